"""ta.cuda: whether a GPU is usable through CuPy."""

from . import backend


def is_available() -> bool:
    return backend.cuda_is_available()


def device_count() -> int:
    return backend.cuda_device_count()
