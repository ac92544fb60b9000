"""nn.MultiheadAttention: torch's module, parameters, state-dict names, masks and shapes.

Attention itself is the engine's: F.scaled_dot_product_attention when the weights are not
asked for (need_weights=False, what the Transformer layers use), an explicit softmax of the
(L, S) scores per head when they are. Read top to bottom: mask handling, the projections,
the module.
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
        if attn_mask is not None:
            want = (key.shape[0],) if attn_mask.ndim == 2 else (num_heads,)
            if attn_mask.ndim not in (2, 3) or (attn_mask.ndim == 3
                                                and attn_mask.shape[0] != num_heads):
                raise AssertionError("MultiheadAttention: for unbatched (2-D) query, expected "
                                     f"attn_mask of shape (L, S) or ({want[0]}, L, S), got "
                                     f"{tuple(attn_mask.shape)}")
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
    kernel instead of reading the mask.

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

    # ------------------------------------------------------------------ projections
    def _project(self, query, key, value):
        """q, k, v = the input projections, (L, N, E), (S, N, E), (S, N, E)."""
        E, b = self.embed_dim, self.in_proj_bias
        b_q, b_k, b_v = (None, None, None) if b is None else b.split(E)
        if not self._qkv_same_embed_dim:
            return (F.linear(query, self.q_proj_weight, b_q),
                    F.linear(key, self.k_proj_weight, b_k),
                    F.linear(value, self.v_proj_weight, b_v))
        w = self.in_proj_weight
        if query is key and key is value:  # self-attention: one GEMM, three views of it
            return F.linear(query, w, b).split(E, dim=-1)
        w_q, w_k, w_v = w.split(E)
        return F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)

    # ------------------------------------------------------------------ forward
    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        batched = _check_shapes(query, key, value, key_padding_mask, attn_mask,
                                self.num_heads)
        if self.batch_first and batched:  # (N, L, E) -> (L, N, E), keeping q is k is v
            q_in = query.transpose(1, 0)
            k_in = q_in if key is query else key.transpose(1, 0)
            v_in = k_in if value is key else value.transpose(1, 0)
            query, key, value = q_in, k_in, v_in
        if not batched:
            q_in = query.unsqueeze(1)
            k_in = q_in if key is query else key.unsqueeze(1)
            v_in = k_in if value is key else value.unsqueeze(1)
            query, key, value = q_in, k_in, v_in
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        out, weights = self._attend(query, key, value, key_padding_mask, need_weights,
                                    attn_mask, average_attn_weights, is_causal)
        if not batched:
            return out.squeeze(1), (None if weights is None else weights.squeeze(0))
        if self.batch_first:
            out = out.transpose(1, 0)
        return out, weights

    def _attend(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                average_attn_weights, is_causal):
        """torch's multi_head_attention_forward on (L, N, E) inputs."""
        L, N, E = query.shape
        S = key.shape[0]
        nh = self.num_heads
        if E != self.embed_dim:
            raise AssertionError(f"MultiheadAttention: was expecting embedding dimension of "
                                 f"{self.embed_dim}, but got {E} (query {tuple(query.shape)})")
        if key.shape[:2] != value.shape[:2] or (self._qkv_same_embed_dim
                                                and key.shape != value.shape):
            raise AssertionError(f"MultiheadAttention: key shape {tuple(key.shape)} does not "
                                 f"match value shape {tuple(value.shape)}")
        key_padding_mask = _canonical_mask(key_padding_mask, "key_padding_mask", query.dtype)
        if key_padding_mask is not None and tuple(key_padding_mask.shape) != (N, S):
            raise AssertionError(f"MultiheadAttention: expecting key_padding_mask shape of "
                                 f"{(N, S)}, but got {tuple(key_padding_mask.shape)}")
        if is_causal and attn_mask is None:
            raise RuntimeError("MultiheadAttention: need attn_mask if specifying the is_causal "
                               "hint; Transformer.generate_square_subsequent_mask(sz) makes "
                               "one")
        if is_causal and key_padding_mask is None and not need_weights:
            attn_mask = None  # the causal kernel stands in for the mask
        else:
            attn_mask = _canonical_mask(attn_mask, "attn_mask", query.dtype)
            is_causal = is_causal and key_padding_mask is None
        if attn_mask is not None:  # -> (1 or N, 1 or nh, L, S), broadcasting to the scores
            if attn_mask.ndim == 2:
                if tuple(attn_mask.shape) != (L, S):
                    raise RuntimeError(f"MultiheadAttention: the shape of the 2D attn_mask is "
                                       f"{tuple(attn_mask.shape)}, but should be {(L, S)}")
                attn_mask = attn_mask.reshape(1, 1, L, S)
            elif tuple(attn_mask.shape) == (N * nh, L, S):
                attn_mask = attn_mask.reshape(N, nh, L, S)
            else:
                raise RuntimeError(f"MultiheadAttention: the shape of the 3D attn_mask is "
                                   f"{tuple(attn_mask.shape)}, but should be {(N * nh, L, S)}")

        q, k, v = self._project(query, key, value)
        if self.bias_k is not None:  # one more key and value, learned
            k = ta.cat([k, self.bias_k.expand(1, N, E)])
            v = ta.cat([v, self.bias_v.expand(1, N, E)])
            attn_mask, key_padding_mask = _zero_column(attn_mask), _zero_column(key_padding_mask)
        q, k, v = _heads(q, nh), _heads(k, nh), _heads(v, nh)  # (N, nh, T, hs)
        if self.add_zero_attn:  # one more key and value, of zeros
            zeros = ta.zeros(N, nh, 1, self.head_dim, dtype=q.dtype, device=q.device)
            k, v = ta.cat([k, zeros], dim=2), ta.cat([v, zeros], dim=2)
            attn_mask, key_padding_mask = _zero_column(attn_mask), _zero_column(key_padding_mask)
        if key_padding_mask is not None:
            padding = key_padding_mask.reshape(N, 1, 1, key_padding_mask.shape[-1])
            attn_mask = padding if attn_mask is None else attn_mask + padding
        p = self.dropout if self.training else 0.0

        if not need_weights:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p,
                                               is_causal=is_causal)  # (N, nh, L, hs)
            return self._merge(y, L, N), None
        scores = (q * (1.0 / math.sqrt(self.head_dim))) @ k.mT  # (N, nh, L, S')
        if attn_mask is not None:
            scores = scores + attn_mask
        weights = F.dropout(F.softmax(scores, dim=-1), p) if p > 0 else F.softmax(scores, -1)
        out = self._merge(weights @ v, L, N)
        return out, (weights.mean(dim=1) if average_attn_weights else weights)

    def _merge(self, y, L: int, N: int):
        """(N, nh, L, hs) -> out_proj -> (L, N, E).

        The attention kernel lays its output out heads-innermost, (N, L, nh, hs) in memory,
        so merging the heads is a view in either order, not a copy; out_proj's GEMM reads
        it through its strides and writes a fresh output in the order the module returns
        (batch_first: (N, L, E), else (L, N, E)), contiguous either way.
        """
        if self.batch_first:
            y = y.transpose(1, 2).reshape(N, L, self.embed_dim)  # (N, L, E)
            return self.out_proj(y).transpose(0, 1)
        y = y.permute(2, 0, 1, 3).reshape(L, N, self.embed_dim)  # (L, N, E), strided
        return self.out_proj(y)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}")
