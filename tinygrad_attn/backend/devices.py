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


def canonical_device(device, arg: str = "device") -> str:
    """The one device parser: None, 'cpu', 'cpu:0', 'cuda', 'cuda:N' (or an object with a
    .type and .index, as torch.device) -> 'cpu' / 'cuda:N'. Every factory, `.to` and the
    memory functions that take a device read it here; `arg` names the argument in errors."""
    if device is None:
        return "cpu"
    if hasattr(device, "type") and hasattr(device, "index") and not isinstance(device, str):
        device = device.type if device.index is None else f"{device.type}:{device.index}"
    if not isinstance(device, str):
        raise TypeError(f"{arg} must be a string such as 'cpu', 'cuda' or 'cuda:0', got "
                        f"{type(device).__name__} {device!r}")
    if device in ("cpu", "cpu:0"):
        return "cpu"
    if device == "cuda":
        return f"cuda:{_current_cuda_index()}"
    if device.startswith("cuda:") and device[5:].isdigit():
        return f"cuda:{int(device[5:])}"
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
    if type(arr) is np.ndarray or isinstance(arr, np.ndarray):
        return "cpu"
    if cp is not None and isinstance(arr, cp.ndarray):
        return f"cuda:{arr.device.id}"
    raise TypeError(f"not an array: {type(arr).__name__}")


def is_array(x) -> bool:
    return isinstance(x, ndarray_types)
