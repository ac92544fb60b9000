"""ta.linalg: the names torch has under torch.linalg that the engine implements."""

from __future__ import annotations

from .ops.stats import vector_norm  # noqa: F401

__all__ = ["vector_norm"]
