"""SGD, torch.optim.SGD's update, in place and without a parameter-sized temporary."""

from __future__ import annotations

from .optimizer import Optimizer, check_implementation_flags, check_nonnegative


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, weight decay, Nesterov and
    maximize, torch.optim.SGD's math (s = -1 when maximizing, else 1):

        d = s * g + wd * p
        buf = d                                 (first step)
        buf = momentum * buf + (1 - dampening) * d
        p -= lr * (d + momentum * buf)          (nesterov)
        p -= lr * buf                           (otherwise; p -= lr * d without momentum)

    A step allocates no Storage: every term is folded in with `mul_` / `add_(x, alpha=a)`
    (the engine's `add_` with alpha != 1 forms `a * x` in one transient array, which the
    ledger's raw-allocator count sees but no Storage holds). State: "momentum_buffer", one
    parameter-sized buffer when momentum != 0.
    """

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, *, maximize: bool = False,
                 foreach=None, differentiable: bool = False, fused=None) -> None:
        check_nonnegative(lr=lr)
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        check_nonnegative(weight_decay=weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        check_implementation_flags("SGD", foreach, fused, differentiable)
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize, foreach=foreach,
                                      differentiable=differentiable, fused=fused))

    def _update(self, p, grad, group, state) -> None:
        lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
        sign = -1.0 if group["maximize"] else 1.0
        if momentum == 0:
            if wd != 0:
                p.mul_(1 - lr * wd)  # p - lr * (s * g + wd * p), with the wd term folded in
            p.add_(grad, alpha=-lr * sign)
            return
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = state["momentum_buffer"] = self._new_buffer(p)
            buf.copy_(grad)  # the first step takes d as it is, undamped
            if sign < 0:
                buf.mul_(-1.0)
            if wd != 0:
                buf.add_(p, alpha=wd)
        else:
            keep = 1 - group["dampening"]
            buf.mul_(momentum).add_(grad, alpha=keep * sign)
            if wd != 0:
                buf.add_(p, alpha=keep * wd)
        if group["nesterov"]:
            # p -= lr * (s * g + wd * p + momentum * buf); buf already holds the new momentum
            if wd != 0:
                p.mul_(1 - lr * wd)
            p.add_(grad, alpha=-lr * sign).add_(buf, alpha=-lr * momentum)
        else:
            p.add_(buf, alpha=-lr)
