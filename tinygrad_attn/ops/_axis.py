"""Array helpers for ops that work along one dim (scans, sorts, scatters): written with `xp`
alone, so the same code runs on NumPy and CuPy."""

from __future__ import annotations

from .. import shape as shp
from ..errors import ShapeError
from ._util import Tensor


def dim_of(x: Tensor, dim, op: str) -> int:
    """dim as a non-negative index; a 0-d tensor accepts 0 and -1, as torch's does."""
    return shp.normalize_dim(dim, x.ndim, op)


def as_1d(X):
    """A 0-d array as a 1-element 1-D view (ops along a dim treat a scalar as one element)."""
    return X.reshape(1) if X.ndim == 0 else X


def scan(xp, fn, A, axis: int):
    """The inclusive scan of a binary ufunc `fn` along `axis` (a new array).

    Hillis-Steele doubling: log2(n) passes of `out[k:] = fn(out[k:], out[:-k])`, each a
    whole-array op, so it runs unchanged on CuPy (which has no ufunc.accumulate for most
    ufuncs). `fn` must be associative (maximum, minimum, logaddexp).
    float16 is scanned in float32 and rounded once, as torch accumulates half: each of the
    log2(n) passes would otherwise round (a logcumsumexp over 5000 float16 values drifted
    by 1e-3 of its size).
    """
    half = A.dtype == "float16"
    out = xp.moveaxis(A, axis, -1).astype("float32" if half else A.dtype, order="C")  # a copy
    n, step = out.shape[-1], 1
    while step < n:
        out[..., step:] = fn(out[..., step:], out[..., :-step])  # right side read first
        step *= 2
    return xp.moveaxis(out.astype(A.dtype, copy=False), -1, axis)


def reverse_cumsum(xp, A, axis: int):
    """sum_{j >= i} A_j along axis (the adjoint of cumsum); float16 summed in float32 (a
    float16 running sum stops moving once it is large) and rounded once."""
    flipped = xp.flip(A, axis)
    if A.dtype == "float16":
        return xp.flip(xp.cumsum(flipped, axis=axis, dtype="float32").astype(A.dtype), axis)
    return xp.flip(xp.cumsum(flipped, axis=axis), axis)


def positions(xp, shape, axis: int):
    """arange(shape[axis]) shaped to broadcast along `axis` of `shape`."""
    idx_shape = [1] * len(shape)
    idx_shape[axis] = shape[axis]
    return xp.arange(shape[axis], dtype=xp.int64).reshape(idx_shape)


def put_along(xp, shape, dtype, idx, values, axis: int, accumulate: bool):
    """zeros(shape) with `values` written (or, with repeats, added) at `idx` along axis
    (recorded values, under create_graph=True, give the recorded result)."""
    from ._recorded import add_at, put_along_axis
    from .indexing import _full_index

    out = xp.zeros(shape, dtype=dtype)
    if accumulate:
        return add_at(out, _full_index(xp, idx, axis), values)
    return put_along_axis(out, idx, values, axis)


def check_index(op: str, x: Tensor, index: Tensor, d: int, src: Tensor | None = None):
    """torch's rules for scatter/gather-like index tensors: integer dtype (int64), as many
    dims as the input, no larger than src (and, off `d`, than the input)."""
    if index.dtype.is_floating_point or index.dtype.name == "bool":
        raise RuntimeError(f"{op}: expected an int64 index tensor, got {index.dtype.name}")
    if index.ndim != x.ndim and not (index.ndim <= 1 and x.ndim <= 1):
        raise ShapeError(f"{op}: index of shape {tuple(index.shape)} must have as many dims as "
                         f"the input of shape {tuple(x.shape)}")
    for k in range(index.ndim):
        if k != d and x.ndim and index.shape[k] > x.shape[k]:
            raise ShapeError(f"{op}: index of shape {tuple(index.shape)} is larger than the "
                             f"input of shape {tuple(x.shape)} in dim {k}")
        if src is not None and src.ndim and index.shape[k] > src.shape[k]:
            raise ShapeError(f"{op}: index of shape {tuple(index.shape)} is larger than src of "
                             f"shape {tuple(src.shape)} in dim {k}")
