"""Scans along one dim: cumsum, cumprod, cummax/cummin, logcumsumexp.

A scalar (0-d) input is scanned as one element, as torch does; integer and bool inputs of
cumsum/cumprod give int64, as torch's do.
"""

from __future__ import annotations

from .. import backend, return_types
from ..autograd import Function
from ..autograd.graph import recording
from ._axis import as_1d, dim_of, positions, put_along, reverse_cumsum, scan
from ._recorded import add_at, backward_xp, ufunc_out
from ._util import Tensor, from_array
from .registry import op


def _accumulate_dtype(x: Tensor, dtype):
    """torch's result dtype of cumsum/cumprod: the requested one, else int64 for integers
    and bool, else the input's."""
    if dtype is not None:
        return backend.to_dtype(dtype)
    return backend.accumulating(x.dtype)


def add_along(xp, shape, dtype, idx, values, axis: int):
    """zeros(shape) with `values` added at `idx` along axis (repeats sum): put_along's
    accumulating form, and, in a recorded backward (create_graph), the same sum recorded
    (np.add.at has no recorded meaning; add_at's index_add has)."""
    if not recording():
        return put_along(xp, shape, dtype, idx, values, axis, accumulate=True)
    from .indexing import _full_index

    return add_at(xp.zeros(shape, dtype=dtype), _full_index(xp, idx, axis), values)


class Cumsum(Function):
    """y_j = sum_{i<=j} x_i;  gx_i = sum_{j>=i} g_j (a reversed cumsum). Saves nothing."""

    @staticmethod
    def forward(ctx, x, dim, dtype=None):
        d = dim_of(x, dim, "cumsum")
        out_dtype = _accumulate_dtype(x, dtype)
        ctx.d, ctx.in_dtype = d, x.dtype
        xp = backend.xp_for(x.device)
        X = as_1d(x._array())
        acc = "float32" if out_dtype is backend.float16 else out_dtype.np  # as torch: half
        Y = xp.cumsum(X, axis=d, dtype=acc)  # accumulates in float32, rounded once
        return from_array(Y.astype(out_dtype.np, copy=False).reshape(x.shape))

    @staticmethod
    def backward(ctx, g):
        xp = backward_xp(g.device)
        G = as_1d(g._array())
        return from_array(reverse_cumsum(xp, G, ctx.d).reshape(g.shape).astype(
            ctx.in_dtype.np, copy=False))


class Cumprod(Function):
    """y_j = prod_{i<=j} x_i;  gx_k = sum_{j>=k} g_j prod_{i<=j, i!=k} x_i.

    Zero-safe, as torch's: before the first zero of a slice gx = revcumsum(g y) / x; at the
    first zero the products skip it (a cumprod with that zero set to 1); after it gx = 0.
    Saves the input only: backward recomputes y with one cumprod rather than keep it.
    """

    @staticmethod
    def forward(ctx, x, dim, dtype=None):
        d = dim_of(x, dim, "cumprod")
        out_dtype = _accumulate_dtype(x, dtype)
        ctx.d = d
        ctx.save_for_backward(x)
        xp = backend.xp_for(x.device)
        X = as_1d(x._array())
        acc = "float32" if out_dtype is backend.float16 else out_dtype.np  # as torch: half
        Y = xp.cumprod(X, axis=d, dtype=acc)  # accumulates in float32, rounded once
        return from_array(Y.astype(out_dtype.np, copy=False).reshape(x.shape))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        xp = backward_xp(x.device)
        d = ctx.d
        X, G = as_1d(x._array()), as_1d(g._array()).astype(x.dtype.np, copy=False)
        zeros_so_far = xp.cumsum(X == 0, axis=d)
        before = zeros_so_far == 0
        first_zero = (zeros_so_far == 1) & (X == 0)
        Y = xp.cumprod(X, axis=d)
        gx = xp.where(before, reverse_cumsum(xp, G * Y, d) / xp.where(before, X, 1), 0)
        skip_zero = xp.cumprod(xp.where(first_zero, 1, X), axis=d)
        at_zero = xp.sum(xp.where(before, 0, G * skip_zero), axis=d, keepdims=True)
        gx = gx + xp.where(first_zero, at_zero, 0)
        return from_array(gx.reshape(x.shape).astype(x.dtype.np, copy=False))


class CumExtreme(Function):
    """(values, indices) = cummax / cummin(x, dim);  gx = g added at the indices.

    The index of a running extreme is the last position that reached it (ties pick the
    later one, as torch's). Saves the indices (int64) only.
    """

    materialize_grads = False

    @staticmethod
    def forward(ctx, x, dim, pick):
        d = dim_of(x, dim, pick)
        xp = backend.xp_for(x.device)
        X = as_1d(x._array())
        fn = xp.maximum if pick == "cummax" else xp.minimum
        values = scan(xp, fn, X, d)
        # a position that equals the running extreme is where the extreme was last reached
        hit = (X == values) | (X != X)  # NaN propagates: it is its own running extreme
        idx = scan(xp, xp.maximum, xp.where(hit, positions(xp, X.shape, d), 0), d)
        ctx.shape, ctx.d = x.shape, d
        indices = from_array(idx.reshape(x.shape))
        ctx.save_for_backward(indices)
        return from_array(values.reshape(x.shape)), indices

    @staticmethod
    def backward(ctx, g, _g_indices):
        (indices,) = ctx.saved_tensors
        xp = backward_xp(g.device)
        G = as_1d(g._array())
        idx = as_1d(indices._array())
        out = add_along(xp, G.shape, G.dtype, idx, G, ctx.d)
        return from_array(out.reshape(ctx.shape))


class LogCumSumExp(Function):
    """y_j = log sum_{i<=j} exp(x_i);  gx_i = sum_{j>=i} g_j exp(x_i - y_j).

    Forward is a logaddexp scan (no overflow, no underflow of small early terms). Backward
    splits g by sign and does the sum in log space too. Saves the input and the output.
    """

    @staticmethod
    def forward(ctx, x, dim):
        if not x.dtype.is_floating_point:
            raise TypeError(f"logcumsumexp: expected a floating point tensor, got {x.dtype.name}")
        d = dim_of(x, dim, "logcumsumexp")
        xp = backend.xp_for(x.device)
        y = from_array(scan(xp, xp.logaddexp, as_1d(x._array()), d).reshape(x.shape))
        ctx.d = d
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        xp = backward_xp(x.device)
        d = ctx.d
        X, Y, G = (as_1d(t._array()) for t in (x, y, g))
        out = xp.zeros_like(X)
        # recorded (create_graph): the left-out terms are the lowest finite number, not
        # -inf, whose difference with y has no derivative in y (-inf - y is -inf whatever
        # y is), so the next derivative would miss y's part; the values are the same
        low = xp.finfo(X.dtype).min if recording() else -xp.inf
        for sign in (1, -1):
            part = G * sign
            positive = part > 0
            log_part = xp.where(positive, xp.log(xp.where(positive, part, 1)), low) - Y
            rev = xp.flip(scan(xp, xp.logaddexp, xp.flip(log_part, d), d), d)
            out = ufunc_out(xp.add, out, sign * xp.exp(rev + X), out=out)
        return from_array(out.reshape(x.shape))


# ----------------------------------------------------------------------------- entry points
@op(Cumsum, method=True, ta=True)
def cumsum(x, dim, dtype=None):
    return Cumsum.apply(x, dim, dtype=dtype)


@op(Cumprod, method=True, ta=True)
def cumprod(x, dim, dtype=None):
    return Cumprod.apply(x, dim, dtype=dtype)


@op(CumExtreme, method=True, ta=True)
def cummax(x, dim):
    return return_types.cummax(*CumExtreme.apply(x, dim, "cummax"))


@op(CumExtreme, method=True, ta=True)
def cummin(x, dim):
    return return_types.cummin(*CumExtreme.apply(x, dim, "cummin"))


@op(LogCumSumExp, method=True, ta=True)
def logcumsumexp(x, dim):
    return LogCumSumExp.apply(x, dim)
