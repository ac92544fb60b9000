"""The layers a transformer is made of, each a thin Module over one functional op.

Initialisation follows PyTorch's defaults (the GPT re-initialises as nanoGPT does).
"""

from __future__ import annotations

import math

import tinygrad_attn as ta

from . import functional as F
from . import init
from .module import Module, Parameter


class Linear(Module):
    """y = x @ W^T + b with PyTorch's (out_features, in_features) weight layout.

    W^T is `weight.mT`, a zero-copy strided view: no transposed copy of the weight is made
    in forward, and its gradient arrives through the transpose's backward (a transpose).
    Initialised as torch: weight kaiming_uniform_(a=sqrt(5)), i.e. U(-1/sqrt(in),
    1/sqrt(in)), and bias U(-1/sqrt(in), 1/sqrt(in)).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        kw = {"dtype": dtype, "device": device}
        self.weight = Parameter(ta.empty(out_features, in_features, **kw))
        if bias:
            self.bias = Parameter(ta.empty(out_features, **kw))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class LayerNorm(Module):
    """Normalizes over the last len(normalized_shape) dims, as one fused op; weight (ones)
    and bias (zeros) when elementwise_affine, bias=False leaving the bias out (nanoGPT's).

    The op saves its input x and 1/std for backward (x is the residual stream in a
    transformer, alive anyway) and rebuilds the normalized input from them.
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape, self.eps = tuple(normalized_shape), eps
        self.elementwise_affine = elementwise_affine
        kw = {"dtype": dtype, "device": device}
        if elementwise_affine:
            self.weight = Parameter(ta.ones(*self.normalized_shape, **kw))
        else:
            self.register_parameter("weight", None)
        if elementwise_affine and bias:
            self.bias = Parameter(ta.zeros(*self.normalized_shape, **kw))
        else:
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}")


def _padding_row(padding_idx, num_embeddings: int):
    """padding_idx counted from the end when negative (torch's rule), or None."""
    if padding_idx is None:
        return None
    if not -num_embeddings <= padding_idx < num_embeddings:
        raise AssertionError("Padding_idx must be within num_embeddings")
    return padding_idx + num_embeddings if padding_idx < 0 else padding_idx


class _EmbeddingRowGrads(ta.Function):
    """y = weight[index];  gw = g scatter-added by index, less the padding row's share and,
    with scale_grad_by_freq, each share divided by how often its index occurs in index.

    Saves the index (integers), not the weight, as the plain embedding op does.
    """

    @staticmethod
    def forward(ctx, weight, index, padding_idx, scale_grad_by_freq):
        ctx.weight_shape = tuple(weight.shape)
        ctx.padding_idx, ctx.scale_grad_by_freq = padding_idx, scale_grad_by_freq
        out = F.embedding(index, weight)  # grad mode is off here: the plain lookup
        ctx.save_for_backward(index)
        return out

    @staticmethod
    def backward(ctx, g):
        # tensor methods only: with create_graph, g and index are the engine's recording
        # proxies, which take methods (and record them) but not ta's free functions
        (index,) = ctx.saved_tensors
        rows, dim = ctx.weight_shape
        flat = index.reshape(-1)
        g = g.reshape(-1, dim)  # (N, D), N = index.numel()
        if ctx.scale_grad_by_freq:
            counts = g.new_zeros((rows,)).index_add_(0, flat, g.new_ones((flat.shape[0],)))
            g = g / counts.index_select(0, flat).unsqueeze(1)
        if ctx.padding_idx is not None:  # a fill, not a product: an inf or nan stays out
            g = g.masked_fill((flat == ctx.padding_idx).unsqueeze(1), 0.0)
        return g.new_zeros((rows, dim)).index_add_(0, flat, g), None, None, None


def _renorm_rows_(weight, index, max_norm: float, norm_type: float) -> None:
    """Each row of weight picked by index whose norm_type-norm exceeds max_norm is scaled in
    place by max_norm / (norm + 1e-7), as torch's embedding_renorm_; other rows are kept."""
    with ta.no_grad():
        flat = index.reshape(-1)
        picked = F.embedding(flat, weight)  # its checks (index dtype and range) first
        norms = picked.norm(p=norm_type, dim=1, keepdim=True)
        scale = ta.where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
        weight.index_copy_(0, flat, picked * scale)


def _embedding(index, weight, padding_idx=None, max_norm=None, norm_type: float = 2.0,
              scale_grad_by_freq: bool = False, sparse: bool = False):
    """torch.nn.functional.embedding's arguments over the engine's embedding op, for
    nn.Embedding (nn.functional.embedding is that op itself, as the registry has it).

    padding_idx: that row's gradient is always zero (its value is looked up as it is);
    max_norm: the looked-up rows are first renormalised in place; scale_grad_by_freq:
    each row's gradient is divided by how often its index occurs in index.
    """
    if sparse:
        raise NotImplementedError("embedding: sparse=True needs sparse gradients, which the "
                                  "engine does not have; use sparse=False (a dense gradient)")
    padding_idx = _padding_row(padding_idx, weight.shape[0])
    if max_norm is not None:
        _renorm_rows_(weight, index, max_norm, norm_type)
    if padding_idx is None and not scale_grad_by_freq:
        return F.embedding(index, weight)
    return _EmbeddingRowGrads.apply(weight, index, padding_idx, scale_grad_by_freq)


class Embedding(Module):
    """Rows of a (num_embeddings, embedding_dim) table picked by integer indices.

    Initialised as torch: N(0, 1), the padding_idx row (if any) zeroed; a given _weight is
    used as it is. from_pretrained builds one over a given table.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx=None,
                 max_norm=None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, _weight=None, _freeze: bool = False, device=None,
                 dtype=None) -> None:
        super().__init__()
        if sparse:
            raise NotImplementedError("Embedding: sparse=True needs sparse gradients, which "
                                      "the engine does not have; use sparse=False")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = _padding_row(padding_idx, num_embeddings)
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        if _weight is None:
            kw = {"dtype": dtype, "device": device}
            self.weight = Parameter(ta.empty(num_embeddings, embedding_dim, **kw),
                                    requires_grad=not _freeze)
            self.reset_parameters()
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise AssertionError("Shape of weight does not match num_embeddings and "
                                     "embedding_dim")
            self.weight = Parameter(_weight, requires_grad=not _freeze)

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        if self.padding_idx is not None:
            with ta.no_grad():
                self.weight[self.padding_idx].fill_(0.0)

    def forward(self, idx):
        return _embedding(idx, self.weight, self.padding_idx, self.max_norm, self.norm_type,
                         self.scale_grad_by_freq, self.sparse)

    @classmethod
    def from_pretrained(cls, embeddings, freeze: bool = True, padding_idx=None, max_norm=None,
                        norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                        sparse: bool = False):
        """An Embedding over `embeddings` (2-D), frozen unless freeze=False."""
        if embeddings.ndim != 2:
            raise AssertionError("Embeddings parameter is expected to be 2-dimensional")
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx=padding_idx, max_norm=max_norm,
                   norm_type=norm_type, scale_grad_by_freq=scale_grad_by_freq, sparse=sparse,
                   _weight=embeddings, _freeze=freeze)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        if self.scale_grad_by_freq:
            s += f", scale_grad_by_freq={self.scale_grad_by_freq}"
        return s


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
