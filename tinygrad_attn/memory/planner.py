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
    recompute     the FLOPs (Function.flops: torch's FlopCounterMode count) and op calls it
                  re-runs in backward, from two attribution runs under profile(source_lines=
                  True) and an OpRecorder, which also keep the tensors forward leaves saved
                  (the reasons name them: op, scope, line). Exact, as the bytes.
    seconds       c + d * B through two timed (unprofiled) runs at `time_batches` (default:
                  the measure batches; a caller may time at larger ones, where the step's
                  own work dwarfs its fixed costs); a falling line (timer noise) is taken as
                  flat at the slower run. With `time_knobs`, only the settings of those
                  knobs are timed whole (the others at their defaults, round-robin, the
                  median of `repeats`), and any other setting is its timed one plus the
                  seconds of the ops it re-runs in backward, read in one step of it at
                  `recompute_batches`: the noise of whole steps does not decide between
                  recompute settings. A step_fn that returns a number (an int or float,
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
(verify). The bytes are not a model of each knob apart: every combination is run, so the
space must be small (max_combinations).

This module knows nothing of models; nn/memory_plan.py gives a GPT's knobs and step function.
"""

from __future__ import annotations

import gc
import itertools
import json
import time
from dataclasses import dataclass, field, fields
from fractions import Fraction

from .. import backend
from .counters import fmt_bytes, live_bytes, parse_bytes
from .ledger import profile
from .planfit import (  # noqa: F401 - the fits are planner.fit_lines etc. as well
    MAX_BATCH,
    UNREACHABLE,
    OpRecorder,
    StepRecorder,
    _attribute,
    _ceil,
    _largest,
    _line,
    _line_through,
    _measure,
    _median,
    _time,
    _timed,
    fit_lines,
    fit_raw,
    fmt_flops,
    largest_batch,
    peak_line,
    predict_peak,
    raw_noise,
    saved_tensors_at,
    step_seconds,
    tensor_changes,
    upper_envelope,
)
from .tracker import limit


# ----------------------------------------------------------------------------- one combination
class _Model:
    """The fitted predictions of one combination of options (plain data: to_data())."""

    def __init__(self, tensor: dict, raw: dict, saved: tuple, time_line: tuple,
                 measured: list, attribution: dict | None = None) -> None:
        self.tensor, self.raw, self.saved, self.time = tensor, raw, saved, time_line
        self.measured = measured
        # what the two attribution runs saw: the recompute FLOPs line (a, b), the ops re-run
        # in backward, the tensors forward left saved for backward (one list per measure batch), and
        # where the seconds came from (timed, or a timed setting plus recomputed ops)
        self.attribution = attribution or {}

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
        att = dict(self.attribution)
        if "flops" in att:
            att["flops"] = [str(v) for v in att["flops"]]
        return {"tensor": lines(self.tensor), "raw": lines(self.raw),
                "saved": [str(v) for v in self.saved], "seconds": list(self.time),
                "measured": self.measured, "attribution": att}

    @classmethod
    def from_data(cls, data: dict) -> _Model:
        def lines(fit):
            return dict(fit, lines=[(Fraction(a), Fraction(b)) for a, b in fit["lines"]])
        att = dict(data.get("attribution") or {})
        if "flops" in att:
            att["flops"] = tuple(Fraction(v) for v in att["flops"])
        return cls(lines(data["tensor"]), lines(data["raw"]),
                   tuple(Fraction(v) for v in data["saved"]), tuple(data["seconds"]),
                   data["measured"], att)

    def peak(self, batch: int) -> int:
        return _ceil(predict_peak(self.tensor, batch))

    def raw_peak(self, batch: int) -> int:
        return _ceil(predict_peak(self.raw, batch))

    def saved_bytes(self, batch: int) -> int:
        return _ceil(self.saved[0] + self.saved[1] * batch)

    def seconds(self, batch: int) -> float:
        return float(self.time[0] + self.time[1] * batch)

    def recompute_flops(self, batch: int) -> int | None:
        """FLOPs re-run in backward (checkpoint reruns, save-policy rebuilds): exact, a line
        in the batch through the two attribution runs; None without them."""
        if "flops" not in self.attribution:
            return None
        a, b = self.attribution["flops"]
        return _ceil(a + b * batch)

    def recomputed_ops(self) -> int | None:
        """Op calls re-run in backward (the same program at every batch); None without
        the attribution runs."""
        return self.attribution.get("recomputed")

    def fits(self, batch: int, budget: int) -> bool:
        return self.peak(batch) <= budget and self.raw_peak(batch) <= budget

    def largest_batch(self, budget: int) -> int:
        return _largest(lambda b: self.fits(b, budget))


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
    recompute_flops: int | None = None  # FLOPs re-run in backward under the choice (exact)
    recomputed_ops: int | None = None  # op calls re-run in backward under the choice
    time_knobs: list | None = None  # the knobs timed (None: every combination timed)
    repeats: int = 1  # timed runs per time batch (the median)
    recompute_batches: list | None = None  # where recomputed ops were timed (time_knobs)

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
        result = _choose(combos, models, allowed, budget, batch, self.measure_batches,
                         self.device, self.time_batches)
        result.time_knobs, result.repeats = self.time_knobs, self.repeats
        result.recompute_batches = self.recompute_batches
        return result

    # -- running it --------------------------------------------------------------------
    def run(self, step_fn):
        """step_fn(plan.batch, plan.choice): one step as planned."""
        return step_fn(self.batch, dict(self.choice))

    def verify(self, step_fn, flops: bool = False) -> dict:
        """Run the step at plan.batch with plan.choice under ta.memory.limit and
        profile(raw=True): returns the measured tensor peak, raw peak, saved bytes and
        seconds (the step's own, when it returns a number, as plan() takes it; else the
        call's), and whether they are within the budget. The limit is the budget on top of
        the live bytes when the step starts (what the process held before is not the
        step's). An OutOfMemoryError when the plan said it fits is a bug: it is raised (and
        a plan that does not fit will usually raise it). With `flops`, the step runs once
        more (under the limit, with an op recorder) for the FLOPs and op calls re-run in
        backward ("recompute_flops", "recomputed_ops")."""
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
        del prof
        peak, raw = s["tensor_peak_above_start"], s["raw_peak_bytes"]
        out = {"peak": peak, "raw_peak": raw, "baseline": base, "seconds": seconds,
               "saved": s["saved_peak"]["unique_bytes_without_parameters"],
               "within_budget": peak <= self.budget and raw <= self.budget}
        if flops:  # a second run: an op recorder's records would move the raw peak
            with limit(base + self.budget, self.device), OpRecorder() as ops:
                self.run(step_fn)
            out["recompute_flops"] = ops.recompute_flops()
            out["recomputed_ops"] = len(ops.recomputed())
        return out

    # -- text --------------------------------------------------------------------------
    def __str__(self) -> str:
        head = (f"memory plan: batch {self.batch}, budget {fmt_bytes(self.budget)}: "
                + ("fits" if self.fits else "DOES NOT FIT"))
        lines = [head,
                 f"  predicted peak {fmt_bytes(self.peak)} (raw {fmt_bytes(self.raw_peak)}), "
                 f"saved for backward {fmt_bytes(self.saved)}, {self.seconds:.4g} s a step"]
        if self.recompute_flops is not None:
            lines.append(f"  recomputed in backward: {self.recomputed_ops} op calls, "
                         f"{fmt_flops(self.recompute_flops)}")
        for knob, r in self.reasons.items():
            if r["option"] == r["default"]:
                why = "the default"
            else:
                why = (f"frees {fmt_bytes(r['frees_raw_bytes'])} raw "
                       f"({fmt_bytes(r['frees_bytes'])} tensor) against {r['default']!r}, "
                       f"costs {r['costs_seconds']:+.3g} s")
                if r.get("recompute_flops") is not None:
                    why += (f", recomputes {r['recomputed_ops']:+d} op calls "
                            f"({fmt_flops(r['recompute_flops'])})")
            lines.append(f"  {knob} = {r['option']!r}: {why}")
            for title, rows in (("no longer saved", r.get("no_longer_saved") or []),
                                ("saved instead", r.get("newly_saved") or [])):
                if r["option"] == r["default"] or not rows:
                    continue
                lines.append(f"    {title}:")
                for row in rows:
                    if "more" in row:
                        lines.append(f"      ... {row['more']} more, {fmt_bytes(row['bytes'])}")
                    else:
                        lines.append(f"      {fmt_bytes(row['bytes']):>11}  {row['what']}")
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


def plan(step_fn, budget, batch: int | None = None, knobs: dict | None = None,
         measure_batches=(1, 2), device: str = "cpu", timer=None,
         max_combinations: int = 256, time_batches=None, time_knobs=None,
         repeats: int = 1, recompute_batches=None) -> Plan:
    """The fastest combination of `knobs` whose step fits `budget` at `batch` (or, without
    `batch`, the largest batch that fits, then the fastest combination there). See the
    module docstring for what is measured and fitted.

    step_fn(batch, choice) runs one training step; knobs maps each knob to its list of
    JSON-able options (the first is the default); budget is bytes or a size string
    ('6GiB'). Each combination runs five times at the measure batches: once at each under
    profile(source_lines=True) and an op recorder (the attribution: recomputed ops, their
    FLOPs, the saved tensors; also the warm-up), at each under profile(raw=True) and once
    more at the smaller (the raw peak's noise). Then it is timed without the profile,
    `repeats` times (the median) at each of `time_batches` (default: the measure batches;
    any other is warmed up once first). With `time_knobs` (a list of knob names: the knobs
    that change the step's work, such as the attention), the combinations with every other
    knob at its default are timed so; another combination's seconds are its timed one's
    plus the seconds of the op calls it re-runs in backward, read by an op recorder in one
    step of it at each time batch after a warm-up there, or at each of `recompute_batches`
    when given (the other knobs only trade memory for recompute: the step's other work is
    the same, and its timing noise is not charged to the choice). Few settings are timed
    whole, so they can be timed at larger batches, nearer the planned one (a line through
    batches 4 and 8 extrapolated to 64 carries their noise fourteenfold), while the many
    recompute settings are read at smaller ones: their ops' seconds are steady.
    None: every combination is timed whole. The time is the number step_fn returns, when
    it returns one, else time.perf_counter's around the call; with a `timer` (a callable
    returning seconds) always the timer's around the call (module docstring). The space is
    enumerated: more than `max_combinations` combinations is refused.
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
    tbs = None if time_batches is None else _two_batches(time_batches, "time_batches")
    repeats = _check_batch(repeats, "repeats")
    if time_knobs is not None:
        time_knobs = [time_knobs] if isinstance(time_knobs, str) else list(time_knobs)
        unknown = [k for k in time_knobs if k not in knobs]
        if unknown:
            raise ValueError(f"plan: time_knobs {unknown} are not knobs; the knobs are "
                             f"{list(knobs)}")
    if recompute_batches is not None and time_knobs is None:
        raise ValueError("plan: recompute_batches needs time_knobs (without them every "
                         "combination is timed whole, at time_batches)")
    combos = [dict(zip(knobs, values)) for values in itertools.product(*knobs.values())]
    if len(combos) > max_combinations:
        raise ValueError(f"plan: {len(combos)} combinations of knobs is more than "
                         f"max_combinations={max_combinations} (the space is enumerated)")

    measured = []  # per combination: (runs, noise, attribution runs)
    for choice in combos:
        attrib = [_attribute(step_fn, b, choice, device) for b in mbs]
        runs = [_measure(step_fn, b, choice, device) for b in mbs]
        noise = raw_noise(runs[0], _measure(step_fn, mbs[0], choice, device))
        measured.append((runs, noise, attrib))

    timed_at = mbs if tbs is None else tbs
    rbs = timed_at if recompute_batches is None else _two_batches(recompute_batches,
                                                                  "recompute_batches")
    warm = set(mbs)

    def base_of(choice: dict) -> dict:
        return {k: (v if k in time_knobs else knobs[k][0]) for k, v in choice.items()}

    def time_it(choice: dict, n: int, per_op: bool, force_warm: bool = False,
                at: list | None = None) -> tuple:
        at = timed_at if at is None else at
        for b in at:
            if force_warm or b not in warm:  # a size this combination has not run at yet
                step_fn(b, dict(choice))
        timed = [_timed(step_fn, b, choice, timer, n, per_op) for b in at]
        return [t for t, _ in timed], [r for _, r in timed]

    models = []
    bases: dict = {}  # with time_knobs: json of a timed setting -> its seconds per time batch
    if time_knobs is not None:
        # the timed settings round-robin, `repeats` rounds (the median of each): a drift
        # of the machine's speed meets each of them alike, not only the one timed then
        order = []
        for choice in combos:
            if base_of(choice) not in order:
                order.append(base_of(choice))
        for choice in order:
            for b in timed_at:
                if b not in warm:
                    step_fn(b, dict(choice))
        rounds = {json.dumps(c, sort_keys=True): [[] for _ in timed_at] for c in order}
        for _ in range(repeats):
            for choice in order:
                for i, b in enumerate(timed_at):
                    rounds[json.dumps(choice, sort_keys=True)][i].append(
                        _time(step_fn, b, choice, timer))
        bases = {k: [_median(v) for v in per_batch] for k, per_batch in rounds.items()}
    for choice, (runs, noise, attrib) in zip(combos, measured):
        a1, a2 = attrib
        att = {"flops": _line((a1["batch"], a1["flops"]), (a2["batch"], a2["flops"])),
               "recomputed": a2["recomputed"], "saved_tensors": [a1["saved"], a2["saved"]],
               "batches": [a1["batch"], a2["batch"]]}
        if time_knobs is None:
            seconds = time_it(choice, repeats, False)[0]
            line = None
            att["time_from"] = {"timed": choice, "recompute_seconds": None}
        else:
            base = base_of(choice)
            key = json.dumps(base, sort_keys=True)
            seconds = bases[key]
            c, d = _line_through(timed_at, seconds)
            rc = rd = 0.0
            if base != choice and a2["recomputed"]:
                # the setting's own recomputed ops, timed in one step at each time batch
                # after a warm-up there (a rebuild's first call at a new size is slower)
                extra = time_it(choice, 1, True, force_warm=True, at=rbs)[1]
                rc, rd = _line_through(rbs, extra)
            line = (c + rc, d + rd)
            att["time_from"] = {"timed": base, "recompute_seconds": [rc, rd]}
        model = _Model.fit(runs, seconds, noise, tbs)
        if line is not None:
            model.time = line
        model.attribution = att
        models.append(model)
    result = _choose(combos, models, knobs, budget, batch, mbs, device, tbs)
    result.time_knobs = time_knobs
    result.repeats = repeats
    result.recompute_batches = None if time_knobs is None else list(rbs)
    return result


def _two_batches(batches, name: str) -> list:
    out = list(batches)
    if len(out) != 2:
        raise ValueError(f"plan: {name} needs two batch sizes, got {batches}")
    what = "a time batch" if name == "time_batches" else f"a batch of {name}"
    out = sorted(_check_batch(b, what) for b in out)
    if out[0] == out[1]:
        raise ValueError(f"plan: {name} must differ, got {batches}")
    return out


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
                     "recompute_flops": models[i].recompute_flops(batch),
                     "recomputed_ops": models[i].recomputed_ops(),
                     "fits": models[i].fits(batch, budget), "largest_batch": largest[i],
                     "aligned": models[i].tensor["aligned"]}
                    for i in order]
    index = {json.dumps(c, sort_keys=True): i for i, c in enumerate(combos)}
    reasons = {}
    for knob, options in knobs.items():
        other = models[index[json.dumps(dict(choice, **{knob: options[0]}), sort_keys=True)]]
        flops, other_flops = m.recompute_flops(batch), other.recompute_flops(batch)
        freed, added = tensor_changes(other, m, batch)
        reasons[knob] = {
            "option": choice[knob], "default": options[0],
            "frees_bytes": other.peak(batch) - m.peak(batch),
            "frees_raw_bytes": other.raw_peak(batch) - m.raw_peak(batch),
            "costs_seconds": m.seconds(batch) - other.seconds(batch),
            "recompute_flops": None if flops is None else flops - other_flops,
            "recomputed_ops": (None if m.recomputed_ops() is None
                               else m.recomputed_ops() - other.recomputed_ops()),
            "no_longer_saved": freed, "newly_saved": added}
    return Plan(choice=choice, batch=batch, budget=budget, fits=bool(fitting),
                peak=m.peak(batch), raw_peak=m.raw_peak(batch), saved=m.saved_bytes(batch),
                seconds=m.seconds(batch), knobs=knobs, alternatives=alternatives,
                reasons=reasons, measure_batches=list(mbs), device=device, needs=needs,
                notes=notes, time_batches=None if tbs is None else list(tbs),
                models=json.loads(json.dumps([m.to_data() for m in models])),
                recompute_flops=m.recompute_flops(batch), recomputed_ops=m.recomputed_ops())
