"""NAdam, RAdam and Adamax: torch.optim's Adam variants as chains of in-place engine ops.

Per parameter and step: a few parameter-sized temporaries, freed within the step (s = 1
when maximize or coupled weight_decay is set: the gradient the rule reads): NAdam 6 + s,
RAdam 8 + s (4 + s while the variance is not yet tractable, rho_t <= 5), Adamax 4 + s.
State: "step", "exp_avg" and "exp_avg_sq" (Adamax: "exp_inf"; NAdam also "mu_product", a
number here, a float32 0-d tensor in torch and in state_dict()).
"""

from __future__ import annotations

import struct

import tinygrad_attn as ta

from .optimizer import (
    Optimizer,
    check_betas,
    check_implementation_flags,
    check_nonnegative,
    read_grad,
)


def _float32(x: float) -> float:
    """x rounded to float32: torch keeps NAdam's mu_product in a float32 0-d tensor."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _read_grad(p, group, decoupled: bool):
    """-g when maximizing; coupled weight decay adds wd * p, decoupled scales p itself."""
    wd = group["weight_decay"]
    if wd != 0 and decoupled:
        p.mul_(1 - group["lr"] * wd)
    return read_grad(p, group["maximize"], 0.0 if decoupled else wd)


def _adam_checks(name, lr, betas, eps, weight_decay, foreach, differentiable, capturable):
    check_nonnegative(lr=lr, eps=eps)
    betas = check_betas(betas)
    check_nonnegative(weight_decay=weight_decay)
    check_implementation_flags(name, foreach, None, differentiable, capturable)
    return betas


class NAdam(Optimizer):
    """Adam with Nesterov momentum, torch.optim.NAdam's math (t counts steps):

        mu_t = beta1 * (1 - 0.5 * 0.96^(t * momentum_decay)),  P_t = mu_1 * ... * mu_t
        m, v as Adam's;  denom = sqrt(v / (1 - beta2^t)) + eps
        p -= lr * (1 - mu_t) / (1 - P_t) * g / denom
        p -= lr * mu_{t+1} / (1 - P_t * mu_{t+1}) * m / denom
    """

    _scalar_state = ("step", "mu_product")

    def __init__(self, params, lr: float = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, foreach=None,
                 maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False) -> None:
        betas = _adam_checks("NAdam", lr, betas, eps, weight_decay, foreach, differentiable,
                             capturable)
        check_nonnegative(momentum_decay=momentum_decay)
        super().__init__(params, dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
            momentum_decay=momentum_decay, decoupled_weight_decay=decoupled_weight_decay,
            maximize=maximize, foreach=foreach, capturable=capturable,
            differentiable=differentiable))

    def _update(self, p, _grad, group, state) -> None:
        if "step" not in state:
            state.update(step=0, mu_product=1.0, exp_avg=self._new_buffer(p),
                         exp_avg_sq=self._new_buffer(p))
        state["step"] += 1
        step, lr, eps = state["step"], group["lr"], group["eps"]
        beta1, beta2 = group["betas"]
        grad = _read_grad(p, group, group["decoupled_weight_decay"])
        mu = beta1 * (1.0 - 0.5 * 0.96 ** (step * group["momentum_decay"]))
        mu_next = beta1 * (1.0 - 0.5 * 0.96 ** ((step + 1) * group["momentum_decay"]))
        # torch multiplies in float32: the factor is rounded to float32 too
        state["mu_product"] = mu_product = _float32(state["mu_product"] * _float32(mu))
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.add_(grad - m, alpha=1 - beta1)
        v.mul_(beta2).add_(grad * grad, alpha=1 - beta2)
        denom = (v / (1 - beta2 ** step)).sqrt().add_(eps)
        p.add_(grad / denom, alpha=-lr * (1.0 - mu) / (1.0 - mu_product))
        p.add_(m / denom, alpha=-lr * mu_next / (1.0 - mu_product * mu_next))


class RAdam(Optimizer):
    """Rectified Adam, torch.optim.RAdam's math (t counts steps):

        m, v as Adam's;  rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t)
        rho_t > 5:  p -= lr * m / (1 - beta1^t) * r_t * sqrt(1 - beta2^t) / (sqrt(v) + eps),
                    r_t = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t))
        otherwise:  p -= lr * m / (1 - beta1^t)
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, decoupled_weight_decay: bool = False, *,
                 foreach=None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False) -> None:
        betas = _adam_checks("RAdam", lr, betas, eps, weight_decay, foreach, differentiable,
                             capturable)
        super().__init__(params, dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, maximize=maximize,
            foreach=foreach, capturable=capturable,
            decoupled_weight_decay=decoupled_weight_decay, differentiable=differentiable))

    def _update(self, p, _grad, group, state) -> None:
        if "step" not in state:
            state.update(step=0, exp_avg=self._new_buffer(p), exp_avg_sq=self._new_buffer(p))
        state["step"] += 1
        step, lr = state["step"], group["lr"]
        beta1, beta2 = group["betas"]
        grad = _read_grad(p, group, group["decoupled_weight_decay"])
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.add_(grad - m, alpha=1 - beta1)
        v.mul_(beta2).add_(grad * grad, alpha=1 - beta2)
        bias_correction1 = 1 - beta1 ** step
        bias_correction2 = 1 - beta2 ** step
        corrected = m / bias_correction1
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * beta2 ** step / bias_correction2
        if rho_t > 5.0:
            rect = ((rho_t - 4) * (rho_t - 2) * rho_inf
                    / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
            adaptive = bias_correction2 ** 0.5 / v.sqrt().add_(group["eps"])
            p.sub_(corrected * lr * adaptive * rect)
        else:
            p.sub_(corrected * lr)


class Adamax(Optimizer):
    """Adam with the infinity norm, torch.optim.Adamax's math (t counts steps):

        m = beta1 * m + (1 - beta1) * g;  u = max(beta2 * u, |g| + eps)
        p -= lr / (1 - beta1^t) * m / u
    """

    def __init__(self, params, lr: float = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, foreach=None, *, maximize: bool = False,
                 differentiable: bool = False, capturable: bool = False) -> None:
        betas = _adam_checks("Adamax", lr, betas, eps, weight_decay, foreach, differentiable,
                             capturable)
        super().__init__(params, dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=foreach,
            maximize=maximize, differentiable=differentiable, capturable=capturable))

    def _update(self, p, _grad, group, state) -> None:
        if "step" not in state:
            state.update(step=0, exp_avg=self._new_buffer(p), exp_inf=self._new_buffer(p))
        state["step"] += 1
        beta1, beta2 = group["betas"]
        grad = _read_grad(p, group, decoupled=False)
        m, u = state["exp_avg"], state["exp_inf"]
        m.add_(grad - m, alpha=1 - beta1)
        u.copy_(ta.maximum(u.mul_(beta2), grad.abs().add_(group["eps"])))
        p.add_(m / u, alpha=-group["lr"] / (1 - beta1 ** state["step"]))
