"""Stride arithmetic, with no arrays in sight (after minitorch's tensor_data.py).

A tensor is (shape, strides, offset) over a flat storage: element (i0, i1, ...) lives at
`offset + i0*strides[0] + i1*strides[1] + ...`. Every zero-copy view op is a function from
one such triple to another; this module holds those functions.
"""

from __future__ import annotations

from .errors import ShapeError

Shape = tuple[int, ...]
Strides = tuple[int, ...]


def numel(shape: Shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def contiguous_strides(shape: Shape) -> Strides:
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def is_contiguous(shape: Shape, strides: Strides) -> bool:
    if 0 in shape:  # no elements: any strides describe it
        return True
    acc = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != acc:
            return False
        acc *= size
    return True


def normalize_dim(dim: int, ndim: int, op: str, tensor_ndim: int | None = None) -> int:
    """dim in [-ndim, ndim) as a non-negative index; `tensor_ndim` is what the message
    reports as the tensor's dims when ndim counts a new dim (unsqueeze, stack)."""
    if not isinstance(dim, int):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    lo, hi = -max(ndim, 1), max(ndim, 1) - 1
    if not lo <= dim <= hi:
        shown = ndim if tensor_ndim is None else tensor_ndim
        raise IndexError(
            f"{op}: dimension out of range (expected to be in range of [{lo}, {hi}], "
            f"but got {dim}) for a tensor of {shown} dims"
        )
    return dim + max(ndim, 1) if dim < 0 else dim


def normalize_dims(dims, ndim: int, op: str) -> tuple[int, ...]:
    out = tuple(normalize_dim(d, ndim, op) for d in dims)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated dims {tuple(dims)}")
    return out


def broadcast_shapes(*shapes: Shape, op: str = "broadcast") -> Shape:
    ndim = max(len(s) for s in shapes)
    out = []
    for i in range(-ndim, 0):
        size = 1
        for s in shapes:
            if -i <= len(s):
                d = s[i]
                if d != 1:
                    if size != 1 and d != size:
                        raise ShapeError(
                            f"{op}: shapes {' and '.join(str(tuple(x)) for x in shapes)} "
                            f"cannot be broadcast together (dim {i}: {size} vs {d})"
                        )
                    size = d
        out.append(size)
    return tuple(out)


def infer_shape(shape, total: int, op: str) -> Shape:
    """Resolve one -1 in `shape` so that it holds `total` elements."""
    shape = tuple(int(s) for s in shape)
    unknown = [i for i, s in enumerate(shape) if s == -1]
    if len(unknown) > 1:
        raise ShapeError(f"{op}: only one dimension can be inferred, got shape {shape}")
    if any(s < -1 for s in shape):
        raise ShapeError(f"{op}: invalid shape {shape}")
    known = numel(tuple(s for s in shape if s != -1))
    if unknown:
        if known == 0 or total % known:
            raise ShapeError(f"{op}: shape {shape} is invalid for input of size {total}")
        shape = shape[: unknown[0]] + (total // known,) + shape[unknown[0] + 1 :]
    if numel(shape) != total:
        raise ShapeError(f"{op}: shape {shape} is invalid for input of size {total}")
    return shape


def view_strides(shape: Shape, strides: Strides, new_shape: Shape) -> Strides | None:
    """Strides that give `new_shape` over the same memory as (shape, strides), or None.

    The rule PyTorch uses: the old dims are cut into chunks that are each contiguous in
    memory; every new dim must fall inside one chunk.
    """
    if not shape:  # 0-d: every new dim has size 1
        return contiguous_strides(new_shape)
    if numel(shape) == 0:  # no elements: any strides describe it; torch keeps them if it can
        return tuple(strides) if tuple(shape) == tuple(new_shape) else (
            contiguous_strides(new_shape))
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base_stride = strides[-1] if strides else 1
    tensor_numel = 1
    view_numel = 1
    for tensor_d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[tensor_d]
        if tensor_d == 0 or (
            shape[tensor_d - 1] != 1 and strides[tensor_d - 1] != tensor_numel * chunk_base_stride
        ):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base_stride
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = strides[tensor_d - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return tuple(new_strides)


def index_geometry(shape: Shape, strides: Strides, offset: int, index: tuple):
    """Basic indexing (ints, slices with positive steps, None, Ellipsis) as a new view.

    Returns (shape, strides, offset). Raises IndexError for out-of-range ints.
    """
    n_real = sum(1 for i in index if i is not None and i is not Ellipsis)
    if n_real > len(shape):
        raise IndexError(
            f"getitem: too many indices for tensor of shape {tuple(shape)}: got {n_real}"
        )
    if sum(1 for i in index if i is Ellipsis) > 1:
        raise IndexError("getitem: an index can only have a single ellipsis ('...')")
    out_shape, out_strides = [], []
    dim = 0
    for item in index:
        if item is None:
            out_shape.append(1)
            out_strides.append(0)
        elif item is Ellipsis:
            skip = len(shape) - n_real
            out_shape.extend(shape[dim : dim + skip])
            out_strides.extend(strides[dim : dim + skip])
            dim += skip
        elif isinstance(item, slice):
            start, stop, step = item.indices(shape[dim])
            if item.step is not None and item.step <= 0:
                raise ValueError(
                    f"getitem: slice step must be positive, got {item.step} "
                    f"(dim {dim} of shape {tuple(shape)})"
                )
            length = max(0, (stop - start + step - 1) // step)
            # start is clamped into [0, size]: an empty slice sits where torch puts it (at
            # the clamped start), which may be past the storage's end; it touches nothing
            offset += start * strides[dim]
            out_shape.append(length)
            out_strides.append(strides[dim] * step)
            dim += 1
        else:
            i = int(item)
            if not -shape[dim] <= i < shape[dim]:
                raise IndexError(
                    f"getitem: index {i} is out of bounds for dim {dim} with size {shape[dim]} "
                    f"(tensor of shape {tuple(shape)})"
                )
            offset += (i % shape[dim]) * strides[dim]
            dim += 1
    out_shape.extend(shape[dim:])
    out_strides.extend(strides[dim:])
    return tuple(out_shape), tuple(out_strides), offset


def storage_extent(shape: Shape, strides: Strides, offset: int) -> int:
    """One past the largest flat position the view touches (0 if it has no elements)."""
    if numel(shape) == 0:
        return 0
    return offset + sum((s - 1) * st for s, st in zip(shape, strides)) + 1


# NumPy and CuPy address an array's bytes with signed 64-bit integers: `numel * itemsize`
# (the product of the nonzero sizes, for an empty array) must fit, or no array of that shape
# can be made (torch's own limit is the element count, 2**63 - 1).
MAX_BYTES = 2**63 - 1


def check_view(op: str, shape: Shape, strides: Strides, offset: int, storage_size: int,
               itemsize: int) -> None:
    """The bounds rule of every view: raise ShapeError (a RuntimeError, as torch's) unless
    (shape, strides, offset) is a view an array can be made of over `storage_size` elements.

    - the storage offset is >= 0 and every size >= 0;
    - the sizes fit MAX_BYTES (an expanded or empty view too: NumPy must hold its shape);
    - a view with elements reads only positions in [0, storage_size): the lowest is
      `offset` plus (size - 1) * stride over the negative strides, the highest `offset`
      plus that over the positive ones;
    - a view with no elements touches nothing: any (non-negative) offset and any strides.

    One pass over the dims, Python ints throughout (no overflow). Constructors whose result
    provably stays inside their input (permute, slicing, a view of the same elements) need
    not call it; the ones that take sizes, strides or offsets from the caller do.
    """
    if offset < 0:
        raise ShapeError(f"{op}: invalid storage offset {offset} (size {tuple(shape)}, "
                         f"stride {tuple(strides)}): it must be >= 0")
    lowest = highest = offset
    count = 1  # the product of the nonzero sizes
    empty = False
    for size, stride in zip(shape, strides):
        if size <= 0:
            if size < 0:
                raise ShapeError(f"{op}: invalid size {size} in {tuple(shape)}: sizes must be "
                                 ">= 0")
            empty = True
            continue
        count *= size
        if stride > 0:
            highest += (size - 1) * stride
        else:
            lowest += (size - 1) * stride
    if count * itemsize > MAX_BYTES:
        raise ShapeError(f"{op}: size {tuple(shape)} is too large: {count} elements of "
                         f"{itemsize} bytes pass the 2**63 - 1 bytes an array can address")
    if empty:
        return
    if lowest < 0 or highest >= storage_size:
        raise ShapeError(
            f"{op}: size {tuple(shape)}, stride {tuple(strides)} and storage offset {offset} "
            f"reach elements {lowest} to {highest}, out of bounds for a storage of "
            f"{storage_size} elements"
        )


# ----------------------------------------------------------------------------- overlap
def has_internal_overlap(shape, strides) -> bool:
    """Whether a view writes several of its elements into one memory location, in the cases
    torch answers "yes": a dim of size > 1 with stride 0 (expand, broadcast_to). Any other
    self-overlapping layout (an as_strided window) is "too hard" for torch, which writes it
    without complaint; so does this."""
    if 0 not in strides:  # the hot path: every contiguous or permuted tensor stops here
        return False
    if 0 in shape:
        return False
    return any(st == 0 and n > 1 for n, st in zip(shape, strides))


def is_non_overlapping_and_dense(shape, strides) -> bool:
    """Whether the view covers a block of numel consecutive elements exactly once, in some
    order of its dims (torch's test; dims of size 1 do not count, an empty view is dense)."""
    if 0 in shape:
        return True
    expected = 1
    for st, n in sorted((st, n) for n, st in zip(shape, strides) if n != 1):
        if st != expected:
            return False
        expected *= n
    return True


def overlap_status(a: tuple, b: tuple) -> str:
    """torch's get_overlap_status of two (shape, strides, offset) views of one Storage: "full"
    (the same elements in the same order), "partial", or "no" (also when the layouts are
    not dense: "too hard" for torch, which then lets the op run)."""
    if a == b:
        return "full"
    (shape_a, st_a, oa), (shape_b, st_b, ob) = a, b
    na, nb = numel(shape_a), numel(shape_b)
    if na == 0 or nb == 0:
        return "no"
    if not (is_non_overlapping_and_dense(shape_a, st_a)
            and is_non_overlapping_and_dense(shape_b, st_b)):
        return "no"
    if oa == ob and na == nb:
        return "full" if st_a == st_b else "partial"
    return "partial" if oa < ob + nb and ob < oa + na else "no"
