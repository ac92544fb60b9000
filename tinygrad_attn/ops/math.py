"""Elementwise math as torch names it: trigonometric and hyperbolic functions, erf and its
relatives, logs and exponentials in other bases, rounding, sign, the binary functions
(atan2, hypot, copysign, fmod, logaddexp, lerp) and the predicates and bitwise/logical ops.

Result dtypes follow torch (docs/dtypes.md): a floating op turns integer and bool inputs into
the default dtype; binary ops promote with backend.promote.
"""

from __future__ import annotations

import math

from .. import backend
from .. import shape as shp
from ..autograd import Function
from ._util import Tensor, broadcast_shape, check_same_device, from_array, unbroadcast
from .registry import op

_LN2 = math.log(2.0)
_LN10 = math.log(10.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_SQRT_PI_OVER_TWO = math.sqrt(math.pi) / 2.0


# ----------------------------------------------------------------------------- dtypes
def _floating(dtype):
    return backend.floating(dtype)


def _as(x, dtype):
    """The array (or the Python scalar) of an operand, in the op's compute dtype."""
    if type(x) is Tensor:
        return x._array().astype(dtype.np, copy=False)
    return x


def _float_input(x: Tensor):
    """x's array in the dtype of a floating op's result (integers and bool: the default)."""
    return _as(x, _floating(x.dtype))


def _xp(t: Tensor):
    return backend.xp_for(t.device)


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


# ----------------------------------------------------------------------------- kernels
# erfc by a Chebyshev series in u = 2t - 1, t = 2 / (2 + z), of log(erfc(z) exp(z^2) / t)
# on z >= 0 (relative error ~1e-13 in float64, where exp(-z^2) rounds); fitted to a
# 40-digit erfc. It keeps full relative precision in the tail where 1 - erf(z) has none.
_ERFC_CHEB = (
    -0.6513268598908547, 0.6419697923564902, 0.019476473204185815,
    -0.009561514786808643, -0.0009465953444819461, 0.00036683949785265156,
    4.2523324806999506e-05, -2.0278578112627893e-05, -1.6242900045931831e-06,
    1.3036558354500412e-06, 1.562644191694862e-08, -8.52380963171511e-08,
    6.529054986033127e-09, 5.059342838475009e-09, -9.913633856617073e-10,
    -2.2736592936239561e-10, 9.646869614564836e-11, 2.392940672209495e-12,
    -6.8846758660969324e-12, 8.928893555526185e-13, 3.1488701309143194e-13,
    -1.1435158494546063e-13, 1.8928977337007185e-15, 5.622724475289294e-15,
)


def _erfc_array(xp, X):
    z = xp.abs(X)
    t = 2 / (2 + z)
    u = 2 * t - 1
    d = xp.zeros_like(z)
    dd = xp.zeros_like(z)
    for c in _ERFC_CHEB[:0:-1]:  # Clenshaw's recurrence for sum c_k T_k(u)
        d, dd = 2 * u * d - dd + c, d
    series = u * d - dd + _ERFC_CHEB[0]
    y = t * xp.exp(series - z * z)
    return xp.where(X < 0, 2 - y, y)


# erfinv: Giles' single-precision polynomials in w = -log(1 - y^2), then (float64) two
# Newton steps on erf(x) = y, which the exact float64 erf of the backend makes exact.
_GILES_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                  0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_GILES_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
               0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _erfinv_array(xp, Y):
    edge = xp.abs(Y) >= 1
    safe = xp.where(edge, 0, Y)
    w = -xp.log((1 - safe) * (1 + safe))
    wc, wt = w - 2.5, xp.sqrt(w) - 3
    pc = xp.zeros_like(w) + _GILES_CENTRAL[0]
    pt = xp.zeros_like(w) + _GILES_TAIL[0]
    for cc, ct in zip(_GILES_CENTRAL[1:], _GILES_TAIL[1:]):
        pc = pc * wc + cc
        pt = pt * wt + ct
    x = xp.where(w < 5, pc, pt) * safe
    if Y.dtype.itemsize >= 8:
        for _ in range(2):
            x = x - (_erf_array(xp, x) - safe) / (_TWO_OVER_SQRT_PI * xp.exp(-x * x))
    limit = xp.where(xp.abs(Y) == 1, xp.copysign(xp.asarray(math.inf, dtype=Y.dtype), Y),
                     math.nan)
    return xp.where(edge, limit, x).astype(Y.dtype, copy=False)


def _erf_array(xp, X):
    X = xp.asarray(X)
    if X.ndim == 0:  # the backend's erf takes arrays of at least one dimension
        return _erf_array(xp, X.reshape(1)).reshape(())
    if X.dtype.itemsize < 4:  # float16: compute in float32, as torch does on the CPU
        return backend.erf(X.astype("float32")).astype(X.dtype)
    return backend.erf(X)


# ----------------------------------------------------------------------------- unary
class Sin(Function):
    """y = sin(x);  gx = g cos(x). Saves the input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return from_array(_xp(x).sin(_float_input(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return from_array(g._array() * _xp(x).cos(x._array()))


class Cos(Function):
    """y = cos(x);  gx = -g sin(x). Saves the input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return from_array(_xp(x).cos(_float_input(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return from_array(-g._array() * _xp(x).sin(x._array()))


class Tan(Function):
    """y = tan(x);  gx = g (1 + y^2). Saves the output (backward needs exactly y)."""

    @staticmethod
    def forward(ctx, x):
        y = from_array(_xp(x).tan(_float_input(x)))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        Y = y._array()
        return from_array(g._array() * (1 + Y * Y))


class Asin(Function):
    """y = asin(x);  gx = g / sqrt(1 - x^2). Saves the input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return from_array(_xp(x).arcsin(_float_input(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        X = x._array()
        return from_array(g._array() / _xp(x).sqrt(1 - X * X))


class Acos(Function):
    """y = acos(x);  gx = -g / sqrt(1 - x^2). Saves the input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return from_array(_xp(x).arccos(_float_input(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        X = x._array()
        return from_array(-g._array() / _xp(x).sqrt(1 - X * X))


class Atan(Function):
    """y = atan(x);  gx = g / (1 + x^2). Saves the input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return from_array(_xp(x).arctan(_float_input(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        X = x._array()
        return from_array(g._array() / (1 + X * X))


class Sinh(Function):
    """y = sinh(x);  gx = g cosh(x). Saves the input (cosh from y alone loses the sign)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return from_array(_xp(x).sinh(_float_input(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return from_array(g._array() * _xp(x).cosh(x._array()))


class Cosh(Function):
    """y = cosh(x);  gx = g sinh(x). Saves the input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return from_array(_xp(x).cosh(_float_input(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return from_array(g._array() * _xp(x).sinh(x._array()))


class Asinh(Function):
    """y = asinh(x);  gx = g / sqrt(x^2 + 1). Saves the input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return from_array(_xp(x).arcsinh(_float_input(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        X = x._array()
        return from_array(g._array() / _xp(x).sqrt(X * X + 1))


class Acosh(Function):
    """y = acosh(x);  gx = g / sqrt((x - 1)(x + 1)). Saves the input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return from_array(_xp(x).arccosh(_float_input(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        X = x._array()
        return from_array(g._array() / _xp(x).sqrt((X - 1) * (X + 1)))


class Atanh(Function):
    """y = atanh(x);  gx = g / (1 - x^2). Saves the input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return from_array(_xp(x).arctanh(_float_input(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        X = x._array()
        return from_array(g._array() / (1 - X * X))


class Erf(Function):
    """y = erf(x);  gx = g 2/sqrt(pi) exp(-x^2). Saves the input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return from_array(_erf_array(_xp(x), _float_input(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        X = x._array()
        return from_array(g._array() * _TWO_OVER_SQRT_PI * _xp(x).exp(-X * X))


class Erfc(Function):
    """y = erfc(x) = 1 - erf(x);  gx = -g 2/sqrt(pi) exp(-x^2). Saves the input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return from_array(_erfc_array(_xp(x), _float_input(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        X = x._array()
        return from_array(g._array() * -_TWO_OVER_SQRT_PI * _xp(x).exp(-X * X))


class Erfinv(Function):
    """y = erfinv(x);  gx = g sqrt(pi)/2 exp(y^2). Saves the output (the derivative is a
    function of y alone)."""

    @staticmethod
    def forward(ctx, x):
        y = from_array(_erfinv_array(_xp(x), _float_input(x)))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        Y = y._array()
        return from_array(g._array() * _SQRT_PI_OVER_TWO * _xp(y).exp(Y * Y))


class Log2(Function):
    """y = log2(x);  gx = g / (x ln 2). Saves the input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return from_array(_xp(x).log2(_float_input(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return from_array(g._array() / (x._array() * _LN2))


class Log10(Function):
    """y = log10(x);  gx = g / (x ln 10). Saves the input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return from_array(_xp(x).log10(_float_input(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return from_array(g._array() / (x._array() * _LN10))


class Log1p(Function):
    """y = log(1 + x);  gx = g / (1 + x). Saves the input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return from_array(_xp(x).log1p(_float_input(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return from_array(g._array() / (1 + x._array()))


class Exp2(Function):
    """y = 2^x;  gx = g y ln 2. Saves the output."""

    @staticmethod
    def forward(ctx, x):
        y = from_array(_xp(x).exp2(_float_input(x)))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return from_array(g._array() * y._array() * _LN2)


class Expm1(Function):
    """y = exp(x) - 1;  gx = g (y + 1). Saves the output."""

    @staticmethod
    def forward(ctx, x):
        y = from_array(_xp(x).expm1(_float_input(x)))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return from_array(g._array() * (y._array() + 1))


class Reciprocal(Function):
    """y = 1 / x;  gx = -g y^2. Saves the output."""

    @staticmethod
    def forward(ctx, x):
        y = from_array(_xp(x).reciprocal(_float_input(x)))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        Y = y._array()
        return from_array(-g._array() * Y * Y)


class Square(Function):
    """y = x^2;  gx = 2 x g. Saves the input. Integers stay integers (torch's x * x)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        X = x._array()
        if X.dtype == bool:
            X = X.astype(backend.int64.np)
        return from_array(_xp(x).square(X))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return from_array(2 * x._array() * g._array())


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
        xp = backend.xp_for(g.device)
        G = g._array()
        return _grads(ctx, lambda: G * xp.sign(A) * xp.copysign(1.0, B),
                      lambda: xp.zeros_like(G))


class Fmod(Function):
    """y = a - trunc(a / b) b (the sign of a, as C's fmod);  ga = g, gb = -g trunc(a / b).

    Saves a and b.
    """

    @staticmethod
    def forward(ctx, a, b):
        A, B, xp, _ = _binary("fmod", a, b)
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
@op(Sin, method=True, ta=True)
def sin(x): return Sin.apply(x)

@op(Cos, method=True, ta=True)
def cos(x): return Cos.apply(x)

@op(Tan, method=True, ta=True)
def tan(x): return Tan.apply(x)

@op(Asin, method=("asin", "arcsin"), ta=True)
def asin(x): return Asin.apply(x)

@op(Acos, method=("acos", "arccos"), ta=True)
def acos(x): return Acos.apply(x)

@op(Atan, method=("atan", "arctan"), ta=True)
def atan(x): return Atan.apply(x)

@op(Sinh, method=True, ta=True)
def sinh(x): return Sinh.apply(x)

@op(Cosh, method=True, ta=True)
def cosh(x): return Cosh.apply(x)

@op(Asinh, method=("asinh", "arcsinh"), ta=True)
def asinh(x): return Asinh.apply(x)

@op(Acosh, method=("acosh", "arccosh"), ta=True)
def acosh(x): return Acosh.apply(x)

@op(Atanh, method=("atanh", "arctanh"), ta=True)
def atanh(x): return Atanh.apply(x)

@op(Erf, method=True, ta=True)
def erf(x): return Erf.apply(x)

@op(Erfc, method=True, ta=True)
def erfc(x): return Erfc.apply(x)

@op(Erfinv, method=True, ta=True)
def erfinv(x): return Erfinv.apply(x)

@op(Log2, method=True, ta=True)
def log2(x): return Log2.apply(x)

@op(Log10, method=True, ta=True)
def log10(x): return Log10.apply(x)

@op(Log1p, method=True, ta=True)
def log1p(x): return Log1p.apply(x)

@op(Exp2, method=True, ta=True)
def exp2(x): return Exp2.apply(x)

@op(Expm1, method=True, ta=True)
def expm1(x): return Expm1.apply(x)

@op(Reciprocal, method=True, ta=True)
def reciprocal(x): return Reciprocal.apply(x)

@op(Square, method=True, ta=True)
def square(x): return Square.apply(x)

@op(Frac, method=True, ta=True)
def frac(x): return Frac.apply(x)

@op(Floor, method=True, ta=True)
def floor(x): return Floor.apply(x)

@op(Ceil, method=True, ta=True)
def ceil(x): return Ceil.apply(x)

@op(Trunc, method=("trunc", "fix"), ta=True)
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

@op(Atan2, method=("atan2", "arctan2"), ta=True)
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


# ----------------------------------------------------------------------------- no grad
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
    A, B, xp, _ = _binary(name, a, b)
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
