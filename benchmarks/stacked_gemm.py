"""The attention's stacked GEMMs through `backend.matmul`, with its stacked path on and off.

Rows are the six products of the views attention (forward q @ k^T and att @ v, and the
four of backward) on strided views of one qkv buffer, as the GPT makes them, at a config's
shape (B, nh, T, hs). Columns are variants of `backend/threads.py`'s stacked path:

    plain     xp.matmul, as before the path existed
    always    the batch cut into chunks the engine's threads take, every call
    adaptive  the path as it ships: split, but not for a while after a split that lost

The variants take turns within each repeat (their order rotating), so load on the machine
hits them alike; a cell is the median time over the repeats, and "x" the median over the
repeats of plain's time / the variant's. `--step` also times whole training steps of the
small GPT (views and flash attention) with the path off and on, alternating step by step.

    python benchmarks/stacked_gemm.py                      # the small GPT's shape
    python benchmarks/stacked_gemm.py --shape 32,6,256,64  # shakespeare-char's
    python benchmarks/stacked_gemm.py --step --repeat 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import tinygrad_attn as ta  # noqa: E402
from tinygrad_attn.backend import threads  # noqa: E402

VARIANTS = {"plain": {"on": False}, "always": {"on": True, "max": 0},
            "adaptive": {"on": True, "max": None}}
_saved = {}  # each variant's own backoff state, kept while the others run
_current = ["adaptive"]


def _set(variant):
    """Make `variant` threads.matmul's behaviour (its backoff state its own)."""
    _saved[_current[0]] = {k: threads._stacked[k] for k in ("skip", "backoff")}
    threads._stacked.update(_saved.get(variant, {"skip": 0, "backoff": 0}))
    threads._stacked["on"] = VARIANTS[variant]["on"]
    limit = VARIANTS[variant].get("max")
    threads.BACKOFF_MAX = DEFAULT_BACKOFF_MAX if limit is None else limit
    _current[0] = variant


DEFAULT_BACKOFF_MAX = threads.BACKOFF_MAX


def products(B, nh, T, hs, dtype):
    """The views attention's six products: (name, a, b)."""
    rng = np.random.default_rng(0)
    C = nh * hs
    qkv = rng.standard_normal((B, T, 3 * C)).astype(dtype)

    def heads(x):
        return x.reshape(B, T, nh, hs).transpose(0, 2, 1, 3)  # (B, nh, T, hs), strided

    q, k, v = heads(qkv[..., :C]), heads(qkv[..., C:2 * C]), heads(qkv[..., 2 * C:])
    att = rng.standard_normal((B, nh, T, T)).astype(dtype)
    g = rng.standard_normal((B, nh, T, hs)).astype(dtype)
    return [("q @ k^T", q, k.swapaxes(-1, -2)), ("att @ v", att, v),
            ("g @ v^T", g, v.swapaxes(-1, -2)), ("att^T @ g", att.swapaxes(-1, -2), g),
            ("ds @ k", att, k), ("ds^T @ q", att.swapaxes(-1, -2), q)]


def bench_products(shape, dtype, repeat):
    names = list(VARIANTS)
    print(f"shape (B, nh, T, hs) = {shape}, {np.dtype(dtype).name}, "
          f"{ta.get_num_threads()} threads, repeat {repeat}, load {os.getloadavg()[0]:.1f}")
    print(f"| product | {' | '.join(names)} | identical |")
    print("|---|" + "---:|" * len(names) + "---|")
    total = {n: 0.0 for n in names}
    for label, a, b in products(*shape, dtype):
        want = np.matmul(a, b)
        same = []
        for n in names:
            _set(n)
            got = threads.matmul(np, a, b)
            same.append(np.array_equal(got, want) and got.strides == want.strides)
        times = {n: [] for n in names}
        for r in range(repeat):
            for n in names[r % len(names):] + names[:r % len(names)]:
                _set(n)
                t0 = time.perf_counter()
                threads.matmul(np, a, b)
                times[n].append(time.perf_counter() - t0)
        flops = 2 * want.size * a.shape[-1]
        cells = []
        for n in names:
            med = statistics.median(times[n])
            total[n] += med
            ratio = statistics.median(p / t for p, t in zip(times["plain"], times[n]))
            cells.append(f"{med * 1e3:.3f} ms {flops / med / 1e9:.0f} GF/s x{ratio:.2f}")
        print(f"| {label} | {' | '.join(cells)} | {'yes' if all(same) else 'NO'} |")
    print("| sum of medians | " + " | ".join(f"{total[n] * 1e3:.2f} ms" for n in names) + " | |")
    _set("adaptive")


def bench_steps(repeat):
    import nn

    for attn in ("views", "flash"):
        ta.manual_seed(0)
        cfg = nn.GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128,
                           dropout=0.0, attn=attn)
        model = nn.GPT(cfg)
        opt = nn.optim.AdamW(model.parameters(), lr=1e-3)
        rng = np.random.default_rng(0)
        idx = ta.tensor(rng.integers(0, 65, (32, 64)))
        tgt = ta.tensor(rng.integers(0, 65, (32, 64)))

        def step(model=model, opt=opt, idx=idx, tgt=tgt):
            _, loss = model(idx, tgt)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(3):
            step()
        times = {"plain": [], "adaptive": []}
        for r in range(repeat):
            for n in (("plain", "adaptive") if r % 2 else ("adaptive", "plain")):
                _set(n)
                t0 = time.perf_counter()
                step()
                times[n].append(time.perf_counter() - t0)
        ratio = statistics.median(p / t for p, t in zip(times["plain"], times["adaptive"]))
        print(f"small GPT step ({attn}): off {statistics.median(times['plain']) * 1e3:.1f} ms, "
              f"on {statistics.median(times['adaptive']) * 1e3:.1f} ms, median pair ratio "
              f"off/on x{ratio:.3f} ({repeat} pairs, load {os.getloadavg()[0]:.1f}; splits "
              f"so far {threads._stacked['splits']}, lost {threads._stacked['lost']})")
    _set("adaptive")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="32,4,64,32", help="B,nh,T,hs")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeat", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--step", action="store_true", help="also time whole small-GPT steps")
    args = ap.parse_args()
    ta.set_num_threads(args.threads)
    bench_products(tuple(int(s) for s in args.shape.split(",")), args.dtype, args.repeat)
    if args.step:
        bench_steps(max(4, args.repeat // 3))


if __name__ == "__main__":
    main()
