"""Where attention's memory goes: the motivating story, measured by the ledger.

    python examples/attention_memory.py                  # the story's config, batch 32 and 64
    python examples/attention_memory.py --batch 8 16 --limit 512MiB --plot mem.png
    python examples/attention_memory.py --quick          # a tiny config (used by the tests)

For a small GPT (4 layers, 4 heads, n_embd 128, vocab 65, block size 256, float32, no
dropout) it runs ONE training step (forward, backward, AdamW step, zero_grad) for each
attention implementation ("naive", "views", "flash"), with and without checkpointing,
under `ta.memory.profile`, and prints:

1. the table: peaks, saved-for-backward bytes beside their analytic floor (`floor_bytes`),
   copies, step time, and whether the step fits an emulated device (`--limit`);
2. the copies made in attention's forward by "naive" and "views", with their source lines;
3. the habits of the story as `ta.memory.emulate` switches, each sized alone and together;
4. a batch-size predictor fitted at two small batches, checked against the measured peaks;
5. the memory timelines of "naive" vs "flash" side by side (`--plot`).

Peaks are tensor-level (exact, from the Storage events); "raw" is tracemalloc's, which also
sees the temporaries inside ops. "fits" compares the absolute tensor peak (parameters and
inputs included) with the limit, which is what `ta.memory.set_limit` enforces.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import sys
import time
from dataclasses import replace

import numpy as np

import nn
import tinygrad_attn as ta
from nn.optim import AdamW
from tinygrad_attn.memory import planner

MiB = 2**20
PROG = "attention_memory.py"
IMPLS = ("naive", "views", "flash")
SWITCHES = {  # ta.memory.emulate keyword -> the habit of the story it reproduces, alone
    "permute_copies": {"permute_copies": True},
    "inplace_grad_accumulation=False": {"inplace_grad_accumulation": False},
    "slice_grad_full": {"slice_grad_full": True},
    "late_free": {"late_free": True},
}
ALL_SWITCHES = {k: v for d in SWITCHES.values() for k, v in d.items()}
COLORS = {"parameter": "#4c72b0", "gradient": "#dd8452", "optimizer_state": "#8172b3",
          "saved": "#c44e52", "activation": "#55a868", "temporary": "#937860",
          "bucket": "#da8bc3"}  # prof.plot's


def story_config(quick: bool = False) -> nn.GPTConfig:
    if quick:
        return nn.GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32,
                            dropout=0.0, attn_block_size=16)
    return nn.GPTConfig(vocab_size=65, block_size=256, n_layer=4, n_head=4, n_embd=128,
                        dropout=0.0)


def _refuse_if_too_big(need: int, what: str, fix: str) -> None:
    """One line and exit status 2 when a step would need more than the machine has."""
    free = ta.memory.available_bytes()
    if free is not None and need > free:
        print(f"{PROG}: error: {what} needs at least {need / 2**30:.1f} GiB for one step "
              f"and {free / 2**30:.1f} GiB is available: {fix}", file=sys.stderr)
        raise SystemExit(2)


# ----------------------------------------------------------------------------- analytic
def floor_bytes(cfg: nn.GPTConfig, batch: int, attn: str | None = None,
                checkpoint: bool | None = None, seq_len: int | None = None,
                itemsize: int = 4) -> dict:
    """The bytes one training step must hold, from the config and what each op saves.

    B = batch, T = seq_len (default block_size), C = n_embd, nh = n_head, L = n_layer,
    V = vocab_size, f = itemsize (4 for float32); indices are int64 (8 bytes).

    parameters   wte V*C (tied to lm_head: one tensor) + wpe block_size*C + ln_f 2C
                 + L * (12 C^2 + 13 C)   [ln_1 2C, c_attn 3C^2+3C, c_proj C^2+C, ln_2 2C,
                 c_fc 4C^2+4C, mlp.c_proj 4C^2+C]; without bias: 12 C^2 + 2C per layer, C ln_f
    gradients    = parameters (one .grad per tensor)
    adamw_state  = 2 * parameters (exp_avg, exp_avg_sq)
    saved_activations (bytes pinned by graph nodes, each storage once; the parameters a
    node keeps are left out, as the ledger's unique_bytes_without_parameters does):
      top level  wte's IndexSelect: idx (B*T int64); wpe's: pos (T int64);
                 ln_f: its input (B,T,C) + rstd (B,T); lm_head's matmul: its input (B,T,C);
                 cross_entropy: logits (B*T,V) + logsumexp (B*T) + targets (B*T int64)
      per block  ln_1: its input (B,T,C) + rstd (B,T); c_attn's matmul: its input (B,T,C);
                 attention (below); c_proj's matmul: the merged heads (B,T,C), the one
                 contiguous() copy; ln_2: its input + rstd; c_fc: input (B,T,C);
                 gelu: its input (B,T,4C); mlp.c_proj: gelu's output (B,T,4C)
                 = 16 BTC f + 2 BT f + attention
      attention  "views": qkv (B,T,3C), pinned once by the q/k/v views that both matmuls
                 keep; masked_softmax's output (B,nh,T,T), all it saves (the bool causal
                 mask is read in forward, not kept)
                 "naive": the q, k, v permute copies (3 x (B,nh,T,hs) = 3 BTC; the slices
                 of qkv save nothing, so qkv itself is freed); softmax output (B,nh,T,T);
                 the additive -inf mask is added (Add saves nothing), so no mask is kept
                 "flash": qkv (B,T,3C) pinned by q, k, v; logsumexp (B,nh,T); its output
                 (B,nh,T,hs) is laid out heads-innermost, so it is the merged heads c_proj
                 keeps (counted there once)
      dropout>0  a bool mask per Dropout (1 byte each): the embeddings' (B,T,C), per block
                 resid (B,T,C) + mlp (B,T,C) + attention (B,nh,T,T), and att @ v then
                 keeps the dropped attention (B,nh,T,T) f besides the softmax output
      checkpoint forward keeps only each block's input (B,T,C) (the Checkpoint node's
                 argument) besides the top level; backward recomputes one block at a
                 time, so the saved peak is max(end of forward, the recompute of the last
                 block: idx, pos (and the embeddings' dropout mask), L block inputs and
                 one block's insides, less the BTC of its ln_1's input, which is the
                 block input itself).
    Returns those four (and 'saved_terms', the breakdown, and 'total').
    """
    attn = cfg.attn if attn is None else attn
    checkpoint = cfg.checkpoint if checkpoint is None else checkpoint
    B, T = batch, cfg.block_size if seq_len is None else seq_len
    C, nh, L, V, bs, f = cfg.n_embd, cfg.n_head, cfg.n_layer, cfg.vocab_size, \
        cfg.block_size, itemsize
    BTC, BT, TT = B * T * C * f, B * T * f, B * nh * T * T * f
    per_layer_params = 12 * C * C + (13 * C if cfg.bias else 2 * C)
    params = (V * C + bs * C + L * per_layer_params + (2 * C if cfg.bias else C)) * f

    drop = cfg.dropout > 0
    top = {"embedding indices (idx, pos)": B * T * 8 + T * 8,
           "ln_f input + rstd": BTC + BT, "lm_head input": BTC,
           "cross_entropy logits + lse + targets": B * T * V * f + BT + B * T * 8}
    if drop:
        top["embedding dropout mask"] = B * T * C
    block = {"layernorms input + rstd": 2 * (BTC + BT), "c_attn input": BTC,
             "c_proj input (merged heads)": BTC, "c_fc input": BTC,
             "gelu input + mlp.c_proj input": 8 * BTC}
    if attn == "views":
        block["attn: qkv + softmax out"] = 3 * BTC + TT
    elif attn == "naive":
        block["attn: q, k, v copies + softmax out"] = 3 * BTC + TT
    elif attn == "flash":
        # the output is laid out heads-innermost: it *is* c_proj's input (merged heads)
        block["attn: qkv + logsumexp (+ out, = c_proj input)"] = 3 * BTC + B * nh * T * f
    else:
        raise ValueError(f"unknown attention {attn!r}")
    if drop:
        if attn == "flash":
            raise ValueError("attn='flash' has no attention dropout")
        block["dropout masks + dropped attention"] = 2 * B * T * C + TT // f + TT
    per_block = sum(block.values())
    if not checkpoint:
        terms = {**top, **{f"{k} (x{L} layers)": v * L for k, v in block.items()}}
    else:
        end_of_forward = sum(top.values()) + L * BTC
        below = {k: v for k, v in top.items() if k.startswith("embedding")}  # still kept
        # the rerun block's ln_1 keeps its input x, which is the block input already kept
        rerun = per_block - BTC
        recompute = sum(below.values()) + L * BTC + rerun
        terms = {**top, f"block inputs (x{L} layers)": L * BTC}
        if recompute > end_of_forward:  # the saved peak is during the last block's rerun
            terms = {**below, f"block inputs (x{L} layers)": L * BTC,
                     "one block recomputed in backward (its ln_1 input counted above)": rerun}
    saved = sum(terms.values())
    return {"parameters": params, "gradients": params, "adamw_state": 2 * params,
            "saved_activations": saved, "saved_terms": terms,
            "total": 4 * params + saved}


# ----------------------------------------------------------------------------- measuring
def make_batch(cfg: nn.GPTConfig, batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, cfg.vocab_size, (batch, cfg.block_size))
    tgt = rng.integers(0, cfg.vocab_size, (batch, cfg.block_size))
    return ta.tensor(idx), ta.tensor(tgt)


def measure(cfg: nn.GPTConfig, batch: int, habits: dict | None = None, limit=None,
            keep_profile: bool = False, viewer: bool = False) -> dict:
    """One training step under the ledger; returns the figures of one table row.

    A fresh model and optimizer each time (so AdamW's state is made inside the step, as
    on a first step). With `limit`, the step runs under `ta.memory.limit` and a
    `ta.OutOfMemoryError` is caught and reported as row['oom']. `keep_profile` keeps the
    timeline (row['timeline']); `viewer` keeps the HTML viewer's data (row['viewer']).
    A line on stderr says which run starts (a run takes seconds; the table waits for it).
    """
    switches = ", ".join(k for k, v in (habits or {}).items() if v) or "no switch"
    print(f"  running attn={cfg.attn} checkpoint={'yes' if cfg.checkpoint else 'no'} "
          f"B={batch} ({switches}{', under a limit' if limit is not None else ''})",
          file=sys.stderr, flush=True)
    gc.collect()
    ta.manual_seed(0)
    model = nn.GPT(cfg)
    opt = AdamW(model.parameters(), lr=3e-4)
    idx, tgt = make_batch(cfg, batch)
    oom = None
    t0 = time.perf_counter()
    profile = ta.memory.profile(source_lines=True, raw=True)
    with ta.memory.emulate(**(habits or {})), profile as prof:
        try:
            if limit is not None:
                with ta.memory.limit(limit):
                    _step(model, opt, idx, tgt)
            else:
                _step(model, opt, idx, tgt)
        except ta.OutOfMemoryError as e:
            oom = str(e).splitlines()[0]
    seconds = time.perf_counter() - t0
    s = prof.summary()
    # read the timeline while the model and optimizer live: a Storage freed after the
    # profile ends falls back to the category it had when allocated (AdamW's state, tagged
    # just after its allocation, would show as 'temporary')
    timeline = prof.timeline() if keep_profile else None
    viewer_data = prof.viewer_data(f"{cfg.attn} B={batch}") if viewer else None
    del model, opt, idx, tgt
    row = {
        "attn": cfg.attn, "checkpoint": cfg.checkpoint, "batch": batch, "seconds": seconds,
        "peak": s["tensor_peak_above_start"], "peak_abs": s["peak"]["bytes"],
        "raw_peak": s["raw_peak_bytes"],
        "saved": s["saved_peak"]["unique_bytes_without_parameters"],
        "saved_by_module": s["saved_peak"]["by_module"],
        "copies": s["copies"], "copied": sum(c["bytes"] for c in s["copies"]),
        "floor": floor_bytes(cfg, batch), "oom": oom, "summary": s,
    }
    if keep_profile:
        row["timeline"] = timeline
    if viewer:
        row["viewer"] = viewer_data
    return row


def _step(model, opt, idx, tgt) -> None:
    loss = model(idx, tgt)[1]  # the logits are not kept past the loss
    loss.backward()
    opt.step()
    opt.zero_grad()


def attention_saved(row: dict) -> int:
    """Saved bytes of the nodes made in the attention modules' own scope, from by_module
    (which counts a storage once per node that keeps it: views' q @ k^T and att @ v both
    keep qkv, and softmax and att @ v both keep the probabilities)."""
    return sum(v["unique_bytes"] for k, v in row["saved_by_module"].items()
               if re.fullmatch(r"transformer\.h\.\d+\.attn", k))


def attention_forward_copies(row: dict) -> list:
    """The copies made in attention's forward, grouped over layers: (count, copy, scopes)."""
    groups: dict = {}
    for c in row["copies"]:
        if c["phase"] != "forward" or ".attn" not in (c["scope"] or ""):
            continue
        # the model's own line (the nn frame the copy went through), not the script's call
        key = (c["reason"], c["op"], tuple(c["shape"]), c["bytes"], c.get("via") or c["source"])
        groups.setdefault(key, []).append(c["scope"])
    return [(len(scopes), dict(zip(("reason", "op", "shape", "bytes", "source"), key)),
             scopes) for key, scopes in groups.items()]


# ----------------------------------------------------------------------------- predictor
def fit_batch_model(small: list) -> dict:
    """Fit peak(B) from two measured steps at different batch sizes (measure(...,
    keep_profile=True), which keeps the timeline), with the planner's fit
    (ta.memory.planner.fit_lines): the live bytes after each event t are a_t + b_t * B
    (the two timelines line up: the same program), and the peak is the highest of those
    lines, peak(B) = max_t (a_t + b_t B). At small B the optimizer step (fixed-size state)
    can be the peak while at large B backward is, so one line through the two peaks alone
    would be wrong there; if the timelines do not line up, that one line is what is fitted.
    """
    runs = []
    for r in small:
        tl = r["timeline"]
        series = np.sum([tl["series"][c] for c in tl["series"]], axis=0)
        runs.append({"batch": r["batch"], "series": [int(v) for v in series],
                     "signature": tl["phases"], "peak": r["peak_abs"]})
    fit = planner.fit_lines(runs)
    r1, r2 = sorted(small, key=lambda r: r["batch"])[:2]
    return dict(fit, batches=(r1["batch"], r2["batch"]), per_event=fit["aligned"])


def predict_peak(model: dict, batch: int) -> float:
    return float(planner.predict_peak(model, batch))


def peak_line(model: dict, batch: int) -> tuple:
    """(a, b) of the line that is the peak at `batch`."""
    a, b = planner.peak_line(model, batch)
    return float(a), float(b)


def largest_batch(model: dict, limit: int) -> int:
    """The largest B whose predicted peak is within `limit` (0 if not even B = 1 fits)."""
    return planner.largest_batch(model, limit)


# ----------------------------------------------------------------------------- pictures
def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_timelines(rows: dict, path: str) -> list:
    """Several measured steps side by side: the HTML viewer (one page, one byte scale for
    all; the rows need measure(..., viewer=True)) next to `path`, and with matplotlib the
    stacked timelines as the PNG `path` (the rows need measure(..., keep_profile=True))."""
    index = os.path.splitext(path)[0] + ".html"
    ta.memory.plot_html({title: row["viewer"] for title, row in rows.items()}, index)
    if not have_matplotlib():
        print(f"matplotlib is not installed: wrote the HTML viewer {index} instead of {path} "
              "(pip install matplotlib for the PNG)")
        return [index]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = ta.memory.CATEGORIES
    fig, axes = plt.subplots(1, len(rows), figsize=(7 * len(rows), 4.5), sharey=True)
    for ax, (title, row) in zip(np.atleast_1d(axes), rows.items()):
        tl = row["timeline"]
        xs = range(len(tl["phases"]))
        ys = [[v / MiB for v in tl["series"][c]] for c in cats]
        ax.stackplot(xs, ys, labels=cats, colors=[COLORS[c] for c in cats])
        seen = []
        for i, ph in enumerate(tl["phases"]):
            if ph not in seen:  # where each phase starts (labels staggered: some are close)
                seen.append(ph)
                ax.axvline(i, color="k", lw=0.6, ls="--")
                ax.text(i, 0.02 + 0.14 * (len(seen) % 2), f" {ph}", rotation=90,
                        va="bottom", fontsize=7, transform=ax.get_xaxis_transform())
        peak = row["summary"]["peak"]
        ax.plot([peak["t"]], [peak["bytes"] / MiB], "rv")
        where = peak["op"] + (f" in {peak['scope']}" if peak["scope"] else "")
        ax.set_title(f"{title}: peak {_mib(peak['bytes'])} MiB at {where}", fontsize=10)
        ax.set_xlabel("event (allocation, free, save, release)")
    np.atleast_1d(axes)[0].set_ylabel("MiB live")
    np.atleast_1d(axes)[0].legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path, index]


# ----------------------------------------------------------------------------- report
def _mib(n) -> str:
    if n is None:
        return "-"
    return f"{n / MiB:.1f}" if abs(n) >= 100 * MiB else f"{n / MiB:.2f}"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a tiny config (seconds)")
    p.add_argument("--batch", type=int, nargs="+", help="batch sizes (default 32 64)")
    p.add_argument("--small-batch", type=int, nargs=2, default=(2, 4),
                   help="the two batch sizes the predictor is fitted at")
    p.add_argument("--limit", default="6GiB", help="emulated device size (default 6GiB)")
    p.add_argument("--plot", default="attention_memory.png",
                   help="timeline of naive vs flash ('' for none)")
    args = p.parse_args(argv)
    base = story_config(args.quick)
    batches = args.batch or ([4, 8] if args.quick else [32, 64])
    limit = ta.memory.parse_bytes(args.limit)
    big = max(batches)
    if min(batches) < 1 or min(args.small_batch) < 1:
        p.error("batch sizes must be at least 1")
    _refuse_if_too_big(floor_bytes(base, big, "naive")["total"], f"--batch {big}",
                       "lower --batch")
    if args.plot and os.path.dirname(args.plot):
        os.makedirs(os.path.dirname(args.plot), exist_ok=True)
    out: dict = {"rows": [], "emulation": [], "predictions": []}

    print(f"# Attention memory: n_layer {base.n_layer}, n_head {base.n_head}, n_embd "
          f"{base.n_embd}, vocab {base.vocab_size}, block_size {base.block_size}, float32, "
          f"dropout {base.dropout}; one step (forward, backward, AdamW, zero_grad)\n")
    fl = floor_bytes(base, 1)
    print(f"parameters {_mib(fl['parameters'])} MiB, gradients {_mib(fl['gradients'])} MiB, "
          f"AdamW state {_mib(fl['adamw_state'])} MiB (floor_bytes; same for every row)\n")

    # -- 1. the table ----------------------------------------------------------------------
    print(f"| attn | checkpoint | batch | peak MiB (above start) | raw peak MiB | saved MiB "
          f"| saved floor MiB | saved/floor | copied MiB | copies | step s | fits {args.limit} |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    rows = {}
    for batch in batches:
        for attn in IMPLS:
            for ckpt in (False, True):
                cfg = replace(base, attn=attn, checkpoint=ckpt)
                keep = bool(args.plot) and batch == big and not ckpt and attn != "views"
                r = measure(cfg, batch, keep_profile=keep, viewer=keep)
                rows[(attn, ckpt, batch)] = r
                out["rows"].append(r)
                fsaved = r["floor"]["saved_activations"]
                print(f"| {attn} | {'yes' if ckpt else 'no'} | {batch} | {_mib(r['peak'])} | "
                      f"{_mib(r['raw_peak'])} | {_mib(r['saved'])} | {_mib(fsaved)} | "
                      f"{r['saved'] / fsaved:.3f} | {_mib(r['copied'])} | "
                      f"{len(r['copies'])} | {r['seconds']:.1f} | "
                      f"{'yes' if r['peak_abs'] <= limit else 'NO'} |", flush=True)
    print("\npeak: tensor-level, above the live bytes at the start (the model's parameters"
          "); raw: tracemalloc, with the temporaries inside ops; saved: saved-for-backward"
          " at its peak, unique storages, without parameters; floor: floor_bytes(); fits:"
          " the absolute tensor peak against the emulated limit.")
    for batch in batches:
        v, n, fa = (rows[(a, False, batch)]["saved"] for a in ("views", "naive", "flash"))
        print(f"B={batch}: saved flash {_mib(fa)} < views {_mib(v)}; naive {_mib(n)} "
              f"(naive - views = {(n - v) / 1024:+.0f} KiB: naive's q/k/v copies replace "
              "the qkv that views pins)")
        core = {a: attention_saved(rows[(a, False, batch)]) for a in ("views", "flash")}
        # all else is the same but the merged heads: flash's output is them (no copy)
        once = core["flash"] + (v - fa) - base.n_layer * batch * base.block_size * base.n_embd * 4
        print(f"  attention's own nodes (scopes transformer.h.*.attn) as by_module counts "
              f"them, per node: views {_mib(core['views'])}, flash {_mib(core['flash'])} "
              f"({core['views'] / core['flash']:.1f}x fewer); each storage once: views "
              f"{_mib(once)}, flash {_mib(core['flash'])} ({once / core['flash']:.1f}x; "
              "both keep qkv)")
    # -- 2. copies in attention's forward -----------------------------------------------
    print(f"\n## Copies made in attention's forward (batch {big}, from the ledger)\n")
    for attn in ("naive", "views"):
        r = rows[(attn, False, big)]
        print(f"{attn}:")
        for count, c, scopes in attention_forward_copies(r):
            print(f"  {count} x {c['reason']:<12} {c['op']:<11} {list(c['shape'])!s:<18} "
                  f"{_mib(c['bytes']):>6} MiB each  at {c['source']}  "
                  f"(in {scopes[0]}" + (f" ... {scopes[-1]})" if len(scopes) > 1 else ")"))
        bwd = [c for c in r["copies"] if c["phase"] == "backward"]
        kinds = sorted({c["reason"] for c in bwd})
        print(f"  (and in backward: {len(bwd)} copies, {_mib(sum(c['bytes'] for c in bwd))}"
              f" MiB: {', '.join(kinds)})")

    # -- 3. the story's habits as switches -----------------------------------------------
    print(f"\n## The story's habits (attn='naive'; factor over the idiomatic 'views' run; "
          f"fits {args.limit})\n")
    head = " | ".join(f"B={b} peak MiB | factor | copied MiB | fits" for b in batches)
    print(f"| run | {head} |")
    print("|---|" + "---:|---:|---:|---|" * len(batches))
    cases = [("views (idiomatic)", "views", {}), ("naive, no switch", "naive", {})]
    cases += [(f"naive + {k}", "naive", v) for k, v in SWITCHES.items()]
    cases += [("naive + all four", "naive", ALL_SWITCHES)]
    emu = {}
    for label, attn, habits in cases:
        cells = []
        for batch in batches:
            if habits:
                r = measure(replace(base, attn=attn), batch, habits=habits)
            else:
                r = rows[(attn, False, batch)]
            emu[(label, batch)] = r
            ref = rows[("views", False, batch)]["peak"]
            cells.append(f"{_mib(r['peak'])} | {r['peak'] / ref:.2f}x | {_mib(r['copied'])} | "
                         f"{'yes' if r['peak_abs'] <= limit else 'NO'}")
        out["emulation"].append({"label": label, "rows": [emu[(label, b)] for b in batches]})
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    print("\ncopied: bytes made by pure data movement (permute-copy, grad-accumulate and "
          "slice-grad are the switches' own), so a switch that leaves the peak alone still "
          "shows what it allocated.")
    # the comparison above is peak vs limit; check it against the emulated device itself
    small_b = min(args.small_batch)
    probe = measure(replace(base, attn="naive"), small_b, habits=ALL_SWITCHES)
    at = probe["peak_abs"]
    ok = measure(replace(base, attn="naive"), small_b, habits=ALL_SWITCHES, limit=at)
    bad = measure(replace(base, attn="naive"), small_b, habits=ALL_SWITCHES, limit=at - 1)
    print(f"\nta.memory.limit check (naive + all four, B={small_b}, measured absolute peak "
          f"{at} bytes): limit = peak -> {'ran' if ok['oom'] is None else 'OOM'}; "
          f"limit = peak - 1 -> {'OutOfMemoryError: ' + bad['oom'] if bad['oom'] else 'ran'}")
    out["limit_check"] = (ok["oom"] is None, bad["oom"] is not None)

    # -- 4. batch-size predictor -----------------------------------------------------------
    print(f"\n## Batch-size predictor: each moment's live bytes = a + b*B, fitted "
          f"at B={args.small_batch[0]} and B={args.small_batch[1]}; peak = the highest line "
          "(absolute tensor peak; a, b: the line that peaks at the predicted batch)\n")
    print(f"| attn | checkpoint | a MiB | b MiB/sample | predicted B={big} MiB | measured MiB"
          f" | error | largest B within {args.limit} |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for attn in IMPLS:
        for ckpt in (False, True):
            cfg = replace(base, attn=attn, checkpoint=ckpt)
            model = fit_batch_model([measure(cfg, b, keep_profile=True)
                                     for b in args.small_batch])
            pred = predict_peak(model, big)
            a, b = peak_line(model, big)
            meas = rows[(attn, ckpt, big)]["peak_abs"]
            err = (pred - meas) / meas
            out["predictions"].append({"attn": attn, "checkpoint": ckpt, "model": model,
                                       "predicted": pred, "measured": meas, "error": err})
            print(f"| {attn} | {'yes' if ckpt else 'no'} | {_mib(a)} | "
                  f"{b / MiB:.3f} | {_mib(pred)} | {_mib(meas)} | {100 * err:+.2f}% "
                  f"| {largest_batch(model, limit)} |", flush=True)

    # -- 5. timelines ----------------------------------------------------------------------
    if args.plot:
        profs = {f"naive B={big}": rows[("naive", False, big)],
                 f"flash B={big}": rows[("flash", False, big)]}
        written = plot_timelines(profs, args.plot)
        print(f"\nwrote {', '.join(written)}")
    return out


if __name__ == "__main__":
    try:
        main()
    except MemoryError as e:  # past the estimate: one line, not NumPy's traceback
        print(f"{PROG}: error: out of memory: {e}; lower --batch", file=sys.stderr)
        raise SystemExit(2) from None
