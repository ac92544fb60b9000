"""Sorting and selection along a dim: sort, argsort, topk, kthvalue, median, mode, and
take_along_dim, which they all end in.

Each selection first computes integer positions (a stable argsort, no gradient) and then
takes the values there with one differentiable op, `TakeAlong`: its backward adds the
gradient back at those positions, so every one of these ops saves only its indices.
"""

from __future__ import annotations

from .. import backend, return_types
from .. import shape as shp
from ..autograd import Function
from ..errors import ShapeError
from ._axis import as_1d, dim_of, positions, scan
from ._recorded import backward_xp
from ._util import Tensor, check_same_device, from_array
from .registry import op
from .scan import add_along


class TakeAlong(Function):
    """y = take_along_axis(x, idx, dim);  gx = zeros with g added at idx (repeats sum).

    Saves the indices (int64), not x.
    """

    @staticmethod
    def forward(ctx, x, indices, dim):
        check_same_device("take_along_dim", x, indices)
        X, I = as_1d(x._array()), as_1d(indices._array())
        n = X.shape[dim]
        if I.size and (int(I.min()) < -n or int(I.max()) >= n):
            raise RuntimeError(f"take_along_dim: index out of range for dim {dim} of size {n} "
                             f"(input shape {tuple(x.shape)})")
        xp = backend.xp_for(x.device)
        I = xp.where(I < 0, I + n, I)
        ctx.shape, ctx.dim, ctx.scalar = X.shape, dim, x.ndim == 0
        ctx.save_for_backward(from_array(I))
        out = xp.take_along_axis(X, I, axis=dim)
        return from_array(out.reshape(indices.shape) if x.ndim == 0 else out)

    @staticmethod
    def backward(ctx, g):
        (indices,) = ctx.saved_tensors
        xp = backward_xp(g.device)
        G = as_1d(g._array())
        out = add_along(xp, ctx.shape, G.dtype, indices._array(), G, ctx.dim)
        return from_array(out.reshape(()) if ctx.scalar else out), None, None


def _argsort(xp, X, d: int, descending: bool):
    """A stable argsort along d (int64); descending keeps equal elements in their original
    order, as torch's stable sort does (NaN sorts as the largest value either way)."""
    if not descending:
        return xp.argsort(X, axis=d, kind="stable").astype(xp.int64, copy=False)
    n = X.shape[d]
    flipped = xp.argsort(xp.flip(X, d), axis=d, kind="stable")
    return (n - 1 - xp.flip(flipped, d)).astype(xp.int64, copy=False)


def _take(x: Tensor, idx, d: int, keepdim: bool = True):
    """(values, indices) at positions idx (an array along d of the 1-d-ised input)."""
    indices = from_array(idx)
    values = TakeAlong.apply(x, indices if x.ndim else indices.reshape(()), d)
    if x.ndim == 0:
        return values, indices.reshape(())
    if not keepdim:
        values, indices = values.squeeze(d), indices.squeeze(d)
    return values, indices


def _no_bool(op_name: str, x) -> None:
    """torch's topk, kthvalue and median have no bool kernel (sort and mode do)."""
    if type(x) is Tensor and x.dtype is backend.bool_:
        raise RuntimeError(f"{op_name}: not implemented for bool (shape {tuple(x.shape)})")


@op(TakeAlong, method=True, ta=True)
def sort(x, dim=-1, descending=False, stable=False):
    """(values, indices), sorted along dim; always stable (a valid choice for stable=False)."""
    d = dim_of(x, dim, "sort")
    xp = backend.xp_for(x.device)
    return return_types.sort(*_take(x, _argsort(xp, as_1d(x._array()), d, descending), d))


@op(method=True, ta=True)
def argsort(x, dim=-1, descending=False, stable=False):
    d = dim_of(x, dim, "argsort")
    xp = backend.xp_for(x.device)
    idx = _argsort(xp, as_1d(x._array()), d, descending)
    return from_array(idx.reshape(()) if x.ndim == 0 else idx)


@op(TakeAlong, method=True, ta=True)
def topk(x, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    """The k largest (or smallest) along dim, in order (sorted=False returns them sorted)."""
    _no_bool("topk", x)
    d = dim_of(x, dim, "topk")
    xp = backend.xp_for(x.device)
    X = as_1d(x._array())
    if not 0 <= k <= X.shape[d]:
        raise RuntimeError(f"topk: selected index k={k} out of range for dim {d} of size "
                           f"{X.shape[d]} (shape {tuple(x.shape)})")
    idx = _argsort(xp, X, d, descending=largest)
    return return_types.topk(*_take(x, idx[(slice(None),) * d + (slice(0, k),)], d))


def _nonempty(x: Tensor, X, d: int, op: str) -> None:
    if X.shape[d] == 0:
        raise IndexError(f"{op}(): Expected reduction dim {d} to have non-zero size "
                         f"(shape {tuple(x.shape)})")


@op(TakeAlong, method=True, ta=True)
def kthvalue(x, k, dim=-1, keepdim=False):
    """(values, indices) of the k-th smallest element (1-based) along dim."""
    _no_bool("kthvalue", x)
    d = dim_of(x, dim, "kthvalue")
    xp = backend.xp_for(x.device)
    X = as_1d(x._array())
    if not 1 <= k <= X.shape[d]:
        raise RuntimeError(f"kthvalue: selected number k={k} out of range for dim {d} of "
                           f"size {X.shape[d]} (shape {tuple(x.shape)})")
    idx = _argsort(xp, X, d, False)[(slice(None),) * d + (slice(k - 1, k),)]
    return return_types.kthvalue(*_take(x, idx, d, keepdim))


class MedianAll(Function):
    """y = the lower median of all elements (NaN if any is NaN; nanmedian: of the others,
    NaN if all are);  gx = g / k at the k positions equal to y, as torch's. Saves the mask
    of those positions (bool)."""

    @staticmethod
    def forward(ctx, x, skip_nan=False):
        xp = backend.xp_for(x.device)
        X = x._array().reshape(-1)
        if X.size == 0:
            ctx.save_for_backward(from_array(xp.zeros(x.shape, dtype=bool)))
            return from_array(xp.asarray(xp.nan, dtype=X.dtype))
        S = xp.sort(X)  # NaN last
        nans = int(xp.sum(X != X))
        if skip_nan:
            Y = S[(X.size - nans - 1) // 2] if nans < X.size else S[0]
        else:
            Y = S[X.size - nans] if nans else S[(X.size - 1) // 2]
        if x.dtype.is_floating_point:
            hit = (x._array() == Y) | ((x._array() != x._array()) & (Y != Y))
            ctx.save_for_backward(from_array(hit))
        return from_array(xp.asarray(Y))

    @staticmethod
    def backward(ctx, g):
        (hit,) = ctx.saved_tensors
        xp = backward_xp(g.device)
        H = hit._array()
        return from_array(xp.where(H, g._array() / xp.maximum(xp.sum(H), 1), 0).astype(
            g.dtype.np, copy=False))


@op(MedianAll, TakeAlong, method=True, ta=True)
def median(x, dim=None, keepdim=False):
    """median(x): the lower median of all elements; median(x, dim): (values, indices).

    A slice holding NaN has median NaN (the index of its first NaN), as torch's.
    """
    _no_bool("median", x)
    if dim is None:
        return MedianAll.apply(x)
    d = dim_of(x, dim, "median")
    xp = backend.xp_for(x.device)
    X = as_1d(x._array())
    _nonempty(x, X, d, "median")
    n = X.shape[d]
    order = _argsort(xp, X, d, False)
    nans = xp.sum(X != X, axis=d, keepdims=True)
    k = xp.where(nans > 0, n - nans, (n - 1) // 2).astype(xp.int64)
    return return_types.median(*_take(x, xp.take_along_axis(order, k, axis=d), d, keepdim))


@op(MedianAll, TakeAlong, method=True, ta=True)
def nanmedian(x, dim=None, keepdim=False):
    """median with NaN left out: the lower median of the other elements (NaN where a slice
    is all NaN, the index of its first), as torch's."""
    _no_bool("nanmedian", x)
    if dim is None:
        return MedianAll.apply(x, skip_nan=True)
    d = dim_of(x, dim, "nanmedian")
    xp = backend.xp_for(x.device)
    X = as_1d(x._array())
    _nonempty(x, X, d, "nanmedian")
    order = _argsort(xp, X, d, False)  # NaN last
    valid = xp.sum(X == X, axis=d, keepdims=True)
    k = xp.where(valid > 0, (valid - 1) // 2, 0).astype(xp.int64)
    return return_types.nanmedian(*_take(x, xp.take_along_axis(order, k, axis=d), d,
                                         keepdim))


@op(TakeAlong, method=True, ta=True)
def mode(x, dim=-1, keepdim=False):
    """(values, indices): the most frequent value along dim (the smallest one on a tie in
    counts) and the position of its last occurrence, as torch's."""
    d = dim_of(x, dim, "mode")
    xp = backend.xp_for(x.device)
    X = as_1d(x._array())
    _nonempty(x, X, d, "mode")
    n = X.shape[d]
    order = _argsort(xp, X, d, False)
    S = xp.take_along_axis(X, order, axis=d)
    pos = positions(xp, S.shape, d)
    head = (slice(None),) * d
    edge = xp.ones(S.shape[:d] + (1,) + S.shape[d + 1:], dtype=bool)
    starts = xp.concatenate([edge, S[head + (slice(1, None),)] != S[head + (slice(0, -1),)]],
                            axis=d)
    ends = xp.concatenate([S[head + (slice(1, None),)] != S[head + (slice(0, -1),)], edge],
                          axis=d)
    run_start = scan(xp, xp.maximum, xp.where(starts, pos, 0), d)
    run_end = xp.flip(scan(xp, xp.minimum, xp.flip(xp.where(ends, pos, n - 1), d), d), d)
    best = xp.argmax(run_end - run_start, axis=d, keepdims=True)  # the first (smallest) run
    last = xp.take_along_axis(run_end, best, axis=d)
    return return_types.mode(*_take(x, xp.take_along_axis(order, last, axis=d), d, keepdim))


@op(TakeAlong, ta=True, method=True)
def take_along_dim(x, indices, dim=None):
    """x's values at `indices` along dim (indices broadcast against x, as torch's); with
    dim=None, x and indices are flattened."""
    if type(indices) is not Tensor:
        raise TypeError("take_along_dim: indices must be a Tensor")
    if indices.dtype.is_floating_point or indices.dtype.name == "bool":
        raise TypeError(f"take_along_dim: indices must be int64, got {indices.dtype.name}")
    if dim is None:
        return TakeAlong.apply(x.reshape(-1), indices.reshape(-1), 0)
    d = dim_of(x, dim, "take_along_dim")
    if indices.ndim != x.ndim:
        raise ShapeError(f"take_along_dim: input of shape {tuple(x.shape)} and indices of "
                         f"shape {tuple(indices.shape)} must have the same number of dims")
    xs = list(x.shape)
    ishape = list(indices.shape)
    xs[d] = ishape[d] = 1
    common = shp.broadcast_shapes(tuple(xs), tuple(ishape), op="take_along_dim")
    x_shape = common[:d] + (x.shape[d],) + common[d + 1:]
    i_shape = common[:d] + (indices.shape[d],) + common[d + 1:]
    return TakeAlong.apply(x.expand(x_shape), indices.expand(i_shape), d)
