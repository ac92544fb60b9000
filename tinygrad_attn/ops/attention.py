"""Memory-efficient attention: one Function that works in query and key blocks.

    out = softmax(q @ k^T * scale + mask) @ v

The full (T x T) score matrix is never materialized, in forward or backward. Forward runs
the online softmax over key blocks (a running row max m, row sum l, and the weighted sum
of values), skipping blocks that the causal mask hides entirely. It saves q, k, v, the
output and the per-row logsumexp (T floats per head); backward recomputes each block's
probabilities from those and accumulates dq, dk, dv block by block. For 4-D inputs the
output is laid out heads-innermost, so merging the heads after it costs no copy. The
GEMMs are NumPy's; the element-wise work on each tile of scores between them is
backend.kernels.attention_block_forward, attention_block_probs and attention_block_dscores.
float16 runs in float32, as torch's CPU attention does for half (its row sums of exps and
its dot products lose too much in float16): q, k, v are widened per call, the output and
the gradients are rounded to float16 once, and the row logsumexp is kept in float32.

Attention dropout (dropout_p > 0) drops probabilities after the softmax, as torch's:
out = (P * keep / (1 - p)) @ v, the row sums still those of the undropped P. Its mask is
counter-based: whether score (b, i, j) is kept is a hash of one seed and the score's flat
index, so each tile's mask is rebuilt from the seed where it is needed, in forward and
again in backward, and no T x T mask is ever stored.
"""

from __future__ import annotations

import math

from .. import backend
from .. import shape as shp
from ..autograd import Function
from ..autograd.graph import recording, unwrap
from ..creation import default_generator
from ..errors import ShapeError
from ._math_util import wide
from ._recorded import constant
from ._util import Tensor, check_same_device, from_array, unbroadcast
from .registry import op

DEFAULT_BLOCK_SIZE = 128

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: 2**64 / golden ratio, odd
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64's finalizer


def _mix(z: int) -> int:
    """splitmix64's finalizer on one Python int (the seed's own mixing)."""
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def _dropout_keep(xp, drop, batch, Tq, Tk, i0, i1, j0, j1):
    """Bool keep-mask of one tile of the (batch..., Tq, Tk) scores under attention dropout.

    drop = (seed, threshold, scale). Score number n (its flat index in the scores) is kept
    when the top 53 bits of splitmix64(seed + n * golden) reach the threshold, round(p * 2**53):
    a pure function of the seed and n, so forward and backward, and any block size, see the
    same mask. Two uint64 buffers of the tile's size, freed on return.
    """
    seed, threshold, _ = drop
    u64 = xp.uint64
    n_batch = math.prod(batch)
    z = (xp.arange(n_batch, dtype=u64).reshape(batch + (1, 1)) * u64(Tq * Tk)
         + xp.arange(i0, i1, dtype=u64)[:, None] * u64(Tk)
         + xp.arange(j0, j1, dtype=u64)[None, :])
    z *= u64(_GOLDEN)  # uint64 arithmetic wraps modulo 2**64, as splitmix64 wants
    z += u64(seed)
    t = z >> u64(30)
    z ^= t
    z *= u64(_MIX1)
    xp.right_shift(z, u64(27), out=t)
    z ^= t
    z *= u64(_MIX2)
    xp.right_shift(z, u64(31), out=t)
    z ^= t
    xp.right_shift(z, u64(11), out=z)
    return z >= u64(threshold)


def _apply_dropout(xp, p, drop, batch, Tq, Tk, i0, i1, j0, j1):
    """p *= keep / (1 - p_drop) over one tile, in place (nothing when drop is None)."""
    if drop is None:
        return
    keep = _dropout_keep(xp, drop, batch, Tq, Tk, i0, i1, j0, j1)
    xp.multiply(p, keep, out=p)
    p *= p.dtype.type(drop[2])


INNER_TILE = 64  # causal: the query strip's height, at most block_size (see _strips)


def _strips(causal, bs, Tq, Tk):
    """The tiling: [(a, b, [(c0, c1), ...]), ...], query rows a:b and, for each, the key
    blocks c0:c1 its tiles cover, at most bs keys each. Without a causal mask the query
    blocks are bs rows, as the key blocks. With it, the rows come in strips of
    min(bs, INNER_TILE) and each strip's keys stop at its last row (key b - 1): only the
    diagonal's last, strip-sized corner of the tile holds hidden scores, whatever bs is,
    and no tile or part of a tile wholly in the future is computed. A strip whose keys fit
    in one block (every strip when T <= bs) is one tile: its softmax is direct, with no
    running rescale across blocks."""
    rows = min(bs, INNER_TILE) if causal else bs
    out = []
    for a in range(0, Tq, rows):
        b = min(a + rows, Tq)
        end = min(b, Tk) if causal else Tk
        out.append((a, b, [(c0, min(c0 + bs, end)) for c0 in range(0, end, bs)]))
    return out


class _StripState:
    """One strip's running row max m, row sum l and weighted sum acc, reused by every strip
    of a call (made once, refilled per strip): flat buffers whose prefix is viewed at the
    strip's shape, so a shorter last strip is still a C-contiguous array, as the kernels
    write them. A strip of one key block passes a zero-width acc (no rescaling to do)."""

    def __init__(self, xp, B, rows, Dv, dtype, online):
        n = math.prod(B) * rows
        self.xp, self.B, self.Dv = xp, B, Dv
        self.m, self.l = xp.empty(n, dtype=dtype), xp.empty(n, dtype=dtype)
        self.acc = xp.empty(n * Dv, dtype=dtype) if online else None
        self.none = xp.empty(B + (rows, 0), dtype=dtype)

    def start(self, rows, online):
        n = math.prod(self.B) * rows
        m = self.m[:n].reshape(self.B + (rows, 1))
        l = self.l[:n].reshape(self.B + (rows, 1))
        m.fill(-self.xp.inf)
        l.fill(0)
        if not online:
            return m, l, self.none[..., :rows, :]
        acc = self.acc[:n * self.Dv].reshape(self.B + (rows, self.Dv))
        acc.fill(0)
        return m, l, acc


COPY_KT_MIN_BLOCK = 64  # key blocks at least this wide read k^T, v^T from a row-order copy


def _rows_first(xp, X, bs):
    """X^T (..., D, T), the right operand of the GEMMs that take k^T or v^T, sliced by key
    block. For key blocks of COPY_KT_MIN_BLOCK keys or more, in row order: one transient
    copy per call, which the GEMMs of every strip share (given the transposed view, they
    read it column by column, OpenBLAS's slower kernel for that layout, or copy each block
    themselves); measured 5-10% faster for the whole op at T = 64, blocks 64 and 128. For
    narrower blocks the transposed view: there the copy's GEMMs, on 16 or 32 columns of a
    T-wide row, ran 10-17% slower (T = 256, blocks 16 and 32)."""
    kt = xp.swapaxes(X, -1, -2)
    return xp.ascontiguousarray(kt) if min(bs, X.shape[-2]) >= COPY_KT_MIN_BLOCK else kt


_KEEP_CACHE = {}


def _causal_keep(xp, rows, cols, offset):
    """Bool (rows, cols): key j visible to row r, j <= r + offset. Made once per shape and
    device and kept (strips repeat a handful of shapes); the kernels read it for every
    head, and no caller writes to it."""
    key = (xp.__name__, rows, cols, offset)
    keep = _KEEP_CACHE.get(key)
    if keep is None:
        if len(_KEEP_CACHE) > 256:
            _KEEP_CACHE.clear()
        keep = xp.arange(cols)[None, :] <= xp.arange(rows)[:, None] + offset
        _KEEP_CACHE[key] = keep
    return keep


def _block_mask(xp, causal, mask, i0, i1, j0, j1):
    """Bool (keep) or float (additive) mask of rows i0:i1 and keys j0:j1, or None; the
    causal keep comes from _causal_keep's cache."""
    keep = None
    if causal and j1 - 1 > i0:  # some keys lie in the future of some queries here
        keep = _causal_keep(xp, i1 - i0, j1 - j0, i0 - j0)
    if mask is None:
        return keep, None
    part = mask[..., i0:i1, j0:j1]
    if part.dtype == bool:
        return (part if keep is None else part & keep), None
    return keep, part


class ScaledDotProductAttention(Function):
    """Blocked exact attention; saves q, k, v, out and the row logsumexp, not T x T.

    Backward per block: p = exp(s - lse); dv += p^T do; dp = do v^T;
    ds = p * (dp - rowsum(do * out)); dq += ds k * scale; dk += ds^T q * scale.
    With dropout, z = keep / (1 - p_drop): dv += (p z)^T do and ds = p * (dp z - rowsum(do *
    out)) (rowsum(dp z p) is still rowsum(do * out)). Dropout saves no tensor at all: only
    its seed, one Python int on ctx, from which backward rebuilds each tile's mask.
    Under create_graph=True the same tiles run on recorded arrays (_recorded_backward), with
    the logsumexp recomputed from q and k so that its derivative flows too.
    """

    @staticmethod
    def flops(ctx, args, out) -> int:
        """2*B*Lq*S*E + 2*B*Lq*S*Ev, the full q k^T and p v whatever the mask (torch's)."""
        q, k, v = args[:3]
        return 2 * math.prod(out.shape[:-1]) * k.shape[-2] * (q.shape[-1] + v.shape[-1])

    @staticmethod
    def forward(ctx, q, k, v, mask=None, is_causal=False, scale=None, block_size=None,
                dropout=None):
        xp = backend.xp_for(q.device)
        Q, K, V = wide(q._array()), wide(k._array()), wide(v._array())
        B = Q.shape[:-2]
        Tq, Tk, Dv = Q.shape[-2], K.shape[-2], V.shape[-1]
        bs = block_size or DEFAULT_BLOCK_SIZE
        M = None if mask is None else wide(mask._array())
        if M is not None:
            M = xp.broadcast_to(M, B + (Tq, Tk))
        if len(B) >= 2:
            # (batch, heads, T, D): lay the output out as (batch, T, heads, D) in memory and
            # hand back the (batch, heads, T, D) view, so merging the heads afterwards,
            # out.transpose(1, 2).contiguous().view(B, T, C), is a no-op, not a copy
            # (grouped heads, (batch, kv heads, group, T, D), likewise: heads innermost)
            out = xp.moveaxis(xp.empty((B[0], Tq) + B[1:] + (Dv,), dtype=Q.dtype), 1, -2)
        else:
            out = xp.empty(B + (Tq, Dv), dtype=Q.dtype)
        lse = xp.empty(B + (Tq, 1), dtype=Q.dtype)
        strips = _strips(is_causal, bs, Tq, Tk)
        state = _StripState(xp, B, max(b - a for a, b, _ in strips) if strips else 0, Dv,
                            Q.dtype, online=any(len(c) > 1 for _, _, c in strips))
        Kt = _rows_first(xp, K, bs)
        for a, b, chunks in strips:
            q_blk = Q[..., a:b, :]
            m, l, acc = state.start(b - a, online=len(chunks) > 1)
            o = None
            for c0, c1 in chunks:
                s = backend.matmul(xp, q_blk, Kt[..., c0:c1])
                keep, add = _block_mask(xp, is_causal, M, a, b, c0, c1)
                # s becomes p; m, l (and acc, over several key blocks) move on, in place
                backend.kernels.attention_block_forward(s, m, l, acc, keep, add, scale)
                _apply_dropout(xp, s, dropout, B, Tq, Tk, a, b, c0, c1)  # after l's sum
                pv = backend.matmul(xp, s, V[..., c0:c1, :])
                if len(chunks) == 1:
                    o = pv  # one key block: its p @ v is the whole sum, no rescaling
                else:
                    acc += pv
            if o is None:
                o = acc
            # a query that may see no key at all (l == 0) gets zeros, as torch (not 0 / 0),
            # and an lse of +inf: backward's p = exp(z - lse) is then 0 over the row, even
            # where z is -inf, so the row adds nothing to dq, dk, dv or the mask's gradient
            # (torch's are 0 there too; exp(-inf - -inf) would be nan and poison them all)
            unseen = l == 0
            xp.divide(o, xp.where(unseen, 1, l), out=out[..., a:b, :])
            lse[..., a:b, :] = xp.where(
                unseen, xp.inf, xp.where(xp.isfinite(m), m, 0) + xp.log(xp.where(unseen, 1, l)))
        ctx.mask_given = mask is not None
        ctx.is_causal, ctx.scale, ctx.block_size = is_causal, scale, bs
        ctx.dropout = dropout
        # float16: rounded once, keeping the heads-innermost layout (astype keeps strides)
        out_t = from_array(out.astype(q.dtype.np, copy=False))
        ctx.save_for_backward(q, k, v, out_t, from_array(lse), mask)
        return out_t

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse, mask = ctx.saved_tensors
        if recording():
            return _recorded_backward(ctx, q, k, v, out, lse, mask, g)
        xp = backend.xp_for(g.device)
        Q, K, V, O, LSE, G = (wide(t._array()) for t in (q, k, v, out, lse, g))
        B = Q.shape[:-2]
        Tq, Tk = Q.shape[-2], K.shape[-2]
        bs, scale, causal, drop = ctx.block_size, ctx.scale, ctx.is_causal, ctx.dropout
        M = None if mask is None else xp.broadcast_to(wide(mask._array()), B + (Tq, Tk))
        dQ = xp.zeros(B + Q.shape[-2:], dtype=Q.dtype)
        dK = xp.zeros(B + K.shape[-2:], dtype=Q.dtype)
        dV = xp.zeros(B + V.shape[-2:], dtype=Q.dtype)
        # an additive float mask that needs a gradient gets d(scores), as torch gives it;
        # the (T x T) buffer exists only then
        n_mask = len(ctx.needs_input_grad) > 3 and ctx.needs_input_grad[3]
        dM = xp.zeros(B + (Tq, Tk), dtype=Q.dtype) if n_mask else None
        Kt, Vt = _rows_first(xp, K, bs), _rows_first(xp, V, bs)
        for a, b, chunks in _strips(causal, bs, Tq, Tk):
            q_blk, g_blk = Q[..., a:b, :], G[..., a:b, :]
            # (..., rows, 1) each, contiguous, as the kernels read them: the strip's lse,
            # and rowsum(do * out) (T floats per head in all)
            lse_blk = xp.ascontiguousarray(LSE[..., a:b, :])
            d_blk = xp.ascontiguousarray((g_blk * O[..., a:b, :]).sum(axis=-1, keepdims=True))
            for n, (c0, c1) in enumerate(chunks):
                k_blk = K[..., c0:c1, :]
                p = backend.matmul(xp, q_blk, Kt[..., c0:c1])
                keep, add = _block_mask(xp, causal, M, a, b, c0, c1)
                backend.kernels.attention_block_probs(p, lse_blk, keep, add, scale)
                ds = backend.matmul(xp, g_blk, Vt[..., c0:c1])
                if drop is None:
                    dV[..., c0:c1, :] += backend.matmul(xp, xp.swapaxes(p, -1, -2), g_blk)
                else:  # the tile's mask again, from the seed: z = keep / (1 - p_drop)
                    z = _dropout_keep(xp, drop, B, Tq, Tk, a, b, c0, c1) * p.dtype.type(
                        drop[2])
                    dV[..., c0:c1, :] += backend.matmul(xp, xp.swapaxes(p * z, -1, -2), g_blk)
                    ds *= z
                    del z
                # the mask's gradient is ds before the scale
                backend.kernels.attention_block_dscores(ds, p, d_blk,
                                                        1 if dM is not None else scale)
                if dM is not None:
                    dM[..., a:b, c0:c1] = ds
                    ds *= scale
                if n == 0:
                    dQ[..., a:b, :] = backend.matmul(xp, ds, k_blk)
                else:
                    dQ[..., a:b, :] += backend.matmul(xp, ds, k_blk)
                dK[..., c0:c1, :] += backend.matmul(xp, xp.swapaxes(ds, -1, -2), q_blk)
        nq, nk, nv = ctx.needs_input_grad[:3]
        dtype = q.dtype.np
        grads = tuple(from_array(d.astype(dtype, copy=False)) if n else None
                      for d, n in ((dQ, nq), (dK, nk), (dV, nv)))
        if dM is None:
            return grads
        return grads + (unbroadcast(from_array(dM.astype(mask.dtype.np, copy=False)),
                                    mask.shape),)


def _recorded_backward(ctx, q, k, v, out, lse, mask, g):
    """The blocked backward under create_graph=True: the same tiles through the same kernels
    (their NumPy text, on recorded arrays), so that the result carries a graph. Two things
    differ from the first-order loop. The row logsumexp that forward saved has no graph of
    its own, yet p = exp(s - lse) depends on q, k and the mask through it: each query
    block's lse is recomputed from its tiles by recorded ops (_recorded_lse). And a recorded
    value is never written into a buffer: each block's gradient is gathered in a list and the
    blocks are joined at the end (the recorded graph holds the tiles; its memory is not the
    first-order path's).
    """
    xp = backend.xp_for(g.device)
    Q, K, V, O, G = (wide(t._array()) for t in (q, k, v, out, g))
    B = Q.shape[:-2]
    Tq, Tk = Q.shape[-2], K.shape[-2]
    bs, scale, causal, drop = ctx.block_size, ctx.scale, ctx.is_causal, ctx.dropout
    # what no derivative flows through is read as a plain array: the saved lse (forward
    # made it without a graph; it serves as a shift) and a bool mask; a float mask is an
    # input whose gradient is recorded
    LSE = wide(unwrap(lse)._array())
    M = None
    if mask is not None:
        M = unwrap(mask)._array() if mask.dtype is backend.bool_ else wide(mask._array())
        M = xp.broadcast_to(M, B + (Tq, Tk))
    n_mask = len(ctx.needs_input_grad) > 3 and ctx.needs_input_grad[3]
    Drow = (G * O).sum(axis=-1, keepdims=True)
    key_blocks = range(0, Tk, bs)
    dQ_rows, dM_rows = [], []
    dK_cols, dV_cols = [None] * len(key_blocks), [None] * len(key_blocks)
    for i0 in range(0, Tq, bs):
        i1 = min(i0 + bs, Tq)
        q_blk, g_blk, d_blk = Q[..., i0:i1, :], G[..., i0:i1, :], Drow[..., i0:i1, :]
        lse_blk = _recorded_lse(xp, q_blk, K, M, causal, scale, bs, i0, i1,
                                LSE[..., i0:i1, :])
        dq, dM_tiles = None, []
        for n, j0 in enumerate(key_blocks):
            if causal and j0 > i1 - 1:
                break
            j1 = min(j0 + bs, Tk)
            k_blk, v_blk = K[..., j0:j1, :], V[..., j0:j1, :]
            p = backend.matmul(xp, q_blk, xp.swapaxes(k_blk, -1, -2))
            keep, add = _block_mask(xp, causal, M, i0, i1, j0, j1)
            backend.kernels.attention_block_probs(p, lse_blk, keep, add, scale)
            ds = backend.matmul(xp, g_blk, xp.swapaxes(v_blk, -1, -2))
            if drop is None:
                dv = backend.matmul(xp, xp.swapaxes(p, -1, -2), g_blk)
            else:
                z = constant(_dropout_keep(xp, drop, B, Tq, Tk, i0, i1, j0, j1)
                              * p.dtype.type(drop[2]))
                dv = backend.matmul(xp, xp.swapaxes(p * z, -1, -2), g_blk)
                ds = ds * z
            backend.kernels.attention_block_dscores(ds, p, d_blk, 1 if n_mask else scale)
            if n_mask:
                dM_tiles.append(ds)
                ds = ds * scale  # a new array: the tile just kept stays unscaled
            dq = _plus(dq, backend.matmul(xp, ds, k_blk))
            dK_cols[n] = _plus(dK_cols[n], backend.matmul(xp, xp.swapaxes(ds, -1, -2), q_blk))
            dV_cols[n] = _plus(dV_cols[n], dv)
        dQ_rows.append(dq)
        if n_mask:
            dM_rows.append(xp.concatenate(dM_tiles, axis=-1))
    for cols, width in ((dK_cols, K.shape[-1]), (dV_cols, V.shape[-1])):
        for n, j0 in enumerate(key_blocks):  # key blocks no query saw (causal, Tk > Tq)
            if cols[n] is None:
                cols[n] = constant(xp.zeros(B + (min(j0 + bs, Tk) - j0, width), dtype=Q.dtype))
    dtype = q.dtype.np
    grads = tuple(from_array(xp.concatenate(blocks, axis=-2).astype(dtype, copy=False))
                  if needed else None
                  for blocks, needed in zip((dQ_rows, dK_cols, dV_cols), ctx.needs_input_grad))
    if not n_mask:
        return grads
    dM = from_array(xp.concatenate(dM_rows, axis=-2).astype(mask.dtype.np, copy=False))
    return grads + (unbroadcast(dM, mask.shape),)


def _recorded_lse(xp, q_blk, K, M, causal, scale, bs, i0, i1, saved):
    """One query block's row logsumexp, recomputed from its tiles by recorded ops:
    lse = c + log(sum over the key blocks of rowsum(exp(z - c))), with the saved lse (a
    plain array) as the shift c, which keeps the exps near 1. A row that sees no key keeps
    +inf (its p is 0 and nothing flows through it); its sum is replaced by 1 so that no
    log(0) is taken."""
    unseen = xp.isinf(saved)
    shift = constant(xp.where(unseen, 0, saved))
    total = None
    for j0 in range(0, K.shape[-2], bs):
        if causal and j0 > i1 - 1:
            break
        j1 = min(j0 + bs, K.shape[-2])
        e = backend.matmul(xp, q_blk, xp.swapaxes(K[..., j0:j1, :], -1, -2))
        keep, add = _block_mask(xp, causal, M, i0, i1, j0, j1)
        backend.kernels.attention_block_probs(e, shift, keep, add, scale)  # exp(z - c)
        total = _plus(total, e.sum(axis=-1, keepdims=True))
    # unseen rows: inf + log(0 + 1); the others: c + log(total + 0)
    return (constant(xp.where(unseen, xp.inf, saved))
            + xp.log(total + constant(unseen.astype(saved.dtype))))




def _plus(acc, x):
    """acc + x, with None as an empty sum."""
    return x if acc is None else acc + x


@op(ScaledDotProductAttention, functional=True)
def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, enable_gqa: bool = False,
                                 block_size: int | None = None) -> Tensor:
    """softmax(q k^T * scale + mask) v without materializing the (T x T) matrix.

    q: (..., Tq, D), k: (..., Tk, D), v: (..., Tk, Dv). `attn_mask` is bool (True = may
    attend) or float (added to the scores), broadcastable to (..., Tq, Tk). `is_causal`
    masks keys after each query (top-left aligned, as PyTorch). `enable_gqa`: grouped-query
    attention, as torch's: k and v may have fewer heads (dim -3) than q, each dividing q's;
    q's head i reads kv head i // (q heads / kv heads). `block_size` (default 128) is the
    query/key tile.
    """
    check_same_device("scaled_dot_product_attention", q, k, v, attn_mask)
    if enable_gqa:
        q, k, v, attn_mask, heads_shape = _grouped_heads(q, k, v, attn_mask)
        out = scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale,
                                           block_size=block_size)
        return out if heads_shape is None else out.reshape(heads_shape)
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ShapeError(
            f"scaled_dot_product_attention: q, k, v must have the same number (>= 2) of dims; "
            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if (q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]
            or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]):
        raise ShapeError(
            f"scaled_dot_product_attention: shapes q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)} do not fit (need q (..., Tq, D), k (..., Tk, D), "
            "v (..., Tk, Dv) with equal leading dims)"
        )
    if not (q.dtype is k.dtype is v.dtype):  # torch does not promote here
        raise RuntimeError(f"scaled_dot_product_attention: expected q, k and v of one dtype, "
                           f"got {q.dtype.name}, {k.dtype.name} and {v.dtype.name}")
    if attn_mask is not None and attn_mask.dtype not in (backend.bool_, backend.float32,
                                                         q.dtype):
        raise RuntimeError(f"scaled_dot_product_attention: expected a bool or float32 "
                           f"attn_mask or one of q's dtype {q.dtype.name}, got "
                           f"{attn_mask.dtype.name}")
    if block_size is not None and (not isinstance(block_size, int) or block_size <= 0):
        raise ValueError(
            f"scaled_dot_product_attention: block_size must be a positive int, got {block_size!r}"
        )
    if not 0.0 <= dropout_p <= 1.0:  # torch raises RuntimeError, for a negative p too
        raise RuntimeError(f"scaled_dot_product_attention: dropout probability has to be "
                           f"between 0 and 1, but got {dropout_p} (q {tuple(q.shape)})")
    target = tuple(q.shape[:-1]) + (k.shape[-2],)
    if attn_mask is not None:
        try:
            ok = shp.broadcast_shapes(attn_mask.shape, target) == target
        except ShapeError:
            ok = False
        if not ok:
            raise ShapeError(
                f"scaled_dot_product_attention: attn_mask of shape {tuple(attn_mask.shape)} "
                f"does not broadcast to the scores' shape {target}"
            )
        if is_causal:
            raise ValueError(
                "scaled_dot_product_attention: pass either attn_mask or is_causal=True, not both"
            )
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if dropout_p == 0.0:
        return ScaledDotProductAttention.apply(q, k, v, attn_mask, is_causal=is_causal,
                                               scale=scale, block_size=block_size)
    return ScaledDotProductAttention.apply(q, k, v, attn_mask, is_causal=is_causal,
                                           scale=scale, block_size=block_size,
                                           dropout=_dropout_plan(dropout_p, q.device))


def _dropout_plan(p: float, device: str) -> tuple:
    """(seed, threshold, scale) of one call's attention dropout; the seed is one draw of
    the engine's generator, so manual_seed (and checkpoint's replay) fix the mask."""
    drawn = int(default_generator.integers(0, 2**62, (), backend.int64, device))
    threshold = min(round(p * 2**53), 2**53)
    return _mix(drawn), threshold, 0.0 if p == 1.0 else 1.0 / (1.0 - p)


def _grouped_heads(q, k, v, attn_mask):
    """enable_gqa: q, k, v (and the mask) as grouped views with one set of heads.

    With equal k and v head counts Hk (a GPT's grouped-query attention), q (..., Hq, T, D)
    is viewed as (..., Hk, Hq/Hk, T, D) and k, v are expanded over the group as stride-0
    views: no copy, and backward sums each group's dk, dv into its kv head. Returns the
    shape to merge the output's heads back to (None: nothing was regrouped). Where k and v
    have different head counts, each is repeated to q's heads (a recorded copy).
    """
    if min(q.ndim, k.ndim, v.ndim) < 3:
        raise IndexError(
            "scaled_dot_product_attention: enable_gqa needs a head dim (-3) in q, k and v; got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    Hq, Hk, Hv = q.shape[-3], k.shape[-3], v.shape[-3]
    if Hq % Hk or Hq % Hv:
        raise ShapeError(
            f"scaled_dot_product_attention: enable_gqa needs the key and value head counts "
            f"(dim -3) to divide the query's; got q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    if Hk == Hv == Hq:
        return q, k, v, attn_mask, None
    if Hk != Hv:  # no single grouping fits both: repeat each to Hq heads
        def repeat(t):
            g = Hq // t.shape[-3]
            grown = t.unsqueeze(-3).expand(*t.shape[:-2], g, *t.shape[-2:])
            return grown.reshape(*t.shape[:-3], Hq, *t.shape[-2:])
        return q, repeat(k), repeat(v), attn_mask, None
    g = Hq // Hk
    lead = tuple(q.shape[:-3])
    grouped = q.reshape(*lead, Hk, g, *q.shape[-2:])  # a view: one dim split in two
    k = k.unsqueeze(-3).expand(*k.shape[:-3], Hk, g, *k.shape[-2:])
    v = v.unsqueeze(-3).expand(*v.shape[:-3], Hk, g, *v.shape[-2:])
    if attn_mask is not None:
        target = tuple(q.shape[:-1]) + (k.shape[-2],)
        try:
            ok = shp.broadcast_shapes(attn_mask.shape, target) == target
        except ShapeError:
            ok = False
        if not ok:
            raise ShapeError(
                f"scaled_dot_product_attention: attn_mask of shape {tuple(attn_mask.shape)} "
                f"does not broadcast to the scores' shape {target}"
            )
        attn_mask = attn_mask.expand(*target).reshape(*lead, Hk, g, *target[-2:])
    return grouped, k, v, attn_mask, tuple(q.shape[:-1]) + (v.shape[-1],)
