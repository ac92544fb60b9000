"""The ledger's global state: what every Storage reads and writes, and what the engine sets.

Pure Python that imports nothing from the engine, so it sits at the bottom of the layers:
storage, autograd and ops reach it as `from .memory import state as ledger_state` and read
or write its tables by attribute (`ledger_state.current["op"]`). The tables are mutated in
place and never rebound, so every module sees the same ones.
"""

from __future__ import annotations

import functools

# Who is allocating right now: the op being run and its invocation (set by
# autograd.Function.apply and the backward engine), the phase (forward / backward /
# optimizer / other), the module scope ("transformer.h.3.attn") and a category tag.
current = {"op": None, "call": None, "phase": "other", "scope": "", "category": None}

# Habits of other engines that ta.memory.emulate() switches on, so the cost of each can be
# measured inside this one engine (see ta.memory.emulate for what each does).
habits = {"permute_copies": False, "inplace_grad_accumulation": True,
          "slice_grad_full": False, "late_free": False}

# Save-or-recompute policy of the ops whose output is cheap to rebuild (ta.memory.save_policy).
# "recompute": a later node that needs such an op's output keeps a recipe (the producing node,
# whose own saved tensors suffice to rebuild it) instead of the output itself.
policies = {"softmax": "save", "gelu": "save", "layer_norm": "save"}

# Emulated device sizes (ta.memory.set_limit), per device: an allocation past one raises
# OutOfMemoryError. `oom_report[0]` (installed by the memory package) describes what holds
# memory on that device at that moment.
limit: dict[str, int] = {}
oom_report = [None]

# Cheap always-on accounting: bytes live per device and the high-water mark.
live_bytes: dict[str, int] = {}
peak_bytes: dict[str, int] = {}

# Observers get on_alloc(storage) and on_free(storage); if they define them, also
# on_save(node), on_release(node) (saved tensors kept / freed by a graph node) and
# on_accumulate(node, output_nr, how, nbytes) (a gradient summed in backward). The memory
# ledger registers here.
observers: list = []

# The nn.Module calls running now, outermost first (see memory/scopes.py, which keeps it).
module_calls: list = []


class _Override:
    """Sets keys of a dict on entering a `with` block and restores their values on leaving."""

    __slots__ = ("table", "changes", "previous")

    def __init__(self, table: dict, changes: dict) -> None:
        self.table = table
        self.changes = changes

    def __enter__(self) -> None:
        table = self.table
        self.previous = {key: table[key] for key in self.changes}
        table.update(self.changes)

    def __exit__(self, *exc) -> None:
        self.table.update(self.previous)

    def __call__(self, fn):
        """As a decorator: fn runs with the keys set (a fresh override per call)."""
        table, changes = self.table, self.changes

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with _Override(table, changes):
                return fn(*args, **kwargs)

        return wrapper


def override(table: dict, **changes) -> _Override:
    """with override(habits, late_free=True): ... sets keys of one of these tables for the
    block and restores what they were (the keys must exist)."""
    unknown = [key for key in changes if key not in table]
    if unknown:
        raise KeyError(f"override: unknown keys {unknown}; expected some of {list(table)}")
    return _Override(table, changes)


def labelled(**changes) -> _Override:
    """with labelled(scope="transformer.h.0", phase="forward"): ... labels what is allocated
    inside (keys of `current`) and restores the previous labels on exit."""
    return override(current, **changes)
