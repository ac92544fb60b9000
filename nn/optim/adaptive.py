"""Adadelta, RMSprop and Adagrad: torch.optim's update rules as chains of in-place engine
ops on the parameter and its state buffers.

Per parameter and step (beyond the state, made on the first step): a few parameter-sized
temporaries, each freed within the step; the engine has no fused kernel for these
updates. Counted with s = 1 when maximize or weight_decay is set (the gradient the rule
reads, -g + wd * p, in one temporary), else 0:
- Adadelta: 6 + s (g * g, acc_delta + eps and its sqrt, square_avg + eps and its sqrt,
  delta * delta); state "square_avg", "acc_delta".
- RMSprop: 3 + s (g * g, sqrt(square_avg), the update g / avg); centered adds 3 (the lerp's
  difference, grad_avg^2 and the difference); state "square_avg" (+ "grad_avg" when centered,
  "momentum_buffer" when momentum > 0).
- Adagrad: 3 + s (g * g, sqrt(sum), g / std); state "sum", made at construction, as torch
  makes it, filled with initial_accumulator_value.
"""

from __future__ import annotations

from .optimizer import Optimizer, check_implementation_flags, check_nonnegative, read_grad


def _effective_grad(p, group):
    """The gradient the rule reads: -g when maximizing, plus wd * p for weight decay."""
    return read_grad(p, group["maximize"], group["weight_decay"])


class Adadelta(Optimizer):
    """Adadelta, torch.optim.Adadelta's math (g after maximize and weight decay):

        v = rho * v + (1 - rho) * g^2
        delta = sqrt(u + eps) / sqrt(v + eps) * g
        u = rho * u + (1 - rho) * delta^2
        p -= lr * delta
    """

    def __init__(self, params, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0, foreach=None, *, capturable: bool = False,
                 maximize: bool = False, differentiable: bool = False) -> None:
        check_nonnegative(lr=lr)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        check_nonnegative(eps=eps, weight_decay=weight_decay)
        check_implementation_flags("Adadelta", foreach, None, differentiable, capturable)
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay,
                                      maximize=maximize, capturable=capturable,
                                      foreach=foreach, differentiable=differentiable))

    def _update(self, p, _grad, group, state) -> None:
        if "step" not in state:
            state["step"] = 0
            state["square_avg"] = self._new_buffer(p)
            state["acc_delta"] = self._new_buffer(p)
        state["step"] += 1
        rho, eps = group["rho"], group["eps"]
        grad = _effective_grad(p, group)
        square_avg, acc_delta = state["square_avg"], state["acc_delta"]
        square_avg.mul_(rho).add_(grad * grad, alpha=1 - rho)
        delta = (acc_delta + eps).sqrt()
        delta.div_((square_avg + eps).sqrt()).mul_(grad)
        acc_delta.mul_(rho).add_(delta * delta, alpha=1 - rho)
        p.add_(delta, alpha=-group["lr"])


class RMSprop(Optimizer):
    """RMSprop, torch.optim.RMSprop's math (g after maximize and weight decay):

        v = alpha * v + (1 - alpha) * g^2
        avg = sqrt(v - gbar^2) + eps, gbar = alpha * gbar + (1 - alpha) * g  (centered)
        avg = sqrt(v) + eps                                                   (otherwise)
        buf = momentum * buf + g / avg;  p -= lr * buf   (momentum > 0)
        p -= lr * g / avg                                (otherwise)
    """

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0, momentum: float = 0, centered: bool = False,
                 capturable: bool = False, foreach=None, maximize: bool = False,
                 differentiable: bool = False) -> None:
        check_nonnegative(lr=lr, eps=eps, momentum=momentum, weight_decay=weight_decay,
                          alpha=alpha)
        check_implementation_flags("RMSprop", foreach, None, differentiable, capturable)
        super().__init__(params, dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps,
                                      centered=centered, weight_decay=weight_decay,
                                      capturable=capturable, foreach=foreach,
                                      maximize=maximize, differentiable=differentiable))

    def _update(self, p, _grad, group, state) -> None:
        if "step" not in state:
            state["step"] = 0
            state["square_avg"] = self._new_buffer(p)
            if group["momentum"] > 0:
                state["momentum_buffer"] = self._new_buffer(p)
            if group["centered"]:
                state["grad_avg"] = self._new_buffer(p)
        state["step"] += 1
        alpha = group["alpha"]
        grad = _effective_grad(p, group)
        square_avg = state["square_avg"]
        square_avg.mul_(alpha).add_(grad * grad, alpha=1 - alpha)
        if group["centered"]:
            grad_avg = state["grad_avg"]
            grad_avg.add_(grad - grad_avg, alpha=1 - alpha)  # torch's lerp_(grad, 1 - alpha)
            avg = (square_avg - grad_avg * grad_avg).sqrt()
        else:
            avg = square_avg.sqrt()
        avg.add_(group["eps"])
        if group["momentum"] > 0:
            buf = state["momentum_buffer"]
            buf.mul_(group["momentum"]).add_(grad / avg)
            p.add_(buf, alpha=-group["lr"])
        else:
            p.add_(grad / avg, alpha=-group["lr"])


class Adagrad(Optimizer):
    """Adagrad, torch.optim.Adagrad's math (g after maximize and weight decay; t counts this
    parameter's steps):

        sum += g^2
        p -= lr / (1 + (t - 1) * lr_decay) * g / (sqrt(sum) + eps)
    """

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0,
                 weight_decay: float = 0, initial_accumulator_value: float = 0,
                 eps: float = 1e-10, foreach=None, *, maximize: bool = False,
                 differentiable: bool = False, fused=None) -> None:
        check_nonnegative(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                          initial_accumulator_value=initial_accumulator_value, eps=eps)
        check_implementation_flags("Adagrad", foreach, fused, differentiable)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps,
                                      weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      foreach=foreach, maximize=maximize,
                                      differentiable=differentiable, fused=fused))

    def add_param_group(self, param_group: dict) -> None:
        """As Optimizer's, and each new parameter's state made at once, as torch does."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            self.state[p] = {"step": 0, "sum": self._new_buffer(
                p, group["initial_accumulator_value"])}

    def _update(self, p, _grad, group, state) -> None:
        state["step"] += 1
        grad = _effective_grad(p, group)
        clr = group["lr"] / (1 + (state["step"] - 1) * group["lr_decay"])
        state["sum"].add_(grad * grad)
        std = state["sum"].sqrt().add_(group["eps"])
        p.add_(grad / std, alpha=-clr)
