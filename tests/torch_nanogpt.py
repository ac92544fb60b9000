"""The PyTorch reference for the cross-check tests: nanoGPT's model.py (Karpathy, MIT), its
modules and parameter names kept as they are, less from_pretrained, configure_optimizers,
estimate_mfu and generate. Import it only after pytest.importorskip("torch").

Beyond nanoGPT, the options of nn.GPTConfig, written here independently in plain torch:
norm="rmsnorm" (torch.nn.RMSNorm), pos_emb="rope" (the rotate-half formula with full-width
tables), mlp="swiglu" and n_kv_head (k, v heads repeat_interleave'd, or torch's enable_gqa
with flash).

`load_from_ta(model, ta_state_dict)` / `state_dict_to_ta(model)` move weights by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F


class LayerNorm(nn.Module):
    """LayerNorm but with an optional bias. PyTorch doesn't support simply bias=False"""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


def make_norm(config):
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=1e-5)
    return LayerNorm(config.n_embd, bias=config.bias)


def rope_tables(config):
    """Full-width (block_size, hs) cos and sin: each angle twice, rounded to float32."""
    hs = config.n_embd // config.n_head
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    angles = torch.outer(torch.arange(config.block_size, dtype=torch.float64), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().float(), angles.sin().float()


def rotate(x, cos, sin):
    h = x.shape[-1] // 2
    rotate_half = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return x * cos + rotate_half * sin


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        hs = config.n_embd // config.n_head
        self.n_kv_head = config.n_kv_head or config.n_head
        # key, query, value projections for all heads, but in a batch
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * self.n_kv_head * hs,
                                bias=config.bias)
        self.rope = config.pos_emb == "rope"
        if self.rope:
            cos, sin = rope_tables(config)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        # output projection
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        # regularization
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        # nanoGPT uses flash attention when torch has it; the manual path is kept for the
        # cross-check (flash=False), where every op is the one tinygrad_attn's GPT uses
        self.flash = config.flash and hasattr(F, "scaled_dot_product_attention")
        if not self.flash:
            # causal mask to ensure that attention is only applied to the left in the sequence
            bs = config.block_size
            self.register_buffer("bias", torch.tril(torch.ones(bs, bs)).view(1, 1, bs, bs))

    def forward(self, x):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)

        # calculate query, key, values for all heads in batch and move head forward
        hs, nkv = C // self.n_head, self.n_kv_head
        q, k, v = self.c_attn(x).split([C, nkv * hs, nkv * hs], dim=2)
        k = k.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        if self.rope:
            q = rotate(q, self.rope_cos[:T], self.rope_sin[:T])
            k = rotate(k, self.rope_cos[:T], self.rope_sin[:T])

        # causal self-attention; Self-attend: (B, nh, T, hs) x (B, nh, hs, T) -> (B, nh, T, T)
        if self.flash:
            y = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0,
                is_causal=True, enable_gqa=nkv != self.n_head)
        else:
            if nkv != self.n_head:  # query head i reads kv head i // group
                k = k.repeat_interleave(self.n_head // nkv, dim=1)
                v = v.repeat_interleave(self.n_head // nkv, dim=1)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs

        # output projection
        y = self.resid_dropout(self.c_proj(y))
        return y


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        x = self.c_fc(x)
        x = self.gelu(x)
        x = self.c_proj(x)
        x = self.dropout(x)
        return x


class SwiGLU(nn.Module):

    def __init__(self, config):
        super().__init__()
        hidden = int(2 * 4 * config.n_embd / 3)
        hidden = 8 * ((hidden + 7) // 8)
        self.w1 = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.w3 = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.w2 = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config) if config.mlp == "gelu" else SwiGLU(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    flash: bool = False  # not in nanoGPT: there, flash is on whenever torch has it
    norm: str = "layernorm"  # the options of nn.GPTConfig, not in nanoGPT
    pos_emb: str = "learned"
    mlp: str = "gelu"
    n_kv_head: int | None = None


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.vocab_size is not None
        assert config.block_size is not None
        self.config = config

        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            **({} if config.pos_emb == "rope" else
               dict(wpe=nn.Embedding(config.block_size, config.n_embd))),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=make_norm(config),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying: the token embedding and the output projection share one matrix
        self.transformer.wte.weight = self.lm_head.weight

        # init all weights
        self.apply(self._init_weights)
        # apply special scaled init to the residual projections, per GPT-2 paper
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def get_num_params(self, non_embedding=True):
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n_params -= self.transformer.wpe.weight.numel()
        return n_params

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        device = idx.device
        b, t = idx.size()
        assert t <= self.config.block_size, (
            f"Cannot forward sequence of length {t}, block size is only "
            f"{self.config.block_size}")
        pos = torch.arange(0, t, dtype=torch.long, device=device)  # shape (t)

        # forward the GPT model itself
        tok_emb = self.transformer.wte(idx)  # token embeddings of shape (b, t, n_embd)
        if "wpe" in self.transformer:
            pos_emb = self.transformer.wpe(pos)  # position embeddings of shape (t, n_embd)
            x = self.transformer.drop(tok_emb + pos_emb)
        else:  # rotary: positions enter on q and k
            x = self.transformer.drop(tok_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)

        if targets is not None:
            # if we are given some desired targets also calculate the loss
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        else:
            # inference-time mini-optimization: only forward the lm_head on the last position
            logits = self.lm_head(x[:, [-1], :])  # note: list [-1] to preserve the time dim
            loss = None

        return logits, loss


# ----------------------------------------------------------------------------- weights by name
def load_from_ta(model: GPT, state_dict) -> None:
    """Copy a tinygrad_attn state_dict into the torch model by name (strict, like nanoGPT's
    from_pretrained: the causal-mask buffers `.attn.bias` are not weights)."""
    own = model.state_dict()
    keys = [k for k in own if not k.endswith(".attn.bias")]
    assert sorted(keys) == sorted(state_dict), (sorted(keys), sorted(state_dict))
    with torch.no_grad():
        for k in keys:
            own[k].copy_(torch.from_numpy(np.array(state_dict[k].detach().numpy())))


def state_dict_to_ta(model: GPT) -> dict:
    """The torch model's weights as NumPy arrays under nanoGPT's names (no mask buffers)."""
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()
            if not k.endswith(".attn.bias")}
