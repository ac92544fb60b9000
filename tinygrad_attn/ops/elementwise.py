"""Elementwise ops with NumPy broadcasting; backward sums gradients back to input shapes."""

from __future__ import annotations

from .. import backend
from .. import shape as shp
from ..autograd import Function
from ..autograd.graph import Recorded
from ..backend.dtypes import checked_scalar, scalar_as
from ._recorded import backward_xp
from ._util import Tensor, broadcast_shape, check_same_device, from_array, operand, unbroadcast
from .registry import op


def _shape(x):
    return x._shape if type(x) is Tensor else ()


def _scalars(a, b):
    """The Python-number operands of a binary op (None for a Tensor), for its backward."""
    return (None if type(a) is Tensor else a, None if type(b) is Tensor else b)


def _in(x, dtype):
    """An operand in the op's result dtype: a Tensor's array cast (no copy when it already
    is), a Python number as a NumPy scalar of that dtype. NumPy then computes in exactly
    that dtype: a 0-d float64 operand never turns a float32 array into a float64 result.
    An int beyond an integer dtype's range wraps into it, as torch's (scalar_as). A saved
    tensor as a recorded backward sees it (create_graph=True) gives its recorded array."""
    if type(x) is Tensor or type(x) is Recorded:
        return x._array().astype(dtype.np, copy=False)
    if isinstance(x, (bool, int, float)):
        return scalar_as(x, dtype)
    return x


def _binary_arrays(op: str, a, b, floating: bool = False):
    """(A, B, xp, dtype) of a binary op after device and broadcast checks: both operands in
    the result dtype (backend.promote; `floating`: at least the default float)."""
    if (type(a) is Tensor and type(b) is Tensor and a.dtype is b.dtype
            and a.device == b.device):
        # the common case, decided without the general checks: promote gives the shared
        # dtype whatever the two dims are, and each array is already in it
        if a._shape != b._shape:
            shp.broadcast_shapes(a._shape, b._shape, op=op)
        dtype = backend.floating(a.dtype) if floating else a.dtype
        A, B = a._array(), b._array()
        if dtype is not a.dtype:
            A, B = A.astype(dtype.np), B.astype(dtype.np)
        return A, B, backend.xp_for(a.device), dtype
    device = check_same_device(op, a, b)
    operand(a, None), operand(b, None)  # a clear TypeError for a non-number operand
    broadcast_shape(op, a, b)
    dtype = backend.promote(a, b)
    if floating:
        dtype = backend.floating(dtype)
    return _in(a, dtype), _in(b, dtype), backend.xp_for(device), dtype


def check_integer_divisor(op: str, a, b, B, dtype) -> None:
    """Integer division by zero raises, as torch's (a RuntimeError, "ZeroDivisionError"), for
    every op that divides in an integer dtype (floor_divide, remainder, fmod): NumPy would
    give 0 with a warning. True division (float) gives inf instead, and an empty result has
    nothing to divide."""
    if dtype.is_floating_point:
        return
    zero = (B == 0) if type(b) is not Tensor else (B == 0).any()
    if zero and shp.numel(broadcast_shape(op, a, b)):
        shapes = " and ".join(str(tuple(t.shape)) if type(t) is Tensor else type(t).__name__
                              for t in (a, b))
        raise RuntimeError(f"{op}: ZeroDivisionError: integer division by zero (operands "
                           f"{shapes}, dtype {dtype.name})")


def _remember(ctx, a, b, dtype):
    """What every binary backward reads: operand shapes and dtypes, and the result dtype."""
    if type(a) is Tensor and type(b) is Tensor:  # the common case, without the helpers
        ctx.shapes, ctx.dtypes = (a._shape, b._shape), (a.dtype, b.dtype)
        ctx.scalars = (None, None)
    else:
        ctx.shapes = (_shape(a), _shape(b))
        ctx.dtypes = (a.dtype if type(a) is Tensor else None,
                      b.dtype if type(b) is Tensor else None)
        ctx.scalars = _scalars(a, b)
    ctx.dtype = dtype


def _grad(ctx, i, g) -> Tensor:
    """The gradient of operand i from `g` (a Tensor, passed on as it is when it already
    fits, or a fresh array): in the operand's own dtype, summed down to its shape."""
    dtype = ctx.dtypes[i]
    if type(g) is not Tensor:
        g = from_array(g)
    if g._shape != ctx.shapes[i]:
        g = unbroadcast(g, ctx.shapes[i])
    if dtype is None or g.dtype is dtype:
        return g
    # summed in the result dtype first, then cast (as torch; and the cast array is smaller)
    return from_array(g._array().astype(dtype.np))


def _saved(ctx, i, t):
    """Operand i for backward, in the result dtype: its saved tensor or its Python number."""
    return _in(ctx.scalars[i] if t is None else t, ctx.dtype)


_wrap = from_array  # an array as a new tensor (the name the ops below read best with)


def _float_in(x: Tensor):
    """x's array for a floating op: integers and bool become the default float (as torch)."""
    return x._array().astype(backend.floating(x.dtype).np, copy=False)


def _no_bool(op: str, what: str, *operands) -> None:
    if all(type(t) is Tensor and t.dtype is backend.bool_ for t in operands):
        shapes = ", ".join(str(tuple(t.shape)) for t in operands)
        raise RuntimeError(f"{op}: {what} on bool tensors is not supported (shapes {shapes}); "
                           "use logical_xor / logical_not, or cast to an integer dtype")


# ----------------------------------------------------------------------------- binary
class Add(Function):
    """y = a + b;  ga = g, gb = g (summed over broadcast dims). Saves nothing."""

    @staticmethod
    def forward(ctx, a, b):
        A, B, xp, dtype = _binary_arrays("add", a, b)
        _remember(ctx, a, b, dtype)
        return _wrap(xp.add(A, B))

    @staticmethod
    def backward(ctx, g):
        na, nb = ctx.needs_input_grad
        return (_grad(ctx, 0, g) if na else None, _grad(ctx, 1, g) if nb else None)


class Sub(Function):
    """y = a - b;  ga = g, gb = -g. Saves nothing."""

    @staticmethod
    def forward(ctx, a, b):
        _no_bool("sub", "subtraction (the - operator)", a, b)
        if any(t is True or t is False or (type(t) is Tensor and t.dtype is backend.bool_)
               for t in (a, b)):  # torch: one bool operand is enough to refuse
            raise RuntimeError("sub: subtraction (the - operator) with a bool tensor is not "
                               f"supported (shapes {_shape(a)} and {_shape(b)}); to invert a "
                               "mask use ~ or logical_not()")
        A, B, xp, dtype = _binary_arrays("sub", a, b)
        _remember(ctx, a, b, dtype)
        return _wrap(xp.subtract(A, B))

    @staticmethod
    def backward(ctx, g):
        na, nb = ctx.needs_input_grad
        return (_grad(ctx, 0, g) if na else None, _grad(ctx, 1, -g._array()) if nb else None)


class Mul(Function):
    """y = a * b;  ga = g * b, gb = g * a. Saves each input only if the other needs a grad."""

    @staticmethod
    def forward(ctx, a, b):
        A, B, xp, dtype = _binary_arrays("mul", a, b)
        na, nb = ctx.needs_input_grad
        _remember(ctx, a, b, dtype)
        ctx.save_for_backward(
            a if nb and type(a) is Tensor else None, b if na and type(b) is Tensor else None
        )
        return _wrap(xp.multiply(A, B))

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        na, nb = ctx.needs_input_grad
        G = g._array()
        ga = _grad(ctx, 0, G * _saved(ctx, 1, b)) if na else None
        gb = _grad(ctx, 1, G * _saved(ctx, 0, a)) if nb else None
        return ga, gb


class Div(Function):
    """y = a / b (integers divide to the default float);  ga = g / b, gb = -g * a / b^2.
    Saves a and b (as needed)."""

    @staticmethod
    def forward(ctx, a, b):
        A, B, xp, dtype = _binary_arrays("div", a, b, floating=True)
        _remember(ctx, a, b, dtype)
        nb = ctx.needs_input_grad[1]
        ctx.save_for_backward(
            a if nb and type(a) is Tensor else None, b if type(b) is Tensor else None
        )
        return _wrap(xp.true_divide(A, B))

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        na, nb = ctx.needs_input_grad
        G = g._array()
        B = _saved(ctx, 1, b)
        ga = _grad(ctx, 0, G / B) if na else None
        gb = _grad(ctx, 1, -G * _saved(ctx, 0, a) / (B * B)) if nb else None
        return ga, gb


class DivRounded(Function):
    """y = trunc(a / b) or floor(a / b) (div's rounding_mode), in the promoted dtype;
    ga = gb = 0 (the result is piecewise constant), as torch. Saves nothing."""

    @staticmethod
    def forward(ctx, a, b, mode):
        op_name = f"div(rounding_mode={mode!r})"
        A, B, xp, dtype = _binary_arrays(op_name, a, b)
        check_integer_divisor(op_name, a, b, B, dtype)
        _remember(ctx, a, b, dtype)
        if mode == "floor":  # Python's floor division, for floats too (as torch's)
            return _wrap(xp.floor_divide(A, B))
        if dtype.is_floating_point:
            return _wrap(xp.trunc(xp.true_divide(A, B)))
        q = xp.floor_divide(A, B)  # toward zero: one up where the signs differ, inexactly
        return _wrap(q + ((A % B != 0) & ((A < 0) != (B < 0))).astype(q.dtype))

    @staticmethod
    def backward(ctx, g):
        zeros = backend.xp_for(g.device).zeros_like(g._array())
        na, nb = ctx.needs_input_grad[:2]
        return (_grad(ctx, 0, zeros) if na else None, _grad(ctx, 1, zeros) if nb else None,
                None)


class Pow(Function):
    """y = a ** b;  ga = g * b * a^(b-1) (0 where b = 0), gb = g * y * log(a) (0 where
    a = 0 and b >= 0), as torch defines the gradient at those points. Saves a, b and (for
    gb) y."""

    @staticmethod
    def forward(ctx, a, b):
        A, B, xp, dtype = _binary_arrays("pow", a, b)
        if type(b) is not Tensor and dtype not in (backend.float32, backend.float64):
            checked_scalar("pow", b, dtype)  # torch checks the exponent's range (float32 and
            # float64 take it as a double)
        negative = (b < 0) if type(b) is not Tensor else bool(xp.any(xp.asarray(B) < 0))
        if not dtype.is_floating_point and negative:
            raise RuntimeError(f"pow: integers to negative integer powers are not allowed "
                               f"(shapes {_shape(a)} and {_shape(b)})")
        _remember(ctx, a, b, dtype)
        y = _wrap(xp.power(A, B))
        nb = ctx.needs_input_grad[1]
        ctx.save_for_backward(
            a if type(a) is Tensor else None, b if type(b) is Tensor else None,
            y if nb else None,
        )
        return y

    @staticmethod
    def backward(ctx, g):
        a, b, y = ctx.saved_tensors
        na, nb = ctx.needs_input_grad
        xp = backward_xp(g.device)
        G = g._array()
        A, B = _saved(ctx, 0, a), _saved(ctx, 1, b)
        ga = gb = None
        if na:
            ga = _grad(ctx, 0, xp.where(B == 0, 0, G * B * A ** (B - 1)).astype(G.dtype))
        if nb:
            log_a = xp.log(A)  # nan for a < 0, as torch's real log (never a domain error)
            gb = xp.where((A == 0) & (B >= 0), 0, G * y._array() * log_a).astype(G.dtype)
            gb = _grad(ctx, 1, gb)
        return ga, gb


class Remainder(Function):
    """y = a mod b (sign of b, as Python's %);  ga = g, gb = -g * floor(a / b). Saves a, b."""

    @staticmethod
    def forward(ctx, a, b):
        A, B, xp, dtype = _binary_arrays("remainder", a, b)
        check_integer_divisor("remainder", a, b, B, dtype)
        _remember(ctx, a, b, dtype)
        nb = ctx.needs_input_grad[1]
        ctx.save_for_backward(a if nb and type(a) is Tensor else None,
                              b if nb and type(b) is Tensor else None)
        return _wrap(xp.remainder(A, B))

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        na, nb = ctx.needs_input_grad
        G = g._array()
        ga = _grad(ctx, 0, g) if na else None
        gb = None
        if nb:
            xp = backend.xp_for(g.device)
            gb = _grad(ctx, 1, -G * xp.floor(_saved(ctx, 0, a) / _saved(ctx, 1, b)))
        return ga, gb


@op(method=True, ta=True)
def floor_divide(x, other) -> Tensor:
    """x // other, elementwise (not differentiable: its derivative is zero almost everywhere)."""
    A, B, xp, dtype = _binary_arrays("floor_divide", x, other)
    check_integer_divisor("floor_divide", x, other, B, dtype)
    with backend.errstate(all="ignore"):  # floats divide as IEEE, silently (as torch)
        return _wrap(xp.floor_divide(A, B))


class _MinMax(Function):
    """y = max(a, b) (or min);  the gradient goes to the chosen input, split evenly on ties.

    Saves a and b (the comparison is all backward needs, but both operands define it).
    """

    pick = "maximum"

    @classmethod
    def forward(cls, ctx, a, b):
        A, B, xp, dtype = _binary_arrays(cls.pick, a, b)
        _remember(ctx, a, b, dtype)
        ctx.save_for_backward(a if type(a) is Tensor else None, b if type(b) is Tensor else None)
        return _wrap(getattr(xp, cls.pick)(A, B))

    @classmethod
    def backward(cls, ctx, g):
        a, b = ctx.saved_tensors
        A, B = _saved(ctx, 0, a), _saved(ctx, 1, b)
        G = g._array()
        wins = (A > B) if cls.pick == "maximum" else (A < B)
        share_a = (wins + 0.5 * (A == B)).astype(G.dtype)
        na, nb = ctx.needs_input_grad
        ga = _grad(ctx, 0, G * share_a) if na else None
        gb = _grad(ctx, 1, G * (1 - share_a)) if nb else None
        return ga, gb


class Maximum(_MinMax):
    pick = "maximum"


class Minimum(_MinMax):
    pick = "minimum"


# ----------------------------------------------------------------------------- unary
class Neg(Function):
    """y = -x;  gx = -g. Saves nothing."""

    @staticmethod
    def forward(ctx, x):
        if x.dtype is backend.bool_:
            raise RuntimeError(f"neg: negation (the - operator) of a bool tensor (shape "
                               f"{tuple(x.shape)}) is not supported; use ~ or logical_not")
        return _wrap(-x._array())

    @staticmethod
    def backward(ctx, g):
        return _wrap(-g._array())


class Exp(Function):
    """y = exp(x);  gx = g * y. Saves the output (backward needs exactly y)."""

    @staticmethod
    def forward(ctx, x):
        y = _wrap(backend.xp_for(x.device).exp(_float_in(x)))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return _wrap(g._array() * y._array())


class Log(Function):
    """y = log(x);  gx = g / x. Saves the input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _wrap(backend.xp_for(x.device).log(_float_in(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return _wrap(g._array() / x._array())


class Sqrt(Function):
    """y = sqrt(x);  gx = g / (2 y). Saves the output."""

    @staticmethod
    def forward(ctx, x):
        y = _wrap(backend.xp_for(x.device).sqrt(_float_in(x)))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return _wrap(g._array() / (2 * y._array()))


class Rsqrt(Function):
    """y = 1/sqrt(x);  gx = -g * y^3 / 2. Saves the output."""

    @staticmethod
    def forward(ctx, x):
        xp = backend.xp_for(x.device)
        root = xp.asarray(xp.sqrt(_float_in(x)))  # asarray: a 0-d input gives a scalar
        y = _wrap(xp.reciprocal(root, out=root))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        Y = y._array()
        return _wrap(-0.5 * g._array() * Y * Y * Y)


class Abs(Function):
    """y = |x|;  gx = g * sign(x). Saves the input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _wrap(backend.xp_for(x.device).abs(x._array()))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return _wrap(g._array() * backend.xp_for(x.device).sign(x._array()))


class Clamp(Function):
    """y = min(max(x, lo), hi);  gx = g where lo <= x <= hi, else 0. Saves the input."""

    @staticmethod
    def forward(ctx, x, lo=None, hi=None):
        if lo is None and hi is None:
            raise RuntimeError("clamp: at least one of min and max must be given")
        ctx.bounds = (lo, hi)
        ctx.save_for_backward(x)
        dtype = backend.promote(x, lo, hi)  # an int tensor with float bounds: a float result
        # a bound must fit the result's dtype, as torch checks it, and is read in it
        lo, hi = (None if b is None else checked_scalar("clamp", b, dtype) for b in (lo, hi))
        X = x._array().astype(dtype.np, copy=False)
        xp = backend.xp_for(x.device)
        out = X
        if lo is not None:
            out = xp.maximum(out, lo)
        if hi is not None:
            out = xp.minimum(out, hi)
        return _wrap(out.astype(dtype.np, copy=False))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        lo, hi = ctx.bounds
        X = x._array()
        inside = True
        if lo is not None:
            inside = X >= lo
        if hi is not None:
            inside = inside & (X <= hi) if lo is not None else X <= hi
        return _wrap(g._array() * inside)


class ClampTensor(Function):
    """y = min(max(x, lo), hi) with tensor bounds (broadcast);  gx = g where lo <= x <= hi,
    g_lo = g where x < lo < hi, g_hi = g where x > hi or hi < lo (as torch).

    Saves x and the tensor bounds: the comparisons are all backward needs.
    """

    @staticmethod
    def forward(ctx, x, lo, hi):
        device = check_same_device("clamp", x, lo, hi)
        shp.broadcast_shapes(x.shape, _shape(lo), _shape(hi), op="clamp")
        dtype = backend.promote(x, lo, hi)
        xp = backend.xp_for(device)
        X, LO, HI = (v._array().astype(dtype.np, copy=False) if type(v) is Tensor else v
                     for v in (x, lo, hi))
        ctx.scalars = tuple(None if type(v) is Tensor else v for v in (lo, hi))
        ctx.shapes = (x.shape, _shape(lo), _shape(hi))
        ctx.save_for_backward(x, *(v if type(v) is Tensor else None for v in (lo, hi)))
        out = X
        if lo is not None:
            out = xp.maximum(out, LO)
        if hi is not None:
            out = xp.minimum(out, HI)
        return _wrap(xp.asarray(out).astype(dtype.np, copy=False))

    @staticmethod
    def backward(ctx, g):
        x, lo, hi = ctx.saved_tensors
        X, G = x._array(), g._array()
        LO = ctx.scalars[0] if lo is None else lo._array()
        HI = ctx.scalars[1] if hi is None else hi._array()
        inside = True
        if LO is not None:
            inside = X >= LO
        if HI is not None:
            inside = (X <= HI) & inside
        nx, nlo, nhi = ctx.needs_input_grad
        gx = unbroadcast(_wrap(G * inside), ctx.shapes[0]) if nx else None
        glo = ghi = None
        if nlo:
            below = X < LO if HI is None else (X < LO) & (LO < HI)
            glo = unbroadcast(_wrap(G * below), ctx.shapes[1])
        if nhi:
            above = X > HI if LO is None else (X > HI) | (HI < LO)
            ghi = unbroadcast(_wrap(G * above), ctx.shapes[2])
        return gx, glo, ghi


# ----------------------------------------------------------------------------- no grad
_COMPARE = {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
            "gt": "greater", "ge": "greater_equal"}


@op()  # ta.eq, x.eq, ..., a == b: ops/logical.py names each comparison
def compare(a, b, how: str) -> Tensor:
    """Elementwise comparison: a bool tensor, never differentiable."""
    A, B, xp, _ = _binary_arrays(how, a, b)
    return _wrap(getattr(xp, _COMPARE[how])(A, B))


@op()  # a & b, a | b
def logical(a, b, how: str) -> Tensor:
    A, B, xp, _ = _binary_arrays(how, a, b)
    return _wrap(xp.logical_and(A, B) if how == "and" else xp.logical_or(A, B))


@op(method=True, ta=True)  # also ~a
def bitwise_not(a: Tensor) -> Tensor:
    """Logical not of a bool tensor, bitwise not of an integer one (as torch's)."""
    xp = backend.xp_for(a.device)
    A = a._array()
    return _wrap(xp.logical_not(A) if A.dtype == bool else xp.invert(A))


# ----------------------------------------------------------------------------- entry points

def _times(other, alpha):  # add's and sub's alpha: other * alpha, then the sum
    if alpha == 1:
        return other
    return Mul.apply(other, alpha) if type(other) is Tensor else other * alpha

@op(Add, Mul, method=True, ta=True)
def add(x, other, *, alpha=1):
    return Add.apply(x, other if alpha == 1 else _times(other, alpha))

@op(Sub, Mul, method=("sub", "subtract"), ta=("sub", "subtract"))
def sub(x, other, *, alpha=1):
    return Sub.apply(x, other if alpha == 1 else _times(other, alpha))

@op(Mul, method=("mul", "multiply"), ta=("mul", "multiply"))
def mul(x, other): return Mul.apply(x, other)

@op(Div, DivRounded, method=("div", "divide", "true_divide"),
    ta=("div", "divide", "true_divide"))
def div(x, other, *, rounding_mode=None):
    if rounding_mode is None:
        return Div.apply(x, other)
    if rounding_mode not in ("trunc", "floor"):
        raise RuntimeError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' "
                           f"but found {rounding_mode!r}")
    return DivRounded.apply(x, other, rounding_mode)

@op(Pow, method=True, ta=True)
def pow(x, exponent): return Pow.apply(x, exponent)  # noqa: A001

@op(Remainder, method=True, ta=True)
def remainder(x, other): return Remainder.apply(x, other)

def _two_tensors(op_name, x, other):
    if type(x) is not Tensor or type(other) is not Tensor:
        raise TypeError(f"{op_name}: both operands must be Tensors (as torch's), got "
                        f"{type(x).__name__} and {type(other).__name__}; use clamp for a number")

@op(Maximum, method=True, ta=True, functional=True)
def maximum(x, other):
    _two_tensors("maximum", x, other)
    return Maximum.apply(x, other)

@op(Minimum, method=True, ta=True, functional=True)
def minimum(x, other):
    _two_tensors("minimum", x, other)
    return Minimum.apply(x, other)

@op(Neg, method=("neg", "negative"), ta=("neg", "negative"))
def neg(x): return Neg.apply(x)

@op(Exp, method=True, ta=True, functional=True)
def exp(x): return Exp.apply(x)

@op(Log, method=True, ta=True, functional=True)
def log(x): return Log.apply(x)

@op(Sqrt, method=True, ta=True, functional=True)
def sqrt(x): return Sqrt.apply(x)

@op(Rsqrt, method=True, ta=True, functional=True)
def rsqrt(x): return Rsqrt.apply(x)

@op(Abs, method=("abs", "absolute"), ta=("abs", "absolute"))
def abs(x): return Abs.apply(x)  # noqa: A001

@op(Clamp, ClampTensor, method=("clamp", "clip"), ta=("clamp", "clip"),
    functional=True)
def clamp(x, min=None, max=None):  # noqa: A002
    if type(min) is Tensor or type(max) is Tensor:
        if min is None and max is None:
            raise RuntimeError("clamp: at least one of min and max must be given")
        return ClampTensor.apply(x, min, max)
    return Clamp.apply(x, lo=min, hi=max)
