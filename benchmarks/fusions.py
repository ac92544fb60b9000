"""The fused transformer nodes against the compositions they replace, interleaved in one
process: add_layer_norm (a residual add and the layer_norm after it) against x + r then
layer_norm; linear (one GEMM with the bias added in place inside the node) against a
matmul node and an in-place add node; and a whole small-GPT training step, fused model
against the same model with its norms and biased Linears unfused.

Each pair runs A then B (the order alternating every repeat), forward and backward, float32,
the kernels in "auto" mode once compiled. A cell is the median of the per-pair ratios
fused / unfused, with the spread (the 25th and 75th percentiles) beside it, so load that
hits both halves of a pair alike cancels out.

    python benchmarks/fusions.py                 # small GPT and shakespeare shapes, GPT step
    python benchmarks/fusions.py --repeat 41 --steps 15
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nn  # noqa: E402
import tinygrad_attn as ta  # noqa: E402
import tinygrad_attn.functional as F  # noqa: E402
from tinygrad_attn.backend import kernels  # noqa: E402

SHAPES = {"small GPT (32*64, 128)": (32 * 64, 128), "shakespeare (32*256, 384)": (32 * 256, 384)}


def _t(shape, seed, grad=True):
    rng = np.random.default_rng(seed)
    return ta.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=grad)


def norm_pair(rows, C):
    x, r = _t((rows, C), 0), _t((rows, C), 1)
    w, b = _t(C, 2), _t(C, 3)
    gy, gs = _t((rows, C), 4, False), _t((rows, C), 5, False)

    def fused():
        s, y = F.add_layer_norm(x, r, C, w, b)
        ta.autograd.backward((y, s), (gy, gs))

    def unfused():
        s = x + r
        y = F.layer_norm(s, C, w, b)
        ta.autograd.backward((y, s), (gy, gs))

    return fused, unfused, (x, r, w, b)


def linear_pair(rows, C):
    x, w, b = _t((rows, C), 0), _t((3 * C, C), 1), _t(3 * C, 2)
    g = _t((rows, 3 * C), 3, False)

    def fused():
        F.linear(x, w, b).backward(g)

    def unfused():
        (x @ w.mT).add_(b).backward(g)

    return fused, unfused, (x, w, b)


class _PlainLayerNorm(nn.LayerNorm):
    """Another type than nn.LayerNorm: the GPT runs the add and the module apart."""


class _ComposedLinear(nn.Linear):
    def forward(self, x):
        y = x @ self.weight.mT
        return y if self.bias is None else y.add_(self.bias)


def gpt_pair():
    def build(fused):
        ta.manual_seed(0)
        cfg = nn.GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128,
                           dropout=0.0, attn="views")
        model = nn.GPT(cfg)
        if not fused:
            for m in model.modules():
                if type(m) is nn.LayerNorm:
                    m.__class__ = _PlainLayerNorm
            for blk in model.transformer.h:
                for lin in (blk.attn.c_attn, blk.attn.c_proj, blk.mlp.c_proj):
                    lin.__class__ = _ComposedLinear
        return model, nn.optim.AdamW(model.parameters(), lr=1e-3)

    rng = np.random.default_rng(0)
    idx = ta.tensor(rng.integers(0, 65, (32, 64)))
    tgt = ta.tensor(rng.integers(0, 65, (32, 64)))
    steps = []
    for fused in (True, False):
        model, opt = build(fused)

        def step(model=model, opt=opt):
            _, loss = model(idx, tgt)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        steps.append(step)
    return steps[0], steps[1], ()


def _zero(leaves):
    for t in leaves:
        t.grad = None


def interleave(fused, unfused, leaves, repeat):
    for _ in range(3):  # warm up: compile (or load) the kernels, fill the caches
        fused(), unfused()
        _zero(leaves)
    kernels.wait_compiled(600)
    ratios, times = [], {"fused": [], "unfused": []}
    for i in range(repeat):
        order = (("fused", fused), ("unfused", unfused))
        if i % 2:
            order = order[::-1]
        took = {}
        for name, fn in order:
            _zero(leaves)
            t0 = time.perf_counter()
            fn()
            took[name] = time.perf_counter() - t0
            times[name].append(took[name])
        ratios.append(took["fused"] / took["unfused"])
    q = statistics.quantiles(ratios, n=4)
    return (statistics.median(times["fused"]) * 1e3, statistics.median(times["unfused"]) * 1e3,
            statistics.median(ratios), q[0], q[2])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=31)
    p.add_argument("--steps", type=int, default=15, help="pairs of GPT steps")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        ta.set_num_threads(args.threads)
    rows = []
    for label, (n, C) in SHAPES.items():
        rows.append((f"add + layer_norm {label}", interleave(*norm_pair(n, C), args.repeat)))
        rows.append((f"linear {label} -> 3C", interleave(*linear_pair(n, C), args.repeat)))
    rows.append(("small GPT step (views, 32 x 64, AdamW)",
                 interleave(*gpt_pair(), args.steps)))
    print(f"kernels {kernels.get_kernels()}, threads {ta.get_num_threads()}, float32")
    print("| fwd+bwd | fused ms | unfused ms | fused/unfused (median of pairs) | IQR |")
    print("|---|---:|---:|---:|---|")
    for name, (a, b, med, lo, hi) in rows:
        print(f"| {name} | {a:.2f} | {b:.2f} | {med:.3f} | {lo:.3f}-{hi:.3f} |")


if __name__ == "__main__":
    main()
