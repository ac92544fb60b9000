"""Training helpers: gradient clipping and nanoGPT's learning-rate schedule."""

from __future__ import annotations

import math

import tinygrad_attn as ta


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0):
    """Scale the gradients in place so that their total norm is at most `max_norm`.

    The total norm is the `norm_type`-norm of all gradients together, as if concatenated into
    one vector (torch.nn.utils.clip_grad_norm_). Returns it as a 0-d Tensor, before clipping.
    Gradients are multiplied by min(1, max_norm / (total + 1e-6)).
    """
    if isinstance(parameters, ta.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    norm_type = float(norm_type)
    if not grads:
        return ta.tensor(0.0)
    device = grads[0].device
    with ta.no_grad(), ta.memory.phase("optimizer"):
        norms = [_norm(g, norm_type).to(device) for g in grads]
        total = _norm(ta.stack(norms), norm_type)
        scale = ta.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(scale.to(g.device))
    return total


def _norm(x, norm_type: float):
    """The norm_type-norm of all of x's elements, as a 0-d tensor."""
    if norm_type == math.inf:
        return x.abs().max()
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
