"""Masked softmax of attention scores, forward and backward, side by side in one process.

The views attention's softmax step on scores of shape (B, nh, T, T), float32, causal:

    composition   softmax((att * scale).masked_fill(mask, -inf), -1), NumPy kernels
    fused numpy   F.masked_softmax(att, mask, scale=...), the NumPy reference kernels
    fused numba   the same op, the compiled kernels (if numba is installed)
    torch         torch.softmax(att.masked_fill(mask, -inf), -1) (if torch is installed)

The variants alternate round by round (so drifting machine load hits them alike); the
table gives the median over the rounds, in milliseconds, of the forward and of the backward
(y.backward(g) through every op of the variant).

    python benchmarks/softmax.py                    # (32, 6, 256, 256), 7 rounds
    python benchmarks/softmax.py --shape 8,6,256,256 --rounds 5
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

import tinygrad_attn as ta
from tinygrad_attn.backend import kernels

F = ta.functional


def _ours(att, mask, scale, fused):
    if fused:
        return F.masked_softmax(att, mask, scale=scale)
    return F.softmax((att * scale).masked_fill(mask, float("-inf")), -1)


def _variants(scores, grad, future, scale):
    """{name: (forward thunk, backward thunk)}: each forward makes a fresh graph."""
    out = {}
    mask = ta.tensor(future)
    g = ta.tensor(grad)

    def ours(mode, fused):
        state = {}

        def forward():
            kernels.set_kernels(mode)
            att = ta.tensor(scores, requires_grad=True)
            t0 = time.perf_counter()
            state["y"] = _ours(att, mask, scale, fused)
            return time.perf_counter() - t0

        def backward():
            kernels.set_kernels(mode)
            t0 = time.perf_counter()
            state.pop("y").backward(g)
            return time.perf_counter() - t0

        return forward, backward

    out["composition (numpy)"] = ours("numpy", False)
    out["fused numpy"] = ours("numpy", True)
    if kernels.numba_available():
        out["fused numba"] = ours("numba", True)
    try:
        import torch
    except ImportError:
        return out
    state = {}
    tmask, tg = torch.from_numpy(future), torch.from_numpy(grad)

    def t_forward():
        att = torch.from_numpy(scores * np.float32(scale)).requires_grad_()
        t0 = time.perf_counter()
        state["y"] = torch.softmax(att.masked_fill(tmask, float("-inf")), -1)
        return time.perf_counter() - t0

    def t_backward():
        t0 = time.perf_counter()
        state.pop("y").backward(tg)
        return time.perf_counter() - t0

    out["torch"] = (t_forward, t_backward)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="32,6,256,256", help="B,nh,T,T")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    shape = tuple(int(s) for s in args.shape.split(","))
    rng = np.random.default_rng(0)
    scores = rng.standard_normal(shape, dtype=np.float32)
    grad = rng.standard_normal(shape, dtype=np.float32)
    T = shape[-1]
    future = np.triu(np.ones((T, T), dtype=bool), 1).reshape(1, 1, T, T)
    scale = 1.0 / math.sqrt(64)
    mode = kernels.get_kernels()
    variants = _variants(scores, grad, future, scale)
    times = {name: ([], []) for name in variants}
    try:
        for fwd, bwd in variants.values():  # warm-up: numba compiles or loads its cache
            fwd()
            bwd()
        for _ in range(args.rounds):
            for name, (fwd, bwd) in variants.items():
                times[name][0].append(fwd())
                times[name][1].append(bwd())
    finally:
        kernels.set_kernels(mode)
    print(f"shape {shape} float32, causal mask, median of {args.rounds} rounds (ms)")
    print(f"{'variant':<22}{'forward':>10}{'backward':>10}")
    for name, (f, b) in times.items():
        print(f"{name:<22}{statistics.median(f) * 1e3:>10.1f}{statistics.median(b) * 1e3:>10.1f}")
    return times


if __name__ == "__main__":
    main()
