"""Cold and warm start: what the compiled kernels add to a fresh process's first step.

Each measurement runs in a fresh Python process (`python -c`), which reports the time of
`import nn, tinygrad_attn`, of the first training step of the shakespeare-char GPT (nn.GPT
+ nn.optim.AdamW: forward, backward, step) and of the second one. Three ways:

    numpy  TINYGRAD_ATTN_KERNELS=numpy: the reference kernels; numba is never imported
    cold   TINYGRAD_ATTN_KERNELS=auto with NUMBA_CACHE_DIR a new empty folder: the first
           step imports numba and compiles every kernel it meets
    warm   the same, with the folder the cold run filled: kernels load from numba's cache

The runs alternate (numpy, cold, warm, numpy, ...) and each cell is the median. "extra"
is the first step's time minus the numpy path's first step: what a user waits for the
compiled kernels; "extra CPU" the same in process CPU time (all threads), which a loaded
machine disturbs less than wall time. Targets: cold <= 5 s, warm <= 0.5 s.

    python benchmarks/start_time.py                   # batch 8, 3 repeats
    python benchmarks/start_time.py --quick           # 1 repeat, batch 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import nn
import tinygrad_attn as ta
t1 = time.perf_counter()
import numpy as np
from tinygrad_attn.backend import kernels
ta.manual_seed(0)
cfg = nn.GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384,
                   dropout=0.0)
model = nn.GPT(cfg)
opt = nn.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
rng = np.random.default_rng(0)
idx = ta.tensor(rng.integers(0, 65, (BATCH, 256)))
tgt = ta.tensor(rng.integers(0, 65, (BATCH, 256)))
steps, cpu = [], []
for _ in range(2):
    s, c = time.perf_counter(), time.process_time()
    _, loss = model(idx, tgt)
    loss.backward()
    opt.step()
    opt.zero_grad()
    steps.append(time.perf_counter() - s)
    cpu.append(time.process_time() - c)
compiled = sorted({k for (k, path), n in kernels.calls.items() if path == "numba" and n})
print(json.dumps({"import": t1 - t0, "first": steps[0], "second": steps[1],
                  "first_cpu": cpu[0], "second_cpu": cpu[1],
                  "numba_imported": "numba" in sys.modules, "compiled": compiled}))
"""


def child(batch: int, kernels: str, cache_dir: str | None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TINYGRAD_ATTN_KERNELS", "NUMBA_CACHE_DIR")}
    env["TINYGRAD_ATTN_KERNELS"] = kernels
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    out = subprocess.run([sys.executable, "-c", CHILD.replace("BATCH", str(batch))],
                         capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(batch: int, repeat: int, numba: bool) -> dict:
    runs = {"numpy": [], "cold": [], "warm": []} if numba else {"numpy": []}
    for rep in range(repeat):
        runs["numpy"].append(child(batch, "numpy", None))
        if numba:
            with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
                runs["cold"].append(child(batch, "auto", cache))
                runs["warm"].append(child(batch, "auto", cache))
        print(f"repeat {rep + 1}/{repeat} done", flush=True)
    return runs


def table(runs: dict) -> str:
    keys = ("import", "first", "second", "first_cpu", "second_cpu")
    med = {m: {k: statistics.median(r[k] for r in rs) for k in keys} for m, rs in runs.items()}
    base, base_cpu = med["numpy"]["first"], med["numpy"]["first_cpu"]
    lines = ["| start | import s | first step s | second step s | extra s | first step CPU s "
             "| extra CPU s | numba imported | compiled kernels |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for m, rs in runs.items():
        c = med[m]
        lines.append(f"| {m} | {c['import']:.2f} | {c['first']:.2f} | {c['second']:.2f} "
                     f"| {c['first'] - base:+.2f} | {c['first_cpu']:.2f} "
                     f"| {c['first_cpu'] - base_cpu:+.2f} | {rs[-1]['numba_imported']} "
                     f"| {', '.join(rs[-1]['compiled']) or '-'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="batch 2, one repeat")
    p.add_argument("--markdown", default=None, help="also write the table to this path")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.repeat = 2, 1
    import importlib.util

    numba = importlib.util.find_spec("numba") is not None
    if not numba:
        print("numba is not installed: only the numpy path is measured.")
    text = table(measure(args.batch, args.repeat, numba))
    head = (f"shakespeare-char GPT (6 layers, n_embd 384, block 256), batch {args.batch}; "
            f"median of {args.repeat} fresh processes per row; extra = first step minus "
            f"the numpy path's first step")
    print()
    print(head)
    print()
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(head + "\n\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
