"""ta.backends.cudnn: torch's cuDNN switches, recorded without effect (the engine has no
cuDNN; its convolutions are its own, deterministic on the CPU)."""

from __future__ import annotations

enabled = True
benchmark = False
deterministic = False
allow_tf32 = True


def is_available() -> bool:
    """False: the engine does not use cuDNN."""
    return False


def version() -> None:
    """None, as torch reports without cuDNN."""
    return None
