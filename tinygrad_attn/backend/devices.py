"""Devices: "cpu" (NumPy) and "cuda:N" (CuPy), and which array module serves each.

`cp` is the GPU array library: CuPy when it imports, else None. It is rebound at run time by
`_install_array_module` (tests install tests/fake_cupy.py in its place), so the other backend
modules read it as `devices.cp` at call time and never copy it with `from .devices import cp`.
"""

from __future__ import annotations

import numpy as np

try:  # CuPy is optional: the package imports and runs on CPU without it.
    import cupy as cp
except Exception:  # noqa: BLE001 - a broken CUDA install must not break CPU use
    cp = None

ndarray_types: tuple = (np.ndarray,) if cp is None else (np.ndarray, cp.ndarray)


def _install_array_module(module):
    """For tests only: make `module` the GPU array library in place of CuPy; returns the
    previous one (None without CuPy), which `_install_array_module(previous)` restores.

    tests/fake_cupy.py is such a module: NumPy underneath, but its arrays refuse implicit
    conversion to host arrays as CuPy's do, so the CPU test suite runs the "cuda" code paths.
    """
    global cp, ndarray_types
    previous = cp
    cp = module
    ndarray_types = (np.ndarray,) if cp is None else (np.ndarray, cp.ndarray)
    return previous


_TYPES = ("cpu", "cuda")


def _parse_index(text: str, spec: str) -> int:
    if not text.isdigit():
        raise RuntimeError(f"Invalid device string: {spec!r} (expected 'cpu', 'cuda' or "
                           "'cuda:N' with N a non-negative integer)")
    return int(text)


class device(str):  # noqa: N801 - torch's name
    """torch.device: `device("cpu")`, `device("cuda:1")`, `device("cuda", 1)`, `device(0)`.

    A str subclass holding the device string, so `x.to(device("cpu"))` and
    `zeros(2, device=device("cpu"))` work as with the string, and `x.device == device("cpu")`
    holds (unlike torch, `device("cpu") == "cpu"` is True here, since the engine's devices
    are strings)."""

    def __new__(cls, type_or_str, index: int | None = None):
        if isinstance(type_or_str, device) and index is None:
            return type_or_str
        if isinstance(type_or_str, int) and not isinstance(type_or_str, bool):
            if index is not None:
                raise TypeError("device(): an integer device takes no index")
            kind, index = "cuda", type_or_str
        elif isinstance(type_or_str, str):
            kind, sep, rest = type_or_str.partition(":")
            if sep:
                if index is not None:
                    raise RuntimeError("device(): type (string) must not include an index "
                                       f"because index was passed explicitly: {type_or_str}")
                index = _parse_index(rest, type_or_str)
        else:
            raise TypeError(f"device(): expected a string or an integer, got "
                            f"{type(type_or_str).__name__} {type_or_str!r}")
        if kind not in _TYPES:
            raise RuntimeError(f"device(): the engine has devices of type {_TYPES}, got "
                               f"{kind!r} in {type_or_str!r}")
        if index is not None:
            if isinstance(index, bool) or not isinstance(index, int):
                raise TypeError(f"device(): index must be an integer, got {index!r}")
            if index < 0:
                raise RuntimeError(f"Device index must not be negative, got {index}")
        self = super().__new__(cls, kind if index is None else f"{kind}:{index}")
        self._type, self._index = kind, index
        return self

    @property
    def type(self) -> str:
        return self._type

    @property
    def index(self) -> int | None:
        return self._index

    def __repr__(self) -> str:
        if self._index is None:
            return f"device(type='{self._type}')"
        return f"device(type='{self._type}', index={self._index})"

    __hash__ = str.__hash__

    def __enter__(self):
        """`with device("cpu"):` changes nothing, the CPU being every factory's default; a
        block that would make a GPU the default device is refused (pass device= instead)."""
        if self._type != "cpu":
            raise NotImplementedError(f"with {self!r}: a default-device block is not "
                                      "implemented; pass device= to the factories or .to()")
        return self

    def __exit__(self, *exc) -> None:
        return None

    def __reduce__(self):
        return (device, (self._type, self._index))


_CANONICAL: dict = {}  # 'cpu', 'cuda:N' -> its device object, made once


def _dev(text: str) -> device:
    found = _CANONICAL.get(text)
    return found if found is not None else _CANONICAL.setdefault(text, device(text))


_CPU = _dev("cpu")


def canonical_device(device, arg: str = "device") -> str:
    """The one device parser: None, 'cpu', 'cpu:0', 'cuda', 'cuda:N' (or an object with a
    .type and .index, as torch.device) -> 'cpu' / 'cuda:N', as a `device` (the string, with
    torch.device's .type and .index). Every factory, `.to` and the memory functions that take
    a device read it here; `arg` names the argument in errors."""
    if device is None:
        return _dev("cpu")
    if _CANONICAL.get(device) is device:  # already canonical: made by _dev below
        return device
    if hasattr(device, "type") and hasattr(device, "index") and not isinstance(device, str):
        device = device.type if device.index is None else f"{device.type}:{device.index}"
    if not isinstance(device, str):
        raise TypeError(f"{arg} must be a string such as 'cpu', 'cuda' or 'cuda:0', got "
                        f"{type(device).__name__} {device!r}")
    if device in ("cpu", "cpu:0"):
        return _dev("cpu")
    if device == "cuda":
        return _dev(f"cuda:{_current_cuda_index()}")
    if device.startswith("cuda:") and device[5:].isdigit():
        return _dev(f"cuda:{int(device[5:])}")
    raise ValueError(f"unknown device {device!r} for {arg}: expected 'cpu', 'cuda' or 'cuda:N' "
                     "(N a GPU number, from 0)")


def _current_cuda_index() -> int:
    return cp.cuda.runtime.getDevice() if cuda_is_available() else 0


def cuda_is_available() -> bool:
    if cp is None:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver, no device
        return False


def cuda_device_count() -> int:
    return cp.cuda.runtime.getDeviceCount() if cuda_is_available() else 0


def xp_for(device: str):
    """The array namespace (numpy or cupy) that holds arrays of `device`."""
    if device == "cpu":
        return np
    if not cuda_is_available():
        raise RuntimeError(
            f"device {device!r} needs CuPy and a CUDA GPU; install the 'cuda' extra "
            "(pip install 'tinygrad_attn[cuda]') on a machine with a GPU"
        )
    return cp


class _CudaScope:
    """Makes device N current while arrays of "cuda:N" are allocated."""

    def __init__(self, device: str):
        self.device = device
        self._ctx = None

    def __enter__(self):
        if self.device != "cpu":
            xp_for(self.device)  # without CuPy or a GPU: the clear error, not a None deref
            self._ctx = cp.cuda.Device(int(self.device.split(":")[1]))
            self._ctx.__enter__()

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)


def on_device(device: str) -> _CudaScope:
    return _CudaScope(device)


def synchronize(device: str | None = None) -> None:
    """Wait until the GPU (device "cuda:N", or the current one) has finished queued work."""
    if not cuda_is_available():
        return
    index = _current_cuda_index() if device is None else int(canonical_device(device)[5:])
    cp.cuda.Device(index).synchronize()


def device_of(arr) -> str:
    """The device holding `arr`, as its canonical `device` object ("cpu", "cuda:N")."""
    if type(arr) is np.ndarray or isinstance(arr, np.ndarray):
        return _CPU
    if cp is not None and isinstance(arr, cp.ndarray):
        return _dev(f"cuda:{arr.device.id}")
    raise TypeError(f"not an array: {type(arr).__name__}")


def is_array(x) -> bool:
    return isinstance(x, ndarray_types)
