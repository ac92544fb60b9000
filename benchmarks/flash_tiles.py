"""The blocked ("flash") attention, forward + backward, against PyTorch's SDPA, by block size.

Each row is one call of F.scaled_dot_product_attention(q, k, v, is_causal=True) and its
backward, float32, with q, k, v as a GPT hands them over: strided head views of one fused
(B, T, 3C) projection, the output merged back to (B, T, C) and a gradient of that shape
sent back, so the views' own backward (into the projection's one buffer) is timed too, in
both engines. Shapes (batch, heads, T, head dim):

    (32, 4, 64, 32)    the small GPT (n_layer 4, n_embd 128, T 64, batch 32)
    (12, 4, 64, 32)    nanoGPT's CPU recipe shape (the same, batch 12)
    (32, 6, 256, 64)   shakespeare-char (n_embd 384, 6 heads, T 256, batch 32)

at block sizes 16, 32, 64, 128. The variants take turns within each repeat, the order
rotating from one repeat to the next; each cell is the median time, and each ratio the
median over the repeats of that repeat's ratio (pairs timed moments apart, so load on a
shared machine hits both). `--old FILE` adds a variant: another version of
tinygrad_attn/ops/attention.py (for instance `git show REV:tinygrad_attn/ops/attention.py
> /tmp/old.py`), loaded beside the current one, to compare before and after in one process.

    python benchmarks/flash_tiles.py --repeat 30
    python benchmarks/flash_tiles.py --old /tmp/old.py --blocks 32,128 --threads 2
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
import time

import numpy as np

import nn.functional as F
import tinygrad_attn as ta

try:
    import torch
    import torch.nn.functional as TF
except ImportError:
    torch = None

SHAPES = ((32, 4, 64, 32), (12, 4, 64, 32), (32, 6, 256, 64))


def load_old(path: str):
    """Another version of ops/attention.py as a module beside the current one (its op
    registration left out: the name is the current module's)."""
    src = open(path).read().replace("@op(ScaledDotProductAttention, functional=True)\n", "")
    spec = importlib.util.spec_from_loader("tinygrad_attn.ops._flash_old", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "tinygrad_attn.ops"
    exec(compile(src, path, "exec"), mod.__dict__)
    return mod


def ours(shape, bs, apply=None):
    """A closure running one forward + backward of our attention at `shape`."""
    B, H, T, D = shape
    C = H * D
    rng = np.random.default_rng(0)
    x = ta.tensor(rng.standard_normal((B, T, 3 * C), dtype=np.float32), requires_grad=True)
    gy = ta.tensor(rng.standard_normal((B, T, C), dtype=np.float32))
    scale = 1.0 / math.sqrt(D)

    def step():
        x.grad = None
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in x.split(C, dim=2))
        if apply is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, block_size=bs)
        else:
            y = apply(q, k, v, None, is_causal=True, scale=scale, block_size=bs)
        y.transpose(1, 2).contiguous().view(B, T, C).backward(gy)
        return x.grad
    return step


def theirs(shape):
    B, H, T, D = shape
    C = H * D
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.standard_normal((B, T, 3 * C), dtype=np.float32), requires_grad=True)
    gy = torch.tensor(rng.standard_normal((B, T, C), dtype=np.float32))

    def step():
        x.grad = None
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in x.split(C, dim=2))
        y = TF.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.transpose(1, 2).contiguous().view(B, T, C).backward(gy)
        return x.grad
    return step


def measure(variants: dict, repeat: int, clock=time.perf_counter) -> dict:
    names = list(variants)
    for fn in variants.values():  # warm: compile or load the kernels, fill the caches
        for _ in range(3):
            fn()
    times = {n: [] for n in names}
    for r in range(repeat):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            t = clock()
            variants[n]()
            times[n].append(clock() - t)
    return times


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--blocks", default="16,32,64,128")
    ap.add_argument("--shapes", default=None, help="B,H,T,D;B,H,T,D (default: the three)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--old", default=None, help="another attention.py to time beside")
    ap.add_argument("--cpu", action="store_true",
                    help="time the process's CPU seconds, not the wall clock: on a machine "
                         "shared with other work, with --threads 1, the work each call does")
    args = ap.parse_args(argv)
    ta.set_num_threads(args.threads)
    if torch is not None:
        torch.set_num_threads(args.threads)
    shapes = SHAPES if args.shapes is None else tuple(
        tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";"))
    old = None if args.old is None else load_old(args.old)
    blocks = [int(b) for b in args.blocks.split(",")]
    cols = ["new"] + (["old"] if old else []) + (["torch"] if torch else [])
    ratios = [("new", "torch")] * bool(torch) + [("old", "torch")] * bool(old and torch) + [
        ("new", "old")] * bool(old)
    head = ["shape (B,H,T,D)", "block"] + [f"{c} ms" for c in cols] + [f"{a}/{b}"
                                                                       for a, b in ratios]
    print(" | ".join(head))
    for shape in shapes:
        for bs in blocks:
            variants = {"new": ours(shape, bs)}
            if old:
                variants["old"] = ours(shape, bs, old.ScaledDotProductAttention.apply)
            if torch:
                variants["torch"] = theirs(shape)
            t = measure(variants, args.repeat,
                        time.process_time if args.cpu else time.perf_counter)
            cells = [str(shape), str(bs)]
            cells += [f"{statistics.median(t[c]) * 1e3:.2f}" for c in cols]
            cells += [f"{statistics.median(x / y for x, y in zip(t[a], t[b])):.2f}"
                      for a, b in ratios]
            print(" | ".join(cells), flush=True)
    print(f"threads {args.threads}, {args.repeat} repeats, "
          f"{'CPU' if args.cpu else 'wall'} time; python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
