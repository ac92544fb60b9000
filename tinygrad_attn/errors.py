"""The engine's exceptions. Every message names the op and the shapes involved."""


class ShapeError(ValueError):
    """Shapes that an op cannot combine: broadcasting, matmul, view, cat, ..."""


class DeviceMismatchError(RuntimeError):
    """Tensors on different devices met in one op (there is never a silent transfer)."""


class OutOfMemoryError(MemoryError):
    """An allocation went past the memory limit (see tinygrad_attn.memory.set_limit)."""
