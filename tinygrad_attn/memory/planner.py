"""An eager memory planner: the fastest setting of a training step's knobs that fits a budget.

    plan = ta.memory.plan(step_fn, "6GiB", batch=64, knobs={"attn": ["views", "flash"], ...})
    print(plan)                      # each choice with the bytes it frees and the time it costs
    plan.verify(step_fn)             # the step at plan.batch under ta.memory.limit(budget)

`step_fn(batch, choice)` runs ONE training step (forward, backward, optimizer step) at that
batch size with `choice` (a dict knob -> option), building what it needs. The planner runs
every combination of the knobs' options (the space is enumerated, so the answer is exact for
the cost model, not a heuristic search) at two small batch sizes under `profile(raw=True)`
and fits, per combination:

    tensor peak   each moment's live bytes = a_t + b_t * B (the two runs' event lists line up:
                  the same program), the peak the highest of those lines, max_t (a_t + b_t B).
                  Exact for a step whose every allocation is affine in B. Where the event lists
                  do not line up, the line through the two peaks is fitted instead (and said).
    raw peak      tracemalloc's peak (temporaries inside ops, Python objects), per interval
                  between two events (StepRecorder reads and resets tracemalloc's peak at
                  every allocation and free): the tensor bytes live in it (exact, as above)
                  plus an excess fitted as a line that never falls, widened by the
                  run-to-run noise of Python objects (a third run repeats the smaller batch:
                  fit_raw), so that it errs high. The noise is tens to hundreds of bytes, which
                  a real model's activations dwarf at the default measure batches (1, 2); a
                  toy step needs larger ones. On a GPU the raw bytes are CuPy's pool's (the
                  profile's hook on it), read per interval the same way.
    saved bytes   saved-for-backward at its peak, a line through the two measurements.
    seconds       c + d * B through two timed (unprofiled) runs at `time_batches` (default:
                  the measure batches; a caller may time at larger ones, where the step's
                  own work dwarfs its fixed costs); a falling line (timer noise) is taken as
                  flat at the slower run. A step_fn that returns a number (an int or float,
                  not a bool) reports its own seconds: the step proper, without building its
                  model and batch (nn.memory_plan.gpt_step times forward, backward and the
                  optimizer step so), and the planner takes that number. That holds with
                  the default timer=None only: a caller that passes a timer (a test's fake
                  clock, or time.perf_counter to time the whole call) gets the timer's
                  reading around the call, whatever the step returns.

All sizes are what the step holds above the live bytes when it starts: a step that builds its
model, gradients and optimizer state counts them all. The measuring runs are under a limit
no step reaches, as verify() runs the step under the budget: the limit's observer keeps a
record per storage, which the raw peak sees. With `batch` the plan is the combination
of least predicted time whose predicted raw peak and tensor peak are within the budget; without
it, the largest batch any combination fits, and the fastest combination at that batch. Ties go
to the combination listed first (itertools.product order: each knob's first option is its
default). The plan is data: printable, JSON-able (to_dict/from_dict, the fits included, so
`replan(budget, batch)` answers another budget without running the step), and checkable
(verify). The measurements are not a model of each knob apart: every combination is run,
so the space must be small (max_combinations).

This module knows nothing of models; nn/memory_plan.py gives a GPT's knobs and step function.
"""

from __future__ import annotations

import gc
import itertools
import json
import time
import tracemalloc
from dataclasses import dataclass, field, fields
from fractions import Fraction

from .. import backend
from . import state
from .counters import fmt_bytes, live_bytes, parse_bytes
from .ledger import profile
from .tracker import limit

UNREACHABLE = 2**62  # the limit the measuring runs are under (as verify's, never reached)
MAX_BATCH = 2**24  # the search for the largest batch stops here (a step that barely grows)


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


# ----------------------------------------------------------------------------- one combination
class _Model:
    """The fitted predictions of one combination of options (plain data: to_data())."""

    def __init__(self, tensor: dict, raw: dict, saved: tuple, time_line: tuple,
                 measured: list) -> None:
        self.tensor, self.raw, self.saved, self.time = tensor, raw, saved, time_line
        self.measured = measured

    @classmethod
    def fit(cls, runs: list, seconds: list, noise: int = 0,
            time_batches: list | None = None) -> _Model:
        """`seconds[i]` is the timed step at time_batches[i] (default: the runs' batches,
        in the runs' order)."""
        r1, r2 = sorted(runs, key=lambda r: r["batch"])
        saved = _line((r1["batch"], r1["saved"]), (r2["batch"], r2["saved"]))
        tbs = [r["batch"] for r in runs] if time_batches is None else list(time_batches)
        (b1, t1), (b2, t2) = sorted(zip(tbs, seconds))
        d = (t2 - t1) / (b2 - b1)
        time_line = (t1 - d * b1, d) if d >= 0 else (max(t1, t2), 0.0)
        measured = [{k: r[k] for k in ("batch", "peak", "raw_peak", "saved")} for r in runs]
        if time_batches is None:  # each run's seconds beside its bytes, as before
            for m, t in zip(measured, seconds):
                m["seconds"] = t
        else:
            measured.append({"timed": [[b, t] for b, t in zip(tbs, seconds)]})
        return cls(fit_lines(runs, "series", "peak"), fit_raw(runs, noise),
                   saved, time_line, measured)

    def to_data(self) -> dict:
        def lines(fit):
            return dict(fit, lines=[[str(a), str(b)] for a, b in fit["lines"]])
        return {"tensor": lines(self.tensor), "raw": lines(self.raw),
                "saved": [str(v) for v in self.saved], "seconds": list(self.time),
                "measured": self.measured}

    @classmethod
    def from_data(cls, data: dict) -> _Model:
        def lines(fit):
            return dict(fit, lines=[(Fraction(a), Fraction(b)) for a, b in fit["lines"]])
        return cls(lines(data["tensor"]), lines(data["raw"]),
                   tuple(Fraction(v) for v in data["saved"]), tuple(data["seconds"]),
                   data["measured"])

    def peak(self, batch: int) -> int:
        return _ceil(predict_peak(self.tensor, batch))

    def raw_peak(self, batch: int) -> int:
        return _ceil(predict_peak(self.raw, batch))

    def saved_bytes(self, batch: int) -> int:
        return _ceil(self.saved[0] + self.saved[1] * batch)

    def seconds(self, batch: int) -> float:
        return float(self.time[0] + self.time[1] * batch)

    def fits(self, batch: int, budget: int) -> bool:
        return self.peak(batch) <= budget and self.raw_peak(batch) <= budget

    def largest_batch(self, budget: int) -> int:
        return _largest(lambda b: self.fits(b, budget))


def _line(p1: tuple, p2: tuple) -> tuple:
    (x1, y1), (x2, y2) = p1, p2
    b = Fraction(y2 - y1, x2 - x1)
    return (y1 - b * x1, b)


def _ceil(x) -> int:
    return -((-x.numerator) // x.denominator) if isinstance(x, Fraction) else int(x)


# ----------------------------------------------------------------------------- the plan
@dataclass
class Plan:
    """What plan() chose, why, and what it predicted; plain data (to_dict / from_dict).

    Sizes are bytes the step holds above the live bytes at its start; `peak` is the
    tensor-level peak (the ledger's), `raw_peak` tracemalloc's (what the budget is checked
    against, with the tensor peak). `alternatives` holds every combination's predictions at
    `batch`; `reasons` maps each knob to the option chosen, the bytes it frees against the
    knob's default (first) option with the other knobs as chosen, and the seconds it costs.
    `needs` (when nothing fits) names the least the plan would need.
    """

    choice: dict
    batch: int
    budget: int
    fits: bool
    peak: int
    raw_peak: int
    saved: int
    seconds: float
    knobs: dict
    alternatives: list
    reasons: dict
    measure_batches: list
    device: str = "cpu"
    needs: dict | None = None
    notes: list = field(default_factory=list)
    time_batches: list | None = None  # where the seconds were timed (None: measure_batches)
    models: list = field(default_factory=list, repr=False)  # the fits, one per alternative

    # -- data --------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain JSON-able data (json.dumps of it goes into a training checkpoint)."""
        return json.loads(json.dumps({f.name: getattr(self, f.name) for f in fields(self)}))

    @classmethod
    def from_dict(cls, data: dict) -> Plan:
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"Plan.from_dict: unknown fields {sorted(unknown)}")
        return cls(**json.loads(json.dumps(data)))

    def replan(self, budget, batch: int | None = None, knobs: dict | None = None) -> Plan:
        """The plan for another budget (and batch; None: the largest that fits) from the
        same measurements and fits, without running the step again. `knobs` may narrow
        each knob to some of its options ({"attn": ["flash"]}: flash only)."""
        budget = parse_bytes(budget, "replan: budget")
        if batch is not None:
            batch = _check_batch(batch, "batch")
        allowed = dict(self.knobs)
        for name, options in _check_knobs(knobs).items():
            if name not in self.knobs:
                raise ValueError(f"replan: unknown knob {name!r}; the plan has "
                                 f"{list(self.knobs)}")
            missing = [o for o in options if o not in self.knobs[name]]
            if missing:
                raise ValueError(f"replan: knob {name!r} was not measured with {missing}")
            allowed[name] = [o for o in self.knobs[name] if o in options]  # in plan order
        keep = [i for i, a in enumerate(self.alternatives)
                if all(a["choice"][k] in allowed[k] for k in allowed)]
        combos = [self.alternatives[i]["choice"] for i in keep]
        models = [_Model.from_data(self.models[i]) for i in keep]
        return _choose(combos, models, allowed, budget, batch, self.measure_batches,
                       self.device, self.time_batches)

    # -- running it --------------------------------------------------------------------
    def run(self, step_fn):
        """step_fn(plan.batch, plan.choice): one step as planned."""
        return step_fn(self.batch, dict(self.choice))

    def verify(self, step_fn) -> dict:
        """Run the step at plan.batch with plan.choice under ta.memory.limit and
        profile(raw=True): returns the measured tensor peak, raw peak, saved bytes and
        seconds (the step's own, when it returns a number, as plan() takes it; else the
        call's), and whether they are within the budget. The limit is the budget on top of
        the live bytes when the step starts (what the process held before is not the
        step's). An OutOfMemoryError when the plan said it fits is a bug: it is raised (and
        a plan that does not fit will usually raise it)."""
        gc.collect()
        base = live_bytes(self.device)
        t0 = time.perf_counter()
        with limit(base + self.budget, self.device), \
                profile(raw=True, device=self.device) as prof:
            result = self.run(step_fn)
        seconds = time.perf_counter() - t0
        if step_seconds(result) is not None:  # the step's own time, as plan() takes it
            seconds = step_seconds(result)
        s = prof.summary()
        peak, raw = s["tensor_peak_above_start"], s["raw_peak_bytes"]
        return {"peak": peak, "raw_peak": raw, "baseline": base, "seconds": seconds,
                "saved": s["saved_peak"]["unique_bytes_without_parameters"],
                "within_budget": peak <= self.budget and raw <= self.budget}

    # -- text --------------------------------------------------------------------------
    def __str__(self) -> str:
        head = (f"memory plan: batch {self.batch}, budget {fmt_bytes(self.budget)}: "
                + ("fits" if self.fits else "DOES NOT FIT"))
        lines = [head,
                 f"  predicted peak {fmt_bytes(self.peak)} (raw {fmt_bytes(self.raw_peak)}), "
                 f"saved for backward {fmt_bytes(self.saved)}, {self.seconds:.4g} s a step"]
        for knob, r in self.reasons.items():
            if r["option"] == r["default"]:
                why = "the default"
            else:
                why = (f"frees {fmt_bytes(r['frees_raw_bytes'])} raw "
                       f"({fmt_bytes(r['frees_bytes'])} tensor) against {r['default']!r}, "
                       f"costs {r['costs_seconds']:+.3g} s")
            lines.append(f"  {knob} = {r['option']!r}: {why}")
        if self.needs:
            lines.append(f"  needs: {self.needs['message']}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        timed = ("" if not self.time_batches else
                 f", timed at {self.time_batches[0]} and {self.time_batches[1]}")
        lines.append(f"  alternatives at batch {self.batch} (measured at batches "
                     f"{self.measure_batches[0]} and {self.measure_batches[1]}{timed}):")
        names = list(self.knobs)
        lines.append("    " + " | ".join(names + ["peak", "raw peak", "saved", "seconds",
                                                  "fits", "largest batch"]))
        for alt in self.alternatives:
            cells = [json.dumps(alt["choice"][k]) for k in names]
            cells += [fmt_bytes(alt["peak"]), fmt_bytes(alt["raw_peak"]),
                      fmt_bytes(alt["saved"]), f"{alt['seconds']:.4g}",
                      "yes" if alt["fits"] else "no", str(alt["largest_batch"])]
            mark = "  *" if alt["choice"] == self.choice else "   "
            lines.append(mark + " " + " | ".join(cells))
        return "\n".join(lines)


def _check_knobs(knobs) -> dict:
    if knobs is None:
        return {}
    if not isinstance(knobs, dict):
        raise TypeError(f"plan: knobs must be a dict knob name -> list of options, got "
                        f"{type(knobs).__name__}")
    if not knobs:
        raise ValueError("plan: knobs is empty; pass knobs=None to plan the batch alone")
    out = {}
    for name, options in knobs.items():
        if not isinstance(name, str):
            raise TypeError(f"plan: knob names must be strings, got {name!r}")
        if isinstance(options, (str, bytes)) or not hasattr(options, "__iter__"):
            raise TypeError(f"plan: knob {name!r} needs a list of options, got {options!r}")
        try:  # JSON-able options, as JSON gives them back (a tuple becomes a list)
            options = json.loads(json.dumps(list(options)))
        except (TypeError, ValueError) as e:
            raise TypeError(f"plan: knob {name!r} has an option that is not JSON-able: "
                            f"{e}") from None
        if not options:
            raise ValueError(f"plan: knob {name!r} has no options")
        if len({json.dumps(o, sort_keys=True) for o in options}) != len(options):
            raise ValueError(f"plan: knob {name!r} lists an option twice: {options}")
        out[name] = options
    return out


def _check_batch(batch, what: str) -> int:
    if isinstance(batch, bool) or not isinstance(batch, int):
        raise TypeError(f"plan: {what} must be an int, got {type(batch).__name__} {batch!r}")
    if batch < 1:
        raise ValueError(f"plan: {what} must be >= 1, got {batch}")
    return batch


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


def plan(step_fn, budget, batch: int | None = None, knobs: dict | None = None,
         measure_batches=(1, 2), device: str = "cpu", timer=None,
         max_combinations: int = 256, time_batches=None) -> Plan:
    """The fastest combination of `knobs` whose step fits `budget` at `batch` (or, without
    `batch`, the largest batch that fits, then the fastest combination there). See the
    module docstring for what is measured and fitted.

    step_fn(batch, choice) runs one training step; knobs maps each knob to its list of
    JSON-able options (the first is the default); budget is bytes or a size string
    ('6GiB'). Each combination runs seven times: twice unmeasured (compiles, first-call
    caches), at each of the two measure_batches under profile(raw=True) and once more at
    the smaller (the raw peak's noise), then timed without the profile at each of
    `time_batches` (default: the measure batches; any other is warmed up once first). The
    time is the number step_fn returns, when it returns one, else time.perf_counter's
    around the call; with a `timer` (a callable returning seconds) always the timer's
    around the call (module docstring). The space is enumerated: more than
    `max_combinations` combinations is refused.
    """
    if not callable(step_fn):
        raise TypeError(f"plan: step_fn must be callable, got {type(step_fn).__name__}")
    budget = parse_bytes(budget, "plan: budget")
    if batch is not None:
        batch = _check_batch(batch, "batch")
    knobs = _check_knobs(knobs)
    device = str(backend.canonical_device(device))  # a plain str: the plan is JSON data
    mbs = list(measure_batches)
    if len(mbs) != 2:
        raise ValueError(f"plan: measure_batches needs two batch sizes, got {measure_batches}")
    mbs = sorted(_check_batch(b, "a measure batch") for b in mbs)
    if mbs[0] == mbs[1]:
        raise ValueError(f"plan: measure_batches must differ, got {measure_batches}")
    if time_batches is None:
        tbs = None
    else:
        tbs = list(time_batches)
        if len(tbs) != 2:
            raise ValueError(f"plan: time_batches needs two batch sizes, got {time_batches}")
        tbs = sorted(_check_batch(b, "a time batch") for b in tbs)
        if tbs[0] == tbs[1]:
            raise ValueError(f"plan: time_batches must differ, got {time_batches}")
    combos = [dict(zip(knobs, values)) for values in itertools.product(*knobs.values())]
    if len(combos) > max_combinations:
        raise ValueError(f"plan: {len(combos)} combinations of knobs is more than "
                         f"max_combinations={max_combinations} (the space is enumerated)")

    models = []
    for choice in combos:
        # warm-up at both sizes (compiles, first-call caches; after one call the next
        # run's raw peak is still a few hundred bytes higher)
        for b in mbs:
            step_fn(b, dict(choice))
        runs = [_measure(step_fn, b, choice, device) for b in mbs]
        noise = raw_noise(runs[0], _measure(step_fn, mbs[0], choice, device))
        if tbs is None:
            seconds = [_time(step_fn, b, choice, timer) for b in mbs]
        else:
            for b in tbs:
                if b not in mbs:  # warm-up at a size not run yet
                    step_fn(b, dict(choice))
            seconds = [_time(step_fn, b, choice, timer) for b in tbs]
        models.append(_Model.fit(runs, seconds, noise, tbs))
    return _choose(combos, models, knobs, budget, batch, mbs, device, tbs)


def _choose(combos, models, knobs, budget, batch, mbs, device, tbs=None) -> Plan:
    order = range(len(combos))
    largest = [m.largest_batch(budget) for m in models]
    notes = []
    if any(not m.tensor["aligned"] for m in models):
        bad = [combos[i] for i in order if not models[i].tensor["aligned"]]
        notes.append(f"the two measured runs were not the same program for {bad}: their "
                     "tensor peak is the line through the two measured peaks")
    if batch is None:
        best_batch = max(largest)
        batch = max(best_batch, 1)
    fitting = [i for i in order if models[i].fits(batch, budget)]
    needs = None
    if fitting:
        pick = min(fitting, key=lambda i: (models[i].seconds(batch), i))
    else:
        pick = min(order, key=lambda i: (max(models[i].raw_peak(batch), models[i].peak(batch)),
                                         i))
        m = models[pick]
        need = max(m.raw_peak(batch), m.peak(batch))
        most = max(largest)
        needs = {"budget": need, "largest_batch": most,
                 "message": f"the smallest predicted peak at batch {batch} is "
                            f"{fmt_bytes(need)} ({need} bytes, with {combos[pick]}): a budget "
                            f"of at least that" + (f", or a batch of at most {most}"
                                                   if most else
                                                   "; not even batch 1 fits this budget")}
    m, choice = models[pick], combos[pick]
    alternatives = [{"choice": combos[i], "peak": models[i].peak(batch),
                     "raw_peak": models[i].raw_peak(batch),
                     "saved": models[i].saved_bytes(batch),
                     "seconds": models[i].seconds(batch),
                     "fits": models[i].fits(batch, budget), "largest_batch": largest[i],
                     "aligned": models[i].tensor["aligned"]}
                    for i in order]
    index = {json.dumps(c, sort_keys=True): i for i, c in enumerate(combos)}
    reasons = {}
    for knob, options in knobs.items():
        other = models[index[json.dumps(dict(choice, **{knob: options[0]}), sort_keys=True)]]
        reasons[knob] = {
            "option": choice[knob], "default": options[0],
            "frees_bytes": other.peak(batch) - m.peak(batch),
            "frees_raw_bytes": other.raw_peak(batch) - m.raw_peak(batch),
            "costs_seconds": m.seconds(batch) - other.seconds(batch)}
    return Plan(choice=choice, batch=batch, budget=budget, fits=bool(fitting),
                peak=m.peak(batch), raw_peak=m.raw_peak(batch), saved=m.saved_bytes(batch),
                seconds=m.seconds(batch), knobs=knobs, alternatives=alternatives,
                reasons=reasons, measure_batches=list(mbs), device=device, needs=needs,
                notes=notes, time_batches=None if tbs is None else list(tbs),
                models=[m.to_data() for m in models])
