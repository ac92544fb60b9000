"""User-facing functions (as torch.nn.functional): thin names over the ops."""

from __future__ import annotations

from . import ops
from .ops import (  # noqa: F401
    adamw_update_,
    cat,
    cross_entropy,
    dropout,
    embedding,
    gather,
    gelu,
    index_select,
    layer_norm,
    log_softmax,
    logsumexp,
    masked_fill,
    matmul,
    relu,
    scaled_dot_product_attention,
    sigmoid,
    silu,
    softmax,
    stack,
    tanh,
    tril,
    triu,
    where,
)


def clamp(x, min=None, max=None):  # noqa: A002
    return ops.clamp(x, min, max)


def exp(x):
    return ops.exp(x)


def log(x):
    return ops.log(x)


def sqrt(x):
    return ops.sqrt(x)


def rsqrt(x):
    return ops.rsqrt(x)


def maximum(a, b):
    return ops.maximum(a, b)


def minimum(a, b):
    return ops.minimum(a, b)
