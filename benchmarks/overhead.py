"""Per-op overhead: forward + backward on tiny tensors, engine vs raw NumPy vs PyTorch CPU.

On a (4, 4) float32 tensor the arithmetic costs almost nothing, so what is timed is the
engine's own bookkeeping: building graph nodes, wrapping arrays in Storages and Tensors,
saving tensors, and running the backward engine. Three columns per op:

- numpy:  the same forward and backward arithmetic written by hand on arrays (the floor:
          no graph, no wrappers; gradients may alias where the math allows, e.g. add's g);
- engine: leaves with requires_grad=True, the op, then a seeded backward;
- torch:  the same program in PyTorch (one thread), if torch can be imported.

Every engine/torch iteration clears the leaves' .grad to None first, then runs the op and
`backward(outputs, seeds)` with seeds made once up front (a seeded backward times the op
alone, not an extra sum). Each cell is the median over --repeat runs of many iterations,
timed with time.perf_counter, with the garbage collector left on (its cost is real).

    python benchmarks/overhead.py            # ~45 s
    python benchmarks/overhead.py --quick    # ~5 s, noisier
    python benchmarks/overhead.py --json     # the same numbers as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

import tinygrad_attn as ta

try:
    import torch
except ImportError:  # the torch column is optional
    torch = None

SHAPE = (4, 4)


# ----------------------------------------------------------------------------- cases
# A case is: the input shapes, the output's shape (for the NumPy seed), a NumPy function
# that does forward and backward by hand and returns the input gradients, and the forward
# for the engine and torch, written once against both (`lib` is ta or torch).

def np_add(a, b, g):
    a + b
    return [g, g]


def np_mul(a, b, g):
    a * b
    return [g * b, g * a]


def np_matmul(a, b, g):
    a @ b
    return [g @ b.T, a.T @ g]


def np_exp(x, g):
    return [g * np.exp(x)]  # the output is the derivative


def np_tanh(x, g):
    y = np.tanh(x)
    return [g * (1 - y * y)]


def np_relu(x, g):
    y = np.maximum(x, 0)
    return [g * (y > 0)]


def np_sum(x, g):
    x.sum()
    return [np.broadcast_to(g, x.shape)]


def np_mean(x, g):
    x.mean()
    return [np.broadcast_to(g / x.size, x.shape)]


def np_softmax(x, g):
    e = np.exp(x - x.max(-1, keepdims=True))
    y = e / e.sum(-1, keepdims=True)
    gy = g * y
    return [gy - y * gy.sum(-1, keepdims=True)]


def np_transpose_contiguous(x, g):
    np.ascontiguousarray(x.T)
    return [g.T]


def np_reshape(x, g):
    x.reshape(2, 8)
    return [g.reshape(x.shape)]


def np_slice(x, g):
    x[1:3, ::2]
    gx = np.zeros_like(x)
    gx[1:3, ::2] = g
    return [gx]


def np_split(x, g):
    x[:2], x[2:]  # two views; their two seed gradients assemble into one buffer
    return [np.concatenate([g, g])]


def np_cat(a, b, g):
    np.concatenate([a, b])
    return [g[:4], g[4:]]


INDEX = np.array([0, 2, 2, 3], dtype=np.int64)  # a repeated row: its gradient accumulates


def np_index_select(table, g):
    np.take(table, INDEX, axis=0)
    gt = np.zeros_like(table)
    np.add.at(gt, INDEX, g)
    return [gt]


def np_mlp(w1, b1, w2, b2, g, x):
    h = np.maximum(x @ w1 + b1, 0)
    o = np.maximum(h @ w2 + b2, 0)
    o.sum()
    go = g * (o > 0)  # d sum / d o = g everywhere, then through relu
    gh = (go @ w2.T) * (h > 0)
    return [x.T @ gh, gh.sum(0), h.T @ go, go.sum(0)]


def mlp(lib, w1, b1, w2, b2, x):
    h = (x @ w1 + b1).relu()
    return (h @ w2 + b2).relu().sum()


def split(lib, x):
    return x.split(2, 0)  # both pieces are seeded


INDEX_TENSOR = {ta: ta.tensor(INDEX)}  # made once, like the NumPy array
if torch is not None:
    INDEX_TENSOR[torch] = torch.tensor(INDEX)


def index_select(lib, table):
    return table.index_select(0, INDEX_TENSOR[lib])


S = SHAPE
CASES = {  # name: (input shapes, output shape, numpy by hand, forward for ta and torch)
    "add": ([S, S], S, np_add, lambda lib, a, b: a + b),
    "mul": ([S, S], S, np_mul, lambda lib, a, b: a * b),
    "matmul": ([S, S], S, np_matmul, lambda lib, a, b: a @ b),
    "exp": ([S], S, np_exp, lambda lib, x: x.exp()),
    "tanh": ([S], S, np_tanh, lambda lib, x: x.tanh()),
    "relu": ([S], S, np_relu, lambda lib, x: x.relu()),
    "sum": ([S], (), np_sum, lambda lib, x: x.sum()),
    "mean": ([S], (), np_mean, lambda lib, x: x.mean()),
    "softmax": ([S], S, np_softmax, lambda lib, x: x.softmax(-1)),
    "transpose+contiguous": ([S], S, np_transpose_contiguous,
                             lambda lib, x: x.transpose(0, 1).contiguous()),
    "view/reshape": ([S], (2, 8), np_reshape, lambda lib, x: x.view(2, 8)),
    "getitem slice": ([S], (2, 2), np_slice, lambda lib, x: x[1:3, ::2]),
    "split": ([S], (2, 4), np_split, split),
    "cat": ([S, S], (8, 4), np_cat, lambda lib, a, b: lib.cat([a, b])),
    "index_select": ([S], S, np_index_select, index_select),
    # parameters need grads; the data input (last, not a leaf that needs grad) does not
    "mlp step": ([S, (4,), S, (4,)], (), np_mlp, mlp),
}
MLP_DATA = "mlp step"


def build(name: str, rng) -> dict:
    """The three step functions of a case, over the same input values."""
    shapes, out_shape, np_fn, forward = CASES[name]
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    extra = [rng.standard_normal(SHAPE).astype(np.float32)] if name == MLP_DATA else []
    g = np.ones(out_shape, np.float32)
    fns = {"numpy": lambda: np_fn(*arrays, g, *extra),
           "ta": lambda: engine_step(ta, arrays, extra, forward)}
    if torch is not None:
        fns["torch"] = lambda: engine_step(torch, arrays, extra, forward)
    return fns


def engine_step(lib, arrays, extra, forward):
    """A forward+backward step for ta or torch; grads are cleared the same way for both."""
    leaves = [lib.tensor(a, requires_grad=True) for a in arrays]
    data = [lib.tensor(a) for a in extra]
    outs = forward(lib, *leaves, *data)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    seeds = [lib.ones_like(o.detach()) for o in outs]  # made once, outside the timed loop
    backward = lib.autograd.backward

    def step():
        for leaf in leaves:
            leaf.grad = None
        outs = forward(lib, *leaves, *data)
        backward(list(outs) if isinstance(outs, (tuple, list)) else [outs], seeds)

    step.leaves = leaves
    return step


# ----------------------------------------------------------------------------- timing
def calls_per_run(step, target_s: float) -> int:
    """How many calls of `step` fill about `target_s` seconds (after a short warm-up)."""
    for _ in range(3):  # warm up caches and lazy imports
        step()
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < target_s / 10 or calls < 5:
        step()
        calls += 1
    return max(5, int(target_s * calls / (time.perf_counter() - t0)))


def time_cells(steps: dict, target_s: float, repeat: int) -> dict:
    """Median µs per call for each step. Runs are interleaved (numpy, engine, torch, numpy,
    ...) so that a burst of load from elsewhere on the machine hits all columns alike."""
    counts = {key: calls_per_run(step, target_s) for key, step in steps.items()}
    runs: dict = {key: [] for key in steps}
    for _ in range(repeat):
        for key, step in steps.items():
            n = counts[key]
            t0 = time.perf_counter()
            for _ in range(n):
                step()
            runs[key].append((time.perf_counter() - t0) / n)
    return {key: statistics.median(r) * 1e6 for key, r in runs.items()}


def check(name: str, fns: dict) -> None:
    """Warn if a library's gradients differ from NumPy's: timing wrong math would be moot."""
    expected = [np.asarray(g, np.float32) for g in fns["numpy"]()]
    for lib in ("ta", "torch"):
        if lib not in fns:
            continue
        step = fns[lib]()
        step()
        got = [leaf.grad.detach().numpy() for leaf in step.leaves]
        if len(got) != len(expected) or not all(
            np.allclose(x, y, rtol=1e-4, atol=1e-5) for x, y in zip(got, expected)
        ):
            print(f"warning: {name}: {lib} gradients differ from the NumPy reference",
                  file=sys.stderr)


def run(repeat: int, target_s: float) -> list[dict]:
    if torch is not None:
        torch.set_num_threads(1)  # one thread: tiny ops gain nothing from more, only noise
    rng = np.random.default_rng(0)
    rows = []
    for name in CASES:
        fns = build(name, rng)
        check(name, fns)
        steps = {"numpy": fns["numpy"], "engine": fns["ta"]()}
        if "torch" in fns:
            steps["torch"] = fns["torch"]()
        us = time_cells(steps, target_s, repeat)
        us = {key: round(v, 3) for key, v in us.items()}
        rows.append({"op": name, "numpy_us": us["numpy"], "engine_us": us["engine"],
                     "torch_us": us.get("torch")})
    return rows


# ----------------------------------------------------------------------------- report
def machine() -> dict:
    return {
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__ if torch is not None else None,
    }


def summary(rows: list[dict]) -> float | None:
    ratios = [r["engine_us"] / r["torch_us"] for r in rows if r["torch_us"]]
    return statistics.median(ratios) if ratios else None


def markdown(rows: list[dict]) -> str:
    with_torch = torch is not None
    head = ["op", "numpy µs", "engine µs"] + (["torch µs"] if with_torch else [])
    head += ["engine/numpy"] + (["engine/torch"] if with_torch else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["op"], f"{r['numpy_us']:.1f}", f"{r['engine_us']:.1f}"]
        if with_torch:
            cells.append(f"{r['torch_us']:.1f}")
        cells.append(f"{r['engine_us'] / r['numpy_us']:.1f}x")
        if with_torch:
            cells.append(f"{r['engine_us'] / r['torch_us']:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    m = machine()
    ratio = summary(rows)
    median = f"median engine/torch {ratio:.2f}x" if ratio else "torch not installed"
    lines.append(
        f"{median}; {m['processor']}, {m['cpu_count']} CPUs, Python {m['python']}, "
        f"numpy {m['numpy']}, torch {m['torch'] or '-'}"
    )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed runs per cell; the median is reported (default 5, quick 3)")
    parser.add_argument("--quick", action="store_true",
                        help="shorter runs (~5 s in all): a rough look, noisier numbers")
    parser.add_argument("--json", action="store_true",
                        help="print the results as JSON instead of a Markdown table")
    args = parser.parse_args(argv)
    repeat = args.repeat or (3 if args.quick else 5)
    target_s = 0.025 if args.quick else 0.15  # seconds per timed run of one cell
    rows = run(repeat, target_s)
    if args.json:
        print(json.dumps({"shape": list(SHAPE), "dtype": "float32", "repeat": repeat,
                          "rows": rows, "median_engine_over_torch": summary(rows),
                          "machine": machine()}, indent=2))
    else:
        print(f"forward+backward per op on {SHAPE} float32, median of {repeat} runs\n")
        print(markdown(rows))


if __name__ == "__main__":
    main()
