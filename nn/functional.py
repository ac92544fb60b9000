"""nn.functional: the engine's functional ops under torch.nn.functional's names, plus linear."""

from __future__ import annotations

from tinygrad_attn import ops as _ops

globals().update(_ops.names("functional"))  # each op declares whether it is functional


def linear(x, weight, bias=None):
    """x @ weight^T + bias, weight laid out (out_features, in_features) as in PyTorch.

    weight.mT is a strided view, so no transposed copy of the weight is made. The bias is
    added in place into the fresh matmul output (matmul saves its inputs, not its output),
    so the layer allocates one output, not two.
    """
    y = x @ weight.mT
    if bias is None:
        return y
    return y.add_(bias) if x.ndim > 1 else y + bias  # a 1-D x gives a squeezed view


__all__ = [*_ops.names("functional"), "linear"]

from .attention import multi_head_attention_forward  # noqa: E402,F401 - written in nn

__all__.append("multi_head_attention_forward")
