"""Memory layout: flat buffers and strided views over them, copies, host/device transfer,
building arrays from user data, and DLPack.

A Storage holds one flat 1-D array; a tensor is (shape, strides, offset) in elements over it.
`flat_buffer` and `span_view` expose an array's memory that way without copying, `strided`
turns the description back into an array.
"""

from __future__ import annotations

import numpy as np

from . import devices
from .devices import device_of, is_array, on_device
from .dtypes import _BY_NP, DType, get_default_dtype


def flat_buffer(arr):
    """(flat, strides, offset) for a freshly computed array whose memory it owns densely.

    `flat` is a 1-D view of the whole allocation, `strides` are in elements, `offset` is 0.
    NumPy's ufuncs keep the memory order of their inputs (a transposed input gives an
    F-ordered result): such a result is dense in some axis order, so it is exposed as-is,
    without a copy. Returns None when the array is not dense (then the caller copies).
    """
    itemsize = arr.itemsize
    if arr.flags.c_contiguous:
        return arr.reshape(-1), _elem_strides(arr.shape, arr.strides, itemsize), 0
    if arr.ndim and all(s > 0 for s in arr.strides):
        order = sorted(range(arr.ndim), key=lambda i: -arr.strides[i])
        dense = arr.transpose(order)
        if dense.flags.c_contiguous:
            return dense.reshape(-1), _elem_strides(arr.shape, arr.strides, itemsize), 0
    return None


def _elem_strides(shape, byte_strides, itemsize):
    # a dimension of size 1 may carry any stride; report the contiguous one for it
    return tuple(s // itemsize for s in byte_strides)


def span_view(arr):
    """(flat, strides, offset) for any array with non-negative strides, sharing its memory.

    Used for arrays that come from outside (DLPack): `flat` is a 1-D view of the memory
    span the array touches, starting at its first element.
    """
    if any(s < 0 for s in arr.strides):
        return None
    itemsize = arr.itemsize
    strides = tuple(s // itemsize for s in arr.strides)
    if arr.size == 0:
        extent = 0
    else:
        extent = 1 + sum((n - 1) * s for n, s in zip(arr.shape, strides))
    if isinstance(arr, np.ndarray):
        flat = np.lib.stride_tricks.as_strided(arr, (extent,), (itemsize,))
    else:
        flat = devices.cp.lib.stride_tricks.as_strided(arr, (extent,), (itemsize,))
    return flat, strides, 0


def strided(flat, shape, strides, offset):
    """The array with the given shape/strides/offset (in elements) over a flat buffer.

    The geometry was checked when the view was made (shape.check_view); two valid views
    NumPy would still refuse are handled here, off the common path: an empty view, and a
    size-1 dim whose stride is too large to count in bytes.
    """
    if 0 in shape:
        # no elements, no memory touched: its offset may lie past the buffer's end (a split
        # piece of an empty tensor) and its strides be anything, which NumPy would check
        return _empty_over(flat, shape)
    itemsize = flat.itemsize
    byte_strides = tuple(s * itemsize for s in strides)
    try:
        return _view_over(flat, shape, byte_strides, offset * itemsize)
    except (ValueError, OverflowError):
        # a size-1 dim never moves, so its stride may be anything (x[::2**62] keeps torch's
        # 2**62), even one whose bytes overflow what NumPy's strides hold: 0 reads the same
        byte_strides = tuple(0 if n == 1 else b for n, b in zip(shape, byte_strides))
        return _view_over(flat, shape, byte_strides, offset * itemsize)


def _view_over(flat, shape, byte_strides, byte_offset):
    if isinstance(flat, np.ndarray):
        return np.ndarray(shape, flat.dtype, flat, byte_offset, byte_strides)
    return devices.cp.ndarray(shape, flat.dtype, flat.data + byte_offset, byte_strides)


def _empty_over(flat, shape):
    """A zero-size array of `shape` over the start of `flat` (it reads nothing)."""
    if isinstance(flat, np.ndarray):
        return np.ndarray(shape, flat.dtype, flat, 0)
    return devices.cp.ndarray(shape, flat.dtype, flat.data)


def ascontiguous(arr):
    """A C-contiguous copy (or the array itself if it already is)."""
    xp = np if isinstance(arr, np.ndarray) else devices.cp
    return xp.ascontiguousarray(arr)


def copy(arr, dtype: DType | None = None):
    """A C-contiguous copy of `arr`, optionally cast."""
    return arr.astype(arr.dtype if dtype is None else dtype.np, order="C", copy=True)


def data_ptr(flat, offset: int) -> int:
    if isinstance(flat, np.ndarray):
        return flat.ctypes.data + offset * flat.itemsize
    return flat.data.ptr + offset * flat.itemsize


def to_host(arr):
    """A NumPy array with the values of `arr` (a copy from the GPU; `arr` itself on CPU)."""
    if isinstance(arr, np.ndarray):
        return arr
    return devices.cp.asnumpy(arr)


def to_device(arr, device: str):
    """`arr` moved to `device` (a new allocation there)."""
    if device == "cpu":
        return to_host(arr)
    with on_device(device):
        return devices.cp.asarray(arr)


def _from_python(data, np_dtype):
    """A host array from Python data (nested lists, scalars), refusing what torch refuses
    instead of NumPy's silent readings: ragged lists, strings and None (an object or text
    array) and integers that do not fit the dtype (NumPy wraps or widens them)."""
    try:
        host = np.array(data)
    except ValueError as e:
        raise ValueError(f"tensor(): nested lists must be rectangular (every list at one depth "
                         f"of the same length): {e}") from None
    if host.dtype.kind in "USV":
        kind = "str" if host.dtype.kind == "U" else "bytes"
        raise TypeError(f"tensor(): data must be numbers or bools, got {kind} in {_short(data)}")
    if host.dtype == object:
        for item in host.flat:
            if not isinstance(item, (int, float)):
                raise TypeError(f"tensor(): data must be numbers or bools, got "
                                f"{type(item).__name__} in {_short(data)}")
        if np_dtype is not None and np_dtype.kind == "f":
            return host.astype(np_dtype)  # 2**70 as a float is fine
        raise ValueError(f"tensor(): integer out of range of int64 in {_short(data)} (Overflow)")
    if np_dtype is None:
        if host.dtype == np.uint64:  # ints past int64's range: NumPy's silent widening
            raise ValueError(f"tensor(): integer out of range of int64 in {_short(data)} "
                             "(Overflow)")
        return host
    if host.dtype.kind in "iu" and np_dtype.kind in "iu" and host.size:
        info = np.iinfo(np_dtype)
        low, high = int(host.min()), int(host.max())
        if low < info.min or high > info.max:
            raise RuntimeError(f"tensor(): value {low if low < info.min else high} cannot be "
                             f"converted to {np_dtype} without overflow")
    return host.astype(np_dtype)


def _short(data) -> str:
    text = repr(data)
    return text if len(text) <= 60 else text[:57] + "..."


def asarray(data, dtype: DType | None, device: str):
    """An array on `device` built from Python data, a NumPy/CuPy array or a scalar."""
    np_dtype = None if dtype is None else dtype.np
    if is_array(data) and device_of(data) == device:
        arr = data.astype(np_dtype, copy=True) if np_dtype is not None else data.copy()
    else:
        keep_dtype = is_array(data)  # an array keeps its dtype, whichever device it is on
        if keep_dtype:
            data = to_host(data)
        elif hasattr(data, "__dlpack__") and not isinstance(data, (list, tuple)):
            data = from_dlpack(data)  # a torch tensor, say: read through DLPack, then copied
            if not isinstance(data, np.ndarray):
                data = to_host(data)
        host = np.array(data, dtype=np_dtype) if keep_dtype else _from_python(data, np_dtype)
        if dtype is None and not keep_dtype:
            if host.dtype.kind == "f":
                host = host.astype(get_default_dtype().np)
            elif host.dtype.kind in "iu" and host.dtype != np.uint8:
                host = host.astype(np.int64)
        arr = to_device(host, device) if device != "cpu" else host
    if arr.dtype not in _BY_NP:
        raise TypeError(f"tensor(): unsupported dtype {arr.dtype}")
    return arr


def ensure_array(x):
    """A 0-d array for a NumPy scalar (reductions and ufuncs on 0-d arrays return those)."""
    return np.asarray(x)


def from_dlpack(obj):
    """An array (NumPy for host memory, CuPy for device memory) sharing `obj`'s memory."""
    dev = obj.__dlpack_device__()[0] if hasattr(obj, "__dlpack_device__") else 1
    if dev == 1:  # kDLCPU
        return np.from_dlpack(obj)
    if devices.cp is None:
        raise RuntimeError("from_dlpack: the object lives on a GPU and CuPy is not installed")
    return devices.cp.from_dlpack(obj)
