"""The elementwise nonlinearities a network uses most: tanh, sigmoid, relu, gelu, silu.

Each saves what its derivative needs and no more: tanh, sigmoid and relu their output (the
next layer usually keeps it anyway), silu and gelu their input; whether a later node keeps
gelu's output or rebuilds it is gelu's save policy. The arithmetic they build on, and its
dtype rules, are elementwise.py's.
"""

from __future__ import annotations

import math

from .. import backend
from ..autograd import Function
from .elementwise import _float_in, _wrap
from .registry import op


class Tanh(Function):
    """y = tanh(x);  gx = g * (1 - y^2). Saves the output."""

    @staticmethod
    def forward(ctx, x):
        y = _wrap(backend.xp_for(x.device).tanh(_float_in(x)))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        Y = y._array()
        return _wrap(g._array() * (1 - Y * Y))


def _sigmoid_array(xp, X):
    """1 / (1 + exp(-x)) in X's dtype, as (1 or e) / (1 + e) with e = exp(-|x|), which
    never overflows: two input-sized arrays (e and the result) and the sign mask."""
    e = xp.abs(X, out=xp.empty_like(X))  # out=: a 0-d X gives a 0-d array, not a scalar
    xp.negative(e, out=e)
    xp.exp(e, out=e)
    y = xp.where(X >= 0, 1.0, e)  # the numerator
    e += 1
    y /= e
    return y


class Sigmoid(Function):
    """y = 1 / (1 + exp(-x));  gx = g * y * (1 - y). Saves the output."""

    @staticmethod
    def forward(ctx, x):
        y = _wrap(_sigmoid_array(backend.xp_for(x.device), _float_in(x)))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        Y = y._array()
        return _wrap(g._array() * Y * (1 - Y))


class Relu(Function):
    """y = max(x, 0);  gx = g * (y > 0). Saves the output (its sign is the mask)."""

    @staticmethod
    def forward(ctx, x):
        X = x._array()
        y = _wrap(backend.xp_for(x.device).maximum(X, 0).astype(X.dtype, copy=False))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return _wrap(g._array() * (y._array() > 0))


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


class Gelu(Function):
    """y = x * Phi(x) (exact, with erf) or its tanh approximation.

    gx = g * (Phi(x) + x * phi(x)) (exact); saves the input, from which both terms follow.
    Policy "recompute": a later node that needs y (the MLP's second matmul) keeps a recipe
    and y is rebuilt from the saved input in backward, so y itself is not kept.
    """

    policy = "gelu"
    saves = {"save": "input", "recompute": "input (its output is rebuilt for later nodes)"}

    @staticmethod
    def saved_bytes_formula(shape, itemsize, policy):
        return math.prod(shape) * itemsize

    @staticmethod
    def forward(ctx, x, approximate="none"):
        if approximate not in ("none", "tanh"):
            raise RuntimeError(f"gelu: approximate must be 'none' or 'tanh', got "
                               f"{approximate!r}")
        ctx.approximate = approximate
        ctx.save_for_backward(x)
        return _wrap(_gelu(backend.xp_for(x.device), _float_in(x), approximate))

    @staticmethod
    def recompute(ctx):
        (x,) = ctx.saved_tensors
        return _wrap(_gelu(backend.xp_for(x.device), x._array(), ctx.approximate))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        xp = backend.xp_for(x.device)
        X, G = x._array(), g._array()
        if ctx.approximate == "tanh":
            inner = _SQRT_2_OVER_PI * (X + 0.044715 * X * X * X)
            t = xp.tanh(inner)
            d_inner = _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * X * X)
            return _wrap(G * (0.5 * (1 + t) + 0.5 * X * (1 - t * t) * d_inner))
        return _wrap(backend.gelu_backward(X, G))


def _gelu(xp, X, approximate):
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (X + 0.044715 * X * X * X)
        return 0.5 * X * (1 + xp.tanh(inner))
    return backend.gelu_forward(X)


class Silu(Function):
    """y = x * sigmoid(x);  gx = g * s * (1 + x * (1 - s)). Saves the input."""

    @staticmethod
    def forward(ctx, x):
        xp = backend.xp_for(x.device)
        X = _float_in(x)
        ctx.save_for_backward(x)
        y = _sigmoid_array(xp, X)
        y *= X
        return _wrap(y)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        X = x._array()
        s = _sigmoid_array(backend.xp_for(x.device), X)
        return _wrap((g._array() * s * (1 + X * (1 - s))).astype(X.dtype, copy=False))


# ----------------------------------------------------------------------------- entry points
@op(Tanh, method=True, ta=True, functional=True)
def tanh(x): return Tanh.apply(x)

@op(Sigmoid, method=True, ta=True, functional=True)
def sigmoid(x): return Sigmoid.apply(x)

@op(Relu, method=True, ta=True, functional=True)
def relu(x): return Relu.apply(x)

@op(Gelu, functional=True)
def gelu(x, approximate="none"): return Gelu.apply(x, approximate=approximate)

@op(Silu, functional=True)
def silu(x): return Silu.apply(x)
