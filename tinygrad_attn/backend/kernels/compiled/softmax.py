"""Compiled softmax, log_softmax and the fused mask + scale + softmax: one pass per row
each way."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ._common import F32, PAR, in_dtype_of, vexp

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
def _normalize(z, y, m, kept, tail):
    """y = exp(z - m) / sum(exp(z - m)) over a row's first `kept` entries, m their max and
    kept >= 1 (z may be y itself), and y = `tail` over the rest of the row. Bounds, not
    slices: a slice's copy loop does not vectorize. The tail is written by the division's
    loop, which runs over the whole row: a loop of its own from `kept` to the end starts
    and ends at a different place in every row of a causal mask, and such a fill alone
    took 3.7 ms over (32, 6, 256, 256), a third of the whole kernel's time."""
    for j in range(kept):
        y[j] = vexp(z[j] - m)
    s = _row_sum(y, kept)
    for j in range(y.shape[0]):
        y[j] = y[j] / s if j < kept else tail


@njit(**PAR)
def _softmax_rows(x, y):
    for r in prange(x.shape[0]):
        xr = x[r]
        _normalize(xr, y[r], _row_max(xr), x.shape[1], in_dtype_of(y, 0.0))


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


@njit(inline="always")
def _scale_mask_max(xr, mr, col_stride, scale, yr, kept):
    """yr[j] = the masked score of xr[j] * scale under mask entry mr[j * col_stride] for
    j < kept (kept >= 1), and their max, taken in _row_max's order: the scores are written
    and their max found in one loop, not two."""
    m = _masked(xr[0] * scale, mr[0])
    yr[0] = m
    for j in range(1, kept):
        v = _masked(xr[j] * scale, mr[j * col_stride])
        yr[j] = v
        m = max(m, v)
    return m


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
            if kept:
                m = _scale_mask_max(xr, mr, 1, scale, yr, kept)
        else:
            kept = n
            m = _scale_mask_max(xr, mask[offset:], col_stride, scale, yr, kept)
        if kept:
            _normalize(yr, yr, m, kept, in_dtype_of(y, 0.0))
        else:  # every entry masked: nan, as exp(-inf - -inf) makes it
            for j in range(n):
                yr[j] = np.nan


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


# One block of query rows of a causal attention's probabilities (reference.py has the
# formulas): rows of s (n, bq, i1) are queries i0 + r, i0 = i1 - bq, of P (n, T, T).


@njit(**_SUMS)
def _prefix_dot(a, b, n):
    s = a[0] * b[0]
    for j in range(1, n):
        s += a[j] * b[j]
    return s


@njit(**PAR)
def _causal_block_rows(s, P, i0, scale):
    bq = s.shape[1]
    for t in prange(s.shape[0] * bq):
        b, r = t // bq, t % bq
        sr, pr = s[b, r], P[b, i0 + r]
        kept = i0 + r + 1
        m = sr[0] * scale
        pr[0] = m
        for j in range(1, kept):  # the scaled scores into P's row, and their max
            v = sr[j] * scale
            pr[j] = v
            m = max(m, v)
        _normalize(pr, pr, m, kept, in_dtype_of(P, 0.0))  # zeros from kept to T


@njit(**PAR)
def _causal_block_backward_rows(dp, P, i0, scale):
    bq, width = dp.shape[1], dp.shape[2]
    for t in prange(dp.shape[0] * bq):
        b, r = t // bq, t % bq
        dr, pr = dp[b, r], P[b, i0 + r]
        kept = i0 + r + 1
        dot = _prefix_dot(dr, pr, kept)
        for j in range(width):
            dr[j] = (dr[j] - dot) * pr[j] * scale if j < kept else 0


def _causal_block_shapes(s, P):
    """(n, bq, i1, T) of a block s (..., bq, i1) of P (..., T, T), or None where they do
    not fit (the reference then runs, and raises as NumPy does)."""
    if s.ndim < 2 or P.ndim != s.ndim or P.shape[:-2] != s.shape[:-2]:
        return None
    bq, i1 = s.shape[-2:]
    T = P.shape[-1]
    if P.shape[-2] != T or not bq <= i1 <= T:
        return None
    return s.size // max(bq * i1, 1), bq, i1, T


def causal_softmax_block(s, P, scale):
    shapes = _causal_block_shapes(s, P)
    if shapes is None:
        return NotImplemented
    n, bq, i1, T = shapes
    if s.size:
        _causal_block_rows(s.reshape(n, bq, i1), P.reshape(n, T, T), i1 - bq,
                           s.dtype.type(scale))
    return None


def causal_softmax_block_backward(dp, P, scale):
    shapes = _causal_block_shapes(dp, P)
    if shapes is None:
        return NotImplemented
    n, bq, i1, T = shapes
    if dp.size:
        _causal_block_backward_rows(dp.reshape(n, bq, i1), P.reshape(n, T, T), i1 - bq,
                                    dp.dtype.type(scale))
    return None
