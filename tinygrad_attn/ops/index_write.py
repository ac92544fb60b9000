"""Writes by index: scatter, scatter_add, scatter_reduce, index_add/copy/fill,
masked_select/masked_scatter, and the integer-valued nonzero and one_hot.

Every output is a new tensor (the input is copied, then written); the in-place forms are
not here. Positions are checked against the target's size first, as torch checks them:
scatter, scatter_add and scatter_reduce take 0 <= i < n (RuntimeError otherwise),
index_add and index_copy too (index_copy: IndexError; index_add: RuntimeError, IndexError
on a 1-D input), index_fill also takes -n <= i < 0 (counted from
the end, as setitem does).
"""

from __future__ import annotations

from .. import backend
from .. import shape as shp
from ..autograd import Function
from ..autograd.graph import recording, unwrap
from ..backend.dtypes import checked_scalar
from ._axis import as_1d, check_index, dim_of, scan
from ._recorded import add_at, constant
from ._util import Tensor, check_same_device, from_array, unbroadcast
from .indexing import _full_index
from .registry import op


def _bounds(op: str, I, n: int, d: int, error=RuntimeError, negative: bool = False):
    """Every position in [0, n), or with `negative` in [-n, n): a -1 would otherwise write
    the last element where torch refuses it."""
    low = -n if negative else 0
    if I.size and (int(I.min()) < low or int(I.max()) >= n):
        bad = int(I.max()) if int(I.max()) >= n else int(I.min())
        raise error(f"{op}: index {bad} is out of bounds for dimension {d} with size {n}")


def _grid(xp, x_shape, index_arr, d: int):
    """The full index tuple that `index` (along d) addresses in a tensor of x_shape (its
    positions are checked to lie in [0, n) already)."""
    return _full_index(xp, index_arr, d)


def _linear(xp, shape, grid, index_shape):
    """Flat positions in a C-contiguous array of `shape` for a full index tuple."""
    lin = xp.zeros(index_shape, dtype=xp.int64)
    for k, g in enumerate(grid):
        lin = lin + g * shp.numel(shape[k + 1:])
    return lin.reshape(-1)


def _src_part(src, index_shape):
    """The leading index-shaped block of src (torch reads only that much of it)."""
    return src[tuple(slice(0, n) for n in index_shape)]




_COMBINE = {"prod": "multiply", "amax": "maximum", "amin": "minimum"}


def _reduce_into(xp, flat, lin, vals, how: str) -> None:
    """flat[lin] (op)= vals with repeated positions all combined.

    Sum uses the backend's scatter-add; the other reductions sort the positions and
    apply one whole-array update per rank within a run of equal positions, so no two
    writes of one update hit the same element (a loop of max-repeat-count passes).
    """
    if lin.size == 0:
        return
    if how in ("sum", "mean"):
        backend.scatter_add(flat, lin, vals)
        return
    order = xp.argsort(lin, kind="stable")
    ls, vs = lin[order], vals[order]
    pos = xp.arange(ls.size, dtype=xp.int64)
    starts = xp.concatenate([xp.ones(1, dtype=bool), ls[1:] != ls[:-1]])
    rank = pos - scan(xp, xp.maximum, xp.where(starts, pos, 0), 0)
    fn = getattr(xp, _COMBINE[how])
    for r in range(int(rank.max()) + 1):
        sel = rank == r
        p = ls[sel]
        flat[p] = fn(flat[p], vs[sel])


def _identity(xp, how: str, dtype):
    if how in ("sum", "mean"):
        return 0
    if how == "prod":
        return 1
    big = xp.inf if dtype.kind == "f" else xp.iinfo(dtype).max
    return -big if how == "amax" else big


class ScatterReduce(Function):
    """y = x with src reduced into y[..index..] ("sum", "prod", "mean", "amax", "amin";
    "none": plain scatter, the last write wins);  gradients as torch's:
    sum/none: gx = g (zero where overwritten), gsrc = g gathered at index;
    mean: g / count; amax/amin: g shared evenly among the values equal to y;
    prod: g y / v, zero-safe (a single zero gets the product of the others).

    Saves the index (integers); amax/amin and prod also save x, src and y.
    """

    @staticmethod
    def forward(ctx, x, dim, index, src, how, include_self=True):
        op_name = "scatter" if how == "none" else f"scatter_reduce({how})"
        check_same_device(op_name, x, index, src)
        d = dim_of(x, dim, op_name)
        src_is_tensor = type(src) is Tensor
        check_index(op_name, x, index, d, src if src_is_tensor else None)
        xp = backend.xp_for(x.device)
        X, I = as_1d(x._array()), as_1d(index._array())
        _bounds(op_name, I, X.shape[d], d)
        if src_is_tensor and src.dtype is not x.dtype:
            raise RuntimeError(f"{op_name}: expected self and src to have the same dtype, got "
                               f"{x.dtype.name} and {src.dtype.name}")
        grid = _grid(xp, X.shape, I, d)
        vals = (_src_part(as_1d(src._array()), I.shape) if src_is_tensor
                else xp.full(I.shape, checked_scalar(op_name, src, x.dtype), dtype=X.dtype))
        out = X.copy()
        lin = _linear(xp, X.shape, grid, I.shape)
        flat = out.reshape(-1)
        if how == "none":
            flat[lin] = vals.reshape(-1)
        else:
            if not include_self:
                flat[lin] = _identity(xp, how, X.dtype)
            _reduce_into(xp, flat, lin, vals.reshape(-1), how)
            if how == "mean":
                count = xp.zeros(X.size, dtype=X.dtype)
                backend.scatter_add(count, lin, xp.ones(lin.size, dtype=X.dtype))
                count = count + (1 if include_self else 0)
                count = xp.where(count == 0, 1, count)
                flat[...] = (flat // count) if X.dtype.kind in "iu" else (flat / count)
        ctx.x_shape, ctx.src_shape = x.shape, (src.shape if src_is_tensor else None)
        ctx.d, ctx.how, ctx.include_self, ctx.shape1 = d, how, include_self, X.shape
        y = from_array(out.reshape(x.shape))
        keep = (x, src, index, y) if how in ("amax", "amin", "prod") else (index,)
        ctx.save_for_backward(*keep)
        return y

    @staticmethod
    def backward(ctx, g):
        saved = ctx.saved_tensors
        index = saved[-1] if len(saved) == 1 else saved[2]
        xp = backend.xp_for(g.device)
        how, shape1 = ctx.how, ctx.shape1
        G = as_1d(g._array())
        I = as_1d(unwrap(index)._array())
        grid = _grid(xp, shape1, I, ctx.d)
        lin = _linear(xp, shape1, grid, I.shape)
        hit = xp.zeros(G.size, dtype=bool)
        hit[lin] = True
        hit = constant(hit.reshape(shape1))
        gx = gsrc_part = None
        if how in ("none", "sum"):
            keep_self = how == "sum" and ctx.include_self
            gx = G if keep_self else xp.where(hit, 0, G)
            gsrc_part = G[grid]
        elif how == "mean":
            count = xp.zeros(G.size, dtype=G.dtype)
            backend.scatter_add(count, lin, xp.ones(lin.size, dtype=G.dtype))
            count = count.reshape(shape1) + (1 if ctx.include_self else 0)
            scaled = G / constant(xp.where(count == 0, 1, count))
            gx = scaled if ctx.include_self else xp.where(hit, 0, G)
            gsrc_part = scaled[grid]
        else:
            x, src, _, y = saved
            X, Y = as_1d(x._array()), as_1d(y._array())
            S = _src_part(as_1d(src._array()), I.shape)
            if how in ("amax", "amin"):
                self_eq = (X == Y) & (True if ctx.include_self else ~hit)
                src_eq = S == Y[grid]
                count = self_eq.astype(G.dtype).reshape(-1)
                backend.scatter_add(count, lin, src_eq.astype(G.dtype).reshape(-1))
                share = G / constant(count.reshape(shape1))
                gx = xp.where(constant(self_eq), share, 0)
                gsrc_part = xp.where(constant(src_eq), share[grid], 0)
            else:  # prod
                gx, gsrc_part = _prod_grads(xp, ctx, X, Y, S, G, I, grid, lin, hit)
        gx = from_array(gx.reshape(ctx.x_shape))
        gsrc = None
        if ctx.src_shape is not None and ctx.needs_input_grad[3]:
            full = xp.zeros(ctx.src_shape or (1,), dtype=G.dtype)
            if recording():  # the block torch read, written by the idiom that records
                full = add_at(full, tuple(slice(0, n) for n in I.shape), gsrc_part)
            else:
                _src_part(full, I.shape)[...] = gsrc_part
            gsrc = from_array(full.reshape(ctx.src_shape))
        return gx, None, None, gsrc


def _prod_grads(xp, ctx, X, Y, S, G, I, grid, lin, hit):
    """torch's zero-safe gradients of scatter_reduce(prod). The masks are constants of a
    recorded backward (constant); the products are recorded, so their derivatives flow."""
    def forward(self_arr, src_arr):
        out = self_arr.copy()
        flat = out.reshape(-1)
        if not ctx.include_self:
            flat[lin] = 1
        _reduce_into(xp, flat, lin, src_arr.reshape(-1), "prod")
        # flat is a view of out; a recorded flat is the array the writes went into
        return flat.reshape(self_arr.shape)

    if ctx.include_self:
        self_zero = constant(X == 0)
        masked_self_result = forward(xp.where(self_zero, 1, X), S)
        gx = xp.where(self_zero, G * masked_self_result, G * Y / xp.where(self_zero, 1, X))
    else:
        gx = xp.where(hit, 0, G)
    src_zero = S == 0
    zeros_at = xp.zeros(X.size, dtype=G.dtype)
    backend.scatter_add(zeros_at, lin, src_zero.astype(G.dtype).reshape(-1))
    single = src_zero & (zeros_at.reshape(X.shape)[grid] == 1)
    single, src_zero = constant(single), constant(src_zero)
    masked_src_result = forward(X, xp.where(single, 1, S))
    gsrc = xp.where(single, (G * masked_src_result)[grid],
                    (G * Y)[grid] / xp.where(src_zero, 1, S))
    return gx, gsrc


_REDUCES = ("sum", "prod", "mean", "amax", "amin")


@op(ScatterReduce, method=True, ta=True)
def scatter(x, dim, index, src=None, value=None, *, reduce=None):
    """y = x with src (a tensor) or value (a number) written at index along dim."""
    if reduce is not None:
        raise NotImplementedError("scatter: reduce= is not supported; use scatter_reduce")
    if src is None:
        src = value
    if src is None:
        raise TypeError("scatter: expected src (a Tensor) or value (a number)")
    return ScatterReduce.apply(x, dim, index, src, "none")


@op(ScatterReduce, method=True, ta=True)
def scatter_add(x, dim, index, src):
    return ScatterReduce.apply(x, dim, index, src, "sum")


@op(ScatterReduce, method=True, ta=True)
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    if reduce not in _REDUCES:
        raise RuntimeError(f"scatter_reduce: reduce must be one of {_REDUCES}, got {reduce!r}")
    if type(src) is not Tensor:
        raise TypeError("scatter_reduce: src must be a Tensor")
    return ScatterReduce.apply(x, dim, index, src, reduce, include_self)


# ----------------------------------------------------------------------------- index_*
def _check_index_1d(op: str, index: Tensor):
    if index.ndim > 1:
        raise IndexError(f"{op}: index must be 0-D or 1-D, got shape {tuple(index.shape)}")
    if index.dtype.is_floating_point or index.dtype.name == "bool":
        raise IndexError(f"{op}: index must be an integer tensor, got {index.dtype.name}")


class IndexWrite(Function):
    """y = x with source added ("add", times alpha) or copied ("copy") at the rows index
    selects along dim, or those rows filled with a value ("fill");
    gx = g (add) or g with those rows zeroed (copy, fill); gsource = alpha g[rows];
    gvalue = sum of g over those rows (fill with a 0-d tensor). Saves the index.
    """

    @staticmethod
    def forward(ctx, x, dim, index, source, how, alpha=1):
        op_name = f"index_{how}"
        check_same_device(op_name, x, index, source)
        d = dim_of(x, dim, op_name)
        _check_index_1d(op_name, index)
        xp = backend.xp_for(x.device)
        X = as_1d(x._array())
        I = index._array().reshape(-1)
        # torch's error types: index_add's is RuntimeError but for a 1-D input (IndexError)
        error = RuntimeError if how == "add" and x.ndim > 1 else IndexError
        _bounds(op_name, I, X.shape[d], d, error, negative=how == "fill")
        I = xp.where(I < 0, I + X.shape[d], I)
        rows = (slice(None),) * d + (I,)
        out = X.copy()
        if how == "fill":
            if type(source) is Tensor and source.ndim != 0:
                raise IndexError(f"index_fill: value must be a 0-d tensor, got shape "
                                 f"{tuple(source.shape)}")
            out[rows] = (source._array() if type(source) is Tensor
                         else checked_scalar("index_fill", source, x.dtype))  # must fit
        else:
            if type(source) is not Tensor or source.dtype is not x.dtype:  # torch: no promotion
                got = source.dtype.name if type(source) is Tensor else type(source).__name__
                raise RuntimeError(f"{op_name}: expected self and source to have the same "
                                   f"dtype, got {x.dtype.name} and {got}")
            S = as_1d(source._array())
            want = X.shape[:d] + (I.size,) + X.shape[d + 1:]
            if S.shape != want:
                raise RuntimeError(f"{op_name}: source of shape {tuple(source.shape)} does not "
                                   f"match {want} (input {tuple(x.shape)}, {I.size} indices)")
            if how == "add":
                backend.index_add(out, d, I, S * alpha if alpha != 1 else S)
            else:
                out[rows] = S
        ctx.d, ctx.how, ctx.alpha, ctx.shape1 = d, how, alpha, X.shape
        ctx.x_shape = x.shape
        ctx.source_shape = source.shape if type(source) is Tensor else None
        ctx.save_for_backward(from_array(I))
        return from_array(out.reshape(x.shape))

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        G = as_1d(g._array())
        I = unwrap(index)._array()
        rows = (slice(None),) * ctx.d + (I,)
        if ctx.how == "add":
            gx = G
        else:
            gx = G.copy()
            gx[rows] = 0
        gs = None
        if ctx.source_shape is not None and ctx.needs_input_grad[3]:
            # G[rows] is the same rows as take's, by an index a recorded array follows
            picked = G[rows] if recording() else xp.take(G, I, axis=ctx.d)
            if ctx.how == "fill":  # NumPy's sum is a scalar; a recorded one is 0-d already
                total = picked.sum()
                gs = from_array(total if recording() else xp.asarray(total))
            else:
                gs = from_array((picked * ctx.alpha).reshape(ctx.source_shape))
        return from_array(gx.reshape(ctx.x_shape)), None, None, gs


@op(IndexWrite, method=True, ta=True)
def index_add(x, dim, index, source, *, alpha=1):
    return IndexWrite.apply(x, dim, index, source, "add", alpha)


@op(IndexWrite, method=True, ta=True)
def index_copy(x, dim, index, source):
    return IndexWrite.apply(x, dim, index, source, "copy")


@op(IndexWrite, method=True, ta=True)
def index_fill(x, dim, index, value):
    return IndexWrite.apply(x, dim, index, value, "fill")


# ----------------------------------------------------------------------------- masks
def _check_mask(op: str, mask: Tensor):
    if type(mask) is not Tensor or mask.dtype.name != "bool":
        got = mask.dtype.name if type(mask) is Tensor else type(mask).__name__
        raise RuntimeError(f"{op}: expected a bool mask, got {got}")


class MaskedSelect(Function):
    """y = the elements of x where mask is True (x and mask broadcast), as a 1-D copy;
    gx = zeros with g put back at those positions (summed over broadcast dims).
    Saves the mask (bool), not x."""

    @staticmethod
    def forward(ctx, x, mask):
        check_same_device("masked_select", x, mask)
        _check_mask("masked_select", mask)
        shape = shp.broadcast_shapes(x.shape, mask.shape, op="masked_select")
        xp = backend.xp_for(x.device)
        M = xp.broadcast_to(mask._array(), shape)
        ctx.x_shape, ctx.shape = x.shape, shape
        ctx.save_for_backward(mask)
        return from_array(xp.broadcast_to(x._array(), shape)[M], "index-gather")

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        out = xp.zeros(ctx.shape, dtype=g.dtype.np)
        M = xp.broadcast_to(unwrap(mask)._array(), ctx.shape)
        if recording():  # g into the zeros by the idiom that records (no repeats: a put)
            out = add_at(out, M, g._array())
        else:
            out[M] = g._array()
        return unbroadcast(from_array(out), ctx.x_shape), None


@op(MaskedSelect, method=True, ta=True)
def masked_select(x, mask):
    return MaskedSelect.apply(x, mask)


class MaskedScatter(Function):
    """y = x with the positions where mask is True filled, in order, from source's first
    elements;  gx = g zeroed there, gsource = g at those positions (then zeros).
    Saves the mask (bool)."""

    @staticmethod
    def forward(ctx, x, mask, source):
        check_same_device("masked_scatter", x, mask, source)
        _check_mask("masked_scatter", mask)
        if shp.broadcast_shapes(x.shape, mask.shape, op="masked_scatter") != x.shape:
            raise RuntimeError(f"masked_scatter: mask of shape {tuple(mask.shape)} does not "
                               f"broadcast to the input's shape {tuple(x.shape)}")
        xp = backend.xp_for(x.device)
        M = xp.broadcast_to(mask._array(), x.shape)
        count = int(M.sum())
        if count > source.numel():
            raise RuntimeError(f"masked_scatter: mask selects {count} elements but source of "
                               f"shape {tuple(source.shape)} has {source.numel()}")
        out = x._array().copy()
        out[M] = source._array().reshape(-1)[:count]
        ctx.source_shape, ctx.count = source.shape, count
        ctx.save_for_backward(mask)
        return from_array(out)

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        G = g._array()
        M = xp.broadcast_to(mask._array(), G.shape)
        gx = xp.where(M, 0, G)
        gs = xp.zeros(shp.numel(ctx.source_shape), dtype=G.dtype)
        if recording():  # the first count elements, by the idiom that records
            gs = add_at(gs, slice(0, ctx.count), G[M])
        else:
            gs[: ctx.count] = G[M]
        return from_array(gx), None, from_array(gs.reshape(ctx.source_shape))


@op(MaskedScatter, method=True, ta=True)
def masked_scatter(x, mask, source):
    return MaskedScatter.apply(x, mask, source)


# ----------------------------------------------------------------------------- integers
@op(method=True, ta=True)
def nonzero(x, *, as_tuple=False):
    """The positions of the non-zero elements: an int64 (n, ndim) tensor, or with
    as_tuple one 1-D tensor per dim; never differentiable."""
    xp = backend.xp_for(x.device)
    X = x._array()
    if as_tuple:
        parts = xp.nonzero(as_1d(X))
        return tuple(from_array(p.astype(xp.int64)) for p in parts)
    if X.ndim == 0:
        return from_array(xp.zeros((int(X != 0), 0), dtype=xp.int64))
    return from_array(xp.stack(xp.nonzero(X), axis=1).astype(xp.int64).reshape(-1, X.ndim))


@op(functional=True)
def one_hot(x, num_classes=-1):
    """(..., num_classes) int64 with a 1 at each class index (num_classes=-1: max + 1)."""
    if x.dtype.name != "int64":
        raise RuntimeError(f"one_hot: expected an int64 tensor, got {x.dtype.name}")
    xp = backend.xp_for(x.device)
    X = x._array()
    if X.size and int(X.min()) < 0:
        raise RuntimeError("one_hot: class values must be non-negative")
    if num_classes == -1:
        if X.size == 0:
            raise RuntimeError("one_hot: cannot infer the number of classes of an empty tensor")
        num_classes = int(X.max()) + 1
    if X.size and int(X.max()) >= num_classes:
        raise RuntimeError(f"one_hot: class values must be smaller than num_classes="
                           f"{num_classes}")
    return from_array((X[..., None] == xp.arange(num_classes)).astype(xp.int64))

