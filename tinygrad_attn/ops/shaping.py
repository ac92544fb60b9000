"""Shape and movement ops beyond the basic views.

Views (no allocation, same Storage): diagonal, unfold, movedim/moveaxis, swapaxes/swapdims
and meshgrid's outputs. Copies, as in torch: flip (torch has no negative strides), roll,
repeat/tile, repeat_interleave, diag, pad. tril_indices/triu_indices build int64 tensors.
"""

from __future__ import annotations

from .. import backend
from .. import shape as shp
from ..autograd import Function
from ..autograd.graph import recording
from ..tensor import _make
from ._axis import dim_of
from ._util import Tensor, from_array, zeros_array
from .movement import (
    Expand,
    Permute,
    ReshapeCopy,
    Slice,
    Transpose,
    View,
    expand,
    getitem,
    permute,
    reshape,
    transpose,
    view,
)
from .registry import op


def _dims(x: Tensor, dims, op: str) -> tuple:
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if x.ndim == 0:  # a scalar accepts dim 0 / -1 and has nothing to move
        for d in dims:
            shp.normalize_dim(d, 0, op)
        return ()
    return shp.normalize_dims(dims, x.ndim, op)


class Flip(Function):
    """y = x reversed along dims (a copy, as torch's);  gx = flip(g). Saves nothing."""

    @staticmethod
    def forward(ctx, x, dims):
        ctx.dims = _dims(x, dims, "flip")
        xp = backend.xp_for(x.device)
        return from_array(backend.copy(xp.flip(x._array(), ctx.dims)))

    @staticmethod
    def backward(ctx, g):
        xp = backend.xp_for(g.device)
        return from_array(backend.copy(xp.flip(g._array(), ctx.dims)))


@op(Flip, method=True, ta=True)
def flip(x, dims):
    return Flip.apply(x, dims)


class Roll(Function):
    """y = x rolled by shifts along dims (flattened when dims is None);  gx = roll(g, -shifts).
    Saves nothing."""

    @staticmethod
    def forward(ctx, x, shifts, dims):
        shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
        if dims is not None:
            dims = _dims(x, dims, "roll")
            if len(dims) != len(shifts):
                raise RuntimeError(f"roll: shifts {shifts} and dims {dims} differ in length")
        elif len(shifts) != 1:
            raise RuntimeError(f"roll: shifts {shifts} need dims")
        ctx.shifts, ctx.dims = shifts, dims
        xp = backend.xp_for(x.device)
        return from_array(_roll(xp, x._array(), shifts, dims))

    @staticmethod
    def backward(ctx, g):
        xp = backend.xp_for(g.device)
        return from_array(_roll(xp, g._array(), tuple(-s for s in ctx.shifts), ctx.dims))


def _roll(xp, X, shifts, dims):
    if dims is None:
        return xp.roll(X.reshape(-1), shifts[0]).reshape(X.shape)
    if X.ndim == 0:
        return X.copy()
    return xp.roll(X, shifts, dims)


@op(Roll, method=True, ta=True)
def roll(x, shifts, dims=None):
    return Roll.apply(x, shifts, dims)


class Repeat(Function):
    """y = x tiled `sizes` times per dim (leading sizes add dims);  gx = g summed over the
    copies (a reshape to (r0, s0, r1, s1, ...) and a sum). Saves nothing."""

    @staticmethod
    def forward(ctx, x, sizes):
        if len(sizes) < x.ndim:
            raise RuntimeError(f"repeat: the number of repeat dims {len(sizes)} can not be "
                               f"smaller than the tensor's {x.ndim} dims (shape {x.shape})")
        if any(s < 0 for s in sizes):
            raise RuntimeError(f"repeat: negative repeat count in {sizes}")
        shape = (1,) * (len(sizes) - x.ndim) + x.shape
        ctx.in_shape, ctx.shape, ctx.sizes = x.shape, shape, sizes
        xp = backend.xp_for(x.device)
        return from_array(xp.tile(x._array().reshape(shape), sizes))

    @staticmethod
    def backward(ctx, g):
        split = []
        for r, s in zip(ctx.sizes, ctx.shape):
            split += [r, s]
        G = g._array().reshape(split)
        xp = backend.xp_for(g.device)
        summed = xp.sum(G, axis=tuple(range(0, len(split), 2)))
        return from_array(summed.reshape(ctx.in_shape))


@op(Repeat, method=True)
def repeat(x, *sizes):
    sizes = tuple(sizes[0]) if len(sizes) == 1 and not isinstance(sizes[0], int) else sizes
    return Repeat.apply(x, tuple(int(s) for s in sizes))


@op(Repeat, method=True, ta=True)
def tile(x, dims):
    """torch.tile: repeat, with too few dims padded by leading ones."""
    dims = tuple(dims)
    return Repeat.apply(x, (1,) * (x.ndim - len(dims)) + dims)


class RepeatInterleave(Function):
    """y = each element (slice along dim) of x repeated repeats[i] times;  gx = g summed
    over each run of copies (an index_add). Saves the repeat counts (int64)."""

    @staticmethod
    def forward(ctx, x, repeats, dim):
        xp = backend.xp_for(x.device)
        X = x._array()
        if dim is None:
            X, d = X.reshape(-1), 0
        else:
            d = dim_of(x, dim, "repeat_interleave")
            X = X.reshape(1) if X.ndim == 0 else X
        n = X.shape[d]
        if type(repeats) is Tensor:
            reps = repeats._array().reshape(-1)
            if reps.size == 1:
                reps = xp.full(n, int(reps[0]), dtype=xp.int64)
            if reps.size != n:
                raise RuntimeError(f"repeat_interleave: repeats must have {n} elements (the "
                                   f"size of dim {d} of shape {tuple(x.shape)}), got {reps.size}")
        else:
            reps = xp.full(n, int(repeats), dtype=xp.int64)
        if reps.size and int(reps.min()) < 0:
            raise RuntimeError("repeat_interleave: repeats can not be negative")
        reps_t = from_array(reps.astype(xp.int64))
        ctx.d, ctx.shape1, ctx.x_shape = d, X.shape, x.shape
        ctx.save_for_backward(reps_t)
        return from_array(xp.repeat(X, _counts(reps), axis=d))

    @staticmethod
    def backward(ctx, g):
        (reps,) = ctx.saved_tensors
        if recording():  # as an op of g, whose own derivative is repeat_interleave again
            return _RepeatInterleaveGrad.apply(g, reps, ctx.d, ctx.shape1, ctx.x_shape), None, None
        xp = backend.xp_for(g.device)
        R = reps._array()
        owner = xp.repeat(xp.arange(R.size, dtype=xp.int64), _counts(R))
        out = zeros_array(ctx.shape1, g.dtype, g.device)
        backend.index_add(out, ctx.d, owner, g._array())
        return from_array(out.reshape(ctx.x_shape)), None, None


class _RepeatInterleaveGrad(Function):
    """gx = RepeatInterleave's backward of g (each run of copies summed), as an op of g:
    what its recorded backward (create_graph=True) applies. The map is linear; its backward
    repeats the gradient again. Saves the repeat counts (int64)."""

    @staticmethod
    def forward(ctx, g, reps, d, shape1, x_shape):
        ctx.d, ctx.shape1, ctx.x_shape = d, shape1, x_shape
        ctx.save_for_backward(reps)
        return RepeatInterleave.backward(ctx, g)[0]

    @staticmethod
    def backward(ctx, gg):
        (reps,) = ctx.saved_tensors
        return RepeatInterleave.apply(gg.reshape(ctx.shape1), reps, ctx.d), None, None, None, None


def _counts(reps) -> list:
    """Repeat counts as a host list: CuPy's repeat takes an int or a list, not an array
    (the output's size depends on them, so they are read on the host anyway)."""
    return backend.to_host(reps).tolist()


@op(RepeatInterleave, method=True, ta=True)
def repeat_interleave(x, repeats=None, dim=None, *, output_size=None):
    """x.repeat_interleave(repeats, dim); repeat_interleave(counts) alone repeats each
    index i counts[i] times, as torch's."""
    if repeats is None:
        counts = x
        xp = backend.xp_for(counts.device)
        C = counts._array().reshape(-1)
        return from_array(xp.repeat(xp.arange(C.size, dtype=xp.int64), _counts(C)))
    return RepeatInterleave.apply(x, repeats, dim)


# ----------------------------------------------------------------------------- diagonals
def _diag_geometry(shape, strides, offset, k, d1, d2):
    """(shape, strides, storage offset) of the k-th diagonal of dims d1, d2, last."""
    s1, s2 = shape[d1], shape[d2]
    if k >= 0:
        length = max(0, min(s1, s2 - k))
        start = offset + k * strides[d2] if length else offset
    else:
        length = max(0, min(s1 + k, s2))
        start = offset - k * strides[d1] if length else offset
    keep = [i for i in range(len(shape)) if i not in (d1, d2)]
    new_shape = tuple(shape[i] for i in keep) + (length,)
    new_strides = tuple(strides[i] for i in keep) + (strides[d1] + strides[d2],)
    return new_shape, new_strides, start


class Diagonal(Function):
    """y = the offset-th diagonal of dims (dim1, dim2), as the last dim: a strided view, no
    copy;  gx = a zeros buffer of x's shape with g written into the same diagonal.
    Saves nothing."""

    @staticmethod
    def forward(ctx, x, offset, dim1, dim2):
        d1, d2 = dim_of(x, dim1, "diagonal"), dim_of(x, dim2, "diagonal")
        if d1 == d2:
            raise RuntimeError(f"diagonal: dim1 and dim2 can not be the same dim ({d1})")
        shape, strides, start = _diag_geometry(x.shape, x._strides, x._offset, offset, d1, d2)
        ctx.in_shape, ctx.args = x.shape, (offset, d1, d2)
        return _make(x._storage, shape, strides, start, base=x)

    @staticmethod
    def backward(ctx, g):
        if recording():  # as an op of g, whose own derivative is this diagonal again
            return _DiagonalGrad.apply(g, ctx.in_shape, ctx.args)
        out = zeros_array(ctx.in_shape, g.dtype, g.device)
        shape, strides, start = _diag_geometry(ctx.in_shape, shp.contiguous_strides(
            ctx.in_shape), 0, *ctx.args)
        backend.strided(out.reshape(-1), shape, strides, start)[...] = g._array()
        return from_array(out)


class _DiagonalGrad(Function):
    """gx = zeros of x's shape with g on a diagonal (Diagonal's backward), as an op of g:
    what the recorded backward (create_graph=True) of Diagonal and of a 2-D Diag applies.
    Its backward takes that diagonal of the gradient (Diagonal). Saves nothing."""

    @staticmethod
    def forward(ctx, g, in_shape, args):
        ctx.in_shape, ctx.args = in_shape, args
        return Diagonal.backward(ctx, g)

    @staticmethod
    def backward(ctx, gg):
        return Diagonal.apply(gg, *ctx.args), None, None


@op(Diagonal, method=True, ta=True)
def diagonal(x, offset=0, dim1=0, dim2=1):
    return Diagonal.apply(x, offset, dim1, dim2)


class Diag(Function):
    """1-D x: y = a square matrix with x on its k-th diagonal; 2-D x: y = a copy of its k-th
    diagonal;  gx = the k-th diagonal of g (1-D) or g placed on it (2-D). Saves nothing."""

    @staticmethod
    def forward(ctx, x, k):
        if x.ndim not in (1, 2):
            raise RuntimeError(f"diag: expected a 1-D or 2-D tensor, got shape {tuple(x.shape)}")
        ctx.k, ctx.in_shape = k, x.shape
        xp = backend.xp_for(x.device)
        return from_array(backend.copy(xp.diag(x._array(), k)))

    @staticmethod
    def backward(ctx, g):
        xp = backend.xp_for(g.device)
        G = g._array()
        if len(ctx.in_shape) == 1:
            return from_array(backend.copy(xp.diagonal(G, ctx.k)))
        if recording():  # g on the diagonal, as an op whose derivative takes it back off
            return _DiagonalGrad.apply(g, ctx.in_shape, (ctx.k, 0, 1))
        out = zeros_array(ctx.in_shape, g.dtype, g.device)
        shape, strides, start = _diag_geometry(ctx.in_shape, shp.contiguous_strides(
            ctx.in_shape), 0, ctx.k, 0, 1)
        backend.strided(out.reshape(-1), shape, strides, start)[...] = G
        return from_array(out)


@op(Diag, method=True, ta=True)
def diag(x, diagonal=0):
    return Diag.apply(x, diagonal)


def _tri_indices(row, col, offset, lower, dtype, device):
    xp = backend.xp_for(backend.canonical_device(device))
    r = xp.arange(row, dtype=xp.int64)[:, None]
    c = xp.arange(col, dtype=xp.int64)[None, :]
    keep = (c - r <= offset) if lower else (c - r >= offset)
    rows, cols = xp.nonzero(xp.broadcast_to(keep, (row, col)))
    out = xp.stack([rows, cols]).astype(backend.to_dtype(dtype).np)
    return from_array(out.reshape(2, -1))


@op(ta=True)
def tril_indices(row, col, offset=0, *, dtype="int64", device="cpu"):
    """The (2, N) int64 row/column indices of the lower triangle of a row x col matrix."""
    return _tri_indices(row, col, offset, True, dtype, device)


@op(ta=True)
def triu_indices(row, col, offset=0, *, dtype="int64", device="cpu"):
    """The (2, N) int64 row/column indices of the upper triangle of a row x col matrix."""
    return _tri_indices(row, col, offset, False, dtype, device)


# ----------------------------------------------------------------------------- views
@op(View, Expand, ta=True)
def meshgrid(*tensors, indexing="ij"):
    """One grid per 1-D input, each an expanded view of its input (stride 0 along the
    other dims): nothing is copied. indexing="xy" swaps the first two grid dims."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing not in ("ij", "xy"):
        raise RuntimeError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    for t in tensors:
        if t.ndim > 1:
            raise RuntimeError(f"meshgrid: expected 0-D or 1-D tensors, got shape {t.shape}")
    sizes = [t.numel() for t in tensors]
    order = list(range(len(tensors)))
    if indexing == "xy" and len(tensors) >= 2:
        order[0], order[1] = 1, 0
    shape = tuple(sizes[i] for i in order)
    grids = []
    for i, t in enumerate(tensors):
        at = order.index(i)
        lined = view(t, tuple(s if k == at else 1 for k, s in enumerate(shape)))
        grids.append(expand(lined, shape))
    return tuple(grids)


@op(Permute, method=True, ta=True)
def movedim(x, source, destination):
    """x with dims moved from source to destination (a permute: a view)."""
    src = (source,) if isinstance(source, int) else tuple(source)
    dst = (destination,) if isinstance(destination, int) else tuple(destination)
    if len(src) != len(dst):
        raise RuntimeError(f"movedim: source {src} and destination {dst} differ in length")
    src = shp.normalize_dims(src, x.ndim, "movedim")
    dst = shp.normalize_dims(dst, x.ndim, "movedim")
    order = [None] * x.ndim
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(i for i in range(x.ndim) if i not in src)
    order = [next(rest) if o is None else o for o in order]
    return permute(x, tuple(order)) if x.ndim else x


@op(Permute, method=True, ta=True)
def moveaxis(x, source, destination):
    return movedim(x, source, destination)


@op(Transpose, method=True, ta=True)
def swapaxes(x, axis0, axis1):
    return transpose(x, axis0, axis1)


@op(Transpose, method=True, ta=True)
def swapdims(x, dim0, dim1):
    return transpose(x, dim0, dim1)


@op(Transpose, View, method=True, ta=True)
def t(input):  # noqa: A002 - torch's argument name
    """x.t(): the transpose of a matrix; a 0-d or 1-d tensor is returned as it is (a view)."""
    if input.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is "
                           f"{input.ndim}D (shape {tuple(input.shape)})")
    if input.ndim == 0:
        return view(input, ())
    return transpose(input, 0, input.ndim - 1)  # a 1-d tensor: transpose(0, 0), a view


class Unfold(Function):
    """y = the windows of `size` every `step` along dim, as a new last dim: a strided view
    (overlapping windows share memory);  gx = the windows' gradients added back, one
    strided add per window position. Saves nothing."""

    @staticmethod
    def forward(ctx, x, dimension, size, step):
        d = dim_of(x, dimension, "unfold")
        n = x.shape[d] if x.ndim else 1
        if size > n or size < 0:
            raise RuntimeError(f"unfold: maximum size for dim {d} is {n} but size is {size} "
                               f"(shape {tuple(x.shape)})")
        if step <= 0:
            raise RuntimeError(f"unfold: step is {step} but must be > 0")
        stride = x._strides[d] if x.ndim else 1
        count = (n - size) // step + 1
        shape, strides = list(x.shape), list(x._strides)
        if x.ndim:
            shape[d], strides[d] = count, stride * step
        ctx.in_shape, ctx.args = x.shape, (d, size, step, count)
        return _make(x._storage, tuple(shape) + (size,), tuple(strides) + (stride,),
                     x._offset, base=x)

    @staticmethod
    def backward(ctx, g):
        if recording():  # as an op of g, whose own derivative is these windows again
            return _UnfoldGrad.apply(g, ctx.in_shape, ctx.args)
        d, size, step, count = ctx.args
        out = zeros_array(ctx.in_shape, g.dtype, g.device)
        O = out.reshape(1) if out.ndim == 0 else out
        G = g._array()
        G = G.reshape(G.shape[-1:]) if out.ndim == 0 else G
        for j in range(size):
            span = slice(j, j + step * (count - 1) + 1, step)
            O[(slice(None),) * d + (span,)] += G[..., j]
        return from_array(out)


class _UnfoldGrad(Function):
    """gx = the windows' gradients added back (Unfold's backward), as an op of g: what
    Unfold's recorded backward (create_graph=True) applies. Its backward takes the windows
    of the gradient (Unfold). Saves nothing."""

    @staticmethod
    def forward(ctx, g, in_shape, args):
        ctx.in_shape, ctx.args = in_shape, args
        return Unfold.backward(ctx, g)

    @staticmethod
    def backward(ctx, gg):
        d, size, step, _ = ctx.args
        return Unfold.apply(gg, d, size, step), None, None


@op(Unfold, method=True)
def unfold(x, dimension, size, step):
    return Unfold.apply(x, dimension, size, step)


# ----------------------------------------------------------------------------- pad
def _source_positions(xp, n, left, right, mode):
    """For each output position of a padded dim, the input position it reads. A negative pad
    crops that side (as torch): reflect and replicate read the output's positions from the
    whole input, circular wraps around what is left once the negative sides are cropped."""
    if mode == "circular":
        start = max(-left, 0)
        kept = n - start - max(-right, 0)
        p = xp.arange(-max(left, 0), kept + max(right, 0), dtype=xp.int64)
        return start + p % kept if kept > 0 else p
    p = xp.arange(-left, n + right, dtype=xp.int64)
    if mode == "reflect":
        p = xp.abs(p)
        return xp.where(p >= n, 2 * (n - 1) - p, p)
    return xp.clip(p, 0, n - 1)  # replicate


def _check_pad(mode, n, lo, hi, d, shape, pads):
    """torch's limits for a non-constant pad of a dim of size n (negative pads crop)."""
    out = n + lo + hi
    where = f"for dim {d} of shape {tuple(shape)} (pad {pads})"
    if mode == "circular":
        kept = n - max(-lo, 0) - max(-hi, 0)
        if out < 0 or (out > 0 and kept <= 0):  # (torch reads memory it never wrote there)
            raise RuntimeError(f"pad: negative circular padding leaves an empty dim {where}")
        if max(lo, 0) > kept or max(hi, 0) > kept:
            raise RuntimeError(f"pad: circular padding ({lo}, {hi}) must be at most the "
                               f"{kept} elements left after cropping {where}")
        return
    if mode == "reflect" and (lo >= n or hi >= n):
        raise RuntimeError(f"pad: reflect padding ({lo}, {hi}) must be less than the "
                           f"input's size {n} {where}")
    if n == 0 or out <= 0:
        raise RuntimeError(f"pad: input of size {n} is too small: {mode} padding ({lo}, {hi}) "
                           f"gives an output of size {out} {where}")


class Pad(Function):
    """y = x padded (negative pads crop): constant: a new buffer with x in its middle, gx =
    the middle of g; reflect / replicate / circular: each padded dim gathers input
    positions, gx = g added back at those positions. Saves nothing."""

    @staticmethod
    def forward(ctx, x, pads, mode, value):
        xp = backend.xp_for(x.device)
        X = x._array()
        pairs = [(pads[2 * i], pads[2 * i + 1]) for i in range(len(pads) // 2)]
        dims = [x.ndim - 1 - i for i in range(len(pairs))]  # last dim first, as torch
        ctx.x_shape, ctx.pairs, ctx.dims, ctx.mode = x.shape, pairs, dims, mode
        if mode == "constant":
            out_shape = list(x.shape)
            for d, (lo, hi) in zip(dims, pairs):
                out_shape[d] += lo + hi
                # negative pads crop (torch narrows): never more than the dim holds
                if out_shape[d] < 0 or x.shape[d] - max(-lo, 0) - max(-hi, 0) < 0:
                    raise RuntimeError(f"pad: padding {pads} gives a negative size for dim {d} "
                                       f"of shape {tuple(x.shape)}")
            out = xp.full(out_shape, value, dtype=X.dtype)
            dst, src = _constant_slices(x.shape, dims, pairs)
            out[dst] = X[src]
            return from_array(out)
        for d, (lo, hi) in zip(dims, pairs):
            n = x.shape[d]
            _check_pad(mode, n, lo, hi, d, x.shape, pads)
            X = xp.take(X, _source_positions(xp, n, lo, hi, mode), axis=d)
        return from_array(X)

    @staticmethod
    def backward(ctx, g):
        if recording():  # as an op of g, whose own derivative is this pad again
            return _PadGrad.apply(g, ctx.x_shape, ctx.pairs, ctx.dims, ctx.mode)
        xp = backend.xp_for(g.device)
        G = g._array()
        if ctx.mode == "constant":
            out = zeros_array(ctx.x_shape, g.dtype, g.device)
            dst, src = _constant_slices(ctx.x_shape, ctx.dims, ctx.pairs)
            out[src] = G[dst]
            return from_array(out)
        for d, (lo, hi) in reversed(list(zip(ctx.dims, ctx.pairs))):
            n = ctx.x_shape[d]
            shape = list(G.shape)
            shape[d] = n
            acc = xp.zeros(shape, dtype=G.dtype)
            backend.index_add(acc, d, _source_positions(xp, n, lo, hi, ctx.mode), G)
            G = acc
        return from_array(G)


class _PadGrad(Function):
    """gx = Pad's backward of g (the middle of g; or g added back at the positions each
    padded dim read), as an op of g: what Pad's recorded backward (create_graph=True)
    applies. The map is linear and its transpose is the pad itself, its backward.
    Saves nothing."""

    @staticmethod
    def forward(ctx, g, x_shape, pairs, dims, mode):
        ctx.x_shape, ctx.pairs, ctx.dims, ctx.mode = x_shape, pairs, dims, mode
        return Pad.backward(ctx, g)

    @staticmethod
    def backward(ctx, gg):
        pads = tuple(p for pair in ctx.pairs for p in pair)
        return Pad.apply(gg, pads, ctx.mode, 0), None, None, None, None


def _constant_slices(shape, dims, pairs):
    """(slices into the padded output, slices into the input) of the part they share."""
    dst = [slice(None)] * len(shape)
    src = [slice(None)] * len(shape)
    for d, (lo, hi) in zip(dims, pairs):
        n = shape[d]
        src[d] = slice(max(-lo, 0), n - max(-hi, 0))
        kept = max(n - max(-lo, 0) - max(-hi, 0), 0)
        dst[d] = slice(max(lo, 0), max(lo, 0) + kept)
    return tuple(dst), tuple(src)


_MODES = ("constant", "reflect", "replicate", "circular")


@op(Pad, functional=True)
def pad(x, pad, mode="constant", value=None):  # noqa: A002 - torch's names
    """torch.nn.functional.pad: `pad` lists (left, right) pairs from the last dim backward."""
    pads = tuple(int(p) for p in pad)
    if len(pads) % 2 or len(pads) // 2 > x.ndim:
        raise RuntimeError(f"pad: padding length {len(pads)} must be even and at most twice "
                           f"the {x.ndim} dims of shape {tuple(x.shape)}")
    if mode not in _MODES:
        raise NotImplementedError(f"pad: mode {mode!r} is not one of {_MODES}")
    if mode != "constant" and value not in (None, 0):
        raise RuntimeError(f"pad: padding mode {mode!r} doesn't take in value argument")
    if mode != "constant" and x.ndim - len(pads) // 2 not in (1, 2):
        # torch's combinations: a batch dim (and maybe a channel dim) before the padded ones
        raise NotImplementedError(
            f"pad: {mode} padding of size {len(pads)} is not supported for a {x.ndim}-D "
            f"input (shape {tuple(x.shape)}); it pads the last 1, 2 or 3 dims of a 2-3, "
            f"3-4 or 4-5 D input, as torch")
    return Pad.apply(x, pads, mode, 0 if value is None else value)



@op(View, ReshapeCopy, method=True, ta=True)
def ravel(input):  # noqa: A002
    """The elements as one dim: a view when the strides allow it, else a copy (reshape)."""
    return reshape(input, (-1,))


@op(Slice, method=True, ta=True)
def select(input, dim, index):  # noqa: A002
    """x.select(dim, i) = x[..., i, ...] at dim: a view without that dim."""
    d = dim_of(input, dim, "select")
    n = input.shape[d] if input.ndim else 1
    if not -n <= index < n:
        raise IndexError(f"select(): index {index} out of range for tensor of size "
                         f"{list(input.shape)} at dimension {d}")
    return getitem(input, (slice(None),) * d + (index,))


@op(Flip, method=True, ta=True)
def fliplr(input):  # noqa: A002
    if input.ndim < 2:
        raise RuntimeError(f"fliplr: input tensor must be at least 2-D (shape "
                           f"{tuple(input.shape)})")
    return Flip.apply(input, (1,))


@op(Flip, method=True, ta=True)
def flipud(input):  # noqa: A002
    if input.ndim < 1:
        raise RuntimeError("flipud: input tensor must be at least 1-D (a 0-d tensor given)")
    return Flip.apply(input, (0,))
