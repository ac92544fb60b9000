"""ta.backends.cpu: what the CPU path offers (NumPy's kernels; no ISA switch)."""

from __future__ import annotations


def get_cpu_capability() -> str:
    """torch names the SIMD level its kernels were built for; NumPy picks its own at run
    time, so the engine reports 'DEFAULT'."""
    return "DEFAULT"
