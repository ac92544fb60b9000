"""nn.MultiheadAttention and F.multi_head_attention_forward, as torch's: parameters,
state-dict names, masks and shapes.

Attention itself is the engine's: F.scaled_dot_product_attention when the weights are not
asked for (need_weights=False, what the Transformer layers use), an explicit softmax of the
(L, S) scores per head when they are. Read top to bottom: mask handling, the projections,
the functional form, the module (its parameters, then forward through the functional).
"""

from __future__ import annotations

import math

import tinygrad_attn as ta

from . import functional as F
from . import init
from .layers import Linear
from .module import Module, Parameter


def _canonical_mask(mask, name: str, dtype):
    """A bool mask (True = masked out) becomes an additive float mask of -inf and 0 in
    `dtype`, as torch's; a float mask is used as it is; anything else is refused."""
    if mask is None:
        return None
    if mask.dtype == ta.bool:
        return ta.zeros(*mask.shape, dtype=dtype, device=mask.device).masked_fill(
            mask, float("-inf"))
    if not mask.is_floating_point():
        raise AssertionError(f"MultiheadAttention: only bool and floating types of {name} are "
                             f"supported, got {mask.dtype} (shape {tuple(mask.shape)})")
    return mask


def _check_shapes(query, key, value, key_padding_mask, attn_mask, num_heads) -> bool:
    """torch's rules for batched (3-D) and unbatched (2-D) inputs; True when batched."""
    def shapes():
        return (f"query {tuple(query.shape)}, key {tuple(key.shape)}, value "
                f"{tuple(value.shape)}")
    if query.ndim == 3:
        if key.ndim != 3 or value.ndim != 3:
            raise AssertionError("MultiheadAttention: for batched (3-D) query, expected key "
                                 f"and value to be 3-D; got {shapes()}")
        if key_padding_mask is not None and key_padding_mask.ndim != 2:
            raise AssertionError("MultiheadAttention: for batched (3-D) query, expected "
                                 "key_padding_mask to be None or 2-D, got shape "
                                 f"{tuple(key_padding_mask.shape)}")
        if attn_mask is not None and attn_mask.ndim not in (2, 3):
            raise AssertionError("MultiheadAttention: for batched (3-D) query, expected "
                                 f"attn_mask to be None, 2-D or 3-D, got shape "
                                 f"{tuple(attn_mask.shape)}")
        return True
    if query.ndim == 2:
        if key.ndim != 2 or value.ndim != 2:
            raise AssertionError("MultiheadAttention: for unbatched (2-D) query, expected key "
                                 f"and value to be 2-D; got {shapes()}")
        if key_padding_mask is not None and key_padding_mask.ndim != 1:
            raise AssertionError("MultiheadAttention: for unbatched (2-D) query, expected "
                                 "key_padding_mask to be None or 1-D, got shape "
                                 f"{tuple(key_padding_mask.shape)}")
        if attn_mask is not None and (attn_mask.ndim not in (2, 3) or (
                attn_mask.ndim == 3 and attn_mask.shape[0] != num_heads)):
            raise AssertionError("MultiheadAttention: for unbatched (2-D) query, expected "
                                 f"attn_mask of shape (L, S) or (num_heads={num_heads}, L, S), "
                                 f"got {tuple(attn_mask.shape)}")
        return False
    raise AssertionError(f"MultiheadAttention: query should be unbatched 2-D or batched 3-D, "
                         f"got {query.ndim}-D ({shapes()})")


def _heads(x, n_heads: int):
    """(T, N, E) -> (N, nh, T, hs): a view (E splits into (nh, hs), then a permute)."""
    T, N, E = x.shape
    return x.reshape(T, N, n_heads, E // n_heads).permute(1, 2, 0, 3)


def _zero_column(mask):
    """The additive mask with one more key column, of 0 (an appended key anyone may see)."""
    if mask is None:
        return None
    pad = ta.zeros(*mask.shape[:-1], 1, dtype=mask.dtype, device=mask.device)
    return ta.cat([mask, pad], dim=-1)


def _in_projection(query, key, value, E, in_proj_weight, in_proj_bias, separate):
    """q, k, v = the input projections, (L, N, E), (S, N, E), (S, N, E)."""
    b = in_proj_bias
    b_q, b_k, b_v = (None, None, None) if b is None else b.split(E)
    if separate is not None:
        w_q, w_k, w_v = separate
        return F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
    w = in_proj_weight
    if query is key and key is value:  # self-attention: one GEMM, three views of it
        return F.linear(query, w, b).split(E, dim=-1)
    w_q, w_k, w_v = w.split(E)  # views: backward assembles one gradient of w
    return F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)


def _attention_mask(attn_mask, key_padding_mask, is_causal, need_weights, L, S, N, nh, dtype):
    """torch's mask rules: (the additive attn_mask as (1 or N, 1 or nh, L, S) or None, the
    additive padding mask (N, S) or None, whether the causal kernel stands in for the
    mask)."""
    key_padding_mask = _canonical_mask(key_padding_mask, "key_padding_mask", dtype)
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (N, S):
        raise AssertionError(f"multi_head_attention_forward: expecting key_padding_mask shape "
                             f"of {(N, S)}, but got {tuple(key_padding_mask.shape)}")
    if is_causal and attn_mask is None:
        raise RuntimeError("multi_head_attention_forward: need attn_mask if specifying the "
                           "is_causal hint; Transformer.generate_square_subsequent_mask(sz) "
                           "makes one")
    if is_causal and key_padding_mask is None and not need_weights:
        return None, None, True  # the causal kernel stands in for the mask
    attn_mask = _canonical_mask(attn_mask, "attn_mask", dtype)
    if attn_mask is not None:
        if attn_mask.ndim == 2:
            if tuple(attn_mask.shape) != (L, S):
                raise RuntimeError(f"multi_head_attention_forward: the shape of the 2D "
                                   f"attn_mask is {tuple(attn_mask.shape)}, but should be "
                                   f"{(L, S)}")
            attn_mask = attn_mask.reshape(1, 1, L, S)
        elif tuple(attn_mask.shape) == (N * nh, L, S):
            attn_mask = attn_mask.reshape(N, nh, L, S)
        else:
            raise RuntimeError(f"multi_head_attention_forward: the shape of the 3D attn_mask "
                               f"is {tuple(attn_mask.shape)}, but should be {(N * nh, L, S)}")
    return attn_mask, key_padding_mask, False


def multi_head_attention_forward(
        query, key, value, embed_dim_to_check: int, num_heads: int, in_proj_weight,
        in_proj_bias, bias_k, bias_v, add_zero_attn: bool, dropout_p: float, out_proj_weight,
        out_proj_bias, training: bool = True, key_padding_mask=None, need_weights: bool = True,
        attn_mask=None, use_separate_proj_weight: bool = False, q_proj_weight=None,
        k_proj_weight=None, v_proj_weight=None, static_k=None, static_v=None,
        average_attn_weights: bool = True, is_causal: bool = False):
    """torch.nn.functional.multi_head_attention_forward: (L, N, E) inputs (or unbatched
    (L, E)) -> (attn_output (L, N, E), attn_weights or None).

    need_weights=False runs F.scaled_dot_product_attention on head views of the
    projections (it saves q, k, v, its output and a row logsumexp, never the (L, S)
    weights); need_weights=True forms the weights, (N, nh, L, S), averaged over the heads
    by default. static_k / static_v, if given, are the keys / values (N * nh, S, hs).
    """
    batched = _check_shapes(query, key, value, key_padding_mask, attn_mask, num_heads)
    if not batched:
        q_in = query.unsqueeze(1)
        k_in = q_in if key is query else key.unsqueeze(1)
        v_in = k_in if value is key else value.unsqueeze(1)
        query, key, value = q_in, k_in, v_in
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    L, N, E = query.shape
    S = key.shape[0]
    nh = num_heads
    hs = E // nh
    if E != embed_dim_to_check:
        raise AssertionError(f"multi_head_attention_forward: was expecting embedding "
                             f"dimension of {embed_dim_to_check}, but got {E} (query "
                             f"{tuple(query.shape)})")
    if hs * nh != E:
        raise AssertionError(f"multi_head_attention_forward: embed_dim {E} not divisible by "
                             f"num_heads {nh}")
    if key.shape[:2] != value.shape[:2] or (not use_separate_proj_weight
                                            and key.shape != value.shape):
        raise AssertionError(f"multi_head_attention_forward: key shape {tuple(key.shape)} "
                             f"does not match value shape {tuple(value.shape)}")
    attn_mask, key_padding_mask, is_causal = _attention_mask(
        attn_mask, key_padding_mask, is_causal, need_weights, L, S, N, nh, query.dtype)

    separate = ((q_proj_weight, k_proj_weight, v_proj_weight) if use_separate_proj_weight
                else None)
    q, k, v = _in_projection(query, key, value, E, in_proj_weight, in_proj_bias, separate)
    if bias_k is not None and bias_v is not None:  # one more key and value, learned
        if static_k is not None or static_v is not None:
            raise AssertionError("multi_head_attention_forward: bias cannot be added to "
                                 "static key or value")
        k = ta.cat([k, bias_k.expand(1, N, E)])
        v = ta.cat([v, bias_v.expand(1, N, E)])
        attn_mask, key_padding_mask = _zero_column(attn_mask), _zero_column(key_padding_mask)
    q = _heads(q, nh)  # (N, nh, L, hs)
    k = _heads(k, nh) if static_k is None else static_k.reshape(N, nh, -1, hs)
    v = _heads(v, nh) if static_v is None else static_v.reshape(N, nh, -1, hs)
    if add_zero_attn:  # one more key and value, of zeros
        zeros = ta.zeros(N, nh, 1, hs, dtype=q.dtype, device=q.device)
        k, v = ta.cat([k, zeros], dim=2), ta.cat([v, zeros], dim=2)
        attn_mask, key_padding_mask = _zero_column(attn_mask), _zero_column(key_padding_mask)
    if key_padding_mask is not None:
        padding = key_padding_mask.reshape(N, 1, 1, key_padding_mask.shape[-1])
        attn_mask = padding if attn_mask is None else attn_mask + padding
    p = dropout_p if training else 0.0

    if not need_weights:
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p,
                                           is_causal=is_causal)  # (N, nh, L, hs)
        weights = None
    else:
        scores = (q * (1.0 / math.sqrt(hs))) @ k.mT  # (N, nh, L, S')
        if attn_mask is not None:
            scores = scores + attn_mask
        weights = F.softmax(scores, dim=-1)
        if p > 0:
            weights = F.dropout(weights, p)
        y = weights @ v
        if average_attn_weights:
            weights = weights.mean(dim=1)
    # merge the heads: the attention kernel lays its output out heads-innermost, (N, L, nh,
    # hs) in memory, so (L, N, E) is a strided view, no copy; out_proj's GEMM reads it
    # through its strides and writes a contiguous (L, N, E)
    y = y.permute(2, 0, 1, 3).reshape(L, N, E)
    out = F.linear(y, out_proj_weight, out_proj_bias)
    if not batched:
        return out.squeeze(1), (None if weights is None else weights.squeeze(0))
    return out, weights


class MultiheadAttention(Module):
    """Multi-head attention with torch's parameters and behaviour.

    Parameters: in_proj_weight (3E, E) and in_proj_bias (3E) for q, k, v, or
    q_proj_weight (E, E), k_proj_weight (E, kdim), v_proj_weight (E, vdim) when kdim or
    vdim differ from embed_dim; out_proj (a Linear); bias_k, bias_v (1, 1, E) with
    add_bias_kv. Init as torch's: xavier_uniform_ projections, zero biases,
    xavier_normal_ bias_k/bias_v.

    forward(query, key, value, key_padding_mask, need_weights, attn_mask,
    average_attn_weights, is_causal) -> (attn_output, attn_weights or None). Inputs are
    (L, N, E) (batch_first: (N, L, E)) or unbatched (L, E). Masks as torch's: bool True
    (or -inf) means "may not attend"; attn_mask (L, S) or (N * num_heads, L, S);
    key_padding_mask (N, S). is_causal is a hint that attn_mask is causal (torch requires
    the mask too); without a padding mask and need_weights=False it runs the causal
    kernel instead of reading the mask. forward is multi_head_attention_forward on the
    module's parameters; with batch_first the output is a transposed view of the (L, N, E)
    result, as torch's.

    Saved bytes: the projections are Linears (matmul saves its inputs). With
    need_weights=False the heads are views of the projections and attention is one
    F.scaled_dot_product_attention call, which saves q, k, v, its output and one
    logsumexp per query row, never the (L, S) weights (dropout adds no saved tensor: its
    mask is rebuilt from a seed in backward). need_weights=True forms the (N, nh, L, S)
    weights, which softmax saves (its output), and dropout a bool mask of that size.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim=None, vdim=None,
                 batch_first: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got "
                             f"embed_dim={embed_dim} and num_heads={num_heads} instead")
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads, self.dropout, self.batch_first = num_heads, dropout, batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise AssertionError(f"MultiheadAttention: embed_dim must be divisible by num_heads "
                                 f"(embed_dim={embed_dim}, num_heads={num_heads})")
        E = embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(ta.empty(3 * E, E))
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.q_proj_weight = Parameter(ta.empty(E, E))
            self.k_proj_weight = Parameter(ta.empty(E, self.kdim))
            self.v_proj_weight = Parameter(ta.empty(E, self.vdim))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(ta.empty(3 * E))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(E, E, bias=bias)
        if add_bias_kv:
            self.bias_k = Parameter(ta.empty(1, 1, E))
            self.bias_v = Parameter(ta.empty(1, 1, E))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()
        if device is not None or dtype is not None:
            self.to(*(a for a in (device, dtype) if a is not None))

    def _reset_parameters(self) -> None:
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
            init.xavier_normal_(self.bias_v)

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        batched = query.ndim == 3
        if self.batch_first and batched:  # (N, L, E) -> (L, N, E), keeping q is k is v
            q_in = query.transpose(1, 0)
            k_in = q_in if key is query else key.transpose(1, 0)
            v_in = k_in if value is key else value.transpose(1, 0)
            query, key, value = q_in, k_in, v_in
        separate = not self._qkv_same_embed_dim
        out, weights = multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, self.in_proj_weight,
            self.in_proj_bias, self.bias_k, self.bias_v, self.add_zero_attn, self.dropout,
            self.out_proj.weight, self.out_proj.bias, training=self.training,
            key_padding_mask=key_padding_mask, need_weights=need_weights,
            attn_mask=attn_mask, use_separate_proj_weight=separate,
            q_proj_weight=self.q_proj_weight, k_proj_weight=self.k_proj_weight,
            v_proj_weight=self.v_proj_weight, average_attn_weights=average_attn_weights,
            is_causal=is_causal)
        if self.batch_first and batched:
            out = out.transpose(1, 0)  # a view of (L, N, E), as torch's
        return out, weights

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}")
