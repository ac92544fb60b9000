"""A backward run, step by step: `with ta.autograd.trace() as tr: loss.backward()`.

The trace is an observer of two kinds. The ledger's observers (memory.state) already hear
which saved tensors a node frees and how a fan-in sum went; the engine's `_tracers` hear the
rest: the gradients a node receives and hands on, a slice's gradient routed into a buffer
shared with its sibling slices, and a leaf's gradient added into .grad. Each becomes one
small record in `tr.events`, in the order the engine did it; `print(tr)` numbers them.

Norms are computed on the raw arrays, outside the ledger, so a traced run allocates (and
computes) exactly what an untraced one does.
"""

from __future__ import annotations

import math
import threading
from dataclasses import asdict, dataclass, field

from ..memory import state as ledger_state
from . import engine


# ----------------------------------------------------------------------------- the records
@dataclass(frozen=True)
class Grad:
    """One gradient as it passed: shape, dtype name, L2 norm. `lazy` is "slice" or
    "reshape" for a gradient not yet written into a buffer of its own (see engine)."""

    shape: tuple
    dtype: str
    norm: float
    lazy: str = ""

    def __str__(self) -> str:
        lazy = f" {self.lazy}" if self.lazy else ""
        return f"{_shape(self.shape)} |g|={self.norm:.4g}{lazy}"


@dataclass
class NodeRun:
    """A node's backward ran: what it received (one per output) and handed on (one per
    input edge; None where no gradient went)."""

    name: str
    scope: str
    received: tuple
    handed: tuple = ()
    kind: str = field(default="run", init=False)

    def describe(self) -> str:
        where = f" [{self.scope}]" if self.scope else ""
        got = ", ".join(_grad(g) for g in self.received)
        out = ", ".join(_grad(g) for g in self.handed)
        return f"{self.name}{where}: got {got} -> hands on {out}"


@dataclass
class Freed:
    """A node let go of its saved tensors after its backward: (shape, bytes of the storage
    each pins, is it a parameter's) per tensor, and `bytes`, each storage once, parameters
    left out (what ta.memory.saved_bytes counts)."""

    name: str
    tensors: tuple
    bytes: int
    kind: str = field(default="free", init=False)

    def describe(self) -> str:
        listed = ", ".join(f"{_shape(s)} {b} B" + (" (parameter)" if p else "")
                           for s, b, p in self.tensors)
        return f"{self.name} frees {listed}: {self.bytes} B"


@dataclass
class Accumulated:
    """A second (or later) gradient summed into slot `slot` of the node `into`: "in-place"
    (added into a buffer the engine owns) or "new-buffer" (a sum allocated). `bytes`: the
    size of the gradient added."""

    into: str
    slot: int
    how: str
    bytes: int
    kind: str = field(default="sum", init=False)

    def describe(self) -> str:
        return f"into {self.into} slot {self.slot}: {self.how}, {self.bytes} B added"


@dataclass
class Routed:
    """A lazy gradient (a slice's piece, or a reshape's laid-out gradient) handed to slot
    `slot` of `into`, whose gradient has shape `target_shape`: "first" (held as it is),
    "new-buffer" (one buffer of the target's shape allocated, the pieces so far written into
    it) or "in-place" (written into that shared buffer)."""

    into: str
    slot: int
    lazy: str
    shape: tuple
    target_shape: tuple
    how: str
    kind: str = field(default="route", init=False)

    def describe(self) -> str:
        return (f"{self.lazy} {_shape(self.shape)} of {_shape(self.target_shape)} into "
                f"{self.into} slot {self.slot}: {_HOW.get(self.how, self.how)}")


@dataclass
class LeafGrad:
    """A leaf's gradient: `how` is "set" (it becomes .grad) or "added" (into .grad, in
    place). `name` is the leaf's name when given to trace(params=...)."""

    name: str
    shape: tuple
    dtype: str
    norm: float
    how: str
    bytes: int
    kind: str = field(default="leaf", init=False)

    def describe(self) -> str:
        where = "becomes .grad" if self.how == "set" else "added into .grad in place"
        return (f"{self.name or 'leaf'} {_shape(self.shape)} |g|={self.norm:.4g}: {where}, "
                f"{self.bytes} B")


_HOW = {"first": "held until a sibling arrives", "new-buffer": "shared buffer allocated",
        "in-place": "written into the shared buffer"}


# ----------------------------------------------------------------------------- the trace
class Trace:
    """The events of the backward runs inside a `with trace():` block, in order."""

    def __init__(self, params: dict | None = None):
        self.events: list = []
        self._names = {id(t): name for name, t in (params or {}).items()}
        self._freed: dict = {}  # storage id -> bytes, over all Freed events
        self._running: list = []  # NodeRuns waiting for what they hand on; a checkpoint's
        # backward runs a backward of its own in between, whose events come inside its run
        self._routed = False  # a lazy gradient was just summed: its Routed says it already

    # -- context manager ---------------------------------------------------------------
    def __enter__(self) -> Trace:
        self.thread = threading.get_ident()  # the backward runs of this thread only
        engine._tracers.append(self)
        ledger_state.observers.append(self)
        return self

    def __exit__(self, *exc) -> None:
        engine._tracers.remove(self)
        ledger_state.observers.remove(self)

    # -- what the engine tells it ------------------------------------------------------
    def on_receive(self, node, grads: list) -> None:
        run = NodeRun(node.name, node.scope, tuple(_info(g) for g in grads))
        self.events.append(run)
        self._running.append(run)

    def on_hand_on(self, node, results: tuple) -> None:
        self._running.pop().handed = tuple(
            None if edge is None else _info(g) for edge, g in zip(node.next_functions, results)
        )

    def on_lazy(self, node, slot: int, g, how: str) -> None:
        lazy = "slice" if type(g) is engine.SliceGrad else "reshape"
        self.events.append(Routed(self._label(node), slot, lazy, tuple(g.grad.shape),
                                  tuple(g.shape), how))
        self._routed = how != "first"  # the ledger's on_accumulate for it comes next

    def on_leaf(self, var, g) -> None:
        self.events.append(LeafGrad(self._names.get(id(var), ""), tuple(g.shape),
                                    g.dtype.name, _norm(g), "set" if var.grad is None
                                    else "added", g.nbytes))

    # -- what the ledger's observers are told ------------------------------------------
    def on_release(self, node) -> None:
        if threading.get_ident() != self.thread or not node.saved_tensor_list():
            return  # it kept only recipes or Nones: nothing of its own to free
        tensors, unique = [], {}
        for t in node.saved_tensor_list():
            st = t.untyped_storage()
            parameter = st.category == "parameter"
            tensors.append((tuple(t.shape), st.nbytes, parameter))
            if not parameter:
                unique[st.id] = st.nbytes
        self._freed.update(unique)
        self.events.append(Freed(node.name, tuple(tensors), sum(unique.values())))

    def on_accumulate(self, node, slot: int, how: str, nbytes: int) -> None:
        if threading.get_ident() != self.thread:
            return  # another thread's backward
        if self._routed:
            self._routed = False
            return
        self.events.append(Accumulated(self._label(node), slot, how, nbytes))

    def on_alloc(self, storage) -> None:
        pass

    def on_free(self, storage) -> None:
        pass

    def _label(self, node) -> str:
        """A node's name; a leaf's AccumulateGrad with the leaf's name when known."""
        name = self._names.get(id(getattr(node, "variable", None)))
        return f"{node.name}({name})" if name else node.name

    # -- reading it --------------------------------------------------------------------
    @property
    def runs(self) -> list:
        """The NodeRun events: the nodes run, in order."""
        return [e for e in self.events if e.kind == "run"]

    def freed_bytes(self) -> int:
        """Saved bytes freed over the run, each storage once, parameters left out."""
        return sum(self._freed.values())

    def to_list(self) -> list:
        """The events as plain dicts (tuples kept), for tests and JSON."""
        return [asdict(e) for e in self.events]

    def __str__(self) -> str:
        width = len(str(len(self.events)))
        lines = [f"{'#':>{width}}  {'event':<6} what"]
        for i, e in enumerate(self.events, 1):
            lines.append(f"{i:>{width}}  {e.kind:<6} {e.describe()}")
        return "\n".join(lines)

    def print(self) -> None:
        print(self)


def trace(params: dict | None = None) -> Trace:
    """Record the backward runs of the `with` block: `with ta.autograd.trace() as tr:
    loss.backward()`, then `print(tr)` or read `tr.events`. `params` (name -> leaf tensor,
    e.g. dict(model.named_parameters())) names the leaves in the record."""
    return Trace(params)


# ----------------------------------------------------------------------------- helpers
def _info(g) -> Grad | None:
    if g is None:
        return None
    if type(g) in engine._LAZY:
        lazy = "slice" if type(g) is engine.SliceGrad else "reshape"
        return Grad(tuple(g.shape), g.grad.dtype.name, _norm(g.grad), lazy)
    return Grad(tuple(g.shape), g.dtype.name, _norm(g))


def _norm(t) -> float:
    """L2 norm in float64 on the raw array: nothing goes through the ledger."""
    a = t._array().astype("float64")
    return math.sqrt(float((a * a).sum()))


def _grad(g: Grad | None) -> str:
    return "None" if g is None else str(g)


def _shape(shape: tuple) -> str:
    return "(" + ", ".join(str(n) for n in shape) + ")"
