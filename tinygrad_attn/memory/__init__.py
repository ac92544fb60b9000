"""ta.memory: where the bytes of a training step go, who allocated them, why they live.

Always on and free: `live_bytes()`, `max_live_bytes()`, `reset_peak()` read counters
every Storage updates. Labels: `scope(name)` (nn.Module calls enter `module_scope`, which
names them by their place in the model), `phase(name)` (forward / backward / optimizer /
other) and `tag(tensor, category)` mark the Storages allocated or tagged under them.

`profile()` is the ledger: an observer of every Storage allocation and free, of every
graph node's saved tensors, and of every gradient summed in backward. From those events
it rebuilds, at any moment, the live bytes by category:

    parameter, gradient, optimizer_state   by tag (leaf .grad is tagged by the engine)
    saved        pinned by a graph node's saved tensors (unique storages, counted once)
    temporary    allocated and freed inside one op invocation
    gradient     other backward allocations (partial gradients in flight)
    activation   everything else made in forward
    bucket       DistributedDataParallel's flat gradient buckets (by tag)

and flags copies (pure data movement) with their reason code. `set_limit` emulates a
device of a given size; `memcheck` is gradcheck's memory counterpart for tests.

The package, bottom up:

    state     the global tables every Storage and op reads (pure Python, below storage)
    scopes    the ledger name of each module call (pure Python, below checkpoint)
    counters  byte counters, labels, sizes, save policies, emulated habits
    tracker   the observer of allocations and saved tensors; the emulated device limit
    render    the text report and the timeline pictures
    ledger    Profile (the analysis), step_stats, saved_bytes, memcheck
    planner   plan(): the fastest setting of a step's knobs that fits a budget (a Plan)

Import order. storage.py imports `memory.state` at its top, and importing any submodule
runs this file first, so this package is initialised while storage (and so tensor, which
imports storage) is only half done. That is safe because every module here imports the
engine's modules as modules (`from .. import storage as _storage`) and reads their
attributes only when called, and none imports tensor, autograd or ops at import time
(memcheck imports creation inside the function). Keep it so: a `from ..storage import
Storage` here would fail at import.
"""

from . import scopes, state  # noqa: F401,I001 - first: the bottom of the package
from .counters import (  # noqa: F401
    CATEGORIES, POLICY_OPS, TAGS, available_bytes, current_phase, current_scope, emulate,
    fmt_bytes,
    keep_freed_host_memory, live_bytes, max_live_bytes, parse_bytes, phase, release_host_memory,
    reserved_bytes, reset_peak, save_policies, save_policy, scope, tag,
)
from .scopes import module_scope, scope_of_call  # noqa: F401
from .tracker import get_limit, limit, set_limit  # noqa: F401
from .ledger import (  # noqa: F401
    MemoryBudgetError, OutOfMemoryError, Profile, StepStats, memcheck, plot_html, profile,
    saved_bytes, step_stats,
)
from .planner import Plan, plan  # noqa: F401
