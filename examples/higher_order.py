"""Second derivatives, for students: differentiate a gradient, take a Newton step with
Hessian-vector products, and pay for a gradient penalty on the small GPT.

    python examples/higher_order.py                  # all three parts, the table at the end
    python examples/higher_order.py --torch          # the same GPT step in PyTorch beside it
    python examples/higher_order.py --config tiny    # a smaller GPT (seconds)

1. d²/dx² tanh(x) = -2 tanh(x) (1 - tanh²(x)), by hand against ta.func.grad(ta.func.grad(f)).
2. Newton's method on a small logistic regression: each step solves H p = -g by conjugate
   gradients, where H p comes from ta.autograd.functional.hvp (the Hessian is never formed).
3. A gradient-penalty step on the GPT: loss + λ Σ ||∂loss/∂θ||², which needs the gradient's
   own graph (create_graph=True), against a plain step; the memory ledger says what the
   gradient's graph keeps, by op.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nn  # noqa: E402
import tinygrad_attn as ta  # noqa: E402

F64 = ta.float64
CONFIGS = {  # name: (n_embd, n_layer, n_head, block_size, batch)
    "tiny": (32, 2, 4, 16, 4),
    "small": (128, 4, 4, 64, 32),
}


# ----------------------------------------------------------------------------- 1. tanh
def part_tanh() -> None:
    print("1. d2/dx2 tanh(x): by hand, and as grad(grad(f))")
    d2 = ta.func.grad(ta.func.grad(lambda x: x.tanh()))
    print(f"   {'x':>6} {'by hand':>14} {'grad(grad(f))':>14}")
    for x in (-2.0, -0.5, 0.0, 0.7, 3.0):
        t = math.tanh(x)
        ours = d2(ta.tensor(x, dtype=F64)).item()
        print(f"   {x:>6.2f} {-2 * t * (1 - t * t):>14.10f} {ours:>14.10f}")


# ----------------------------------------------------------------------------- 2. Newton
def part_newton() -> None:
    print("\n2. Newton's method with Hessian-vector products (logistic regression, 5 weights)")
    rng = np.random.default_rng(0)
    X = ta.tensor(rng.standard_normal((200, 5)), dtype=F64)
    w_true = np.array([1.5, -2.0, 0.5, 0.0, 1.0])
    y = ta.tensor((rng.random(200) < 1 / (1 + np.exp(-X.numpy() @ w_true))).astype(float),
                  dtype=F64)

    def loss(w):
        z = X @ w
        return (ta.nn.functional.softplus(z) - y * z).mean() + 1e-3 * (w * w).sum()

    w = ta.zeros(5, dtype=F64)
    for step in range(6):
        wg = w.detach().requires_grad_()
        (g,) = ta.autograd.grad(loss(wg), wg)
        p = _conjugate_gradients(lambda v, w=w: ta.autograd.functional.hvp(loss, w, v)[1], -g)
        w = w + p
        print(f"   step {step}: loss {loss(w).item():.12f}  |gradient| {g.norm().item():.2e}")


def _conjugate_gradients(hvp, b, iters: int = 10, tol: float = 1e-12):
    """Solve H x = b with H given only as v -> H v (H symmetric positive definite)."""
    x = ta.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = (r * r).sum()
    for _ in range(iters):
        hp = hvp(p)
        alpha = rr / (p * hp).sum()
        x = x + alpha * p
        r = r - alpha * hp
        new = (r * r).sum()
        if new.item() < tol:
            break
        p = r + (new / rr) * p
        rr = new
    return x


# ----------------------------------------------------------------------------- 3. GPT
def make_gpt(config: str):
    n_embd, n_layer, n_head, block, batch = CONFIGS[config]
    ta.manual_seed(0)
    model = nn.GPT(nn.GPTConfig(vocab_size=65, block_size=block, n_layer=n_layer,
                                n_head=n_head, n_embd=n_embd, dropout=0.0))
    rng = np.random.default_rng(1)
    idx_np = rng.integers(0, 65, (batch, block))
    tgt_np = rng.integers(0, 65, (batch, block))
    return model, idx_np, tgt_np


def ours_steps(model, idx_np, tgt_np, lam: float):
    idx, tgt = ta.tensor(idx_np), ta.tensor(tgt_np)
    params = [p for p in model.parameters() if p.requires_grad]

    def plain():
        _, loss = model(idx, tgt)
        loss.backward()
        return loss

    def penalty():
        _, loss = model(idx, tgt)
        grads = ta.autograd.grad(loss, params, create_graph=True)
        pen = sum((g * g).sum() for g in grads)
        (loss + lam * pen).backward()
        return loss

    return plain, penalty


def measure_ours(step, params, repeat: int) -> dict:
    for p in params:
        p.grad = None
    with ta.memory.profile() as prof:
        step()
    summary = prof.summary()
    for p in params:
        p.grad = None
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        for p in params:
            p.grad = None
    sv = summary["saved_peak"]
    return {"saved": sv["unique_bytes_without_parameters"],
            "graph": sv["graph_of_gradient"]["unique_bytes"],
            "graph_by_op": sv["graph_of_gradient"]["by_op"],
            "peak": summary["tensor_peak_above_start"], "time": statistics.median(times)}


def measure_torch(model, idx_np, tgt_np, lam: float, repeat: int) -> dict:
    """The same two steps in PyTorch on the same weights; saved bytes from saved-tensor
    hooks (each storage once, parameters excluded), split into those saved by the forward
    and those saved while the create_graph backward records the gradient's graph."""
    import torch

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests import torch_nanogpt as ref

    n_embd, n_layer, n_head, block, _ = (model.config.n_embd, model.config.n_layer,
                                         model.config.n_head, model.config.block_size, 0)
    tmodel = ref.GPT(ref.GPTConfig(block_size=block, vocab_size=65, n_layer=n_layer,
                                   n_head=n_head, n_embd=n_embd, dropout=0.0, bias=True,
                                   flash=False))
    ref.load_from_ta(tmodel, model.state_dict())
    idx, tgt = torch.from_numpy(idx_np), torch.from_numpy(tgt_np)
    params = list(tmodel.parameters())
    ptrs = {p.untyped_storage().data_ptr() for p in params}

    def run(penalty: bool, seen=None):
        phase = {"now": "forward"}

        def pack(t):
            st = t.untyped_storage()
            if seen is not None and st.data_ptr() not in ptrs and st.nbytes() > 0:
                seen.setdefault(phase["now"], {})[st.data_ptr()] = st.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            _, loss = tmodel(idx, tgt)
            if penalty:
                phase["now"] = "graph"
                grads = torch.autograd.grad(loss, params, create_graph=True)
                pen = sum((g * g).sum() for g in grads)
                total = loss + lam * pen
            else:
                total = loss
        total.backward()
        for p in params:
            p.grad = None

    out = {}
    for name, pen in (("plain", False), ("penalty", True)):
        seen: dict = {}
        run(pen, seen)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            run(pen)
            times.append(time.perf_counter() - t0)
        fwd = sum(seen.get("forward", {}).values())
        graph = sum(v for k, v in seen.get("graph", {}).items()
                    if k not in seen.get("forward", {}))
        out[name] = {"saved": fwd + graph, "graph": graph, "time": statistics.median(times)}
    return out


def part_gpt(config: str, with_torch: bool, repeat: int, lam: float = 0.01) -> None:
    n_embd, n_layer, n_head, block, batch = CONFIGS[config]
    print(f"\n3. A gradient-penalty step on the GPT ({config}: n_embd {n_embd}, {n_layer} "
          f"layers, {n_head} heads, block {block}, batch {batch}; float32, attention "
          "'views')")
    model, idx_np, tgt_np = make_gpt(config)
    params = [p for p in model.parameters() if p.requires_grad]
    plain, penalty = ours_steps(model, idx_np, tgt_np, lam)
    rows = {"plain": measure_ours(plain, params, repeat),
            "penalty": measure_ours(penalty, params, repeat)}
    theirs = measure_torch(model, idx_np, tgt_np, lam, repeat) if with_torch else None
    mib = 2 ** 20
    print(f"   {'step':<30}{'saved (MiB)':>12}{'added by the graph':>20}{'peak (MiB)':>12}"
          f"{'time (s)':>10}")
    engines = [("", rows)] + ([("torch ", theirs)] if theirs is not None else [])
    for prefix, table in engines:
        base = table["plain"]["saved"]
        for name, label in (("plain", "plain (loss.backward)"),
                            ("penalty", "penalty (create_graph=True)")):
            r = table[name]
            peak = f"{r['peak'] / mib:>12.2f}" if "peak" in r else f"{'':>12}"
            print(f"   {prefix + label:<30}{r['saved'] / mib:>12.2f}"
                  f"{(r['saved'] - base) / mib:>20.2f}{peak}{r['time']:>10.3f}")
    ours = rows["penalty"]
    extra = (ours["saved"] - rows["plain"]["saved"]) / mib
    print(f"   ours: the gradient's graph costs {extra:.2f} MiB more saved and "
          f"{ours['time'] / rows['plain']['time']:.2f}x the plain step's time.")
    print("   What its nodes keep, by op (the ledger's graph_of_gradient; storages they share")
    print("   with the forward's saved tensors count here too):")
    by_op = sorted(ours["graph_by_op"].items(), key=lambda kv: -kv[1]["unique_bytes"])
    for op, row in by_op[:8]:
        print(f"     {op:<28}{row['unique_bytes'] / mib:>8.2f} MiB in {row['nodes']} nodes")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=list(CONFIGS), default="small")
    p.add_argument("--torch", action="store_true", help="measure the same GPT step in torch")
    p.add_argument("--repeat", type=int, default=3, help="timed steps of each kind")
    p.add_argument("--only", choices=["tanh", "newton", "gpt"], default=None)
    args = p.parse_args(argv)
    if args.only in (None, "tanh"):
        part_tanh()
    if args.only in (None, "newton"):
        part_newton()
    if args.only in (None, "gpt"):
        part_gpt(args.config, args.torch, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
