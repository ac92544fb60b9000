"""ta.memory: where the bytes go.

Always on and cheap: `live_bytes()`, `max_live_bytes()`, `reset_peak()` read counters that
every Storage updates. Attribution: `scope(name)` (nn.Module calls push their qualified
name), `phase(name)` (forward / backward / optimizer / other) and `tag(tensor, category)`
(parameter, optimizer_state, ...) label the Storages allocated or tagged under them.
"""

from __future__ import annotations

import contextlib

from . import storage as _storage

CATEGORIES = ("parameter", "gradient", "optimizer_state", "activation", "saved",
              "temporary")


def live_bytes(device: str = "cpu") -> int:
    """Bytes held by live Storages on `device` right now."""
    return _storage.live(device)


def max_live_bytes(device: str = "cpu") -> int:
    """The highest live_bytes since the start or the last reset_peak()."""
    return _storage.peak_bytes.get(device, 0)


def reset_peak(device: str = "cpu") -> None:
    _storage.reset_peak(device)


@contextlib.contextmanager
def scope(name: str):
    """Attribute allocations (and graph nodes created) inside to the module `name`."""
    cur = _storage.current
    prev = cur["scope"]
    cur["scope"] = name
    try:
        yield
    finally:
        cur["scope"] = prev


@contextlib.contextmanager
def phase(name: str):
    """Mark allocations inside as belonging to a phase: forward, backward, optimizer, other."""
    cur = _storage.current
    prev = cur["phase"]
    cur["phase"] = name
    try:
        yield
    finally:
        cur["phase"] = prev


def tag(tensor, category: str) -> None:
    """Label the Storage under `tensor` with a category (e.g. 'parameter')."""
    if category not in CATEGORIES:
        raise ValueError(f"tag: unknown category {category!r}; expected one of {CATEGORIES}")
    tensor.untyped_storage().category = category
