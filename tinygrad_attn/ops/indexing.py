"""Copying ops: advanced indexing, cat/stack, where, masked_fill, tril/triu, gather,
index_select. Their outputs are new allocations; their backwards scatter-add or slice."""

from __future__ import annotations

from .. import backend
from .. import shape as shp
from ..autograd import Function
from ..errors import ShapeError
from ._util import Tensor, check_same_device, from_array, unbroadcast, zeros_array
from .registry import op


def _index_arrays(x: Tensor, index) -> tuple:
    """The index as a tuple NumPy/CuPy understand: tensors/lists become integer arrays,
    boolean masks become the integer positions they select."""
    if not isinstance(index, tuple):
        index = (index,)
    xp = backend.xp_for(x.device)
    out = []
    for item in index:
        if type(item) is Tensor:
            check_same_device("index", x, item)
            arr = item._array()
        elif isinstance(item, (list, bool)) or backend.is_array(item):
            arr = backend.asarray(item, None, x.device)
        else:
            out.append(int(item) if not isinstance(item, slice) and item is not None
                       and item is not Ellipsis else item)
            continue
        if arr.dtype == bool:
            out.extend(xp.nonzero(arr))
        elif arr.dtype.kind in "iu":
            out.append(arr)
        else:
            raise IndexError(
                f"index: tensors used as indices must be integer or bool, got {arr.dtype}"
            )
    return tuple(out)


class AdvancedIndex(Function):
    """y = x[index] with integer/bool array indices (a copy, reason 'index-gather').

    gx = zeros of x's shape with g scatter-added at the indexed positions (repeated
    indices sum). Saves the index arrays (integers), not x.
    """

    @staticmethod
    def forward(ctx, x, index):
        try:
            out = x._array()[index]
        except IndexError as e:
            raise IndexError(f"index: {e} (tensor of shape {tuple(x.shape)})") from None
        ctx.in_shape, ctx.index = x.shape, index
        return from_array(out, "index-gather")  # integer-array indexing made a new array

    @staticmethod
    def backward(ctx, g):
        out = zeros_array(ctx.in_shape, g.dtype, g.device)
        backend.scatter_add(out, ctx.index, g._array())
        return from_array(out)


def advanced_index(x: Tensor, index):
    return AdvancedIndex.apply(x, _index_arrays(x, index))


class Cat(Function):
    """y = the inputs joined along `dim` (a copy, reason 'cat');  g_i = a slice (view) of g.

    Saves nothing: only the sizes along dim.
    """

    @staticmethod
    def forward(ctx, *tensors, dim=0):
        xp = backend.xp_for(check_same_device("cat", *tensors))
        first = tensors[0]
        d = shp.normalize_dim(dim, first.ndim, "cat")
        for t in tensors[1:]:
            if t.ndim != first.ndim or any(
                a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != d
            ):
                raise ShapeError(
                    f"cat: tensors must match in every dim but {d}; got shapes "
                    f"{[tuple(x.shape) for x in tensors]}"
                )
        ctx.dim, ctx.sizes = d, [t.shape[d] for t in tensors]
        ctx.dtypes = [t.dtype for t in tensors]
        dtype = backend.result_type(*ctx.dtypes)  # torch's promotion, as every op's
        return from_array(xp.concatenate([t._array() for t in tensors], axis=d,
                                         dtype=dtype.np), "cat")

    @staticmethod
    def backward(ctx, g):
        grads, start = [], 0
        for size, need, dtype in zip(ctx.sizes, ctx.needs_input_grad, ctx.dtypes):
            part = g.narrow(ctx.dim, start, size) if need else None
            if part is not None and dtype is not g.dtype:  # a gradient has its input's dtype
                part = from_array(part._array().astype(dtype.np))
            grads.append(part)
            start += size
        return tuple(grads)


@op(Cat, ta=True, functional=True)
def cat(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat: expected a non-empty list of tensors")
    return Cat.apply(*tensors, dim=dim)


@op(Cat, ta=True, functional=True)
def stack(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack: expected a non-empty list of tensors")
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) != 1:
        raise ShapeError(f"stack: all tensors must have the same shape, got {sorted(shapes)}")
    d = shp.normalize_dim(dim, tensors[0].ndim + 1, "stack", tensor_ndim=tensors[0].ndim)
    return Cat.apply(*[t.unsqueeze(d) for t in tensors], dim=d)


class Where(Function):
    """y = a where cond else b;  ga = g where cond (else 0), gb = g where not cond.

    Saves the condition (a bool tensor), not a or b.
    """

    @staticmethod
    def forward(ctx, cond, a, b):
        device = check_same_device("where", cond, a, b)
        xp = backend.xp_for(device)
        shapes = [x.shape for x in (cond, a, b) if type(x) is Tensor]
        shp.broadcast_shapes(*shapes, op="where")
        C = cond._array() if type(cond) is Tensor else cond
        if getattr(C, "dtype", None) is not None and C.dtype != bool:
            raise TypeError(f"where: condition must be a bool tensor, got {C.dtype}")
        dtype = backend.promote(a, b)  # the two values promote; the condition does not
        A, B = (v._array().astype(dtype.np, copy=False) if type(v) is Tensor else v
                for v in (a, b))
        out = xp.asarray(xp.where(C, A, B)).astype(dtype.np, copy=False)
        ctx.dtypes = tuple(v.dtype if type(v) is Tensor else dtype for v in (a, b))
        ctx.shapes = (a.shape if type(a) is Tensor else (), b.shape if type(b) is Tensor else ())
        ctx.save_for_backward(cond)
        return from_array(out)

    @staticmethod
    def backward(ctx, g):
        (cond,) = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        C, G = cond._array(), g._array()
        _, na, nb = ctx.needs_input_grad
        da, db = (d.np for d in ctx.dtypes)  # a gradient has its input's dtype
        ga = unbroadcast(from_array(xp.where(C, G, 0).astype(da)), ctx.shapes[0]) if na else None
        gb = unbroadcast(from_array(xp.where(C, 0, G).astype(db)), ctx.shapes[1]) if nb else None
        return None, ga, gb


@op(Where, method=True, ta=True, functional=True)
def where(cond, a, b):
    if type(cond) is not Tensor:
        raise TypeError("where: condition must be a Tensor")
    return Where.apply(cond, a, b)


class MaskedFill(Function):
    """y = x with `value` where mask is True;  gx = g with zeros where mask is True,
    g_value = sum of g where mask is True (when value is a 0-d tensor).

    Saves the mask (bool), not x.
    """

    @staticmethod
    def forward(ctx, x, mask, value):
        check_same_device("masked_fill", x, mask, value)
        if mask.dtype.name != "bool":
            raise TypeError(f"masked_fill: mask must be a bool tensor, got {mask.dtype.name}")
        if shp.broadcast_shapes(x.shape, mask.shape, op="masked_fill") != x.shape:
            raise ShapeError(
                f"masked_fill: mask of shape {tuple(mask.shape)} does not broadcast to the "
                f"input's shape {tuple(x.shape)}"
            )
        if type(value) is Tensor and value.ndim != 0:
            raise ShapeError(f"masked_fill: value must be a 0-d tensor, got shape {value.shape}")
        V = value._array() if type(value) is Tensor else value
        ctx.save_for_backward(mask)
        return from_array(backend.masked_fill(x._array(), mask._array(), V))

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        M, G = mask._array(), g._array()
        nx, _, nv = ctx.needs_input_grad
        gx = from_array(backend.masked_fill(G, M, 0)) if nx else None
        gv = from_array(xp.asarray(xp.where(M, G, 0).sum())) if nv else None
        return gx, None, gv


@op(MaskedFill, method=True, ta=True, functional=True)
def masked_fill(x, mask, value):
    return MaskedFill.apply(x, mask, value)


class Tri(Function):
    """y = tril(x, k) or triu(x, k) over the last two dims;  gx = the same op on g.

    Saves nothing.
    """

    @staticmethod
    def forward(ctx, x, k=0, lower=True):
        if x.ndim < 2:
            raise ShapeError(f"{'tril' if lower else 'triu'}: input must be at least 2-D, "
                             f"got shape {tuple(x.shape)}")
        ctx.k, ctx.lower = k, lower
        xp = backend.xp_for(x.device)
        return from_array((xp.tril if lower else xp.triu)(x._array(), k))

    @staticmethod
    def backward(ctx, g):
        xp = backend.xp_for(g.device)
        return from_array((xp.tril if ctx.lower else xp.triu)(g._array(), ctx.k))


@op(Tri, method=True, ta=True, functional=True)
def tril(x, diagonal=0):
    return Tri.apply(x, k=diagonal, lower=True)


@op(Tri, method=True, ta=True, functional=True)
def triu(x, diagonal=0):
    return Tri.apply(x, k=diagonal, lower=False)


def _full_index(xp, index_arr, dim: int):
    """Index arrays selecting, for every position of index_arr, (i0, .., index, .., in)."""
    grids = []
    for d, n in enumerate(index_arr.shape):
        if d == dim:
            grids.append(index_arr)
        else:
            shape = [1] * index_arr.ndim
            shape[d] = n
            grids.append(xp.arange(n).reshape(shape))
    return tuple(grids)


class Gather(Function):
    """y[i][j] = x[index[i][j]][j] (dim 0; likewise for any dim);  gx = g scatter-added.

    Saves the index (integers), not x.
    """

    @staticmethod
    def forward(ctx, x, dim, index):
        check_same_device("gather", x, index)
        d = shp.normalize_dim(dim, x.ndim, "gather")
        if index.ndim != x.ndim or any(
            i > s for k, (i, s) in enumerate(zip(index.shape, x.shape)) if k != d
        ):
            raise ShapeError(
                f"gather: index of shape {tuple(index.shape)} must have the input's number of "
                f"dims and be no larger in dims other than {d} (input {tuple(x.shape)})"
            )
        if index.dtype.is_floating_point or index.dtype.name == "bool":
            raise TypeError(f"gather: index must be an integer tensor, got {index.dtype.name}")
        xp = backend.xp_for(x.device)
        I = index._array()
        n = x.shape[d]
        if I.size and (int(I.min()) < -n or int(I.max()) >= n):
            raise IndexError(f"gather: index out of range for dim {d} of size {n}")
        full = _full_index(xp, I, d)
        ctx.in_shape, ctx.full = x.shape, full
        ctx.save_for_backward(index)
        return from_array(x._array()[full], "index-gather")

    @staticmethod
    def backward(ctx, g):
        out = zeros_array(ctx.in_shape, g.dtype, g.device)
        backend.scatter_add(out, ctx.full, g._array())
        return from_array(out), None, None


@op(Gather, method=True, ta=True, functional=True)
def gather(x, dim, index):
    return Gather.apply(x, dim, index)


class IndexSelect(Function):
    """y = x.take(index, dim) (embedding lookup for dim 0);  gx = g scatter-added by index.

    Saves the index (integers), not x: the backward of an embedding needs only where each
    row came from.
    """

    @staticmethod
    def forward(ctx, x, dim, index):
        check_same_device("index_select", x, index)
        d = shp.normalize_dim(dim, x.ndim, "index_select")
        if index.ndim > 1:
            raise ShapeError(f"index_select: index must be 0-D or 1-D, got {tuple(index.shape)}")
        if index.dtype.is_floating_point or index.dtype.name == "bool":
            raise TypeError(f"index_select: index must be integer, got {index.dtype.name}")
        xp = backend.xp_for(x.device)
        I = index._array().reshape(-1)
        n = x.shape[d]
        if I.size and (int(I.min()) < -n or int(I.max()) >= n):
            raise IndexError(
                f"index_select: index out of range for dim {d} of size {n} "
                f"(input shape {tuple(x.shape)})"
            )
        ctx.in_shape, ctx.dim = x.shape, d
        ctx.save_for_backward(index)
        return from_array(xp.take(x._array(), I, axis=d), "index-gather")

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        out = zeros_array(ctx.in_shape, g.dtype, g.device)
        backend.index_add(out, ctx.dim, index._array().reshape(-1), g._array())
        return from_array(out), None, None


@op(IndexSelect, method=True, ta=True, functional=True)
def index_select(x, dim, index):
    return IndexSelect.apply(x, dim, index)
