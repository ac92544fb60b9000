"""The "views" attention: the composition of four nodes against F.causal_attention, which
multiplies only the tiles a causal mask keeps.

    old  F.masked_softmax(q @ k.mT, mask, scale) @ v: the whole (T, T) product each way
    new  F.causal_attention(q, k, v, scale, block_size=bs): query rows [i0, i1) against
         keys [0, i1), for each block size bs asked (bs >= T: one block, the whole product)

Each cell is forward + backward of one call on (B, nh, T, hs) head views of a fused
(B, T, 3C) projection, as the GPT makes them, float32. The variants take turns in every
repeat (the order rotating), so load on the machine hits them alike; the table gives each
variant's median time and the median over the repeats of its time / old's time in the same
repeat (the per-pair ratio), with the spread of those ratios (quartiles).

    python benchmarks/attention_tiles.py                      # both shapes, 2 threads
    python benchmarks/attention_tiles.py --repeat 31 --blocks 32,64,128
    python benchmarks/attention_tiles.py --quick              # a smoke test
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

import tinygrad_attn as ta

F = ta.functional
SHAPES = {"small (B 32, nh 4, T 64, hs 32)": (32, 4, 64, 32),
          "shakespeare (B 32, nh 6, T 256, hs 64)": (32, 6, 256, 64)}


def _heads(B, nh, T, hs, seed=0):
    """q, k, v: (B, nh, T, hs) views of one (B, T, 3C) leaf, and the leaf."""
    rng = np.random.default_rng(seed)
    x = ta.tensor(rng.standard_normal((B, T, 3 * nh * hs)).astype(np.float32),
                  requires_grad=True)
    q, k, v = x.split(nh * hs, dim=2)
    return [t.view(B, T, nh, hs).transpose(1, 2) for t in (q, k, v)], x


def _old(q, k, v, mask, scale, bs):
    T = q.shape[-2]
    return F.masked_softmax(q @ k.mT, mask[:, :, :T, :T], scale=scale) @ v


def _new(q, k, v, mask, scale, bs):
    return F.causal_attention(q, k, v, scale=scale, block_size=bs)


def _step(fn, shape, g, mask, bs):
    (q, k, v), x = _heads(*shape)
    t0 = time.perf_counter()
    y = fn(q, k, v, mask, 1.0 / math.sqrt(shape[-1]), bs)
    y.backward(g)
    return time.perf_counter() - t0


def run(shape, blocks, repeat):
    B, nh, T, hs = shape
    g = ta.tensor(np.random.default_rng(1).standard_normal((B, nh, T, hs)).astype(np.float32))
    mask = (ta.ones(T, T).tril() == 0).view(1, 1, T, T)
    variants = [("old", _old, None)] + [(f"new bs={bs}", _new, bs) for bs in blocks]
    for _, fn, bs in variants:  # warm up: compiled kernels, BLAS threads
        _step(fn, shape, g, mask, bs)
    times = {name: [] for name, _, _ in variants}
    for r in range(repeat):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for name, fn, bs in order:
            times[name].append(_step(fn, shape, g, mask, bs))
    rows = []
    for name, _, _ in variants:
        ratios = sorted(t / o for t, o in zip(times[name], times["old"]))
        q1, q3 = np.percentile(ratios, [25, 75])
        rows.append((name, statistics.median(times[name]) * 1e3, statistics.median(ratios),
                     q1, q3))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--blocks", default="16,32,64,128,256",
                   help="comma-separated block sizes of the new op")
    p.add_argument("--kernels", default="numba", choices=("auto", "numba", "numpy"))
    p.add_argument("--quick", action="store_true", help="B 2, 3 repeats")
    args = p.parse_args(argv)
    ta.set_num_threads(args.threads)
    ta.backend.set_kernels(args.kernels)
    blocks = [int(b) for b in args.blocks.split(",")]
    repeat = 3 if args.quick else args.repeat
    print(f"float32, forward + backward, {args.threads} threads, kernels {args.kernels}, "
          f"{repeat} interleaved repeats; ratio = median of per-repeat new / old "
          "(q1-q3 in brackets)")
    out = {}
    for label, shape in SHAPES.items():
        if args.quick:
            shape = (2,) + shape[1:]
        rows = run(shape, [b for b in blocks if b <= shape[2]] or [shape[2]], repeat)
        out[label] = rows
        print(f"\n{label}")
        print(f"{'variant':<14} {'median ms':>10} {'ratio':>7}  {'(q1-q3)':>13}")
        for name, ms, ratio, q1, q3 in rows:
            print(f"{name:<14} {ms:>10.2f} {ratio:>7.3f}  ({q1:.3f}-{q3:.3f})")
    return out


if __name__ == "__main__":
    main()
