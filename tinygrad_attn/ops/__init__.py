"""The op layer: one Function class per op, forward and backward side by side.

Each op module registers its public functions with `@op` (registry.py); every registered
function is exported here (ta.ops.exp, ...), and Tensor's methods are those functions.
"""

from . import activations, attention, elementwise, indexing, inplace, math, movement, nn, reduce  # noqa: F401  # noqa: F401
from .registry import REGISTRY, names, op  # noqa: F401

globals().update(names("ops"))
