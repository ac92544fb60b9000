"""Optimizers: SGD and AdamW, updating parameters in place, as torch.optim does.

Every update runs under `ta.no_grad()` (nothing is recorded) and `ta.memory.phase("optimizer")`
(the ledger attributes what the step allocates), and writes into the parameter's own Storage
with in-place ops. State buffers (momentum, exp_avg, exp_avg_sq) are made once, on a
parameter's first step, with `ta.zeros_like`, tagged "optimizer_state", and reused after.

What a step allocates beyond that state, per parameter:
- SGD: no Storage (every term is folded in with `mul_` / `add_(x, alpha=a)`; the engine's
  `add_` with alpha != 1 forms `a * x` in one transient array, which the ledger's raw-allocator
  count sees but no Storage holds).
- AdamW: no Storage either. The update is one engine call per parameter group,
  `ta.functional.adamw_update_` on lists of tensors, which on CPU runs block by block
  through a small scratch buffer (or, compiled, in one parallel pass over the group);
  written as a chain of in-place ops it would need two parameter-sized temporaries
  (grad * grad and the denominator sqrt(v)), and PyTorch's own single-tensor AdamW
  allocates one (denom).
"""

from __future__ import annotations

from collections.abc import Mapping

import tinygrad_attn as ta

from .module import zero_grads


class Optimizer:
    """Param groups, per-parameter state, zero_grad and state_dict, shared by optimizers.

    `params` is an iterable of tensors, or of dicts {"params": [...], **hyperparameters};
    a group's missing hyperparameters come from `defaults`.
    """

    def __init__(self, params, defaults: dict) -> None:
        self.defaults = dict(defaults)
        # state is keyed by the parameter tensor itself (Tensor hashes by identity)
        self.state: dict = {}
        self.param_groups: list[dict] = []
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, group: dict) -> None:
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError("a param group must be a dict with a 'params' entry")
        params = group["params"]
        params = [params] if isinstance(params, ta.Tensor) else list(params)
        for p in params:
            if not isinstance(p, ta.Tensor):
                raise TypeError(f"optimizer params must be Tensors, got {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("optimizer can only optimize leaf tensors (no grad_fn)")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params) or len({id(p) for p in params}) != len(params):
            raise ValueError("a parameter appears in more than one param group (or twice)")
        unknown = set(group) - set(self.defaults) - {"params"}
        if unknown:
            raise ValueError(f"unknown hyperparameters {sorted(unknown)} in a param group")
        self.param_groups.append({**self.defaults, **group, "params": params})

    def zero_grad(self, set_to_none: bool = True) -> None:
        zero_grads((p for group in self.param_groups for p in group["params"]), set_to_none)

    def step(self) -> None:
        with ta.no_grad(), ta.memory.phase("optimizer"):
            for group in self.param_groups:
                self._update_group(group)

    def _update_group(self, group: dict) -> None:
        """Update the group's parameters that have a gradient (one at a time here)."""
        for p in group["params"]:
            if p.grad is not None:
                self._update(p, p.grad, group, self.state.setdefault(p, {}))

    def _update(self, p, grad, group: dict, state: dict) -> None:
        raise NotImplementedError

    def _new_buffer(self, p):
        """A zeroed state buffer shaped like `p`, labelled for the memory ledger."""
        buf = ta.zeros_like(p)
        ta.memory.tag(buf, "optimizer_state")
        return buf

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """{"state": {index: {name: Tensor or number}}, "param_groups": [{..., "params": [i]}]}.

        Parameters are numbered in group order, as torch.optim does. The state tensors are the
        live buffers (not copies): save or clone them before stepping again.
        """
        index = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                index[id(p)] = len(index)
                ids.append(index[id(p)])
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        state = {index[id(p)]: dict(s) for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore hyperparameters and state; tensors are copied into fresh buffers shaped,
        typed and placed like their parameters. Everything is checked before anything
        changes: a state_dict that is not a mapping (a list, a path) is a TypeError, a
        missing "state" or "param_groups" entry a KeyError naming it, as torch's."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}; "
                            "pass the dict optimizer.state_dict() returned")
        for key in ("state", "param_groups"):
            if key not in state_dict:
                raise KeyError(f"load_state_dict: the optimizer state has no {key!r} entry "
                               f"(it has {sorted(map(str, state_dict))})")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"load_state_dict: the state has {len(saved_groups)} param groups, this "
                f"optimizer has {len(self.param_groups)}"
            )
        params = []
        for i, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"load_state_dict: param group {i} has {len(group['params'])} parameters "
                    f"here and {len(saved['params'])} in the state"
                )
            params.extend(zip(saved["params"], group["params"]))
        state = {int(k): v for k, v in state_dict["state"].items()}
        for k, v in state.items():
            if not isinstance(v, Mapping):
                raise TypeError(f"load_state_dict: the state of parameter {k} must be a dict "
                                f"of buffers and numbers, got {type(v).__name__}")
        self.state = {}
        for saved_index, p in params:
            if saved_index in state:
                self.state[p] = {
                    name: self._restore(value, p, saved_index, name)
                    for name, value in state[saved_index].items()
                }
        for group, saved in zip(self.param_groups, saved_groups):
            group.update({k: _plain(v) for k, v in saved.items() if k != "params"})

    def _restore(self, value, p, index: int, name: str):
        if not isinstance(value, ta.Tensor):
            return value
        if tuple(value.shape) != tuple(p.shape):
            raise ValueError(
                f"load_state_dict: state {name!r} of parameter {index} has shape "
                f"{tuple(value.shape)}, the parameter has {tuple(p.shape)}"
            )
        buf = self._new_buffer(p)
        buf.copy_(value.to(p.device))  # copy_ casts to the parameter's dtype
        return buf


def _plain(value):
    """JSON round trips turn tuples (betas) into lists; give them back as tuples."""
    return tuple(value) if isinstance(value, list) else value


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, weight decay and Nesterov,
    the same math as torch.optim.SGD:

        d = g + wd * p
        buf = d                                 (first step)
        buf = momentum * buf + (1 - dampening) * d
        p -= lr * (d + momentum * buf)          (nesterov)
        p -= lr * buf                           (otherwise; p -= lr * d without momentum)
    """

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False, dampening: float = 0.0) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(
                f"SGD: lr, momentum and weight_decay must be >= 0 (got {lr}, {momentum}, "
                f"{weight_decay})"
            )
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: nesterov momentum requires momentum > 0 and dampening 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      nesterov=nesterov, dampening=dampening))

    def _update(self, p, grad, group, state) -> None:
        lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
        if momentum == 0:
            if wd != 0:
                p.mul_(1 - lr * wd)  # p - lr * (g + wd * p), with the wd term folded in
            p.add_(grad, alpha=-lr)
            return
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = state["momentum_buffer"] = self._new_buffer(p)
            buf.copy_(grad)  # the first step takes d as it is, undamped
            if wd != 0:
                buf.add_(p, alpha=wd)
        else:
            keep = 1 - group["dampening"]
            buf.mul_(momentum).add_(grad, alpha=keep)
            if wd != 0:
                buf.add_(p, alpha=keep * wd)
        if group["nesterov"]:
            # p -= lr * (g + wd * p + momentum * buf); buf already holds the new momentum
            if wd != 0:
                p.mul_(1 - lr * wd)
            p.add_(grad, alpha=-lr).add_(buf, alpha=-lr * momentum)
        else:
            p.add_(buf, alpha=-lr)


class AdamW(Optimizer):
    """Adam with decoupled weight decay and bias correction, as torch.optim.AdamW:

        p *= 1 - lr * wd
        m = beta1 * m + (1 - beta1) * g             v = beta2 * v + (1 - beta2) * g^2
        p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2) -> None:
        beta1, beta2 = betas
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"AdamW: lr, eps, weight_decay must be >= 0 ({lr}, {eps}, "
                             f"{weight_decay})")
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError(f"AdamW: betas must be in [0, 1), got {tuple(betas)}")
        super().__init__(params, dict(lr=lr, betas=(beta1, beta2), eps=eps,
                                      weight_decay=weight_decay))

    def _update_group(self, group) -> None:
        """All the group's parameters that have a gradient in one fused call per step count
        (they share one unless some missed steps without a gradient): one launch of the
        compiled kernel for the group, rather than one per parameter, each of which costs
        more than a bias's whole update."""
        by_step: dict = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state.setdefault(p, {})
            if "step" not in state:
                state["step"] = 0
                state["exp_avg"] = self._new_buffer(p)
                state["exp_avg_sq"] = self._new_buffer(p)
            by_step.setdefault(state["step"] + 1, []).append(
                (p, p.grad, state["exp_avg"], state["exp_avg_sq"], state))
        beta1, beta2 = group["betas"]
        for step, entries in by_step.items():
            ps, gs, ms, vs, states = (list(c) for c in zip(*entries))
            # one fused in-place update (no parameter-sized temporary; see the module
            # docstring); the step counts move only once it has run
            ta.functional.adamw_update_(ps, gs, ms, vs, lr=group["lr"], beta1=beta1,
                                        beta2=beta2, eps=group["eps"],
                                        weight_decay=group["weight_decay"], step=step)
            for state in states:
                state["step"] = step


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
