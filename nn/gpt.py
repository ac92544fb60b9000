"""A GPT language model, shaped like nanoGPT's model.py so weights interchange by name.

Read top to bottom: attention, MLP, a transformer block, the model. Parameter names are
nanoGPT's (transformer.wte.weight, transformer.h.0.attn.c_attn.weight, lm_head.weight).
The default attention ("views") is written with views only: one split of the fused qkv
projection and transposes that are strided views, so the only copy in the block is the
explicit .contiguous() that merges the heads back. "naive" reproduces the copies of the
motivating story, "flash" the memory-efficient blocked op (see CausalSelfAttention).

Four later transformer parts are options, each off by default (the defaults are nanoGPT,
parameter for parameter and output for output): RMSNorm for LayerNorm (`norm`), rotary
position embeddings on q and k for the learned wpe table (`pos_emb`), a SwiGLU MLP for
the GELU one (`mlp`) and grouped-query attention (`n_kv_head`).
examples/gpt_options_memory.py measures what each one saves for backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tinygrad_attn as ta

from . import functional as F
from .layers import GELU, Dropout, Embedding, LayerNorm, Linear
from .module import Module, ModuleDict, ModuleList
from .norm import RMSNorm


@dataclass
class GPTConfig:
    vocab_size: int = 65
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True  # bias in Linears and LayerNorms, as GPT-2; False is a bit better
    attn: str = "views"  # "naive", "views" or "flash": see CausalSelfAttention
    # recompute Blocks in backward instead of saving their insides: True every block, False
    # none, or a tuple (a list is taken) of the block indices to recompute (() is none)
    checkpoint: bool | tuple = False
    attn_block_size: int = 128  # the query/key tile of "flash"
    norm: str = "layernorm"  # or "rmsnorm": no mean, no bias (eps 1e-5, as the LayerNorms)
    pos_emb: str = "learned"  # the wpe table; or "rope": rotary q and k, no wpe parameter
    mlp: str = "gelu"  # c_fc, GELU, c_proj; or "swiglu": w2(silu(w1 x) * w3 x)
    n_kv_head: int | None = None  # key/value heads for grouped-query attention (None: n_head)

    def __post_init__(self) -> None:
        self.checkpoint = checkpoint_blocks_field(self.checkpoint, self.n_layer)

    def checkpointed_blocks(self) -> tuple:
        """The indices of the blocks recomputed in backward."""
        if self.checkpoint is True:
            return tuple(range(self.n_layer))
        return self.checkpoint or ()


def checkpoint_blocks_field(value, n_layer: int):
    """GPTConfig.checkpoint checked: a bool as it is; a tuple or list of block indices as a
    sorted tuple (JSON gives a tuple back as a list, so a config read from a checkpoint's
    metadata compares equal to the one written)."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"GPTConfig.checkpoint must be a bool or a tuple of block indices, "
                         f"got {type(value).__name__} {value!r}")
    for i in value:
        if isinstance(i, bool) or not isinstance(i, int):
            raise ValueError(f"GPTConfig.checkpoint: block indices must be ints, got {i!r} "
                             f"in {value!r}")
        if not 0 <= i < n_layer:
            raise ValueError(f"GPTConfig.checkpoint: block index {i} is out of range for "
                             f"n_layer={n_layer} (0 to {n_layer - 1})")
    if len(set(value)) != len(value):
        raise ValueError(f"GPTConfig.checkpoint lists a block twice: {value!r}")
    return tuple(sorted(value))


ATTENTION = ("naive", "views", "flash")
NORMS = ("layernorm", "rmsnorm")
POS_EMBS = ("learned", "rope")
MLPS = ("gelu", "swiglu")
ROPE_BASE = 10000.0  # theta of RoFormer and Llama: channel pair i turns t * theta^(-2i/hs)


def _check_option(name: str, value: str, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; expected one of {allowed}")


def make_norm(config: GPTConfig) -> Module:
    """nanoGPT's LayerNorm (bias per config.bias), or an RMSNorm (a weight only)."""
    _check_option("norm", config.norm, NORMS)
    if config.norm == "rmsnorm":
        return RMSNorm(config.n_embd, eps=1e-5)
    return LayerNorm(config.n_embd, bias=config.bias)


def rope_tables(config: GPTConfig) -> tuple:
    """cos and sin of the rotary angles t * ROPE_BASE^(-2i/hs) for every position t <
    block_size and channel pair i < hs/2: two (block_size, hs/2) float32 tensors.

    Computed in float64 and rounded once. A GPT builds them once and every layer holds the
    same two tensors as non-persistent buffers (moved and cast by .to() once, left out of
    the state_dict: they are a function of the config, not weights). They are the only
    thing rotary attention saves for its backward, and, being shared, are counted once.
    """
    hs = config.n_embd // config.n_head
    if hs % 2:
        raise ValueError(f"pos_emb='rope' rotates channel pairs: the head size "
                         f"n_embd // n_head = {hs} must be even")
    pair = ta.arange(hs // 2, dtype=ta.float64)
    inv_freq = ROPE_BASE ** (pair * (-2.0 / hs))  # (hs/2,)
    t = ta.arange(config.block_size, dtype=ta.float64)
    angles = t.view(-1, 1) * inv_freq.view(1, -1)  # (block_size, hs/2)
    return ta.cos(angles).float(), ta.sin(angles).float()


def swiglu_hidden(n_embd: int) -> int:
    """The SwiGLU hidden size: Llama's 2/3 of 4 * n_embd (three matrices instead of two
    keep the parameter count near the GELU MLP's 8 n_embd^2), rounded up to a multiple of
    8. n_embd 128 -> 344, 32 -> 88."""
    hidden = int(2 * 4 * n_embd / 3)
    return 8 * ((hidden + 7) // 8)


class CausalSelfAttention(Module):
    """Multi-head causal self-attention, three ways (GPTConfig.attn):

    "naive"  the direct port of the motivating story: three slices of qkv, heads made
             with permute + contiguous() copies (as Julia's permutedims), an explicit
             additive -inf mask tensor, softmax, batched matmul, permute + copy back.
    "views"  the idiom: one split, view + transpose views fed to F.causal_attention (one
             node: scores, mask, softmax, dropout, @ v, over the causal tiles only, keeping
             the T x T probabilities); the only copy is the contiguous() that merges the heads.
    "flash"  F.scaled_dot_product_attention: one blocked op that never forms the T x T
             matrix and saves only q, k, v, the output and a logsumexp per row.
    All three compute the same function, with the same parameters.

    Options ("views" and "flash"): pos_emb="rope" rotates q and k (B, nh, T, hs) by
    F.apply_rotary_emb, which saves only the shared cos/sin tables; n_kv_head < n_head
    makes c_attn produce n_kv_head key and value heads, each read by n_head // n_kv_head
    query heads through stride-0 views (no copy of k or v).
    """

    def __init__(self, config: GPTConfig, rope: tuple | None = None) -> None:
        super().__init__()
        if config.n_embd % config.n_head != 0:
            raise ValueError(
                f"n_embd ({config.n_embd}) must be divisible by n_head ({config.n_head})"
            )
        n_kv = config.n_head if config.n_kv_head is None else config.n_kv_head
        if n_kv <= 0 or config.n_head % n_kv:
            raise ValueError(f"n_kv_head ({config.n_kv_head}) must be a positive divisor of "
                             f"n_head ({config.n_head})")
        _check_option("pos_emb", config.pos_emb, POS_EMBS)
        if config.attn == "naive" and (config.pos_emb != "learned" or n_kv != config.n_head):
            raise ValueError("attn='naive' is the story's nanoGPT port: pos_emb='rope' and "
                             "n_kv_head need attn='views' or 'flash'")
        if config.attn not in ATTENTION:
            raise ValueError(f"unknown attention implementation {config.attn!r}; "
                             f"expected one of {ATTENTION}")
        if config.attn == "flash" and config.dropout > 0:
            raise ValueError("attn='flash' has no attention dropout; use dropout=0.0 or "
                             "attn='views'")
        if config.attn == "flash" and config.attn_block_size <= 0:
            raise ValueError(f"attn_block_size must be positive, got {config.attn_block_size}")
        self.attn = config.attn
        self.attn_block_size = config.attn_block_size
        # key, query, value projections for all heads, in one matrix
        self.n_kv_head, self.kv_embd = n_kv, n_kv * (config.n_embd // config.n_head)
        self.c_attn = Linear(config.n_embd, config.n_embd + 2 * self.kv_embd, bias=config.bias)
        # output projection
        self.c_proj = Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = Dropout(config.dropout)
        self.resid_dropout = Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout
        # True above the diagonal: the future positions a token may not attend to. A buffer
        # (moved by .to()), built once, not in the state_dict (nanoGPT's is called "bias").
        bs = config.block_size
        future = ta.ones(bs, bs).tril() == 0
        self.register_buffer("mask", future.view(1, 1, bs, bs), persistent=False)
        if config.attn == "naive":  # the story's additive mask: 0 below, -inf above
            neg = ta.zeros(bs, bs).masked_fill(future, float("-inf"))
            self.register_buffer("neg_mask", neg, persistent=False)
        self.rope = config.pos_emb == "rope"
        if self.rope:  # the GPT passes one shared pair to every layer (see rope_tables)
            cos, sin = rope_tables(config) if rope is None else rope
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x):
        if self.attn == "naive":
            y = self._naive(x)
        else:
            y = self._views(x)
        # output projection
        return self.resid_dropout(self.c_proj(y))

    def _views(self, x):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)
        nh, hs = self.n_head, C // self.n_head

        nkv = self.n_kv_head
        if nkv != nh:
            return self._grouped(x)

        # one split of the fused projection: three views whose gradients fill one buffer
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        if self.rope:  # new q, k (B, nh, T, hs); backward keeps only the tables' [:T] views
            q = F.apply_rotary_emb(q, self.rope_cos[:T], self.rope_sin[:T])
            k = F.apply_rotary_emb(k, self.rope_cos[:T], self.rope_sin[:T])

        if self.attn == "flash":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               block_size=self.attn_block_size)
        else:
            # causal self-attention in one node: att = softmax(q @ k^T / sqrt(hs)) (B, nh,
            # T, T) with the future masked, dropout, then y = att @ v (B, nh, T, hs). It keeps
            # att for backward (the softmax's output, as the four ops it replaces did), and
            # multiplies only the blocks of scores that the causal mask keeps
            y = F.causal_attention(q, k, v, scale=1.0 / math.sqrt(hs),
                                   dropout_p=self.attn_dropout.p, training=self.training)
        return y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): heads side by side

    def _grouped(self, x):
        """Grouped-query attention: n_kv_head key/value heads, each shared by a group of
        g = n_head // n_kv_head query heads; query head i reads kv head i // g."""
        B, T, C = x.size()
        nh, nkv, hs = self.n_head, self.n_kv_head, C // self.n_head
        g = nh // nkv
        q, k, v = self.c_attn(x).split([C, self.kv_embd, self.kv_embd], dim=2)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = v.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        if self.rope:
            q = F.apply_rotary_emb(q, self.rope_cos[:T], self.rope_sin[:T])
            k = F.apply_rotary_emb(k, self.rope_cos[:T], self.rope_sin[:T])

        if self.attn == "flash":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                               block_size=self.attn_block_size)
        else:
            # the group as a dim of its own: q a view (B, nkv, g, T, hs), k and v given a
            # size-1 group dim that the matmuls broadcast (a stride-0 view, never a copy)
            q = q.view(B, nkv, g, T, hs)  # (B, nkv, g, T, hs)
            k, v = k.unsqueeze(2), v.unsqueeze(2)  # (B, nkv, 1, T, hs)
            y = F.causal_attention(q, k, v, scale=1.0 / math.sqrt(hs),  # (B, nkv, g, T, hs)
                                   dropout_p=self.attn_dropout.p, training=self.training)
            y = y.view(B, nh, T, hs)
        return y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): heads side by side

    def _naive(self, x):
        B, T, C = x.size()
        nh, hs = self.n_head, C // self.n_head
        qkv = self.c_attn(x)  # (B, T, 3C)
        # three slices (the story's view(qkv, 1:n_embd, :, :) ...), not one split
        q = qkv[:, :, :C]
        k = qkv[:, :, C:2 * C]
        v = qkv[:, :, 2 * C:]
        # heads by permutedims: a permute that copies, as Julia's permutedims does
        q = q.reshape(B, T, nh, hs).permute(0, 2, 1, 3).contiguous()  # (B, nh, T, hs) copy
        k = k.reshape(B, T, nh, hs).permute(0, 2, 3, 1).contiguous()  # (B, nh, hs, T) copy
        v = v.reshape(B, T, nh, hs).permute(0, 2, 1, 3).contiguous()  # (B, nh, T, hs) copy
        att = (q @ k) * (1.0 / math.sqrt(hs))  # (B, nh, T, T)
        att = att + self.neg_mask[:T, :T]  # an explicit additive -inf mask: a new T x T
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v  # (B, nh, T, hs)
        return y.permute(0, 2, 1, 3).contiguous().reshape(B, T, C)  # copy back


class MLP(Module):
    """c_fc, GELU, c_proj, dropout, as nanoGPT's.

    With a bias in c_fc, its bias and the GELU run as one op, F.bias_gelu(x @ W^T, b): one
    pass over the (B, T, 4C) activation each way instead of an add and a gelu, the bias
    gradient summed in the gelu's backward pass. The modules and parameters stay nanoGPT's
    (c_fc.weight, c_fc.bias), and each part runs in its own module's scope, so the ledger
    names them as before. The fused op saves what the gelu did (its (B, T, 4C) input; the
    bias is a parameter) and follows the same "gelu" save policy.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = GELU()
        self.c_proj = Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = Dropout(config.dropout)

    def forward(self, x):
        if (type(self.c_fc) is Linear and self.c_fc.bias is not None
                and type(self.gelu) is GELU):
            with ta.memory.module_scope(self.c_fc):
                x = F.linear(x, self.c_fc.weight)
            with ta.memory.module_scope(self.gelu):
                x = F.bias_gelu(x, self.c_fc.bias, approximate=self.gelu.approximate)
        else:  # a replaced c_fc or activation, or no bias: the modules as they are
            x = self.gelu(self.c_fc(x))
        x = self.c_proj(x)
        return self.dropout(x)


class SwiGLU(Module):
    """Llama's MLP: w2(silu(w1 x) * w3 x), hidden size swiglu_hidden(n_embd). w2 is the
    residual projection (given the GPT-2 scaled init, as c_proj)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        hidden = swiglu_hidden(config.n_embd)
        self.w1 = Linear(config.n_embd, hidden, bias=config.bias)  # the gate
        self.w3 = Linear(config.n_embd, hidden, bias=config.bias)  # the value
        self.w2 = Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


def add_norm(norm: Module, x, residual):
    """(x + residual, norm(x + residual)): one F.add_layer_norm node in the norm's scope
    when `norm` is a plain LayerNorm (the ledger names it as before: the node saves what
    the norm saved, the sum and 1/std); otherwise the add and the module as they are."""
    if type(norm) is not LayerNorm:
        x = x + residual
        return x, norm(x)
    with ta.memory.module_scope(norm):
        return F.add_layer_norm(x, residual, norm.normalized_shape, norm.weight, norm.bias,
                                norm.eps)


class Block(Module):
    """x + attn(ln_1(x)), then that + mlp(ln_2(that)), as nanoGPT's.

    The first residual add and ln_2 run as one node (add_norm: one pass over the residual
    stream each way instead of two). Inside a GPT (forward_fused) the block also takes
    its ln_1(x) from the node before it, and hands the next norm (the next block's ln_1,
    or ln_f) its second residual add, so every residual add of the model is fused with
    the norm after it.
    """

    def __init__(self, config: GPTConfig, rope: tuple | None = None) -> None:
        super().__init__()
        _check_option("mlp", config.mlp, MLPS)
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config, rope)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config) if config.mlp == "gelu" else SwiGLU(config)

    def forward(self, x):
        x, h = add_norm(self.ln_2, x, self.attn(self.ln_1(x)))
        return x + self.mlp(h)

    def forward_fused(self, x, h, next_norm: Module):
        """(x', next_norm(x')) for this block's output x', given its input x and h =
        ln_1(x): the block with its last residual add fused into the next norm. Called in
        the block's scope (GPT.forward enters it)."""
        x, h = add_norm(self.ln_2, x, self.attn(h))
        return add_norm(next_norm, x, self.mlp(h))


class GPT(Module):

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.vocab_size is None or config.block_size is None:
            raise ValueError("GPTConfig needs vocab_size and block_size")
        self.config = config
        _check_option("pos_emb", config.pos_emb, POS_EMBS)
        learned = config.pos_emb == "learned"
        rope = None if learned else rope_tables(config)  # one pair, shared by every layer
        self.transformer = ModuleDict(dict(
            wte=Embedding(config.vocab_size, config.n_embd),
            **(dict(wpe=Embedding(config.block_size, config.n_embd)) if learned else {}),
            drop=Dropout(config.dropout),
            h=ModuleList([Block(config, rope) for _ in range(config.n_layer)]),
            ln_f=make_norm(config),
        ))
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying: the token embedding and the output projection share one matrix
        # (one tensor, one Storage, one gradient, in both places), which saves parameters
        # and ties the input and output token representations together
        self.transformer.wte.weight = self.lm_head.weight

        # init all weights, then a scaled init of the residual projections (GPT-2 paper)
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight") or pn.endswith("mlp.w2.weight"):
                _normal_(p, std=0.02 / math.sqrt(2 * config.n_layer))

    def num_params(self, non_embedding: bool = True) -> int:
        """Number of parameters, each tied tensor counted once. With non_embedding, the
        position embeddings are left out (the token embeddings are counted: they are
        tied to lm_head's weight, which is used as a projection)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    get_num_params = num_params  # nanoGPT's name

    def load_state_dict(self, state_dict, strict: bool = True):
        # nanoGPT checkpoints made without flash attention carry their causal mask as a
        # buffer named "attn.bias": not a weight, so skipped (as nanoGPT's from_pretrained)
        state_dict = {k: v for k, v in state_dict.items() if not k.endswith(".attn.bias")}
        return super().load_state_dict(state_dict, strict)

    @staticmethod
    def _init_weights(module: Module) -> None:
        if isinstance(module, Linear):
            _normal_(module.weight, std=0.02)
            if module.bias is not None:
                _zeros_(module.bias)
        elif isinstance(module, Embedding):
            _normal_(module.weight, std=0.02)

    def forward(self, idx, targets=None):
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(f"cannot forward a sequence of length {T}, block size is only "
                             f"{self.config.block_size}")
        # forward the GPT model itself
        recomputed = self.config.checkpointed_blocks() if ta.is_grad_enabled() else ()
        blocks = self.transformer.h
        if not recomputed and all(type(b) is Block and "forward" not in vars(b)
                                  for b in blocks):  # a replaced block runs as it is
            x = self._fused_trunk(idx)
        else:
            x = self._embed(idx)
            for i, block in enumerate(blocks):
                if i in recomputed:
                    # save only the block's input; recompute its insides in backward
                    x = ta.checkpoint(block, x)
                else:
                    x = block(x)
            x = self.transformer.ln_f(x)

        if targets is not None:
            # training: logits everywhere, and the loss (a fused, stable cross-entropy
            # that saves the logits and one logsumexp per row; -1 targets are ignored)
            logits = self.lm_head(x)  # (B, T, vocab_size)
            V = logits.size(-1)
            loss = F.cross_entropy(logits.view(-1, V), targets.reshape(-1), ignore_index=-1)
        else:
            # inference: only the last position's logits are needed (a view, no copy)
            logits = self.lm_head(x[:, -1:, :])  # (B, 1, vocab_size)
            loss = None
        return logits, loss

    def _embed(self, idx):
        """The first block's input: token (+ learned position) embeddings, dropout."""
        T = idx.size(1)
        if self.config.pos_emb == "learned":
            pos = ta.arange(0, T, dtype=ta.long, device=idx.device)  # (T,)
            tok_emb = self.transformer.wte(idx)  # token embeddings of shape (B, T, n_embd)
            pos_emb = self.transformer.wpe(pos)  # position embeddings of shape (T, n_embd)
            return self.transformer.drop(tok_emb + pos_emb)
        # rotary: positions enter in each attention layer, on q and k
        return self.transformer.drop(self.transformer.wte(idx))  # (B, T, n_embd)

    def _fused_trunk(self, idx):
        """ln_f(blocks(embeddings)) with each residual add fused into the norm after it
        (Block.forward_fused): the embedding sum into the first ln_1 when dropout is off
        (p = 0 or eval; the (T, C) position table broadcast over the batch inside the
        node), each block's last add into the next ln_1 and the last one into ln_f. The
        same modules, scopes and saved bytes as the plain loop; fewer passes."""
        blocks, drop = self.transformer.h, self.transformer.drop
        first = blocks[0].ln_1 if len(blocks) else self.transformer.ln_f
        if (self.config.pos_emb == "learned" and type(drop) is Dropout
                and (drop.p == 0 or not drop.training)):
            T = idx.size(1)
            pos = ta.arange(0, T, dtype=ta.long, device=idx.device)  # (T,)
            tok_emb = self.transformer.wte(idx)  # (B, T, n_embd)
            pos_emb = self.transformer.wpe(pos)  # (T, n_embd)
            x, h = add_norm(first, tok_emb, pos_emb)
        else:
            x = self._embed(idx)
            h = first(x)
        for i, block in enumerate(blocks):
            last = i + 1 == len(blocks)
            with ta.memory.module_scope(block):
                x, h = block.forward_fused(x, h, self.transformer.ln_f if last
                                           else blocks[i + 1].ln_1)
        return h

    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k=None):
        """Extend idx (B, T) by max_new_tokens sampled tokens, feeding each back in.

        As nanoGPT's, this leaves the mode alone: call model.eval() first to turn dropout
        off. The context is cropped to the last block_size tokens.
        """
        with ta.no_grad():
            for _ in range(max_new_tokens):
                bs = self.config.block_size
                idx_cond = idx if idx.size(1) <= bs else idx[:, -bs:]
                logits, _ = self(idx_cond)
                idx_next = sample(logits[:, -1, :], temperature, top_k)  # (B, 1)
                idx = ta.cat((idx, idx_next), dim=1)
        return idx


def sample(logits, temperature: float = 1.0, top_k=None):
    """One token per row of logits (B, V) from softmax(logits / temperature), restricted to
    the top_k most likely tokens if top_k is given: returns (B, 1) int64.

    The engine has no multinomial, so this uses the Gumbel-max trick, which is exact:
    argmax(logits + G) with G = -log(-log(U)), U ~ Uniform(0, 1) i.i.d., is distributed as
    softmax(logits). Tokens outside the top k get logit -inf, which never wins. The k-th
    largest logit (the cutoff, ties kept as torch.topk's) is found by k - 1 rounds of
    removing the current maximum: O(k V) work with the ops the engine has.
    """
    logits = logits / temperature
    B, V = logits.shape
    if top_k is not None and top_k < V:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        rest, columns = logits, ta.arange(V, device=logits.device)
        for _ in range(top_k - 1):
            top = rest.argmax(-1, keepdim=True)  # (B, 1)
            rest = rest.masked_fill(columns == top, float("-inf"))
        kth, _ = rest.max(-1, keepdim=True)  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    u = ta.rand(B, V, dtype=logits.dtype, device=logits.device).clamp(min=1e-30)
    gumbel = -((-u.log()).log())
    return (logits + gumbel).argmax(-1, keepdim=True)


def _normal_(t: ta.Tensor, std: float) -> None:
    """Fill t in place with N(0, std^2) samples (the tensor, and so any tie, is kept)."""
    with ta.no_grad():
        t.copy_(ta.randn(*t.shape, dtype=t.dtype, device=t.device) * std)


def _zeros_(t: ta.Tensor) -> None:
    with ta.no_grad():
        t.zero_()
