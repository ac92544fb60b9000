"""Copying ops: advanced indexing, cat/stack, where, masked_fill, tril/triu, gather,
index_select. Their outputs are new allocations; their backwards scatter-add or slice."""

from __future__ import annotations

from .. import backend
from .. import shape as shp
from ..autograd import Function
from ..autograd.graph import recording, unwrap
from ..backend.dtypes import checked_scalar
from ..errors import ShapeError
from ._recorded import add_at
from ._util import Tensor, check_same_device, from_array, unbroadcast, zeros_array
from .registry import op

# ----------------------------------------------------------------------------- x[index]
# torch's rules, which differ from NumPy's in where the advanced-index dims go: ints, slices
# and None are applied first, as a view; the remaining integer arrays (bool masks become
# the positions they select) then index that view, and their broadcast dims stay in place
# when the arrays are adjacent, else go first. On a view that holds only slices and arrays,
# NumPy's placement rule is exactly that, so `view[arrays]` gives torch's result.

_VALID = ("only integers, slices (`:`), ellipsis (`...`), None, bools and integer or bool "
          "tensors are valid indices")


def _as_index_tuple(index) -> tuple:
    """torch's reading of a top-level list: as a tuple of indices when it is short and holds
    a tensor, a sequence, a slice, None or Ellipsis; otherwise as one index."""
    if isinstance(index, tuple):
        return index
    if isinstance(index, list) and len(index) < 32 and any(
        type(i) is Tensor or backend.is_array(i) or isinstance(i, (list, tuple, slice))
        or i is None or i is Ellipsis for i in index
    ):
        return tuple(index)
    return (index,)


def _dims_taken(item) -> int:
    """How many dims of the indexed tensor a checked index item consumes."""
    if item is None or item is Ellipsis:
        return 0
    if isinstance(item, tuple) and item[0] == "mask":
        return 0 if type(item[1]) is bool else item[1].ndim  # a 0-d mask adds a dim
    return 1


def _index_item(op: str, item, x: Tensor):
    """One index item as None, Ellipsis, a slice, an int, ('mask', array) or
    ('ints', array): the checks torch makes on the kinds and dtypes of indices."""
    if item is None or item is Ellipsis or type(item) is int:
        return item
    if isinstance(item, slice):
        if item.step is not None and int(item.step) <= 0:
            raise ValueError(f"{op}: slice step must be positive, got {item.step}")
        return item
    if isinstance(item, bool):  # a Python bool is a 0-d mask: a new dim of size 1 or 0
        return "mask", item
    if isinstance(item, (list, tuple)):
        try:
            arr = backend.asarray(list(item), None, x.device)
        except (ValueError, TypeError, RuntimeError) as e:
            raise IndexError(f"{op}: cannot make an index tensor from {item!r}: {e}") from None
        if arr.size == 0:  # an empty list selects nothing, as an empty int64 index
            arr = arr.astype(backend.int64.np)
        elif arr.dtype.kind == "f":
            raise IndexError(f"{op}: {_VALID} (got a list of floats {item!r})")
    elif type(item) is Tensor:
        check_same_device(op, x, item)
        arr = item._array()
    elif backend.is_array(item):
        arr = backend.asarray(item, None, x.device)
    elif isinstance(item, str):
        raise TypeError(f"{op}: {_VALID} (got str {item!r})")
    elif hasattr(item, "__index__") and not isinstance(item, float):
        try:
            return int(item.__index__())
        except TypeError:
            raise IndexError(f"{op}: {_VALID} (got {type(item).__name__})") from None
    else:
        raise IndexError(f"{op}: {_VALID} (got {type(item).__name__})")
    name = str(arr.dtype)
    if name in ("bool", "uint8"):
        return "mask", arr
    if name in ("int32", "int64") or (arr.ndim == 0 and arr.dtype.kind in "iu"):
        return int(arr.item()) if arr.ndim == 0 else ("ints", arr)
    raise IndexError(f"{op}: tensors used as indices must be long, int, byte or bool tensors, "
                     f"got {name}")


class ResolvedIndex:
    """x[index] split into torch's two steps: `basic` (ints, slices, None) gives a view,
    and `arrays` (a tuple of slices and integer arrays, or None) indexes that view."""

    __slots__ = ("basic", "arrays")

    def __init__(self, basic: tuple, arrays):
        self.basic, self.arrays = basic, arrays

    def read(self, arr):
        """arr[index]: a view when the index is basic, else a new array."""
        return arr[self.basic] if self.arrays is None else arr[self.basic][self.arrays]

    def write(self, arr, value) -> None:
        """arr[index] = value, in place (the basic part of an advanced index is a view).

        A recorded array's `arr[basic]` is a new array, not a view, so there the write
        goes in one step, at the positions the whole index selects."""
        if self.arrays is None:
            arr[self.basic] = value
        elif not recording():
            arr[self.basic][self.arrays] = value
        elif arr.ndim == 0:  # a 0-d mask on a 0-d array: all of it, or nothing
            if self._positions(arr)[0].size:
                arr[...] = value
        else:
            arr[self._positions(arr)] = value

    def add_into(self, arr, value):
        """arr[index] += value with repeated positions summed; returns arr (written in
        place), or, for a recorded value, the recorded sum (a new array)."""
        if not recording():
            backend.scatter_add(arr[self.basic], self.arrays, value)
            return arr
        if arr.ndim == 0:  # x[True] of a 0-d x: the one element, once or not at all
            return add_at(arr.reshape(1), self._positions(arr), value).reshape(())
        return add_at(arr, self._positions(arr), value)

    def _positions(self, arr) -> tuple:
        """Integer arrays (one per dim of arr, each of the shape of arr[index]) of the
        positions arr[index] reads: the index as one NumPy advanced index (for a 0-d arr,
        one array of positions in arr.reshape(1))."""
        first = next(a for a in self.arrays if backend.is_array(a))
        xp = backend.xp_for(backend.device_of(first))
        shape = tuple(arr.shape)
        flat = self.read(xp.arange(shp.numel(shape), dtype=xp.int64).reshape(shape))
        return xp.unravel_index(flat, shape) if shape else (flat,)


def _check_bounds(op: str, arr, dim: int, shape: tuple) -> None:
    n = shape[dim]
    if arr.size == 0:
        return
    low, high = int(arr.min()), int(arr.max())
    bad = low if low < -n else high if high >= n else None
    if bad is not None:
        raise IndexError(f"{op}: index {bad} is out of bounds for dim {dim} with size {n} "
                         f"(tensor of shape {tuple(shape)})")


def resolve_index(x: Tensor, index, op: str = "getitem") -> ResolvedIndex:
    """Check `index` against x (kinds, dtypes, mask shapes, bounds) and split it."""
    shape = tuple(x.shape)
    items = [_index_item(op, i, x) for i in _as_index_tuple(index)]
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise IndexError(f"{op}: an index can only have a single ellipsis ('...')")
    taken = sum(_dims_taken(i) for i in items)
    if taken > len(shape):
        raise IndexError(f"{op}: too many indices for tensor of shape {shape}: got {taken}")
    xp = backend.xp_for(x.device)
    basic, arrays = [], {}
    dim = 0  # the dim of x the next item indexes
    for item in items:
        if item is None:
            basic.append(None)
        elif item is Ellipsis:
            skip = len(shape) - taken
            basic.extend([slice(None)] * skip)
            dim += skip
        elif isinstance(item, slice):
            basic.append(item)
            dim += 1
        elif type(item) is int:
            if not -shape[dim] <= item < shape[dim]:
                raise IndexError(f"{op}: index {item} is out of bounds for dim {dim} with size "
                                 f"{shape[dim]} (tensor of shape {shape})")
            basic.append(item % shape[dim])
            dim += 1
        elif item[0] == "ints":
            _check_bounds(op, item[1], dim, shape)
            arrays[_view_dim(basic)] = item[1]
            basic.append(slice(None))
            dim += 1
        else:
            mask = item[1]
            if type(mask) is bool or mask.ndim == 0:  # a new dim, all (True) or none of it
                keep = mask if type(mask) is bool else bool(mask.item())
                arrays[_view_dim(basic)] = xp.arange(1 if keep else 0, dtype=xp.int64)
                basic.append(None)
                continue
            _check_mask(op, mask, dim, shape)
            for positions in xp.nonzero(mask):
                arrays[_view_dim(basic)] = positions
                basic.append(slice(None))
                dim += 1
    if not arrays:
        return ResolvedIndex(tuple(basic), None)
    try:
        shp.broadcast_shapes(*(tuple(a.shape) for a in arrays.values()), op=op)
    except ShapeError:
        shapes = ", ".join(str(tuple(a.shape)) for a in arrays.values())
        raise IndexError(f"{op}: shape mismatch: indexing tensors could not be broadcast "
                         f"together with shapes {shapes}") from None
    last = max(arrays)
    full = tuple(arrays.get(d, slice(None)) for d in range(last + 1))
    return ResolvedIndex(tuple(basic), full)


def _view_dim(basic: list) -> int:
    """The dim of the basic view that the next item lands on (ints drop a dim)."""
    return sum(1 for b in basic if type(b) is not int)


def _check_mask(op: str, mask, dim: int, shape: tuple) -> None:
    for j, size in enumerate(mask.shape):
        if dim + j >= len(shape) or shape[dim + j] != size:
            raise IndexError(
                f"{op}: the shape of the mask {tuple(mask.shape)} at index {j} does not match "
                f"the shape of the indexed tensor {shape} at index {dim + j}"
            )


class AdvancedIndex(Function):
    """y = x[index] with integer/bool array indices (a copy, reason 'index-gather').

    gx = zeros of x's shape with g scatter-added at the indexed positions (repeated
    indices sum). Saves the index arrays (integers), not x.
    """

    @staticmethod
    def forward(ctx, x, index: ResolvedIndex):
        ctx.in_shape, ctx.index = x.shape, index
        return from_array(index.read(x._array()), "index-gather")  # a new array

    @staticmethod
    def backward(ctx, g):
        out = zeros_array(ctx.in_shape, g.dtype, g.device)
        out = ctx.index.add_into(out, g._array())
        return from_array(out)


def advanced_index(x: Tensor, index: ResolvedIndex):
    return AdvancedIndex.apply(x, index)


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
        # a Python number is stored as a value of the result dtype: it must fit (torch)
        A, B = (v._array().astype(dtype.np, copy=False) if type(v) is Tensor
                else checked_scalar("where", v, dtype) for v in (a, b))
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
        V = value._array() if type(value) is Tensor else checked_scalar("masked_fill", value,
                                                                          x.dtype)
        ctx.save_for_backward(mask)
        return from_array(backend.masked_fill(x._array(), mask._array(), V))

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        M, G = mask._array(), g._array()
        nx, _, nv = ctx.needs_input_grad
        gx = from_array(backend.masked_fill(G, M, 0)) if nx else None
        gv = None
        if nv:  # NumPy's sum is a scalar, made a 0-d array; a recorded sum is one already
            total = xp.where(M, G, 0).sum()
            gv = from_array(total if recording() else xp.asarray(total))
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


def check_index_tensor(op: str, index, error=RuntimeError) -> None:
    """An index argument must be an int32 or int64 tensor (torch's rule for gather,
    index_select and embedding)."""
    if type(index) is not Tensor:
        raise TypeError(f"{op}: index must be a Tensor, got {type(index).__name__}")
    if index.dtype.name not in ("int32", "int64"):
        raise error(f"{op}: expected dtype int32 or int64 for index, got {index.dtype.name} "
                    f"(index of shape {tuple(index.shape)})")


def check_index_range(op: str, index_arr, dim: int, shape, error=IndexError) -> None:
    """Every index in [0, shape[dim]): negative indices are errors here, as in torch (only
    x[index] counts from the end)."""
    n = shape[dim]
    if index_arr.size == 0:
        return
    low, high = int(index_arr.min()), int(index_arr.max())
    if low < 0 or high >= n:
        raise error(f"{op}: index {low if low < 0 else high} is out of range for dim {dim} "
                    f"of size {n} (input shape {tuple(shape)})")


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
        check_index_tensor("gather", index, RuntimeError)
        xp = backend.xp_for(x.device)
        I = index._array()
        check_index_range("gather", I, d, x.shape, RuntimeError)
        full = _full_index(xp, I, d)
        ctx.in_shape, ctx.full = x.shape, full
        ctx.save_for_backward(index)
        return from_array(x._array()[full], "index-gather")

    @staticmethod
    def backward(ctx, g):
        out = zeros_array(ctx.in_shape, g.dtype, g.device)
        out = add_at(out, ctx.full, g._array())
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
    def forward(ctx, x, dim, index, op="index_select"):
        # `op` names the caller in errors: embedding is this op, and checks nothing twice
        check_same_device(op, x, index)
        d = shp.normalize_dim(dim, x.ndim, op)
        if index.ndim > 1:
            raise ShapeError(f"{op}: index must be 0-D or 1-D, got {tuple(index.shape)}")
        check_index_tensor(op, index, RuntimeError)
        xp = backend.xp_for(x.device)
        I = index._array().reshape(-1)
        check_index_range(op, I, d, x.shape, IndexError)
        ctx.in_shape, ctx.dim = x.shape, d
        ctx.save_for_backward(index)
        return from_array(xp.take(x._array(), I, axis=d), "index-gather")

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        out = zeros_array(ctx.in_shape, g.dtype, g.device)
        I = unwrap(index)._array().reshape(-1)
        if recording():  # the same sum by the idiom that records (index_add writes in place)
            out = add_at(out, (slice(None),) * ctx.dim + (I,), g._array())
        else:
            backend.index_add(out, ctx.dim, I, g._array())
        return from_array(out), None, None


@op(IndexSelect, method=True, ta=True, functional=True)
def index_select(x, dim, index):
    return IndexSelect.apply(x, dim, index)
