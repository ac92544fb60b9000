"""Always-on, free accounting and the labels the ledger reads.

Counters: `live_bytes()`, `max_live_bytes()`, `reset_peak()` read the tables every Storage
updates; `reserved_bytes()` asks the allocator. Labels: `scope(name)`, `phase(name)` and
`tag(tensor, category)` mark the Storages allocated or tagged under them. Switches:
`save_policy` / `save_policies` (keep or rebuild an op's output for backward) and `emulate`
(the habits of other engines). Sizes: `parse_bytes`, `fmt_bytes`.
"""

from __future__ import annotations

import contextlib

from .. import backend
from . import state

CATEGORIES = ("parameter", "gradient", "optimizer_state", "saved", "activation", "temporary",
              "bucket")
TAGS = CATEGORIES  # what tag() accepts


# ----------------------------------------------------------------------------- counters
def live_bytes(device: str = "cpu") -> int:
    """Bytes held by live Storages on `device` right now."""
    return state.live_bytes.get(backend.canonical_device(device), 0)


def max_live_bytes(device: str = "cpu") -> int:
    """The highest live_bytes since the start or the last reset_peak()."""
    return state.peak_bytes.get(backend.canonical_device(device), 0)


def reset_peak(device: str = "cpu") -> None:
    device = backend.canonical_device(device)
    with state.lock:
        state.peak_bytes[device] = state.live_bytes.get(device, 0)


def reserved_bytes(device: str = "cpu"):
    """Bytes the allocator holds from the system (live + cached), beside live_bytes.

    cpu: the process's malloc heap (glibc; None elsewhere), which also holds Python objects
    and other libraries' memory; cuda: CuPy's default memory pool."""
    return backend.reserved_bytes(backend.canonical_device(device))


def available_bytes(device: str = "cpu"):
    """Bytes `device` could still give this process (cpu: the system's MemAvailable), or
    None where that cannot be read: for turning an impossible size into one line."""
    return backend.available_bytes(backend.canonical_device(device))


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
def scope(name: str):
    """Attribute allocations (and graph nodes created) inside to the module `name`."""
    return state.labelled(scope=name)


def phase(name: str):
    """Mark allocations inside as belonging to a phase: forward, backward, optimizer, other."""
    return state.labelled(phase=name)


def current_phase() -> str:
    return state.local.labels["phase"]


def current_scope() -> str:
    return state.local.labels["scope"]


def tag(tensor, category: str) -> None:
    """Label the Storage under `tensor` with a category (e.g. 'parameter')."""
    if category not in TAGS:
        raise ValueError(f"tag: unknown category {category!r}; expected one of {TAGS}")
    tensor.untyped_storage().category = category


# ----------------------------------------------------------------------------- sizes
_SIZE_FORMS = "a byte count >= 0 (int) or a string such as '6GiB', '512MB' or '100k'"


def parse_bytes(size, arg: str = "size") -> int:
    """'6GiB', '512MB', '100k', 1024 -> bytes. Negative, NaN and infinite sizes are
    ValueErrors naming `arg` and the accepted forms."""
    if not isinstance(size, (bool, float, str)) and hasattr(size, "__index__"):
        size = size.__index__()  # a NumPy integer, say
    if isinstance(size, bool) or not isinstance(size, (int, float, str)):
        raise TypeError(f"{arg}: expected {_SIZE_FORMS}, got {type(size).__name__} {size!r}")
    text = str(size).strip().replace(" ", "")
    units = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
             "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4,
             "tb": 1000**4, "tib": 1024**4}
    num = text.rstrip("aAbBgGiIkKmMtT") if isinstance(size, str) else text
    unit = text[len(num):].lower()
    try:
        value = float(num)
    except ValueError:
        value = None
    if unit not in units or value is None:
        raise ValueError(f"{arg}: cannot parse a size from {size!r}; expected {_SIZE_FORMS}")
    if not (0 <= value < float("inf")):  # NaN fails both comparisons
        raise ValueError(f"{arg}: a size must be finite and >= 0, got {size!r}; expected "
                         f"{_SIZE_FORMS}")
    if isinstance(size, int):
        return size
    return int(value * units[unit])


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"  # pragma: no cover


# ----------------------------------------------------------------------------- policies
POLICY_OPS = ("softmax", "gelu", "layer_norm")


def save_policy(op: str | None = None, mode: str | None = None):
    """Get or set whether an op's output is kept for backward ("save") or rebuilt from what
    the op saved anyway ("recompute"): softmax, gelu and layer_norm.

    save_policy() -> the whole table; save_policy("gelu") -> its mode;
    save_policy("gelu", "recompute") sets it. `save_policies(...)` scopes a change.
    """
    if op is None:
        return state.policies.copy()
    if op not in POLICY_OPS:
        raise ValueError(f"save_policy: unknown op {op!r}; expected one of {POLICY_OPS}")
    if mode is None:
        return state.policies[op]
    if mode not in ("save", "recompute"):
        raise ValueError(f"save_policy: mode must be 'save' or 'recompute', got {mode!r}")
    state.policies[op] = mode
    return mode


@contextlib.contextmanager
def save_policies(**modes):
    """with ta.memory.save_policies(gelu="recompute", layer_norm="recompute"): ...

    The block's policies are this thread's: another thread keeps the process's table (what
    save_policy sets outside any such block)."""
    for op, mode in modes.items():  # checked before the block: the errors of save_policy
        if op not in POLICY_OPS:
            raise ValueError(f"save_policy: unknown op {op!r}; expected one of {POLICY_OPS}")
        if mode not in ("save", "recompute"):
            raise ValueError(f"save_policy: mode must be 'save' or 'recompute', got {mode!r}")
    with state.override(state.policies, **modes):
        yield


# ----------------------------------------------------------------------------- habits
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
    return state.override(state.habits, permute_copies=permute_copies,
                          inplace_grad_accumulation=inplace_grad_accumulation,
                          slice_grad_full=slice_grad_full, late_free=late_free)
