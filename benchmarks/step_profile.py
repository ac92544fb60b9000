"""Where a GPT training step's time goes: per op (forward and backward), GEMMs by shape,
the optimizer, and the page faults of the step.

Every engine op is a `ta.Function` subclass; this script wraps each one's forward and
backward with a timer for the run (nested calls, such as a recompute inside a Matmul
backward, count in both). NumPy's matmul is wrapped too, to give each GEMM shape its time
and GFLOP/s. Minor page faults and system time come from getrusage around each step.

The fused kernels run inside the Functions, so the op table covers them; the kernel table
adds, per kernel, its calls on each path (`backend.kernels.calls`) and the time of the
compiled ones (the compiled module's functions are wrapped with a timer once it loads).
`--kernels` picks the path (ta.backend.set_kernels), `--threads` the thread count.

    python benchmarks/step_profile.py                         # shakespeare-char, B 8, views
    python benchmarks/step_profile.py --batch 32 --attn flash --policy recompute
    python benchmarks/step_profile.py --host-cache off        # glibc's default allocator
    python benchmarks/step_profile.py --kernels numpy         # the reference kernels only
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import statistics
import sys
import time

import numpy as np

import nn
import tinygrad_attn as ta
from tinygrad_attn.backend import kernels


def subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from subclasses(sub)


class Timers:
    """Wall time per (op, forward/backward) and per GEMM shape, while installed."""

    def __init__(self):
        self.ops = collections.defaultdict(float)
        self.gemm = collections.defaultdict(lambda: [0, 0.0, 0.0])
        self.compiled = collections.defaultdict(float)
        self._undo = []

    def _wrap_method(self, cls, name):
        raw = cls.__dict__.get(name)
        if raw is None:
            return
        fn = raw.__func__ if isinstance(raw, staticmethod) else raw
        key = (cls.__name__, name)
        ops = self.ops

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                ops[key] += time.perf_counter() - t0

        setattr(cls, name, staticmethod(timed) if isinstance(raw, staticmethod) else timed)
        self._undo.append((cls, name, raw))

    def install(self, optimizer_cls):
        for cls in set(subclasses(ta.Function)):
            self._wrap_method(cls, "forward")
            self._wrap_method(cls, "backward")
        step = optimizer_cls.step
        ops = self.ops

        def timed_step(opt, *a, **k):
            t0 = time.perf_counter()
            try:
                return step(opt, *a, **k)
            finally:
                ops[(optimizer_cls.__name__, "step")] += time.perf_counter() - t0

        optimizer_cls.step = timed_step
        self._undo.append((optimizer_cls, "step", step))
        matmul = np.matmul
        gemm = self.gemm

        def timed_matmul(a, b, *args, **kwargs):
            t0 = time.perf_counter()
            out = matmul(a, b, *args, **kwargs)
            dt = time.perf_counter() - t0
            key = (a.shape, tuple(s // a.itemsize for s in a.strides),
                   b.shape, tuple(s // b.itemsize for s in b.strides))
            rec = gemm[key]
            rec[0] += 1
            rec[1] += dt
            rec[2] += 2.0 * out.size * a.shape[-1]
            return out

        np.matmul = timed_matmul
        self._undo.append((np, "matmul", matmul))
        self._wrap_compiled()

    def _wrap_compiled(self):
        """Time the compiled kernels (the layer looks each one up on the module per call)."""
        if kernels.get_kernels() == "numpy" or not kernels.numba_available():
            return
        module = kernels._load_compiled()
        compiled = self.compiled
        for name in kernel_names():
            fn = getattr(module, name, None)
            if fn is None:
                continue

            def timed(*args, _fn=fn, _name=name, **kwargs):
                t0 = time.perf_counter()
                try:
                    return _fn(*args, **kwargs)
                finally:
                    compiled[_name] += time.perf_counter() - t0

            setattr(module, name, timed)
            self._undo.append((module, name, fn))

    def clear(self):
        self.ops.clear()
        self.gemm.clear()
        self.compiled.clear()

    def uninstall(self):
        for obj, name, raw in reversed(self._undo):
            setattr(obj, name, raw)
        self._undo = []


def kernel_names() -> list[str]:
    """The kernels with a choice of path (declared with the layer's _kernel)."""
    return sorted(n for n in dir(kernels) if hasattr(getattr(kernels, n), "__wrapped__"))


def training_step(batch: int, attn: str):
    """One training step of the shakespeare-char GPT on a fixed batch, as a function."""
    ta.manual_seed(0)
    cfg = nn.GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384,
                       dropout=0.0, attn=attn)
    model = nn.GPT(cfg)
    opt = nn.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                         weight_decay=0.1)
    rng = np.random.default_rng(0)
    idx = ta.tensor(rng.integers(0, 65, (batch, 256)))
    tgt = ta.tensor(rng.integers(0, 65, (batch, 256)))

    def step():
        _, loss = model(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad()

    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--attn", default="views", choices=("naive", "views", "flash"))
    p.add_argument("--policy", default="save", choices=("save", "recompute"))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--host-cache", choices=("on", "off"), default="on")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--kernels", default="auto", choices=kernels.MODES)
    p.add_argument("--threads", type=int, default=ta.get_num_threads())
    args = p.parse_args(argv)

    if args.host_cache == "off" and os.environ.get("TINYGRAD_ATTN_KEEP_HOST_MEMORY") != "0":
        # glibc's untouched malloc (its dynamic mmap threshold) needs the setting left alone
        # from the start: rerun this script with the engine's opt-out set
        os.environ["TINYGRAD_ATTN_KEEP_HOST_MEMORY"] = "0"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    ta.backend.set_kernels(args.kernels)
    ta.set_num_threads(args.threads)
    ta.memory.save_policy("gelu", args.policy)
    ta.memory.save_policy("layer_norm", args.policy)
    step = training_step(args.batch, args.attn)
    step()  # warm-up: optimizer state, first-touch of the heap
    plain, faults, sys_s = [], [], []
    for _ in range(args.steps):
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        step()
        plain.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        faults.append(r1.ru_minflt - r0.ru_minflt)
        sys_s.append(r1.ru_stime - r0.ru_stime)

    timers = Timers()
    timers.install(nn.optim.AdamW)
    try:
        step()
        timers.clear()
        before = kernels.calls.copy()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        timed = (time.perf_counter() - t0) / args.steps
        counts = kernels.calls - before
    finally:
        timers.uninstall()
    report(args, timers, counts, plain, faults, sys_s, timed)
    return 0


def report(args, timers, counts, plain, faults, sys_s, timed) -> None:
    n = args.steps
    print(f"shakespeare-char GPT, batch {args.batch}, attn {args.attn}, policy {args.policy}, "
          f"host cache {args.host_cache}, kernels {args.kernels}, threads {args.threads}; "
          f"{n} steps after one warm-up")
    print(f"step s (median, untimed run) {statistics.median(plain):.3f}; with timers "
          f"{timed:.3f}; minor page faults per step {statistics.median(faults):.0f}; "
          f"system time per step {statistics.median(sys_s):.3f} s")
    print()
    print("| op | ms per step | share of step |")
    print("|---|---:|---:|")
    for (op, kind), secs in sorted(timers.ops.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"| {op}.{kind} | {secs / n * 1e3:.1f} | {secs / n / timed:.0%} |")
    total = sum(r[1] for r in timers.gemm.values()) / n
    flops = sum(r[2] for r in timers.gemm.values()) / n
    print()
    print(f"GEMMs: {total:.3f} s per step ({total / timed:.0%} of the step), "
          f"{flops / total / 1e9:.0f} GFLOP/s on average")
    print()
    print("| a shape (strides) | b shape (strides) | calls | ms per step | GFLOP/s |")
    print("|---|---|---:|---:|---:|")
    for (ash, ast, bsh, bst), (calls, secs, fl) in sorted(timers.gemm.items(),
                                                          key=lambda kv: -kv[1][1])[:12]:
        print(f"| {ash} ({ast}) | {bsh} ({bst}) | {calls // n} | {secs / n * 1e3:.1f} "
              f"| {fl / secs / 1e9:.0f} |")
    print()
    print("| kernel | numba calls per step | numpy calls per step | compiled ms per step |")
    print("|---|---:|---:|---:|")
    for name in kernel_names():
        nb, ref = counts[name, "numba"] / n, counts[name, "numpy"] / n
        if nb or ref:
            ms = f"{timers.compiled[name] / n * 1e3:.1f}" if nb else "-"
            print(f"| {name} | {nb:g} | {ref:g} | {ms} |")


if __name__ == "__main__":
    sys.exit(main())
