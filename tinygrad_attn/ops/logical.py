"""The predicates (isnan, isinf, isfinite, isclose, allclose), the comparisons (eq, lt,
...), the logical and bitwise ops: results without a gradient, as in torch; and torch's
questions about a tensor (is_tensor, numel, is_floating_point, is_nonzero).
"""

from __future__ import annotations

from .. import backend
from .. import shape as shp
from ..backend.dtypes import scalar_as
from ._math_util import _binary, _require_integral, _xp
from ._util import Tensor, broadcast_shape, check_same_device, from_array
from .elementwise import compare
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


# ----------------------------------------------------------------------------- comparisons
# torch's function and method forms of a == b, ...: each one name of compare's, with
# torch's aliases (greater, less_equal, not_equal, ...)
@op(method=True, ta=True)
def eq(input, other) -> Tensor:  # noqa: A002 - torch's argument name
    return compare(input, other, "eq")


@op(method=("ne", "not_equal"), ta=("ne", "not_equal"))
def ne(input, other) -> Tensor:  # noqa: A002
    return compare(input, other, "ne")


@op(method=("lt", "less"), ta=("lt", "less"))
def lt(input, other) -> Tensor:  # noqa: A002
    return compare(input, other, "lt")


@op(method=("le", "less_equal"), ta=("le", "less_equal"))
def le(input, other) -> Tensor:  # noqa: A002
    return compare(input, other, "le")


@op(method=("gt", "greater"), ta=("gt", "greater"))
def gt(input, other) -> Tensor:  # noqa: A002
    return compare(input, other, "gt")


@op(method=("ge", "greater_equal"), ta=("ge", "greater_equal"))
def ge(input, other) -> Tensor:  # noqa: A002
    return compare(input, other, "ge")


# ----------------------------------------------------------------------------- about a tensor
# torch.is_tensor, torch.numel, ...: questions, not ops (no graph, no array); registered so
# that ta.numel(x) and x.numel() are one function, as every other name of the engine.
@op(ta=True)
def is_tensor(obj) -> bool:
    return isinstance(obj, Tensor)


@op(method=True, ta=True)
def numel(input) -> int:  # noqa: A002
    return shp.numel(_tensor_arg("numel", input).shape)


@op(method=True, ta=True)
def is_floating_point(input) -> bool:  # noqa: A002
    return _tensor_arg("is_floating_point", input).dtype.is_floating_point


@op(method=True, ta=True)
def is_complex(input) -> bool:  # noqa: A002
    _tensor_arg("is_complex", input)
    return False  # the engine has no complex dtypes


@op(method=True, ta=True)
def is_nonzero(input) -> bool:  # noqa: A002
    """bool of a one-element tensor, as torch's (which refuses any other size)."""
    t = _tensor_arg("is_nonzero", input)
    if t.numel() != 1:
        raise RuntimeError(f"is_nonzero: a Tensor with {t.numel()} elements cannot be "
                           f"converted to Scalar (shape {tuple(t.shape)})")
    return bool(t.item())


def _tensor_arg(name: str, x) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}(): argument 'input' must be Tensor, not {type(x).__name__}")
    return x
