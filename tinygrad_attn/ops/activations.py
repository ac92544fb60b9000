"""Activation functions as torch.nn.functional names them, one graph node each.

Where the derivative is a function of the output alone (elu, selu, celu with alpha >= 0,
leaky_relu with a non-negative slope, hardsigmoid, hardtanh), the op saves its output:
the next layer usually keeps that tensor anyway, so the save costs no new bytes.
"""

from __future__ import annotations

import math

from .. import backend
from .. import shape as shp
from ..autograd import Function
from ..autograd.graph import recording
from ._math_util import _require_float
from ._recorded import backward_xp
from ._util import Tensor, from_array
from .nonlinear import _sigmoid_array
from .reduce import Softmax, softmax
from .registry import op

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _xp(t: Tensor):
    """t's array module (in a recorded backward off the CPU, one that records: backward_xp)."""
    return backward_xp(t.device)


def _input(name: str, x):
    if type(x) is not Tensor:
        raise TypeError(f"{name}: expected a Tensor, got {type(x).__name__}")
    _require_float(name, x)
    return x._array()


def _not_bool(name: str, x) -> None:
    if type(x) is not Tensor:
        raise TypeError(f"{name}: expected a Tensor, got {type(x).__name__}")
    if x.dtype is backend.bool_:
        raise RuntimeError(f"{name}: bool inputs are not supported (shape {tuple(x.shape)})")


class LeakyRelu(Function):
    """y = x if x > 0 else slope x;  gx = g if x > 0 else slope g.

    Saves the output when slope >= 0 (y > 0 exactly where x > 0), else the input.
    """

    @staticmethod
    def forward(ctx, x, negative_slope=0.01):
        X = _input("leaky_relu", x)
        ctx.slope = negative_slope
        y = from_array(_xp(x).where(X > 0, X, X * negative_slope).astype(X.dtype, copy=False))
        ctx.save_for_backward(y if negative_slope >= 0 else x)
        return y

    @staticmethod
    def backward(ctx, g):
        (saved,) = ctx.saved_tensors
        G = g._array()
        return from_array(_xp(g).where(saved._array() > 0, G, G * ctx.slope))


class Elu(Function):
    """y = x if x > 0 else scale alpha (exp(x) - 1), times `scale` for x > 0 too (selu);
    gx = g scale if x > 0 else g (y + scale alpha).

    Saves the output when alpha >= 0 (then y > 0 exactly where x > 0), else the input.
    """

    @staticmethod
    def forward(ctx, x, alpha=1.0, scale=1.0, name="elu"):
        X = _input(name, x)
        xp = _xp(x)
        ctx.alpha, ctx.scale = alpha, scale
        y = xp.where(X > 0, X * scale, xp.expm1(X) * (alpha * scale)).astype(X.dtype)
        y = from_array(y)
        ctx.from_output = alpha >= 0
        ctx.save_for_backward(y if ctx.from_output else x)
        return y

    @staticmethod
    def backward(ctx, g):
        (saved,) = ctx.saved_tensors
        xp = _xp(g)
        S, G = saved._array(), g._array()
        a_s = ctx.alpha * ctx.scale
        if recording():  # the same values; the negative side's derivative only below 0,
            # as torch's second derivative takes it (0 at x = 0)
            negative = xp.where(S < 0, S, 0) + a_s if ctx.from_output \
                else xp.where(S < 0, xp.exp(S), 1.0) * a_s
        else:
            negative = S + a_s if ctx.from_output else xp.exp(S) * a_s
        return from_array(xp.where(S > 0, G * ctx.scale, G * negative))


class Celu(Function):
    """y = max(0, x) + min(0, alpha (exp(x / alpha) - 1));  gx = g if x > 0 else
    g (y / alpha + 1). Saves the output."""

    @staticmethod
    def forward(ctx, x, alpha=1.0):
        X = _input("celu", x)
        if alpha == 0:
            raise ZeroDivisionError("celu: alpha must not be 0")
        xp = _xp(x)
        ctx.alpha = alpha
        y = from_array(xp.where(X > 0, X, xp.expm1(X / alpha) * alpha).astype(X.dtype))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        Y, G = y._array(), g._array()
        xp = _xp(g)
        if recording():  # the negative side's derivative only below 0, as elu's
            Y = xp.where(Y < 0, Y, 0)
        return from_array(xp.where(Y > 0, G, G * (Y / ctx.alpha + 1)))


class Softplus(Function):
    """y = log(1 + exp(beta x)) / beta (x where beta x > threshold);
    gx = g sigmoid(beta x) (g above the threshold). Saves the input."""

    @staticmethod
    def forward(ctx, x, beta=1.0, threshold=20.0):
        X = _input("softplus", x)
        xp = _xp(x)
        ctx.beta, ctx.threshold = beta, threshold
        ctx.save_for_backward(x)
        bx = X * beta
        soft = (xp.maximum(bx, 0) + xp.log1p(xp.exp(-xp.abs(bx)))) / beta
        return from_array(xp.where(bx > threshold, X, soft).astype(X.dtype, copy=False))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        xp = _xp(g)
        bx = x._array() * ctx.beta
        G = g._array()
        s = _sigmoid_array(xp, bx)
        if recording():  # at the threshold itself the value is kept and its derivative is 0,
            # as torch's second derivative takes it (strictly below the threshold)
            s = xp.where(bx < ctx.threshold, s, 1 / (1 + math.exp(-ctx.threshold)))
        return from_array(xp.where(bx > ctx.threshold, G, G * s))


class Softsign(Function):
    """y = x / (1 + |x|);  gx = g / (1 + |x|)^2. Saves the input."""

    @staticmethod
    def forward(ctx, x):
        _not_bool("softsign", x)  # integers promote, as torch's x / (1 + |x|)
        X = x._array().astype(backend.floating(x.dtype).np, copy=False)
        ctx.save_for_backward(x)
        return from_array(X / (1 + _xp(x).abs(X)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        X = x._array()
        xp = _xp(x)
        # recorded: |x| as sign(x) x, whose derivative at 0 is sign(0) = 0, as torch's
        d = 1 + (xp.sign(X) * X if recording() else xp.abs(X))
        return from_array(g._array() / (d * d))


class Mish(Function):
    """y = x tanh(softplus(x));  gx = g (t + x sigmoid(x) (1 - t^2)), t = tanh(softplus(x)).
    Saves the input."""

    @staticmethod
    def forward(ctx, x):
        X = _input("mish", x)
        ctx.save_for_backward(x)
        return from_array(X * _tanh_softplus(_xp(x), X))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        xp = _xp(x)
        X = x._array()
        t = _tanh_softplus(xp, X)
        return from_array(g._array() * (t + X * _sigmoid_array(xp, X) * (1 - t * t)))


def _tanh_softplus(xp, X):
    return xp.tanh(xp.maximum(X, 0) + xp.log1p(xp.exp(-xp.abs(X))))


class Hardswish(Function):
    """y = x relu6(x + 3) / 6;  gx = 0 for x <= -3, g for x >= 3, g (x / 3 + 1/2) between
    (torch's choice at the two corners).
    Saves the input."""

    @staticmethod
    def forward(ctx, x):
        X = _input("hardswish", x)
        ctx.save_for_backward(x)
        return from_array(X * _xp(x).clip(X + 3, 0, 6) / 6)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        xp = _xp(x)
        X, G = x._array(), g._array()
        return from_array(xp.where(X <= -3, 0, xp.where(X < 3, G * (X / 3 + 0.5), G))
                          .astype(G.dtype, copy=False))


class Hardsigmoid(Function):
    """y = relu6(x + 3) / 6;  gx = g / 6 where -3 < x < 3, else 0.
    Saves the output (0 < y < 1 exactly there)."""

    @staticmethod
    def forward(ctx, x):
        X = _input("hardsigmoid", x)
        y = from_array((_xp(x).clip(X + 3, 0, 6) / 6).astype(X.dtype, copy=False))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        Y, G = y._array(), g._array()
        return from_array(G * ((Y > 0) & (Y < 1)) / 6)


class Hardtanh(Function):
    """y = clamp(x, lo, hi);  gx = g where lo < x < hi (strictly, as torch), else 0.
    Saves the output (lo < y < hi exactly there). Integer inputs stay integers."""

    @staticmethod
    def forward(ctx, x, min_val=-1.0, max_val=1.0):
        _not_bool("hardtanh", x)
        X = x._array()  # integers too, as torch's clamp
        if min_val > max_val:
            raise ValueError(f"hardtanh: min_val ({min_val}) cannot be greater than max_val "
                             f"({max_val})")
        ctx.bounds = (min_val, max_val)
        y = from_array(_xp(x).clip(X, min_val, max_val).astype(X.dtype, copy=False))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        lo, hi = ctx.bounds
        Y = y._array()
        return from_array(g._array() * ((Y > lo) & (Y < hi)))


class LogSigmoid(Function):
    """y = -softplus(-x) = min(x, 0) - log(1 + exp(-|x|));  gx = g sigmoid(-x).
    Saves the input."""

    @staticmethod
    def forward(ctx, x):
        X = _input("logsigmoid", x)
        xp = _xp(x)
        ctx.save_for_backward(x)
        return from_array((xp.minimum(X, 0) - xp.log1p(xp.exp(-xp.abs(X))))
                          .astype(X.dtype, copy=False))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return from_array(g._array() * _sigmoid_array(_xp(x), -x._array()))


class Glu(Function):
    """y = a sigmoid(b) with (a, b) the halves of x along dim;  ga = g s, gb = g a s (1 - s).
    Saves the input (both halves are needed; s is recomputed)."""

    @staticmethod
    def forward(ctx, x, dim=-1):
        X = _input("glu", x)
        if x.ndim == 0:
            raise RuntimeError("glu: does not support 0-dimensional tensors")
        d = shp.normalize_dim(dim, x.ndim, "glu")
        if x.shape[d] % 2:
            raise RuntimeError(f"glu: halving dimension must be even, but dimension {d} of "
                               f"shape {tuple(x.shape)} is size {x.shape[d]}")
        xp = _xp(x)
        ctx.dim = d
        ctx.save_for_backward(x)
        a, b = xp.split(X, 2, axis=d)
        return from_array(a * _sigmoid_array(xp, b))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        xp = _xp(x)
        a, b = xp.split(x._array(), 2, axis=ctx.dim)
        s = _sigmoid_array(xp, b)
        G = g._array()
        return from_array(xp.concatenate([G * s, G * a * s * (1 - s)], axis=ctx.dim))


# ----------------------------------------------------------------------------- entry points
@op(LeakyRelu, functional=True)
def leaky_relu(x, negative_slope=0.01, inplace=False):
    return LeakyRelu.apply(x, negative_slope=negative_slope)


@op(Elu, functional=True)
def elu(x, alpha=1.0, inplace=False):
    return Elu.apply(x, alpha=alpha)


@op(Elu, ta=True, functional=True)
def selu(x, inplace=False):
    """scale * elu(x, alpha) with the self-normalizing constants."""
    return Elu.apply(x, alpha=_SELU_ALPHA, scale=_SELU_SCALE, name="selu")


@op(Celu, ta=True, functional=True)
def celu(x, alpha=1.0, inplace=False):
    return Celu.apply(x, alpha=alpha)


@op(Softplus, functional=True)
def softplus(x, beta=1.0, threshold=20.0):
    return Softplus.apply(x, beta=beta, threshold=threshold)


@op(Softsign, functional=True)
def softsign(x):
    return Softsign.apply(x)


@op(Mish, functional=True)
def mish(x, inplace=False):
    return Mish.apply(x)


@op(Hardswish, functional=True)
def hardswish(x, inplace=False):
    return Hardswish.apply(x)


@op(Hardsigmoid, functional=True)
def hardsigmoid(x, inplace=False):
    return Hardsigmoid.apply(x)


@op(Hardtanh, functional=True)
def hardtanh(x, min_val=-1.0, max_val=1.0, inplace=False):
    return Hardtanh.apply(x, min_val=min_val, max_val=max_val)


@op(Hardtanh, functional=True)
def relu6(x, inplace=False):
    """hardtanh(x, 0, 6), as torch defines it: the same node, nothing more saved."""
    _not_bool("relu6", x)
    return Hardtanh.apply(x, min_val=0.0, max_val=6.0)


@op(LogSigmoid, functional=True)
def logsigmoid(x):
    return LogSigmoid.apply(x)


@op(Softmax, functional=True)
def softmin(x, dim=None):
    """softmax(-x, dim), as torch computes it: the negation saves nothing and softmax keeps
    its output, so this costs no more saved bytes than softmax."""
    if dim is None:
        raise TypeError("softmin: pass dim explicitly (the implicit choice is deprecated)")
    return softmax(-x, dim)


@op(Glu, functional=True)
def glu(x, dim=-1):
    return Glu.apply(x, dim=dim)

