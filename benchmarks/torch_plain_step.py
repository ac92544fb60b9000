"""A plain nanoGPT-style GPT training step in PyTorch, timed alone: the harness's torch side.

The model is written here in the PyTorch idiom, in the shape of nanoGPT's model.py and
under its parameter names (so weights move from this engine by name), but it is not the
tests' reference (tests/torch_nanogpt.py): no Dropout modules when dropout is 0, the
causal mask of the manual attention built once, nothing the cross-checks need (RoPE,
RMSNorm, SwiGLU, GQA). Three attentions, one per attention of nn.GPT:

    flash   torch.nn.functional.scaled_dot_product_attention(is_causal=True)
    views   nanoGPT's manual attention: split, view + transpose, masked_fill, softmax
    naive   the naive port (three slices, permute().contiguous(), an additive -inf mask)

This file never imports tinygrad_attn: run alone, the step runs in a process that holds
only torch (NumPy's OpenBLAS loads with torch but does no work). benchmarks/vs_torch.py
and benchmarks/recipe.py import the model and the step from here.

    python benchmarks/torch_plain_step.py --preset small --attn views --steps 30
    python benchmarks/torch_plain_step.py --preset nanogpt-cpu --attn flash --json
    python benchmarks/torch_plain_step.py --preset small --dropout-modules --keep-host-memory

The flags after --steps each change one thing the step might be sensitive to (the
discrepancy table in docs/performance.md was measured with them): --dropout-modules puts
nanoGPT's nn.Dropout(p=0) modules back, --no-tie unties wte and lm_head, --fused /
--foreach pick AdamW's implementation, --keep-host-memory makes glibc keep freed memory
(the mallopt this engine sets on import), --import-engine imports tinygrad_attn first
(its mallopt, its OpenBLAS settings), --flush-denormal sets torch.set_flush_denormal.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

try:
    import torch
    import torch.nn as tnn
    import torch.nn.functional as F
except ImportError:  # main() says so and exits 0
    torch = None

# (n_layer, n_head, n_embd, block_size, batch): the shapes of vs_torch.py's CONFIGS
PRESETS = {
    "tiny": (2, 4, 32, 16, 4),
    "small": (4, 4, 128, 64, 32),
    "nanogpt-cpu": (4, 4, 128, 64, 12),
    "shakespeare-b8": (6, 6, 384, 256, 8),
    "shakespeare-b32": (6, 6, 384, 256, 32),
}
ATTN = ("naive", "views", "flash")


def keep_host_memory() -> bool:
    """glibc's malloc keeps freed memory (no mmap for large blocks, no trimming): the same
    two mallopt calls tinygrad_attn makes when imported. Process-wide."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.mallopt(-4, 0) == 1 and libc.mallopt(-1, 2**31 - 1) == 1
    except (OSError, AttributeError):
        return False


def _maybe_dropout(p: float, as_module: bool):
    """An nn.Dropout(p) where it does something, or where nanoGPT's module layout is
    asked for (as_module: its modules are there even at p = 0); else None, no call."""
    return tnn.Dropout(p) if p or as_module else None


def _drop(module, x):
    return x if module is None else module(x)


if torch is not None:

    class SelfAttention(tnn.Module):
        """Causal self-attention; `attn` is one of ATTN."""

        def __init__(self, n_embd: int, n_head: int, block_size: int, attn: str,
                     dropout: float, dropout_modules: bool) -> None:
            super().__init__()
            self.c_attn = tnn.Linear(n_embd, 3 * n_embd)
            self.c_proj = tnn.Linear(n_embd, n_embd)
            self.n_head, self.attn, self.dropout = n_head, attn, dropout
            self.attn_dropout = _maybe_dropout(dropout, dropout_modules)
            self.resid_dropout = _maybe_dropout(dropout, dropout_modules)
            if attn != "flash":
                future = torch.ones(block_size, block_size).tril() == 0  # (T, T)
                if attn == "views":
                    self.register_buffer("future", future, persistent=False)
                else:
                    neg = torch.zeros(block_size, block_size).masked_fill(future,
                                                                          float("-inf"))
                    self.register_buffer("neg", neg, persistent=False)

        def forward(self, x):
            B, T, C = x.shape
            nh, hs = self.n_head, C // self.n_head
            if self.attn == "naive":
                return _drop(self.resid_dropout, self.c_proj(self._naive(x, B, T, C, nh, hs)))
            q, k, v = self.c_attn(x).split(C, dim=2)
            q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
            k = k.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
            v = v.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
            if self.attn == "flash":
                p = self.dropout if self.training else 0.0
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, T)
                att = att.masked_fill(self.future[:T, :T], float("-inf")).softmax(dim=-1)
                y = _drop(self.attn_dropout, att) @ v  # (B, nh, T, hs)
            y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
            return _drop(self.resid_dropout, self.c_proj(y))

        def _naive(self, x, B, T, C, nh, hs):
            qkv = self.c_attn(x)
            q = qkv[:, :, :C].reshape(B, T, nh, hs).permute(0, 2, 1, 3).contiguous()
            k = qkv[:, :, C:2 * C].reshape(B, T, nh, hs).permute(0, 2, 3, 1).contiguous()
            v = qkv[:, :, 2 * C:].reshape(B, T, nh, hs).permute(0, 2, 1, 3).contiguous()
            att = (q @ k) * (1.0 / math.sqrt(hs)) + self.neg[:T, :T]  # (B, nh, T, T)
            att = _drop(self.attn_dropout, att.softmax(dim=-1))
            y = att @ v  # (B, nh, T, hs)
            return y.permute(0, 2, 1, 3).contiguous().reshape(B, T, C)  # (B, T, C)

    class MLP(tnn.Module):

        def __init__(self, n_embd: int, dropout: float, dropout_modules: bool) -> None:
            super().__init__()
            self.c_fc = tnn.Linear(n_embd, 4 * n_embd)
            self.c_proj = tnn.Linear(4 * n_embd, n_embd)
            self.dropout = _maybe_dropout(dropout, dropout_modules)

        def forward(self, x):
            return _drop(self.dropout, self.c_proj(F.gelu(self.c_fc(x))))

    class Block(tnn.Module):

        def __init__(self, n_embd, n_head, block_size, attn, dropout, dropout_modules):
            super().__init__()
            self.ln_1 = tnn.LayerNorm(n_embd)
            self.attn = SelfAttention(n_embd, n_head, block_size, attn, dropout,
                                      dropout_modules)
            self.ln_2 = tnn.LayerNorm(n_embd)
            self.mlp = MLP(n_embd, dropout, dropout_modules)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class PlainGPT(tnn.Module):
        """nanoGPT's GPT (LayerNorm with bias, GELU, tied wte / lm_head, GPT-2 init)."""

        def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int,
                     n_embd: int, attn: str = "flash", dropout: float = 0.0,
                     tie: bool = True, dropout_modules: bool = False) -> None:
            super().__init__()
            self.transformer = tnn.ModuleDict(dict(
                wte=tnn.Embedding(vocab_size, n_embd),
                wpe=tnn.Embedding(block_size, n_embd),
                h=tnn.ModuleList(Block(n_embd, n_head, block_size, attn, dropout,
                                       dropout_modules) for _ in range(n_layer)),
                ln_f=tnn.LayerNorm(n_embd),
            ))
            self.drop = _maybe_dropout(dropout, dropout_modules)
            self.lm_head = tnn.Linear(n_embd, vocab_size, bias=False)
            if tie:
                self.transformer.wte.weight = self.lm_head.weight
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    tnn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
                elif p.dim() == 2:
                    tnn.init.normal_(p, 0.0, 0.02)
                elif name.endswith("bias"):
                    tnn.init.zeros_(p)

        def forward(self, idx, targets=None):
            B, T = idx.shape
            pos = torch.arange(T, device=idx.device)
            x = _drop(self.drop, self.transformer.wte(idx) + self.transformer.wpe(pos))
            for block in self.transformer.h:
                x = block(x)
            logits = self.lm_head(self.transformer.ln_f(x))  # (B, T, vocab)
            if targets is None:
                return logits, None
            loss = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
            return logits, loss


def make_optimizer(model, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, fused=None,
                   foreach=None, groups=True):
    """nanoGPT's configure_optimizers: decay on the parameters with dim >= 2, none on the
    rest (groups=False: one group, decay on all). fused / foreach as torch takes them
    (None: torch's default for the device)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if groups:
        params = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay,
                             fused=fused, foreach=foreach)


def train_step(model, opt, idx, targets) -> float:
    """forward, backward, AdamW step, zero_grad(set_to_none): the loss as a float."""
    _, loss = model(idx, targets)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def reference_model(vocab_size, block_size, n_layer, n_head, n_embd, attn):
    """tests/torch_nanogpt.py's GPT (nanoGPT's model.py as the tests keep it): Dropout
    modules at p = 0, the manual attention's mask compared with 0 on every call."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests import torch_nanogpt as ref

    cfg = ref.GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer,
                        n_head=n_head, n_embd=n_embd, dropout=0.0, bias=True,
                        flash=attn == "flash")
    return ref.GPT(cfg)


def build(args, **change):
    """(model, optimizer, idx, targets) for the flags in `args`, with `change` applied."""
    args = argparse.Namespace(**{**vars(args), **change})
    n_layer, n_head, n_embd, block, batch = PRESETS[args.preset]
    torch.manual_seed(0)
    if args.model == "reference":
        model = reference_model(65, block, n_layer, n_head, n_embd, args.attn)
    else:
        model = PlainGPT(65, block, n_layer, n_head, n_embd, attn=args.attn,
                         tie=not args.no_tie, dropout_modules=args.dropout_modules)
    opt = make_optimizer(model, fused=True if args.fused else None,
                         foreach=True if args.foreach else None)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 65, (batch, block), generator=g)
    tgt = torch.randint(0, 65, (batch, block), generator=g)
    return model, opt, idx, tgt


# One suspect at a time: the flag that changes it, and how (in this process: two models
# stepping in turn; "process": a fresh process per run, runs alternating A B A B)
SUSPECTS = {
    "nn.Dropout(p=0) modules (nanoGPT's layout)": ("--dropout-modules", "in"),
    "reference model (tests/torch_nanogpt.py)": ("--model reference", "in"),
    "untied wte / lm_head": ("--no-tie", "in"),
    "AdamW fused=True": ("--fused", "in"),
    "AdamW foreach=True": ("--foreach", "in"),
    "1 torch thread (of 2)": ("--threads 1", "in"),
    "flush denormals": ("--flush-denormal", "in"),
    "SDPA (is_causal) instead of manual": ("--attn flash", "in"),
    "kept host memory (mallopt)": ("--keep-host-memory", "process"),
    "tinygrad_attn imported (mallopt, OpenBLAS loaded)": ("--import-engine", "process"),
    "reference model, fresh process": ("--model reference", "process"),
}


def compare_in_process(args, flag: str, pairs: int) -> list[float]:
    """Per-pair ratios B / A: A = `args`, B = `args` with `flag`; steps alternate."""
    b_args = parse([*_argv(args), *flag.split()])
    a_threads, b_threads = args.threads, b_args.threads
    a, b = build(args), build(b_args)
    ratios = []
    for i in range(pairs + 2):
        pair = []
        for (model, opt, idx, tgt), threads, flush in (
                (a, a_threads, args.flush_denormal), (b, b_threads, b_args.flush_denormal)):
            torch.set_num_threads(threads)
            torch.set_flush_denormal(flush)
            t0 = time.perf_counter()
            train_step(model, opt, idx, tgt)
            pair.append(time.perf_counter() - t0)
        if i >= 2:  # two warm-up pairs
            ratios.append(pair[1] / pair[0])
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(args.flush_denormal)
    return ratios


def _argv(args) -> list[str]:
    out = ["--preset", args.preset, "--attn", args.attn, "--threads", str(args.threads),
           "--model", args.model, "--steps", str(args.steps)]
    for flag in ("dropout_modules", "no_tie", "fused", "foreach", "keep_host_memory",
                 "import_engine", "flush_denormal"):
        if getattr(args, flag):
            out.append("--" + flag.replace("_", "-"))
    return out


def compare_processes(args, flag: str, rounds: int) -> list[float]:
    """Per-round ratios B / A of fresh processes' median step times, A and B alternating."""
    def run(extra):
        cmd = [sys.executable, __file__, *_argv(args), *extra, "--json"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])["median_s"]

    ratios = []
    for _ in range(rounds):
        base = run([])
        ratios.append(run(flag.split()) / base)
    return ratios


def suspects_table(args) -> str:
    """The markdown table of what each suspect changes in the plain step."""
    lines = ["| suspect | how compared | median ratio (with / without) | ratios min-max | n |",
             "|---|---|---|---|---|"]
    for name, (flag, how) in SUSPECTS.items():
        if how == "in":
            r = compare_in_process(args, flag, args.pairs)
            kind = f"one process, alternating steps ({args.pairs} pairs)"
        else:
            r = compare_processes(args, flag, args.rounds)
            kind = f"fresh processes, alternating ({args.rounds} rounds of {args.steps} steps)"
        lines.append(f"| {name} (`{flag}`) | {kind} | {statistics.median(r):.3f} "
                     f"| {min(r):.2f}-{max(r):.2f} | {len(r)} |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small", choices=list(PRESETS))
    p.add_argument("--attn", default="views", choices=ATTN)
    p.add_argument("--model", default="plain", choices=("plain", "reference"),
                   help="this file's plain GPT, or the tests' reference GPT")
    p.add_argument("--steps", type=int, default=30, help="timed steps (after 3 warm-up)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--dropout-modules", action="store_true")
    p.add_argument("--no-tie", action="store_true")
    p.add_argument("--fused", action="store_true")
    p.add_argument("--foreach", action="store_true")
    p.add_argument("--keep-host-memory", action="store_true")
    p.add_argument("--import-engine", action="store_true")
    p.add_argument("--flush-denormal", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON line, no prose")
    p.add_argument("--suspects", action="store_true",
                   help="time each suspect against the plain step; print a markdown table")
    p.add_argument("--pairs", type=int, default=40, help="--suspects: pairs in one process")
    p.add_argument("--rounds", type=int, default=6, help="--suspects: fresh-process rounds")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if torch is None:
        print("torch_plain_step.py times a PyTorch step; torch is not installed. "
              "Nothing measured.")
        return 0
    if args.import_engine:
        import tinygrad_attn  # noqa: F401 - its import-time settings are what is timed
    if args.keep_host_memory:
        keep_host_memory()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(args.flush_denormal)
    if args.suspects:
        print(suspects_table(args))
        return 0
    model, opt, idx, tgt = build(args)
    for _ in range(3):
        train_step(model, opt, idx, tgt)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        train_step(model, opt, idx, tgt)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    q1, _, q3 = statistics.quantiles(times, n=4) if len(times) > 1 else (med, med, med)
    if args.json:
        print(json.dumps({"median_s": med, "q1_s": q1, "q3_s": q3, "steps": args.steps}))
    else:
        print(f"{args.preset} {args.attn} {args.model}: torch step median {med * 1e3:.1f} ms "
              f"(quartiles {q1 * 1e3:.1f} / {q3 * 1e3:.1f}) over {args.steps} steps, "
              f"{torch.get_num_threads()} threads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
