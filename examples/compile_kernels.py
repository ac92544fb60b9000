"""Fill numba's on-disk cache with the compiled kernels a training run uses, before the run.

    python examples/compile_kernels.py          # what examples/train_gpt.py's defaults use
    python examples/compile_kernels.py --all    # also each other --attn, --norm, --mlp,
                                                # --pos-emb, dropout and --checkpoint choice

The first run after installing otherwise compiles its kernels while it trains (in a worker
process, while the steps run the NumPy reference kernels: docs/kernels.md, "Compiling in
the background"), which costs that run some seconds. This script pays that once, up front:
it builds the model train_gpt.py would build (on a short made-up text: the vocabulary
changes no kernel's argument types) and runs one training step and one evaluation with
the kernels set to "numba", which compiles each kernel the step calls, for the argument
types it calls it with, and writes it to the cache (`__pycache__` beside the kernels, or
NUMBA_CACHE_DIR). Every later process, train_gpt.py included, loads them from there in
milliseconds. Run it again after changing a kernel or upgrading numba; it costs seconds
when the cache is warm. Without numba it says so and does nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The default model, then one change from it per choice train_gpt.py offers: the kernels
# each choice adds (a combination of choices calls the same kernels on the same types).
VARIANTS = {
    "default": {},
    "attn naive": {"attn": "naive"},
    "attn flash": {"attn": "flash"},
    "norm rmsnorm": {"norm": "rmsnorm"},
    "mlp swiglu": {"mlp": "swiglu"},
    "pos_emb rope": {"pos_emb": "rope"},
    "dropout 0.1": {"dropout": 0.1},
    "checkpoint": {"checkpoint": True},
}


def compile_variant(changes: dict) -> dict:
    """One training step and one evaluation of train_gpt.py's default model with `changes`,
    kernels "numba"; the compiled kernels called and the seconds it took."""
    from train_gpt import DEFAULT_MODEL  # examples/, on the path (main)

    import tinygrad_attn as ta
    from nn.trainer import TrainConfig, Trainer

    start = time.perf_counter()
    ta.backend.set_kernels("numba")
    text = "".join(chr(32 + (i * 7919) % 95) for i in range(64 * 1024))
    tcfg = TrainConfig(steps=1, eval_iters=1, progress=False)
    trainer = Trainer(dataclasses.replace(DEFAULT_MODEL, **changes), tcfg, text,
                      log=lambda *a, **k: None)
    trainer.train_step()
    trainer.evaluate()
    calls = ta.backend.kernels.calls
    names = sorted({name for (name, path), n in calls.items() if path == "numba" and n})
    return {"seconds": time.perf_counter() - start, "kernels": names}


def _in_a_process(label: str) -> dict:
    """compile_variant(VARIANTS[label]) in a fresh interpreter (runs in parallel)."""
    out = subprocess.run([sys.executable, __file__, "--variant", label], capture_output=True,
                         text=True, cwd=ROOT, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{label}: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--all", action="store_true", help="every choice, not only the defaults")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="variants compiled at once with --all")
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # one, as JSON
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "examples"))
    import importlib.util

    if importlib.util.find_spec("numba") is None:
        print("numba is not installed: nothing to compile (pip install 'tinygrad_attn[fast]')")
        return 0
    if args.variant:
        print(json.dumps(compile_variant(VARIANTS[args.variant])))
        return 0
    start = time.perf_counter()
    # the defaults first, alone: the kernels every variant shares are compiled once, and
    # no two processes write one kernel's cache index at the same time
    results = {"default": _in_a_process("default")}
    rest = [label for label in VARIANTS if label != "default"] if args.all else []
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results.update(zip(rest, pool.map(_in_a_process, rest)))
    for label, res in results.items():
        print(f"{label:14s} {res['seconds']:6.1f} s  {', '.join(res['kernels'])}")
    print(f"compiled into numba's cache in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
