"""nn.functional: the engine's functional ops under torch.nn.functional's names (linear is
the engine's Linear node: x @ weight^T with the bias added into the GEMM's output)."""

from __future__ import annotations

from tinygrad_attn import ops as _ops

globals().update(_ops.names("functional"))  # each op declares whether it is functional

__all__ = [*_ops.names("functional")]

from .attention import multi_head_attention_forward  # noqa: E402,F401 - written in nn

__all__.append("multi_head_attention_forward")
