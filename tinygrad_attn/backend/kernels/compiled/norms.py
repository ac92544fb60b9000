"""Compiled layer_norm, rms_norm and cross-entropy: parallel over rows, one pass each
way, weight gradients from per-chunk partial sums."""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ._common import in_dtype_of, vexp

# "reassoc" lets LLVM split a row's sum into SIMD lanes (a sum is otherwise one chain of
# dependent additions); these kernels take no other fast-math liberty. Sums whose accuracy
# matters run in float64: a row's mean (x + 1e4 keeps its variance) and the weight
# gradients, which add up every row.
_ROW_SUMS = {"cache": True, "parallel": True, "fastmath": {"reassoc"}}
_FLUSH_ROWS = 64  # rows a weight gradient sums in the input's dtype before it moves to float64


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
def _layer_norm_fwd(x, w, b, eps, y, rstd):
    rows, n = x.shape
    for r in prange(rows):
        xr = x[r]
        mean, var = _row_stats(xr)
        rs = in_dtype_of(x, 1.0 / math.sqrt(var + eps))
        m = in_dtype_of(x, mean)
        for j in range(n):
            h = (xr[j] - m) * rs
            if w is not None:
                h = h * w[j]
            if b is not None:
                h = h + b[j]
            y[r, j] = h
        rstd[r, 0] = rs


def layer_norm_forward(x, weight, bias, eps):
    """(y, rstd) of a (rows, n) x: one parallel pass over the rows, each row's mean and
    variance in float64 (float32: one sweep over x minus its first element), then its
    output; the normalized input is not written (backward rebuilds it from x)."""
    rows, n = x.shape
    if n == 0:
        return NotImplemented
    y, rstd = np.empty_like(x), np.empty((rows, 1), x.dtype)
    _layer_norm_fwd(x, weight, bias, eps, y, rstd)
    return y, rstd


@njit(**_ROW_SUMS)
def _layer_norm_bwd(g, x, rstd, w, gs, gx, acc, part, nx, sums, chunks):
    rows, n = g.shape
    for c in prange(chunks):
        lo, hi = c * rows // chunks, (c + 1) * rows // chunks
        aw, ab = acc[c, 0], acc[c, 1]
        for r in range(lo, hi):
            gr, xr, rs = g[r], x[r], rstd[r, 0]
            m = in_dtype_of(g, _row_stats(xr)[0])  # the forward's mean, to the bit
            s1 = in_dtype_of(g, 0.0)
            s2 = in_dtype_of(g, 0.0)
            if sums:
                for j in range(n):
                    h = (xr[j] - m) * rs
                    aw[j] += gr[j] * h
                    ab[j] += gr[j]
                    gh = gr[j] * w[j] if w is not None else gr[j]
                    s1 += gh
                    s2 += gh * h
                _flush_partial(aw, part[c, 0], r, lo, hi)
                _flush_partial(ab, part[c, 1], r, lo, hi)
            else:
                for j in range(n):
                    gh = gr[j] * w[j] if w is not None else gr[j]
                    s1 += gh
                    s2 += gh * ((xr[j] - m) * rs)
            if nx:
                m1, m2 = s1 / in_dtype_of(g, n), s2 / in_dtype_of(g, n)
                for j in range(n):
                    gh = gr[j] * w[j] if w is not None else gr[j]
                    d = (gh - m1 - ((xr[j] - m) * rs) * m2) * rs
                    gx[r, j] = d + gs[r, j] if gs is not None else d  # add_layer_norm's s


def layer_norm_backward(g, x, rstd, weight, needs, gs=None):
    """(gx, gw, gb) from the saved x and rstd: one parallel pass over chunks of rows, each
    row's xhat rebuilt in registers; gw and gb from per-chunk partial sums added up at the
    end (no g-sized temporary). With gs (add_layer_norm's gradient of s = x + residual),
    it is added to each row of gx as that row is written: no second pass, no temporary."""
    rows, n = g.shape
    nx, nw, nb = (bool(v) for v in needs)
    if x.shape != g.shape or (gs is not None and gs.shape != g.shape):
        return NotImplemented
    chunks, acc, part = _weight_partials(rows, 2, n, g.dtype)
    gx = np.empty_like(g) if nx else np.empty((0, n), g.dtype)
    _layer_norm_bwd(g, x, rstd, weight, gs, gx, acc, part, nx, nw or nb, chunks)
    total = part.sum(axis=0).astype(g.dtype)
    return gx if nx else None, total[0] if nw else None, total[1] if nb else None


@njit(**_ROW_SUMS)
def _add_layer_norm_fwd(x, r, w, b, eps, s, y, rstd):
    rows, n = x.shape
    k = r.shape[0]  # rows of r: all of them, or a table repeating down the rows
    for i in prange(rows):
        xr, rr, sr = x[i], r[i % k], s[i]
        for j in range(n):
            sr[j] = xr[j] + rr[j]
        mean, var = _row_stats(sr)  # from the row just written, still in cache
        rs = in_dtype_of(x, 1.0 / math.sqrt(var + eps))
        m = in_dtype_of(x, mean)
        for j in range(n):
            h = (sr[j] - m) * rs
            if w is not None:
                h = h * w[j]
            if b is not None:
                h = h + b[j]
            y[i, j] = h
        rstd[i, 0] = rs


def add_layer_norm_forward(x, r, weight, bias, eps):
    """(s, y, rstd): one parallel pass over the rows, each row's sum written and then
    normalized from cache, with layer_norm_forward's arithmetic on s (the same bits)."""
    rows, n = x.shape
    if n == 0 or r.ndim != 2 or r.shape[1] != n or r.shape[0] == 0 or rows % r.shape[0]:
        return NotImplemented
    s, y, rstd = np.empty_like(x), np.empty_like(x), np.empty((rows, 1), x.dtype)
    _add_layer_norm_fwd(x, r, weight, bias, eps, s, y, rstd)
    return s, y, rstd


def add_layer_norm_backward(g, s, rstd, weight, gs, needs):
    """(gx, gw, gb) of add_layer_norm: layer_norm_backward on the saved s, with the
    gradient of s added into gx in the same pass."""
    return layer_norm_backward(g, s, rstd, weight, needs, gs)


@njit(**_ROW_SUMS)
def _rms_norm_fwd(x, w, eps, y, rstd):
    rows, n = x.shape
    for r in prange(rows):
        xr = x[r]
        q = 0.0
        for j in range(n):
            q += np.float64(xr[j]) * xr[j]
        rs = in_dtype_of(x, 1.0 / math.sqrt(q / n + eps))
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
            s = in_dtype_of(g, 0.0)
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
                m = s / in_dtype_of(g, n)
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


# A row's sum of exp(x - x[0]) is trusted when at most this: no term overflowed (exp32 of
# more than 88 would), and log(s) is small enough that its rounding stays near the ulp of
# the logits' own spread. Above it, or nan, the row is summed again from its max.
_SHIFT_SUM_MAX = 2.0**64


@njit(**_ROW_SUMS)
def _cross_entropy_fwd(x, t, ignore, loss, lse):
    rows, n = x.shape
    for r in prange(rows):
        xr = x[r]
        # Shifted by the row's first logit, not its max: one sweep, not two. The sum is at
        # least 1 (the first term), so nothing is lost below; above the bound, or nan, the
        # row is summed again from its max, with the C library's exp: a rare path, kept
        # out of the vector code (a second inlined exp32 loop costs a second of compile).
        m = xr[0]
        s = in_dtype_of(x, 0.0)
        for j in range(n):
            s += vexp(xr[j] - m)
        if not s <= _SHIFT_SUM_MAX:
            for j in range(1, n):
                m = max(m, xr[j])  # a nan anywhere in the row makes the sum nan anyway
            s = in_dtype_of(x, 0.0)
            for j in range(n):
                s += math.exp(xr[j] - m)
        lr = in_dtype_of(x, math.log(s)) + m
        valid = t[r] != ignore
        loss[r] = (lr - xr[t[r] if valid else 0]) * in_dtype_of(x, valid)
        lse[r, 0] = lr


def _loss_target(target, ignore_index) -> bool:
    """Target indices the compiled loss kernels take: a NumPy integer array whose values
    compare exactly with ignore_index in int64 (so no uint64)."""
    return (isinstance(target, np.ndarray) and target.dtype.kind in "iu"
            and target.dtype != np.uint64 and -(2**63) <= ignore_index < 2**63)


def cross_entropy_forward(logits, target, ignore_index):
    """(loss, lse): one parallel pass over the rows (sum of exp shifted by the row's first
    logit, its max where that sum is too large, pick)."""
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
    for r in prange(rows):  # x[r, j], not a row view: measured about 5% faster here
        lr = lse[r, 0]
        valid = t[r] != ignore
        s = scale[r * step] * in_dtype_of(x, valid)
        for j in range(n):
            grad[r, j] = vexp(x[r, j] - lr) * s
        k = t[r] if valid else 0
        grad[r, k] = (vexp(x[r, k] - lr) - in_dtype_of(x, 1.0)) * s


def cross_entropy_backward(logits, lse, target, ignore_index, scale):
    """The gradient in one parallel pass over the rows, exp recomputed from lse."""
    scale = np.asarray(scale)
    if (logits.shape[1] == 0 or not _loss_target(target, ignore_index)
            or scale.dtype != logits.dtype):
        return NotImplemented
    grad = np.empty_like(logits)
    _cross_entropy_bwd(logits, lse, target, ignore_index, scale.reshape(-1), grad)
    return grad
