"""The layers a transformer is made of, each a thin Module over one functional op.

Initialisation follows PyTorch's defaults (the GPT re-initialises as nanoGPT does).
"""

from __future__ import annotations

import math

import tinygrad_attn as ta

from . import functional as F
from .module import Module, Parameter


def _uniform(shape, bound: float) -> ta.Tensor:
    """Samples of U(-bound, bound)."""
    return (ta.rand(*shape) * 2.0 - 1.0) * bound


class Linear(Module):
    """y = x @ W^T + b with PyTorch's (out_features, in_features) weight layout.

    W^T is `weight.mT`, a zero-copy strided view: no transposed copy of the weight is made
    in forward, and its gradient arrives through the transpose's backward (a transpose).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features) if in_features > 0 else 0.0
        # torch's kaiming_uniform_(a=sqrt(5)) for the weight is U(-1/sqrt(in), 1/sqrt(in))
        self.weight = Parameter(_uniform((out_features, in_features), bound))
        self.bias = Parameter(_uniform((out_features,), bound)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class LayerNorm(Module):
    """LayerNorm with an optional bias (nanoGPT's), as one fused op.

    The op saves its input x and 1/std for backward (x is the residual stream in a
    transformer, alive anyway) and rebuilds the normalized input from them.
    """

    def __init__(self, normalized_shape, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape, self.eps = tuple(normalized_shape), eps
        self.weight = Parameter(ta.ones(*self.normalized_shape))
        self.bias = Parameter(ta.zeros(*self.normalized_shape)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, bias={self.bias is not None}, eps={self.eps}"


class Embedding(Module):
    """Rows of a (num_embeddings, embedding_dim) table picked by integer indices."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = Parameter(ta.randn(num_embeddings, embedding_dim))

    def forward(self, idx):
        return F.embedding(idx, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class Dropout(Module):
    """Zeroes elements with probability p while training (scaling the rest by 1/(1-p));
    the identity in eval mode or when p == 0."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class GELU(Module):
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class ReLU(Module):
    def forward(self, x):
        return F.relu(x)
