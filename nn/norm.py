"""Normalization layers beyond LayerNorm: RMSNorm, GroupNorm, BatchNorm1d/2d, each a thin
Module over one fused functional op; and the shape layers Identity, Flatten, Unflatten."""

from __future__ import annotations

import tinygrad_attn as ta

from . import functional as F
from .module import Module, Parameter


def _shape_tuple(shape) -> tuple:
    return (shape,) if isinstance(shape, int) else tuple(shape)


class RMSNorm(Module):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dims (eps None: the dtype's
    machine epsilon)."""

    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.normalized_shape, self.eps = _shape_tuple(normalized_shape), eps
        self.elementwise_affine = elementwise_affine
        self.weight = (Parameter(ta.ones(*self.normalized_shape, dtype=dtype, device=device))
                       if elementwise_affine else None)

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class GroupNorm(Module):
    """Normalizes each sample over groups of num_channels // num_groups channels."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by "
                             f"num_groups ({num_groups})")
        self.num_groups, self.num_channels, self.eps, self.affine = (num_groups, num_channels,
                                                                      eps, affine)
        self.weight = Parameter(ta.ones(num_channels, dtype=dtype, device=device)) if affine \
            else None
        self.bias = Parameter(ta.zeros(num_channels, dtype=dtype, device=device)) if affine \
            else None

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class _BatchNorm(Module):
    """Batch statistics while training, running statistics in eval mode (torch's rules).

    running_mean, running_var and num_batches_tracked are buffers (in state_dict, moved by
    to()). momentum=None makes the running statistics a cumulative average over the
    batches seen (factor 1 / num_batches_tracked).
    """

    expected_ndims: tuple = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        kw = {"dtype": dtype, "device": device}
        self.weight = Parameter(ta.ones(num_features, **kw)) if affine else None
        self.bias = Parameter(ta.zeros(num_features, **kw)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", ta.zeros(num_features, **kw))
            self.register_buffer("running_var", ta.ones(num_features, **kw))
            self.register_buffer("num_batches_tracked",
                                 ta.tensor(0, dtype=ta.int64, device=device))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            with ta.no_grad():
                self.running_mean.zero_()
                self.running_var.fill_(1.0)
                self.num_batches_tracked.zero_()

    def forward(self, x):
        if x.ndim not in self.expected_ndims:
            wanted = " or ".join(f"{n}D" for n in self.expected_ndims)
            raise ValueError(f"{type(self).__name__}: expected {wanted} input (got {x.ndim}D "
                             f"input of shape {tuple(x.shape)})")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            with ta.no_grad():
                self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked.item())
        use_batch_stats = self.training or self.running_mean is None
        keep = not self.training or self.track_running_stats
        return F.batch_norm(x, self.running_mean if keep else None,
                            self.running_var if keep else None, self.weight, self.bias,
                            use_batch_stats, factor, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Over (N, C) or (N, C, L) input, per channel C."""

    expected_ndims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Over (N, C, H, W) input, per channel C."""

    expected_ndims = (4,)


class Identity(Module):
    """Returns its input; any constructor arguments are ignored, as torch."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def forward(self, x):
        return x


class Flatten(Module):
    """x.flatten(start_dim, end_dim): a view when the strides allow (dims 1.. by default)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """x.unflatten(dim, unflattened_size): dim split into the given sizes (a view)."""

    def __init__(self, dim: int, unflattened_size) -> None:
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, x):
        return x.unflatten(self.dim, self.unflattened_size)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
