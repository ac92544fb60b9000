"""torch.nn.utils' gradient helpers (clip_grad_norm_, clip_grad_value_, get_total_norm,
clip_grads_with_norm_, parameters_to_vector, vector_to_parameters) and nanoGPT's
learning-rate schedule.

`foreach` is accepted for torch's signatures: it picks among torch's implementations and
changes nothing here. The clipping runs under `ta.no_grad()` and
`ta.memory.phase("optimizer")`, in place on the gradients.
"""

from __future__ import annotations

import math
import warnings

import tinygrad_attn as ta


def _as_list(parameters) -> list:
    return [parameters] if isinstance(parameters, ta.Tensor) else list(parameters)


def _grads(parameters) -> list:
    return [p.grad for p in _as_list(parameters) if p.grad is not None]


def get_total_norm(tensors, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                   foreach=None):
    """The norm_type-norm of all `tensors` together, as if concatenated into one vector, as
    a 0-d tensor (0.0 for none). RuntimeError, as torch's, when error_if_nonfinite and it
    is nan or inf."""
    tensors = _as_list(tensors)
    norm_type = float(norm_type)
    if not tensors:
        return ta.tensor(0.0)
    device = tensors[0].device
    with ta.no_grad():
        norms = [_norm(t, norm_type).to(device) for t in tensors]
        total = _norm(ta.stack(norms), norm_type)
    if error_if_nonfinite and not math.isfinite(total.item()):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is "
            "non-finite, so it cannot be clipped. To disable this error and scale the "
            "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")
    return total


def clip_grads_with_norm_(parameters, max_norm: float, total_norm, foreach=None) -> None:
    """Scale the gradients in place by min(1, max_norm / (total_norm + 1e-6))."""
    grads = _grads(parameters)
    if not grads:
        return
    with ta.no_grad(), ta.memory.phase("optimizer"):
        scale = ta.clamp(max_norm / (total_norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(scale.to(g.device))


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach=None):
    """Scale the gradients in place so that their total norm is at most `max_norm`.

    The total norm is the `norm_type`-norm of all gradients together, as if concatenated into
    one vector (torch.nn.utils.clip_grad_norm_). Returns it as a 0-d Tensor, before clipping.
    Gradients are multiplied by min(1, max_norm / (total + 1e-6)).
    """
    parameters = _as_list(parameters)
    grads = _grads(parameters)
    if not grads:
        return ta.tensor(0.0)
    with ta.memory.phase("optimizer"):
        total = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(parameters, max_norm, total, foreach)
    return total


def clip_grad_norm(parameters, max_norm: float, norm_type: float = 2.0,
                   error_if_nonfinite: bool = False, foreach=None):
    """The deprecated name of clip_grad_norm_, as torch keeps it (with torch's warning)."""
    warnings.warn("`torch.nn.utils.clip_grad_norm` is now deprecated in favor of "
                  "`torch.nn.utils.clip_grad_norm_`.", FutureWarning, stacklevel=2)
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


def clip_grad_value_(parameters, clip_value: float, foreach=None) -> None:
    """Clamp every gradient in place to [-clip_value, clip_value]."""
    clip_value = float(clip_value)
    with ta.no_grad(), ta.memory.phase("optimizer"):
        for g in _grads(parameters):
            g.clamp_(min=-clip_value, max=clip_value)


def parameters_to_vector(parameters):
    """All parameters flattened and concatenated, in order, into one 1-d tensor (a copy;
    gradients flow back to the parameters)."""
    parameters = _as_list(parameters)
    _check_one_device("parameters_to_vector", parameters)
    return ta.cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec, parameters) -> None:
    """Copy consecutive slices of the 1-d `vec` into the parameters, in order (torch
    rebinds each parameter's .data to a view of vec; here the values are copied in)."""
    if not isinstance(vec, ta.Tensor):
        raise TypeError(f"expected torch.Tensor, but got: {type(vec).__name__}")
    parameters = _as_list(parameters)
    _check_one_device("vector_to_parameters", [vec, *parameters])
    needed = sum(p.numel() for p in parameters)
    if vec.ndim != 1 or vec.numel() != needed:
        raise RuntimeError(f"vector_to_parameters: vec has shape {tuple(vec.shape)}, the "
                           f"parameters need a 1-d vector of {needed} elements")
    offset = 0
    with ta.no_grad():
        for p in parameters:
            n = p.numel()
            p.copy_(vec[offset:offset + n].reshape(p.shape))
            offset += n


def _check_one_device(name: str, tensors) -> None:
    devices = {str(t.device) for t in tensors}
    if len(devices) > 1:
        raise TypeError(f"{name}: found two parameters on different devices, this is "
                        f"currently not supported (devices {sorted(devices)})")


def _norm(x, norm_type: float):
    """The norm_type-norm of all of x's elements, as a 0-d tensor (torch's vector_norm:
    inf is max |x|, -inf min |x|, 0 the count of nonzeros)."""
    if norm_type == math.inf:
        return x.abs().amax() if x.numel() else ta.tensor(0.0, dtype=x.dtype)
    if norm_type == -math.inf:
        return x.abs().amin()
    if norm_type == 0.0:
        return (x != 0).sum().to(x.dtype)
    if norm_type == 2.0 and x.is_contiguous():
        flat = x.reshape(-1)  # a view: the dot product needs no x-sized temporary
        return (flat @ flat).sqrt()
    if norm_type == 1.0:
        return x.abs().sum()
    return (x.abs() ** norm_type).sum() ** (1.0 / norm_type)


def cosine_lr(step: int, max_lr: float, warmup_steps: int, max_steps: int,
              min_lr: float) -> float:
    """nanoGPT's get_lr: linear warmup to max_lr, then cosine decay to min_lr at max_steps.

    step < warmup_steps:  max_lr * (step + 1) / (warmup_steps + 1)
    step > max_steps:     min_lr
    otherwise:            min_lr + 0.5 * (1 + cos(pi * r)) * (max_lr - min_lr),
                          r = (step - warmup_steps) / (max_steps - warmup_steps)
    """
    if step < warmup_steps:
        return max_lr * (step + 1) / (warmup_steps + 1)
    if step > max_steps or max_steps <= warmup_steps:
        return min_lr
    ratio = (step - warmup_steps) / (max_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)
