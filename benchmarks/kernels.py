"""The fused kernels op by op: this engine's NumPy path, its numba path, and PyTorch (CPU).

Each row is one op, forward and backward, at the shapes of the shakespeare-char GPT's
training step (batch 32, block 256, n_embd 384, 6 heads, vocab 65), float32:

    gelu, gelu tanh          (32, 256, 1536)   the MLP's activation
    mask+scale+softmax       (32, 6, 256, 256) the attention matrix, causal
    layer_norm, rms_norm     (32, 256, 384)
    cross_entropy            (8192, 65)        logits of every position
    dropout p=0.1            (32, 256, 1536)
    AdamW step               the GPT's 10.7 M parameters; torch foreach and fused

The engines take turns, repeat after repeat, so load on the machine hits them alike, and
the order rotates from one repeat to the next (numpy, numba, torch; then numba, torch,
numpy; ...), so no engine is always timed right after the same other one. Each turn starts
after a pause of PAUSE_S, longer than GNU OpenMP's threads (torch's pool) spin-wait after
an op by default, so an engine's call does not share the cores with another's idle
spinning threads. (On the machine of README's tables the pause made no difference that
could be told from noise: a compiled gelu at (32, 256, 1536) timed right after torch's
took a median of 4.24 and 3.65 ms over 15 calls in two runs, 3.84 and 3.68 ms 0.2 s
later.) Each cell is the median over the repeats. The first numba-path call of a row
compiles its kernels (or loads them from numba's disk cache) and is reported apart, as
"first call". Rows whose op is missing are skipped; the column "compiled" names the
kernels that ran compiled (empty: no compiled twin yet, both paths ran the reference).

    python benchmarks/kernels.py --quick          # small shapes, a smoke test
    python benchmarks/kernels.py --repeat 7 --markdown kernels.md
    python benchmarks/kernels.py --repeat 15 --only gelu,layer_norm   # some rows, no AdamW
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import nn
import tinygrad_attn as ta
from tinygrad_attn.backend import kernels

try:
    import torch
    import torch.nn.functional as TF
except ImportError:
    torch = None

B, T, C, H, V = 32, 256, 384, 6, 65


def shapes(quick: bool) -> dict:
    b = 2 if quick else B
    return {"act": (b, T, 4 * C), "attn": (b, H, T, T), "norm": (b, T, C),
            "logits": (b * T, V)}


# ----------------------------------------------------------------------------- the ops
def _softmax_ours(x, mask, scale):
    F = ta.functional
    if hasattr(F, "masked_softmax"):
        return F.masked_softmax(x, mask, scale=scale)
    return F.softmax(F.masked_fill(x * scale, mask, float("-inf")), -1)


def _softmax_torch(x, mask, scale):
    return TF.softmax((x * scale).masked_fill(mask, float("-inf")), -1)


def op_rows(s: dict) -> list:
    """(name, shape, inputs(rng) -> dict, ours(**inputs), torch(**inputs)); a float input
    named x gets requires_grad, the backward is of the output against a random gradient."""
    act, attn, norm, logits = s["act"], s["attn"], s["norm"], s["logits"]
    causal = np.triu(np.ones((T, T), bool), 1)  # True: masked out (masked_fill's sense)
    scale = 1 / np.sqrt(C // H)
    F = ta.functional
    rows = [
        ("gelu", act, lambda r: {"x": r.standard_normal(act, np.float32)},
         lambda x: F.gelu(x), lambda x: TF.gelu(x)),
        ("gelu tanh", act, lambda r: {"x": r.standard_normal(act, np.float32)},
         lambda x: F.gelu(x, approximate="tanh"), lambda x: TF.gelu(x, approximate="tanh")),
        ("mask+scale+softmax", attn,
         lambda r: {"x": r.standard_normal(attn, np.float32), "mask": causal},
         lambda x, mask: _softmax_ours(x, mask, scale),
         lambda x, mask: _softmax_torch(x, mask, scale)),
        ("layer_norm", norm, lambda r: {"x": r.standard_normal(norm, np.float32),
                                        "w": r.standard_normal(C, np.float32),
                                        "b": r.standard_normal(C, np.float32)},
         lambda x, w, b: F.layer_norm(x, (C,), w, b),
         lambda x, w, b: TF.layer_norm(x, (C,), w, b)),
        ("rms_norm", norm, lambda r: {"x": r.standard_normal(norm, np.float32),
                                      "w": r.standard_normal(C, np.float32)},
         lambda x, w: F.rms_norm(x, (C,), w, eps=1e-5),
         lambda x, w: TF.rms_norm(x, (C,), w, eps=1e-5)),
        ("cross_entropy", logits,
         lambda r: {"x": r.standard_normal(logits, np.float32),
                    "target": r.integers(0, V, logits[0])},
         lambda x, target: F.cross_entropy(x, target),
         lambda x, target: TF.cross_entropy(x, target)),
        ("dropout p=0.1", act, lambda r: {"x": r.standard_normal(act, np.float32)},
         lambda x: F.dropout(x, 0.1), lambda x: TF.dropout(x, 0.1)),
    ]
    return [row for row in rows if hasattr(F, row[0].split()[0].replace("mask+scale+", ""))]


def _leaves(lib, inputs: dict) -> dict:
    out = {}
    for k, a in inputs.items():
        floating = a.dtype.kind == "f"
        if lib == "torch":
            t = torch.from_numpy(a.copy())
            out[k] = t.requires_grad_() if k == "x" else t
        elif floating or a.dtype == bool:
            out[k] = ta.tensor(a, requires_grad=k == "x")
        else:
            out[k] = ta.tensor(a)
    return out


def fwd_bwd(fn, leaves: dict, grad) -> tuple[float, float]:
    """Seconds of one forward and one backward."""
    t0 = time.perf_counter()
    y = fn(**leaves)
    t1 = time.perf_counter()
    if y.ndim == 0:
        y.backward()
    else:
        y.backward(grad)
    t2 = time.perf_counter()
    leaves["x"].grad = None
    return t1 - t0, t2 - t1


# ----------------------------------------------------------------------------- AdamW
def adamw_setup(quick: bool, fused: bool):
    """(ours_step, torch_step) over the GPT's parameters with the same random gradients."""
    cfg = nn.GPTConfig(vocab_size=V, block_size=T, n_layer=1 if quick else 6, n_head=H,
                       n_embd=C)
    params = list(nn.GPT(cfg).parameters())
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(p.shape, np.float32) * 1e-2 for p in params]
    for p, g in zip(params, grads):
        p.grad = ta.tensor(g)
    ours = nn.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    tparams = [torch.from_numpy(p.detach().numpy().copy()).requires_grad_()
               for p in params]
    for p, g in zip(tparams, grads):
        p.grad = torch.from_numpy(g.copy())
    kind = {"fused": True} if fused else {"foreach": True}
    theirs = torch.optim.AdamW(tparams, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, **kind)
    n = sum(p.numel() for p in tparams)
    return ours.step, theirs.step, n


# ----------------------------------------------------------------------------- timing
ENGINES = ("numpy", "numba", "torch")


PAUSE_S = 0.05  # before each engine's turn: longer than OpenMP's spin-wait after an op


def run_row(make_runs, engines, repeat: int) -> dict:
    """make_runs() -> {engine: run() -> tuple of seconds}. The engines take turns in a
    rotating order; repeat 0 is a warm-up (for numba: the compile, kept as `first`)."""
    runs = make_runs()
    times = {e: [] for e in engines}
    first = None
    before = set(kernels.calls.items())
    for rep in range(repeat + 1):
        k = rep % len(engines)
        for e in engines[k:] + engines[:k]:
            if e != "torch":
                kernels.set_kernels(e)
            gc.collect()
            time.sleep(PAUSE_S)
            t = runs[e]()
            if rep == 0:
                if e == "numba":
                    first = sum(t)
                continue
            times[e].append(t)
    kernels.set_kernels("auto")
    compiled = {k for (k, path), n in set(kernels.calls.items()) - before if path == "numba"}
    med = {e: [statistics.median(col) for col in zip(*times[e])] for e in engines}
    return {"median": med, "first": first, "compiled": sorted(compiled)}


def _wanted(name: str, only) -> bool:
    return only is None or name in only


def bench_ops(args, engines, rows_out):
    rng = np.random.default_rng(0)
    for name, shape, inputs, ours, theirs in op_rows(shapes(args.quick)):
        if not _wanted(name, args.only):
            continue
        data = inputs(rng)
        out_shape = tuple(theirs(**_leaves("torch", data)).shape)
        g = rng.standard_normal(out_shape, np.float32) if out_shape else None

        def make_runs(data=data, ours=ours, theirs=theirs, g=g):
            ol, tl = _leaves("ours", data), _leaves("torch", data)
            og = None if g is None else ta.tensor(g)
            tg = None if g is None else torch.from_numpy(g.copy())
            run = {e: (lambda: fwd_bwd(ours, ol, og)) for e in ("numpy", "numba")}
            run["torch"] = lambda: fwd_bwd(theirs, tl, tg)
            return run

        r = run_row(make_runs, engines, args.repeat)
        for i, part in enumerate(("fwd", "bwd")):
            rows_out.append(_row(f"{name} {part}", shape, r, i, engines))
        print(f"{name}: done", flush=True)


def bench_adamw(args, engines, rows_out):
    for fused in (False, True):
        holder = {}

        def make_runs(fused=fused, holder=holder):
            ours, theirs, n = adamw_setup(args.quick, fused)
            holder["n"] = n

            def timed(step):
                t0 = time.perf_counter()
                step()
                return (time.perf_counter() - t0,)

            run = {e: (lambda: timed(ours)) for e in ("numpy", "numba")}
            run["torch"] = lambda: timed(theirs)
            return run

        r = run_row(make_runs, engines, args.repeat)
        label = f"AdamW step (torch {'fused' if fused else 'foreach'})"
        rows_out.append(_row(label, (holder["n"],), r, 0, engines))
        print(f"{label}: done", flush=True)


def _row(name, shape, r, i, engines) -> dict:
    ms = {e: r["median"][e][i] * 1e3 for e in engines}
    return {"op": name, "shape": "x".join(map(str, shape)), **ms,
            "first": None if r["first"] is None or i else r["first"] * 1e3,
            "compiled": ", ".join(r["compiled"])}


# ----------------------------------------------------------------------------- output
def table(rows, engines) -> str:
    head = ["op", "shape", "numpy ms", "numba ms", "torch ms", "numba/torch", "numpy/torch",
            "numba first call ms", "compiled"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(v):
        return "-" if v is None else f"{v:.2f}"

    for r in rows:
        ratio = (r["numba"] / r["torch"]) if "numba" in engines else None
        cells = [r["op"], r["shape"], f(r.get("numpy")), f(r.get("numba")), f(r["torch"]),
                 f(ratio), f(r["numpy"] / r["torch"]), f(r["first"]), r["compiled"] or "-"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def machine_line(threads: int) -> str:
    return (f"Machine: {platform.platform()}, {os.cpu_count()} CPUs; Python "
            f"{platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}; "
            f"threads {threads} (ta.set_num_threads: OpenBLAS and numba; "
            f"torch.set_num_threads); float32.")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5, help="timed repeats per engine")
    p.add_argument("--quick", action="store_true", help="batch 2, 1-layer GPT, 2 repeats")
    p.add_argument("--threads", type=int, default=ta.get_num_threads())
    p.add_argument("--markdown", default=None, help="also write the table to this path")
    p.add_argument("--only", default=None,
                   help="comma-separated rows to run, by op name (e.g. 'gelu,dropout p=0.1'); "
                        "'adamw' for the AdamW rows")
    args = p.parse_args(argv)
    args.only = None if args.only is None else {n.strip() for n in args.only.split(",")}
    if torch is None:
        print("kernels.py compares against PyTorch, which is not installed. Nothing measured.")
        return 0
    if args.quick:
        args.repeat = min(args.repeat, 2)
    engines = ENGINES if kernels.numba_available() else ("numpy", "torch")
    ta.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    machine = machine_line(args.threads)
    print(machine, flush=True)
    rows = []
    bench_ops(args, engines, rows)
    if _wanted("adamw", args.only):
        bench_adamw(args, engines, rows)
    text = "\n\n".join([machine, table(rows, engines)])
    print()
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
        print(f"\nwrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
