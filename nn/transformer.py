"""nn.Transformer and its layers, with torch's arguments, behaviour and state-dict names.

Read top to bottom: the helpers, the encoder layer, the decoder layer, the stacks, the
Transformer. Every attention inside is an nn.MultiheadAttention called with
need_weights=False, so it runs the engine's blocked attention op.
"""

from __future__ import annotations

import copy

import tinygrad_attn as ta

from . import functional as F
from . import init
from .attention import MultiheadAttention
from .layers import Dropout, LayerNorm, Linear
from .module import Module, ModuleList


def _activation(activation):
    """"relu", "gelu" or a callable (a Module is kept as a submodule, as torch's)."""
    if isinstance(activation, str):
        if activation == "relu":
            return F.relu
        if activation == "gelu":
            return F.gelu
        raise RuntimeError(f"activation should be relu/gelu, not {activation}")
    if not callable(activation):
        raise RuntimeError(f"activation should be relu/gelu or a callable, not {activation!r}")
    return activation


def _clones(module: Module, n: int) -> ModuleList:
    return ModuleList([copy.deepcopy(module) for _ in range(n)])


def generate_square_subsequent_mask(sz: int, device=None, dtype=None) -> ta.Tensor:
    """(sz, sz) float mask: 0 on and below the diagonal, -inf above (a query may not see
    later keys)."""
    if dtype == ta.bool:  # torch's -inf cast to bool: True above the diagonal
        return ta.ones(sz, sz, dtype=ta.bool, device=device).triu(1)
    full = ta.full((sz, sz), float("-inf"), dtype=dtype or ta.float32, device=device)
    return full.triu(1)


def _detect_is_causal_mask(mask, is_causal, size=None) -> bool:
    """torch's rule: an explicit is_causal wins; otherwise a mask equal to the square
    subsequent mask counts as causal (so the causal kernel may stand in for it)."""
    if is_causal is None and mask is not None:
        sz = size if size is not None else mask.shape[-2]
        if tuple(mask.shape) != (sz, sz):
            return False
        causal = generate_square_subsequent_mask(sz, device=mask.device, dtype=mask.dtype)
        return bool((mask == causal).all())
    return bool(is_causal)


def _seq_len(x, batch_first: bool) -> int:
    return x.shape[1 if batch_first and x.ndim == 3 else 0]


class TransformerEncoderLayer(Module):
    """Self-attention and a feed-forward block, each with a residual and a LayerNorm.

    norm_first=False (torch's default): x = norm1(x + sa(x)); x = norm2(x + ff(x)).
    norm_first=True: x = x + sa(norm1(x)); x = x + ff(norm2(x)). ff(x) = linear2(dropout(
    activation(linear1(x)))). Names: self_attn, linear1, dropout, linear2, norm1, norm2,
    dropout1, dropout2 (and activation, if it is a Module).

    Saved bytes: the self-attention saves what nn.MultiheadAttention does with
    need_weights=False (q, k, v, the output and a row logsumexp: no (S, S) weights); the
    rest is what Linear, LayerNorm, the activation and dropout save (their inputs, the
    normalization statistics, bool masks).
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation(activation)
        if device is not None or dtype is not None:
            self.to(*(a for a in (device, dtype) if a is not None))

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout2(x)


class TransformerDecoderLayer(Module):
    """Self-attention, attention over the encoder's memory, and a feed-forward block.

    norm_first=False: x = norm1(x + sa(x)); x = norm2(x + mha(x, memory));
    x = norm3(x + ff(x)); norm_first=True puts each norm before its block. Names:
    self_attn, multihead_attn, linear1, dropout, linear2, norm1..3, dropout1..3.

    Saved bytes: each of the two attentions saves what nn.MultiheadAttention does with
    need_weights=False (its q, k, v, output and row logsumexp, never the (T, S) weights);
    the rest is what Linear, LayerNorm, the activation and dropout save.
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                 batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = _activation(activation)
        if device is not None or dtype is not None:
            self.to(*(a for a in (device, dtype) if a is not None))

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool = False,
                memory_is_causal: bool = False):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask,
                                   tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask,
                                    memory_key_padding_mask, memory_is_causal)
            return x + self._ff_block(self.norm3(x))
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask,
                                           memory_is_causal))
        return self.norm3(x + self._ff_block(x))

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           is_causal=is_causal, need_weights=False)[0]
        return self.dropout1(x)

    def _mha_block(self, x, mem, attn_mask, key_padding_mask, is_causal):
        x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask,
                                key_padding_mask=key_padding_mask, is_causal=is_causal,
                                need_weights=False)[0]
        return self.dropout2(x)

    def _ff_block(self, x):
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout3(x)


class TransformerEncoder(Module):
    """num_layers copies of an encoder layer (layers.0, layers.1, ...), then `norm`.

    enable_nested_tensor and mask_check are accepted and change nothing: the engine has no
    nested tensors, so padded positions are computed like any other (torch's eval-mode fast
    path returns 0 there). Saved bytes: those of each layer (see TransformerEncoderLayer).
    """

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm=None,
                 enable_nested_tensor: bool = True, mask_check: bool = True) -> None:
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers, self.norm = num_layers, norm
        self.enable_nested_tensor, self.mask_check = enable_nested_tensor, mask_check

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        batch_first = self.layers[0].self_attn.batch_first if len(self.layers) else False
        is_causal = _detect_is_causal_mask(mask, is_causal, _seq_len(src, batch_first))
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=is_causal,
                      src_key_padding_mask=src_key_padding_mask)
        return x if self.norm is None else self.norm(x)


class TransformerDecoder(Module):
    """num_layers copies of a decoder layer (layers.0, ...), then `norm`. Saved bytes:
    those of each layer (see TransformerDecoderLayer)."""

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int,
                 norm=None) -> None:
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers, self.norm = num_layers, norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None,
                memory_is_causal: bool = False):
        batch_first = self.layers[0].self_attn.batch_first if len(self.layers) else False
        tgt_is_causal = _detect_is_causal_mask(tgt_mask, tgt_is_causal,
                                               _seq_len(tgt, batch_first))
        x = tgt
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      tgt_key_padding_mask=tgt_key_padding_mask,
                      memory_key_padding_mask=memory_key_padding_mask,
                      tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)
        return x if self.norm is None else self.norm(x)


class Transformer(Module):
    """An encoder-decoder Transformer as torch's: encoder (TransformerEncoder with a final
    LayerNorm), decoder (TransformerDecoder likewise); every weight matrix re-initialised
    with xavier_uniform_. forward(src, tgt, ...) -> (T, N, E) (batch_first: (N, T, E)).

    Saved bytes: those of the encoder and decoder layers (see their docstrings); no
    attention keeps its (T, S) weights.
    """

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", custom_encoder=None,
                 custom_decoder=None, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        layer_args = dict(dim_feedforward=dim_feedforward, dropout=dropout,
                          activation=activation, layer_norm_eps=layer_norm_eps,
                          batch_first=batch_first, norm_first=norm_first, bias=bias)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            layer = TransformerEncoderLayer(d_model, nhead, **layer_args)
            self.encoder = TransformerEncoder(
                layer, num_encoder_layers, LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            layer = TransformerDecoderLayer(d_model, nhead, **layer_args)
            self.decoder = TransformerDecoder(
                layer, num_decoder_layers, LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first
        if device is not None or dtype is not None:
            self.to(*(a for a in (device, dtype) if a is not None))

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal: bool = False):
        batched = src.ndim == 3
        if batched and src.shape[0 if self.batch_first else 1] != tgt.shape[
                0 if self.batch_first else 1]:
            raise RuntimeError(f"Transformer: the batch number of src and tgt must be equal; "
                               f"got src {tuple(src.shape)}, tgt {tuple(tgt.shape)} "
                               f"(batch_first={self.batch_first})")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise RuntimeError(f"Transformer: the feature number of src and tgt must be equal "
                               f"to d_model ({self.d_model}); got src {tuple(src.shape)}, "
                               f"tgt {tuple(tgt.shape)}")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device=None, dtype=None) -> ta.Tensor:
        """(sz, sz) float mask: 0 on and below the diagonal, -inf above."""
        return generate_square_subsequent_mask(sz, device=device, dtype=dtype)
