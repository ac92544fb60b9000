"""ta.memory: where the bytes of a training step go, who allocated them, why they live.

Always on and free: `live_bytes()`, `max_live_bytes()`, `reset_peak()` read counters
every Storage updates. Labels: `scope(name)` (nn.Module calls push their qualified name),
`phase(name)` (forward / backward / optimizer / other) and `tag(tensor, category)` mark
the Storages allocated or tagged under them.

`profile()` is the ledger: an observer of every Storage allocation and free, of every
graph node's saved tensors, and of every gradient summed in backward. From those events
it rebuilds, at any moment, the live bytes by category:

    parameter, gradient, optimizer_state   by tag (leaf .grad is tagged by the engine)
    saved        pinned by a graph node's saved tensors (unique storages, counted once)
    temporary    allocated and freed inside one op invocation
    gradient     other backward allocations (partial gradients in flight)
    activation   everything else made in forward

and flags copies (pure data movement) with their reason code. `set_limit` emulates a
device of a given size; `memcheck` is gradcheck's memory counterpart for tests.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import tracemalloc
import weakref

from . import backend
from . import storage as _storage
from .errors import OutOfMemoryError  # noqa: F401 - re-exported: ta.memory.OutOfMemoryError

CATEGORIES = ("parameter", "gradient", "optimizer_state", "saved", "activation", "temporary")
TAGS = CATEGORIES  # what tag() accepts
_ENGINE_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP_DIRS = (_ENGINE_DIR, os.path.dirname(contextlib.__file__))


# ----------------------------------------------------------------------------- counters
def live_bytes(device: str = "cpu") -> int:
    """Bytes held by live Storages on `device` right now."""
    return _storage.live(backend.canonical_device(device))


def max_live_bytes(device: str = "cpu") -> int:
    """The highest live_bytes since the start or the last reset_peak()."""
    return _storage.peak_bytes.get(backend.canonical_device(device), 0)


def reset_peak(device: str = "cpu") -> None:
    _storage.reset_peak(backend.canonical_device(device))


def reserved_bytes(device: str = "cpu"):
    """Bytes the allocator holds from the system (live + cached), beside live_bytes.

    cpu: the process's malloc heap (glibc; None elsewhere), which also holds Python objects
    and other libraries' memory; cuda: CuPy's default memory pool."""
    return backend.reserved_bytes(backend.canonical_device(device))


def keep_freed_host_memory(keep: bool = True) -> bool:
    """Whether freed host memory stays in the process for reuse (the default; it spares a
    training step the page faults of re-allocating its activations). False gives it back
    and restores glibc's static thresholds (for its untouched, dynamic ones, set
    TINYGRAD_ATTN_KEEP_HOST_MEMORY=0 before importing the engine). Returns False where this
    cannot be set (malloc other than glibc's)."""
    return backend.keep_freed_host_memory(keep)


def release_host_memory() -> None:
    """Return cached free host memory to the system now (malloc_trim)."""
    backend.release_host_memory()


# ----------------------------------------------------------------------------- labels
@contextlib.contextmanager
def _labelled(key: str, value: str):
    cur = _storage.current
    prev = cur[key]
    cur[key] = value
    try:
        yield
    finally:
        cur[key] = prev


def scope(name: str):
    """Attribute allocations (and graph nodes created) inside to the module `name`."""
    return _labelled("scope", name)


def phase(name: str):
    """Mark allocations inside as belonging to a phase: forward, backward, optimizer, other."""
    return _labelled("phase", name)


def current_phase() -> str:
    return _storage.current["phase"]


def current_scope() -> str:
    return _storage.current["scope"]


def tag(tensor, category: str) -> None:
    """Label the Storage under `tensor` with a category (e.g. 'parameter')."""
    if category not in TAGS:
        raise ValueError(f"tag: unknown category {category!r}; expected one of {TAGS}")
    tensor.untyped_storage().category = category


def parse_bytes(size) -> int:
    """'6GiB', '512MB', '100k', 1024 -> bytes."""
    if isinstance(size, int):
        return size
    text = str(size).strip().replace(" ", "")
    units = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
             "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4,
             "tb": 1000**4, "tib": 1024**4}
    num = text.rstrip("aAbBgGiIkKmMtT")
    unit = text[len(num):].lower()
    try:
        value = float(num)
    except ValueError:
        value = None
    if unit not in units or value is None:
        raise ValueError(f"cannot parse a size from {size!r} (try '6GiB' or '512MB')")
    return int(value * units[unit])


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"  # pragma: no cover


def _source_line() -> str | None:
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_SKIP_DIRS):
            return f"{os.path.basename(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


# ----------------------------------------------------------------------------- tracker
class _Tracker:
    """Observes storages, saved tensors and gradient sums (see storage.observers)."""

    def __init__(self, device: str = "cpu", events: bool = True, source_lines: bool = False):
        self.device = device
        self.record_events = events
        self.source_lines = source_lines
        self.info: dict = {}  # storage id -> dict (every storage seen, live or freed)
        self.refs: dict = {}  # storage id -> weakref to the live Storage
        self.saved_count: dict = {}  # storage id -> number of live nodes saving it
        self.nodes: dict = {}  # id(node) -> node info while its saved tensors live
        self.events: list = []
        self.fanout: dict = {}
        for st in gc.get_objects():  # what was alive before we started watching
            if type(st) is _storage.Storage and st.device == device:
                self._remember(st, preexisting=True)

    def _remember(self, st, preexisting=False) -> dict:
        info = {
            "id": st.id, "bytes": st.nbytes, "dtype": st.dtype.name,
            "shape": list(st.shape) if st.shape is not None else None, "op": st.op,
            "phase": st.phase, "scope": st.scope, "tag": st.category,
            "copy_reason": st.copy_reason, "call": st.call, "preexisting": preexisting,
            "temporary": False, "source": None,
        }
        self.info[st.id] = info
        self.refs[st.id] = weakref.ref(st)
        return info

    def _event(self, kind: str, **data) -> None:
        if self.record_events:
            cur = _storage.current
            data.update(kind=kind, t=len(self.events), phase=cur["phase"], op=cur["op"],
                        scope=cur["scope"])
            self.events.append(data)

    # -- storage observer protocol -----------------------------------------------------
    def on_alloc(self, st) -> None:
        if st.device != self.device:
            return
        info = self._remember(st)
        if self.source_lines:
            info["source"] = _source_line()
        self._event("alloc", sid=st.id, bytes=st.nbytes)

    def on_free(self, st) -> None:
        info = self.info.get(st.id)
        if info is None:
            return
        self.refs.pop(st.id, None)
        info["tag"] = st.category
        info["temporary"] = st.call is not None and st.call == _storage.current["call"]
        self._event("free", sid=st.id, bytes=st.nbytes)

    def on_save(self, node) -> None:
        saved = []
        for t in node.saved_tensor_list():
            st = t.untyped_storage()
            if st.device != self.device:
                continue
            if st.id not in self.info:
                self._remember(st, preexisting=True)
            saved.append((st.id, t.numel() * t.itemsize))
        if not saved:
            return
        key = id(node)
        self.nodes[key] = {
            "node": node.name, "op": node.name.removesuffix("Backward"), "scope": node.scope,
            "saved": saved, "source": _source_line() if self.source_lines else None,
        }
        for sid in {s for s, _ in saved}:
            self.saved_count[sid] = self.saved_count.get(sid, 0) + 1
        self._event("save", node=key, sids=sorted({s for s, _ in saved}))
        weakref.finalize(node, self._node_gone, key)

    def on_release(self, node) -> None:
        self._node_gone(id(node))

    def _node_gone(self, key) -> None:
        info = self.nodes.pop(key, None)
        if info is None:
            return
        sids = sorted({s for s, _ in info["saved"]})
        for sid in sids:
            self.saved_count[sid] -= 1
        self._event("release", node=key, sids=sids, node_info=info)

    def on_accumulate(self, node, output_nr, how, nbytes) -> None:
        name = getattr(node, "name", "?")
        key = (name, getattr(node, "scope", ""), output_nr)
        entry = self.fanout.setdefault(
            key, {"node": name, "scope": key[1], "output": output_nr, "partials": 1,
                  "in_place": 0, "new_buffer": 0, "bytes": nbytes}
        )
        entry["partials"] += 1
        entry["in_place" if how == "in-place" else "new_buffer"] += 1

    # -- derived views -----------------------------------------------------------------
    def category(self, sid: int, saved_count: dict) -> str:
        info = self.info[sid]
        ref = self.refs.get(sid)
        st = ref() if ref is not None else None
        tag_ = st.category if st is not None else info["tag"]
        if tag_ in ("parameter", "gradient", "optimizer_state"):
            return tag_
        if saved_count.get(sid, 0) > 0:
            return "saved"
        if tag_ in ("activation", "saved", "temporary"):
            return tag_
        if info["temporary"]:
            return "temporary"
        if info["phase"] == "backward":
            return "gradient"
        if info["phase"] == "optimizer":
            return "temporary"
        return "activation"

    def live_summary(self) -> str:
        """What holds memory now (for OutOfMemoryError messages)."""
        by_cat: dict = {}
        holders = []
        for sid, ref in list(self.refs.items()):
            if ref() is None:
                continue
            cat = self.category(sid, self.saved_count)
            info = self.info[sid]
            by_cat[cat] = by_cat.get(cat, 0) + info["bytes"]
            holders.append((info["bytes"], cat, info))
        lines = ["live by category: " + ", ".join(
            f"{c} {fmt_bytes(b)}" for c, b in sorted(by_cat.items(), key=lambda x: -x[1]))]
        for nbytes, cat, info in sorted(holders, key=lambda h: -h[0])[:5]:
            lines.append(f"  {fmt_bytes(nbytes):>10}  {cat:<15} {_describe(info)}")
        return "\n".join(lines)


def _describe(info: dict) -> str:
    parts = [f"{info['dtype']}{info['shape']}" if info["shape"] is not None else info["dtype"]]
    parts.append(f"from {info['op'] or 'a factory'}")
    if info["scope"]:
        parts.append(f"in {info['scope']}")
    if info.get("source"):
        parts.append(f"at {info['source']}")
    if info["copy_reason"]:
        parts.append(f"[copy: {info['copy_reason']}]")
    return " ".join(parts)


# ----------------------------------------------------------------------------- profile
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
        self._tracker = _Tracker(self.device, events=True, source_lines=self.source_lines)
        self.baseline_bytes = live_bytes(self.device)
        self.reserved_start = backend.reserved_bytes(self.device)
        self._started_tracemalloc = False
        self._pool_hook = None
        if self.raw and self.device != "cpu":  # CuPy: a hook on its memory pool
            self._pool_hook = backend.pool_tracker(self.device)
            self._pool_hook.__enter__()
        if self.raw and self.device == "cpu":
            if not tracemalloc.is_tracing():
                tracemalloc.start()
                self._started_tracemalloc = True
            tracemalloc.reset_peak()
            self._raw_start = tracemalloc.get_traced_memory()[0]
        _storage.observers.append(self._tracker)
        return self

    def __exit__(self, *exc) -> None:
        _storage.observers.remove(self._tracker)
        tr = self._tracker
        for sid, ref in tr.refs.items():  # tags set after allocation (optimizer state, ...)
            st = ref()
            if st is not None:
                tr.info[sid]["tag"] = st.category
        tr.refs = {}  # the profile is closed: later frees must not change its story
        self.raw_peak_bytes = None
        if self._pool_hook is not None:
            self._pool_hook.__exit__(None, None, None)
            self.raw_peak_bytes = self._pool_hook.peak
        if self.raw and self.device == "cpu":
            self.raw_peak_bytes = tracemalloc.get_traced_memory()[1] - self._raw_start
            if self._started_tracemalloc:
                tracemalloc.stop()
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
        # pass 1: total live after each event, to find the peak (and the backward peak)
        total = base
        peak_t, peak = -1, base
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

    def _moment(self, t: int) -> dict:
        if t < 0 or not self._tracker.events:
            return {"t": t, "op": None, "phase": None, "scope": None}
        e = self._tracker.events[t]
        return {"t": t, "op": e["op"], "phase": e["phase"], "scope": e["scope"]}

    def _replay_until(self, t: int):
        """(live storage ids, saved counts, saved-by map) just after event t."""
        tr = self._tracker
        live = {sid for sid, info in tr.info.items() if info["preexisting"]}
        saved_count: dict = {}
        holders: dict = {}  # sid -> node infos saving it
        released = {e["node"]: e["node_info"] for e in tr.events if e["kind"] == "release"}
        for e in tr.events[: t + 1]:
            kind = e["kind"]
            if kind == "alloc":
                live.add(e["sid"])
            elif kind == "free":
                live.discard(e["sid"])
            elif kind == "save":
                info = tr.nodes.get(e["node"]) or released.get(e["node"])
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
                     "what": _describe(info), "op": info["op"], "phase": info["phase"],
                     "scope": info["scope"], "source": info["source"],
                     "copy_reason": info["copy_reason"]}
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
                    "by_module": {}, "nodes": []}
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
        for n in nodes.values():
            sids = {s for s, _ in n["saved"]}
            unique = sum(tr.info[s]["bytes"] for s in sids)
            nominal = sum(b for _, b in n["saved"])
            node_rows.append({"node": n["node"], "scope": n["scope"], "source": n["source"],
                              "unique_bytes": unique, "nominal_bytes": nominal})
            for table, key in ((by_op, n["op"]), (by_module, n["scope"] or "(top level)")):
                row = table.setdefault(key, {"unique_bytes": 0, "nominal_bytes": 0,
                                             "nodes": 0})
                row["unique_bytes"] += unique
                row["nominal_bytes"] += nominal
                row["nodes"] += 1
        node_rows.sort(key=lambda r: -r["unique_bytes"])
        return {
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
                             "scope": info["scope"], "source": info["source"]})
        return rows

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
    def report(self, top: int = 10) -> str:
        s = self._summary
        pk = s["peak"]
        lines = [f"Memory profile on {s['device']}: {s['n_events']} events"]
        where = f"{pk['op'] or '-'} (phase {pk['phase'] or '-'}"
        where += f", scope {pk['scope']})" if pk["scope"] else ")"
        lines.append(f"  peak live (tensors)   {fmt_bytes(pk['bytes']):>12}  at event "
                     f"{pk['t']}: {where}")
        lines.append(f"  live at start         {fmt_bytes(s['baseline_bytes']):>12}   "
                     f"at end {fmt_bytes(s['end_bytes'])}")
        lines.append(f"  peak above start      {fmt_bytes(s['tensor_peak_above_start']):>12}"
                     " (tensor-level)")
        if s["raw_peak_bytes"] is not None:
            how = "tracemalloc" if s["device"] == "cpu" else "CuPy pool hook"
            lines.append(f"  raw peak above start  {fmt_bytes(s['raw_peak_bytes']):>12}"
                         f" ({how}: includes temporaries inside ops)")
        else:
            lines.append("  raw peak              not measured (profile(raw=True) adds it)")
        if s["reserved_end_bytes"] is not None:
            what = ("process malloc heap" if s["device"] == "cpu" else "CuPy memory pool")
            lines.append(f"  reserved              {fmt_bytes(s['reserved_end_bytes']):>12}"
                         f" at end, {fmt_bytes(s['reserved_start_bytes'])} at start ({what}:"
                         " live + cached)")
        lines.append("")
        lines.append("Bytes at peak by category:")
        for c, b in sorted(pk["by_category"].items(), key=lambda x: -x[1]):
            if b:
                lines.append(f"  {c:<16}{fmt_bytes(b):>12}  {100 * b / max(pk['bytes'], 1):5.1f}%")
        sv = s["saved_peak"]
        lines.append("")
        lines.append(f"Saved for backward at its peak (event {sv['t']}): "
                     f"{fmt_bytes(sv['unique_bytes'])} unique "
                     f"({fmt_bytes(sv['unique_bytes_without_parameters'])} without the "
                     "parameters nodes keep), "
                     f"{fmt_bytes(sv['nominal_bytes'])} nominal (views of one storage count "
                     "once in 'unique')")
        for title, table in (("by op", sv["by_op"]), ("by module", sv["by_module"])):
            lines.append(f"  {title}:")
            rows = sorted(table.items(), key=lambda kv: -kv[1]["unique_bytes"])[:top]
            for key, row in rows:
                lines.append(f"    {key:<34}{fmt_bytes(row['unique_bytes']):>12} unique "
                             f"{fmt_bytes(row['nominal_bytes']):>12} nominal  "
                             f"({row['nodes']} nodes)")
        lines.append("")
        copies = s["copies"]
        lines.append(f"Copies (pure data movement): {len(copies)}, "
                     f"{fmt_bytes(sum(c['bytes'] for c in copies))}")
        for c in sorted(copies, key=lambda c: -c["bytes"])[:top]:
            src = f" at {c['source']}" if c["source"] else ""
            scope_ = f" in {c['scope']}" if c["scope"] else ""
            lines.append(f"  {c['reason']:<15}{fmt_bytes(c['bytes']):>12}  {c['op']} "
                         f"{c['dtype']}{c['shape']} ({c['phase']}){scope_}{src}")
        if s["fanout"]:
            lines.append("")
            lines.append("Gradient fan-in (tensors with several consumers):")
            for f in s["fanout"][:top]:
                lines.append(f"  {f['node']:<24} {f['scope'] or '(top level)':<28} "
                             f"{f['partials']} partial grads, {f['in_place']} summed in place, "
                             f"{f['new_buffer']} new buffer(s), {fmt_bytes(f['bytes'])} each")
        lines.append("")
        lines.append("Top holders at peak:")
        for h in pk["holders"][:top]:
            lines.append(f"  {fmt_bytes(h['bytes']):>12}  {h['category']:<16} {h['what']}")
        bp = s["backward_peak"]
        if bp is not None:
            lines.append("")
            lines.append(f"Backward peak: {fmt_bytes(bp['bytes'])} at event {bp['t']} "
                         f"({bp['op']}); what was live, by the forward op it belongs to:")
            for h in bp["holders"][:top]:
                if h["category"] == "saved" and h.get("held_by"):
                    n = h["held_by"][0]
                    why = f"saved by {n['forward_op']}" + (f" in {n['scope']}" if n["scope"]
                                                          else "")
                    why += f" ({n['source']})" if n.get("source") else ""
                elif h.get("for_forward_op"):
                    why = f"made by the backward of {h['for_forward_op']}"
                    why += f" in {h['scope']}" if h["scope"] else ""
                else:
                    why = f"{h['category']} from {h['op'] or 'a factory'}"
                    why += f" in {h['scope']}" if h["scope"] else ""
                lines.append(f"  {fmt_bytes(h['bytes']):>12}  {h['category']:<16} {why}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()

    # -- pictures ----------------------------------------------------------------------
    def plot(self, path: str, title: str = "live bytes by category") -> str:
        """A stacked timeline PNG (needs matplotlib: pip install 'tinygrad_attn[plot]')."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(
                "plot() needs matplotlib: pip install 'tinygrad_attn[plot]' (or use "
                "plot_html(), which needs nothing)"
            ) from e
        tl = self.timeline()
        xs = list(range(len(tl["phases"])))
        fig, ax = plt.subplots(figsize=(10, 4.5))
        ys = [[b / 2**20 for b in tl["series"][c]] for c in CATEGORIES]
        ax.stackplot(xs, ys, labels=CATEGORIES, colors=[_COLORS[c] for c in CATEGORIES])
        for x, label in _phase_changes(tl["phases"]):
            ax.axvline(x, color="k", lw=0.8, ls="--")
            ax.text(x, ax.get_ylim()[1] * 0.97, f" {label}", va="top", fontsize=8)
        pk = self._summary["peak"]
        if pk["t"] >= 0:
            ax.plot([pk["t"]], [pk["bytes"] / 2**20], "rv")
            ax.annotate(f"peak {fmt_bytes(pk['bytes'])}", (pk["t"], pk["bytes"] / 2**20),
                        textcoords="offset points", xytext=(5, 5), fontsize=8, color="r")
        ax.set_xlabel("event (allocation, free, save, release)")
        ax.set_ylabel("MiB live")
        ax.set_title(title)
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    def plot_html(self, path: str, title: str = "live bytes by category") -> str:
        """The same timeline as a self-contained HTML page (inline SVG, no dependency)."""
        tl = self.timeline()
        n = max(len(tl["phases"]), 1)  # noqa: N806
        W, H, pad = 960, 360, 40
        totals = [sum(tl["series"][c][i] for c in CATEGORIES) for i in range(len(tl["phases"]))]
        top = max(totals + [1])

        def xy(i, v):
            return pad + (W - 2 * pad) * i / max(n - 1, 1), H - pad - (H - 2 * pad) * v / top

        polys = []
        lower = [0] * len(totals)
        for c in CATEGORIES:
            upper = [lo + v for lo, v in zip(lower, tl["series"][c])]
            if any(tl["series"][c]):
                pts = [xy(i, v) for i, v in enumerate(upper)]
                pts += [xy(i, v) for i, v in reversed(list(enumerate(lower)))]
                path_d = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
                polys.append(f'<polygon points="{path_d}" fill="{_COLORS[c]}">'
                             f"<title>{c}</title></polygon>")
            lower = upper
        marks = []
        for i, label in _phase_changes(tl["phases"]):
            x, _ = xy(i, 0)
            marks.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{pad}" y2="{H - pad}" '
                         f'stroke="black" stroke-dasharray="4"/><text x="{x + 3:.1f}" '
                         f'y="{pad + 12}" font-size="11">{label}</text>')
        pk = self._summary["peak"]
        if pk["t"] >= 0:
            x, y = xy(pk["t"], pk["bytes"])
            marks.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="red"/><text '
                         f'x="{x + 6:.1f}" y="{y - 6:.1f}" font-size="11" fill="red">peak '
                         f'{fmt_bytes(pk["bytes"])}</text>')
        legend = " ".join(f'<span style="background:{_COLORS[c]};padding:0 8px"></span> {c}'
                          for c in CATEGORIES)
        report = (self.report().replace("&", "&amp;").replace("<", "&lt;")
                  .replace(">", "&gt;"))
        page = (f"<!doctype html><meta charset='utf-8'><title>{title}</title>"
                f"<h3>{title}</h3><div>{legend}</div>"
                f'<svg width="{W}" height="{H}" xmlns="http://www.w3.org/2000/svg">'
                f'<rect width="{W}" height="{H}" fill="white"/>{"".join(polys)}'
                f'{"".join(marks)}<text x="{pad}" y="{H - 10}" font-size="11">events '
                f'(0..{n - 1}); top = {fmt_bytes(top)}</text></svg><pre>{report}</pre>')
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)
        return path


_COLORS = {"parameter": "#4c72b0", "gradient": "#dd8452", "optimizer_state": "#8172b3",
           "saved": "#c44e52", "activation": "#55a868", "temporary": "#937860"}


def _phase_changes(phases):
    out, prev = [], None
    for i, p in enumerate(phases):
        if p != prev:
            out.append((i, p))
            prev = p
    return out


def profile(source_lines: bool = False, device: str = "cpu", raw: bool = False) -> Profile:
    """Record every allocation, free and saved tensor inside a `with` block.

    `source_lines=True` also records the first source line outside the engine for each
    allocation and graph node. `raw=True` also measures the raw peak, which includes the
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
        _storage.observers.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _storage.observers.remove(self)
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


# ----------------------------------------------------------------------------- policies
POLICY_OPS = ("softmax", "gelu", "layer_norm")


def save_policy(op: str | None = None, mode: str | None = None):
    """Get or set whether an op's output is kept for backward ("save") or rebuilt from what
    the op saved anyway ("recompute"): softmax, gelu and layer_norm.

    save_policy() -> the whole table; save_policy("gelu") -> its mode;
    save_policy("gelu", "recompute") sets it. `save_policies(...)` scopes a change.
    """
    if op is None:
        return dict(_storage.policies)
    if op not in POLICY_OPS:
        raise ValueError(f"save_policy: unknown op {op!r}; expected one of {POLICY_OPS}")
    if mode is None:
        return _storage.policies[op]
    if mode not in ("save", "recompute"):
        raise ValueError(f"save_policy: mode must be 'save' or 'recompute', got {mode!r}")
    _storage.policies[op] = mode
    return mode


@contextlib.contextmanager
def save_policies(**modes):
    """with ta.memory.save_policies(gelu="recompute", layer_norm="recompute"): ..."""
    prev = dict(_storage.policies)
    try:
        for op, mode in modes.items():
            save_policy(op, mode)
        yield
    finally:
        _storage.policies.update(prev)


# ----------------------------------------------------------------------------- habits
@contextlib.contextmanager
def emulate(permute_copies: bool = False, inplace_grad_accumulation: bool = True,
            slice_grad_full: bool = False, late_free: bool = False):
    """Reproduce, inside this engine, the habits behind the motivating story:

    permute_copies             permute/transpose materialize (Julia's permutedims);
                               copies carry the reason 'permute-copy'
    inplace_grad_accumulation  False: every sum of two gradients allocates a new buffer
                               (reason 'grad-accumulate'), as the story's engine did
    slice_grad_full            each basic slice's backward allocates a base-sized zero
                               gradient (as PyTorch and Zygote do for indexing); split
                               still assembles one buffer
    late_free                  saved tensors are freed only when backward ends, as with a
                               garbage-collected allocator
    """
    new = {"permute_copies": permute_copies,
           "inplace_grad_accumulation": inplace_grad_accumulation,
           "slice_grad_full": slice_grad_full, "late_free": late_free}
    prev = dict(_storage.habits)
    _storage.habits.update(new)
    try:
        yield
    finally:
        _storage.habits.update(prev)


# ----------------------------------------------------------------------------- limit
_limit_trackers: dict = {}  # device -> the _Tracker that describes it when it overflows


def _oom_report(device: str) -> str:
    tracker = _limit_trackers.get(device)
    return tracker.live_summary() if tracker is not None else ""


def set_limit(size, device: str = "cpu") -> None:
    """Emulate a device of `size` bytes ('6GiB', 512 * 2**20, or None to remove it).

    The limit is per device: set_limit("6GiB", "cuda") caps the GPU and leaves the CPU
    alone. An allocation that would take the device's live bytes past it raises
    ta.OutOfMemoryError, with a summary of what holds memory there; the failed allocation
    leaves nothing behind.
    """
    dev = backend.canonical_device(device)
    old = _limit_trackers.pop(dev, None)
    if old is not None:
        _storage.observers.remove(old)
    if size is None:
        _storage.limit.pop(dev, None)
        return
    _storage.limit[dev] = parse_bytes(size)
    tracker = _Tracker(dev, events=False)
    _storage.observers.append(tracker)
    _limit_trackers[dev] = tracker
    _storage.oom_report[0] = _oom_report


def get_limit(device: str = "cpu"):
    """The emulated size of `device` in bytes, or None."""
    return _storage.limit.get(backend.canonical_device(device))


@contextlib.contextmanager
def limit(size, device: str = "cpu"):
    """set_limit for the duration of a `with` block."""
    prev = get_limit(device)
    set_limit(size, device)
    try:
        yield
    finally:
        set_limit(prev, device)


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
                        from .creation import ones_like

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
