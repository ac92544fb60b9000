"""The compiled kernels: numba, the only module in the project that imports it.

Each public function here has the name and signature of a kernel in `reference.py` and must
agree with it: to float32 tolerance where the arithmetic differs (a polynomial exp instead
of the C library's), bit for bit where it is the same. A function may return NotImplemented
for operands it does not take (the reference then runs); `kernels/__init__.py` has already
checked that the float operands are NumPy float32/float64 arrays of one dtype, C-contiguous.

How the kernels are written, and why (docs/kernels.md has the measurements):

- One pass each way: a kernel reads its inputs once and writes its outputs once, with no
  array-sized temporaries beyond the outputs the op returns. Rows (softmax, norms, loss) are
  spread over the threads with `prange`; elementwise kernels over blocks of elements.
- float32 math written out, not called: `math.exp` and `math.erf` compile to calls into the
  C library, one element at a time, which LLVM cannot vectorize (PyPI's llvmlite has no
  vector math library). `exp32` below is a short polynomial LLVM turns into SIMD code.
  float64 kernels use `math.exp`/`math.erf` (exact to rounding; float64 is for checks).
- `cache=True`: each kernel compiles once per dtype on first use (a fraction of a second)
  and loads from numba's on-disk cache after that (milliseconds).
- The threading layer is "workqueue" (unless NUMBA_THREADING_LAYER says otherwise), chosen
  before any kernel runs: numba's own pool, no OpenMP runtime to fight OpenBLAS's, and safe
  across `fork`. It aborts the process when two threads launch parallel kernels at once,
  GIL or no GIL, so `kernels/__init__.py` calls the kernels here under one lock.
"""

from __future__ import annotations

import math
import os

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types  # noqa: F401 - prange: the kernels below
from numba.extending import intrinsic, overload

if not os.environ.get("NUMBA_THREADING_LAYER"):  # the user's choice, where made, wins
    numba.config.THREADING_LAYER = "workqueue"

JIT = {"cache": True}  # serial kernels
PAR = {"cache": True, "parallel": True}  # kernels spread over the threads

F32 = np.float32


def set_num_threads(n: int) -> int:
    """Use n threads (at most the pool's size, NUMBA_NUM_THREADS); returns the count set."""
    n = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(n)
    return n


# ----------------------------------------------------------------------------- math
@intrinsic
def _int32_bits_as_float32(typingctx, i):
    """The float32 whose bit pattern is the int32 i (a register move, no memory)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@njit(inline="always")
def exp32(x):
    """exp of a float32, to within 1 ulp or so of the C library's, in a form LLVM vectorizes.

    exp(x) = 2^k * exp(r) with k = round(x / ln 2), r = x - k ln 2 (ln 2 split in two so r is
    exact), exp(r) by Cephes' degree-6 polynomial on |r| <= ln 2 / 2, and 2^k built in the
    exponent bits. Below -87.3 the result is 0 (float32's denormals are not produced), above
    88.7 it is inf, and nan stays nan."""
    xc = min(max(x, F32(-87.0)), F32(88.0))
    k = np.floor(xc * F32(1.4426950408889634) + F32(0.5))
    r = xc - k * F32(0.693359375) + k * F32(2.12194440e-4)
    p = F32(1.9875691500e-4)
    p = p * r + F32(1.3981999507e-3)
    p = p * r + F32(8.3334519073e-3)
    p = p * r + F32(4.1665795894e-2)
    p = p * r + F32(1.6666665459e-1)
    p = p * r + F32(5.0000001201e-1)
    p = p * r * r + r + F32(1.0)
    y = p * _int32_bits_as_float32((np.int32(k) + np.int32(127)) << np.int32(23))
    if x < F32(-87.3):
        y = F32(0.0)
    if x > F32(88.7):
        y = F32(np.inf)
    if x != x:
        y = x
    return y


def vexp(x):
    """exp in the argument's precision: exp32 for float32, the C library's for float64."""
    raise NotImplementedError  # only called from compiled code, through the overload below


@overload(vexp, inline="always")
def _vexp(x):
    if x == types.float32:
        return lambda x: exp32(x)
    return lambda x: math.exp(x)


# ----------------------------------------------------------------------------- activations
# Elementwise kernels run over blocks of _ACT_BLOCK elements, one block per prange step; the
# inner loop over a block is what LLVM vectorizes. The exact gelu's arithmetic is the
# reference's, operation for operation (reference.py's _gelu_block for float32, its
# whole-array formulas for float64), so the two differ only where exp32 differs from
# NumPy's exp and where a multiply and an add became one fma. The float32 tanh
# approximation takes 1 +- tanh from one exp (see _tanh_halves32); float64 is the
# reference's formula with the C library's tanh. Dropout is the reference's arithmetic,
# bit for bit (no fma there).
_ACT_BLOCK = 16384
# error_model "numpy": a float division by zero gives inf or nan as in NumPy, with no check;
# numba's default ("python") tests every divisor to raise ZeroDivisionError, and that branch
# keeps LLVM from vectorizing any loop with a division in it.
_ACT_PAR = {**PAR, "error_model": "numpy"}
# The loop over a block is a serial kernel of its own, which the parallel one calls per
# block: LLVM vectorizes that plain loop better than the same loop inside the prange body
# (measured: about 1.3x). In the gelu loops, whose results are not claimed bit-equal to
# the reference's, LLVM may fuse a multiply and an add into one fma (one rounding, not two).
_ACT_SERIAL = {**JIT, "error_model": "numpy"}
_ACT_SERIAL_FMA = {**_ACT_SERIAL, "fastmath": {"contract"}}
_ACT_PARTS = 64  # row chunks of bias_gelu's backward, each with its own partial bias gradient
# the reference's constants, computed as it computes them (so float64 agrees to the bit)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_TANH_K, _TANH_3K = 0.044715, 3 * 0.044715


@njit(inline="always")
def _gelu_cdf32(x):
    """(Phi(x), exp(-x^2 / 2)) of a float32, Phi by Abramowitz & Stegun 7.1.26 in the
    reference's order of operations: one exp serves Phi and the density."""
    z = abs(x) * F32(_INV_SQRT2)
    t = F32(1.0) / (z * F32(0.3275911) + F32(1.0))
    y = t * F32(1.061405429)
    y = (y + F32(-1.453152027)) * t
    y = (y + F32(1.421413741)) * t
    y = (y + F32(-0.284496736)) * t
    y = (y + F32(0.254829592)) * t
    e = exp32(-(z * z))
    y = (y * e) * F32(-0.5) + F32(0.5)  # erf(|x| / sqrt 2) / 2
    return math.copysign(y, x) + F32(0.5), e


@njit(inline="always")
def _tanh_halves32(x):
    """(1 + tanh(u), 1 - tanh(u)) for gelu's tanh argument u of a float32 x, from one
    e = exp(-2|u|) <= 1: 2 / (1 + e) and 2e / (1 + e), the large one and the small one by
    the sign of u. Neither is a difference, so the small one keeps its relative accuracy
    (1 - tanh^2 by subtraction loses it as tanh nears +-1), and e never overflows."""
    u = F32(_SQRT_2_OVER_PI) * (x + F32(_TANH_K) * x * x * x)
    e = exp32(F32(-2.0) * abs(u))
    d = F32(1.0) + e
    big, small = F32(2.0) / d, (F32(2.0) * e) / d
    if u >= F32(0.0):
        return big, small
    return small, big


def _gelu(x):
    """gelu(x) (exact) in x's precision."""
    raise NotImplementedError  # only called from compiled code, through the overload below


@overload(_gelu, inline="always")
def _ov_gelu(x):
    if x == types.float32:
        def gelu32(x):
            cdf, _ = _gelu_cdf32(x)
            return cdf * x
        return gelu32
    return lambda x: 0.5 * (1.0 + math.erf(x * _INV_SQRT2)) * x


def _gelu_grad(x, g):
    """g * gelu'(x) (exact) in x's precision."""
    raise NotImplementedError


@overload(_gelu_grad, inline="always")
def _ov_gelu_grad(x, g):
    if x == types.float32:
        def grad32(x, g):
            cdf, e = _gelu_cdf32(x)
            return (cdf + e * x * F32(_INV_SQRT_2PI)) * g
        return grad32

    def grad64(x, g):
        cdf = 0.5 * (1.0 + math.erf(x * _INV_SQRT2))
        return g * (cdf + x * (_INV_SQRT_2PI * math.exp(-0.5 * x * x)))
    return grad64


def _gelu_tanh(x):
    """gelu(x) by the tanh approximation, in x's precision."""
    raise NotImplementedError


@overload(_gelu_tanh, inline="always")
def _ov_gelu_tanh(x):
    if x == types.float32:
        def tanh32(x):
            plus, _ = _tanh_halves32(x)
            return F32(0.5) * x * plus
        return tanh32

    def tanh64(x):
        u = _SQRT_2_OVER_PI * (x + _TANH_K * x * x * x)
        return 0.5 * x * (1.0 + math.tanh(u))
    return tanh64


def _gelu_tanh_grad(x, g):
    """g * gelu'(x) by the tanh approximation, in x's precision."""
    raise NotImplementedError


@overload(_gelu_tanh_grad, inline="always")
def _ov_gelu_tanh_grad(x, g):
    if x == types.float32:
        def grad32(x, g):
            plus, minus = _tanh_halves32(x)
            d_inner = F32(_SQRT_2_OVER_PI) * (F32(1.0) + F32(_TANH_3K) * x * x)
            return g * (F32(0.5) * plus + F32(0.5) * x * (minus * plus) * d_inner)
        return grad32

    def grad64(x, g):
        t = math.tanh(_SQRT_2_OVER_PI * (x + _TANH_K * x * x * x))
        d_inner = _SQRT_2_OVER_PI * (1.0 + _TANH_3K * x * x)
        return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner)
    return grad64


@njit(**_ACT_SERIAL_FMA)
def _gelu_run(x, out, tanh):
    if tanh:
        for i in range(x.size):
            out[i] = _gelu_tanh(x[i])
    else:
        for i in range(x.size):
            out[i] = _gelu(x[i])


@njit(**_ACT_SERIAL_FMA)
def _gelu_grad_run(x, g, out, tanh):
    if tanh:
        for i in range(x.size):
            out[i] = _gelu_tanh_grad(x[i], g[i])
    else:
        for i in range(x.size):
            out[i] = _gelu_grad(x[i], g[i])


@njit(**_ACT_PAR)
def _gelu_map(x, out, tanh):
    n = x.size
    for blk in prange((n + _ACT_BLOCK - 1) // _ACT_BLOCK):
        lo, hi = blk * _ACT_BLOCK, min(n, (blk + 1) * _ACT_BLOCK)
        _gelu_run(x[lo:hi], out[lo:hi], tanh)


@njit(**_ACT_PAR)
def _gelu_grad_map(x, g, out, tanh):
    n = x.size
    for blk in prange((n + _ACT_BLOCK - 1) // _ACT_BLOCK):
        lo, hi = blk * _ACT_BLOCK, min(n, (blk + 1) * _ACT_BLOCK)
        _gelu_grad_run(x[lo:hi], g[lo:hi], out[lo:hi], tanh)


def _act_same_shape(*arrays) -> bool:
    return all(a.shape == arrays[0].shape for a in arrays)


def _gelu_forward(x, tanh):
    out = np.empty_like(x)
    _gelu_map(x.reshape(-1), out.reshape(-1), tanh)
    return out


def _gelu_backward(x, g, tanh):
    if not _act_same_shape(x, g):
        return NotImplemented
    out = np.empty_like(x)
    _gelu_grad_map(x.reshape(-1), g.reshape(-1), out.reshape(-1), tanh)
    return out


def gelu_forward(x):
    return _gelu_forward(x, False)


def gelu_backward(x, g):
    return _gelu_backward(x, g, False)


def gelu_tanh_forward(x):
    return _gelu_forward(x, True)


def gelu_tanh_backward(x, g):
    return _gelu_backward(x, g, True)


@njit(**_ACT_SERIAL_FMA)
def _bias_gelu_run(x, b, out, tanh):
    if tanh:
        for j in range(x.size):
            out[j] = _gelu_tanh(x[j] + b[j])
    else:
        for j in range(x.size):
            out[j] = _gelu(x[j] + b[j])


@njit(**_ACT_SERIAL_FMA)
def _bias_gelu_grad_run(x, b, g, gx, acc, tanh):
    if tanh:
        for j in range(x.size):
            v = _gelu_tanh_grad(x[j] + b[j], g[j])
            gx[j] = v
            acc[j] += v
    else:
        for j in range(x.size):
            v = _gelu_grad(x[j] + b[j], g[j])
            gx[j] = v
            acc[j] += v


@njit(**_ACT_PAR)
def _bias_gelu_rows(x, b, out, tanh):
    for r in prange(x.shape[0]):
        _bias_gelu_run(x[r], b, out[r], tanh)


@njit(**_ACT_PAR)
def _bias_gelu_grad_rows(x, b, g, gx, partial, tanh):
    """gx = g * gelu'(x + b); partial[c] = the sum of gx over chunk c's rows."""
    rows, parts = x.shape[0], partial.shape[0]
    for c in prange(parts):
        for r in range(c * rows // parts, (c + 1) * rows // parts):
            _bias_gelu_grad_run(x[r], b, g[r], gx[r], partial[c], tanh)


def bias_gelu_forward(x, bias, approximate="none"):
    if x.ndim == 0 or bias.shape != x.shape[-1:]:
        return NotImplemented
    out = np.empty_like(x)
    if x.size:
        cols = x.shape[-1]
        _bias_gelu_rows(x.reshape(-1, cols), bias, out.reshape(-1, cols), approximate == "tanh")
    return out


def bias_gelu_backward(x, bias, g, approximate="none"):
    if x.ndim == 0 or bias.shape != x.shape[-1:] or not _act_same_shape(x, g):
        return NotImplemented
    gx = np.empty_like(x)
    if x.size == 0:
        return gx, np.zeros_like(bias)
    cols = x.shape[-1]
    rows = x.size // cols
    # A fixed number of chunks, not one per thread: the sum's order, and so its rounding,
    # is the same whatever the thread count. Each chunk sums its rows in x's dtype (a
    # float64 accumulator in the float32 loop halves its vector width: +40% time), and the
    # chunks' sums are added in float64.
    partial = np.zeros((min(rows, _ACT_PARTS), cols), x.dtype)
    _bias_gelu_grad_rows(x.reshape(rows, cols), bias, g.reshape(rows, cols),
                         gx.reshape(rows, cols), partial, approximate == "tanh")
    return gx, partial.sum(axis=0, dtype=np.float64).astype(x.dtype)


@njit(**_ACT_SERIAL)
def _dropout_run(x, u, p, scale, one, zero, y, keep):
    for i in range(x.size):
        k = u[i] >= p
        keep[i] = k
        y[i] = (x[i] * (one if k else zero)) * scale


@njit(**_ACT_SERIAL)
def _dropout_grad_run(g, keep, scale, one, zero, out):
    for i in range(g.size):
        out[i] = (g[i] * (one if keep[i] else zero)) * scale


@njit(**_ACT_PAR)
def _dropout_map(x, u, p, scale, one, zero, y, keep):
    n = x.size
    for blk in prange((n + _ACT_BLOCK - 1) // _ACT_BLOCK):
        lo, hi = blk * _ACT_BLOCK, min(n, (blk + 1) * _ACT_BLOCK)
        _dropout_run(x[lo:hi], u[lo:hi], p, scale, one, zero, y[lo:hi], keep[lo:hi])


@njit(**_ACT_PAR)
def _dropout_grad_map(g, keep, scale, one, zero, out):
    n = g.size
    for blk in prange((n + _ACT_BLOCK - 1) // _ACT_BLOCK):
        lo, hi = blk * _ACT_BLOCK, min(n, (blk + 1) * _ACT_BLOCK)
        _dropout_grad_run(g[lo:hi], keep[lo:hi], scale, one, zero, out[lo:hi])


def dropout_forward(x, u, p):
    if (type(u) is not np.ndarray or u.dtype != np.float32 or not u.flags.c_contiguous
            or u.shape != x.shape):
        return NotImplemented
    y, keep = np.empty_like(x), np.empty(x.shape, np.bool_)
    # the reference compares u >= p with p a Python float, which NumPy rounds to float32
    t = x.dtype.type
    _dropout_map(x.reshape(-1), u.reshape(-1), F32(p), t(1.0 / (1.0 - p)), t(1), t(0),
                 y.reshape(-1), keep.reshape(-1))
    return y, keep


def dropout_backward(g, keep, scale):
    if (type(keep) is not np.ndarray or keep.dtype != np.bool_ or not keep.flags.c_contiguous
            or keep.shape != g.shape):
        return NotImplemented
    out = np.empty_like(g)
    t = g.dtype.type
    _dropout_grad_map(g.reshape(-1), keep.reshape(-1), t(scale), t(1), t(0), out.reshape(-1))
    return out


# ----------------------------------------------------------------------------- softmax
# One pass per row each way: the row is read from memory once and its output written once;
# the inner loops between run over the output row while it is still in L1. The sums are
# separate functions compiled with "reassoc" only, which lets LLVM split a sum into SIMD
# lanes (a different, fixed order of additions; NumPy's pairwise sum differs too); the
# exp polynomial, compiled without it, keeps its exact order of operations.
_SUMS = {"cache": True, "fastmath": {"reassoc"}}


@njit(**_SUMS)
def _row_sum(a, n):
    s = a[0]  # not a zero of a's type made as a[0] * 0: that is nan for an infinite a[0]
    for j in range(1, n):
        s += a[j]
    return s


@njit(**_SUMS)
def _row_dot(a, b):
    s = a[0] * b[0]
    for j in range(1, a.shape[0]):
        s += a[j] * b[j]
    return s


@njit(inline="always")
def _row_max(a):
    m = a[0]
    for j in range(1, a.shape[0]):
        m = max(m, a[j])
    return m


@njit(inline="always")  # inlined once per kernel: numba's SSA check trips on two copies
def _normalize(z, y, n):
    """y = exp(z - max) / sum(exp(z - max)) over a row's first n entries, n >= 1 (z may be
    y itself). Bounds, not slices: a slice's copy loop does not vectorize."""
    m = z[0]
    for j in range(1, n):
        m = max(m, z[j])
    for j in range(n):
        y[j] = vexp(z[j] - m)
    s = _row_sum(y, n)
    for j in range(n):
        y[j] = y[j] / s


@njit(**PAR)
def _softmax_rows(x, y):
    for r in prange(x.shape[0]):
        _normalize(x[r], y[r], x.shape[1])


@njit(**PAR)
def _softmax_backward_rows(y, g, gx, scale, zero_nan_rows):
    for r in prange(y.shape[0]):
        yr, gr, out = y[r], g[r], gx[r]
        if zero_nan_rows and yr[0] != yr[0]:
            for j in range(yr.shape[0]):
                out[j] = 0
            continue
        dot = _row_dot(gr, yr)
        for j in range(yr.shape[0]):
            out[j] = (gr[j] - dot) * yr[j] * scale


@njit(**PAR)
def _log_softmax_rows(x, y):
    for r in prange(x.shape[0]):
        xr, yr = x[r], y[r]
        m = _row_max(xr)
        for j in range(xr.shape[0]):
            yr[j] = vexp(xr[j] - m)
        log_sum = math.log(_row_sum(yr, yr.shape[0]))
        for j in range(xr.shape[0]):
            yr[j] = (xr[j] - m) - log_sum


@njit(**PAR)
def _log_softmax_backward_rows(y, g, gx):
    for r in prange(y.shape[0]):
        yr, gr, out = y[r], g[r], gx[r]
        total = _row_sum(gr, gr.shape[0])
        for j in range(yr.shape[0]):
            out[j] = gr[j] - vexp(yr[j]) * total


def _masked(v, m):
    """The score v under mask entry m: -inf where a bool m is True, v + m for a float m."""
    raise NotImplementedError  # only called from compiled code, through the overload below


@overload(_masked, inline="always")
def _masked_impl(v, m):
    if isinstance(m, types.Boolean):
        minus_inf = F32(-np.inf) if v == types.float32 else -np.inf

        def fill(v, m):
            if m:
                return minus_inf
            return v

        return fill
    return lambda v, m: v + m


def _kept_prefix(mask_row):
    """The length of the row without its trailing masked entries (bool masks only)."""
    raise NotImplementedError  # only called from compiled code, through the overload below


@overload(_kept_prefix, inline="always")
def _kept_prefix_impl(mask_row):
    if isinstance(mask_row.dtype, types.Boolean):
        def kept(mask_row):
            k = 0
            for j in range(mask_row.shape[0]):  # a whole-row scan LLVM vectorizes, where a
                if not mask_row[j]:  # backward search stopping early runs byte by byte
                    k = j + 1
            return k

        return kept
    return lambda mask_row: mask_row.shape[0]


@njit(inline="always")
def _mask_offset(row, lead_shape, lead_strides):
    """Where row `row` of x (rows in C order over the lead shape) starts in the mask."""
    offset, rest = 0, row + 0  # a new variable: prange's index must not be written
    for d in range(lead_shape.shape[0] - 1, -1, -1):
        offset += (rest % lead_shape[d]) * lead_strides[d]
        rest //= lead_shape[d]
    return offset


@njit(**PAR)
def _masked_softmax_rows(x, mask, lead_shape, lead_strides, col_stride, scale, y):
    """mask: the mask's elements as one flat array; row r of x reads the mask's row at
    the offset its index gives through the broadcast strides (0 along broadcast dims)."""
    n = x.shape[1]
    for r in prange(x.shape[0]):
        offset = _mask_offset(r, lead_shape, lead_strides)
        xr, yr = x[r], y[r]
        if col_stride == 1:
            mr = mask[offset:offset + n]
            # a bool mask's masked tail (a causal row's future) has probability exactly 0:
            # written as such, its exp skipped (half of all exps for a causal mask)
            kept = _kept_prefix(mr)
            for j in range(kept):
                yr[j] = _masked(xr[j] * scale, mr[j])
        else:
            kept = n
            for j in range(n):
                yr[j] = _masked(xr[j] * scale, mask[offset + j * col_stride])
        if kept:
            _normalize(yr, yr, kept)
        for j in range(kept, n):  # every entry masked: nan, as exp(-inf - -inf) makes it
            yr[j] = 0 if kept else np.nan


def _as_rows(a):
    """a as (rows, last dim): a view of a C-contiguous array."""
    return a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)


def softmax_forward(x):
    y = np.empty_like(x)
    if x.size:
        _softmax_rows(_as_rows(x), _as_rows(y))
    return y


def softmax_backward(y, g):
    gx = np.empty_like(y)
    if y.size:
        _softmax_backward_rows(_as_rows(y), _as_rows(g), _as_rows(gx), y.dtype.type(1), False)
    return gx


def log_softmax_forward(x):
    y = np.empty_like(x)
    if x.size:
        _log_softmax_rows(_as_rows(x), _as_rows(y))
    return y


def log_softmax_backward(y, g):
    gx = np.empty_like(y)
    if y.size:
        _log_softmax_backward_rows(_as_rows(y), _as_rows(g), _as_rows(gx))
    return gx


def _flat_mask(mask, shape):
    """(elements, lead shape, lead strides, column stride) of `mask` broadcast to `shape`,
    strides in elements; None for a mask this kernel does not read (a negative or
    unaligned stride, not a NumPy array)."""
    if type(mask) is not np.ndarray:
        return None
    view = np.broadcast_to(mask, shape)
    size = mask.itemsize
    if any(s < 0 or s % size for s in view.strides):
        return None
    span = 1 + sum((n - 1) * s // size for n, s in zip(mask.shape, mask.strides) if n)
    flat = np.lib.stride_tricks.as_strided(mask, (span,), (size,))
    strides = np.array([s // size for s in view.strides], dtype=np.int64)
    return flat, np.array(shape[:-1], dtype=np.int64), strides[:-1], int(strides[-1])


def masked_softmax_forward(x, mask, scale):
    if mask is not None and mask.dtype != np.bool_ and mask.dtype != x.dtype:
        return NotImplemented
    y = np.empty_like(x)
    if x.size == 0:
        return y
    if mask is None:  # a row of False, read with column stride 1 (the fast loop)
        mask = np.zeros(x.shape[-1], np.bool_)
    flat = _flat_mask(mask, x.shape)
    if flat is None:
        return NotImplemented
    elements, lead_shape, lead_strides, col_stride = flat
    _masked_softmax_rows(_as_rows(x), elements, lead_shape, lead_strides, col_stride,
                         x.dtype.type(scale), _as_rows(y))
    return y


def masked_softmax_backward(y, g, scale, bool_mask):
    gx = np.empty_like(y)
    if y.size:
        _softmax_backward_rows(_as_rows(y), _as_rows(g), _as_rows(gx), y.dtype.type(scale),
                               bool(bool_mask))
    return gx

# ----------------------------------------------------------------------------- norms, loss
# "reassoc" lets LLVM split a row's sum into SIMD lanes (a sum is otherwise one chain of
# dependent additions); these kernels take no other fast-math liberty. Sums whose accuracy
# matters run in float64: a row's mean (x + 1e4 keeps its variance) and the weight
# gradients, which add up every row.
_ROW_SUMS = {"cache": True, "parallel": True, "fastmath": {"reassoc"}}
_FLUSH_ROWS = 64  # rows a weight gradient sums in the input's dtype before it moves to float64


def _in_dtype_of(a, v):
    """v in the float dtype of array a (compiled code only)."""
    raise NotImplementedError


@overload(_in_dtype_of, inline="always")
def _in_dtype_of_ov(a, v):
    if a.dtype == types.float32:
        return lambda a, v: np.float32(v)
    return lambda a, v: np.float64(v)


@njit(inline="always")
def _flush_partial(acc, part, r, lo, hi):
    """Every _FLUSH_ROWS rows of a chunk and at its end: part (float64) += acc; acc = 0."""
    if (r - lo) % _FLUSH_ROWS == _FLUSH_ROWS - 1 or r == hi - 1:
        for j in range(acc.shape[0]):
            part[j] += acc[j]
            acc[j] = 0


def _weight_partials(rows: int, k: int, n: int, dtype):
    """(chunks, acc, part) for a kernel with k weight gradients of n values: the rows split
    in one chunk per thread, each with its own running sums (acc, in the input's dtype) and
    float64 totals (part), so no chunk waits on another; the caller adds part over chunks."""
    chunks = max(1, min(rows, numba.get_num_threads()))
    return chunks, np.zeros((chunks, k, n), dtype), np.zeros((chunks, k, n))


def _row_stats(xr):
    """(mean, variance) of a row, in float64 (compiled code only)."""
    raise NotImplementedError


@overload(_row_stats, inline="always")
def _row_stats_ov(xr):
    if xr.dtype == types.float32:
        def one_sweep(xr):  # x - x[0] and its square are exact in float64: one sweep
            n, k = xr.shape[0], np.float64(xr[0])
            s = q = 0.0
            for j in range(n):
                d = xr[j] - k
                s += d
                q += d * d
            dm = s / n
            return k + dm, max(q / n - dm * dm, 0.0)
        return one_sweep

    def two_sweeps(xr):  # float64: the centred sum, exact to rounding as the reference's
        n, s, q = xr.shape[0], 0.0, 0.0
        for j in range(n):
            s += xr[j]
        mean = s / n
        for j in range(n):
            q += (xr[j] - mean) * (xr[j] - mean)
        return mean, q / n
    return two_sweeps


@njit(**_ROW_SUMS)
def _layer_norm_fwd(x, w, b, eps, y, xhat, rstd):
    rows, n = x.shape
    for r in prange(rows):
        xr = x[r]
        mean, var = _row_stats(xr)
        rs = _in_dtype_of(x, 1.0 / math.sqrt(var + eps))
        m = _in_dtype_of(x, mean)
        for j in range(n):
            h = (xr[j] - m) * rs
            xhat[r, j] = h
            if w is not None:
                h = h * w[j]
            if b is not None:
                h = h + b[j]
            y[r, j] = h
        rstd[r, 0] = rs


def layer_norm_forward(x, weight, bias, eps):
    """(y, xhat, rstd) of a (rows, n) x: one parallel pass over the rows, each row's mean
    and variance in float64 (float32: one sweep over x minus its first element), then its
    output."""
    rows, n = x.shape
    if n == 0:
        return NotImplemented
    y, xhat = np.empty_like(x), np.empty_like(x)
    rstd = np.empty((rows, 1), x.dtype)
    _layer_norm_fwd(x, weight, bias, eps, y, xhat, rstd)
    return y, xhat, rstd


@njit(**_ROW_SUMS)
def _layer_norm_bwd(g, xhat, rstd, w, gx, acc, part, nx, sums, chunks):
    rows, n = g.shape
    for c in prange(chunks):
        lo, hi = c * rows // chunks, (c + 1) * rows // chunks
        aw, ab = acc[c, 0], acc[c, 1]
        for r in range(lo, hi):
            gr, hr = g[r], xhat[r]
            s1 = _in_dtype_of(g, 0.0)
            s2 = _in_dtype_of(g, 0.0)
            if sums:
                for j in range(n):
                    aw[j] += gr[j] * hr[j]
                    ab[j] += gr[j]
                    gh = gr[j] * w[j] if w is not None else gr[j]
                    s1 += gh
                    s2 += gh * hr[j]
                _flush_partial(aw, part[c, 0], r, lo, hi)
                _flush_partial(ab, part[c, 1], r, lo, hi)
            else:
                for j in range(n):
                    gh = gr[j] * w[j] if w is not None else gr[j]
                    s1 += gh
                    s2 += gh * hr[j]
            if nx:
                m1, m2, rs = s1 / _in_dtype_of(g, n), s2 / _in_dtype_of(g, n), rstd[r, 0]
                for j in range(n):
                    gh = gr[j] * w[j] if w is not None else gr[j]
                    gx[r, j] = (gh - m1 - hr[j] * m2) * rs


def layer_norm_backward(g, xhat, rstd, weight, needs):
    """(gx, gw, gb): one parallel pass over chunks of rows; gw and gb from per-chunk partial
    sums added up at the end (no g-sized temporary)."""
    rows, n = g.shape
    nx, nw, nb = (bool(v) for v in needs)
    chunks, acc, part = _weight_partials(rows, 2, n, g.dtype)
    gx = np.empty_like(g) if nx else np.empty((0, n), g.dtype)
    _layer_norm_bwd(g, xhat, rstd, weight, gx, acc, part, nx, nw or nb, chunks)
    total = part.sum(axis=0).astype(g.dtype)
    return gx if nx else None, total[0] if nw else None, total[1] if nb else None


@njit(**_ROW_SUMS)
def _rms_norm_fwd(x, w, eps, y, rstd):
    rows, n = x.shape
    for r in prange(rows):
        xr = x[r]
        q = 0.0
        for j in range(n):
            q += np.float64(xr[j]) * xr[j]
        rs = _in_dtype_of(x, 1.0 / math.sqrt(q / n + eps))
        for j in range(n):
            v = xr[j] * rs
            if w is not None:
                v = v * w[j]
            y[r, j] = v
        rstd[r, 0] = rs


def rms_norm_forward(x, weight, eps):
    """(y, rstd) of a (rows, n) x: one parallel pass, the row read twice from cache."""
    rows, n = x.shape
    if n == 0:
        return NotImplemented
    y, rstd = np.empty_like(x), np.empty((rows, 1), x.dtype)
    _rms_norm_fwd(x, weight, eps, y, rstd)
    return y, rstd


@njit(**_ROW_SUMS)
def _rms_norm_bwd(g, x, rstd, w, gx, acc, part, nx, nw, chunks):
    rows, n = g.shape
    for c in prange(chunks):
        lo, hi = c * rows // chunks, (c + 1) * rows // chunks
        aw = acc[c, 0]
        for r in range(lo, hi):
            gr, xr, rs = g[r], x[r], rstd[r, 0]
            s = _in_dtype_of(g, 0.0)
            if nw:
                for j in range(n):
                    h = xr[j] * rs
                    aw[j] += gr[j] * h
                    s += (gr[j] * w[j] if w is not None else gr[j]) * h
                _flush_partial(aw, part[c, 0], r, lo, hi)
            else:
                for j in range(n):
                    s += (gr[j] * w[j] if w is not None else gr[j]) * (xr[j] * rs)
            if nx:
                m = s / _in_dtype_of(g, n)
                for j in range(n):
                    gh = gr[j] * w[j] if w is not None else gr[j]
                    gx[r, j] = (gh - xr[j] * rs * m) * rs


def rms_norm_backward(g, x, rstd, weight, needs):
    """(gx, gw): one parallel pass over chunks of rows, gw from per-chunk partial sums."""
    rows, n = g.shape
    nx, nw = (bool(v) for v in needs)
    chunks, acc, part = _weight_partials(rows, 1, n, g.dtype)
    gx = np.empty_like(g) if nx else np.empty((0, n), g.dtype)
    _rms_norm_bwd(g, x, rstd, weight, gx, acc, part, nx, nw, chunks)
    return gx if nx else None, part[:, 0].sum(axis=0).astype(g.dtype) if nw else None


@njit(**_ROW_SUMS)
def _cross_entropy_fwd(x, t, ignore, loss, lse):
    rows, n = x.shape
    for r in prange(rows):
        xr = x[r]
        m = xr[0]
        for j in range(1, n):
            m = max(m, xr[j])  # a nan anywhere in the row makes the sum below nan anyway
        s = _in_dtype_of(x, 0.0)  # in the logits' dtype, as the reference: terms in (0, 1]
        for j in range(n):
            s += vexp(xr[j] - m)
        lr = _in_dtype_of(x, math.log(s)) + m
        valid = t[r] != ignore
        loss[r] = (lr - xr[t[r] if valid else 0]) * _in_dtype_of(x, valid)
        lse[r, 0] = lr


def _loss_target(target, ignore_index) -> bool:
    """Target indices the compiled loss kernels take: a NumPy integer array whose values
    compare exactly with ignore_index in int64 (so no uint64)."""
    return (isinstance(target, np.ndarray) and target.dtype.kind in "iu"
            and target.dtype != np.uint64 and -(2**63) <= ignore_index < 2**63)


def cross_entropy_forward(logits, target, ignore_index):
    """(loss, lse): one parallel pass over the rows (max, sum of exp, pick)."""
    rows, n = logits.shape
    if n == 0 or not _loss_target(target, ignore_index):
        return NotImplemented
    loss, lse = np.empty(rows, logits.dtype), np.empty((rows, 1), logits.dtype)
    _cross_entropy_fwd(logits, target, ignore_index, loss, lse)
    return loss, lse


@njit(**_ROW_SUMS)
def _cross_entropy_bwd(x, lse, t, ignore, scale, grad):
    rows, n = x.shape
    step = 1 if scale.shape[0] == rows else 0  # one scale per row, or one for all
    for r in prange(rows):
        xr, lr = x[r], lse[r, 0]
        valid = t[r] != ignore
        s = scale[r * step] * _in_dtype_of(x, valid)
        for j in range(n):
            grad[r, j] = vexp(xr[j] - lr) * s
        k = t[r] if valid else 0
        grad[r, k] = (vexp(xr[k] - lr) - _in_dtype_of(x, 1.0)) * s


def cross_entropy_backward(logits, lse, target, ignore_index, scale):
    """The gradient in one parallel pass over the rows, exp recomputed from lse."""
    scale = np.asarray(scale)
    if (logits.shape[1] == 0 or not _loss_target(target, ignore_index)
            or scale.dtype != logits.dtype):
        return NotImplemented
    grad = np.empty_like(logits)
    _cross_entropy_bwd(logits, lse, target, ignore_index, scale.reshape(-1), grad)
    return grad

# ------------------------------------------------------------------------- optimizer, reductions
# AdamW over many parameters in one parallel pass. Each parallel launch of numba's
# workqueue pool costs tens of microseconds whatever its size, more than a bias's whole
# update, so a group's parameters go to one kernel as a table of addresses and sizes, cut
# into chunks of equal length that the threads share out. (A tuple of arrays would compile
# once per group length, and slowly; a typed List costs more to build than the update.)
_ADAMW_CHUNK = 16384  # elements: a chunk's four float32 streams stay within L2


@intrinsic
def _pointer_to(typingctx, address, like):
    """The integer `address` as a pointer to elements of `like`'s dtype."""
    ptr = types.CPointer(like.dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))

    return ptr(types.int64, like), codegen


@njit(**JIT)
def _adamw_row(table, j, p, g, m, v):
    """Row j of the table: the four arrays' data addresses, then their size; False (and
    the row unwritten) if their sizes differ."""
    if g.size != p.size or m.size != p.size or v.size != p.size:
        return False
    table[j, 0] = p.ctypes.data
    table[j, 1] = g.ctypes.data
    table[j, 2] = m.ctypes.data
    table[j, 3] = v.ctypes.data
    table[j, 4] = p.size
    return True


@njit(inline="always")
def _adamw_span(p, g, m, v, lo, hi, decay, b1, c1, b2, c2, inv_bc2, eps, neg_step):
    # The reference's operations one by one, each rounded to the arrays' dtype, in its
    # order: the same arithmetic, so the same bits. No fastmath: it would let LLVM fuse
    # multiply-adds and reorder. Unsigned indices: numba then skips its negative-index
    # wraparound, which otherwise keeps LLVM from vectorizing the loop.
    for i in range(np.uint64(lo), np.uint64(hi)):
        gi = g[i]
        mi = m[i] * b1 + gi * c1
        vi = v[i] * b2 + (gi * gi) * c2
        s = math.sqrt(vi) * inv_bc2 + eps
        m[i] = mi
        v[i] = vi
        p[i] = p[i] * decay + (mi / s) * neg_step


@njit(**PAR)
def _adamw_table(table, like, chunk, decay, b1, c1, b2, c2, inv_bc2, eps, neg_step):
    n = table.shape[0]
    first = np.zeros(n + 1, np.int64)  # first[j]: the first chunk of parameter j
    for j in range(n):
        first[j + 1] = first[j] + (table[j, 4] + chunk - 1) // chunk
    for c in prange(first[n]):
        j = np.searchsorted(first, c, side="right") - 1
        size = table[j, 4]
        lo = (c - first[j]) * chunk
        hi = min(lo + chunk, size)
        p = numba.carray(_pointer_to(table[j, 0], like), size)
        g = numba.carray(_pointer_to(table[j, 1], like), size)
        m = numba.carray(_pointer_to(table[j, 2], like), size)
        v = numba.carray(_pointer_to(table[j, 3], like), size)
        _adamw_span(p, g, m, v, lo, hi, decay, b1, c1, b2, c2, inv_bc2, eps, neg_step)


def _adamw_constants(dtype, lr, beta1, beta2, eps, weight_decay, step):
    """The reference's scalars, computed in Python floats exactly as it does, then rounded
    to the arrays' dtype as NumPy rounds a Python float meeting an array (NEP 50)."""
    step_size = lr / (1 - beta1**step)
    inv_bc2 = 1.0 / math.sqrt(1 - beta2**step)
    decay = 1 - lr * weight_decay
    c = dtype.type
    return (c(decay), c(beta1), c(1 - beta1), c(beta2), c(1 - beta2), c(inv_bc2), c(eps),
            c(-step_size))


def adamw_update_many(params, grads, exp_avgs, exp_avg_sqs, lr, beta1, beta2, eps,
                      weight_decay, step):
    """adamw_update on each (p, g, m, v) of the lists, all in one parallel pass.

    The arrays must be C-contiguous and of one float dtype (kernels/__init__.py sees to
    it), of one size per quadruple, and no written array (p, m, v) may overlap another
    operand: the chunks run at once."""
    if not params:
        return None
    dtype = params[0].dtype
    table = np.empty((len(params), 5), np.int64)
    for j, quad in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
        if not _adamw_row(table, j, *quad):
            return NotImplemented
    k = _adamw_constants(dtype, lr, beta1, beta2, eps, weight_decay, step)
    _adamw_table(table, np.empty(0, dtype), _ADAMW_CHUNK, *k)
    return None


def adamw_update(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step):
    """One AdamW step in place, one parallel pass (see reference.adamw_update)."""
    return adamw_update_many((p,), (g,), (m,), (v,), lr, beta1, beta2, eps, weight_decay,
                             step)
