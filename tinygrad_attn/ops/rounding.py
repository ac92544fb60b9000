"""Rounding as torch names it: frac, floor, ceil, trunc, round, sign, sgn, and nan_to_num.

The piecewise-constant ones have a node and a zero gradient, as in torch; integer and bool
inputs come back unchanged.
"""

from __future__ import annotations

from .. import backend
from ..autograd import Function
from ._math_util import _require_float, _xp
from ._util import from_array
from .registry import op


class Frac(Function):
    """y = x - trunc(x);  gx = g. Saves nothing."""

    @staticmethod
    def forward(ctx, x):
        _require_float("frac", x)
        X = x._array()
        return from_array(X - _xp(x).trunc(X))

    @staticmethod
    def backward(ctx, g):
        return g


class _Step(Function):
    """y = a piecewise-constant f(x);  gx = 0. Saves nothing.

    As in torch, the node exists (the result requires grad) and its gradient is zero.
    Integer and bool inputs come back unchanged, in their dtype.
    """

    kernel = "floor"

    @classmethod
    def forward(cls, ctx, x, decimals=0):
        X = x._array()
        if not x.dtype.is_floating_point:
            if cls.kernel == "sign" and x.dtype.name != "bool":
                return from_array(_xp(x).sign(X))
            return from_array(X.copy())
        xp = _xp(x)
        if cls.kernel == "rint" and decimals:
            scale = 10.0 ** abs(decimals)
            if decimals > 0:
                return from_array((xp.rint(X * scale) / scale).astype(X.dtype, copy=False))
            return from_array((xp.rint(X / scale) * scale).astype(X.dtype, copy=False))
        if cls.kernel == "sign":  # torch's sign(nan) is 0
            return from_array(xp.where(xp.isnan(X), 0, xp.sign(X)).astype(X.dtype, copy=False))
        return from_array(getattr(xp, cls.kernel)(X))

    @staticmethod
    def backward(ctx, g):
        return from_array(backend.xp_for(g.device).zeros_like(g._array()))


class Floor(_Step):
    """y = floor(x);  gx = 0. Saves nothing."""

    kernel = "floor"


class Ceil(_Step):
    """y = ceil(x);  gx = 0. Saves nothing."""

    kernel = "ceil"


class Trunc(_Step):
    """y = trunc(x) (toward zero);  gx = 0. Saves nothing."""

    kernel = "trunc"


class Round(_Step):
    """y = x rounded half to even (to `decimals` places);  gx = 0. Saves nothing."""

    kernel = "rint"


class Sign(_Step):
    """y = sign(x) in {-1, 0, 1} (0 for nan, as torch);  gx = 0. Saves nothing."""

    kernel = "sign"


class NanToNum(Function):
    """y = x with nan, +inf, -inf replaced;  gx = g where x is finite, else 0.

    Saves the finite mask as bool (1 byte an element): all that backward needs.
    """

    @staticmethod
    def forward(ctx, x, nan=0.0, posinf=None, neginf=None):
        X = x._array()
        if not x.dtype.is_floating_point:
            return from_array(X.copy())
        xp = _xp(x)
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(from_array(xp.isfinite(X)))
        return from_array(xp.nan_to_num(X, copy=True, nan=nan, posinf=posinf, neginf=neginf))

    @staticmethod
    def backward(ctx, g):
        (finite,) = ctx.saved_tensors
        return from_array(g._array() * finite._array())


# ----------------------------------------------------------------------------- entry points
@op(Frac, method=True, ta=True)
def frac(x): return Frac.apply(x)

@op(Floor, method=True, ta=True)
def floor(x): return Floor.apply(x)

@op(Ceil, method=True, ta=True)
def ceil(x): return Ceil.apply(x)

@op(Trunc, method=("trunc", "fix"), ta=("trunc", "fix"))
def trunc(x): return Trunc.apply(x)

@op(Round, method=True, ta=True)
def round(x, decimals=0): return Round.apply(x, decimals=decimals)  # noqa: A001

@op(Sign, method=True, ta=True)
def sign(x): return Sign.apply(x)

@op(Sign, method=True, ta=True)
def sgn(x):
    """sign(x) for the real dtypes this engine has (torch's sgn differs on complex only)."""
    return Sign.apply(x)

@op(NanToNum, method=True, ta=True)
def nan_to_num(x, nan=0.0, posinf=None, neginf=None):
    return NanToNum.apply(x, nan=nan, posinf=posinf, neginf=neginf)
