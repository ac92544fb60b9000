"""Operands in an op's compute dtype, and the checks the elementwise math families share.

Result dtypes follow torch (docs/dtypes.md): a floating op turns integer and bool inputs into
the default dtype; binary ops promote with backend.promote.
"""

from __future__ import annotations

from .. import backend
from ._util import (
    Tensor,
    broadcast_shape,
    check_same_device,
    from_array,
    unbroadcast,
    xp_of,
)
from .elementwise import _float_in


def wide(X):
    """X for a reduction's arithmetic: float16 widened to float32, as torch's CPU kernels
    accumulate half (a float16 sum of squares overflows at 65504, and NumPy sums a strided
    float16 axis in float16, where adding 0.1 to 4096 does nothing); every other dtype as
    it is, with no copy."""
    return X.astype("float32") if X.dtype == "float16" else X


def _floating(dtype):
    return backend.floating(dtype)


def _as(x, dtype):
    """The array (or the Python scalar) of an operand, in the op's compute dtype."""
    if type(x) is Tensor:
        return x._array().astype(dtype.np, copy=False)
    return x


_float_input = _float_in  # one rule for a floating op's input, shared with elementwise
_xp = xp_of


def _shape(x):
    return x.shape if type(x) is Tensor else ()


def _binary(name: str, a, b, floating: bool = False):
    """(A, B, xp, dtype) for a binary op: device and broadcast checks, then both operands
    in the result dtype (the floating one for `floating` ops)."""
    device = check_same_device(name, a, b)
    broadcast_shape(name, a, b)
    dtype = backend.promote(a, b)
    if floating:
        dtype = _floating(dtype)
    return _as(a, dtype), _as(b, dtype), backend.xp_for(device), dtype


def _grad_to(arr, shape, dtype) -> Tensor:
    """A gradient for an operand of `shape` and `dtype`: cast, then summed down to shape."""
    return unbroadcast(from_array(arr.astype(dtype.np, copy=False)), shape)


def _require_float(name: str, *tensors) -> None:
    for t in tensors:
        if type(t) is Tensor and not t.dtype.is_floating_point:
            raise RuntimeError(f"{name}: not implemented for {t.dtype.name} (shape "
                               f"{tuple(t.shape)}); expected a floating point tensor")


def _require_integral(name: str, *operands) -> None:
    for t in operands:
        bad = t.dtype.is_floating_point if type(t) is Tensor else isinstance(t, float)
        if bad:
            shape = tuple(t.shape) if type(t) is Tensor else "a Python float"
            raise RuntimeError(f"{name}: only integer and bool tensors, got a floating "
                               f"operand ({shape})")
