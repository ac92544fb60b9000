"""A tour of the engine's internals, printed: views, a graph and what it saved, a gradient.

    python examples/autodiff_tour.py [--out DIR]   (writes DIR/graph.svg, default .)

(a) Views: a Tensor is (shape, strides, storage_offset) over one Storage; views share it.
(b) A graph: each op's node keeps only what its backward needs; we walk it and look.
(c) A gradient by hand: the chain rule over the saved tensors equals what backward() gives.
(d) gradcheck: the same gradients against finite differences, in float64.
(e) A picture: ta.viz draws a graph, with what each node saved, as graph.svg.
(f) A trace: ta.autograd.trace() records a backward run, node by node, as a numbered table.
"""

import argparse
import os
import sys

import numpy as np

import tinygrad_attn as ta

np.set_printoptions(precision=4, suppress=True)


def header(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 76 - len(title)))


def describe(label: str, t: ta.Tensor, original: ta.Tensor) -> None:
    storage = t.untyped_storage()
    yes_no = {True: "yes", False: "no"}
    print(f"{label:<24}{str(tuple(t.shape)):<11}{str(t.stride()):<12}{t.storage_offset():<7}"
          f"{yes_no[t.is_contiguous()]:<11}{yes_no[t.shares_storage(original)]:<8}"
          f"#{storage.id} ({storage.nbytes} B)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autodiff_tour.py", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, metavar="DIR",
                   help="folder for graph.svg, created if missing (default: .)")
    p.add_argument("out_dir", nargs="?", default=None, metavar="OUT_DIR",
                   help="the same folder, as a positional argument (older form)")
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    out_dir = args.out or args.out_dir or "."
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        print(f"autodiff_tour.py: error: --out {out_dir}: {e.strerror or e}", file=sys.stderr)
        raise SystemExit(2) from None
    ta.manual_seed(0)

    # ----------------------------------------------------------------------------- (a) views
    header("(a) views: new (shape, stride, offset), same Storage")
    x = ta.arange(24, dtype=ta.float32).view(2, 3, 4)  # values 0..23: easy to read positions
    print(f"{'':<24}{'shape':<11}{'stride':<12}{'offset':<7}{'contiguous':<11}{'shares':<8}storage")
    describe("x", x, x)
    # strides count elements: one step along dim 0 skips a whole 3x4 block (12 elements)
    describe("x.transpose(0, 1)", x.transpose(0, 1), x)  # swaps two strides; moves nothing
    describe("x[:, ::2, 1:]", x[:, ::2, 1:], x)  # a step doubles a stride, a start sets offset
    for i, piece in enumerate(x.split(2, dim=2)):  # pieces differ only in their offset
        describe(f"x.split(2, dim=2)[{i}]", piece, x)
    describe("x.view(6, 4)", x.view(6, 4), x)  # merging dims needs no copy when contiguous

    # a transposed tensor is not contiguous: contiguous() is the one explicit copy
    transposed = x.transpose(0, 1)
    copy = transposed.contiguous()
    describe("transposed.contiguous()", copy, x)
    print(f"  -> a new {copy.untyped_storage()}")
    print(f"     copy_reason={copy.untyped_storage().copy_reason!r}: every copy records why its "
          "bytes exist")

    # ----------------------------------------------------------------------------- (b) a graph
    header("(b) a graph: y = (x @ w).softmax(-1); loss = (y * t).sum()")
    x = ta.randn(2, 3, requires_grad=True)
    w = ta.randn(3, 4, requires_grad=True)
    t = ta.randn(2, 4)  # a target: no gradient needed, so nothing is kept on its behalf
    y = (x @ w).softmax(-1)
    loss = (y * t).sum()

    WHY = {  # what each op keeps, and why it is enough
        "SumBackward": "nothing: its gradient is g broadcast back, a stride-0 view",
        "MulBackward": "only t: y's gradient is g * t, and t needs no gradient, so y is not kept",
        "SoftmaxBackward": "its output y: gx = y * (g - sum(g * y)) needs y alone",
        "MatmulBackward": "both inputs: ga = g @ b^T, gb = a^T @ g",
        "AccumulateGrad": "nothing: it adds the incoming gradient into leaf.grad",
    }

    NAMES = {"x": x, "w": w, "t": t, "y (softmax's output)": y}

    # an explicit stack, not recursion: graphs of real models are deeper than Python's stack
    stack, seen = [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        leaf = getattr(node, "variable", None)
        where = f" for leaf of shape {tuple(leaf.shape)}" if leaf is not None else ""
        print(f"{node.name}{where}: saves {node.saved_bytes()} bytes")
        print(f"    why: {WHY[node.name]}")
        for saved in node.saved_tensor_list():
            # which tensor of the expression is it? a saved tensor is a view, not a copy
            same = [k for k, v in NAMES.items() if saved.shares_storage(v)]
            print(f"    saved {tuple(saved.shape)} {saved.dtype.name}, {saved.nbytes} bytes: "
                  f"{', '.join(same) or 'a new tensor'}")
        nexts = [edge[0] for edge in node.next_functions if edge is not None]
        print(f"    -> next: {[n.name for n in nexts] or 'none (a leaf)'}")
        stack.extend(reversed(nexts))  # reversed: visit the first input first

    # ----------------------------------------------------------------------------- (c) by hand
    header("(c) a gradient by hand: loss = x.tanh().exp().mean()")
    x = ta.randn(5, dtype=ta.float64, requires_grad=True)
    h = x.tanh()  # TanhBackward saves h:  d tanh(x)/dx = 1 - h^2
    e = h.exp()  # ExpBackward saves e:    d exp(h)/dh = e
    loss = e.mean()  # MeanBackward saves nothing: d mean(e)/de = 1/n

    mean_node = loss.grad_fn
    exp_node = mean_node.next_functions[0][0]
    tanh_node = exp_node.next_functions[0][0]
    print("chain:", " <- ".join(n.name for n in (mean_node, exp_node, tanh_node)))

    # read the saved tensors before backward(): backward frees them as soon as they are used
    (e_saved,) = exp_node.saved_tensor_list()
    (h_saved,) = tanh_node.saved_tensor_list()
    g = np.full(5, 1 / 5)  # d loss / d e
    print("d loss/d e =", g)
    g = g * e_saved.detach().numpy()  # through exp
    print("d loss/d h =", g)
    g = g * (1 - h_saved.detach().numpy() ** 2)  # through tanh
    print("d loss/d x =", g, "(by hand)")

    loss.backward()
    print("x.grad     =", x.grad.numpy(), "(backward)")
    print(f"max |difference| = {np.abs(g - x.grad.numpy()).max():.2e}")
    print(f"saved tensors after backward: exp {exp_node.saved_tensor_list()}, "
          f"tanh {tanh_node.saved_tensor_list()} (freed)")

    # ----------------------------------------------------------------------------- (d) gradcheck
    header("(d) gradcheck: autograd vs central finite differences (float64)")
    x = ta.randn(5, dtype=ta.float64, requires_grad=True)
    print("tanh -> exp -> mean:", ta.gradcheck(lambda x: x.tanh().exp().mean(), [x]))
    x = ta.randn(2, 3, dtype=ta.float64, requires_grad=True)
    w = ta.randn(3, 4, dtype=ta.float64, requires_grad=True)
    t = ta.randn(2, 4, dtype=ta.float64)
    print("(x @ w).softmax(-1) * t, summed:",
          ta.gradcheck(lambda x, w, t: ((x @ w).softmax(-1) * t).sum(), [x, w, t]))

    # ----------------------------------------------------------------------------- (e) picture
    header("(e) a picture: ta.viz.draw(loss, params) -> graph.svg")
    x = ta.randn(4, 3, requires_grad=True)
    w = ta.randn(3, 12, requires_grad=True)
    q, k, v = (x @ w).split(4, dim=-1)  # three views of one (4, 12) tensor: saving q pins all
    loss = ((q @ k.mT).softmax(-1) @ v).sum()
    graph = ta.viz.draw(loss, params={"x": x, "w": w})  # dict(model.named_parameters()) in a model
    path = graph.save(os.path.join(out_dir, "graph.svg"))
    print(f"{len(graph.nodes)} boxes, {len(graph.edges)} arrows, "
          f"{graph.saved_bytes} bytes saved for backward")
    print(f"wrote {os.path.abspath(path)} (open it in a browser; graph.to_dot() gives DOT text)")

    # ----------------------------------------------------------------------------- (f) trace
    header("(f) a trace: y = (x * w).sum(); z = y * 2 + y; z.backward()")
    x = ta.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
    w = ta.tensor([[0.5, -1.0, 2.0], [1.0, 0.0, -2.0]], requires_grad=True)
    y = (x * w).sum()
    z = y * 2 + y  # y feeds two ops: its two gradients (1 and 2) are summed before SumBackward
    print(f"saved for backward: {ta.memory.saved_bytes(z)} bytes")
    with ta.autograd.trace(params={"x": x, "w": w}) as tr:
        z.backward()
    print(tr)  # |g| is each gradient's norm; "free" lines give back what was saved
    print(f"freed {tr.freed_bytes()} bytes; x.grad = 3 * w: {x.grad.numpy().tolist()}")


if __name__ == "__main__":
    try:
        main()
    except MemoryError as e:
        print(f"autodiff_tour.py: error: out of memory: {e}", file=sys.stderr)
        raise SystemExit(2) from None
