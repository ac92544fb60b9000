"""The ledger's observer: every Storage allocated and freed, every graph node's saved tensors
and every gradient summed in backward, on one device; and the emulated device limit.

A `Tracker` is registered in state.observers by profile() (with the full event list, from
which ledger.py rebuilds any moment) and by set_limit() (without events: on an overflow it
only has to say what holds memory now, which is why the limit lives here, beside it).
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref

from .. import backend
from . import state
from .counters import fmt_bytes, parse_bytes

# The user's source line is the first frame outside the engine (tinygrad_attn/) and the nn
# package beside it (nn/): an nn.Linear in a user's model is charged to the model's line, not
# to nn's own `linear`. nn is found as the engine's sibling directory, not imported (memory
# sits below nn), so a user's own package named nn elsewhere is still the user's code.
_ENGINE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NN_DIR = os.path.join(os.path.dirname(_ENGINE_DIR), "nn")
_SKIP_DIRS = (_ENGINE_DIR + os.sep, _NN_DIR + os.sep,
              os.path.dirname(contextlib.__file__) + os.sep)


def source_lines() -> tuple:
    """(the user's line, the innermost nn line on the way to it or None), as 'file.py:N'.
    The nn line says where inside nn the bytes were asked for (the copy in nn/gpt.py that
    a model call from a script made), which the user's line alone no longer shows."""
    frame, via = sys._getframe(2), None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_SKIP_DIRS):
            return f"{os.path.basename(filename)}:{frame.f_lineno}", via
        if via is None and filename.startswith(_NN_DIR + os.sep):
            via = f"{os.path.basename(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return None, via


# ----------------------------------------------------------------------------- tracker
def _live_storages() -> list:
    """Every live Storage, from the registry each one enters when it is made and leaves in
    its __del__ (state.live_storages). The copy is one C call that allocates its dict before
    it reads any entry, so no collection (and no other thread) runs while it copies: a
    Storage made or freed meanwhile is in it or not, never half. (It is not taken under
    state.lock: allocating a dict there could run a __del__ that takes the lock again.)"""
    refs = state.live_storages.copy()
    return [st for st in (r() for r in refs.values()) if st is not None]


class Tracker:
    """Observes storages, saved tensors and gradient sums (see state.observers)."""

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
        for st in _live_storages():  # what was alive before we started watching
            # (one another thread is constructing has no `call` yet: its on_alloc will come)
            if hasattr(st, "call") and st.device == device:
                self._remember(st, preexisting=True)

    def _remember(self, st, preexisting=False) -> dict:
        info = {
            "id": st.id, "bytes": st.nbytes, "dtype": st.dtype.name,
            "shape": list(st.shape) if st.shape is not None else None, "op": st.op,
            "phase": st.phase, "scope": st.scope, "tag": st.category,
            "copy_reason": st.copy_reason, "call": st.call, "preexisting": preexisting,
            "temporary": False, "source": None, "via": None,
        }
        self.info[st.id] = info
        self.refs[st.id] = weakref.ref(st)
        return info

    def _event(self, kind: str, **data) -> None:
        if self.record_events:
            cur = state.local.labels  # the labels of the thread the event happens in
            data.update(kind=kind, t=len(self.events), phase=cur["phase"], op=cur["op"],
                        scope=cur["scope"])
            self.events.append(data)

    # -- storage observer protocol -----------------------------------------------------
    def on_alloc(self, st) -> None:
        if st.device != self.device:
            return
        info = self._remember(st)
        if self.source_lines:
            info["source"], info["via"] = source_lines()
        self._event("alloc", sid=st.id, bytes=st.nbytes)

    def on_free(self, st) -> None:
        info = self.info.get(st.id)
        if info is None:
            return
        self.refs.pop(st.id, None)
        info["tag"] = st.category
        info["temporary"] = st.call is not None and st.call == state.local.labels["call"]
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
        source, via = source_lines() if self.source_lines else (None, None)
        self.nodes[key] = {
            "node": node.name, "op": node.name.removesuffix("Backward"), "scope": node.scope,
            "saved": saved, "source": source, "via": via,
            # recorded by a create_graph backward: part of a gradient's graph
            "order": 2 if state.local.create_graph else 1,
        }
        for sid in {s for s, _ in saved}:
            self.saved_count[sid] = self.saved_count.get(sid, 0) + 1
        self._event("save", node=key, sids=sorted({s for s, _ in saved}))
        weakref.finalize(node, self._node_gone, key)

    def on_release(self, node) -> None:
        self._node_gone(id(node))

    def _node_gone(self, key) -> None:
        # also called by a node's finalizer, in whichever thread drops the node last
        with state.observer_lock:
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
        if tag_ in ("parameter", "gradient", "optimizer_state", "bucket"):
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
            lines.append(f"  {fmt_bytes(nbytes):>10}  {cat:<15} {describe(info)}")
        return "\n".join(lines)


def describe(info: dict) -> str:
    parts = [f"{info['dtype']}{info['shape']}" if info["shape"] is not None else info["dtype"]]
    parts.append(f"from {info['op'] or 'a factory'}")
    if info["scope"]:
        parts.append(f"in {info['scope']}")
    if info.get("source"):
        parts.append(f"at {info['source']}")
        if info.get("via"):
            parts.append(f"via {info['via']}")
    if info["copy_reason"]:
        parts.append(f"[copy: {info['copy_reason']}]")
    return " ".join(parts)


# ----------------------------------------------------------------------------- limit
_limit_trackers: dict = {}  # device -> the Tracker that describes it when it overflows


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
    limit = None if size is None else parse_bytes(size, "set_limit: size")
    old = _limit_trackers.pop(dev, None)
    if old is not None:
        state.observers.remove(old)
    if size is None:
        state.limit.pop(dev, None)
        return
    state.limit[dev] = limit
    tracker = Tracker(dev, events=False)
    state.observers.append(tracker)
    _limit_trackers[dev] = tracker
    state.oom_report[0] = _oom_report


def get_limit(device: str = "cpu"):
    """The emulated size of `device` in bytes, or None."""
    return state.limit.get(backend.canonical_device(device))


@contextlib.contextmanager
def limit(size, device: str = "cpu"):
    """set_limit for the duration of a `with` block."""
    prev = get_limit(device)
    set_limit(size, device)
    try:
        yield
    finally:
        set_limit(prev, device)
