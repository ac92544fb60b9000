"""Rprop and ASGD, torch.optim's, as chains of in-place engine ops.

Per parameter and step, each freed within the step: Rprop makes 5 parameter-sized
temporaries (g * prev, the factor, the masked gradient, its sign, sign * step_size) and
two boolean masks, +1 for maximize; ASGD makes 1 once averaging (p - ax, after t0
steps), none before, +1 for maximize or weight decay.
"""

from __future__ import annotations

import struct

import tinygrad_attn as ta

from .optimizer import Optimizer, check_implementation_flags, check_nonnegative, read_grad


def _float32(x: float) -> float:
    """x rounded to float32, as the 0-d float32 tensors torch keeps ASGD's eta and mu in."""
    return struct.unpack("f", struct.pack("f", x))[0]


class Rprop(Optimizer):
    """Resilient backpropagation, torch.optim.Rprop's math: each element's step size grows
    by etaplus while its gradient keeps its sign, shrinks by etaminus when it flips (and
    that step is skipped), within step_sizes; p -= sign(g) * step_size."""

    def __init__(self, params, lr: float = 1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50), *,
                 capturable: bool = False, foreach=None, maximize: bool = False,
                 differentiable: bool = False) -> None:
        check_nonnegative(lr=lr)
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"Invalid eta values: {etas[0]}, {etas[1]}")
        check_implementation_flags("Rprop", foreach, None, differentiable, capturable)
        super().__init__(params, dict(lr=lr, etas=tuple(etas), step_sizes=tuple(step_sizes),
                                      foreach=foreach, maximize=maximize,
                                      differentiable=differentiable, capturable=capturable))

    def _update(self, p, _grad, group, state) -> None:
        if "step" not in state:
            state.update(step=0, prev=self._new_buffer(p),
                         step_size=self._new_buffer(p, group["lr"]))
        state["step"] += 1
        etaminus, etaplus = group["etas"]
        low, high = group["step_sizes"]
        grad = read_grad(p, group["maximize"])
        trend = grad * state["prev"]
        factor = ta.full_like(trend, 1.0)
        factor.masked_fill_(trend > 0, etaplus)
        flipped = trend < 0
        factor.masked_fill_(flipped, etaminus)
        state["step_size"].mul_(factor).clamp_(low, high)
        grad = ta.where(flipped, 0.0, grad)  # no step, and no memory of it, where it flipped
        p.sub_(grad.sign() * state["step_size"])
        state["prev"].copy_(grad)


class ASGD(Optimizer):
    """Averaged SGD, torch.optim.ASGD's math (t counts steps; eta and mu are float32 numbers,
    as torch keeps them):

        p *= 1 - lambd * eta;  p -= eta * g
        ax += mu * (p - ax)   (ax = p while mu is 1)
        eta = lr / (1 + lambd * lr * t) ** alpha;  mu = 1 / max(1, t - t0)
    """

    _scalar_state = ("step", "eta", "mu")

    def __init__(self, params, lr: float = 1e-2, lambd: float = 1e-4, alpha: float = 0.75,
                 t0: float = 1e6, weight_decay: float = 0, foreach=None,
                 maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False) -> None:
        check_nonnegative(lr=lr, weight_decay=weight_decay)
        check_implementation_flags("ASGD", foreach, None, differentiable, capturable)
        super().__init__(params, dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0,
                                      weight_decay=weight_decay, foreach=foreach,
                                      maximize=maximize, differentiable=differentiable,
                                      capturable=capturable))

    def _update(self, p, _grad, group, state) -> None:
        lr, lambd = group["lr"], group["lambd"]
        if "step" not in state:
            state.update(step=0, eta=_float32(lr), mu=1.0, ax=self._new_buffer(p))
        state["step"] += 1
        grad = read_grad(p, group["maximize"], group["weight_decay"])
        eta = state["eta"]
        p.mul_(1 - lambd * eta)
        p.add_(grad, alpha=-eta)
        if state["mu"] != 1:
            state["ax"].add_((p - state["ax"]).mul_(state["mu"]))
        else:
            state["ax"].copy_(p)
        step = state["step"]
        state["eta"] = _float32(lr / (1 + lambd * lr * step) ** group["alpha"])
        state["mu"] = _float32(1 / max(1, step - group["t0"]))
