"""User-facing functions (as torch.nn.functional): the ops registered with functional=True
(see ops/registry.py), plus the fused optimizer step."""

from __future__ import annotations

from . import ops
from .ops import adamw_update_  # noqa: F401 - no graph node, so not in nn.functional

globals().update(ops.names("functional"))
