"""The window geometry convolution and pooling share: a window is a strided view of the
input (`_windows`), explicit padding is a recorded copy, im2col is the one copy a
convolution's GEMM needs, and col2im is its adjoint. conv.py's docstring tells the story.
"""

from __future__ import annotations

import itertools
import math

from .. import backend
from ..autograd.graph import unwrap
from ..errors import ShapeError
from ._recorded import _is_recorded, add_at
from ._util import Tensor, from_array


# ----------------------------------------------------------------------------- geometry
def _tuple(value, n: int, name: str, op_name: str) -> tuple:
    out = (int(value),) * n if isinstance(value, int) else tuple(int(v) for v in value)
    if len(out) != n:
        raise ShapeError(f"{op_name}: {name} must be an int or {n} ints, got {value!r}")
    return out


class _Geometry:
    """Kernel, stride, dilation, padding (low, high) per spatial dim and the output sizes
    of a window view over an input of spatial shape `size`."""

    def __init__(self, size, kernel, stride, dilation, pad_lo, pad_hi, out):
        self.size, self.kernel, self.stride, self.dilation = size, kernel, stride, dilation
        self.pad_lo, self.pad_hi, self.out = pad_lo, pad_hi, out

    @property
    def padded(self) -> tuple:
        return tuple(n + lo + hi for n, lo, hi in zip(self.size, self.pad_lo, self.pad_hi))

    @property
    def padded_any(self) -> bool:
        return any(self.pad_lo) or any(self.pad_hi)

    def crop(self) -> tuple:
        return tuple(slice(lo, lo + n) for lo, n in zip(self.pad_lo, self.size))


def _windows(arr, geo: _Geometry):
    """The zero-copy window view (N, C, *kernel, *out) of arr (N, C, *padded); of a
    recorded array (create_graph=True), a gather of the same elements, recorded."""
    if _is_recorded(arr):
        return arr.reshape(-1)[_positions(arr.shape, geo, arr.t.device)]
    flat, strides, offset = backend.span_view(arr)
    spatial = strides[2:]
    shape = arr.shape[:2] + tuple(geo.kernel) + tuple(geo.out)
    view_strides = (strides[:2] + tuple(s * d for s, d in zip(spatial, geo.dilation))
                    + tuple(s * st for s, st in zip(spatial, geo.stride)))
    return backend.strided(flat, shape, view_strides, offset)


def _positions(shape, geo: _Geometry, device):
    """The flat positions (N, C, *kernel, *out) that the windows of a C-contiguous
    (N, C, *padded) array of this shape read, on `device`: what a recorded backward
    gathers and scatters by (a constant index array)."""
    xp = backend.xp_for(device)
    with backend.on_device(device):
        flat = xp.arange(math.prod(shape), dtype=xp.int64).reshape(shape)
        return backend.copy(_windows(flat, geo))


def _padded(xp, X, geo: _Geometry, value=0):
    """X itself, or a Tensor holding X inside a fresh buffer filled with `value` (recorded as
    'window-pad'; the caller keeps the Tensor while it reads the array, so the ledger counts
    the buffer for as long as it lives). A recorded X is padded by a recorded op."""
    if not geo.padded_any:
        return X
    if _is_recorded(X):
        widths = [(0, 0), (0, 0)] + list(zip(geo.pad_lo, geo.pad_hi))
        return xp.pad(X, widths, constant_values=value)
    buf = xp.full(X.shape[:2] + geo.padded, value, dtype=X.dtype)
    buf[(slice(None), slice(None)) + geo.crop()] = X
    return from_array(buf, "window-pad")


def _array_of(source):
    return source._array() if type(source) is Tensor else source


def _im2col(xp, X, geo: _Geometry) -> Tensor:
    """The columns (N, C, *kernel, *out) of X: one contiguous copy of its window view, as a
    Tensor recorded as 'im2col' (hold it while its array is in use)."""
    padded = _padded(xp, X, geo)
    cols = backend.copy(_windows(_array_of(padded), geo))
    del padded
    return from_array(cols, "im2col")


def _col2im(xp, cols, geo: _Geometry, dtype):
    """The adjoint of _im2col: columns (N, C, *kernel, *out) summed back into (N, C, *size).
    Recorded columns (create_graph=True) are scattered by a recorded index-add."""
    lead = (slice(None), slice(None))
    if _is_recorded(cols):
        shape = cols.shape[:2] + geo.padded
        index = _positions(shape, geo, cols.t.device)
        buf = add_at(xp.zeros(math.prod(shape), dtype=dtype), index, cols)
        buf = buf.reshape(shape)
        return buf[lead + geo.crop()] if geo.padded_any else buf
    buf = xp.zeros(cols.shape[:2] + geo.padded, dtype=dtype)
    view = _windows(buf, geo)
    for k in itertools.product(*(range(n) for n in geo.kernel)):
        view[lead + k] += cols[lead + k]
    if geo.padded_any:
        return xp.ascontiguousarray(buf[lead + geo.crop()])
    return buf




def _plain(t):
    """The plain array of a saved tensor that no derivative flows through (an index), in a
    first-order or a recorded backward alike."""
    return unwrap(t)._array()


def _batched(X, n):
    """(array with a batch dim, whether one was added) for (C, *S) or (N, C, *S) input."""
    return (X[None], True) if X.ndim == n + 1 else (X, False)


def _positive(op_name, **values):
    for name, vals in values.items():
        if any(v <= 0 for v in vals):
            raise ShapeError(f"{op_name}: {name} must be positive, got {vals}")
