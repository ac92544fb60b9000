"""Compiled tiles of the blocked attention: the element-wise steps between its GEMMs,
one pass over a tile's rows each (reference.py's attention_block_* has the formulas)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ._common import PAR, in_dtype_of, vexp
from .softmax import _row_sum


def _tile_operand(a, s, dtype):
    """A mask operand (keep or add) as the kernels read it: (rows of its own, bk), row r
    of s reading row r % rows. None stays None; NotImplemented for what they do not read
    (another dtype, not C-contiguous, or a shape other than s's or its last two dims)."""
    if a is None:
        return None
    if type(a) is not np.ndarray or a.dtype != dtype or not a.flags.c_contiguous:
        return NotImplemented
    if a.shape != s.shape and a.shape != s.shape[-2:]:
        return NotImplemented
    return a.reshape(-1, s.shape[-1])


def _rows(s, *others):
    """s as (rows, bk), and each of `others` (m, l, acc, lse, d: one row per row of s) as
    (rows, its last dim); None where a size does not split into s's rows."""
    n = s.shape[-1]
    rows = s.size // n
    if any(o.size % rows for o in others):
        return None
    return (s.reshape(rows, n),) + tuple(o.reshape(rows, -1) for o in others)


@njit(inline="always")
def _scaled_masked(sr, r, keep, add, scale):
    """sr = sr * scale (+ add's row), -inf where keep's row is False: plain loops over the
    row, each of which LLVM vectorizes (a mask read as keep[r % rows, j] inside the
    arithmetic's loop, with its branch, was not, and cost the kernel half its time)."""
    n = sr.shape[0]
    if add is not None:
        ar = add[r % add.shape[0]]
        for j in range(n):
            sr[j] = sr[j] * scale + ar[j]
    else:
        for j in range(n):
            sr[j] = sr[j] * scale
    if keep is not None:
        kr = keep[r % keep.shape[0]]
        hidden = in_dtype_of(sr, -np.inf)
        for j in range(n):
            sr[j] = sr[j] if kr[j] else hidden


@njit(**PAR)
def _block_forward(s, m, l, acc, keep, add, scale):
    """A row with a nan score gives a nan output row, as the reference does (its p, then
    l and acc, are nan), though its running max may differ from the reference's. acc may
    have no columns (a strip of one key block: nothing to rescale)."""
    rows, n = s.shape
    for r in prange(rows):
        sr = s[r]
        _scaled_masked(sr, r, keep, add, scale)
        top = sr[0]
        for j in range(1, n):
            top = max(top, sr[j])
        old = m[r, 0]
        new = max(top, old)
        safe = new if new - new == 0 else in_dtype_of(s, 0.0)  # no key yet: 0, not -inf
        for j in range(n):
            sr[j] = vexp(sr[j] - safe)
        c = in_dtype_of(s, math.exp(old - safe))  # one per row: the C library's exp
        l[r, 0] = l[r, 0] * c + _row_sum(sr, n)
        ar = acc[r]
        for j in range(ar.shape[0]):
            ar[j] *= c
        m[r, 0] = new


def attention_block_forward(s, m, l, acc, keep, add, scale):
    keep, add = _tile_operand(keep, s, np.bool_), _tile_operand(add, s, s.dtype)
    tiles = _rows(s, m, l, acc) if s.size else None
    if keep is NotImplemented or add is NotImplemented or tiles is None:
        return NotImplemented
    s2, m2, l2, acc2 = tiles
    _block_forward(s2, m2, l2, acc2, keep, add, s.dtype.type(scale))
    return None


@njit(**PAR)
def _block_probs(s, lse, keep, add, scale):
    rows, n = s.shape
    for r in prange(rows):
        sr, lr = s[r], lse[r, 0]
        _scaled_masked(sr, r, keep, add, scale)  # hidden: -inf, whose exp is 0
        for j in range(n):
            sr[j] = vexp(sr[j] - lr)


def attention_block_probs(s, lse, keep, add, scale):
    keep, add = _tile_operand(keep, s, np.bool_), _tile_operand(add, s, s.dtype)
    tiles = _rows(s, lse) if s.size else None
    if keep is NotImplemented or add is NotImplemented or tiles is None:
        return NotImplemented
    _block_probs(*tiles, keep, add, s.dtype.type(scale))
    return None


@njit(**PAR)
def _block_dscores(dp, p, d, scale):
    rows, n = dp.shape
    for r in prange(rows):
        dr, pr, d0 = dp[r], p[r], d[r, 0]
        for j in range(n):
            dr[j] = (dr[j] - d0) * pr[j] * scale


def attention_block_dscores(dp, p, d, scale):
    tiles = _rows(dp, p, d) if dp.size and p.shape == dp.shape else None
    if tiles is None:
        return NotImplemented
    _block_dscores(*tiles, dp.dtype.type(scale))
    return None
