"""Array backends: NumPy on "cpu", CuPy on "cuda[:N]".

This is the only module of the project that imports numpy or cupy. Everything above it asks
this module for the array namespace of a device (`xp_for`) and for the few operations whose
spelling differs between the two libraries (strided views, scatter-add, erf, RNG, DLPack).
"""

from __future__ import annotations

import math
import os

import numpy as np

try:  # CuPy is optional: the package imports and runs on CPU without it.
    import cupy as cp
except Exception:  # noqa: BLE001 - a broken CUDA install must not break CPU use
    cp = None

ndarray_types: tuple = (np.ndarray,) if cp is None else (np.ndarray, cp.ndarray)


def _install_array_module(module):
    """For tests only: make `module` the GPU array library in place of CuPy; returns the
    previous one (None without CuPy), which `_install_array_module(previous)` restores.

    tests/fake_cupy.py is such a module: NumPy underneath, but its arrays refuse implicit
    conversion to host arrays as CuPy's do, so the CPU test suite runs the "cuda" code paths.
    """
    global cp, ndarray_types
    previous = cp
    cp = module
    ndarray_types = (np.ndarray,) if cp is None else (np.ndarray, cp.ndarray)
    return previous


# ----------------------------------------------------------------------------- dtypes
class DType:
    """An element type: a name, an item size and whether it is floating point."""

    __slots__ = ("name", "np", "itemsize", "is_floating_point")

    def __init__(self, name: str, np_dtype) -> None:
        self.name = name
        self.np = np.dtype(np_dtype)
        self.itemsize = self.np.itemsize
        self.is_floating_point = self.np.kind == "f"

    def __repr__(self) -> str:
        return f"tinygrad_attn.{self.name}"

    def __reduce__(self):
        return (_dtype_by_name, (self.name,))


float16 = DType("float16", np.float16)
float32 = DType("float32", np.float32)
float64 = DType("float64", np.float64)
int32 = DType("int32", np.int32)
int64 = DType("int64", np.int64)
int8 = DType("int8", np.int8)
uint8 = DType("uint8", np.uint8)
bool_ = DType("bool", np.bool_)
DTYPES = (float16, float32, float64, int8, uint8, int32, int64, bool_)
_BY_NP = {d.np: d for d in DTYPES}
_BY_NAME = {d.name: d for d in DTYPES}


def _dtype_by_name(name: str) -> DType:
    return _BY_NAME[name]


def to_dtype(x) -> DType:
    """A DType from a DType, a name ('float32'), a Python type or a NumPy/CuPy dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in _BY_NAME:
        return _BY_NAME[x]
    if x is float:
        return float32
    if x is int:
        return int64
    if x is bool:
        return bool_
    try:
        return _BY_NP[np.dtype(x)]
    except (TypeError, KeyError):
        raise TypeError(f"unsupported dtype {x!r}; use one of {[d.name for d in DTYPES]}") from None


def dtype_of(arr) -> DType:
    try:
        return _BY_NP[arr.dtype]
    except KeyError:
        raise TypeError(f"unsupported array dtype {arr.dtype}") from None


def result_type(*dtypes: DType) -> DType:
    return _BY_NP[np.result_type(*(d.np for d in dtypes))]


# ----------------------------------------------------------------------------- devices
def canonical_device(device) -> str:
    """'cpu', 'cuda' or 'cuda:N' (or an object with a .type/.index pair) -> 'cpu' / 'cuda:N'."""
    if device is None:
        return "cpu"
    name = str(device)
    if name == "cpu":
        return "cpu"
    if name == "cuda":
        return f"cuda:{_current_cuda_index()}"
    if name.startswith("cuda:") and name[5:].isdigit():
        return name
    raise ValueError(f"unknown device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")


def _current_cuda_index() -> int:
    return cp.cuda.runtime.getDevice() if cuda_is_available() else 0


def cuda_is_available() -> bool:
    if cp is None:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver, no device
        return False


def cuda_device_count() -> int:
    return cp.cuda.runtime.getDeviceCount() if cuda_is_available() else 0


def xp_for(device: str):
    """The array namespace (numpy or cupy) that holds arrays of `device`."""
    if device == "cpu":
        return np
    if not cuda_is_available():
        raise RuntimeError(
            f"device {device!r} needs CuPy and a CUDA GPU; install the 'cuda' extra "
            "(pip install 'tinygrad_attn[cuda]') on a machine with a GPU"
        )
    return cp


class _CudaScope:
    """Makes device N current while arrays of "cuda:N" are allocated."""

    def __init__(self, device: str):
        self.device = device
        self._ctx = None

    def __enter__(self):
        if self.device != "cpu":
            self._ctx = cp.cuda.Device(int(self.device.split(":")[1]))
            self._ctx.__enter__()

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)


def on_device(device: str) -> _CudaScope:
    return _CudaScope(device)


def synchronize(device: str | None = None) -> None:
    """Wait until the GPU (device "cuda:N", or the current one) has finished queued work."""
    if not cuda_is_available():
        return
    index = _current_cuda_index() if device is None else int(canonical_device(device)[5:])
    cp.cuda.Device(index).synchronize()


def device_of(arr) -> str:
    if type(arr) is np.ndarray or isinstance(arr, np.ndarray):
        return "cpu"
    if cp is not None and isinstance(arr, cp.ndarray):
        return f"cuda:{arr.device.id}"
    raise TypeError(f"not an array: {type(arr).__name__}")


def is_array(x) -> bool:
    return isinstance(x, ndarray_types)


# ----------------------------------------------------------------------------- layout
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
        flat = cp.lib.stride_tricks.as_strided(arr, (extent,), (itemsize,))
    return flat, strides, 0


def strided(flat, shape, strides, offset):
    """The array with the given shape/strides/offset (in elements) over a flat buffer."""
    itemsize = flat.itemsize
    byte_strides = tuple(s * itemsize for s in strides)
    if isinstance(flat, np.ndarray):
        return np.ndarray(shape, flat.dtype, flat, offset * itemsize, byte_strides)
    return cp.ndarray(shape, flat.dtype, flat.data + offset * itemsize, byte_strides)


def ascontiguous(arr):
    """A C-contiguous copy (or the array itself if it already is)."""
    xp = np if isinstance(arr, np.ndarray) else cp
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
    return cp.asnumpy(arr)


def to_device(arr, device: str):
    """`arr` moved to `device` (a new allocation there)."""
    if device == "cpu":
        return to_host(arr)
    with on_device(device):
        return cp.asarray(arr)


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
        host = np.array(data, dtype=np_dtype)
        if dtype is None and not keep_dtype:
            if host.dtype.kind == "f":
                host = host.astype(np.float32)
            elif host.dtype.kind in "iu" and host.dtype != np.uint8:
                host = host.astype(np.int64)
        arr = to_device(host, device) if device != "cpu" else host
    if arr.dtype not in _BY_NP:
        raise TypeError(f"tensor(): unsupported dtype {arr.dtype}")
    return arr


def ensure_array(x):
    """A 0-d array for a NumPy scalar (reductions and ufuncs on 0-d arrays return those)."""
    return np.asarray(x)


# ----------------------------------------------------------------------------- kernels
def scatter_add(target, index, values) -> None:
    """target[index] += values, with repeated indices summed (unbuffered)."""
    if isinstance(target, np.ndarray):
        np.add.at(target, index, values)
    else:
        import cupyx

        cupyx.scatter_add(target, index, values)


def index_add(target, dim: int, index, values) -> None:
    """target[(:,)*dim + (index,)] += values, summing rows with repeated indices.

    The backward of an embedding lookup. NumPy's add.at handles repeats but runs an
    element at a time (about 6x slower here on embedding-sized rows); sorting the
    indices and summing each run of equal ones with add.reduceat is exact and fast.
    """
    if not isinstance(target, np.ndarray):
        import cupyx

        cupyx.scatter_add(target, (slice(None),) * dim + (index,), values)
        return
    if index.size == 0:
        return
    rows = np.moveaxis(target, dim, 0)
    vals = np.moveaxis(values, dim, 0)
    order = np.argsort(index, kind="stable")
    sorted_idx = index[order]
    starts = np.flatnonzero(np.r_[True, sorted_idx[1:] != sorted_idx[:-1]])
    rows[sorted_idx[starts]] += np.add.reduceat(vals[order], starts, axis=0)


def masked_fill(x, mask, value):
    """A C-ordered copy of x with `value` (a scalar or 0-d array) where the broadcast
    `mask` is True: one copy plus a masked store (about 40% faster than where(), which
    reads three operands, on an attention-shaped (8, 6, 256, 256) float32 array)."""
    xp = np if isinstance(x, np.ndarray) else cp
    out = xp.array(x, order="C", copy=True)
    xp.copyto(out, value, casting="unsafe", where=mask)
    return out


_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_erf64 = np.frompyfunc(math.erf, 1, 1)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _erfc_tail(abs_z):
    """1 - erf(|z|) by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7, below float32's
    epsilon), computed in place: `abs_z` is consumed; two more buffers of its size."""
    a1, a2, a3, a4, a5 = _AS_A
    t = abs_z * _AS_P
    t += 1
    np.reciprocal(t, out=t)
    y = t * a5
    for a in (a4, a3, a2, a1):
        y += a
        y *= t
    np.square(abs_z, out=abs_z)
    np.negative(abs_z, out=abs_z)
    np.exp(abs_z, out=abs_z)
    y *= abs_z
    return y, t


def _exact(x) -> bool:
    """float64 on NumPy goes through the C library's erf, exact to rounding (for checks)."""
    return x.dtype == np.float64 or not isinstance(x, np.ndarray)


def erf(x):
    """The error function, elementwise.

    float64 on NumPy uses the C library's erf (exact to rounding; slow, meant for checks);
    float32/16 on NumPy uses Abramowitz & Stegun 7.1.26 in place; CuPy its own kernel.
    """
    if not isinstance(x, np.ndarray):
        import cupyx.scipy.special

        return cupyx.scipy.special.erf(x)
    if x.dtype == np.float64:
        return _erf64(x).astype(np.float64)
    y, _ = _erfc_tail(np.abs(x))
    np.subtract(1, y, out=y)
    return np.copysign(y, x, out=y)


def gelu_cdf(x):
    """Phi(x) = (1 + erf(x / sqrt 2)) / 2, in as few passes and buffers as NumPy allows.

    Returns (cdf, spare) where `spare` is a free buffer of x's shape (or None)."""
    if _exact(x):
        return 0.5 * (1 + erf(x * _INV_SQRT2)), None
    z = np.abs(x)
    z *= _INV_SQRT2
    h, spare = _erfc_tail(z)  # 1 - erf(|x| / sqrt 2)
    h *= -0.5
    h += 0.5  # erf(|x| / sqrt 2) / 2
    np.copysign(h, x, out=h)
    h += 0.5  # Phi(x) = 1/2 + sign(x) erf(|x| / sqrt 2) / 2
    return h, spare


# Elementwise chains over activation-sized arrays (a (8, 256, 1536) gelu input is 12 MiB)
# run block by block: each of a chain's ~25 NumPy passes then reads and writes a block that
# is still in cache, instead of streaming the whole array from memory 25 times, and the
# scratch buffers are block-sized rather than array-sized.
_BLOCK = 65536


def _gelu_block(x, out, s1, s2, g=None):
    """out = gelu(x) (g None) or g * gelu'(x) on one block; s1, s2 scratch of its size.

    One exp serves both terms: erfc(|x| / sqrt 2) by Abramowitz & Stegun 7.1.26 is a
    polynomial times exp(-x^2 / 2), and phi(x) is exp(-x^2 / 2) / sqrt(2 pi)."""
    a1, a2, a3, a4, a5 = _AS_A
    np.abs(x, out=s1)
    s1 *= _INV_SQRT2  # z = |x| / sqrt 2
    np.multiply(s1, _AS_P, out=s2)
    s2 += 1
    np.reciprocal(s2, out=s2)  # t = 1 / (1 + p z)
    np.multiply(s2, a5, out=out)
    for a in (a4, a3, a2, a1):
        out += a
        out *= s2
    np.square(s1, out=s1)
    np.negative(s1, out=s1)
    np.exp(s1, out=s1)  # exp(-z^2) = exp(-x^2 / 2)
    out *= s1  # erfc(z)
    out *= -0.5
    out += 0.5
    np.copysign(out, x, out=out)
    out += 0.5  # Phi(x) = 1/2 + sign(x) erf(z) / 2
    if g is None:
        out *= x
        return
    s1 *= x
    s1 *= _INV_SQRT_2PI  # x phi(x)
    out += s1
    out *= g


def _blocks(n: int):
    """(lo, hi) of each block of a flat range of n elements."""
    for lo in range(0, n, _BLOCK):
        yield lo, min(lo + _BLOCK, n)


def _dense_alike(*arrays) -> bool:
    """NumPy arrays, all C-contiguous, all of the first one's shape and dtype."""
    x = arrays[0]
    return all(isinstance(a, np.ndarray) and a.dtype == x.dtype and a.shape == x.shape
               and a.flags.c_contiguous for a in arrays)


def _blockable(*arrays) -> bool:
    """What the blocked float kernels take (float64 keeps the exact, whole-array path)."""
    return _dense_alike(*arrays) and arrays[0].dtype in (np.float32, np.float16)


def _blockwise(kernel, x, g=None):
    """kernel(x, out, s1, s2, g) over C-contiguous x (and g) block by block."""
    out = np.empty_like(x)
    xf, of = x.reshape(-1), out.reshape(-1)
    gf = None if g is None else g.reshape(-1)
    s1 = np.empty(min(xf.size, _BLOCK), x.dtype)
    s2 = np.empty_like(s1)
    for lo, hi in _blocks(xf.size):
        m = hi - lo
        kernel(xf[lo:hi], of[lo:hi], s1[:m], s2[:m], None if gf is None else gf[lo:hi])
    return out


def gelu_forward(x):
    """x * Phi(x)."""
    if _blockable(x):
        return _blockwise(_gelu_block, x)
    cdf, _ = gelu_cdf(x)
    cdf *= x
    return cdf


def gelu_backward(x, g):
    """g * (Phi(x) + x * phi(x)), phi the standard normal density."""
    if _blockable(x, g):
        return _blockwise(_gelu_block, x, g)
    cdf, spare = gelu_cdf(x)
    xp = np if isinstance(x, np.ndarray) else cp
    if spare is None:
        return g * (cdf + x * (_INV_SQRT_2PI * xp.exp(-0.5 * x * x)))
    np.square(x, out=spare)
    spare *= -0.5
    np.exp(spare, out=spare)
    spare *= _INV_SQRT_2PI
    spare *= x
    cdf += spare
    cdf *= g
    return cdf


def adamw_update(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step) -> None:
    """One AdamW step on arrays, in place (p, m, v), as torch.optim.AdamW computes it:

        p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    On NumPy with C-contiguous operands of one dtype it runs block by block with one
    block-sized scratch buffer (no parameter-sized temporary); otherwise over the whole
    arrays with one parameter-sized scratch array."""
    step_size = lr / (1 - beta1**step)
    inv_bc2 = 1.0 / math.sqrt(1 - beta2**step)
    decay = 1 - lr * weight_decay

    def update(xp, p, g, m, v, s):
        if decay != 1:
            p *= decay
        m *= beta1
        xp.multiply(g, 1 - beta1, out=s)
        m += s
        v *= beta2
        xp.multiply(g, g, out=s)
        s *= 1 - beta2
        v += s
        xp.sqrt(v, out=s)
        s *= inv_bc2
        s += eps
        xp.divide(m, s, out=s)
        s *= -step_size
        p += s

    if not _dense_alike(p, g, m, v):  # CuPy, or strided operands: whole arrays
        xp = np if isinstance(p, np.ndarray) else cp
        update(xp, p, g, m, v, xp.empty(p.shape, p.dtype))
        return
    pf, gf, mf, vf = (a.reshape(-1) for a in (p, g, m, v))
    s = np.empty(min(pf.size, _BLOCK), p.dtype)
    for lo, hi in _blocks(pf.size):
        update(np, pf[lo:hi], gf[lo:hi], mf[lo:hi], vf[lo:hi], s[:hi - lo])


# ----------------------------------------------------------------------------- RNG
class Generator:
    """One seeded random stream per device, like torch.manual_seed."""

    def __init__(self, seed: int = 0):
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> None:
        self.seed = int(seed)
        self._cpu = np.random.default_rng(self.seed)
        self._cuda = {}  # device -> number of draws made on it so far

    def _rng(self, device: str):
        """The generator for one draw on `device` (call inside on_device(device)).

        CuPy's generators keep their state in GPU memory with no way to read or restore it
        (`bit_generator.state` is a method returning a device pointer), so a CUDA stream is
        a counter instead: draw n is made by a generator seeded with (seed, n). Its state is
        that count, which get_state/set_state (and so checkpoint's replay) can save exactly.
        """
        if device == "cpu":
            return self._cpu
        n = self._cuda.get(device, 0)
        self._cuda[device] = n + 1
        return cp.random.default_rng([self.seed, n])

    def normal(self, shape, dtype: DType, device: str):
        rng = self._rng(device)
        if dtype.np in (np.float32, np.float64):
            return rng.standard_normal(shape, dtype=dtype.np)
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype.np)

    def uniform(self, shape, dtype: DType, device: str):
        rng = self._rng(device)
        if dtype.np in (np.float32, np.float64):
            return rng.random(shape, dtype=dtype.np)
        return rng.random(shape, dtype=np.float32).astype(dtype.np)

    def integers(self, low, high, shape, dtype: DType, device: str):
        return self._rng(device).integers(low, high, size=shape).astype(dtype.np)

    def get_state(self):
        """The generator's state (every device's stream), for set_state."""
        import copy

        return {"seed": self.seed, "cpu": copy.deepcopy(self._cpu.bit_generator.state),
                "cuda": dict(self._cuda)}

    def set_state(self, state) -> None:
        import copy

        self.seed = int(state.get("seed", self.seed))
        self._cpu.bit_generator.state = copy.deepcopy(state["cpu"])
        self._cuda = {d: int(n) for d, n in state.get("cuda", {}).items()}


# ----------------------------------------------------------------------------- DLPack
def from_dlpack(obj):
    """An array (NumPy for host memory, CuPy for device memory) sharing `obj`'s memory."""
    dev = obj.__dlpack_device__()[0] if hasattr(obj, "__dlpack_device__") else 1
    if dev == 1:  # kDLCPU
        return np.from_dlpack(obj)
    if cp is None:
        raise RuntimeError("from_dlpack: the object lives on a GPU and CuPy is not installed")
    return cp.from_dlpack(obj)


# ----------------------------------------------------------------------------- host allocator
# A training step frees and re-allocates the same large buffers every step. glibc's malloc
# serves blocks above its mmap threshold with fresh mmap()s and unmaps them on free, and
# trims the top of the heap, so each step page-faults its activations in again (measured
# here: about 22,000 minor faults and 0.3-0.6 s of system time per shakespeare-char step at
# batch 8). keep_freed_host_memory() makes malloc keep freed memory in the process (no
# mmap for big blocks, no trimming): its size-binned free lists then act as a buffer
# cache, and a step reuses the pages of the one before. This is process-wide, like CuPy's
# memory pool is per device; reserved_bytes() reports what the process holds.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_GLIBC_DEFAULTS = {_M_TRIM_THRESHOLD: 128 * 1024, _M_MMAP_MAX: 65536}
_host = {"libc": None, "keep": False}


def _libc():
    if _host["libc"] is None:
        import ctypes
        import ctypes.util
        import platform

        lib = False
        if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                lib.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
                lib.malloc_trim.argtypes = (ctypes.c_size_t,)
                if hasattr(lib, "mallinfo2"):

                    class Mallinfo2(ctypes.Structure):
                        _fields_ = [(name, ctypes.c_size_t) for name in (
                            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                            "fsmblks", "uordblks", "fordblks", "keepcost")]

                    lib.mallinfo2.restype = Mallinfo2
            except (OSError, AttributeError):
                lib = False
        _host["libc"] = lib
    return _host["libc"]


def keep_freed_host_memory(keep: bool = True) -> bool:
    """Keep (True) or return (False) freed host memory; False where malloc is not glibc's.

    Turning it off gives the cached memory back to the system (malloc_trim) and restores
    glibc's default thresholds, but not their dynamic adjustment, which any mallopt call
    switches off for the process: glibc's untouched behaviour needs
    TINYGRAD_ATTN_KEEP_HOST_MEMORY=0 in the environment before the engine is imported."""
    lib = _libc()
    if not lib:
        return False
    if keep:
        ok = lib.mallopt(_M_MMAP_MAX, 0) == 1 and lib.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    else:
        ok = all(lib.mallopt(k, v) == 1 for k, v in _GLIBC_DEFAULTS.items())
        lib.malloc_trim(0)
    _host["keep"] = bool(keep and ok)
    return ok


def keeps_freed_host_memory() -> bool:
    return _host["keep"]


def release_host_memory() -> None:
    """Give free cached host memory back to the system now (malloc_trim)."""
    lib = _libc()
    if lib:
        lib.malloc_trim(0)


def pool_tracker(device: str):
    """A CuPy memory hook (use it as a context manager) that counts the bytes CuPy's pool
    hands out on `device` and takes back, every array included (temporaries inside ops
    too): `.live` (net since entering, can go negative when older arrays die) and `.peak`."""
    index = int(canonical_device(device)[5:])

    class _PoolTracker(cp.cuda.MemoryHook):
        name = "tinygrad_attn.memory"

        def __init__(self):
            self.live = 0
            self.peak = 0

        def malloc_postprocess(self, **kw):
            if kw.get("device_id", index) == index:
                self.live += kw["mem_size"]
                if self.live > self.peak:
                    self.peak = self.live

        def free_postprocess(self, **kw):
            if kw.get("device_id", index) == index:
                self.live -= kw["mem_size"]

    return _PoolTracker()


def reserved_bytes(device: str = "cpu"):
    """Bytes the allocator holds from the system for `device` (live + cached), or None.

    cpu: the whole process's malloc heap (glibc's mallinfo2: arena + mmapped), so it also
    counts Python objects and other libraries' memory. cuda:N: CuPy's default memory pool."""
    if device != "cpu":
        if cp is None:
            return None
        with on_device(device):
            return int(cp.get_default_memory_pool().total_bytes())
    lib = _libc()
    if not lib or not hasattr(lib, "mallinfo2"):  # glibc before 2.33
        return None
    info = lib.mallinfo2()
    return int(info.arena + info.hblkhd)


# on by default (TINYGRAD_ATTN_KEEP_HOST_MEMORY=0 leaves malloc as it was)
if os.environ.get("TINYGRAD_ATTN_KEEP_HOST_MEMORY", "1") != "0":
    keep_freed_host_memory(True)
