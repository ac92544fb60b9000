"""Zero-copy view ops. Each returns a Tensor over the same Storage; none allocates.

The backward of a movement op is the inverse movement (after early tinygrad): transpose
of a gradient is a transpose, permute is undone by the inverse permutation, expand is
undone by a sum, reshape by a reshape. A slice's gradient is a `SliceGrad`: the engine
writes all slices of one base into one base-sized buffer.
"""

from __future__ import annotations

from .. import backend
from .. import shape as shp
from ..autograd import Function, ReshapeGrad, SliceGrad
from ..autograd.graph import recording
from ..errors import ShapeError
from ..memory.state import habits  # a table mutated in place, never rebound
from ..tensor import Tensor, _make, from_array
from .indexing import AdvancedIndex, advanced_index, resolve_index
from .registry import op


def _view(x: Tensor, shape, strides, offset=None) -> Tensor:
    return _make(x._storage, shape, strides, x._offset if offset is None else offset, base=x)


def _checked_view(op: str, x: Tensor, shape, strides, offset=None) -> Tensor:
    """_view for a geometry that does not provably stay inside x: the one bounds rule
    (shape.check_view) first."""
    offset = x._offset if offset is None else offset
    shp.check_view(op, shape, strides, offset, x._storage.size, x.dtype.itemsize)
    return _view(x, shape, strides, offset)


class View(Function):
    """y = x viewed with a new shape (strides must allow it);  gx = g.reshape(x.shape).

    When g's layout makes that reshape a copy (a transposed gradient), gx travels as a
    ReshapeGrad and is written straight into the buffer that receives it. Saves nothing.
    """

    @staticmethod
    def forward(ctx, x, shape):
        new_shape = shp.infer_shape(shape, x.numel(), "view")
        strides = shp.view_strides(x.shape, x._strides, new_shape)
        if strides is None:
            raise ShapeError(
                f"view: shape {new_shape} is not compatible with the input's size and stride "
                f"(shape {tuple(x.shape)}, strides {tuple(x._strides)}): at least one new dim "
                "spans two non-contiguous chunks of memory. Use .reshape(...) (which copies "
                "when it must) or call .contiguous() first."
            )
        ctx.in_shape = x.shape
        if x.numel() == 0:  # the same elements, but an empty view's sizes are free to be huge
            return _checked_view("view", x, new_shape, strides)
        return _view(x, new_shape, strides)

    @staticmethod
    def backward(ctx, g):
        if shp.view_strides(g.shape, g._strides, ctx.in_shape) is None:
            return ReshapeGrad(g, ctx.in_shape)
        return g.view(ctx.in_shape)


class ReshapeCopy(Function):
    """y = a contiguous copy of x with a new shape, when no view can express it.

    Recorded as a copy with reason 'reshape-copy'. gx = g.reshape(x.shape). Saves nothing.
    """

    @staticmethod
    def forward(ctx, x, shape):
        ctx.in_shape = x.shape
        arr = backend.copy(x._array())
        return from_array(arr.reshape(shape), "reshape-copy")

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.in_shape)


@op(View, method=("view", "view_as"))
def view(x: Tensor, shape) -> Tensor:
    return View.apply(x, tuple(shape))


@op(View, ReshapeCopy, method=("reshape", "reshape_as"), ta=True)
def reshape(x: Tensor, shape) -> Tensor:
    """A view when the strides allow it, else a copy (recorded as 'reshape-copy')."""
    new_shape = shp.infer_shape(shape, x.numel(), "reshape")
    if new_shape == x.shape:
        return view(x, new_shape)
    if shp.view_strides(x.shape, x._strides, new_shape) is not None:
        return View.apply(x, new_shape)
    return ReshapeCopy.apply(x, new_shape)


class Permute(Function):
    """y = x with dims reordered (strides reordered; no copy);  gx = g.permute(inverse).

    Saves nothing.
    """

    @staticmethod
    def forward(ctx, x, dims):
        if len(dims) != x.ndim:
            raise ShapeError(
                f"permute: number of dims {len(dims)} does not match the tensor's {x.ndim} "
                f"(shape {tuple(x.shape)}, dims {tuple(dims)})"
            )
        dims = shp.normalize_dims(dims, x.ndim, "permute")
        ctx.inverse = tuple(sorted(range(len(dims)), key=dims.__getitem__))
        out = _view(x, tuple(x.shape[d] for d in dims), tuple(x._strides[d] for d in dims))
        return _permute_copy(out) if habits["permute_copies"] else out

    @staticmethod
    def backward(ctx, g):
        return g.permute(ctx.inverse)


class Transpose(Function):
    """y = x with two dims swapped (a strided view);  gx = g.transpose(d0, d1). Saves nothing."""

    @staticmethod
    def forward(ctx, x, dim0, dim1):
        d0 = shp.normalize_dim(dim0, x.ndim, "transpose")
        d1 = shp.normalize_dim(dim1, x.ndim, "transpose")
        ctx.dims = (d0, d1)
        shape, strides = list(x.shape), list(x._strides)
        shape[d0], shape[d1] = shape[d1], shape[d0]
        strides[d0], strides[d1] = strides[d1], strides[d0]
        out = _view(x, tuple(shape), tuple(strides))
        return _permute_copy(out) if habits["permute_copies"] else out

    @staticmethod
    def backward(ctx, g):
        return g.transpose(*ctx.dims)


def _permute_copy(view: Tensor) -> Tensor:
    """The emulated habit of Julia's permutedims: the permuted tensor is materialized."""
    return from_array(backend.copy(view._array()), "permute-copy")


@op(Permute, method=("permute", "T"), ta=True)
def permute(x, dims):
    return Permute.apply(x, tuple(dims))


@op(Transpose, method=("transpose", "mT"), ta=True)
def transpose(x, dim0, dim1):
    if x.ndim < 2 and dim0 in (0, -1) and dim1 in (0, -1):
        return x
    return Transpose.apply(x, dim0, dim1)


class Expand(Function):
    """y = x broadcast to `shape` (stride 0 on new/size-1 dims; no copy);  gx = sum of g.

    Saves nothing.
    """

    @staticmethod
    def forward(ctx, x, shape):
        shape = tuple(shape)
        if len(shape) < x.ndim:
            raise ShapeError(
                f"expand: the number of sizes {len(shape)} must be >= the number of dims "
                f"{x.ndim} (shape {tuple(x.shape)} to {shape})"
            )
        lead = len(shape) - x.ndim
        new_shape, new_strides = [0] * len(shape), [0] * len(shape)
        for i in range(len(shape) - 1, -1, -1):  # torch's order: last dim first
            size = shape[i]
            if size < -1 or (size == -1 and i < lead):
                what = "-1 is not allowed in a new leading dim" if size == -1 else (
                    "sizes must be >= 0, or -1 to keep a dim")
                raise ShapeError(f"expand: invalid size {size} at dim {i}: {what} (shape "
                                 f"{tuple(x.shape)} to {shape})")
            if i < lead:
                # a new dim reads the same elements again (stride 0); one of size 1 gets
                # the stride a contiguous dim there would have, as torch's does
                after = new_shape[i + 1] * new_strides[i + 1] if i + 1 < len(shape) else 0
                new_shape[i], new_strides[i] = size, after if size == 1 else 0
                continue
            old, stride = x.shape[i - lead], x._strides[i - lead]
            if size == -1 or size == old:
                new_shape[i], new_strides[i] = old, stride
            elif old == 1:
                new_shape[i], new_strides[i] = size, 0
            else:
                raise ShapeError(
                    f"expand: the expanded size {size} must match the existing size {old} at "
                    f"dim {i} (shape {tuple(x.shape)} to {shape}); only size-1 dims expand"
                )
        ctx.in_shape = x.shape
        # the elements x reads, read again (stride 0): only the size can go wrong
        return _checked_view("expand", x, tuple(new_shape), tuple(new_strides))

    @staticmethod
    def backward(ctx, g):
        from ._util import unbroadcast

        return unbroadcast(g, ctx.in_shape)


@op(Expand, method=("expand", "expand_as", "broadcast_to"), ta="broadcast_to")
def expand(x, shape):
    if tuple(shape) == x.shape:
        return x
    return Expand.apply(x, tuple(shape))


class Squeeze(Function):
    """y = x without the given size-1 dims;  gx = g with them put back. Saves nothing."""

    @staticmethod
    def forward(ctx, x, dims):
        keep = [i for i in range(x.ndim) if i not in dims]
        ctx.dims = dims
        return _view(x, tuple(x.shape[i] for i in keep), tuple(x._strides[i] for i in keep))

    @staticmethod
    def backward(ctx, g):
        for d in sorted(ctx.dims):
            g = g.unsqueeze(d)
        return g


class Unsqueeze(Function):
    """y = x with a size-1 dim inserted at `dim`;  gx = g.squeeze(dim). Saves nothing."""

    @staticmethod
    def forward(ctx, x, dim):
        d = shp.normalize_dim(dim, x.ndim + 1, "unsqueeze", tensor_ndim=x.ndim)
        ctx.dim = d
        shape, strides = list(x.shape), list(x._strides)
        stride = strides[d] * shape[d] if d < x.ndim else 1
        shape.insert(d, 1)
        strides.insert(d, stride)
        return _view(x, tuple(shape), tuple(strides))

    @staticmethod
    def backward(ctx, g):
        return g.squeeze(ctx.dim)


@op(Squeeze, method=True, ta=True)
def squeeze(x, dim=None):
    if dim is None:
        dims = tuple(i for i, s in enumerate(x.shape) if s == 1)
    else:
        dlist = dim if isinstance(dim, (tuple, list)) else (dim,)
        dims = tuple(d for d in shp.normalize_dims(dlist, x.ndim, "squeeze")
                     if x.ndim and x.shape[d] == 1)
    if not dims:
        return x
    return Squeeze.apply(x, dims)


@op(Unsqueeze, method=True, ta=True)
def unsqueeze(x, dim):
    return Unsqueeze.apply(x, dim)


@op(View, ReshapeCopy, method=True, ta=True)
def flatten(x, start_dim=0, end_dim=-1):
    if x.ndim == 0:
        return reshape(x, (1,))
    s = shp.normalize_dim(start_dim, x.ndim, "flatten")
    e = shp.normalize_dim(end_dim, x.ndim, "flatten")
    if s > e:
        raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    shape = x.shape[:s] + (shp.numel(x.shape[s : e + 1]),) + x.shape[e + 1 :]
    return reshape(x, shape)


@op(View, ReshapeCopy, method=True, ta=True)
def unflatten(x, dim, sizes):
    d = shp.normalize_dim(dim, x.ndim, "unflatten")
    sizes = shp.infer_shape(sizes, x.shape[d], "unflatten")
    return reshape(x, x.shape[:d] + tuple(sizes) + x.shape[d + 1 :])


# ----------------------------------------------------------------------------- slicing
class Slice(Function):
    """y = x[index] for basic indices (ints, slices, None, ...): a strided view, no copy.

    gx = g placed at the slice within zeros of x's shape; it travels as a SliceGrad so
    that several slices of one base share one gradient buffer. Saves nothing.
    """

    @staticmethod
    def forward(ctx, x, index):
        shape, strides, offset = shp.index_geometry(x.shape, x._strides, x._offset, index)
        ctx.in_shape, ctx.index = x.shape, index
        return _view(x, shape, strides, offset)

    @staticmethod
    def backward(ctx, g):
        grad = SliceGrad(ctx.in_shape, ctx.index, g)
        if habits["slice_grad_full"] and not recording():
            # the emulated habit: a full zero gradient per slice (a recorded backward's
            # SliceGrad becomes one anyway, written by recorded ops)
            return grad.materialize()
        return grad


@op(Slice, AdvancedIndex, method="__getitem__")
def getitem(x: Tensor, index):
    """x[index] with torch's rules (see indexing.resolve_index): a view when the index is
    basic (ints, slices, None, ...), a copy when it holds integer arrays or bool masks."""
    resolved = resolve_index(x, index, "getitem")
    if resolved.arrays is None:
        return Slice.apply(x, resolved.basic)
    return advanced_index(x, resolved)


@op(Slice, method=True, ta=True)
def narrow(x, dim, start, length):
    d = shp.normalize_dim(dim, x.ndim, "narrow")
    n = x.shape[d]
    if not -n <= start <= n:  # torch: a start outside the dim is an IndexError ...
        raise IndexError(
            f"narrow: start {start} out of range [{-n}, {n}] for dim {d} of size {n} "
            f"(shape {tuple(x.shape)})"
        )
    if start < 0:
        start += n
    if length < 0:  # ... a bad length a RuntimeError
        raise RuntimeError(f"narrow: length must be non-negative, got {length} "
                           f"(shape {tuple(x.shape)}, dim {d})")
    if start + length > n:
        raise RuntimeError(
            f"narrow: start {start} + length {length} exceeds dim {d} of size {n} "
            f"(shape {tuple(x.shape)})"
        )
    return Slice.apply(x, (slice(None),) * d + (slice(start, start + length),))


class MultiSlice(Function):
    """Several basic-index views of one input at once: split, chunk, unbind.

    gx = one buffer of x's shape with each output's gradient written in its place
    (outputs that got no gradient get zeros): one allocation however many pieces. When the
    pieces tile x (split, chunk and unbind cut one dim into consecutive parts) every element
    is written once, so the buffer is not zero-filled first. Saves nothing.
    """

    materialize_grads = False
    takes_lazy_grads = True  # a ReshapeGrad is written into its piece without a copy

    @staticmethod
    def forward(ctx, x, indices):
        ctx.in_shape, ctx.indices = x.shape, indices
        ctx.tiles = _tiles(x.shape, indices)
        outs = []
        for index in indices:
            shape, strides, offset = shp.index_geometry(x.shape, x._strides, x._offset, index)
            outs.append(_view(x, shape, strides, offset))
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        if recording():
            return _joined_pieces(ctx, grads)
        base = ctx.in_shape
        contiguous = shp.contiguous_strides(base)
        first = next(g for g in grads if g is not None)
        if type(first) is ReshapeGrad:
            first = first.grad
        xp = backend.xp_for(first.device)
        with backend.on_device(first.device):
            buf = (xp.empty if ctx.tiles else xp.zeros)(base, dtype=first.dtype.np)
        flat = buf.reshape(-1)
        for index, g in zip(ctx.indices, grads):
            if g is None and not ctx.tiles:
                continue
            shape, strides, offset = shp.index_geometry(base, contiguous, 0, index)
            if shp.numel(shape) == 0:  # an empty piece writes nothing
                continue
            if g is None:
                backend.strided(flat, shape, strides, offset)[...] = 0
                continue
            if type(g) is ReshapeGrad:
                view = g.view_of(flat, shape, strides, offset)
                if view is not None:
                    view[...] = g.grad._array()
                    continue
                g = g.materialize()
            backend.strided(flat, shape, strides, offset)[...] = g._array()
        return from_array(buf)


def _joined_pieces(ctx, grads):
    """MultiSlice's gx in recorded ops (create_graph=True): the pieces' gradients joined
    by cat along the cut dim (zeros for a piece that got none), so that the next derivative
    flows back to each piece; pieces that do not tile x are written into a zeros buffer."""
    from ._util import zeros_array
    from .indexing import cat

    base = ctx.in_shape
    contiguous = shp.contiguous_strides(base)
    first = next(g for g in grads if g is not None)
    d = len(ctx.indices[0]) - 1
    pieces = []
    for index, g in zip(ctx.indices, grads):
        if g is None:
            shape = shp.index_geometry(base, contiguous, 0, index)[0]
            g = from_array(zeros_array(shape, first.dtype, first.device))
        if ctx.tiles and type(index[d]) is int:  # an unbind piece lost the cut dim
            g = g.unsqueeze(d)
        pieces.append(g)
    if ctx.tiles:
        return cat(pieces, d)
    buf = from_array(zeros_array(base, first.dtype, first.device))
    for index, g in zip(ctx.indices, pieces):  # the pieces of a split never overlap
        buf[index] = g
    return buf


def _tiles(shape, indices) -> bool:
    """Whether the basic indices cut one dim of `shape` into consecutive pieces that cover
    it (slices of step 1, or every integer in order), leaving the other dims whole."""
    whole = slice(None)
    d = len(indices[0]) - 1 if indices else -1
    if d < 0 or d >= len(shape):
        return False
    start = 0
    for index in indices:
        if len(index) != d + 1 or any(i != whole for i in index[:d]):
            return False
        last = index[d]
        if type(last) is int:
            lo, hi = last, last + 1
        elif type(last) is slice and last.step in (None, 1):
            lo, hi, _ = last.indices(shape[d])
        else:
            return False
        if lo != start or hi < lo:
            return False
        start = hi
    return start == shape[d]


@op(MultiSlice, method=True, ta=True)
def split(x, split_size_or_sections, dim=0):
    d = shp.normalize_dim(dim, x.ndim, "split")
    size = x.shape[d]
    if isinstance(split_size_or_sections, int):
        step = split_size_or_sections
        if step <= 0:
            raise ValueError(f"split: split_size must be positive, got {step}")
        sizes = [min(step, size - s) for s in range(0, size, step)] or [0]
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if sum(sizes) != size or any(s < 0 for s in sizes):
            raise ShapeError(
                f"split: sizes {sizes} must be non-negative and sum to the size {size} of dim "
                f"{d} (shape {tuple(x.shape)})"
            )
    indices, start = [], 0
    for s in sizes:
        indices.append((slice(None),) * d + (slice(start, start + s),))
        start += s
    return MultiSlice.apply(x, tuple(indices))


@op(MultiSlice, method=True, ta=True)
def chunk(x, chunks, dim=0):
    if chunks <= 0:
        raise ValueError(f"chunk: number of chunks must be positive, got {chunks}")
    d = shp.normalize_dim(dim, x.ndim, "chunk")
    step = -(-x.shape[d] // chunks) if x.shape[d] else 1
    return split(x, step, d)


@op(MultiSlice, method=True, ta=True)
def unbind(x, dim=0):
    d = shp.normalize_dim(dim, x.ndim, "unbind")
    indices = tuple((slice(None),) * d + (i,) for i in range(x.shape[d]))
    return MultiSlice.apply(x, indices)


class AsStrided(Function):
    """y = a view with arbitrary (size, stride, storage_offset) over x's storage.

    gx = the gradient summed back onto the storage positions y reads, then read at x's
    positions (divided by how often x itself reads each position). Saves nothing.
    """

    @staticmethod
    def forward(ctx, x, size, stride, storage_offset):
        size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
        if len(size) != len(stride):
            raise ShapeError(f"as_strided: size {size} and stride {stride} differ in length")
        if any(s < 0 for s in stride):  # as torch: the backward's positions assume it
            raise ShapeError(f"as_strided: negative strides are not supported, got stride "
                             f"{stride} (size {size})")
        offset = x._offset if storage_offset is None else int(storage_offset)
        ctx.geometry = (size, stride, offset)
        ctx.in_geometry = (x.shape, x._strides, x._offset)
        return _checked_view("as_strided", x, size, stride, offset)

    @staticmethod
    def backward(ctx, g):
        if recording():  # as an op of g, whose own derivative is its transpose
            return _AsStridedGrad.apply(g, ctx.geometry, ctx.in_geometry)
        xp = backend.xp_for(g.device)
        size, stride, offset = ctx.geometry
        in_shape, in_strides, in_offset = ctx.in_geometry
        if shp.numel(size) == 0:  # y read nothing; its sizes may be too big for positions
            return from_array(xp.zeros(in_shape, dtype=g.dtype.np))
        lo = min(offset, in_offset)
        extent = max(shp.storage_extent(size, stride, offset),
                     shp.storage_extent(in_shape, in_strides, in_offset)) - lo
        acc = xp.zeros(max(extent, 0), dtype=g.dtype.np)
        backend.scatter_add(acc, _positions(xp, size, stride, offset - lo), g._array())
        in_pos = _positions(xp, in_shape, in_strides, in_offset - lo)
        count = xp.zeros_like(acc)
        backend.scatter_add(count, in_pos, xp.ones(in_shape, dtype=acc.dtype))
        return from_array(acc[in_pos] / count[in_pos])


class _AsStridedGrad(Function):
    """gx = AsStrided's backward of g, as an op of g: what its recorded backward
    (create_graph=True) applies, so that the next derivative flows through it. The map is
    linear; its backward is its transpose (_AsStridedGradT). Saves nothing."""

    @staticmethod
    def forward(ctx, g, geometry, in_geometry):
        ctx.geometry, ctx.in_geometry = geometry, in_geometry
        return AsStrided.backward(ctx, g)

    @staticmethod
    def backward(ctx, gg):
        return _AsStridedGradT.apply(gg, ctx.geometry, ctx.in_geometry), None, None


class _AsStridedGradT(Function):
    """The transpose of _AsStridedGrad: h (x's shape) divided by how often x reads each
    storage position, summed onto those positions, then read at y's positions. Its backward
    is _AsStridedGrad. Saves nothing."""

    @staticmethod
    def forward(ctx, h, geometry, in_geometry):
        ctx.geometry, ctx.in_geometry = geometry, in_geometry
        xp = backend.xp_for(h.device)
        size, stride, offset = geometry
        in_shape, in_strides, in_offset = in_geometry
        if shp.numel(size) == 0:
            return from_array(xp.zeros(size, dtype=h.dtype.np))
        lo = min(offset, in_offset)
        extent = max(shp.storage_extent(size, stride, offset),
                     shp.storage_extent(in_shape, in_strides, in_offset)) - lo
        in_pos = _positions(xp, in_shape, in_strides, in_offset - lo)
        count = xp.zeros(max(extent, 0), dtype=h.dtype.np)
        backend.scatter_add(count, in_pos, xp.ones(in_shape, dtype=count.dtype))
        acc = xp.zeros_like(count)
        backend.scatter_add(acc, in_pos, h._array() / count[in_pos])
        return from_array(acc[_positions(xp, size, stride, offset - lo)])

    @staticmethod
    def backward(ctx, gg):
        return _AsStridedGrad.apply(gg, ctx.geometry, ctx.in_geometry), None, None


def _positions(xp, shape, strides, offset):
    pos = xp.full(shape, offset, dtype=xp.int64)
    for d, (n, s) in enumerate(zip(shape, strides)):
        idx_shape = [1] * len(shape)
        idx_shape[d] = n
        step = s if n > 1 else 0  # a size-1 dim's stride is never used, and may pass int64
        pos = pos + (xp.arange(n, dtype=xp.int64) * step).reshape(idx_shape)
    return pos


@op(AsStrided, method=True, ta=True)
def as_strided(x, size, stride, storage_offset=None):
    return AsStrided.apply(x, size, stride, storage_offset)


# ----------------------------------------------------------------------------- copies
class Contiguous(Function):
    """y = a C-contiguous copy of x (recorded as a copy, reason 'contiguous');  gx = g.

    Saves nothing.
    """

    @staticmethod
    def forward(ctx, x, reason="contiguous"):
        return from_array(backend.copy(x._array()), reason)

    @staticmethod
    def backward(ctx, g):
        return g


@op(Contiguous, method=True)
def contiguous(x):
    """x itself if already contiguous, else an explicit copy."""
    if x.is_contiguous():
        return x
    return Contiguous.apply(x)


@op(Contiguous, method=True, ta=True)
def clone(x):
    return Contiguous.apply(x, reason="clone")


class Cast(Function):
    """y = x converted to another dtype;  gx = g converted back. Saves nothing."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.in_dtype = x.dtype
        return from_array(backend.copy(x._array(), dtype), "dtype-cast")

    @staticmethod
    def backward(ctx, g):
        return from_array(backend.copy(g._array(), ctx.in_dtype), "dtype-cast")


class ToDevice(Function):
    """y = x copied to another device;  gx = g copied back. Saves nothing."""

    @staticmethod
    def forward(ctx, x, device):
        ctx.in_device = x.device
        return from_array(backend.to_device(x._array(), device), "device-copy")

    @staticmethod
    def backward(ctx, g):
        if recording():  # the copy back as an op, whose own derivative is this copy again
            return ToDevice.apply(g, ctx.in_device)
        return from_array(backend.to_device(g._array(), ctx.in_device), "device-copy")


def _names_dtype(text: str) -> bool:
    try:
        backend.to_dtype(text)
    except TypeError:
        return False
    return True


@op(Cast, ToDevice, Contiguous, method=("to", "cpu", "cuda", "float", "double", "half",
                                         "long", "int", "bool", "byte", "char", "short",
                                         "type", "type_as"))
def to(x, *args, **kwargs):
    """x.to(device), x.to(dtype), x.to(device, dtype) or x.to(other_tensor), then torch's
    non_blocking and copy (positional or keywords): copy=True always copies; non_blocking
    and memory_format change nothing (every copy here is synchronous, every layout kept)."""
    device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
    flags = [kwargs.pop("non_blocking", False), kwargs.pop("copy", False)]
    kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"to(): unexpected arguments {sorted(kwargs)}")
    bools = [a for a in args if isinstance(a, bool)]
    args = [a for a in args if not isinstance(a, bool)]
    flags[:len(bools)] = bools
    for a in args:
        if type(a) is Tensor:
            device, dtype = a.device, a.dtype
        elif isinstance(a, str) and not _names_dtype(a):
            device = a  # not a dtype: the device parser names the valid forms
        else:
            dtype = a
    out = x
    if dtype is not None:
        dtype = backend.to_dtype(dtype)
        if dtype is not x.dtype:
            out = Cast.apply(out, dtype)
    if device is not None:
        device = backend.canonical_device(device)
        if device != x.device:
            backend.xp_for(device)  # a clear error when CUDA is not available
            out = ToDevice.apply(out, device)
    return clone(out) if flags[1] and out is x else out

