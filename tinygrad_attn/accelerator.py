"""ta.device and ta.accelerator: torch's device objects and its accelerator queries.

The engine names a device with a string ("cpu", "cuda:1"): `Tensor.device` is one, and every
factory and `.to` read one. `ta.device("cuda", 1)` is that string, with torch's `.type` and
`.index` on top, so it goes wherever a device string goes and compares equal to it.
"""

from __future__ import annotations

from . import backend
from .backend.devices import device  # noqa: F401 - torch.device, made by the device parser


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
