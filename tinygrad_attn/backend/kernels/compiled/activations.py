"""Compiled activations: gelu (exact and tanh), bias + gelu, dropout; each forward
and backward in one pass over blocks of elements."""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from ._common import F32, JIT, PAR, exp32_clamped

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
def _exp_nonpos32(v):
    """exp32 of a float32 v <= 0, to the bit: exp32's arithmetic without what no such v
    needs (the clamp at 88, the overflow above 88.7, and nan, which the gelu's product
    with x passes on anyway): five vector operations fewer per element in the gelu loops."""
    y = exp32_clamped(max(v, F32(-87.0)))
    if v < F32(-87.3):
        y = F32(0.0)
    return y


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
    e = _exp_nonpos32(-(z * z))
    y = (y * e) * F32(-0.5) + F32(0.5)  # erf(|x| / sqrt 2) / 2
    return math.copysign(y, x) + F32(0.5), e


@njit(inline="always")
def _tanh_halves32(x):
    """(1 + tanh(u), 1 - tanh(u)) for gelu's tanh argument u of a float32 x, from one
    e = exp(-2|u|) <= 1: 2 / (1 + e) and 2e / (1 + e), the large one and the small one by
    the sign of u. Neither is a difference, so the small one keeps its relative accuracy
    (1 - tanh^2 by subtraction loses it as tanh nears +-1), and e never overflows."""
    u = F32(_SQRT_2_OVER_PI) * (x + F32(_TANH_K) * x * x * x)
    e = _exp_nonpos32(F32(-2.0) * abs(u))
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


# Streaming (non-temporal) stores, for outputs too large to stay in the cache: a plain
# store to memory not in the cache first reads the line in, then writes it back; a
# streaming store writes the line without the read, a third less memory traffic for
# g * mask -> out. The vector instruction needs its address aligned, so the loop that uses
# it gets only whole _ACT_BLOCK blocks that start on a 64-byte boundary (every vector
# store LLVM makes of it is then aligned, and no remainder is left to the scalar loop);
# the elements before the first boundary and after the last whole block take plain
# stores. Tried on the gelu (compute-bound) and on layer_norm's two row outputs too:
# slower there, so only the dropout backward uses them.
_NT_MIN_BYTES = 32 << 20  # about the L3 cache: smaller outputs may still be read from it
_NT_ALIGN = 64


@intrinsic
def _stream_store(typingctx, arr, i, v):
    """arr[i] = v as a non-temporal store (the caller guarantees 64-byte alignment of the
    vector stores LLVM makes of it: see _NT_ALIGN)."""
    sig = types.void(arr, types.intp, arr.dtype)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]], inbounds=True)
        store = builder.store(args[2], ptr, align=32)
        store.set_metadata("nontemporal",
                           builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _store_fence(typingctx):
    """A full fence (mfence on x86): streaming stores are weakly ordered, so each block
    fences them before its thread reports the block done."""

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


@njit(**_ACT_SERIAL)
def _dropout_grad_stream(g, keep, scale, one, zero, out):
    for i in range(g.size):
        _stream_store(out, i, (g[i] * (one if keep[i] else zero)) * scale)
    _store_fence()


@njit(inline="always")
def _stream_split(n, head, blk):
    """(lo, hi, streaming) of block blk of n elements where out[head:] starts on a cache
    line: block 0 is the head, the last block what follows the whole _ACT_BLOCK blocks
    (both plain stores), the whole blocks between them streaming stores."""
    whole = (n - head) // _ACT_BLOCK
    if blk == 0:
        return 0, head, False
    if blk == whole + 1:
        return head + whole * _ACT_BLOCK, n, False
    lo = head + (blk - 1) * _ACT_BLOCK
    return lo, lo + _ACT_BLOCK, True


@njit(**_ACT_PAR)
def _dropout_grad_map(g, keep, scale, one, zero, out):
    n = g.size
    for blk in prange((n + _ACT_BLOCK - 1) // _ACT_BLOCK):
        lo, hi = blk * _ACT_BLOCK, min(n, (blk + 1) * _ACT_BLOCK)
        _dropout_grad_run(g[lo:hi], keep[lo:hi], scale, one, zero, out[lo:hi])


@njit(**_ACT_PAR)
def _dropout_grad_map_streaming(g, keep, scale, one, zero, out, head):
    """_dropout_grad_map for large outputs (a kernel of its own, so it compiles only when
    such an output comes: smaller work never pays its compile time)."""
    for blk in prange((g.size - head) // _ACT_BLOCK + 2):
        lo, hi, streaming = _stream_split(g.size, head, blk)
        if streaming:
            _dropout_grad_stream(g[lo:hi], keep[lo:hi], scale, one, zero, out[lo:hi])
        else:
            _dropout_grad_run(g[lo:hi], keep[lo:hi], scale, one, zero, out[lo:hi])


@njit(**_ACT_PAR)
def _dropout_map(x, u, p, scale, one, zero, y, keep):
    n = x.size
    for blk in prange((n + _ACT_BLOCK - 1) // _ACT_BLOCK):
        lo, hi = blk * _ACT_BLOCK, min(n, (blk + 1) * _ACT_BLOCK)
        _dropout_run(x[lo:hi], u[lo:hi], p, scale, one, zero, y[lo:hi], keep[lo:hi])


def _stream_head(out) -> int:
    """Elements before out's first 64-byte boundary where streaming stores pay (an output
    of at least _NT_MIN_BYTES, with a whole block after the head); else -1."""
    head = (-out.ctypes.data) % _NT_ALIGN // out.itemsize
    if (out.nbytes < _NT_MIN_BYTES or out.ctypes.data % out.itemsize
            or head + _ACT_BLOCK > out.size):
        return -1
    return head


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
    args = (g.reshape(-1), keep.reshape(-1), t(scale), t(1), t(0), out.reshape(-1))
    head = _stream_head(out)
    if head < 0:
        _dropout_grad_map(*args)
    else:
        _dropout_grad_map_streaming(*args, head)
    return out
