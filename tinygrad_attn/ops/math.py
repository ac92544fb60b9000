"""Elementwise math as torch names it: trigonometric and hyperbolic functions, erf and its
relatives, logs and exponentials in other bases, reciprocal and square. Their siblings:
rounding.py (floor, round, sign, ...), binary_math.py (atan2, hypot, fmod, lerp, ...) and
logical.py (the predicates and the logical and bitwise ops).

Result dtypes follow torch (docs/dtypes.md): a floating op turns integer and bool inputs into
the default dtype; binary ops promote with backend.promote.
"""

from __future__ import annotations

import math

from .. import backend
from ..autograd import Function
from ._math_util import _float_input, _xp
from ._util import from_array
from .registry import op

_LN2 = math.log(2.0)
_LN10 = math.log(10.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_SQRT_PI_OVER_TWO = math.sqrt(math.pi) / 2.0


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


# ----------------------------------------------------------------------------- entry points
@op(Sin, method=True, ta=True)
def sin(x): return Sin.apply(x)

@op(Cos, method=True, ta=True)
def cos(x): return Cos.apply(x)

@op(Tan, method=True, ta=True)
def tan(x): return Tan.apply(x)

@op(Asin, method=("asin", "arcsin"), ta=("asin", "arcsin"))
def asin(x): return Asin.apply(x)

@op(Acos, method=("acos", "arccos"), ta=("acos", "arccos"))
def acos(x): return Acos.apply(x)

@op(Atan, method=("atan", "arctan"), ta=("atan", "arctan"))
def atan(x): return Atan.apply(x)

@op(Sinh, method=True, ta=True)
def sinh(x): return Sinh.apply(x)

@op(Cosh, method=True, ta=True)
def cosh(x): return Cosh.apply(x)

@op(Asinh, method=("asinh", "arcsinh"), ta=("asinh", "arcsinh"))
def asinh(x): return Asinh.apply(x)

@op(Acosh, method=("acosh", "arccosh"), ta=("acosh", "arccosh"))
def acosh(x): return Acosh.apply(x)

@op(Atanh, method=("atanh", "arctanh"), ta=("atanh", "arctanh"))
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
