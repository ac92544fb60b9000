"""The op layer: one Function class per op, forward and backward side by side.

Each op module registers its public functions with `@op` (registry.py); every registered
function is exported here (ta.ops.exp, ...), and Tensor's methods are those functions.
"""

from . import (  # noqa: F401
    _recorded,  # noqa: F401 - recorded arrays for create_graph backwards
    activations,
    attention,
    attention_views,
    binary_math,
    contraction,
    conv,
    elementwise,
    index_write,
    indexing,
    inplace,
    logical,
    losses,
    math,
    movement,
    nn,
    nonlinear,
    norm,
    pooling,
    random,
    recurrent,
    reduce,
    rotary,
    rounding,
    scan,
    shaping,
    sorting,
    stats,
)
from .registry import REGISTRY, names, op  # noqa: F401

globals().update(names("ops"))
