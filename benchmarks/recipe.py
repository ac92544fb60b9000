"""nanoGPT's CPU recipe end to end, this engine against a plain PyTorch script: wall time,
steps/s and the final losses side by side.

The recipe is nanoGPT's shakespeare_char run as its README gives it for a laptop CPU:
n_layer 4, n_head 4, n_embd 128, block_size 64, batch_size 12, dropout 0, max_iters 2000,
lr_decay_iters 2000, eval_iters 20; its config's learning rate 1e-3 (min 1e-4, warmup 100,
cosine decay), AdamW betas (0.9, 0.99), weight_decay 0.1 on the matrices only, gradient
clipping at norm 1.0. There is no download here, so both engines train on this project's
embedded corpus (nn.data.default_corpus, one token per character, the first 90 % to train).

    python benchmarks/recipe.py                  # the full 2000 steps, both engines
    python benchmarks/recipe.py --steps 50       # a short check of the whole pipeline
    python benchmarks/recipe.py --markdown recipe.md --json recipe.json

Each engine trains in a process of its own, one after the other, never both at once
(this process only prepares the data and waits): the engine's process imports only the
engine (and NumPy), the torch process only torch (it never imports tinygrad_attn, whose
import sets malloc and OpenBLAS options process-wide). Both read one prepared file: the
token ids, the start of every training window of every step and of every evaluation
window, drawn here from one NumPy RNG seed, so both see the same batches in the same
order, and both start from the same weights (the engine's GPT-2 initialisation, written
once and loaded by name in torch). Evaluation (every --eval-every steps and at the end):
the mean loss over the same eval_iters fixed windows of the training and of the
validation text each time, in eval mode without gradients. Reported per engine: the
process's wall time (start to exit, imports included), the time in training steps and in
evaluation, steps/s over the training steps, and the losses of the last evaluation.

Both engines run on --threads threads (default: every CPU of the machine): torch through
torch.set_num_threads, this engine through ta.set_num_threads (OpenBLAS's and numba's
pools). Attention: "flash" is nanoGPT's choice on PyTorch 2 (scaled_dot_product_attention
with is_causal=True) against the engine's tiled flash attention; "views" is nanoGPT's
manual attention against the engine's views attention.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RECIPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, dropout=0.0,
              lr=1e-3, min_lr=1e-4, warmup=100, beta1=0.9, beta2=0.99, weight_decay=0.1,
              grad_clip=1.0, eval_iters=20)
ENGINES = ("ours", "torch")


def get_lr(step: int, cfg: dict, decay_steps: int) -> float:
    """nanoGPT's schedule: linear warmup, then cosine from lr down to min_lr at decay_steps."""
    lr, min_lr, warmup = cfg["lr"], cfg["min_lr"], cfg["warmup"]
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if step > decay_steps or decay_steps <= warmup:
        return min_lr
    ratio = (step - warmup) / (decay_steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def eval_points(steps: int, every: int) -> list[int]:
    """The steps after which both engines evaluate: 0 (the initial weights), every
    `every`, and the last."""
    points = list(range(0, steps, every)) if every else [0]
    return points + [steps] if points[-1] != steps else points


# ----------------------------------------------------------------------------- the data
def prepare(path: str, steps: int, seed: int, cfg: dict) -> dict:
    """Write the token ids and every window start both engines read; returns a summary.
    Importing nn.data here imports the engine in this (waiting) process only."""
    from nn.data import default_corpus

    text = default_corpus()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.int64)
    n = int(0.9 * len(ids))
    train, val = ids[:n], ids[n:]
    T, B, E = cfg["block_size"], cfg["batch_size"], cfg["eval_iters"]
    rng = np.random.default_rng(seed)
    np.savez(path, train=train, val=val,
             train_starts=rng.integers(0, len(train) - T, (steps, B)),
             eval_train=rng.integers(0, len(train) - T, (E, B)),
             eval_val=rng.integers(0, len(val) - T, (E, B)),
             vocab_size=np.array(len(chars)))
    return {"characters": len(text), "vocab_size": len(chars), "train_tokens": len(train),
            "val_tokens": len(val)}


def windows(data: np.ndarray, starts: np.ndarray, T: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, y), each (B, T) int64: the windows at `starts` and the same shifted by one."""
    offsets = starts[:, None] + np.arange(T)[None, :]  # (B, T)
    return data[offsets], data[offsets + 1]


# ----------------------------------------------------------------------------- the engines
def run_ours(data, cfg: dict, steps: int, every: int, args, init_path: str) -> dict:
    """This engine's loop: the pieces of nn/trainer.py (configure_adamw, cosine_lr,
    clip_grad_norm_), fed the prepared batches."""
    import nn
    import tinygrad_attn as ta
    from nn.utils import clip_grad_norm_, cosine_lr

    ta.set_num_threads(args.threads)
    if args.kernels:
        ta.backend.set_kernels(args.kernels)
    ta.manual_seed(args.seed)
    model = nn.GPT(nn.GPTConfig(vocab_size=int(data["vocab_size"]),
                                block_size=cfg["block_size"], n_layer=cfg["n_layer"],
                                n_head=cfg["n_head"], n_embd=cfg["n_embd"],
                                dropout=cfg["dropout"], attn=args.attn))
    if init_path:
        np.savez(init_path, **{k: v.numpy() for k, v in model.state_dict().items()})
    opt = nn.optim.configure_adamw(model, cfg["weight_decay"], cfg["lr"],
                                   betas=(cfg["beta1"], cfg["beta2"]))
    T = cfg["block_size"]

    @ta.no_grad()
    def evaluate(split: str) -> float:
        model.eval()
        source = data["train"] if split == "train" else data["val"]
        losses = []
        for starts in data["eval_" + split]:
            x, y = windows(source, starts, T)
            losses.append(model(ta.tensor(x), ta.tensor(y))[1].item())
        model.train()
        return float(np.mean(losses))

    def step(i: int) -> float:
        lr = cosine_lr(i, cfg["lr"], cfg["warmup"], steps, cfg["min_lr"])
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = windows(data["train"], data["train_starts"][i], T)
        _, loss = model(ta.tensor(x), ta.tensor(y))
        loss.backward()
        clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return train_loop(step, evaluate, steps, every, "ours")


def run_torch(data, cfg: dict, steps: int, every: int, args, init_path: str) -> dict:
    """The plain PyTorch script: benchmarks/torch_plain_step.py's GPT and nanoGPT's loop."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from torch_plain_step import PlainGPT, make_optimizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = PlainGPT(int(data["vocab_size"]), cfg["block_size"], cfg["n_layer"],
                     cfg["n_head"], cfg["n_embd"], attn=args.attn, dropout=cfg["dropout"])
    if init_path:
        init = np.load(init_path)
        state = {k: torch.from_numpy(init[k]) for k in init.files}
        model.load_state_dict(state, strict=True)
    opt = make_optimizer(model, lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]),
                         weight_decay=cfg["weight_decay"])
    T = cfg["block_size"]

    @torch.no_grad()
    def evaluate(split: str) -> float:
        model.eval()
        source = data["train"] if split == "train" else data["val"]
        losses = []
        for starts in data["eval_" + split]:
            x, y = windows(source, starts, T)
            losses.append(model(torch.from_numpy(x), torch.from_numpy(y))[1].item())
        model.train()
        return float(np.mean(losses))

    def step(i: int) -> float:
        lr = get_lr(i, cfg, steps)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = windows(data["train"], data["train_starts"][i], T)
        _, loss = model(torch.from_numpy(x), torch.from_numpy(y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return train_loop(step, evaluate, steps, every, "torch")


def train_loop(step, evaluate, steps: int, every: int, name: str) -> dict:
    """Train `steps` steps, evaluating at eval_points; times the two apart."""
    points = set(eval_points(steps, every))
    history, train_s, eval_s, last = [], 0.0, 0.0, float("nan")
    for i in range(steps + 1):
        if i in points:
            t0 = time.perf_counter()
            rec = {"step": i, "train": evaluate("train"), "val": evaluate("val")}
            eval_s += time.perf_counter() - t0
            history.append(rec)
            print(f"[{name}] step {i}: train {rec['train']:.4f}, val {rec['val']:.4f}, "
                  f"last batch {last:.4f}, {train_s:.1f} s training", flush=True)
        if i == steps:
            break
        t0 = time.perf_counter()
        last = step(i)
        train_s += time.perf_counter() - t0
    return {"history": history, "train_s": train_s, "eval_s": eval_s, "last_loss": last}


def worker(args) -> int:
    """One engine's run (in its own process): reads --data, writes --result."""
    with np.load(args.data) as f:
        data = {k: f[k] for k in f.files}
    cfg, steps = dict(RECIPE), int(data["train_starts"].shape[0])
    run = run_ours if args.worker == "ours" else run_torch
    result = run(data, cfg, steps, args.eval_every, args, args.init)
    result["threads"] = args.threads
    Path(args.result).write_text(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------- the driver
def launch(engine: str, args, tmp: str, init: str, write_init: bool) -> dict:
    """Run one engine's process to its end; its lines go to this one's stdout."""
    result = os.path.join(tmp, f"{engine}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine,
           "--data", os.path.join(tmp, "data.npz"), "--result", result,
           "--threads", str(args.threads), "--attn", args.attn, "--seed", str(args.seed),
           "--eval-every", str(args.eval_every)]
    if args.kernels:
        cmd += ["--kernels", args.kernels]
    if init and (write_init or os.path.exists(init)):
        cmd += ["--init", init]
    env = dict(os.environ)
    if engine == "ours" and not env.get("OPENBLAS_THREAD_TIMEOUT", "").strip():
        # the worker loads NumPy (this file's import) before the engine, which would have
        # set this for NumPy's OpenBLAS: set it here, to the engine's value
        from tinygrad_attn.backend.threads import OPENBLAS_THREAD_TIMEOUT

        env["OPENBLAS_THREAD_TIMEOUT"] = OPENBLAS_THREAD_TIMEOUT
    t0 = time.perf_counter()
    done = subprocess.run(cmd, stderr=subprocess.PIPE, text=True, env=env)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        print(f"[{engine}] failed (exit {done.returncode}):\n{tail}", flush=True)
        return {"engine": engine, "failed": done.returncode, "wall_s": wall}
    out = json.loads(Path(result).read_text())
    out.update(engine=engine, wall_s=wall)
    return out


def report(runs: list[dict], steps: int, summary: dict, args) -> str:
    ok = [r for r in runs if "failed" not in r]
    init = ("each engine its own" if args.own_init or args.engine_list[0] != "ours"
            else "the engine's, loaded by name in torch")
    lines = [f"nanoGPT's CPU recipe, {steps} steps (batch {RECIPE['batch_size']}, block "
             f"{RECIPE['block_size']}, {RECIPE['n_layer']} layers x {RECIPE['n_head']} heads x "
             f"{RECIPE['n_embd']}, attention {args.attn}), {args.threads} threads each, the "
             f"embedded corpus ({summary['characters']:,} characters, vocabulary "
             f"{summary['vocab_size']}); data seed {args.seed}; initial weights: {init}; "
             f"{machine()}", "",
             "| engine | wall s (process) | training s | steps/s | eval s | final train loss "
             "| final val loss |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        if "failed" in r:
            lines.append(f"| {r['engine']} | failed (exit {r['failed']}) | | | | | |")
            continue
        end = r["history"][-1]
        lines.append(f"| {r['engine']} | {r['wall_s']:.1f} | {r['train_s']:.1f} "
                     f"| {steps / r['train_s']:.2f} | {r['eval_s']:.1f} | {end['train']:.4f} "
                     f"| {end['val']:.4f} |")
    if len(ok) == 2:
        a, b = ok
        lines.append(f"| ratio {a['engine']} / {b['engine']} | {a['wall_s'] / b['wall_s']:.2f} "
                     f"| {a['train_s'] / b['train_s']:.2f} "
                     f"| {(steps / a['train_s']) / (steps / b['train_s']):.2f} "
                     f"| {a['eval_s'] / b['eval_s']:.2f} "
                     f"| {a['history'][-1]['train'] - b['history'][-1]['train']:+.4f} "
                     f"| {a['history'][-1]['val'] - b['history'][-1]['val']:+.4f} |")
        lines += ["", "(ratio row: times as ratios, losses as differences.)", "",
                  "| step | " + " | ".join(f"{r['engine']} train | {r['engine']} val"
                                           for r in ok) + " |",
                  "|---|" + "---|---|" * len(ok)]
        for recs in zip(*(r["history"] for r in ok)):
            lines.append(f"| {recs[0]['step']} | " + " | ".join(
                f"{x['train']:.4f} | {x['val']:.4f}" for x in recs) + " |")
    return "\n".join(lines)


def machine() -> str:
    import platform

    name = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f
                         if ln.startswith("model name")), name)
    except OSError:
        pass
    try:
        load = f"; load average (1 min) at the end {os.getloadavg()[0]:.1f}"
    except OSError:
        load = ""
    return f"{name}, {os.cpu_count()} CPUs, Python {platform.python_version()}{load}."


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000, help="training steps (the recipe: 2000)")
    p.add_argument("--eval-every", type=int, default=250, help="evaluate every N steps")
    p.add_argument("--engines", default="ours,torch",
                   help="comma-separated, run in this order: from ours,torch")
    p.add_argument("--attn", default="flash", choices=("views", "flash"))
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--kernels", default=None, choices=("numpy", "numba", "auto"),
                   help="the engine's kernel path (default: the engine's own choice)")
    p.add_argument("--seed", type=int, default=1337, help="data and init seed")
    p.add_argument("--init", default=None, help=argparse.SUPPRESS)  # worker: weights file
    p.add_argument("--own-init", action="store_true",
                   help="each engine initialises its own weights (default: torch loads the "
                        "engine's initial weights by name)")
    p.add_argument("--markdown", default=None, help="also write the tables to this path")
    p.add_argument("--json", default=None, help="also write every number to this path")
    p.add_argument("--worker", choices=ENGINES, default=None, help=argparse.SUPPRESS)
    p.add_argument("--data", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.engine_list = [e.strip() for e in args.engines.split(",") if e.strip()]
    for e in args.engine_list:
        if e not in ENGINES:
            p.error(f"unknown engine {e!r}; choose from {', '.join(ENGINES)}")
    if args.steps < 1 or args.eval_every < 0 or args.threads < 1:
        p.error("--steps and --threads must be positive, --eval-every not negative")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.worker:
        return worker(args)
    with tempfile.TemporaryDirectory(prefix="recipe_") as tmp:
        summary = prepare(os.path.join(tmp, "data.npz"), args.steps, args.seed, RECIPE)
        init = "" if args.own_init else os.path.join(tmp, "init.npz")
        runs = []
        for engine in args.engine_list:
            print(f"--- {engine}: its own process, alone (load average now "
                  f"{os.getloadavg()[0]:.1f})", flush=True)
            runs.append(launch(engine, args, tmp, init, write_init=engine == "ours"))
    text = report(runs, args.steps, summary, args)
    print()
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "data": summary,
                                               "recipe": RECIPE, "steps": args.steps}))
    return 0 if all("failed" not in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
