"""The ledger: what a region of code allocated, saved and copied, rebuilt from its events.

`profile()` registers a Tracker (tracker.py) for the region, then analyses its event list:
the peak and what held it, saved-for-backward at its peak by op and by module, copies,
gradient fan-in, the backward peak, and a timeline by category (render.py draws them).
`step_stats()` keeps only per-step numbers, `saved_bytes()` walks a graph, and `memcheck()`
is gradcheck's memory counterpart for tests.
"""

from __future__ import annotations

import json
import tracemalloc

from .. import backend
from ..errors import OutOfMemoryError  # noqa: F401 - re-exported: ta.memory.OutOfMemoryError
from . import render, state
from .counters import CATEGORIES, live_bytes, max_live_bytes, reset_peak
from .tracker import Tracker, describe


class Profile:
    """The ledger of one region of code (see profile())."""

    def __init__(self, source_lines: bool = False, device: str = "cpu", raw: bool = False):
        self.device = backend.canonical_device(device)
        self.source_lines = source_lines
        self.raw = raw
        self._tracker = None
        self._summary = None

    # -- lifetime ----------------------------------------------------------------------
    def __enter__(self) -> Profile:
        self._tracker = Tracker(self.device, events=True, source_lines=self.source_lines)
        self.baseline_bytes = live_bytes(self.device)
        self.reserved_start = backend.reserved_bytes(self.device)
        self._started_tracemalloc = False
        self._pool_hook = None
        if self.raw and self.device != "cpu":  # CuPy: a hook on its memory pool
            self._pool_hook = backend.pool_tracker(self.device)
            self._pool_hook.__enter__()
        self._compiler_paused = None
        if self.raw and self.device == "cpu":
            # tracemalloc traces every thread: the background kernel compiler's loading
            # (megabytes of Python objects) waits until the profile ends
            self._compiler_paused = backend.compiler_paused()
            self._compiler_paused.__enter__()
            if not tracemalloc.is_tracing():
                tracemalloc.start()
                self._started_tracemalloc = True
            tracemalloc.reset_peak()
            self._raw_start = tracemalloc.get_traced_memory()[0]
        with state.observer_lock:
            state.observers.append(self._tracker)
        return self

    def __exit__(self, *exc) -> None:
        tr = self._tracker
        with state.observer_lock:  # no event of another thread's in flight meanwhile
            state.observers.remove(tr)
            for sid, ref in tr.refs.items():  # tags set after allocation (optimizer state)
                st = ref()
                if st is not None:
                    tr.info[sid]["tag"] = st.category
            tr.refs = {}  # the profile is closed: later frees must not change its story
        self.raw_peak_bytes = None
        if self._pool_hook is not None:
            self._pool_hook.__exit__(None, None, None)
            self.raw_peak_bytes = self._pool_hook.peak
        if self.raw and self.device == "cpu":
            try:
                self.raw_peak_bytes = tracemalloc.get_traced_memory()[1] - self._raw_start
                if self._started_tracemalloc:
                    tracemalloc.stop()
            finally:
                self._compiler_paused.__exit__(None, None, None)
        self.end_bytes = live_bytes(self.device)
        self.reserved_end = backend.reserved_bytes(self.device)
        self._analyze()

    # -- results -----------------------------------------------------------------------
    @property
    def events(self) -> list:
        return self._tracker.events

    def live_bytes(self) -> int:
        return live_bytes(self.device)

    @property
    def peak_bytes(self) -> int:
        return self._summary["peak"]["bytes"]

    def _analyze(self) -> None:
        tr = self._tracker
        base = self.baseline_bytes
        self._save_infos = self._pair_saves()
        (peak_t, peak), (bwd_t, bwd_peak), saved_peak_t = self._peaks()
        self._peak_t, self._bwd_t, self._saved_peak_t = peak_t, bwd_t, saved_peak_t
        self._summary = {
            "device": self.device,
            "baseline_bytes": base,
            "end_bytes": self.end_bytes,
            "peak": dict(self._moment(peak_t), bytes=peak),
            "raw_peak_bytes": self.raw_peak_bytes,
            "reserved_start_bytes": self.reserved_start,
            "reserved_end_bytes": self.reserved_end,
            "keeps_freed_host_memory": backend.keeps_freed_host_memory(),
            "tensor_peak_above_start": peak - base,
            "saved_peak": self._saved_at(saved_peak_t),
            "copies": self._copies(),
            "fanout": sorted(tr.fanout.values(), key=lambda f: -f["partials"]),
            "backward_peak": None if bwd_t is None else dict(
                self._moment(bwd_t), bytes=bwd_peak, holders=self._holders_at(bwd_t, 20)),
            "n_events": len(tr.events),
        }
        at_peak = self._holders_at(peak_t, None)
        by_cat = {c: 0 for c in CATEGORIES}
        for h in at_peak:
            by_cat[h["category"]] += h["bytes"]
        self._summary["peak"]["by_category"] = by_cat
        self._summary["peak"]["holders"] = at_peak[:15]

    def _peaks(self):
        """One pass over the events: ((t, bytes) of the peak, (t, bytes) of the backward
        peak, t of the saved-for-backward peak), the totals counted after each event."""
        tr = self._tracker
        total = self.baseline_bytes
        peak_t, peak = -1, total
        bwd_t, bwd_peak = None, -1
        saved_total, saved_peak_t, saved_peak = 0, -1, 0
        saved_count: dict = {}
        for e in tr.events:
            kind = e["kind"]
            if kind == "alloc":
                total += e["bytes"]
            elif kind == "free":
                total -= e["bytes"]
            else:
                for sid in e["sids"]:
                    before = saved_count.get(sid, 0)
                    saved_count[sid] = before + (1 if kind == "save" else -1)
                    if kind == "save" and before == 0:
                        saved_total += tr.info[sid]["bytes"]
                    elif kind == "release" and before == 1:
                        saved_total -= tr.info[sid]["bytes"]
            if total > peak:
                peak, peak_t = total, e["t"]
            if e["phase"] == "backward" and total > bwd_peak:
                bwd_peak, bwd_t = total, e["t"]
            if saved_total > saved_peak:
                saved_peak, saved_peak_t = saved_total, e["t"]
        return (peak_t, peak), (bwd_t, bwd_peak), saved_peak_t

    def _moment(self, t: int) -> dict:
        if t < 0 or not self._tracker.events:
            return {"t": t, "op": None, "phase": None, "scope": None}
        e = self._tracker.events[t]
        return {"t": t, "op": e["op"], "phase": e["phase"], "scope": e["scope"]}

    def _pair_saves(self) -> dict:
        """Event index of each save -> the info of the node that made it.

        Events name a node by id(node), which Python reuses once the node dies; but a node
        is released (at the latest when it dies) before another can be saved under its id,
        so each save pairs with the next release of its id, or with a node still alive."""
        tr = self._tracker
        open_saves, infos = {}, {}
        for e in tr.events:
            if e["kind"] == "save":
                open_saves[e["node"]] = e["t"]
            elif e["kind"] == "release" and e["node"] in open_saves:
                infos[open_saves.pop(e["node"])] = e["node_info"]
        for node, t in open_saves.items():
            infos[t] = tr.nodes.get(node)
        return infos

    def _replay_until(self, t: int):
        """(live storage ids, saved counts, saved-by map) just after event t."""
        tr = self._tracker
        live = {sid for sid, info in tr.info.items() if info["preexisting"]}
        saved_count: dict = {}
        holders: dict = {}  # sid -> node infos saving it
        for e in tr.events[: t + 1]:
            kind = e["kind"]
            if kind == "alloc":
                live.add(e["sid"])
            elif kind == "free":
                live.discard(e["sid"])
            elif kind == "save":
                info = self._save_infos.get(e["t"])
                for sid in e["sids"]:
                    saved_count[sid] = saved_count.get(sid, 0) + 1
                    holders.setdefault(sid, []).append(info)
            elif kind == "release":
                for sid in e["sids"]:
                    saved_count[sid] -= 1
                    lst = holders.get(sid, [])
                    for i, ni in enumerate(lst):
                        if ni is e["node_info"]:
                            del lst[i]
                            break
        return live, saved_count, holders

    def _holders_at(self, t: int, limit) -> list:
        tr = self._tracker
        live, saved_count, holders = self._replay_until(t)
        out = []
        for sid in live:
            info = tr.info[sid]
            cat = tr.category(sid, saved_count)
            entry = {"storage": sid, "bytes": info["bytes"], "category": cat,
                     "what": describe(info), "op": info["op"], "phase": info["phase"],
                     "scope": info["scope"], "source": info["source"],
                     "via": info["via"], "copy_reason": info["copy_reason"]}
            if cat == "saved":
                entry["held_by"] = [
                    {"node": n["node"], "forward_op": n["op"], "scope": n["scope"],
                     "source": n["source"]} for n in holders.get(sid, []) if n is not None
                ]
            elif info["phase"] == "backward" and info["op"]:
                entry["for_forward_op"] = info["op"].removesuffix("Backward")
            out.append(entry)
        out.sort(key=lambda h: -h["bytes"])
        return out if limit is None else out[:limit]

    def _saved_at(self, t: int) -> dict:
        """Saved-for-backward at the moment it peaked: by op and by module."""
        tr = self._tracker
        if t < 0:
            return {"t": t, "unique_bytes": 0, "unique_bytes_without_parameters": 0,
                    "nominal_bytes": 0, "by_op": {},
                    "by_module": {}, "nodes": [],
                    "graph_of_gradient": {"unique_bytes": 0, "nominal_bytes": 0, "nodes": 0,
                                          "by_op": {}, "by_module": {}}}
        _, saved_count, holders = self._replay_until(t)
        nodes = {}
        for sid, lst in holders.items():
            for n in lst:
                if n is not None and saved_count.get(sid, 0) > 0:
                    nodes[id(n)] = n
        unique_sids = {sid for sid, c in saved_count.items() if c > 0}
        by_op: dict = {}
        by_module: dict = {}
        node_rows = []
        graph_of_gradient = {"unique_bytes": 0, "nominal_bytes": 0, "nodes": 0,
                             "by_op": {}, "by_module": {}}
        second_sids: set = set()
        for n in nodes.values():
            sids = {s for s, _ in n["saved"]}
            unique = sum(tr.info[s]["bytes"] for s in sids)
            nominal = sum(b for _, b in n["saved"])
            order = n.get("order", 1)
            node_rows.append({"node": n["node"], "scope": n["scope"], "source": n["source"],
                              "unique_bytes": unique, "nominal_bytes": nominal,
                              "order": order})
            tables = [(by_op, n["op"]), (by_module, n["scope"] or "(top level)")]
            if order == 2:  # recorded by a create_graph backward: the gradient's own graph
                second_sids |= sids
                graph_of_gradient["nominal_bytes"] += nominal
                graph_of_gradient["nodes"] += 1
                tables += [(graph_of_gradient["by_op"], n["op"]),
                           (graph_of_gradient["by_module"], n["scope"] or "(top level)")]
            for table, key in tables:
                row = table.setdefault(key, {"unique_bytes": 0, "nominal_bytes": 0,
                                             "nodes": 0})
                row["unique_bytes"] += unique
                row["nominal_bytes"] += nominal
                row["nodes"] += 1
        node_rows.sort(key=lambda r: -r["unique_bytes"])
        graph_of_gradient["unique_bytes"] = sum(tr.info[s]["bytes"] for s in second_sids)
        return {
            "graph_of_gradient": graph_of_gradient,
            "t": t,
            "unique_bytes": sum(tr.info[s]["bytes"] for s in unique_sids),
            "unique_bytes_without_parameters": sum(
                tr.info[s]["bytes"] for s in unique_sids
                if tr.category(s, {}) != "parameter"),
            "nominal_bytes": sum(r["nominal_bytes"] for r in node_rows),
            "by_op": by_op, "by_module": by_module, "nodes": node_rows,
        }

    def _copies(self) -> list:
        tr = self._tracker
        rows = []
        for e in tr.events:
            if e["kind"] != "alloc":
                continue
            info = tr.info[e["sid"]]
            if info["copy_reason"]:
                rows.append({"reason": info["copy_reason"], "op": info["op"],
                             "shape": info["shape"], "dtype": info["dtype"],
                             "bytes": info["bytes"], "phase": info["phase"],
                             "scope": info["scope"], "source": info["source"],
                             "via": info["via"]})
        return rows

    def saved_tensors(self, when: str = "saved_peak") -> list:
        """The storages saved for backward at the moment saved bytes peaked (when=
        "saved_peak") or when backward began (when="backward": the last event before the
        first one in phase backward; what forward left for it), largest first: bytes,
        dtype, shape, what (dtype[shape] from op in scope at line), the op and scope that
        made it, its source line (with source_lines=True), and held_by (the forward ops
        whose nodes keep it). Parameters are left out, as in saved_peak's
        unique_bytes_without_parameters."""
        if when not in ("saved_peak", "backward"):
            raise ValueError(f"saved_tensors: when must be 'saved_peak' or 'backward', "
                             f"got {when!r}")
        t = self._saved_peak_t
        if when == "backward":
            events = self._tracker.events
            t = next((e["t"] - 1 for e in events if e["phase"] == "backward"),
                     len(events) - 1)
        if t < 0:
            return []
        keys = ("bytes", "what", "op", "scope", "source", "via", "held_by")
        out = []
        for h in self._holders_at(t, None):
            if h["category"] == "saved":
                info = self._tracker.info[h["storage"]]
                row = {k: h[k] for k in keys}
                row.update(dtype=str(info["dtype"]), shape=list(info["shape"] or ()))
                out.append(row)
        return json.loads(json.dumps(out, default=str))

    def summary(self) -> dict:
        """Everything the report shows, as plain Python data (JSON-serializable)."""
        return json.loads(json.dumps(self._summary, default=str))

    def timeline(self) -> dict:
        """Live bytes by category after every event: {category: [bytes...]}, phases."""
        tr = self._tracker
        live, saved_count, _ = self._replay_until(-1)
        live = {sid for sid, info in tr.info.items() if info["preexisting"]}
        cat_of = {sid: tr.category(sid, saved_count) for sid in live}
        totals = {c: 0 for c in CATEGORIES}
        for sid in live:
            totals[cat_of[sid]] += tr.info[sid]["bytes"]
        series = {c: [] for c in CATEGORIES}
        phases = []
        for e in tr.events:
            kind = e["kind"]
            if kind == "alloc":
                sid = e["sid"]
                cat_of[sid] = tr.category(sid, saved_count)
                totals[cat_of[sid]] += e["bytes"]
            elif kind == "free":
                cat = cat_of.pop(e["sid"], None)
                if cat is not None:
                    totals[cat] -= e["bytes"]
            else:
                for sid in e["sids"]:
                    saved_count[sid] = saved_count.get(sid, 0) + (1 if kind == "save" else -1)
                    if sid in cat_of:
                        new = tr.category(sid, saved_count)
                        old = cat_of[sid]
                        if new != old:
                            b = tr.info[sid]["bytes"]
                            totals[old] -= b
                            totals[new] += b
                            cat_of[sid] = new
            for c in CATEGORIES:
                series[c].append(totals[c])
            phases.append(e["phase"])
        return {"series": series, "phases": phases}

    # -- text report -------------------------------------------------------------------

    # -- text and pictures (render.py) -------------------------------------------------
    def report(self, top: int = 10) -> str:
        """The summary as text: peak, by category, saved by op and module, copies, fan-in,
        top holders at the peak and at the backward peak."""
        return render.report(self._summary, top)

    def __str__(self) -> str:
        return self.report()

    def plot(self, path: str, title: str = "live bytes by category") -> str:
        """A stacked timeline PNG (needs matplotlib: pip install 'tinygrad_attn[plot]')."""
        return render.plot_png(self.timeline(), self._summary["peak"], path, title)

    def plot_html(self, path: str, title: str = "live bytes by category") -> str:
        """The timeline as one self-contained interactive HTML page (no dependency, nothing
        fetched): hover for bytes, shapes, ops and source lines, zoom, click the peak."""
        return render.plot_html([self.viewer_data(title)], path, title)

    def viewer_data(self, title: str = "live bytes by category") -> dict:
        """What the HTML viewer draws for this profile (plain data; see plot_html()). Call it
        while the model lives, as timeline(): a tag set after the profile is read live."""
        return render.viewer_data(self.timeline(), self._summary, self._tracker.events,
                                  self._allocations(), self.report(), title)

    def _allocations(self) -> list:
        """Each storage seen: its lifetime in events (t1 None: still live at the end), what
        it is, who made it and why, and its category (saved if a node ever saved it)."""
        tr = self._tracker
        t0, t1, ever_saved = {}, {}, set()
        for e in tr.events:
            if e["kind"] == "alloc":
                t0[e["sid"]] = e["t"]
            elif e["kind"] == "free":
                t1[e["sid"]] = e["t"]
            elif e["kind"] == "save":
                ever_saved.update(e["sids"])
        out = []
        for sid, info in tr.info.items():
            if not info["preexisting"] and sid not in t0:
                continue
            cat = tr.category(sid, {})
            if sid in ever_saved and cat not in ("parameter", "gradient", "optimizer_state",
                                                 "bucket"):
                cat = "saved"
            out.append({"t0": t0.get(sid, 0), "t1": t1.get(sid), "bytes": info["bytes"],
                        "dtype": info["dtype"], "shape": info["shape"], "op": info["op"],
                        "scope": info["scope"], "phase": info["phase"],
                        "source": info["source"], "via": info["via"],
                        "copy_reason": info["copy_reason"],
                        "category": cat})
        return out


def plot_html(runs, path: str, title: str | None = None) -> str:
    """Several profiles in one interactive HTML page on one byte scale, to compare them:
    `runs` maps titles to Profiles (or to their viewer_data()), or lists viewer_data()."""
    if isinstance(runs, dict):
        runs = [r.viewer_data(t) if isinstance(r, Profile) else dict(r, title=t)
                for t, r in runs.items()]
    return render.plot_html(list(runs), path, title)


def profile(source_lines: bool = False, device: str = "cpu", raw: bool = False) -> Profile:
    """Record every allocation, free and saved tensor inside a `with` block.

    `source_lines=True` also records, for each allocation and graph node, the user's source
    line: the first frame outside the engine and the nn package (and, as `via`, the nn line
    the call went through, if any). `raw=True` also measures the raw peak, which includes the
    temporaries inside ops that never become tensors: on CPU with tracemalloc, which
    traces every Python allocation and adds 25-41% to a small GPT step's time, so it is
    opt-in (an open profile() alone costs about 5%: see README); on a GPU with a memory
    hook on CuPy's pool, which sees every array CuPy allocates and frees.
    """
    return Profile(source_lines=source_lines, device=device, raw=raw)


# ----------------------------------------------------------------------------- per step
class StepStats:
    """Cheap per-step numbers for a training log (no event list is kept):

        with ta.memory.step_stats() as st:
            loss = model(x, y)[1]; st.mark_saved(loss); loss.backward(); opt.step()
        st.peak_bytes, st.saved_bytes, st.copies, st.copied_bytes, st.allocated_bytes
    """

    def __init__(self, device: str = "cpu"):
        self.device = backend.canonical_device(device)
        self.copies = self.copied_bytes = self.allocations = self.allocated_bytes = 0
        self.saved_bytes = 0

    def on_alloc(self, st) -> None:
        if st.device == self.device:
            self.allocations += 1
            self.allocated_bytes += st.nbytes
            if st.copy_reason:
                self.copies += 1
                self.copied_bytes += st.nbytes

    def on_free(self, st) -> None:
        pass

    def mark_saved(self, output) -> int:
        """Record the bytes the graph behind `output` holds for backward (call it before
        backward frees them)."""
        self.saved_bytes = saved_bytes(output)
        return self.saved_bytes

    def __enter__(self) -> StepStats:
        self.start_bytes = live_bytes(self.device)
        reset_peak(self.device)
        state.observers.append(self)
        return self

    def __exit__(self, *exc) -> None:
        state.observers.remove(self)
        self.peak_bytes = max_live_bytes(self.device)
        self.end_bytes = live_bytes(self.device)


def step_stats(device: str = "cpu") -> StepStats:
    return StepStats(device)


def saved_bytes(output, include_parameters: bool = False) -> int:
    """Unique bytes (each storage once) held for backward by the graph behind `output`.

    Parameters a node keeps (a Linear's weight) are left out unless asked for: they are
    alive anyway, so they are not what saving for backward costs.
    """
    seen_nodes, seen_storages = set(), {}
    stack = [output.grad_fn] if output.grad_fn is not None else []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        for t in node.saved_tensor_list():
            st = t.untyped_storage()
            if include_parameters or st.category != "parameter":
                seen_storages[st.id] = st.nbytes
        stack.extend(edge[0] for edge in node.next_functions if edge is not None)
    return sum(seen_storages.values())


# ----------------------------------------------------------------------------- memcheck
class MemoryBudgetError(AssertionError):
    """A memcheck budget was exceeded; the message carries the ledger's report."""


def memcheck(fn, *inputs, max_saved_bytes=None, max_copies=None, max_copy_bytes=None,
             max_peak_bytes=None, backward: bool = True, source_lines: bool = True) -> Profile:
    """Run fn(*inputs) (and its backward) under the ledger; raise if a budget is exceeded.

    Budgets: saved-for-backward unique bytes at their peak, number (and bytes) of copies,
    tensor-level peak above the start. Returns the Profile for further assertions.
    """
    with profile(source_lines=source_lines) as prof:
        out = fn(*inputs)
        if backward:
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for o in outs:
                if getattr(o, "requires_grad", False):
                    if o.numel() == 1:
                        o.backward()
                    else:
                        from ..creation import ones_like  # at call time: creation is above

                        o.backward(ones_like(o))
        del out
    s = prof.summary()
    problems = []
    if max_saved_bytes is not None and s["saved_peak"]["unique_bytes"] > max_saved_bytes:
        problems.append(f"saved for backward {s['saved_peak']['unique_bytes']} bytes > budget "
                        f"{max_saved_bytes}")
    if max_copies is not None and len(s["copies"]) > max_copies:
        problems.append(f"{len(s['copies'])} copies > budget {max_copies}")
    copy_bytes = sum(c["bytes"] for c in s["copies"])
    if max_copy_bytes is not None and copy_bytes > max_copy_bytes:
        problems.append(f"copied {copy_bytes} bytes > budget {max_copy_bytes}")
    if max_peak_bytes is not None and s["tensor_peak_above_start"] > max_peak_bytes:
        problems.append(f"peak {s['tensor_peak_above_start']} bytes above start > budget "
                        f"{max_peak_bytes}")
    if problems:
        raise MemoryBudgetError("memcheck failed: " + "; ".join(problems) + "\n\n"
                                + prof.report())
    return prof
