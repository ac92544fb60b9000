"""The memory planner's predictions against measured steps, and its choices against simple ones.

    python benchmarks/memory_plan.py                     # n_layer 4, n_embd 128, T 64
    python benchmarks/memory_plan.py --quick             # a tiny config (seconds)

ta.memory.plan measures every combination of a GPT's knobs (nn.memory_plan.gpt_knobs:
attention views/flash, save policies, k of the n_layer blocks checkpointed) once at batches 1
and 2. From those fits it plans (budget, batch, attention) points (Plan.replan, narrowed to
one attention), and each plan is run under ta.memory.limit(budget) (Plan.verify), which
prints the first table: predicted vs measured tensor peak (and raw peak beside it).

The first table also gives the FLOPs each plan re-runs in backward, predicted and counted
(Plan.verify(flops=True)). The second table, per (batch, budget), compares the plan's step
time (both attentions allowed), predicted and measured (the median of --steps steps), with
the simple choices that fit: checkpoint every block, flash only, recompute policies only;
and with the exhaustive optimum of the cost model, found here by brute force over the
alternatives (it must equal the plan's).
"""

from __future__ import annotations

import argparse
import json
import time

import nn
import tinygrad_attn as ta
from nn.memory_plan import TIME_KNOBS, gpt_knobs, gpt_step

MiB = 2**20


def _mib(n) -> str:
    return f"{n / MiB:.2f}"


def config(quick: bool) -> nn.GPTConfig:
    if quick:
        return nn.GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32,
                            attn_block_size=16)
    return nn.GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)


def budgets_for(plan, batch: int, attention: str, levels: int) -> list:
    """`levels` budgets at batch `batch` for one attention, from what its combinations
    need: everything fits, then down to only the leanest (each a need, so one fits)."""
    narrowed = plan.replan(plan.budget, batch, knobs={"attn": [attention]})
    needs = sorted({max(a["raw_peak"], a["peak"]) for a in narrowed.alternatives},
                   reverse=True)
    picks = [needs[round(i * (len(needs) - 1) / max(levels - 1, 1))] for i in range(levels)]
    return sorted(set(picks), reverse=True)


SIMPLE = {  # the simple choices: one knob turned, the others at their defaults
    "checkpoint every block": lambda c, L: c["attn"] == "views" and c["policy"] == "save"
    and len(c["checkpoint"]) == L,
    "flash only": lambda c, L: c["attn"] == "flash" and c["policy"] == "save"
    and not c["checkpoint"],
    "recompute policies only": lambda c, L: c["attn"] == "views"
    and c["policy"] == "recompute" and not c["checkpoint"],
}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a tiny config")
    p.add_argument("--batch", type=int, nargs="+", default=None,
                   help="batch sizes to plan (default 8 16; --quick 4 8)")
    p.add_argument("--levels", type=int, default=3, help="budgets per (batch, attention)")
    p.add_argument("--steps", type=int, default=5,
                   help="timed steps per measured setting (the median)")
    args = p.parse_args(argv)
    cfg = config(args.quick)
    batches = args.batch or ([4, 8] if args.quick else [8, 16])
    if min(batches) < 1 or args.levels < 1:
        p.error("batch sizes and --levels must be at least 1")
    L = cfg.n_layer

    t0 = time.perf_counter()
    step = gpt_step(cfg)
    knobs = gpt_knobs(cfg)
    timed = (min(batches), max(batches)) if len(set(batches)) > 1 else None
    full = ta.memory.plan(step, "1TiB", batch=max(batches), knobs=knobs,
                          time_batches=timed, time_knobs=TIME_KNOBS, repeats=3)
    measured_in = time.perf_counter() - t0
    print(f"# Memory planner: n_layer {L}, n_head {cfg.n_head}, n_embd {cfg.n_embd}, "
          f"block_size {cfg.block_size}, vocab {cfg.vocab_size}, float32, AdamW\n")
    print(f"{len(full.alternatives)} combinations measured at batches "
          f"{full.measure_batches[0]} and {full.measure_batches[1]} in {measured_in:.1f} s; "
          f"checkpoint options {knobs['checkpoint']}\n")

    # -- predicted vs measured ------------------------------------------------------------
    print("| budget MiB | batch | attention | choice | predicted peak MiB | measured peak MiB "
          "| error | predicted raw MiB | measured raw MiB | recompute MFLOP predicted / "
          "measured | fits |")
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|")
    points = []
    for batch in batches:
        for attention in knobs["attn"]:
            for budget in budgets_for(full, batch, attention, args.levels):
                plan = full.replan(budget, batch, knobs={"attn": [attention]})
                v = plan.verify(step, flops=True)  # under ta.memory.limit(budget)
                err = (plan.peak - v["peak"]) / v["peak"]
                points.append({"budget": budget, "batch": batch, "attention": attention,
                               "plan": plan.to_dict(), "measured": v, "error": err})
                c = plan.choice
                print(f"| {_mib(budget)} | {batch} | {attention} | {c['policy']}, "
                      f"ckpt {c['checkpoint']} | {_mib(plan.peak)} | {_mib(v['peak'])} | "
                      f"{100 * err:+.2f}% | {_mib(plan.raw_peak)} | {_mib(v['raw_peak'])} | "
                      f"{plan.recompute_flops / 1e6:.1f} / {v['recompute_flops'] / 1e6:.1f} | "
                      f"{'yes' if plan.fits and v['within_budget'] else 'NO'} |", flush=True)
    worst = max(abs(pt["error"]) for pt in points)
    flops_exact = all(pt["plan"]["recompute_flops"] == pt["measured"]["recompute_flops"]
                      for pt in points)
    print(f"\n{len(points)} points; largest tensor-peak error {100 * worst:.2f}%; recompute "
          f"FLOPs predicted {'exactly' if flops_exact else 'NOT exactly'} at every point. "
          "Sizes are above the live bytes at the step's start (the step builds its model, "
          "gradients and AdamW state); raw is tracemalloc's, what the budget is planned "
          "against.\n")

    # -- the plan's time vs the simple choices ----------------------------------------------
    names = list(SIMPLE)
    print("| batch | budget MiB | plan | plan s predicted / measured | "
          + " | ".join(f"{n} s predicted / measured" for n in names)
          + " | exhaustive optimum s | plan / best simple, measured |")
    print("|---:|---:|---|---:|" + "---:|" * len(names) + "---:|---:|")
    rows, ratios = [], []
    for batch in batches:
        budgets = sorted({pt["budget"] for pt in points if pt["batch"] == batch},
                         reverse=True)
        plans = [full.replan(budget, batch) for budget in budgets]
        wanted = []  # every setting a row shows, each measured once (round-robin)
        for plan in plans:
            for alt in plan.alternatives:
                fits = alt["raw_peak"] <= plan.budget and alt["peak"] <= plan.budget
                simple = any(SIMPLE[n](alt["choice"], L) for n in names)
                if fits and (alt["choice"] == plan.choice or simple) \
                        and alt["choice"] not in wanted:
                    wanted.append(alt["choice"])
        got = measure_round_robin(step, batch, wanted, args.steps)
        for budget, plan in zip(budgets, plans):
            fitting = [a for a in plan.alternatives
                       if a["raw_peak"] <= budget and a["peak"] <= budget]
            optimum = min((a["seconds"] for a in fitting), default=None)
            plan_s = got[json.dumps(plan.choice)] if plan.fits else None
            cells, simple = [], []
            for name in names:
                alt = next(a for a in plan.alternatives if SIMPLE[name](a["choice"], L))
                if alt in fitting:
                    t = got[json.dumps(alt["choice"])]
                    simple.append(t)
                    cells.append(f"{alt['seconds']:.4f} / {t:.4f}")
                else:
                    cells.append("no fit")
            ratio = plan_s / min(simple) if simple and plan_s else None
            if ratio is not None:
                ratios.append(ratio)
            c = plan.choice
            choice = f"{c['attn']}, {c['policy']}, ckpt {c['checkpoint']}"
            print(f"| {batch} | {_mib(budget)} | {choice if plan.fits else 'nothing fits'} | "
                  f"{plan.seconds:.4f} / "
                  + ("-" if plan_s is None else f"{plan_s:.4f}") + " | "
                  + " | ".join(cells) + " | "
                  f"{'-' if optimum is None else f'{optimum:.4f}'} | "
                  + ("no simple choice fits" if ratio is None else f"{ratio:.3f}") + " |",
                  flush=True)
            assert optimum is None or optimum == plan.seconds
            rows.append({"batch": batch, "budget": budget, "plan": plan.to_dict(),
                         "measured_seconds": plan_s, "simple_seconds": simple})
    timed_at = full.time_batches or full.measure_batches
    print(f"\nseconds predicted: the cost model (the attention's step timed at batches "
          f"{timed_at[0]} and {timed_at[1]}, median of {full.repeats}, plus the seconds of "
          "the ops each setting re-runs in backward, read in one step of it); measured: the "
          f"median of {args.steps} steps of gpt_step (forward, backward, AdamW), each "
          "setting shown at a batch measured once, the settings in turn, on this machine, "
          "now. The optimum is the least prediction over every combination that "
          "fits, by brute force."
          + (f" Plan / best simple choice that fits, measured: {min(ratios):.3f} to "
             f"{max(ratios):.3f}." if ratios else ""))
    return {"points": points, "rows": rows}


def measure_round_robin(step, batch: int, choices: list, n: int) -> dict:
    """json of each choice -> the median of n steps' own seconds (gpt_step returns them),
    after a warm-up each, the choices taken in turn n times (a drift of the machine's speed
    meets them alike)."""
    for c in choices:
        step(batch, dict(c))
    times = {json.dumps(c): [] for c in choices}
    for _ in range(n):
        for c in choices:
            times[json.dumps(c)].append(step(batch, dict(c)))
    return {k: sorted(v)[n // 2] for k, v in times.items()}


if __name__ == "__main__":
    main()
