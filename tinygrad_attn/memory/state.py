"""The ledger's state: what every Storage reads and writes, and what the engine sets.

Pure Python that imports nothing from the engine, so it sits at the bottom of the layers:
storage, autograd and ops reach it as `from .memory import state as ledger_state` and read
or write its tables by attribute (`ledger_state.current["op"]`). The module's tables are
never rebound, so every module sees the same ones.

Threads. What changes per call is per thread, as PyTorch keeps its grad mode and its
profiler's scopes: the labels (`current`) and the running module calls (`local`), and the
`with` overrides of the switch tables (`habits`, `policies`): a thread's `with` block
changes what that thread sees, and a new thread starts at the defaults. What is
configuration is shared by the process: the switch tables outside any `with` block, the
limit, the observers, and the byte counters, which `lock` keeps exact.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import MutableMapping

# Who is allocating right now: the op being run and its invocation (set by
# autograd.Function.apply and the backward engine), the phase (forward / backward /
# optimizer / other), the module scope ("transformer.h.3.attn") and a category tag.
LABELS = {"op": None, "call": None, "phase": "other", "scope": "", "category": None}


class _Local(threading.local):
    """This thread's labels and module calls; each thread starts with fresh ones.

    The engine reads `local.labels` (a plain dict) on its hot paths and replaces it, never
    edits it, when labels change for a block: a block's labels are a new dict and leaving it
    puts the previous one back, one attribute store each way."""

    def __init__(self) -> None:
        self.labels = dict(LABELS)
        self.module_calls = []  # the nn.Module calls running now, outermost first (scopes.py)
        # inside a backward with create_graph=True (the engine sets it): the nodes recorded
        # now are the gradient's graph, which the ledger counts apart (tracker.on_save)
        self.create_graph = False
        # op observers (below): how deep in op calls this thread is (an op run inside
        # another op's forward is the outer op's work) and whether it is re-running forward
        # work in backward (a checkpoint's rerun, a save policy's recompute)
        self.op_depth = 0
        self.recomputing = 0


local = _Local()


class _PerThread(MutableMapping):
    """A table whose dict in effect depends on the calling thread: `table()` reads it,
    `_swap(new)` makes `new` this thread's and returns what `_unswap` needs to put the
    previous one back (what a `with` block of `override` does). Keys are fixed: `defaults`."""

    __slots__ = ()
    name = ""
    defaults: dict = {}

    def table(self) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def _swap(self, new: dict):  # pragma: no cover - abstract
        raise NotImplementedError

    def _unswap(self, previous) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def __getitem__(self, key):
        return self.table()[key]

    def __setitem__(self, key, value) -> None:
        if key not in self.defaults:
            raise KeyError(f"{self.name}: unknown key {key!r}; expected one of "
                           f"{list(self.defaults)}")
        self.table()[key] = value

    def __delitem__(self, key) -> None:
        raise TypeError(f"{self.name}: keys cannot be deleted")

    def __iter__(self):
        return iter(self.table())

    def __len__(self) -> int:
        return len(self.table())

    def copy(self) -> dict:
        return dict(self.table())

    def __repr__(self) -> str:
        return f"{self.name}({self.table()!r})"


class _Labels(_PerThread):
    """`current`: the calling thread's labels, as a dict-like view (`current["scope"]`)."""

    __slots__ = ()
    name, defaults = "current", LABELS

    def table(self) -> dict:
        return local.labels

    def _swap(self, new: dict) -> dict:
        previous, local.labels = local.labels, new
        return previous

    def _unswap(self, previous: dict) -> None:
        local.labels = previous


current = _Labels()


class _Switches(_PerThread):
    """A table of switches: the process's values, and inside a thread's `with` block (see
    `override`) that thread's own copy, so that one thread's block neither leaks into
    another thread nor is undone by another thread's exit. Writing outside a block sets
    the process's value; inside one, the block's (undone when it ends, as before)."""

    __slots__ = ("name", "defaults", "_local")

    def __init__(self, name: str, values: dict) -> None:
        self.name = name
        self.defaults = dict(values)  # the process's values: the table outside any block
        self._local = threading.local()

    def table(self) -> dict:
        """The dict in effect in this thread: its innermost block's, or the shared one."""
        own = getattr(self._local, "table", None)
        return self.defaults if own is None else own

    def __getitem__(self, key):  # table()[key], one call: the engine reads switches per run
        own = getattr(self._local, "table", None)
        return (self.defaults if own is None else own)[key]

    def _swap(self, new: dict):
        previous = getattr(self._local, "table", None)
        self._local.table = new
        return previous

    def _unswap(self, previous) -> None:
        self._local.table = previous


# Habits of other engines that ta.memory.emulate() switches on, so the cost of each can be
# measured inside this one engine (see ta.memory.emulate for what each does).
habits = _Switches("habits", {"permute_copies": False, "inplace_grad_accumulation": True,
                              "slice_grad_full": False, "late_free": False})

# Save-or-recompute policy of the ops whose output is cheap to rebuild (ta.memory.save_policy).
# "recompute": a later node that needs such an op's output keeps a recipe (the producing node,
# whose own saved tensors suffice to rebuild it) instead of the output itself.
policies = _Switches("policies", {"softmax": "save", "gelu": "save", "layer_norm": "save"})

# Emulated device sizes (ta.memory.set_limit), per device: an allocation past one raises
# OutOfMemoryError. `oom_report[0]` (installed by the memory package) describes what holds
# memory on that device at that moment.
limit: dict[str, int] = {}
oom_report = [None]

# Cheap always-on accounting: bytes live per device and the high-water mark, for the whole
# process. `lock` makes each update exact when threads allocate at once (a read-add-write
# of a dict entry is not atomic under the GIL). Nothing inside it may allocate a Python
# container (a garbage collection could run a Storage's __del__ there, which takes it too):
# only the arithmetic on the counters, and the entry in `live_storages` (id -> weakref to
# every live Storage, made before the lock is taken), from which profile() learns what was
# alive before it started watching.
live_bytes: dict[str, int] = {}
peak_bytes: dict[str, int] = {}
live_storages: dict = {}
lock = threading.Lock()

# Observers get on_alloc(storage) and on_free(storage); if they define them, also
# on_save(node), on_release(node) (saved tensors kept / freed by a graph node) and
# on_accumulate(node, output_nr, how, nbytes) (a gradient summed in backward). The memory
# ledger registers here. They hear every thread; `observer_lock` gives them one event at a
# time (reentrant: an observer's own allocations may free a Storage, whose event nests).
observers: list = []
observer_lock = threading.RLock()

# Op observers hear each op call that is not inside another op's forward: on_op(record), a
# dict with the op's name, scope, phase, "recompute" (forward work re-run in backward) and
# its FLOPs and seconds (autograd.graph.Function.apply). The list is empty unless a caller
# (the memory planner's OpRecorder) is listening: one truth test per op call otherwise.
op_observers: list = []


# A fork while another thread held either lock would leave it held forever in the child
# (that thread does not exist there), and the child's first allocation would wait on it.
# The forking thread takes both (observer_lock first, the order every thread takes them
# in) and lets them go on both sides of the fork: the child's counters are whole.
def _before_fork() -> None:
    observer_lock.acquire()
    lock.acquire()


def _after_fork() -> None:
    lock.release()
    observer_lock.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork,
                        after_in_child=_after_fork)


class _Override:
    """Sets keys of a table on entering a `with` block and restores them on leaving.

    The labels (`current`) and the switch tables are per thread: the block gets a new dict,
    its thread's previous one plus the changes, and leaving puts the previous one back. A
    plain dict is edited in place and its keys restored."""

    __slots__ = ("table", "changes", "previous")

    def __init__(self, table, changes: dict) -> None:
        self.table = table
        self.changes = changes

    def __enter__(self) -> None:
        table = self.table
        if isinstance(table, _PerThread):
            self.previous = table._swap({**table.table(), **self.changes})
        else:
            self.previous = {key: table[key] for key in self.changes}
            table.update(self.changes)

    def __exit__(self, *exc) -> None:
        table = self.table
        if isinstance(table, _PerThread):
            table._unswap(self.previous)
        else:
            table.update(self.previous)

    def __call__(self, fn):
        """As a decorator: fn runs with the keys set (a fresh override per call)."""
        table, changes = self.table, self.changes

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with _Override(table, changes):
                return fn(*args, **kwargs)

        return wrapper


def override(table, **changes) -> _Override:
    """with override(habits, late_free=True): ... sets keys of one of these tables for the
    block and restores what they were (the keys must exist)."""
    unknown = [key for key in changes if key not in table]
    if unknown:
        raise KeyError(f"override: unknown keys {unknown}; expected some of {list(table)}")
    return _Override(table, changes)


def labelled(**changes) -> _Override:
    """with labelled(scope="transformer.h.0", phase="forward"): ... labels what is allocated
    inside (keys of `current`) and restores the previous labels on exit."""
    for key in changes:  # as override(), without reading this thread's labels per key
        if key not in LABELS:
            raise KeyError(f"override: unknown keys {[k for k in changes if k not in LABELS]}"
                           f"; expected some of {list(LABELS)}")
    return _Override(current, changes)
