"""ta.device and ta.accelerator: torch's device objects and its accelerator queries.

The engine names a device with a string ("cpu", "cuda:1"): `Tensor.device` is one, and every
factory and `.to` read one. `ta.device("cuda", 1)` is that string, with torch's `.type` and
`.index` on top, so it goes wherever a device string goes and compares equal to it.
"""

from __future__ import annotations

from . import backend

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


def is_available() -> bool:
    """Whether an accelerator (a CUDA GPU, through CuPy) is usable: torch.accelerator."""
    return backend.cuda_is_available()


def current_accelerator(check_available: bool = False) -> device | None:
    """The accelerator's device type (device('cuda')), or None when there is none."""
    return device("cuda") if is_available() else None


def device_count() -> int:
    return backend.cuda_device_count()


def current_device_index() -> int:
    """The current GPU's index; without one a RuntimeError, as torch.accelerator's."""
    if not is_available():
        raise RuntimeError("current_device_index: no accelerator is available (no CUDA GPU "
                           "through CuPy)")
    return int(backend.canonical_device("cuda").split(":")[1])


current_device_idx = current_device_index


def synchronize(device=None) -> None:
    """Wait for the accelerator's queued work (a no-op without one)."""
    backend.synchronize(None if device is None else backend.canonical_device(device))
