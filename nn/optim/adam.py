"""Adam and AdamW (torch.optim.Adam / AdamW), and nanoGPT's configure_adamw.

The common case (no amsgrad) is one engine call per parameter group and step count,
`ta.functional.adamw_update_` on lists of tensors, which on CPU runs block by block through
a small scratch buffer (or, compiled, in one parallel pass over the group): AdamW allocates
no Storage per step. Written as a chain of in-place ops it would need two parameter-sized
temporaries (grad * grad and the denominator sqrt(v)), and PyTorch's own single-tensor
AdamW allocates one (denom).

Per parameter and step, beyond that:
- maximize, or Adam's (coupled) weight_decay: one parameter-sized temporary, the gradient
  the update reads (-g, g + wd * p), freed within the step.
- amsgrad: a chain of engine ops (grad - m, grad * grad, max(v_max, v), sqrt(v_max),
  / sqrt(1 - beta2^t), m / denom): six temporaries more, freed within the step, and a third
  state buffer, "max_exp_avg_sq".
"""

from __future__ import annotations

import tinygrad_attn as ta

from .optimizer import (
    Optimizer,
    check_betas,
    check_implementation_flags,
    check_nonnegative,
    read_grad,
)


class Adam(Optimizer):
    """Adam with bias correction, torch.optim.Adam's math (t counts this parameter's steps):

        g = -g (maximize);  g = g + wd * p (weight decay), or p *= 1 - lr * wd (decoupled)
        m = beta1 * m + (1 - beta1) * g             v = beta2 * v + (1 - beta2) * g^2
        v_max = max(v_max, v), read instead of v    (amsgrad)
        p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

    State per parameter: "step", "exp_avg", "exp_avg_sq" (and "max_exp_avg_sq").
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *, foreach=None,
                 maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, fused=None,
                 decoupled_weight_decay: bool = False) -> None:
        check_nonnegative(lr=lr, eps=eps)
        betas = check_betas(betas)
        check_nonnegative(weight_decay=weight_decay)
        check_implementation_flags(type(self).__name__, foreach, fused, differentiable,
                                   capturable)
        super().__init__(params, dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
            maximize=maximize, foreach=foreach, capturable=capturable,
            differentiable=differentiable, fused=fused,
            decoupled_weight_decay=decoupled_weight_decay))

    def _update_group(self, group) -> None:
        """All the group's parameters that have a gradient in one fused call per step count
        (they share one unless some missed steps without a gradient): one launch of the
        compiled kernel for the group, rather than one per parameter, each of which costs
        more than a bias's whole update. amsgrad goes one parameter at a time."""
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        beta1, beta2 = group["betas"]
        decoupled = group["decoupled_weight_decay"]
        maximize, coupled_wd = group["maximize"], 0.0 if decoupled else wd
        plain = not maximize and coupled_wd == 0  # the update reads p.grad as it is
        by_step: dict = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "step" not in state:
                state["step"] = 0
                state["exp_avg"] = self._new_buffer(p)
                state["exp_avg_sq"] = self._new_buffer(p)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = self._new_buffer(p)
            grad = p.grad if plain else read_grad(p, maximize, coupled_wd)
            if group["amsgrad"]:
                state["step"] += 1
                self._amsgrad_update(p, grad, state, lr, beta1, beta2, eps,
                                     wd if decoupled else 0.0)
                continue
            by_step.setdefault(state["step"] + 1, []).append(
                (p, grad, state["exp_avg"], state["exp_avg_sq"], state))
        for step, entries in by_step.items():
            ps, gs, ms, vs, states = (list(c) for c in zip(*entries))
            # one fused in-place update (no parameter-sized temporary; see the module
            # docstring); the step counts move only once it has run
            ta.functional.adamw_update_(ps, gs, ms, vs, lr=lr, beta1=beta1, beta2=beta2,
                                        eps=eps, weight_decay=wd if decoupled else 0.0,
                                        step=step)
            for state in states:
                state["step"] = step

    @staticmethod
    def _amsgrad_update(p, grad, state, lr, beta1, beta2, eps, decoupled_wd) -> None:
        step = state["step"]
        m, v, v_max = state["exp_avg"], state["exp_avg_sq"], state["max_exp_avg_sq"]
        if decoupled_wd != 0:
            p.mul_(1 - lr * decoupled_wd)
        m.add_(grad - m, alpha=1 - beta1)  # torch's lerp_(grad, 1 - beta1)
        v.mul_(beta2).add_(grad * grad, alpha=1 - beta2)
        v_max.copy_(ta.maximum(v_max, v))
        denom = (v_max.sqrt() / (1 - beta2 ** step) ** 0.5).add_(eps)
        p.add_(m / denom, alpha=-lr / (1 - beta1 ** step))


class AdamW(Adam):
    """Adam with decoupled weight decay (torch.optim.AdamW): p *= 1 - lr * wd before the
    Adam step; weight_decay defaults to 1e-2."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach=None, capturable: bool = False,
                 differentiable: bool = False, fused=None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable,
                         differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)


def configure_adamw(model_or_named_params, weight_decay: float, lr: float,
                    betas=(0.9, 0.95), eps: float = 1e-8) -> AdamW:
    """AdamW with nanoGPT's two groups: weight decay on parameters with ndim >= 2 (matmul
    weights, embeddings), none on the rest (biases, LayerNorm gains).

    Takes a Module (anything with `named_parameters()`), a dict name -> tensor, or an iterable
    of (name, tensor) pairs. Parameters that don't require grad are skipped; a tensor reached
    under two names (weight tying) is optimized once.
    """
    source = model_or_named_params
    if hasattr(source, "named_parameters"):
        source = source.named_parameters()
    elif isinstance(source, dict):
        source = source.items()
    decay, no_decay, seen = [], [], set()
    for _, p in source:
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return AdamW([g for g in groups if g["params"]], lr=lr, betas=betas, eps=eps)
