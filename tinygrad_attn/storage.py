"""Storage: one flat buffer per allocation, and the registration point the ledger observes.

Every array the engine allocates becomes exactly one Storage. Tensors are strided views
over a Storage; views never create one. A Storage carries a version counter that every
in-place write bumps, shared by all tensors viewing it, so a saved tensor can tell that its
values changed after it was saved.

Each Storage reads who is allocating it (op, phase, scope, category) from the ledger's
state (tinygrad_attn/memory/state.py), updates its live/peak byte counts, checks the
emulated device limit and tells the observers there.
"""

from __future__ import annotations

import itertools
import weakref

from . import backend
from . import shape as shp
from .memory import state as ledger_state  # the ledger's tables (pure Python, no cycle)

_ids = itertools.count(1)


class Storage:
    """One flat allocation: buffer, device, dtype, nbytes, version counter."""

    __slots__ = ("buffer", "device", "dtype", "nbytes", "version", "id", "op", "copy_reason",
                 "phase", "scope", "category", "call", "shape", "history_version",
                 "__weakref__")

    def __init__(self, buffer, device: str, dtype, copy_reason: str | None = None,
                 shape=None) -> None:
        ledger = ledger_state
        nbytes = buffer.nbytes
        sid = next(_ids)
        ref = weakref.ref(self)  # made outside the lock: a weakref can start a collection
        with ledger.lock:  # exact under threads; nothing in here allocates (see state.lock)
            live = ledger.live_bytes.get(device, 0) + nbytes
            cap = ledger.limit.get(device) if ledger.limit else None
            over = cap is not None and live > cap
            if not over:
                ledger.live_bytes[device] = live
                if live > ledger.peak_bytes.get(device, 0):
                    ledger.peak_bytes[device] = live
                ledger.live_storages[sid] = ref
        if over:
            raise _out_of_memory(nbytes, device, dtype, shape, live - nbytes, cap)
        current = ledger.local.labels  # this thread's (see memory/state.py)
        self.buffer = buffer  # 1-D array (numpy or cupy) of the whole allocation
        self.device = device
        self.dtype = dtype
        self.nbytes = nbytes
        self.shape = shape  # shape of the tensor that asked for it
        self.version = 0
        self.history_version = 0  # version at the last in-place op that rewrote history
        self.id = sid
        self.op = current["op"]
        self.phase = current["phase"]  # forward / backward / optimizer / other
        self.scope = current["scope"]  # qualified module name, e.g. "transformer.h.3.attn"
        self.category = current["category"]  # parameter, gradient, optimizer_state, ... or None
        self.copy_reason = copy_reason  # set when the bytes come from pure data movement
        self.call = current["call"]  # which op invocation allocated it (id of its node)
        if ledger.observers:
            with ledger.observer_lock:  # one event at a time, whichever thread allocates
                for obs in tuple(ledger.observers):
                    obs.on_alloc(self)

    def __del__(self) -> None:
        try:
            ledger = ledger_state
            with ledger.lock:
                ledger.live_bytes[self.device] -= self.nbytes
                del ledger.live_storages[self.id]
            if ledger.observers:
                with ledger.observer_lock:
                    for obs in tuple(ledger.observers):
                        obs.on_free(self)
        except Exception:  # noqa: BLE001 - interpreter shutdown: module globals may be gone
            pass

    @property
    def size(self) -> int:
        """Number of elements."""
        return self.buffer.size

    def __repr__(self) -> str:
        why = f", copy of {self.copy_reason}" if self.copy_reason else ""
        return (
            f"Storage(id={self.id}, {self.size} x {self.dtype.name} = {self.nbytes} bytes on "
            f"{self.device}, version={self.version}{why})"
        )


def _out_of_memory(nbytes, device, dtype, shape, live, cap):
    from .errors import OutOfMemoryError

    current, report = ledger_state.local.labels, ledger_state.oom_report[0]
    what = f"{nbytes} bytes ({dtype.name}{list(shape) if shape is not None else ''})"
    msg = (
        f"out of memory on {device} (emulated limit {cap} bytes): {current['op'] or 'an op'} "
        f"tried to allocate {what} with {live} bytes live in phase {current['phase']}"
        + (f", scope {current['scope']}" if current["scope"] else "")
    )
    if report is not None:
        msg += "\n" + report(device)
    return OutOfMemoryError(msg)


def wrap_array(arr, copy_reason: str | None = None):
    """(storage, shape, strides, offset) for a freshly computed array, without copying it."""
    if type(arr) is _HOST_ARRAY and arr.flags.c_contiguous:  # every CPU op result, kept short
        shape = arr.shape
        key = (arr.dtype, arr.strides)
        layout = _host_layouts.get(key)
        if layout is None:
            layout = _host_layout(arr, key)
        device, dtype, strides = layout
        if arr.size == 0:  # NumPy gives an empty array all-zero strides; torch, contiguous ones
            strides = shp.contiguous_strides(shape)
        storage = Storage(arr.ravel(), device, dtype, copy_reason, shape)
        return storage, shape, strides, 0
    if arr.flags.c_contiguous:
        itemsize = arr.itemsize
        flat, strides = arr.reshape(-1), tuple([s // itemsize for s in arr.strides])
    else:
        dense = backend.flat_buffer(arr)
        if dense is None:  # a non-dense result (rare): materialize it contiguously
            arr = backend.ascontiguous(arr)
            dense = backend.flat_buffer(arr)
        flat, strides, _ = dense
    shape = arr.shape
    if arr.size == 0:  # NumPy gives an empty array all-zero strides; torch, contiguous ones
        strides = shp.contiguous_strides(shape)
    storage = Storage(flat, backend.device_of(arr), backend.dtype_of(arr), copy_reason, shape)
    return storage, shape, strides, 0


# What wrap_array derives from a C-contiguous NumPy array's dtype and byte strides (its
# device, DType and strides in elements), kept per (dtype, strides): the same few layouts
# come back on every op call, and deriving them costs more than the lookup.
_HOST_ARRAY = backend.ndarray_types[0]  # NumPy's array type (the first of them, always)
_host_layouts: dict = {}


def _host_layout(arr, key) -> tuple:
    if len(_host_layouts) > 4096:  # a program of many shapes: start over, stay small
        _host_layouts.clear()
    itemsize = arr.itemsize
    layout = (backend.device_of(arr), backend.dtype_of(arr),
              tuple([s // itemsize for s in arr.strides]))
    _host_layouts[key] = layout
    return layout
