"""What the memory ledger costs: a small GPT training step with profiling off and on.

    python benchmarks/ledger_overhead.py [--repeat 15] [--batch 32]

Prints a Markdown table: median step time over interleaved repeats (so drifting machine
load hits every variant alike) and the ratio to the step without a profile.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import nn
import tinygrad_attn as ta


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args(argv)

    ta.manual_seed(0)
    cfg = nn.GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
    model = nn.GPT(cfg)
    opt = nn.optim.AdamW(model.parameters(), lr=1e-3)
    idx = ta.randint(0, 65, (args.batch, cfg.block_size))
    targets = ta.randint(0, 65, (args.batch, cfg.block_size))

    def step():
        _, loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()

    def under(**kw):
        def run():
            with ta.memory.profile(**kw):
                step()
        return run

    variants = {
        "no profile": step,
        "profile()": under(),
        "profile(source_lines=True)": under(source_lines=True),
        "profile(raw=True) (tracemalloc)": under(raw=True),
    }
    step()  # warm up
    times = {name: [] for name in variants}
    for _ in range(args.repeat):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["no profile"])
    print(f"small GPT training step (n_layer 4, n_embd 128, T 64, batch {args.batch}), "
          f"median of {args.repeat}\n")
    print("| variant | step ms | ratio |\n|---|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med * 1e3:.0f} | {med / base:.2f}x |")
    print(f"\n{platform.machine()}, Python {platform.python_version()}")


if __name__ == "__main__":
    main()
