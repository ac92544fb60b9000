"""The engine's exceptions. Every message names the op and the shapes involved.

Each also subclasses what a PyTorch user's `except` catches for the same mistake: torch
raises RuntimeError for shapes that do not combine, so ShapeError is a RuntimeError too (and
a ValueError, as it always was here).
"""


class ShapeError(ValueError, RuntimeError):
    """Shapes that an op cannot combine: broadcasting, matmul, view, cat, ..."""


class DeviceMismatchError(RuntimeError):
    """Tensors on different devices met in one op (there is never a silent transfer)."""


class OutOfMemoryError(MemoryError):
    """An allocation went past the memory limit (see tinygrad_attn.memory.set_limit)."""
