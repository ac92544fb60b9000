"""The planner's measurements and fits: what one step allocates, and lines through two runs.

StepRecorder is a ledger observer that keeps, per allocation and free, the live bytes and the
raw (tracemalloc or CuPy pool) peak since the event before; fit_lines / fit_raw fit each
moment as a line in the batch size through two runs of the same program, and the peak as the
upper envelope of those lines (exact for a step whose allocations are affine in the batch).
OpRecorder hears every op call (memory.state.op_observers): its FLOPs, seconds, and whether
it re-ran forward work in backward. The runs: _measure (bytes, under profile(raw=True)),
_attribute (recomputed ops and saved tensors, under profile(source_lines=True)), _time and
_timed (seconds). The reasons: saved_tensors_at and tensor_changes, what one setting saves
that another does not. memory/planner.py builds plans from them.
"""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc
from fractions import Fraction

from . import state
from .ledger import profile
from .tracker import limit

MAX_BATCH = 2**24  # the search for the largest batch stops here (a step that barely grows)
UNREACHABLE = 2**62  # the limit the measuring runs are under (as verify's, never reached)

# ----------------------------------------------------------------------------- recording
class StepRecorder:
    """A ledger observer that keeps, for each allocation and free on `device`, the live
    bytes above the start after it, the raw (tracemalloc) peak since the event before it
    (the temporaries inside the op in between, Python objects included), and the event's
    (kind, phase, op): the program's signature, which says whether two runs line up.

    Use it inside profile(raw=True), which runs tracemalloc (and pauses the background
    compiler), or on a GPU hooks CuPy's pool; it resets that peak at every event, so that
    the profile's own raw_peak_bytes then covers only the time after the last event.
    """

    def __init__(self, device: str = "cpu", pool_hook=None) -> None:
        self.device = device
        self.series: list = []
        # on a GPU the raw bytes are CuPy's pool's: `pool_hook` is the profile's hook on it
        # (its .live and .peak), read and reset the same way; without one, no raw series
        self.pool_hook = pool_hook
        self.raw: list | None = [] if device == "cpu" or pool_hook is not None else None
        self.signature: list = []
        self.total = 0

    def __enter__(self) -> StepRecorder:
        if self.pool_hook is not None:
            self.raw_start = self.pool_hook.live
            self.pool_hook.peak = self.pool_hook.live
        elif self.raw is not None:
            if not tracemalloc.is_tracing():
                raise RuntimeError("StepRecorder needs tracemalloc: use it inside "
                                   "ta.memory.profile(raw=True)")
            self.raw_start = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
        with state.observer_lock:
            state.observers.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with state.observer_lock:
            state.observers.remove(self)
        self._event("end", 0)

    def _event(self, kind: str, delta: int) -> None:
        if self.pool_hook is not None:
            self.raw.append(self.pool_hook.peak - self.raw_start)
            self.pool_hook.peak = self.pool_hook.live
        elif self.raw is not None:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.reset_peak()
            self.raw.append(peak - self.raw_start)
        self.total += delta
        self.series.append(self.total)
        labels = state.local.labels
        self.signature.append((kind, labels["phase"], labels["op"]))

    def on_alloc(self, st) -> None:
        if st.device == self.device:
            self._event("alloc", st.nbytes)

    def on_free(self, st) -> None:
        if st.device == self.device:
            self._event("free", -st.nbytes)


# ----------------------------------------------------------------------------- the fit
def fit_lines(runs: list, series: str = "series", peak: str = "peak") -> dict:
    """Fit peak(B) = max_t (a_t + b_t B) from two runs of the same step at different batch
    sizes: dicts with "batch", "signature" and the per-event `series` (a StepRecorder's
    "series" or "raw") and its maximum `peak`.

    Memory is affine in the batch: parameters, gradients, optimizer state and buffers are
    fixed, every activation scales with B, at every moment of the step; so with the two
    runs' event lists lined up, each moment is a line, and the peak is the highest line. At
    small B the optimizer step (fixed-size state) can be the peak while at large B backward
    is, which the line through the two peaks alone would miss. Where the event lists do not
    line up (an op that branches on size), that one line is what is fitted ("aligned" False).
    Returns {"lines": the upper envelope for B >= 1 as [(a, b)] Fractions, "aligned"}.
    """
    r1, r2 = sorted(runs, key=lambda r: r["batch"])[:2]
    db = r2["batch"] - r1["batch"]
    if db <= 0:
        raise ValueError("fit_lines: the two runs need different batch sizes")
    aligned = r1["signature"] == r2["signature"]
    pairs = zip(r1[series], r2[series]) if aligned else [(r1[peak], r2[peak])]
    lines = {(0, 0)}  # the moment before the first event: nothing above the start
    for y1, y2 in pairs:
        b = Fraction(y2 - y1, db)
        lines.add((y1 - b * r1["batch"], b))
    return {"lines": upper_envelope(lines), "aligned": aligned}


def raw_noise(first: dict, again: dict) -> int:
    """The most two runs of one step at one batch differ in an interval's raw peak (or in
    the raw peak, where their event lists do not line up): tracemalloc also counts Python
    objects, whose caches and free lists move by tens to hundreds of bytes run to run."""
    if first["raw"] is not None and first["signature"] == again["signature"]:
        return max((abs(x - y) for x, y in zip(first["raw"], again["raw"])), default=0)
    return abs(first["raw_peak"] - again["raw_peak"])


def fit_raw(runs: list, noise: int = 0) -> dict:
    """Fit the raw peak as fit_lines does, through each interval's excess of the raw peak
    over the tensor bytes live when it began (Python objects: fixed; temporaries inside
    ops: growing with B), with each measurement taken as uncertain by `noise` bytes
    (raw_noise): per interval, the steepest excess line the two measurements allow (never
    falling: temporaries do not shrink with the batch) and, for batches up to the larger
    measured one, the larger measured excess. So the prediction errs high by about
    2 * noise * B / (b2 - b1), which a real model's activations dwarf, rather than low by as
    much. Where the event lists do not line up, or there is no raw series (a GPU: the pool
    hook gives one peak a run), the excess of the raw peak over the tensor peak is fitted
    so and added to the tensor peak's fit (fit_lines)."""
    r1, r2 = sorted(runs, key=lambda r: r["batch"])[:2]
    b1, b2 = r1["batch"], r2["batch"]
    db = b2 - b1

    def excess_lines(e1, e2) -> list:
        eb = max(Fraction(e2 - e1 + 2 * noise, db), Fraction(0))
        return [(e2 + noise - eb * b2, eb), (max(e1, e2) + noise, Fraction(0))]

    aligned = r1["signature"] == r2["signature"]
    lines = {(0, 0)}
    if aligned and r1["raw"] is not None:  # per interval: raw peak, tensor bytes at its start
        pairs = zip(r1["raw"], r2["raw"], [0] + r1["series"][:-1], [0] + r2["series"][:-1])
        for y1, y2, s1, s2 in pairs:
            tb = Fraction(s2 - s1, db)
            ta_ = s1 - tb * b1  # the tensor bytes: exact
            for ea, eb in excess_lines(y1 - s1, y2 - s2):
                lines.add((ta_ + ea, tb + eb))
    else:
        tensor = fit_lines(runs, "series", "peak")["lines"]
        for ea, eb in excess_lines(r1["raw_peak"] - r1["peak"], r2["raw_peak"] - r2["peak"]):
            lines.update((a + ea, b + eb) for a, b in tensor)
    return {"lines": upper_envelope(lines), "aligned": aligned, "noise": noise}


def upper_envelope(lines) -> list:
    """The lines (a, b) that are the maximum of a + b * B somewhere in B >= 1, by slope."""
    best: dict = {}
    for a, b in lines:  # of equal slopes only the highest can be the maximum
        if b not in best or a > best[b]:
            best[b] = a
    hull: list = []
    for b in sorted(best):
        a = best[b]
        # the middle line is never the maximum if the new one overtakes the first no later
        # than the middle one does
        while len(hull) >= 2:
            (a1, b1), (a2, b2) = hull[-2], hull[-1]
            if (a1 - a) * (b2 - b1) <= (a1 - a2) * (b - b1):
                hull.pop()
            else:
                break
        hull.append((a, b))
    # drop the lines that are the maximum only below B = 1
    while len(hull) >= 2:
        (a1, b1), (a2, b2) = hull[0], hull[1]
        if a1 - a2 <= b2 - b1:  # they cross at B = (a1 - a2) / (b2 - b1) <= 1
            hull.pop(0)
        else:
            break
    return hull


def predict_peak(fit: dict, batch: int):
    """max over the fitted lines at `batch` (a Fraction: exact where the fit is)."""
    return max(a + b * batch for a, b in fit["lines"])


def peak_line(fit: dict, batch: int) -> tuple:
    """(a, b) of the line that is the peak at `batch`."""
    return max(fit["lines"], key=lambda ab: ab[0] + ab[1] * batch)


def largest_batch(fit: dict, budget: int) -> int:
    """The largest B whose predicted peak is within `budget` (0 if not even B = 1 fits;
    MAX_BATCH if the peak does not grow with B)."""
    return _largest(lambda b: predict_peak(fit, b) <= budget)


def _largest(fits) -> int:
    """The largest B in [1, MAX_BATCH] with fits(B), for a `fits` true on a prefix (the
    predictions are maxima of lines: convex in B, so the B within a budget are an interval)."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= MAX_BATCH and fits(hi):
        lo, hi = hi, 2 * hi
    if hi > MAX_BATCH:
        return MAX_BATCH if fits(MAX_BATCH) else _bisect(fits, lo, MAX_BATCH + 1)
    return _bisect(fits, lo, hi)


def _bisect(fits, lo: int, hi: int) -> int:
    """fits(lo) and not fits(hi): the last B that fits."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _line(p1: tuple, p2: tuple) -> tuple:
    (x1, y1), (x2, y2) = p1, p2
    b = Fraction(y2 - y1, x2 - x1)
    return (y1 - b * x1, b)


def _ceil(x) -> int:
    return -((-x.numerator) // x.denominator) if isinstance(x, Fraction) else int(x)


# ----------------------------------------------------------------------------- op calls
class OpRecorder:
    """An op observer (memory.state.op_observers): the record of every op call this thread
    makes outside another op's forward (autograd.graph._op_heard): op, scope, phase,
    "recompute" (forward work re-run in backward: a checkpoint's rerun, a save policy's
    rebuild), FLOPs (torch's FlopCounterMode count: Function.flops) and seconds."""

    def __init__(self) -> None:
        self.records: list = []
        self.thread = threading.get_ident()

    def __enter__(self) -> OpRecorder:
        with state.observer_lock:
            state.op_observers.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with state.observer_lock:
            state.op_observers.remove(self)

    def on_op(self, record: dict) -> None:
        if threading.get_ident() == self.thread:
            self.records.append(record)

    def recomputed(self) -> list:
        """The recompute records, in order."""
        return [r for r in self.records if r["recompute"]]

    def recompute_flops(self) -> int:
        return sum(r["flops"] for r in self.records if r["recompute"])

    def recompute_seconds(self) -> float:
        return sum(r["seconds"] for r in self.records if r["recompute"])



# ----------------------------------------------------------------------------- runs
def _measure(step_fn, batch: int, choice: dict, device: str) -> dict:
    gc.collect()
    # under a limit no step reaches, as verify() runs it: the limit's observer keeps a
    # record of every storage, which the raw peak counts
    with limit(UNREACHABLE, device), profile(raw=True, device=device) as prof, \
            StepRecorder(prof.device, getattr(prof, "_pool_hook", None)) as rec:
        step_fn(batch, dict(choice))
    s = prof.summary()
    raw_peak = s["raw_peak_bytes"] if rec.raw is None else max(rec.raw, default=0)
    run = {"batch": batch, "series": rec.series, "raw": rec.raw, "signature": rec.signature,
           "peak": max(rec.series, default=0), "raw_peak": raw_peak,
           "saved": s["saved_peak"]["unique_bytes_without_parameters"]}
    del prof
    return run


def step_seconds(result) -> float | None:
    """The seconds a step_fn reported by returning them (an int or float, not a bool), or
    None."""
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        return None
    return float(result)


def _time(step_fn, batch: int, choice: dict, timer) -> float:
    """The seconds of one step: the timer's reading around the call with a timer, else
    the step's own report (step_seconds) or, without one, time.perf_counter's."""
    gc.collect()
    clock = time.perf_counter if timer is None else timer
    t0 = clock()
    result = step_fn(batch, dict(choice))
    elapsed = clock() - t0
    reported = step_seconds(result) if timer is None else None
    return elapsed if reported is None else reported


def _attribute(step_fn, batch: int, choice: dict, device: str) -> dict:
    """One run of the step under profile(source_lines=True) and an OpRecorder (also the
    warm-up of the measured runs after it: compiles, first-call caches): the ops re-run in
    backward and their FLOPs, and the tensors forward leaves saved for backward, with the op, scope
    and line that made each (what the plan's reasons name)."""
    gc.collect()
    with limit(UNREACHABLE, device), profile(source_lines=True, device=device) as prof, \
            OpRecorder() as ops:
        step_fn(batch, dict(choice))
    saved = []
    for t in prof.saved_tensors("backward"):
        row = {k: t[k] for k in ("bytes", "dtype", "shape", "op", "scope", "via", "source")}
        row["held_by"] = sorted({f"{h['forward_op']} {h['scope']}" for h in t["held_by"]})
        saved.append(row)
    del prof
    return {"batch": batch, "flops": ops.recompute_flops(),
            "recomputed": len(ops.recomputed()), "saved": saved}


def _timed(step_fn, batch: int, choice: dict, timer, repeats: int, per_op: bool) -> tuple:
    """(the median seconds of `repeats` timed steps, and with per_op the median seconds of
    the op calls re-run in backward in them: OpRecorder.recompute_seconds)."""
    secs, extra = [], []
    for _ in range(repeats):
        if per_op:
            with OpRecorder() as ops:
                secs.append(_time(step_fn, batch, choice, timer))
            extra.append(ops.recompute_seconds())
        else:
            secs.append(_time(step_fn, batch, choice, timer))
    return _median(secs), (_median(extra) if extra else None)


def _median(values: list) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def _line_through(tbs: list, seconds: list) -> tuple:
    """c + d * B through two timed batches; a falling line (timer noise) is flat."""
    (b1, t1), (b2, t2) = sorted(zip(tbs, seconds))
    d = (t2 - t1) / (b2 - b1)
    return (t1 - d * b1, d) if d >= 0 else (max(t1, t2), 0.0)


# ----------------------------------------------------------------------------- reasons
def fmt_flops(n: int) -> str:
    """A FLOP count in words: 1.23 GFLOP."""
    for unit, size in (("TFLOP", 10**12), ("GFLOP", 10**9), ("MFLOP", 10**6)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} FLOP"


def saved_tensors_at(model, batch: int) -> list:
    """The tensors one combination's forward leaves saved for backward (at the moment
    backward begins), extrapolated to `batch`: each tensor of the two attribution runs
    paired with its namesake (dtype, op, scope, line), its bytes and each dimension a line
    in the batch. Each: "key" (what pairs them), "what" (dtype[shape] from op in scope at
    line, kept for the ops whose nodes hold it), "bytes"."""
    lists = model.attribution.get("saved_tensors")
    if not lists:
        return []
    (b1, b2), (l1, l2) = model.attribution["batches"], lists

    def keyed(rows):
        seen, out = {}, {}
        for t in rows:
            key = (f"{t['dtype']} from {t['op'] or 'a factory'} in "
                   f"{t['scope'] or '(top level)'}"
                   + (f" via {t['via']}" if t["via"] else "")
                   + (f" at {t['source']}" if t["source"] and not t["via"] else ""))
            n = seen.get(key, 0)
            seen[key] = n + 1
            out[(key, n)] = t
        return out

    k1, k2 = keyed(l1), keyed(l2)
    out = []
    for (key, n), t2 in k2.items():
        t1 = k1.get((key, n))
        if t1 is None or len(t1["shape"]) != len(t2["shape"]):
            continue
        nbytes = _ceil(_line((b1, t1["bytes"]), (b2, t2["bytes"]))[0]
                       + _line((b1, t1["bytes"]), (b2, t2["bytes"]))[1] * batch)
        shape = [_ceil(a + b * batch) for a, b in
                 (_line((b1, x1), (b2, x2)) for x1, x2 in zip(t1["shape"], t2["shape"]))]
        what = (f"{t2['dtype']}{shape} {key.split(' ', 1)[1]}, kept for "
                f"{', '.join(t2['held_by']) or 'backward'}")
        out.append({"key": key, "what": what, "bytes": nbytes})
    return out


def tensor_changes(before, after, batch: int, top: int = 5) -> tuple:
    """(the tensors `before` saves that `after` does not, those `after` saves that `before`
    does not), largest first, `top` of each: {"what", "bytes"} at `batch`, and a last
    {"more": n, "bytes": b} row for the rest."""
    def totals(model):
        out: dict = {}
        for t in saved_tensors_at(model, batch):
            row = out.setdefault(t["key"], {"what": t["what"], "bytes": 0, "count": 0})
            row["bytes"] += t["bytes"]
            row["count"] += 1
        return out

    t_before, t_after = totals(before), totals(after)

    def less(a, b):
        rows = []
        for key, row in a.items():
            gone = row["bytes"] - b.get(key, {"bytes": 0})["bytes"]
            if gone > 0:
                n = row["count"] - b.get(key, {"count": 0})["count"]
                what = row["what"] + (f" (x{n})" if n > 1 else "")
                rows.append({"what": what, "bytes": gone})
        rows.sort(key=lambda r: (-r["bytes"], r["what"]))
        if len(rows) > top:
            rest = rows[top:]
            rows = rows[:top] + [{"more": len(rest), "bytes": sum(r["bytes"] for r in rest)}]
        return rows

    return less(t_before, t_after), less(t_after, t_before)
