"""The elementwise nonlinearities a network uses most: tanh, sigmoid, relu, gelu, silu, and
bias_gelu, gelu(x + bias) in one op (a Linear's bias folded into the gelu after it).

Each saves what its derivative needs and no more: tanh, sigmoid and relu their output (the
next layer usually keeps it anyway), silu and gelu their input; whether a later node keeps
gelu's output or rebuilds it is gelu's save policy. The arithmetic they build on, and its
dtype rules, are elementwise.py's.
"""

from __future__ import annotations

import math

from .. import backend
from ..autograd import Function
from ..autograd.graph import recording
from ..errors import ShapeError
from ._recorded import backward_xp
from ._util import Tensor, check_same_device
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
    never overflows: two input-sized arrays (e and the result) and the sign mask. A
    recorded backward (create_graph=True) gets the same arithmetic out of place."""
    if recording():
        e = xp.exp(-xp.abs(X))
        return xp.where(X >= 0, 1.0, e) / (e + 1)
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


def _gelu(X, approximate):
    if approximate == "tanh":
        return backend.kernels.gelu_tanh_forward(X)
    return backend.kernels.gelu_forward(X)


def _check_approximate(op: str, approximate) -> None:
    if approximate not in ("none", "tanh"):
        raise RuntimeError(f"{op}: approximate must be 'none' or 'tanh', got {approximate!r}")


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
        _check_approximate("gelu", approximate)
        ctx.approximate = approximate
        ctx.save_for_backward(x)
        return _wrap(_gelu(_float_in(x), approximate))

    @staticmethod
    def recompute(ctx):
        (x,) = ctx.saved_tensors
        return _wrap(_gelu(x._array(), ctx.approximate))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if recording() and ctx.approximate == "none":  # one node for the gradient's graph
            return _GeluGrad.apply(x, g)
        X, G = x._array(), g._array()
        if ctx.approximate == "tanh":
            return _wrap(backend.kernels.gelu_tanh_backward(X, G))
        return _wrap(backend.kernels.gelu_backward(X, G))


class BiasGelu(Function):
    """y = gelu(x + bias) with bias of shape (x.shape[-1],), added along the last dim.

    gx = g * gelu'(x + bias), gbias = gx summed over the leading dims; the compiled kernels
    make each direction one pass (the bias gradient summed in the same pass as gx).
    Saves the input and the bias, not x + bias: backward adds them again element by
    element, so the op keeps what a gelu of a bias-free linear keeps (the bias is a
    parameter, stored anyway). The save policy is gelu's: under "recompute" a later node
    that needs y keeps a recipe, and y is rebuilt from x and the bias in backward.
    """

    policy = "gelu"
    saves = {"save": "input and bias",
             "recompute": "input and bias (its output is rebuilt for later nodes)"}

    @staticmethod
    def saved_bytes_formula(shape, itemsize, policy):
        return math.prod(shape) * itemsize  # the input; the bias is a parameter

    @staticmethod
    def forward(ctx, x, bias, approximate="none"):
        for name, t in (("input", x), ("bias", bias)):
            if type(t) is not Tensor:
                raise TypeError(f"bias_gelu: {name} must be a Tensor, got {type(t).__name__}")
        check_same_device("bias_gelu", x, bias)
        _check_approximate("bias_gelu", approximate)
        if x.ndim == 0 or tuple(bias.shape) != (x.shape[-1],):
            raise ShapeError(f"bias_gelu: expected a bias of shape (x.shape[-1],), got "
                             f"{tuple(bias.shape)} for an input of shape {tuple(x.shape)}")
        if not (x.dtype.is_floating_point and bias.dtype.is_floating_point):
            raise RuntimeError(f"bias_gelu: expected floating tensors, got {x.dtype.name} "
                               f"and {bias.dtype.name}")
        ctx.approximate = approximate
        ctx.save_for_backward(x, bias)
        X, B = _bias_gelu_arrays(x, bias)
        return _wrap(backend.kernels.bias_gelu_forward(X, B, approximate))

    @staticmethod
    def recompute(ctx):
        X, B = _bias_gelu_arrays(*ctx.saved_tensors)
        return _wrap(backend.kernels.bias_gelu_forward(X, B, ctx.approximate))

    @staticmethod
    def backward(ctx, g):
        x, bias = ctx.saved_tensors
        nx, nb = ctx.needs_input_grad[:2]
        if recording() and ctx.approximate == "none":  # one node for the gradient's graph
            gx = _GeluGrad.apply(x + bias, g)
            gb = gx.reshape(-1, gx.shape[-1]).sum(0)
            return (gx.to(x.dtype) if nx else None, gb.to(bias.dtype) if nb else None)
        X, B = _bias_gelu_arrays(x, bias)
        gx, gb = backend.kernels.bias_gelu_backward(X, B, g._array(), ctx.approximate)
        return (_wrap(gx.astype(x.dtype.np, copy=False)) if nx else None,
                _wrap(gb.astype(bias.dtype.np, copy=False)) if nb else None)


class _GeluGrad(Function):
    """y = g * gelu'(x) = g * (Phi(x) + x phi(x)), exact gelu's backward as one node of a
    recorded backward (create_graph): gg = gelu'(x) * gy, gx = gy * g * phi(x) * (2 - x^2).
    Saves x and g, as torch's double backward of gelu does: recording gelu's backward
    text op by op would keep five input-sized intermediates for the gradient's graph."""

    @staticmethod
    def forward(ctx, x, g):
        ctx.save_for_backward(x, g)
        return _wrap(backend.kernels.gelu_backward(_float_in(x), g._array()))

    @staticmethod
    def backward(ctx, gy):
        x, g = ctx.saved_tensors
        nx, ng = ctx.needs_input_grad
        X, G, GY = x._array(), g._array(), gy._array()
        gx = gg = None
        if nx:
            xp = backward_xp(gy.device)
            phi = xp.exp(-0.5 * X * X) * _INV_SQRT_2PI
            gx = _wrap(GY * G * phi * (2 - X * X))
        if ng:
            gg = _wrap(backend.kernels.gelu_backward(X, GY))
        return gx, gg


_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _bias_gelu_arrays(x, bias):
    """x's and bias's arrays in their promoted dtype (a float32 x with a float64 bias
    computes in float64, as gelu(x + bias) would)."""
    dtype = backend.promote(x, bias).np
    return x._array().astype(dtype, copy=False), bias._array().astype(dtype, copy=False)


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
        s = _sigmoid_array(backward_xp(x.device), X)
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

@op(BiasGelu, functional=True)
def bias_gelu(x, bias, approximate="none"): return BiasGelu.apply(x, bias, approximate=approximate)

@op(Silu, functional=True)
def silu(x): return Silu.apply(x)
