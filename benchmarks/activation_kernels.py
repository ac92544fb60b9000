"""The activation kernels side by side: the NumPy reference, the compiled (numba) twin and
PyTorch's CPU kernel, forward and backward, on one activation-sized float32 array.

Each cell is the fastest of --repeat calls (on a shared machine the least disturbed one;
--median prints medians instead); the three paths take turns call by call, so a loaded
machine slows them alike and their ratios stay meaningful. torch runs with the
engine's thread count; its backward is autograd's (GeluBackward0 on a fresh gradient).

    python benchmarks/activation_kernels.py                       # (32, 256, 1536)
    python benchmarks/activation_kernels.py --shape 8,256,1536 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tinygrad_attn as ta
from tinygrad_attn.backend import kernels
from tinygrad_attn.backend.kernels import reference

try:
    import torch
except ImportError:  # the torch column is optional
    torch = None


def _cases(x, g, b, u):
    """{row: {path: a function of no arguments}}."""
    compiled = kernels._load_compiled()
    rows = {}
    for name in ("gelu", "gelu_tanh"):
        fwd, bwd = name + "_forward", name + "_backward"
        rows[f"{name} forward"] = {"reference": lambda f=fwd: getattr(reference, f)(x),
                                   "compiled": lambda f=fwd: getattr(compiled, f)(x)}
        rows[f"{name} backward"] = {"reference": lambda f=bwd: getattr(reference, f)(x, g),
                                    "compiled": lambda f=bwd: getattr(compiled, f)(x, g)}
    rows["bias_gelu forward"] = {"reference": lambda: reference.bias_gelu_forward(x, b),
                                 "compiled": lambda: compiled.bias_gelu_forward(x, b)}
    rows["bias_gelu backward"] = {"reference": lambda: reference.bias_gelu_backward(x, b, g),
                                  "compiled": lambda: compiled.bias_gelu_backward(x, b, g)}
    rows["dropout forward"] = {"reference": lambda: reference.dropout_forward(x, u, 0.1),
                               "compiled": lambda: compiled.dropout_forward(x, u, 0.1)}
    keep = u >= 0.1
    rows["dropout backward"] = {"reference": lambda: reference.dropout_backward(g, keep, 1.1),
                                "compiled": lambda: compiled.dropout_backward(g, keep, 1.1)}
    if torch is not None:
        _torch_cases(rows, x, g, b)
    return rows


def _torch_cases(rows, x, g, b):
    tf = torch.nn.functional
    tx, tg, tb = torch.from_numpy(x), torch.from_numpy(g), torch.from_numpy(b)

    def backward(fn):
        leaf = tx.clone().requires_grad_()  # the clone is outside the timed call
        y = fn(leaf)
        return lambda: torch.autograd.grad(y, leaf, tg, retain_graph=True)

    for name, approximate in (("gelu", "none"), ("gelu_tanh", "tanh")):
        rows[f"{name} forward"]["torch"] = lambda a=approximate: tf.gelu(tx, approximate=a)
        rows[f"{name} backward"]["torch"] = backward(
            lambda t, a=approximate: tf.gelu(t, approximate=a))
    rows["bias_gelu forward"]["torch"] = lambda: tf.gelu(tx + tb)
    rows["dropout forward"]["torch"] = lambda: tf.dropout(tx, 0.1)


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="32,256,1536")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--median", action="store_true", help="medians, not minima")
    args = parser.parse_args(argv)
    shape = tuple(int(n) for n in args.shape.split(","))
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32)
    g = rng.standard_normal(shape, dtype=np.float32)
    b = rng.standard_normal(shape[-1:], dtype=np.float32)
    u = rng.random(shape, dtype=np.float32)
    threads = ta.get_num_threads()
    if torch is not None:
        torch.set_num_threads(threads)
    rows = _cases(x, g, b, u)
    paths = ("reference", "compiled", "torch")
    stat = statistics.median if args.median else min
    print(f"shape {shape} float32, {threads} threads, {stat.__name__} of {args.repeat} (ms)")
    print(f"{'kernel':<22}" + "".join(f"{p:>11}" for p in paths) + f"{'ref/comp':>10}")
    with np.errstate(all="ignore"):
        for row, fns in rows.items():
            for fn in fns.values():
                fn()  # compile, warm the caches
            times = {p: [] for p in fns}
            for _ in range(args.repeat):
                for p, fn in fns.items():
                    times[p].append(_time(fn))
            ms = {p: 1e3 * stat(t) for p, t in times.items()}
            cells = "".join(f"{ms[p]:>11.2f}" if p in ms else f"{'-':>11}" for p in paths)
            print(f"{row:<22}{cells}{ms['reference'] / ms['compiled']:>10.1f}")


if __name__ == "__main__":
    main()
