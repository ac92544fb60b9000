"""How a training step's memory and time grow with sequence length T, per attention.

    python benchmarks/seq_sweep.py [--lengths 64,128,256,512,1024] [--batch 4]

One step (forward, backward, AdamW) of a small GPT (n_layer 2, n_head 4, n_embd 128) for
each T and each attention implementation, under the memory ledger. Prints a Markdown
table of saved-for-backward bytes, the tensor-level peak and the step time, and the
growth factor of saved bytes per doubling of T: about 2 means linear in T, about 4
quadratic. "views" keeps one T x T probability matrix per layer; "flash" none.
"""

from __future__ import annotations

import argparse
import platform
import time

import nn
import tinygrad_attn as ta


def step_figures(attn: str, T: int, batch: int) -> dict:
    ta.manual_seed(0)
    cfg = nn.GPTConfig(vocab_size=65, block_size=T, n_layer=2, n_head=4, n_embd=128,
                       attn=attn)
    model = nn.GPT(cfg)
    opt = nn.optim.AdamW(model.parameters(), lr=1e-3)
    idx = ta.randint(0, 65, (batch, T))
    t0 = time.perf_counter()
    with ta.memory.profile() as prof:
        _, loss = model(idx, idx)
        loss.backward()
        opt.step()
        opt.zero_grad()
    seconds = time.perf_counter() - t0
    s = prof.summary()
    return {"saved": s["saved_peak"]["unique_bytes_without_parameters"],
            "peak": s["tensor_peak_above_start"], "seconds": seconds}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="64,128,256,512,1024")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--attn", default="views,flash")
    args = p.parse_args(argv)
    lengths = [int(t) for t in args.lengths.split(",")]
    impls = args.attn.split(",")
    mib = 2**20
    print(f"one training step, n_layer 2, n_head 4, n_embd 128, batch {args.batch}, float32\n")
    print("| attn | T | saved MiB | x per doubling | peak MiB | step s |")
    print("|---|---:|---:|---:|---:|---:|")
    for attn in impls:
        prev = None
        for T in lengths:
            r = step_figures(attn, T, args.batch)
            growth = f"{r['saved'] / prev:.2f}" if prev else "-"
            print(f"| {attn} | {T} | {r['saved'] / mib:.2f} | {growth} | "
                  f"{r['peak'] / mib:.2f} | {r['seconds']:.2f} |", flush=True)
            prev = r["saved"]
    print(f"\n{platform.machine()}, Python {platform.python_version()}; step time includes "
          "the ledger's bookkeeping (about 5%)")


if __name__ == "__main__":
    main()
