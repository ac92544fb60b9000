"""The motivating story end to end: a nanoGPT port's batch-64 step under an emulated 6 GiB
device (where the story's port ran out of memory), and the memory planner's setting for it.

    python examples/memory_story.py                       # the story's sizes (takes minutes)
    python examples/memory_story.py --budget 2GiB         # a budget that binds here
    python examples/memory_story.py --markdown story.md   # also write the table there
    python examples/memory_story.py --quick               # a tiny config (the tests use it)

The model is the shakespeare-char GPT (n_layer 6, n_head 6, n_embd 384, block size 256,
vocab 65, dropout 0, float32), one training step at batch 64 (forward, backward, AdamW),
and the device is emulated by ta.memory.limit(budget): an allocation past the budget raises
ta.OutOfMemoryError, whose message lists what holds the memory. Every size below is what
the step holds above the live bytes before it starts (the model, its gradients and AdamW's
state included), as the planner counts them.

  1. the naive port (attn="naive": three slices of qkv, heads copied by permute +
     contiguous; no checkpointing; every op saves what it saves by default) under the
     budget: the OutOfMemoryError and its holders report; then the same step without the
     limit under ta.memory.profile(raw=True): its tensor peak and raw (tracemalloc) peak.
  2. the unconstrained step with the default config (attn="views"): its peaks and step time.
  3. the plan: ta.memory.plan(gpt_step(config), budget, batch, knobs=gpt_knobs(config)),
     printed, then plan.verify(step) (the step under the limit; it must not raise).
  4. a table at the same budget: the naive port, the unconstrained step, the planner's
     choice, and the simple choices (checkpoint every block; flash attention only;
     recompute policies only, gelu and layer_norm). Each row runs under the limit: whether
     it fits (no OutOfMemoryError; the limit counts tensors, so a raw peak over the budget
     is said apart, and such a row does not count as fitting, as for the planner), its
     measured tensor and raw peaks (without the limit for a row that does not fit: what
     it would need), and its step time: the median of --steps steps of one model after a
     warm-up step (the model is built once, so building it is not timed), against the
     unconstrained step's.

One configuration runs at a time, and everything of one row is freed before the next.

Measured on a 2-core CPU: at the story's sizes this engine's step peaks at 3.06 GiB, the
naive port included, so under 6 GiB every row fits and the default is the answer; under
--budget 2GiB the naive port, flash only and recompute policies only run out of memory,
and the planner's setting (1.09 GiB) and checkpointing every block fit.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import nn
import tinygrad_attn as ta
from nn.memory_plan import TIME_KNOBS, apply, gpt_knobs, gpt_step, prime_adamw

PROG = "memory_story.py"
fmt = ta.memory.fmt_bytes


def story_config(quick: bool = False) -> nn.GPTConfig:
    """The shakespeare-char GPT (or, --quick, a tiny one), attn="views", no checkpointing."""
    if quick:
        return nn.GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32,
                            dropout=0.0, bias=True, attn_block_size=16)
    return nn.GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384,
                        dropout=0.0, bias=True)


DEFAULT = {"attn": "views", "policy": "save", "checkpoint": []}


def rows_for(config: nn.GPTConfig, plan_choice: dict) -> list:
    """(name, choice, under the limit?) for each row of the table."""
    every = list(range(config.n_layer))
    return [
        ("naive port", dict(DEFAULT, attn="naive"), True),
        ("unconstrained (views)", dict(DEFAULT), False),
        ("planner's choice", dict(plan_choice), True),
        ("checkpoint every block", dict(DEFAULT, checkpoint=every), True),
        ("flash only", dict(DEFAULT, attn="flash"), True),
        ("recompute policies only", dict(DEFAULT, policy="recompute"), True),
    ]


def _free() -> None:
    gc.collect()


def try_under_limit(step, batch: int, choice: dict, budget: int):
    """Run one step under the budget: (None, profile summary) or (the OutOfMemoryError, None)."""
    _free()
    base = ta.memory.live_bytes()
    try:
        with ta.memory.limit(base + budget), ta.memory.profile(raw=True) as prof:
            step(batch, dict(choice))
    except ta.OutOfMemoryError as e:
        _free()
        return e, None
    s = prof.summary()
    del prof
    _free()
    return None, s


def measure_peaks(step, batch: int, choice: dict) -> dict:
    """Tensor and raw peaks of one step without any limit (ta.memory.profile(raw=True))."""
    _free()
    with ta.memory.profile(raw=True) as prof:
        step(batch, dict(choice))
    s = prof.summary()
    del prof
    _free()
    return {"peak": s["tensor_peak_above_start"], "raw_peak": s["raw_peak_bytes"],
            "saved": s["saved_peak"]["unique_bytes_without_parameters"]}


def time_steps(config: nn.GPTConfig, batch: int, choice: dict, steps: int,
               budget: int | None, seed: int = 0) -> dict:
    """The median seconds of `steps` training steps of one model (built once, AdamW's state
    made up front as in gpt_step), after one warm-up step, under the budget when given."""
    _free()
    base = ta.memory.live_bytes()
    cfg, policies = apply(choice, config)
    times = []
    guard = ta.memory.limit(base + budget) if budget is not None else _nothing()
    with guard, policies:
        ta.manual_seed(seed)
        model = nn.GPT(cfg)
        opt = nn.optim.AdamW(model.parameters(), lr=3e-4)
        prime_adamw(opt)
        for i in range(steps + 1):
            idx = ta.randint(0, cfg.vocab_size, (batch, cfg.block_size))
            targets = ta.randint(0, cfg.vocab_size, (batch, cfg.block_size))
            t0 = time.perf_counter()
            _, loss = model(idx, targets)
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()
            dt = time.perf_counter() - t0
            del loss, idx, targets
            if i:  # the first is the warm-up
                times.append(dt)
        del model, opt
    _free()
    return {"seconds": statistics.median(times), "times": times}


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def oom_head(err: Exception, lines: int = 8) -> str:
    return "\n".join(str(err).splitlines()[:lines])


def choice_text(choice: dict) -> str:
    cp = choice["checkpoint"]
    cp = "none" if not cp else ("all" if cp is True else ",".join(map(str, cp)))
    return f"attn={choice['attn']}, policy={choice['policy']}, checkpoint={cp}"


def table(rows: list, budget: int, base_seconds: float) -> str:
    lines = ["| row | choice | fits under the budget | tensor peak | raw peak | step s | "
             "overhead vs unconstrained |",
             "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        if r["limited"]:
            fits = "yes" if r["fits"] else "no (OutOfMemoryError)"
            if r["fits"] and r["raw_peak"] > budget:
                fits = "tensors yes; raw peak over"
        else:
            fits = "no limit" + ("" if r["peak"] <= budget else f" (needs {fmt(r['peak'])})")
        if r["seconds"] is None:
            secs, over = "-", "-"
        else:
            secs = f"{r['seconds']:.3f}" + (f" (= {r['same_as']})" if "same_as" in r else "")
            over = f"{(r['seconds'] / base_seconds - 1) * 100:+.1f} %"
            if not r["fits"] and r["limited"]:
                secs, over = f"({secs} unlimited)", f"({over})"
        note = "" if r["fits"] or not r["limited"] else " (without the limit)"
        lines.append(f"| {r['name']} | {choice_text(r['choice'])} | {fits} | "
                     f"{fmt(r['peak'])}{note} | {fmt(r['raw_peak'])}{note} | {secs} | {over} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=None, help="batch size (default 64; 16 quick)")
    ap.add_argument("--budget", default=None,
                    help="the emulated device's size (default 6GiB; 3MiB quick)")
    ap.add_argument("--steps", type=int, default=None,
                    help="timed steps per row, after a warm-up (default 3; 2 quick)")
    ap.add_argument("--quick", action="store_true", help="a tiny config (the tests use it)")
    ap.add_argument("--time-oom-rows", action="store_true",
                    help="also time, without the limit, the rows that do not fit")
    ap.add_argument("--markdown", default=None, help="also write the table to this path")
    ap.add_argument("--json", default=None, help="also write every number to this path")
    args = ap.parse_args(argv)
    config = story_config(args.quick)
    batch = args.batch if args.batch is not None else (16 if args.quick else 64)
    steps = args.steps if args.steps is not None else (2 if args.quick else 3)
    if batch < 1:
        ap.error(f"--batch must be at least 1, got {batch}")
    if steps < 1:
        ap.error(f"--steps must be at least 1, got {steps}")
    try:
        budget = ta.memory.parse_bytes(args.budget or ("3MiB" if args.quick else "6GiB"),
                                       "--budget")
    except (TypeError, ValueError) as e:
        ap.error(str(e))
    step = gpt_step(config)
    print(f"GPT n_layer={config.n_layer}, n_head={config.n_head}, n_embd={config.n_embd}, "
          f"block {config.block_size}, vocab {config.vocab_size}, float32, dropout 0; "
          f"batch {batch}, budget {fmt(budget)}; {platform.machine()}, "
          f"Python {platform.python_version()}")
    out = {"batch": batch, "budget": budget, "steps": steps, "quick": args.quick}

    # 1. the naive port under the limit, then without it
    print("\n== 1. the naive port under the budget")
    naive = dict(DEFAULT, attn="naive")
    step(1, naive)  # warm-up: first-call caches
    err, _ = try_under_limit(step, batch, naive, budget)
    if err is None:
        print("it fits (no OutOfMemoryError)")
    else:
        print(f"ta.OutOfMemoryError:\n{oom_head(err)}")
    out["naive_oom"] = None if err is None else str(err)
    del err
    naive_peaks = measure_peaks(step, batch, naive)
    print(f"without the limit the same step peaks at {fmt(naive_peaks['peak'])} of tensors, "
          f"{fmt(naive_peaks['raw_peak'])} raw (tracemalloc), "
          f"{fmt(naive_peaks['saved'])} saved for backward")

    # 2. the unconstrained step, default config
    print("\n== 2. the unconstrained step (attn='views')")
    step(1, DEFAULT)
    base_peaks = measure_peaks(step, batch, DEFAULT)
    base_time = time_steps(config, batch, DEFAULT, steps, None)
    over = "more" if base_peaks["peak"] > budget else "less"
    print(f"tensor peak {fmt(base_peaks['peak'])} ({over} than the budget), raw "
          f"{fmt(base_peaks['raw_peak'])}; step {base_time['seconds']:.3f} s (median of "
          f"{steps})")

    # 3. the plan
    print("\n== 3. the plan")
    t0 = time.perf_counter()
    knobs = gpt_knobs(config)
    # profiled at two small batches (the byte fits are exact there); the two attentions'
    # steps timed at a quarter and a half of the batch (a line through them extrapolated
    # to the batch carries their noise twice, not fourteen times as from 4 and 8), the
    # recompute settings' rebuilt ops read at 4 and 8 (their seconds are steady)
    quarter = max(batch // 4, 1)
    plan = ta.memory.plan(step, budget, batch=batch, knobs=knobs,
                          measure_batches=(4, 8) if args.quick else (1, 2),
                          time_batches=(quarter, max(batch // 2, quarter + 1)),
                          recompute_batches=(4, 8), time_knobs=TIME_KNOBS, repeats=3)
    plan_s = time.perf_counter() - t0
    print(plan)
    print(f"(planning took {plan_s:.1f} s)")
    verified = plan.verify(step) if plan.fits else None
    if verified is not None:
        print(f"verify: ran under the limit; measured tensor peak {fmt(verified['peak'])}, "
              f"raw {fmt(verified['raw_peak'])} (predicted {fmt(plan.peak)}, raw "
              f"{fmt(plan.raw_peak)}); within the budget: {verified['within_budget']}")
    out["plan"] = {"choice": plan.choice, "fits": plan.fits, "peak": plan.peak,
                   "raw_peak": plan.raw_peak, "seconds": plan.seconds, "needs": plan.needs,
                   "planning_seconds": plan_s, "verify": verified}
    _free()

    # 4. the table
    print(f"\n== 4. at batch {batch} under {fmt(budget)} (step s: median of {steps} after a "
          f"warm-up)")
    rows = []
    timings: dict = {}  # a setting shown twice (the plan's is a simple one) is timed once
    for name, choice, limited in rows_for(config, plan.choice):
        row = {"name": name, "choice": choice, "limited": limited}
        if name.startswith("unconstrained"):
            row.update(fits=base_peaks["peak"] <= budget, peak=base_peaks["peak"],
                       raw_peak=base_peaks["raw_peak"], seconds=base_time["seconds"],
                       times=base_time["times"])
            rows.append(row)
            continue
        if name == "naive port":
            err = out["naive_oom"]
            peaks = naive_peaks
            fits = err is None
        else:
            step(1, choice)
            e, s = try_under_limit(step, batch, choice, budget)
            fits = e is None
            del e
            if fits:
                peaks = {"peak": s["tensor_peak_above_start"], "raw_peak": s["raw_peak_bytes"]}
            else:
                peaks = measure_peaks(step, batch, choice)
        row.update(fits=fits, peak=peaks["peak"], raw_peak=peaks["raw_peak"], seconds=None)
        timed = None
        key = json.dumps([choice, fits], sort_keys=True)
        if key in timings:
            timed = timings[key]
            row["same_as"] = timed["row"]
        elif fits:
            timed = time_steps(config, batch, choice, steps, budget)
        elif args.time_oom_rows:
            timed = time_steps(config, batch, choice, steps, None)
        if timed is not None and key not in timings:
            timings[key] = dict(timed, row=name)
        if timed is not None:
            row.update(seconds=timed["seconds"], times=timed["times"])
        rows.append(row)
        print(f"  {name}: {'fits' if fits else 'OutOfMemoryError'}, peak {fmt(row['peak'])}"
              + ("" if row["seconds"] is None else f", {row['seconds']:.3f} s")
              + (f" (the same setting as {row['same_as']}: its timing)"
                 if "same_as" in row else ""))
    text = table(rows, budget, base_time["seconds"])
    print()
    print(text)
    planner_row = rows[2]
    # fitting, as the planner counts it: no OutOfMemoryError and the raw peak within too
    simple = [r for r in rows[3:] if r["fits"] and r["raw_peak"] <= budget
              and r["seconds"] is not None]
    if planner_row["fits"] and simple:
        best = min(simple, key=lambda r: r["seconds"])
        verdict = ("no slower than" if planner_row["seconds"] <= best["seconds"]
                   else "SLOWER than")
        summary = (f"planner's choice {planner_row['seconds']:.3f} s is {verdict} the best "
                   f"simple choice that fits ({best['name']}, {best['seconds']:.3f} s); "
                   f"overhead vs unconstrained "
                   f"{(planner_row['seconds'] / base_time['seconds'] - 1) * 100:+.1f} %")
    else:
        summary = ("the planner's choice fits and no simple choice does (raw peak included)"
                   if planner_row["fits"]
                   else "the planner's choice does not fit")
    print("\n" + summary)
    out.update(rows=rows, table=text, summary=summary, base_peaks=base_peaks,
               naive_peaks=naive_peaks, base_seconds=base_time["seconds"])
    if args.markdown:
        Path(args.markdown).write_text(
            f"batch {batch}, budget {fmt(budget)}, {steps} timed steps per row\n\n"
            + text + "\n\n" + summary + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(out, default=str, indent=1))
    return out


if __name__ == "__main__":
    try:
        result = main()
    except MemoryError as e:  # the machine itself ran out: one line, not a traceback
        print(f"{PROG}: error: out of memory: {e}; lower --batch", file=sys.stderr)
        raise SystemExit(2) from None
    sys.exit(0 if result["plan"]["fits"] else 1)
