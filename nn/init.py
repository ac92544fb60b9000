"""nn.init: fill a tensor in place, under no_grad, from the engine's seeded generator.

torch.nn.init's names, arguments and formulas: after `ta.manual_seed(s)` the same calls
give the same values. Each function returns the tensor it filled.
"""

from __future__ import annotations

import math
import warnings

import tinygrad_attn as ta

_LINEAR_LIKE = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                "conv_transpose2d", "conv_transpose3d", "sigmoid")


def calculate_gain(nonlinearity: str, param=None) -> float:
    """The recommended scale of the weights feeding `nonlinearity` (torch's table)."""
    if nonlinearity in _LINEAR_LIKE:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = param
        else:
            raise ValueError(f"calculate_gain: negative_slope {param!r} is not a valid number")
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def _calculate_fan_in_and_fan_out(tensor) -> tuple[int, int]:
    if tensor.ndim < 2:
        raise ValueError(f"fan in and fan out can not be computed for a tensor with fewer than "
                         f"2 dimensions (shape {tuple(tensor.shape)})")
    receptive = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"kaiming init: mode {mode!r} not supported, use fan_in or fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def _write(tensor, values):
    with ta.no_grad():
        tensor.copy_(values)
    return tensor


def _like(sampler, tensor, generator):
    return sampler(*tensor.shape, dtype=tensor.dtype, device=tensor.device, generator=generator)


def uniform_(tensor, a: float = 0.0, b: float = 1.0, generator=None):
    """Samples of U(a, b)."""
    return _write(tensor, _like(ta.rand, tensor, generator) * (b - a) + a)


def normal_(tensor, mean: float = 0.0, std: float = 1.0, generator=None):
    """Samples of N(mean, std^2)."""
    return _write(tensor, _like(ta.randn, tensor, generator) * std + mean)


def trunc_normal_(tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0,
                  b: float = 2.0, generator=None):
    """N(mean, std^2) conditioned on [a, b]: a uniform sample between the normal CDF at a
    and at b, mapped back through the inverse CDF (erfinv), as torch."""
    def cdf(x):
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    lo, hi = cdf((a - mean) / std), cdf((b - mean) / std)
    u = _like(ta.rand, tensor, generator) * (2 * hi - 2 * lo) + (2 * lo - 1)
    values = ta.erfinv(u) * (std * math.sqrt(2.0)) + mean
    return _write(tensor, values.clamp(a, b))


def constant_(tensor, val: float):
    with ta.no_grad():
        tensor.fill_(val)
    return tensor


def ones_(tensor):
    return constant_(tensor, 1.0)


def zeros_(tensor):
    return constant_(tensor, 0.0)


def xavier_uniform_(tensor, gain: float = 1.0, generator=None):
    """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = math.sqrt(3.0) * gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor, gain: float = 1.0, generator=None):
    """N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)), generator)


def _kaiming_std(tensor, a, mode, nonlinearity):
    return calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))


def kaiming_uniform_(tensor, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu", generator=None):
    """U(-bound, bound) with bound = gain(nonlinearity, a) * sqrt(3 / fan)."""
    if 0 in tensor.shape:
        warnings.warn("kaiming_uniform_: initializing a zero-element tensor is a no-op",
                      stacklevel=2)
        return tensor
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a: float = 0.0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu", generator=None):
    """N(0, std^2) with std = gain(nonlinearity, a) / sqrt(fan)."""
    if 0 in tensor.shape:
        warnings.warn("kaiming_normal_: initializing a zero-element tensor is a no-op",
                      stacklevel=2)
        return tensor
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity), generator)


def _orthonormal_columns(a):
    """The Q of a = QR (a tall, full rank) with R's diagonal positive: Gram-Schmidt, each
    column projected out twice against the previous ones (one pass loses orthogonality
    in floating point; two are enough)."""
    columns = []
    for j in range(a.shape[1]):
        v = a[:, j]
        if columns:
            q = ta.stack(columns, dim=1)  # (m, j)
            for _ in range(2):
                v = v - q @ (q.mT @ v)
        columns.append(v / v.norm())
    return ta.stack(columns, dim=1)


def orthogonal_(tensor, gain: float = 1.0, generator=None):
    """A (semi-)orthogonal matrix times gain: the Q factor of a standard normal sample
    (with R's diagonal positive), over the tensor viewed as (shape[0], -1)."""
    if tensor.ndim < 2:
        raise ValueError(f"orthogonal_: only tensors with 2 or more dimensions are supported, "
                         f"got shape {tuple(tensor.shape)}")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    with ta.no_grad():
        flat = ta.randn(rows, cols, dtype=tensor.dtype, device=tensor.device,
                        generator=generator)
        if rows < cols:
            flat = flat.mT
        q = _orthonormal_columns(flat)
        if rows < cols:
            q = q.mT
        return _write(tensor, q.reshape(tensor.shape) * gain)


__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_",
           "zeros_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
           "kaiming_normal_", "orthogonal_"]
