"""What the GPT's modern options save for backward, measured by the ledger, side by side.

    python examples/gpt_options_memory.py                # the story's config, batch 8
    python examples/gpt_options_memory.py --attn flash   # the same with the blocked attention
    python examples/gpt_options_memory.py --quick        # a tiny config (used by the tests)

For a small GPT (4 layers, 4 heads, n_embd 128, vocab 65, block size 256, float32, no
dropout) it runs one forward and backward for each variant: nanoGPT's defaults, then one
option at a time (RMSNorm for LayerNorm, rotary for learned positions, SwiGLU for GELU,
grouped-query attention with 2 and 1 key/value heads), then all four together. The table
gives the parameters, the saved-for-backward peak (bytes pinned by graph nodes, each
storage once, parameters left out: the ledger's unique_bytes_without_parameters) beside
its analytic floor, and one layer's share per token: measured as the difference between
the model with L and with L - 1 layers, divided by B * T, beside the floor's per-block term.

The analytic floor (float itemsize f, B batch, T = block_size, C = n_embd, nh heads,
hs = C / nh, KV = n_kv_head * hs, V vocab, H = swiglu_hidden(C) = 2/3 * 4C rounded up to 8):

  top level   idx (B T int64); learned: pos (T int64) | rope: the cos and sin tables,
              (block_size, hs/2) each, shared by every layer, so counted once: block_size hs f;
              ln_f BTC f + BT f; lm_head input BTC f; cross_entropy logits BTV f + lse BT f
              + targets (B T int64)
  per block   norms      2 (BTC + BT) f, either kind keeps its input x (the residual stream,
                         not otherwise saved) and 1/std (LayerNorm) or 1/rms (RMSNorm)
              c_attn     its input BTC f, and its output qkv B T (C + 2 KV) f, pinned whole by
                         the q/k/v views that the attention keeps (GQA shrinks it: KV < C)
              rope       + the rotated q (BTC f) and k (B T KV f): new tensors the scores
                         keep; the rotation itself keeps only the shared tables
              views      the softmax output B nh T T f (grouped heads too: each query head
                         has its own probabilities), all masked_softmax saves
              flash      the row logsumexp B nh T f (its output is the merged heads below)
              c_proj     its input, the merged heads BTC f
              gelu MLP   c_fc input BTC f + gelu input 4BTC f + c_proj input 4BTC f
              swiglu MLP w1/w3 input (one tensor) BTC f + silu input BTH f + silu output and
                         w3 x (the product keeps both) 2 BTH f + w2 input BTH f

So, per token and layer (f = 4): the norms cost the same; rope adds (C + KV) f and takes
wpe's pos; SwiGLU's 4H (= 10.7 C at H = 8C/3) replaces GELU's 8C; GQA saves 2 (C - KV) f of
qkv and, with rope, C - KV more of the rotated k. The T x T probabilities dominate at this
block size under "views" and do not move with any option; "flash" removes them.
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
from dataclasses import replace

import numpy as np

import nn
import tinygrad_attn as ta
from nn.gpt import swiglu_hidden

PROG = "gpt_options_memory.py"

VARIANTS = {
    "nanoGPT (LayerNorm, learned, GELU, MHA)": {},
    "RMSNorm": dict(norm="rmsnorm"),
    "rotary (no wpe)": dict(pos_emb="rope"),
    "SwiGLU": dict(mlp="swiglu"),
    "GQA n_kv_head=2": dict(n_kv_head=2),
    "MQA n_kv_head=1": dict(n_kv_head=1),
    "all four (RMSNorm+rotary+SwiGLU+GQA 2)": dict(norm="rmsnorm", pos_emb="rope",
                                                    mlp="swiglu", n_kv_head=2),
}


def base_config(quick: bool = False, attn: str = "views") -> nn.GPTConfig:
    if quick:
        return nn.GPTConfig(vocab_size=65, block_size=16, n_layer=2, n_head=4, n_embd=32,
                            attn=attn, attn_block_size=8)
    return nn.GPTConfig(vocab_size=65, block_size=256, n_layer=4, n_head=4, n_embd=128,
                        attn=attn)


def _refuse_if_too_big(need: int, what: str, fix: str) -> None:
    """One line and exit status 2 when a step would need more than the machine has."""
    free = ta.memory.available_bytes()
    if free is not None and need > free:
        print(f"{PROG}: error: {what} needs at least {need / 2**30:.1f} GiB for one step "
              f"and {free / 2**30:.1f} GiB is available: {fix}", file=sys.stderr)
        raise SystemExit(2)


# ----------------------------------------------------------------------------- analytic
def param_count(cfg: nn.GPTConfig) -> int:
    """Parameters of the GPT for cfg (the tied wte/lm_head counted once)."""
    C, V, L = cfg.n_embd, cfg.vocab_size, cfg.n_layer
    KV = (cfg.n_kv_head or cfg.n_head) * (C // cfg.n_head)
    b = 1 if cfg.bias else 0
    norm = C if cfg.norm == "rmsnorm" else C + b * C
    attn = C * (C + 2 * KV) + b * (C + 2 * KV) + C * C + b * C
    if cfg.mlp == "swiglu":
        H = swiglu_hidden(C)
        mlp = 3 * C * H + b * (2 * H + C)
    else:
        mlp = 8 * C * C + b * 5 * C
    wpe = cfg.block_size * C if cfg.pos_emb == "learned" else 0
    return V * C + wpe + norm + L * (2 * norm + attn + mlp)


def floor_bytes(cfg: nn.GPTConfig, batch: int, itemsize: int = 4) -> dict:
    """Saved-for-backward bytes at the end of forward, term by term (see the docstring):
    {'top': {...}, 'block': {...}, 'per_block', 'saved', 'per_token_layer'}. Dropout 0,
    no checkpointing, attn "views" or "flash", T = block_size."""
    if cfg.dropout or cfg.checkpoint or cfg.attn not in ("views", "flash"):
        raise ValueError("floor_bytes: for dropout 0, no checkpointing, attn views or flash")
    B, T, C, nh, V, f = batch, cfg.block_size, cfg.n_embd, cfg.n_head, cfg.vocab_size, itemsize
    hs = C // nh
    KV = (cfg.n_kv_head or nh) * hs
    BTC, BT = B * T * C * f, B * T * f
    rope = cfg.pos_emb == "rope"
    top = {"idx (int64)": B * T * 8}
    if rope:
        top["rope cos + sin tables (shared)"] = cfg.block_size * hs * f
    else:
        top["pos (int64)"] = T * 8
    top |= {"ln_f": BTC + BT, "lm_head input": BTC,
            "cross_entropy logits + lse + targets": B * T * V * f + BT + B * T * 8}
    block = {"norms (ln_1, ln_2)": 2 * (BTC + BT), "c_attn input": BTC,
             "qkv (B, T, C + 2 KV)": B * T * (C + 2 * KV) * f}
    if rope:
        block["rotated q and k"] = BTC + B * T * KV * f
    if cfg.attn == "views":
        block["softmax out"] = B * nh * T * T * f
    else:
        block["logsumexp"] = B * nh * T * f
    block["c_proj input (merged heads)"] = BTC
    if cfg.mlp == "swiglu":
        block["swiglu: input + 4 x (B, T, H)"] = BTC + 4 * B * T * swiglu_hidden(C) * f
    else:
        block["gelu mlp: input + 2 x (B, T, 4C)"] = 9 * BTC
    per_block = sum(block.values())
    return {"top": top, "block": block, "per_block": per_block,
            "saved": sum(top.values()) + cfg.n_layer * per_block,
            "per_token_layer": per_block / (B * T)}


# ----------------------------------------------------------------------------- measuring
def measure_saved(cfg: nn.GPTConfig, batch: int) -> int:
    """The ledger's saved-for-backward peak (unique bytes, parameters left out) over one
    forward and backward of a fresh model."""
    gc.collect()
    ta.manual_seed(0)
    model = nn.GPT(cfg)
    rng = np.random.default_rng(0)
    idx = ta.tensor(rng.integers(0, cfg.vocab_size, (batch, cfg.block_size)))
    tgt = ta.tensor(rng.integers(0, cfg.vocab_size, (batch, cfg.block_size)))
    with ta.memory.profile() as prof:
        model(idx, tgt)[1].backward()
    return prof.summary()["saved_peak"]["unique_bytes_without_parameters"]


def measure(cfg: nn.GPTConfig, batch: int) -> dict:
    """One table row: measured and analytic saved bytes, total and per token-layer."""
    saved = measure_saved(cfg, batch)
    one_less = measure_saved(replace(cfg, n_layer=cfg.n_layer - 1), batch)
    floor = floor_bytes(cfg, batch)
    model = nn.GPT(cfg)
    return {"params": sum(p.numel() for p in model.parameters()),
            "params_floor": param_count(cfg), "saved": saved, "floor": floor["saved"],
            "per_token_layer": (saved - one_less) / (batch * cfg.block_size),
            "per_token_layer_floor": floor["per_token_layer"], "terms": floor}


def machine_line() -> str:
    return (f"{platform.machine()}, Python {platform.python_version()}, "
            f"NumPy {np.__version__}")


def table(rows: dict, cfg: nn.GPTConfig, batch: int) -> str:
    lines = [f"attn={cfg.attn!r}, B={batch}, T={cfg.block_size}, n_layer={cfg.n_layer}, "
             f"n_head={cfg.n_head}, n_embd={cfg.n_embd}, vocab={cfg.vocab_size}, float32; "
             f"{machine_line()}",
             "",
             "| variant | parameters | saved (measured) | saved (analytic floor) | "
             "per token-layer (measured) | per token-layer (floor) |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['params']:,} | {r['saved']:,} B | {r['floor']:,} B | "
                     f"{r['per_token_layer']:,.0f} B | {r['per_token_layer_floor']:,.0f} B |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=None, help="batch size (default 8; 2 quick)")
    ap.add_argument("--attn", choices=("views", "flash"), default="views")
    ap.add_argument("--quick", action="store_true", help="a tiny config (the tests use it)")
    args = ap.parse_args(argv)
    cfg = base_config(args.quick, args.attn)
    batch = args.batch or (2 if args.quick else 8)
    if batch < 1:
        ap.error(f"--batch must be at least 1, got {batch}")
    worst = replace(cfg, norm="rmsnorm", pos_emb="rope", mlp="swiglu")  # the most saved
    _refuse_if_too_big(floor_bytes(worst, batch)["saved"] + 16 * param_count(cfg),
                       f"--batch {batch}", "lower --batch")
    rows = {name: measure(replace(cfg, **opts), batch) for name, opts in VARIANTS.items()}
    text = table(rows, cfg, batch)
    print(text)
    exact = all(r["saved"] == r["floor"] and r["params"] == r["params_floor"]
                for r in rows.values())
    print(f"\nmeasured == analytic floor for every variant: {exact}")
    return {"rows": rows, "table": text, "exact": exact}


if __name__ == "__main__":
    try:
        sys.exit(0 if main()["exact"] else 1)
    except MemoryError as e:  # past the estimate: one line, not NumPy's traceback
        print(f"{PROG}: error: out of memory: {e}; lower --batch", file=sys.stderr)
        raise SystemExit(2) from None
