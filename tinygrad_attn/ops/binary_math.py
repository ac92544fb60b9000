"""Elementwise binary math as torch names it: atan2, hypot, copysign, fmod, logaddexp, lerp.

Operands promote with backend.promote (docs/dtypes.md); a Python number operand stays on the
node, a tensor one is saved.
"""

from __future__ import annotations

from .. import backend
from .. import shape as shp
from ..autograd import Function
from ..autograd.graph import recording
from ..backend.dtypes import scalar_as
from ._math_util import _binary, _grad_to, _require_float, _shape
from ._recorded import backward_xp
from ._util import Tensor, check_same_device, from_array
from .elementwise import Add, Div, Mul, add, check_integer_divisor, div, mul
from .registry import op


# ----------------------------------------------------------------------------- binary
def _save_binary(ctx, a, b, *extra):
    """Save the tensor operands (and `extra`); keep Python-number operands on the node."""
    ctx.scalars = tuple(None if type(x) is Tensor else x for x in (a, b))
    ctx.shapes = (_shape(a), _shape(b))
    ctx.dtypes = tuple(x.dtype if type(x) is Tensor else None for x in (a, b))
    ctx.save_for_backward(*(x if type(x) is Tensor else None for x in (a, b)), *extra)


def _operand_arrays(ctx, a, b):
    return tuple(s if t is None else t._array() for s, t in zip(ctx.scalars, (a, b)))


def _grads(ctx, ga, gb):
    """Each input's gradient (None where it needs none), in its dtype and shape."""
    out = []
    for need, arr, shape, dtype in zip(ctx.needs_input_grad, (ga, gb), ctx.shapes, ctx.dtypes):
        out.append(_grad_to(arr(), shape, dtype) if need else None)
    return tuple(out)


class Atan2(Function):
    """y = atan2(a, b);  ga = g b / (a^2 + b^2), gb = -g a / (a^2 + b^2). Saves a and b."""

    @staticmethod
    def forward(ctx, a, b):
        A, B, xp, _ = _binary("atan2", a, b, floating=True)
        _save_binary(ctx, a, b)
        return from_array(xp.arctan2(A, B))

    @staticmethod
    def backward(ctx, g):
        A, B = _operand_arrays(ctx, *ctx.saved_tensors)
        scale = g._array() / (A * A + B * B)
        return _grads(ctx, lambda: scale * B, lambda: -scale * A)


class Hypot(Function):
    """y = sqrt(a^2 + b^2);  ga = g a / y, gb = g b / y. Saves a, b and y."""

    @staticmethod
    def forward(ctx, a, b):
        _require_float("hypot", a, b)
        A, B, xp, _ = _binary("hypot", a, b)
        y = from_array(xp.hypot(A, B))
        _save_binary(ctx, a, b, y)
        return y

    @staticmethod
    def backward(ctx, g):
        a, b, y = ctx.saved_tensors
        A, B = _operand_arrays(ctx, a, b)
        scale = g._array() / y._array()
        return _grads(ctx, lambda: scale * A, lambda: scale * B)


class Copysign(Function):
    """y = |a| with the sign of b;  ga = g sign(a) * (b's sign), gb = 0.

    Saves a and b (a's gradient is y / a where a != 0, rebuilt from their signs).
    """

    @staticmethod
    def forward(ctx, a, b):
        A, B, xp, _ = _binary("copysign", a, b, floating=True)
        _save_binary(ctx, a, b)
        return from_array(xp.copysign(A, B))

    @staticmethod
    def backward(ctx, g):
        A, B = _operand_arrays(ctx, *ctx.saved_tensors)
        xp = backward_xp(g.device)
        G = g._array()
        # b's sign as +-1 (a constant); recorded (create_graph=True), copysign's first
        # operand is an array of ones, which the recorded copysign takes
        one = xp.ones_like(G) if recording() else 1.0
        return _grads(ctx, lambda: G * xp.sign(A) * xp.copysign(one, B),
                      lambda: xp.zeros_like(G))


class Fmod(Function):
    """y = a - trunc(a / b) b (the sign of a, as C's fmod);  ga = g, gb = -g trunc(a / b).

    Saves a and b.
    """

    @staticmethod
    def forward(ctx, a, b):
        A, B, xp, dtype = _binary("fmod", a, b)
        A = A if type(a) is Tensor else scalar_as(a, dtype)  # an int wraps, as torch's
        B = B if type(b) is Tensor else scalar_as(b, dtype)
        check_integer_divisor("fmod", a, b, B, dtype)
        _save_binary(ctx, a, b)
        return from_array(xp.fmod(A, B))

    @staticmethod
    def backward(ctx, g):
        A, B = _operand_arrays(ctx, *ctx.saved_tensors)
        xp = backend.xp_for(g.device)
        G = g._array()
        return _grads(ctx, lambda: G, lambda: -G * xp.trunc(A / B))


class LogAddExp(Function):
    """y = log(exp(a) + exp(b));  ga = g exp(a - y), gb = g exp(b - y). Saves a, b and y."""

    @staticmethod
    def forward(ctx, a, b):
        _require_float("logaddexp", a, b)
        A, B, xp, _ = _binary("logaddexp", a, b)
        y = from_array(xp.logaddexp(A, B))
        _save_binary(ctx, a, b, y)
        return y

    @staticmethod
    def backward(ctx, g):
        a, b, y = ctx.saved_tensors
        A, B = _operand_arrays(ctx, a, b)
        xp = backend.xp_for(g.device)
        G, Y = g._array(), y._array()
        return _grads(ctx, lambda: G * xp.exp(A - Y), lambda: G * xp.exp(B - Y))


class Lerp(Function):
    """y = start + w (end - start);  g_start = g (1 - w), g_end = g w,
    g_w = g (end - start). Saves w for the first two and start, end for the third."""

    @staticmethod
    def forward(ctx, start, end, weight):
        check_same_device("lerp", start, end, weight)
        _require_float("lerp", start, end, weight)
        if start.dtype != end.dtype or (type(weight) is Tensor and weight.dtype != start.dtype):
            w = weight.dtype.name if type(weight) is Tensor else type(weight).__name__
            raise RuntimeError(f"lerp: expected start, end and weight of one dtype, got "
                               f"{start.dtype.name}, {end.dtype.name} and {w}")
        shp.broadcast_shapes(start.shape, end.shape, _shape(weight), op="lerp")
        ns, ne, nw = ctx.needs_input_grad
        ctx.scalar_w = None if type(weight) is Tensor else weight
        ctx.shapes = (start.shape, end.shape, _shape(weight))
        ctx.save_for_backward(weight if (ns or ne) and type(weight) is Tensor else None,
                              start if nw else None, end if nw else None)
        S, E = start._array(), end._array()
        W = weight._array() if type(weight) is Tensor else weight
        return from_array(S + W * (E - S))

    @staticmethod
    def backward(ctx, g):
        weight, start, end = ctx.saved_tensors
        ns, ne, nw = ctx.needs_input_grad
        G = g._array()
        W = ctx.scalar_w if weight is None else weight._array()
        s_shape, e_shape, w_shape = ctx.shapes
        return (_grad_to(G * (1 - W), s_shape, g.dtype) if ns else None,
                _grad_to(G * W, e_shape, g.dtype) if ne else None,
                _grad_to(G * (end._array() - start._array()), w_shape, g.dtype) if nw else None)


# ----------------------------------------------------------------------------- entry points
@op(Atan2, method=("atan2", "arctan2"), ta=("atan2", "arctan2"))
def atan2(x, other): return Atan2.apply(x, other)

@op(Hypot, method=True, ta=True)
def hypot(x, other): return Hypot.apply(x, other)

@op(Copysign, method=True, ta=True)
def copysign(x, other): return Copysign.apply(x, other)

@op(Fmod, method=True, ta=True)
def fmod(x, other): return Fmod.apply(x, other)

@op(LogAddExp, method=True, ta=True)
def logaddexp(x, other): return LogAddExp.apply(x, other)

@op(Lerp, method=True, ta=True)
def lerp(x, end, weight): return Lerp.apply(x, end, weight)


@op(Add, Mul, method=True, ta=True)
def addcmul(input, tensor1, tensor2, *, value=1):  # noqa: A002 - torch's argument names
    """input + value * tensor1 * tensor2 (an optimizer's fused update, in torch's spelling)."""
    product = mul(tensor1, tensor2)
    return add(input, product if value == 1 else mul(product, value))


@op(Add, Mul, Div, method=True, ta=True)
def addcdiv(input, tensor1, tensor2, *, value=1):  # noqa: A002
    """input + value * tensor1 / tensor2; integer tensor1 and tensor2 are refused, as torch's
    (it would be a floor division in old torch)."""
    for t in (tensor1, tensor2):
        if type(t) is Tensor and not (t.dtype.is_floating_point):
            raise RuntimeError(f"addcdiv: integer division with addcdiv is no longer "
                               f"supported (a {t.dtype.name} operand of shape "
                               f"{tuple(t.shape)}); use input + value * tensor1 / tensor2")
    quotient = div(tensor1, tensor2)
    return add(input, quotient if value == 1 else mul(quotient, value))
