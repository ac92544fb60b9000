"""The Optimizer base class: torch.optim.Optimizer's param groups, state, hooks and
state_dict, for the update rules in this package.

A subclass gives its defaults and `_update_group(group)`; `step` runs that for every group
under `ta.no_grad()` (nothing is recorded) and `ta.memory.phase("optimizer")` (the ledger
attributes what the step allocates). State buffers are made on a parameter's first step
with `_new_buffer`, tagged "optimizer_state", and updated in place after.

Step counts ("step", and NAdam's "mu_product") are Python numbers in `optimizer.state`, so a
step makes no 0-d Storage per parameter; `state_dict()` gives them as torch stores them
(float32 0-d tensors) and `load_state_dict` takes either form.
"""

from __future__ import annotations

import copy
from collections import OrderedDict, defaultdict
from collections.abc import Mapping

import tinygrad_attn as ta

from ..module import zero_grads


class _Required:
    """The default of a hyperparameter every param group must give (torch's `required`)."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _Required()


class RemovableHandle:
    """What register_step_pre_hook / register_step_post_hook return: `.remove()` unhooks."""

    _next_id = 0

    def __init__(self, hooks: dict) -> None:
        self._hooks = hooks
        self.id = RemovableHandle._next_id
        RemovableHandle._next_id += 1

    def remove(self) -> None:
        self._hooks.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def check_implementation_flags(name: str, foreach=None, fused=None, differentiable=False,
                               capturable=False) -> None:
    """foreach/fused/capturable select among torch's implementations of one update rule;
    there is one implementation here, so they are accepted and change nothing.
    `differentiable=True` (a step autograd can go through) is not supported."""
    if differentiable:
        raise RuntimeError(f"{name}: differentiable=True is not supported: the update runs "
                           "in place under no_grad, so autograd cannot differentiate through "
                           "it; leave differentiable=False")
    if fused and foreach:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")


def check_betas(betas) -> tuple:
    beta1, beta2 = betas
    if not 0.0 <= beta1 < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {beta1}")
    if not 0.0 <= beta2 < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {beta2}")
    return (beta1, beta2)


def check_nonnegative(**values) -> None:
    """ValueError "Invalid learning rate: -1" and the like, as torch words them."""
    words = {"lr": "learning rate", "eps": "epsilon value"}
    for name, value in values.items():
        if not 0.0 <= value:
            raise ValueError(f"Invalid {words.get(name, name + ' value')}: {value}")


def read_grad(p, maximize: bool, weight_decay: float = 0.0):
    """The gradient an update rule reads: p.grad itself, or one parameter-sized temporary
    holding -g (maximize) and + wd * p (torch's coupled weight decay, added in place)."""
    grad = -p.grad if maximize else p.grad
    if weight_decay != 0:
        if grad is p.grad:
            grad = grad.clone()
        grad.add_(p, alpha=weight_decay)
    return grad


class Optimizer:
    """Param groups, per-parameter state, zero_grad, step hooks and state_dict.

    `params` is an iterable of tensors, or of dicts {"params": [...], **hyperparameters};
    a group's missing hyperparameters come from `defaults`.
    """

    # state entries kept as Python numbers here and given as float32 0-d tensors in
    # state_dict(), as torch keeps them
    _scalar_state: tuple = ("step",)

    def __init__(self, params, defaults: dict) -> None:
        self.defaults = dict(defaults)
        self.state: defaultdict = defaultdict(dict)  # keyed by the parameter tensor itself
        self.param_groups: list[dict] = []
        self._step_pre_hooks: OrderedDict = OrderedDict()
        self._step_post_hooks: OrderedDict = OrderedDict()
        if isinstance(params, ta.Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            f"Tensors or dicts, but got {type(params).__name__} (a single "
                            "tensor: pass [tensor])")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def __repr__(self) -> str:
        text = f"{type(self).__name__} ("
        for i, group in enumerate(self.param_groups):  # groups one blank line apart
            text += f"\nParameter Group {i}\n"
            text += "".join(f"    {key}: {group[key]}\n" for key in sorted(group)
                            if key != "params")
        return text + ")"

    def __getstate__(self) -> dict:
        return {"defaults": self.defaults, "state": self.state,
                "param_groups": self.param_groups}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._step_pre_hooks = OrderedDict()
        self._step_post_hooks = OrderedDict()

    def add_param_group(self, param_group: dict) -> None:
        """Add a group of parameters, its missing hyperparameters taken from `defaults`."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, ta.Tensor):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError("optimizer parameters need to be organized in ordered collections,"
                            " but the ordering of tensors in sets will change between runs. "
                            "Please use a list instead.")
        else:
            params = list(params)
        for p in params:
            if not isinstance(p, ta.Tensor):
                raise TypeError("optimizer can only optimize Tensors, but one of the params "
                                f"is {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        group = {**param_group, "params": params}
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ValueError("parameter group didn't specify a value of required "
                                 f"optimization parameter {name}")
            group.setdefault(name, default)
        if len({id(p) for p in params}) != len(params):
            raise ValueError("optimizer: a parameter appears twice in one parameter group")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        zero_grads((p for group in self.param_groups for p in group["params"]), set_to_none)

    # ------------------------------------------------------------------ the step
    def register_step_pre_hook(self, hook) -> RemovableHandle:
        """hook(optimizer, args, kwargs) before each step; it may return (args, kwargs)."""
        handle = RemovableHandle(self._step_pre_hooks)
        self._step_pre_hooks[handle.id] = hook
        return handle

    def register_step_post_hook(self, hook) -> RemovableHandle:
        """hook(optimizer, args, kwargs) after each step."""
        handle = RemovableHandle(self._step_post_hooks)
        self._step_post_hooks[handle.id] = hook
        return handle

    def step(self, closure=None):
        """Update every parameter that has a gradient; returns closure()'s loss, the
        closure (which recomputes the loss and its gradients) run under enable_grad."""
        args, kwargs = (), {"closure": closure} if closure is not None else {}
        for hook in list(self._step_pre_hooks.values()):
            result = hook(self, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError("optimizer step pre-hook must return None or a tuple "
                                       f"of (new_args, new_kwargs), but got {result}.")
                args, kwargs = result
        closure = kwargs.get("closure", args[0] if args else None)
        loss = None
        if closure is not None:
            with ta.enable_grad():
                loss = closure()
        with ta.no_grad(), ta.memory.phase("optimizer"):
            for group in self.param_groups:
                self._update_group(group)
        for hook in list(self._step_post_hooks.values()):
            hook(self, args, kwargs)
        return loss

    def _update_group(self, group: dict) -> None:
        """Update the group's parameters that have a gradient (one at a time here)."""
        for p in group["params"]:
            if p.grad is not None:
                self._update(p, p.grad, group, self.state[p])

    def _update(self, p, grad, group: dict, state: dict) -> None:
        raise NotImplementedError

    def _new_buffer(self, p, fill: float = 0.0):
        """A state buffer shaped like `p` (zeros, or `fill`), labelled for the ledger."""
        buf = ta.zeros_like(p) if fill == 0 else ta.full_like(p, fill)
        ta.memory.tag(buf, "optimizer_state")
        return buf

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """{"state": {index: {name: Tensor}}, "param_groups": [{..., "params": [i]}]}, as
        torch.optim gives it: parameters numbered in group order, step counts as float32
        0-d tensors. The other state tensors are the live buffers (not copies): save or
        clone them before stepping again."""
        index: dict = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        state = {}
        for p, entries in self.state.items():
            if id(p) in index and entries:
                state[index[id(p)]] = {
                    name: ta.tensor(float(v), dtype=ta.float32)
                    if name in self._scalar_state and not isinstance(v, ta.Tensor) else v
                    for name, v in entries.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore hyperparameters and state. The groups are deep-copied; state tensors
        are copied into fresh buffers cast to their parameter's dtype and device, step
        counts read back as numbers. Everything is checked before anything changes."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}; "
                            "pass the dict optimizer.state_dict() returned")
        for key in ("state", "param_groups"):
            if key not in state_dict:
                raise KeyError(f"load_state_dict: the optimizer state has no {key!r} entry "
                               f"(it has {sorted(map(str, state_dict))})")
        saved_groups = copy.deepcopy(list(state_dict["param_groups"]))
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups "
                             f"({len(saved_groups)}; this optimizer has "
                             f"{len(self.param_groups)})")
        params = []
        for group, saved in zip(self.param_groups, saved_groups):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't "
                                 "match the size of optimizer's group "
                                 f"({len(saved['params'])} vs {len(group['params'])} "
                                 "parameters)")
            params.extend(zip(saved["params"], group["params"]))
        state = {int(k): v for k, v in state_dict["state"].items()}
        for k, v in state.items():
            if not isinstance(v, Mapping):
                raise TypeError(f"load_state_dict: the state of parameter {k} must be a dict "
                                f"of buffers and numbers, got {type(v).__name__}")
        new_state: defaultdict = defaultdict(dict)
        for saved_index, p in params:
            if saved_index in state:
                new_state[p] = {name: self._restore(value, p, saved_index, name)
                                for name, value in state[saved_index].items()}
        self.state = new_state
        for group, saved in zip(self.param_groups, saved_groups):
            own = group["params"]
            group.clear()  # the saved hyperparameters replace these, as torch's do
            group.update({k: _plain(v) for k, v in saved.items() if k != "params"})
            group["params"] = own

    def _restore(self, value, p, index: int, name: str):
        if name in self._scalar_state:
            number = value.item() if isinstance(value, ta.Tensor) else value
            return int(number) if name == "step" and float(number).is_integer() else number
        if not isinstance(value, ta.Tensor):
            return copy.deepcopy(value)
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
