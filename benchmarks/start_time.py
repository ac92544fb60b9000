"""Cold and warm start: what the compiled kernels add to a fresh process's first step.

Each measurement runs in a fresh Python process (`python -c`), which reports the time of
`import nn, tinygrad_attn` and of each of the first N training steps (--steps, 5) of the
shakespeare-char GPT (nn.GPT + nn.optim.AdamW: forward, backward, step). Three ways:

    numpy  TINYGRAD_ATTN_KERNELS=numpy: the reference kernels; numba is never imported
    cold   TINYGRAD_ATTN_KERNELS=auto with NUMBA_CACHE_DIR a new empty folder: numba is
           imported and every kernel compiled, in a worker process while the steps run
           the reference kernels (docs/kernels.md, "Compiling in the background")
    warm   the same, with the folder the cold run filled: each kernel loads from numba's
           cache on its first call

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
    python benchmarks/start_time.py --during-compile 4 --batch 4
                                   # steps while the compiler runs (interleaved, 4 cycles)
    python benchmarks/start_time.py --main 100 --repeat 2
                                   # the main command itself: examples/train_gpt.py

--main STEPS times the README's main command, `examples/train_gpt.py` with its defaults
(--steps STEPS, no evaluation or sample), each repeat with two new empty numba caches:
"cold" on the first (the first run after installing: it compiles while it trains; a run
shorter than the compile ends with the worker killed mid-way, so give it the default 600
steps for the whole cost), then on the second `examples/compile_kernels.py`, the run
after it, and the run again ("warm", the baseline). "CPU" counts the process and its
children (the compiler's worker), which a loaded machine disturbs less than wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The shakespeare-char GPT and one batch, as both child scripts below build them.
MODEL = """
ta.manual_seed(0)
cfg = nn.GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384,
                   dropout=0.0)
model = nn.GPT(cfg)
opt = nn.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
rng = np.random.default_rng(0)
idx = ta.tensor(rng.integers(0, 65, (BATCH, 256)))
tgt = ta.tensor(rng.integers(0, 65, (BATCH, 256)))
"""

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import nn
import tinygrad_attn as ta
t1 = time.perf_counter()
import numpy as np
from tinygrad_attn.backend import kernels
""" + MODEL + """steps, cpu = [], []
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
failed = sorted(str(k[0]) for k in kernels.background._bg.get("failed", {}))
print(json.dumps({"import": t1 - t0, "first": steps[0], "second": steps[1],
                  "first_n": sum(steps), "last": steps[-1], "steps": steps,
                  "first_cpu": cpu[0], "second_cpu": cpu[1], "compiled_at": done,
                  "numba_imported": "numba" in sys.modules, "compiled": compiled,
                  "failed": failed}))
"""

# Step times while the background compiler runs, against steps with it held still, in one
# process and interleaved (a loaded machine's drift falls on every column alike). The model
# runs the reference kernels ("numpy"), so its steps never wait for the compiler's lock;
# the compiler is given kernels to compile (float64 and read-only variants the model never
# calls) from an empty cache. "held" steps hold the launch lock, so the compiler waits on
# it without the GIL; the other columns let it run, at each GIL switch interval.
DURING = """
import json, sys, time
import nn
import tinygrad_attn as ta
import numpy as np
from tinygrad_attn.backend import kernels
from tinygrad_attn.backend.kernels import background
kernels.set_kernels("numpy")
""" + MODEL + """def step():
    s = time.perf_counter()
    _, loss = model(idx, tgt)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return time.perf_counter() - s
step()
for ro, dt, shape in [(r, d, s) for s in ((4, 8), (2, 4, 8)) for r in (False, True)
                      for d in (np.float64, np.float32)]:
    x, w, t = np.ones(shape, dt), np.ones(8, dt), np.zeros(shape[:-1], np.int64)
    for a in (x, w):
        a.setflags(write=not ro)
    for name, args in [("gelu_forward", (x,)), ("gelu_backward", (x, x)),
                       ("softmax_forward", (x,)), ("softmax_backward", (x, x)),
                       ("log_softmax_forward", (x,)), ("log_softmax_backward", (x, x)),
                       ("layer_norm_forward", (x, w, w, 1e-5)),
                       ("cross_entropy_forward", (x, t, -100)),
                       ("bias_gelu_forward", (x, w, "none")),
                       ("rms_norm_forward", (x, w, 1e-5))]:
        background.first_call(background.key(name, args, {}), name, args, {})
queued = len(background._bg["queue"])
rows = []
for cycle in range(CYCLES):
    labels = ["held", "5 ms", "0.5 ms", "0.1 ms"]
    for label in labels[cycle % 4:] + labels[:cycle % 4]:  # each order in turn
        before = len(background._bg["ready"])
        if label == "held":
            with kernels._state["launch"]:
                before = len(background._bg["ready"])
                t = step()
        else:
            sys.setswitchinterval(float(label.split()[0]) / 1000)
            t = step()
            sys.setswitchinterval(0.005)
        rows.append((label, t, len(background._bg["ready"]) - before))
left = len(background._bg["queue"])
print(json.dumps({"rows": rows, "queued": queued, "left": left}))
"""


def during_compile(batch: int, cycles: int) -> str:
    """The DURING measurement in one fresh process with an empty cache, as a table."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    code = DURING.replace("BATCH", str(batch)).replace("CYCLES", str(cycles))
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        env["NUMBA_CACHE_DIR"] = cache
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, cwd=ROOT, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    lines = [f"steps of batch {batch} on the reference kernels while the background compiler "
             f"runs ({res['queued']} kernels queued, {res['left']} left at the end); "
             f"median of {cycles} interleaved cycles", "",
             "| compiler | GIL switch interval | step s | vs held | kernels compiled per "
             "step |", "|---|---|---:|---:|---:|"]
    held = statistics.median(t for lab, t, _ in res["rows"] if lab == "held")
    for label in ("held", "5 ms", "0.5 ms", "0.1 ms"):
        ts = [t for lab, t, _ in res["rows"] if lab == label]
        done = [n for lab, _, n in res["rows"] if lab == label]
        lines.append(f"| {'held (waits on the lock)' if label == 'held' else 'compiling'} "
                     f"| {'5 ms' if label == 'held' else label} | {statistics.median(ts):.2f} "
                     f"| {statistics.median(ts) / held:.2f}x | {statistics.mean(done):.1f} |")
    return "\n".join(lines)


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


def _timed(command: list, env: dict) -> tuple[float, float]:
    """(wall s, CPU s of the command and its children) of one command."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main_command(steps: int, repeat: int) -> str:
    """The --main table: examples/train_gpt.py cold, warm and prepared."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TINYGRAD_ATTN_KERNELS", "NUMBA_CACHE_DIR")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    rows: dict = {"cold": [], "prepare": [], "prepared": [], "warm": []}
    for rep in range(repeat):
        with tempfile.TemporaryDirectory(prefix="start-time-") as tmp:
            train = [sys.executable, str(ROOT / "examples" / "train_gpt.py"), "--steps",
                     str(steps), "--eval-every", "0", "--sample-tokens", "0",
                     "--no-progress", "--overwrite", "--out", os.path.join(tmp, "run")]
            for cache in ("a", "b"):
                os.mkdir(os.path.join(tmp, cache))
            run_a = {**env, "NUMBA_CACHE_DIR": os.path.join(tmp, "a")}
            run_b = {**env, "NUMBA_CACHE_DIR": os.path.join(tmp, "b")}
            rows["cold"].append(_timed(train, run_a))
            rows["prepare"].append(_timed([sys.executable, str(ROOT / "examples" /
                                                               "compile_kernels.py")], run_b))
            rows["prepared"].append(_timed(train, run_b))
            rows["warm"].append(_timed(train, run_b))
        print(f"repeat {rep + 1}/{repeat} done", flush=True)
    warm_wall = statistics.median(w for w, _ in rows["warm"])
    warm_cpu = statistics.median(c for _, c in rows["warm"])
    lines = [f"examples/train_gpt.py --steps {steps} (defaults otherwise, no evaluation or "
             f"sample); median of {repeat} fresh processes per row, interleaved", "",
             "| run | wall s | vs warm s | CPU s | vs warm CPU s | each wall s |",
             "|---|---:|---:|---:|---:|---|"]
    what = {"cold": "cold (empty cache)", "prepare": "examples/compile_kernels.py (empty "
            "cache)", "prepared": "after compile_kernels.py", "warm": "warm (the same again)"}
    for key, label in what.items():
        wall = statistics.median(w for w, _ in rows[key])
        cpu = statistics.median(c for _, c in rows[key])
        vs = (f"{wall - warm_wall:+.1f} | {cpu:.1f} | {cpu - warm_cpu:+.1f}"
              if key != "prepare" else f"- | {cpu:.1f} | -")
        lines.append(f"| {label} | {wall:.1f} | {vs} | "
                     f"{' '.join(f'{w:.1f}' for w, _ in rows[key])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--steps", type=int, default=5, help="steps timed per process (>= 2)")
    p.add_argument("--quick", action="store_true", help="batch 2, one repeat")
    p.add_argument("--markdown", default=None, help="also write the table to this path")
    p.add_argument("--during-compile", type=int, default=0, metavar="CYCLES",
                   help="instead: step times while the background compiler runs")
    p.add_argument("--main", type=int, default=0, metavar="STEPS",
                   help="instead: the main command (examples/train_gpt.py), cold and warm")
    args = p.parse_args(argv)
    if args.main:
        print(main_command(args.main, args.repeat))
        return 0
    if args.quick:
        args.batch, args.repeat = 2, 1
    if args.during_compile:
        print(during_compile(args.batch, args.during_compile))
        return 0
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
