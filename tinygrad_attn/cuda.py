"""ta.cuda: whether a GPU is usable through CuPy."""

from . import backend


def is_available() -> bool:
    return backend.cuda_is_available()


def device_count() -> int:
    return backend.cuda_device_count()


def synchronize(device=None) -> None:
    """Wait for the GPU's queued kernels to finish (a no-op without one), as
    torch.cuda.synchronize: time GPU work between two synchronize() calls."""
    backend.synchronize(device)
