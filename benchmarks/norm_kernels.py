"""The norm and loss kernels, side by side in one process: the NumPy reference, the compiled
(numba) twin, the whole op through the engine on each path, and PyTorch CPU.

    layer_norm    (32, 256, 384) float32, weight and bias, normalized over the last dim
    rms_norm      (32, 256, 384) float32, weight
    cross_entropy (8192, 65) float32 logits, mean reduction, one row in 10 ignored

Columns (milliseconds): `reference` and `compiled` call the kernels on arrays (forward:
`*_forward`; backward: `*_backward` with every gradient wanted); `engine numpy` and
`engine numba` run the op on tensors that require grad (forward) and its backward with
retain_graph (backward), kernels set to that mode; `torch` the same op and autograd.grad.
Each cell is the best of --rounds rounds of --iters calls; the rounds go round-robin over
the columns, so a busy machine slows all of them alike. Threads: numba's and torch's count
are both set to --threads (default ta.get_num_threads()).

    python benchmarks/norm_kernels.py              # ~1 minute
    python benchmarks/norm_kernels.py --rounds 3   # quicker, noisier
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import tinygrad_attn as ta
import tinygrad_attn.functional as F
from tinygrad_attn.backend import kernels
from tinygrad_attn.backend.kernels import reference

try:
    import torch
except ImportError:  # the torch column is optional
    torch = None


def _best(fn, rounds_out: list, iters: int) -> None:
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    rounds_out.append((time.perf_counter() - t) / iters * 1e3)


def _engine(mode, make_out, leaves):
    """(forward, backward) closures of the op on tensors, kernels in `mode`."""
    state = {}

    def fwd():
        kernels.set_kernels(mode)
        state["y"] = make_out()

    def bwd():
        kernels.set_kernels(mode)
        ta.autograd.grad(state["y"], leaves, state["g"], retain_graph=True)

    fwd()
    state["g"] = ta.ones_like(state["y"])
    return fwd, bwd


def _cases(rng, compiled):
    x = rng.standard_normal((32, 256, 384)).astype(np.float32)
    w, b = (rng.standard_normal(384).astype(np.float32) for _ in range(2))
    g = rng.standard_normal(x.shape).astype(np.float32)
    x2, g2 = x.reshape(-1, 384), g.reshape(-1, 384)
    _, xhat, rstd = reference.layer_norm_forward(x2, w, b, 1e-5)
    _, rrstd = reference.rms_norm_forward(x2, w, 1e-6)
    logits = (rng.standard_normal((8192, 65)) * 3).astype(np.float32)
    target = rng.integers(0, 65, 8192)
    target[::10] = -100
    _, lse = reference.cross_entropy_forward(logits, target, -100)
    scale = np.float32(1 / 8192)
    tx, tw, tb = (ta.tensor(a, requires_grad=True) for a in (x, w, b))
    tl, tt = ta.tensor(logits, requires_grad=True), ta.tensor(target)
    return {
        "layer_norm": (
            lambda k: k.layer_norm_forward(x2, w, b, 1e-5),
            lambda k: k.layer_norm_backward(g2, xhat, rstd, w, (True, True, True)),
            lambda: F.layer_norm(tx, 384, tw, tb), (tx, tw, tb),
            lambda tt_: torch.nn.functional.layer_norm(tt_[0], (384,), tt_[1], tt_[2]),
            (x, w, b)),
        "rms_norm": (
            lambda k: k.rms_norm_forward(x2, w, 1e-6),
            lambda k: k.rms_norm_backward(g2, x2, rrstd, w, (True, True)),
            lambda: F.rms_norm(tx, 384, tw, eps=1e-6), (tx, tw),
            lambda tt_: torch.nn.functional.rms_norm(tt_[0], (384,), tt_[1], eps=1e-6),
            (x, w)),
        "cross_entropy": (
            lambda k: k.cross_entropy_forward(logits, target, -100),
            lambda k: k.cross_entropy_backward(logits, lse, target, -100, scale),
            lambda: F.cross_entropy(tl, tt), (tl,),
            lambda tt_: torch.nn.functional.cross_entropy(tt_[0], torch.from_numpy(target)),
            (logits,)),
    }


def _torch_pair(op, arrays):
    leaves = [torch.from_numpy(a).requires_grad_() for a in arrays]
    y = op(leaves)
    g = torch.ones_like(y)

    def fwd():
        with torch.no_grad():
            op(leaves)

    return fwd, lambda: torch.autograd.grad(y, leaves, g, retain_graph=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None, help="default: ta.get_num_threads()")
    args = ap.parse_args()
    compiled = kernels._load_compiled()
    n = args.threads or ta.get_num_threads()
    ta.set_num_threads(n)
    if torch is not None:
        torch.set_num_threads(n)
    before = kernels.get_kernels()
    print(f"threads: {n}; best of {args.rounds} rounds x {args.iters} calls, milliseconds")
    cols = ["reference", "compiled", "engine numpy", "engine numba"]
    cols += ["torch"] if torch is not None else []
    print(f"{'op':<22}" + "".join(f"{c:>14}" for c in cols))
    cases = _cases(np.random.default_rng(0), compiled)
    for name, (kf, kb, op, leaves, top, arrays) in cases.items():
        fns = {"fwd": [lambda kf=kf: kf(reference), lambda kf=kf: kf(compiled)],
               "bwd": [lambda kb=kb: kb(reference), lambda kb=kb: kb(compiled)]}
        for mode in ("numpy", "numba"):
            f, b = _engine(mode, op, leaves)
            fns["fwd"].append(f)
            fns["bwd"].append(b)
        if torch is not None:
            f, b = _torch_pair(top, arrays)
            fns["fwd"].append(f)
            fns["bwd"].append(b)
        for way, row in fns.items():
            times = [[] for _ in row]
            for fn in row:
                fn()  # warm: compile, first-touch pages
            for _ in range(args.rounds):
                for fn, out in zip(row, times):
                    _best(fn, out, args.iters)
            print(f"{name + ' ' + way:<22}" + "".join(f"{min(t):>14.3f}" for t in times))
    kernels.set_kernels(before)


if __name__ == "__main__":
    main()
