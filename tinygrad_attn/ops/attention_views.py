"""Causal attention that materializes its probabilities: the "views" attention's core.

    y = dropout(softmax(q @ k^T * scale, causal)) @ v

as one node. It keeps the (..., T, T) probabilities for backward, as torch's math
scaled_dot_product_attention does (and as the composition of q @ k.mT, masked_softmax,
dropout and @ v did), unlike the blocked op of attention.py, which keeps only a logsumexp
per row. What it saves over the composition is work: the scores are computed in row
blocks of queries [i0, i1), each against keys [0, i1) only, so the tiles above the
diagonal that a causal mask would hide are never multiplied, in forward or in backward.
The saved probabilities still have the full (T, T) shape: their upper triangle is zeros,
written once.

Dropout (dropout_p > 0 while training) drops probabilities after the softmax, as
nn.Dropout after masked_softmax does: y = (P * keep / (1 - p)) @ v. Its mask is the
counter-based one of attention.py (a hash of one seed and each score's flat index), so it
is rebuilt from the seed in backward and no (T, T) mask is saved. It is not the stream
F.dropout draws (that one saves its bool mask): the same seed gives the same mask as
scaled_dot_product_attention's.
"""

from __future__ import annotations

import math

from .. import backend
from .. import shape as shp
from ..autograd import Function
from ..autograd.graph import recording
from ..creation import default_generator
from ..errors import ShapeError
from ._recorded import constant
from ._util import Tensor, check_same_device, from_array, unbroadcast
from .attention import ScaledDotProductAttention, _dropout_keep, _mix
from .registry import op

# query rows per block; a T at or under FULL_PRODUCT_T is one block: the whole product,
# where the skipped tiles are fewer than the extra calls cost (benchmarks/attention_tiles.py)
DEFAULT_BLOCK_SIZE = 32
FULL_PRODUCT_T = 64


def _row_blocks(T: int, bs: int):
    """(i0, i1) of each block of query rows."""
    return [(i0, min(i0 + bs, T)) for i0 in range(0, T, bs)]


def _future(xp, T: int):
    """(T, T) bool, True above the diagonal: the keys a query may not see."""
    return xp.triu(xp.ones((T, T), dtype=bool), 1)


class CausalAttention(Function):
    """y = (P * z) v, P = softmax(q k^T * scale) under a causal mask, z the dropout's
    keep / (1 - p) (1 without dropout);  dv = (P z)^T g, dP = (g v^T) z,
    dS = P * (dP - rowsum(P * dP)), dq = scale dS k, dk = scale dS^T q.

    Saves q, k, v and the probabilities P (..., T, T), upper triangle zeros: backward needs
    P and the three inputs; recomputing P would cost the forward's GEMM again. These are
    the bytes the composition it replaces saved (its matmuls kept q, k, v and the softmax's
    output). Dropout saves only its seed (an int on ctx), from which backward rebuilds each
    tile's mask. Each product runs over the kept tiles only: query rows [i0, i1) against
    keys [0, i1). Under create_graph=True the backward runs whole-matrix formulas on
    recorded arrays, with P recomputed from q and k so that its derivative flows.
    """

    flops = ScaledDotProductAttention.flops  # the full products: torch's causal sdpa count

    @staticmethod
    def forward(ctx, q, k, v, scale, block_size, dropout=None):
        xp = backend.xp_for(q.device)
        Q, K, V = q._array(), k._array(), v._array()
        T = Q.shape[-2]
        batch = shp.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2])
        KT = xp.swapaxes(K, -1, -2)
        blocks = _row_blocks(T, block_size)
        if len(blocks) <= 1:  # the whole product: no tile to skip
            P = backend.matmul(xp, Q, KT)
            backend.kernels.causal_softmax_block(P, P, scale)  # the scores become P in place
            if P.shape != batch + (T, T):
                P = xp.ascontiguousarray(xp.broadcast_to(P, batch + (T, T)))
        else:
            P = xp.empty(batch + (T, T), dtype=Q.dtype)
            for i0, i1 in blocks:
                s = backend.matmul(xp, Q[..., i0:i1, :], KT[..., :i1])  # (..., bq, i1)
                # rows [i0, i1) of P: the softmax of each query's keys [0, i], then zeros
                # to T (the hidden future: written once, never multiplied)
                backend.kernels.causal_softmax_block(s, P, scale)
        Y = xp.empty(batch + (T, V.shape[-1]), dtype=Q.dtype)
        for i0, i1 in blocks:
            p = P[..., i0:i1, :i1]
            if dropout is not None:
                p = p * _keep_scaled(xp, dropout, batch, T, i0, i1, p.dtype)
            Y[..., i0:i1, :] = backend.matmul(xp, p, V[..., :i1, :])
        ctx.scale, ctx.block_size, ctx.dropout = scale, block_size, dropout
        ctx.shapes = (q.shape, k.shape, v.shape)
        ctx.save_for_backward(q, k, v, from_array(P))
        return from_array(Y)

    @staticmethod
    def backward(ctx, g):
        q, k, v, p_saved = ctx.saved_tensors
        if recording():
            return _recorded_backward(ctx, q, k, v, g)
        xp = backend.xp_for(g.device)
        Q, K, V, P, G = q._array(), k._array(), v._array(), p_saved._array(), g._array()
        T = Q.shape[-2]
        batch = P.shape[:-2]
        scale, drop = ctx.scale, ctx.dropout
        nq, nk, nv = ctx.needs_input_grad[:3]
        dQ = xp.empty(batch + Q.shape[-2:], dtype=Q.dtype) if nq else None
        dK = xp.zeros(batch + K.shape[-2:], dtype=Q.dtype) if nk else None
        dV = xp.zeros(batch + V.shape[-2:], dtype=Q.dtype) if nv else None
        VT = xp.swapaxes(V, -1, -2)
        for i0, i1 in _row_blocks(T, ctx.block_size):
            g_blk = G[..., i0:i1, :]
            p = P[..., i0:i1, :i1]  # this block's probabilities (a view)
            dp = backend.matmul(xp, g_blk, VT[..., :i1])  # (..., bq, i1): g v^T
            if drop is not None:
                z = _keep_scaled(xp, drop, batch, T, i0, i1, p.dtype)
                dp *= z
                pz = p * z
                del z
            else:
                pz = p
            if nv:
                dV[..., :i1, :] += backend.matmul(xp, xp.swapaxes(pz, -1, -2), g_blk)
            del pz
            if not (nq or nk):
                continue
            backend.kernels.causal_softmax_block_backward(dp, P, scale)  # dp: scale * dS
            ds = dp
            if nq:
                dQ[..., i0:i1, :] = backend.matmul(xp, ds, K[..., :i1, :])
            if nk:
                dK[..., :i1, :] += backend.matmul(xp, xp.swapaxes(ds, -1, -2),
                                                  Q[..., i0:i1, :])
        return tuple(None if d is None else unbroadcast(from_array(d), shape)
                     for d, shape in zip((dQ, dK, dV), ctx.shapes))


def _keep_scaled(xp, drop, batch, T, i0, i1, dtype):
    """The dropout's keep / (1 - p) over query rows [i0, i1), keys [0, i1): (..., bq, i1)."""
    keep = _dropout_keep(xp, drop, batch, T, T, i0, i1, 0, i1)
    return keep * dtype.type(drop[2])


def _recorded_backward(ctx, q, k, v, g):
    """The backward under create_graph=True, on recorded arrays, over whole (T, T) matrices
    (the recorded graph holds them anyway): P is recomputed from q and k by the same masked
    softmax (its saved copy has no graph to q and k), then the first-order formulas."""
    xp = backend.xp_for(g.device)
    Q, K, V, G = q._array(), k._array(), v._array(), g._array()
    T = Q.shape[-2]
    batch = shp.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2])
    S = backend.matmul(xp, Q, xp.swapaxes(K, -1, -2))
    P = backend.kernels.masked_softmax_forward(S, _future(xp, T), ctx.scale)
    dP = backend.matmul(xp, G, xp.swapaxes(V, -1, -2))
    PZ = P
    if ctx.dropout is not None:
        Z = constant(_keep_scaled(xp, ctx.dropout, batch, T, 0, T, Q.dtype))
        dP = dP * Z
        PZ = P * Z
    dS = backend.kernels.masked_softmax_backward(P, dP, ctx.scale, False)
    grads = (backend.matmul(xp, dS, K),
             backend.matmul(xp, xp.swapaxes(dS, -1, -2), Q),
             backend.matmul(xp, xp.swapaxes(PZ, -1, -2), G))
    return tuple(unbroadcast(from_array(d), shape) if needed else None
                 for d, shape, needed in zip(grads, ctx.shapes, ctx.needs_input_grad))


def _dropout_seed(p: float, generator, device: str) -> tuple:
    """(seed, threshold, scale) of one call's dropout mask: the seed is one draw of the
    generator (the engine's by default), so manual_seed fixes the mask."""
    gen = generator or default_generator
    drawn = int(gen.integers(0, 2**62, (), backend.int64, device))
    return _mix(drawn), min(round(p * 2**53), 2**53), 1.0 / (1.0 - p)


@op(CausalAttention, functional=True)
def causal_attention(q: Tensor, k: Tensor, v: Tensor, scale: float | None = None,
                     dropout_p: float = 0.0, training: bool = True, generator=None,
                     block_size: int | None = None) -> Tensor:
    """dropout(softmax(q k^T * scale with the future masked)) v, as one node that
    materializes the (..., T, T) probabilities (the GPT's "views" attention; torch's math
    scaled_dot_product_attention(q, k, v, is_causal=True) computes the same).

    q, k: (..., T, D), v: (..., T, Dv), their leading dims broadcast (a grouped-query
    attention's k and v may have a size-1 group dim). scale defaults to 1 / sqrt(D).
    Dropout acts while `training` and dropout_p > 0, with a mask drawn from `generator`
    (the engine's by default). block_size: query rows per block of scores (default 32;
    T <= 64 runs as one block, the whole product). Causal only: for another mask, compose
    masked_softmax, or call scaled_dot_product_attention.
    """
    check_same_device("causal_attention", q, k, v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if type(t) is not Tensor:
            raise TypeError(f"causal_attention: {name} must be a Tensor, got "
                            f"{type(t).__name__}")
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise ShapeError(f"causal_attention: q, k, v need (..., T, D) shapes; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    T = q.shape[-2]
    if k.shape[-2] != T or v.shape[-2] != T or k.shape[-1] != q.shape[-1]:
        raise ShapeError(f"causal_attention: shapes q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)} do not fit (need q, k (..., T, D), "
                         "v (..., T, Dv): self-attention, one T)")
    try:
        shp.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ShapeError:
        raise ShapeError(f"causal_attention: the leading dims of q {tuple(q.shape)}, k "
                         f"{tuple(k.shape)} and v {tuple(v.shape)} do not broadcast") from None
    if not (q.dtype is k.dtype is v.dtype) or not q.dtype.is_floating_point:
        raise RuntimeError(f"causal_attention: expected floating q, k and v of one dtype, "
                           f"got {q.dtype.name}, {k.dtype.name} and {v.dtype.name}")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"causal_attention: dropout probability must be in [0, 1], got "
                         f"{dropout_p}")
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(
            block_size, int) or block_size <= 0):
        raise ValueError(f"causal_attention: block_size must be a positive int, got "
                         f"{block_size!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0
    bs = block_size or (max(T, 1) if T <= FULL_PRODUCT_T else DEFAULT_BLOCK_SIZE)
    if training and dropout_p == 1.0:  # every probability dropped
        return CausalAttention.apply(q, k, v, float(scale), bs) * 0.0
    if training and dropout_p > 0.0:
        return CausalAttention.apply(q, k, v, float(scale), bs,
                                     dropout=_dropout_seed(dropout_p, generator, q.device))
    return CausalAttention.apply(q, k, v, float(scale), bs)
