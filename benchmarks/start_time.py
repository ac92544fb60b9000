"""Cold and warm start: what the compiled kernels add to a fresh process's first step.

Each measurement runs in a fresh Python process (`python -c`), which reports the time of
`import nn, tinygrad_attn` and of each of the first N training steps (--steps, 5) of the
shakespeare-char GPT (nn.GPT + nn.optim.AdamW: forward, backward, step). Three ways:

    numpy  TINYGRAD_ATTN_KERNELS=numpy: the reference kernels; numba is never imported
    cold   TINYGRAD_ATTN_KERNELS=auto with NUMBA_CACHE_DIR a new empty folder: numba is
           imported and every kernel compiled, in a background thread while the steps run
           the reference kernels (docs/kernels.md, "Compiling in the background")
    warm   the same, with the folder the cold run filled: kernels load from numba's cache

The runs alternate (numpy, cold, warm, numpy, ...) and each cell is the median. "extra"
is the first step's time minus the numpy path's first step: what a user waits for the
compiled kernels; "extra CPU" the same in process CPU time (all threads), which a loaded
machine disturbs less than wall time. Since compiling in the background moves its cost
onto the steps that run beside it, "first N" is the sum of the first N steps and "extra N"
that minus the numpy path's: the whole cost of the start, wherever it falls. "compiled
at" is when the background compiler had nothing left, in seconds from the first step's
start (after the N steps, wait_compiled() waits for it). Targets: cold <= 5 s, warm <= 0.5 s
on the first step.

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
start = time.perf_counter()
for _ in range(STEPS):
    s, c = time.perf_counter(), time.process_time()
    _, loss = model(idx, tgt)
    loss.backward()
    opt.step()
    opt.zero_grad()
    steps.append(time.perf_counter() - s)
    cpu.append(time.process_time() - c)
wait = getattr(kernels, "wait_compiled", None)
done = wait(600) and time.perf_counter() - start if wait else None
compiled = sorted({k for (k, path), n in kernels.calls.items() if path == "numba" and n})
failed = sorted(str(k[0]) for k in getattr(kernels, "_bg", {}).get("failed", {}))
print(json.dumps({"import": t1 - t0, "first": steps[0], "second": steps[1],
                  "first_n": sum(steps), "last": steps[-1], "steps": steps,
                  "first_cpu": cpu[0], "second_cpu": cpu[1], "compiled_at": done,
                  "numba_imported": "numba" in sys.modules, "compiled": compiled,
                  "failed": failed}))
"""


def child(batch: int, steps: int, kernels: str, cache_dir: str | None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TINYGRAD_ATTN_KERNELS", "NUMBA_CACHE_DIR")}
    env["TINYGRAD_ATTN_KERNELS"] = kernels
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    code = CHILD.replace("BATCH", str(batch)).replace("STEPS", str(steps))
    out = subprocess.run([sys.executable, "-c", code],
                         capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(batch: int, steps: int, repeat: int, numba: bool) -> dict:
    runs = {"numpy": [], "cold": [], "warm": []} if numba else {"numpy": []}
    for rep in range(repeat):
        runs["numpy"].append(child(batch, steps, "numpy", None))
        if numba:
            with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
                runs["cold"].append(child(batch, steps, "auto", cache))
                runs["warm"].append(child(batch, steps, "auto", cache))
        print(f"repeat {rep + 1}/{repeat} done", flush=True)
    return runs


def _median(rs, key):
    values = [r[key] for r in rs if r[key] is not None]
    return statistics.median(values) if values else None


def table(runs: dict, steps: int) -> str:
    keys = ("import", "first", "second", "first_n", "last", "first_cpu", "compiled_at")
    med = {m: {k: _median(rs, k) for k in keys} for m, rs in runs.items()}
    base = med["numpy"]
    lines = [f"| start | import s | first step s | second step s | first {steps} steps s "
             f"| step {steps} s | extra s | extra {steps} s | first step CPU s | extra CPU s "
             "| compiled at s | numba imported | compiled kernels |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for m, rs in runs.items():
        c = med[m]
        at = "-" if c["compiled_at"] is None or m == "numpy" else f"{c['compiled_at']:.2f}"
        failed = sorted({k for r in rs for k in r.get("failed", [])})
        names = ", ".join(rs[-1]["compiled"]) or "-"
        if failed:
            names += f" (compiled on the caller's thread: {', '.join(failed)})"
        lines.append(f"| {m} | {c['import']:.2f} | {c['first']:.2f} | {c['second']:.2f} "
                     f"| {c['first_n']:.2f} | {c['last']:.2f} | {c['first'] - base['first']:+.2f} "
                     f"| {c['first_n'] - base['first_n']:+.2f} | {c['first_cpu']:.2f} "
                     f"| {c['first_cpu'] - base['first_cpu']:+.2f} | {at} "
                     f"| {rs[-1]['numba_imported']} | {names} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--steps", type=int, default=5, help="steps timed per process (>= 2)")
    p.add_argument("--quick", action="store_true", help="batch 2, one repeat")
    p.add_argument("--markdown", default=None, help="also write the table to this path")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.repeat = 2, 1
    import importlib.util

    numba = importlib.util.find_spec("numba") is not None
    if not numba:
        print("numba is not installed: only the numpy path is measured.")
    runs = measure(args.batch, max(args.steps, 2), args.repeat, numba)
    text = table(runs, max(args.steps, 2))
    head = (f"shakespeare-char GPT (6 layers, n_embd 384, block 256), batch {args.batch}; "
            f"median of {args.repeat} fresh processes per row; extra = first step minus "
            f"the numpy path's first step; extra {max(args.steps, 2)}: the same over the "
            f"first {max(args.steps, 2)} steps")
    print()
    print(head)
    print()
    print(text)
    print()
    print("each step, per process (s):")
    for m, rs in runs.items():
        for r in rs:
            print(f"  {m:5s} " + " ".join(f"{t:.2f}" for t in r["steps"]))
    if args.markdown:
        Path(args.markdown).write_text(head + "\n\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
