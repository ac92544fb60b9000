"""Small helpers shared by the op modules: operands, devices, un-broadcasting."""

from __future__ import annotations

from .. import backend
from .. import shape as shp
from ..errors import DeviceMismatchError, ShapeError
from ..tensor import Tensor, from_array

__all__ = ["Tensor", "from_array", "xp_of", "operand", "unbroadcast", "sum_to",
           "check_same_device",
           "broadcast_shape", "ShapeError", "shp", "backend", "zeros_array"]


def xp_of(t: Tensor):
    return backend.xp_for(t.device)


def check_same_device(op: str, *tensors) -> str:
    device = None
    for t in tensors:
        if type(t) is Tensor:
            if device is None:
                device = t.device
            elif t.device != device:
                shapes = ", ".join(
                    f"{tuple(x.shape)} on {x.device}" for x in tensors if type(x) is Tensor
                )
                raise DeviceMismatchError(
                    f"{op}: expected all tensors on the same device, got {shapes}; move them "
                    "explicitly with .to(device) (there is no silent transfer)"
                )
    return device or "cpu"


def operand(x, like: Tensor):
    """The array (or Python scalar) for an operand of an elementwise op."""
    if type(x) is Tensor:
        return x._array()
    if isinstance(x, (int, float, bool)):
        return x
    if backend.is_array(x):
        return x
    raise TypeError(f"unsupported operand type {type(x).__name__} for a tensor op")


def broadcast_shape(op: str, a, b) -> tuple:
    sa = a.shape if type(a) is Tensor else ()
    sb = b.shape if type(b) is Tensor else ()
    if sa == sb:
        return sa
    return shp.broadcast_shapes(sa, sb, op=op)


def unbroadcast(g: Tensor, shape: tuple) -> Tensor:
    """Sum `g` down to `shape` (the inverse of broadcasting `shape` up to g.shape)."""
    if g.shape == tuple(shape):
        return g
    return from_array(sum_to(g._array(), shape, backend.xp_for(g.device)))


def sum_to(arr, shape: tuple, xp):
    """A new array: `arr` summed over the dims that broadcasting `shape` added or stretched.
    `arr.shape` must differ from `shape` (otherwise there is nothing to sum)."""
    lead = arr.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and arr.shape[lead + i] != 1
    )
    # A bias's gradient lands here (the leading dims summed). NumPy's sum is already one
    # vectorized pass at memory speed; a compiled twin spread over the threads by column
    # bands measured slower at a GPT step's sizes (launching numba's pool costs about what
    # the whole sum does), so there is none.
    return xp.sum(arr, axis=axes, keepdims=True).reshape(shape)


def zeros_array(shape, dtype, device):
    xp = backend.xp_for(device)
    with backend.on_device(device):
        return xp.zeros(shape, dtype=dtype.np)

