"""torch.random's functions over the engine's default generator (ta.random.manual_seed, ...).

The state get_rng_state returns is the generator's JSON-able dict (the seed, NumPy's PCG64
state for the CPU and a draw count per CUDA device), not torch's ByteTensor: it goes back
through set_rng_state, into a checkpoint's metadata, or through json.
"""

from __future__ import annotations

import contextlib

from .creation import Generator, default_generator, get_rng_state, manual_seed, set_rng_state

__all__ = ["Generator", "default_generator", "fork_rng", "get_rng_state", "initial_seed",
           "manual_seed", "seed", "set_rng_state"]


def seed() -> int:
    """Seed the default generator from the operating system's entropy; returns the seed."""
    return default_generator.seed()


def initial_seed() -> int:
    """The seed the default generator was last seeded with."""
    return default_generator.initial_seed()


@contextlib.contextmanager
def fork_rng(devices=None, enabled: bool = True, _caller: str = "fork_rng",
             _devices_kw: str = "devices", device_type: str = "cuda"):
    """Inside the block, draws from the default generator do not move its stream: its state
    (every device's) is saved on entry and restored on exit, exceptions included."""
    if not enabled:
        yield
        return
    state = default_generator.get_state()
    try:
        yield
    finally:
        default_generator.set_state(state)
