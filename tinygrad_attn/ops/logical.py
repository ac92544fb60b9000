"""The predicates (isnan, isinf, isfinite, isclose, allclose) and the logical and bitwise
ops: results without a gradient, as in torch.
"""

from __future__ import annotations

from .. import backend
from ..backend.dtypes import scalar_as
from ._math_util import _binary, _require_integral, _xp
from ._util import Tensor, broadcast_shape, check_same_device, from_array
from .registry import op


@op(method=True, ta=True)
def isnan(x: Tensor) -> Tensor:
    return from_array(_xp(x).isnan(x._array()))


@op(method=True, ta=True)
def isinf(x: Tensor) -> Tensor:
    return from_array(_xp(x).isinf(x._array()))


@op(method=True, ta=True)
def isfinite(x: Tensor) -> Tensor:
    return from_array(_xp(x).isfinite(x._array()))


def _close(name, x, other, rtol, atol, equal_nan):
    if type(other) is Tensor and other.dtype != x.dtype:
        raise RuntimeError(f"{name}: expected both tensors of one dtype, got "
                           f"{x.dtype.name} {tuple(x.shape)} and {other.dtype.name} "
                           f"{tuple(other.shape)}")
    A, B, xp, _ = _binary(name, x, other)
    return xp.isclose(A, B, rtol=rtol, atol=atol, equal_nan=equal_nan)


@op(method=True, ta=True)
def isclose(x, other, rtol=1e-05, atol=1e-08, equal_nan=False) -> Tensor:
    """|x - other| <= atol + rtol |other|, elementwise (a bool tensor)."""
    return from_array(_close("isclose", x, other, rtol, atol, equal_nan))


@op(method=True, ta=True)
def allclose(x, other, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
    """isclose(...).all() as a Python bool."""
    return bool(_close("allclose", x, other, rtol, atol, equal_nan).all())


def _logical(name, a, b):
    device = check_same_device(name, a, b)
    broadcast_shape(name, a, b)
    A = a._array() if type(a) is Tensor else a
    B = b._array() if type(b) is Tensor else b
    return from_array(getattr(backend.xp_for(device), name)(A, B))


@op(method=True, ta=True)
def logical_and(x, other) -> Tensor: return _logical("logical_and", x, other)

@op(method=True, ta=True)
def logical_or(x, other) -> Tensor: return _logical("logical_or", x, other)

@op(method=True, ta=True)
def logical_xor(x, other) -> Tensor: return _logical("logical_xor", x, other)

@op(method=True, ta=True)
def logical_not(x) -> Tensor: return from_array(_xp(x).logical_not(x._array()))


def _bitwise(name, kernel, a, b):
    _require_integral(name, a, b)
    A, B, xp, dtype = _binary(name, a, b)
    # a Python int wraps into the tensor's width, as torch's (0xFFFFFFFF is -1 in int32)
    A = A if type(a) is Tensor else scalar_as(a, dtype)
    B = B if type(b) is Tensor else scalar_as(b, dtype)
    return from_array(getattr(xp, kernel)(A, B))


@op(method=True, ta=True)  # also a & b
def bitwise_and(x, other) -> Tensor:
    """Bitwise and of integers; logical and of bools (as torch)."""
    return _bitwise("bitwise_and", "bitwise_and", x, other)


@op(method=True, ta=True)  # also a | b
def bitwise_or(x, other) -> Tensor:
    return _bitwise("bitwise_or", "bitwise_or", x, other)


@op(method=True, ta=True)  # also a ^ b
def bitwise_xor(x, other) -> Tensor:
    return _bitwise("bitwise_xor", "bitwise_xor", x, other)


@op(method=True, ta=True)  # also a << b
def bitwise_left_shift(x, other) -> Tensor:
    return _bitwise("bitwise_left_shift", "left_shift", x, other)


@op(method=True, ta=True)  # also a >> b
def bitwise_right_shift(x, other) -> Tensor:
    return _bitwise("bitwise_right_shift", "right_shift", x, other)
