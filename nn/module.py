"""Module: a tree of parameters, buffers and submodules (torch.nn.Module's shape).

A parameter is a plain leaf `ta.Tensor` (the engine checks `type(x) is Tensor`, so there
is no Parameter subclass): `Parameter(t)` makes it require grad and tags its Storage as
"parameter" for the memory ledger. Assigning such a tensor to a module attribute registers
it; assigning a Module registers a submodule. Weight tying is assigning the same tensor
to two modules: it is one Storage, one gradient, and `parameters()` lists it once.

Calling a module runs `forward` inside `ta.memory.module_scope(self)`: the ledger's scope
is its dotted path from the module the call started at ("transformer.h.3.attn"; that
root's name is ""), so every byte allocated in forward (and, through the graph nodes, in
backward) is attributed to the module that asked for it.
"""

from __future__ import annotations

import inspect
import weakref
from collections import OrderedDict, namedtuple
from collections.abc import Mapping

import tinygrad_attn as ta

IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def Parameter(data: ta.Tensor, requires_grad: bool = True) -> ta.Tensor:  # noqa: N802
    """A trainable leaf over data's memory, tagged "parameter" for the memory ledger."""
    if type(data) is not ta.Tensor:
        raise TypeError(f"Parameter: expected a ta.Tensor, got {type(data).__name__}")
    t = data.detach()
    t.requires_grad_(requires_grad)
    ta.memory.tag(t, "parameter")
    return t


def is_parameter(value) -> bool:
    """A leaf tensor that requires grad, or one made by Parameter(..., requires_grad=False)."""
    return type(value) is ta.Tensor and value.is_leaf and (
        value.requires_grad or value.untyped_storage().category == "parameter"
    )


def zero_grads(params, set_to_none: bool = True) -> None:
    """Drop (set_to_none) or zero in place the .grad of each tensor in params."""
    for p in params:
        if p.grad is None:
            continue
        if set_to_none:
            p.grad = None
        else:
            with ta.no_grad():
                p.grad.zero_()


class Module:
    """Base class of every layer: subclasses set attributes in __init__ and define forward."""

    def __init__(self) -> None:
        d = self.__dict__
        d["_parameters"] = OrderedDict()
        d["_buffers"] = OrderedDict()
        d["_non_persistent"] = set()
        d["_modules"] = OrderedDict()
        d["training"] = True

    def forward(self, *args, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    # ------------------------------------------------------------------ registration
    def __setattr__(self, name: str, value) -> None:
        d = self.__dict__
        if "_parameters" not in d and isinstance(value, (ta.Tensor, Module)):
            raise AttributeError(
                f"cannot assign {name!r} before Module.__init__() is called; call "
                "super().__init__() first in the subclass's __init__"
            )
        if isinstance(value, Module):
            self._forget(name, keep="_modules")
            d["_modules"][name] = value
        elif is_parameter(value) or (value is None and name in d.get("_parameters", ())):
            self._forget(name, keep="_parameters")
            d["_parameters"][name] = value
        elif name in d.get("_parameters", ()):
            raise TypeError(
                f"cannot assign a {type(value).__name__} that is not a parameter to the "
                f"parameter {name!r}: wrap a tensor with nn.Parameter(tensor), or del the "
                "parameter first"
            )
        elif name in d.get("_buffers", ()) and (value is None or type(value) is ta.Tensor):
            d["_buffers"][name] = value
        elif name in d.get("_modules", ()) and value is None:
            d["_modules"][name] = None
        else:
            self._forget(name)
            object.__setattr__(self, name, value)

    def _forget(self, name: str, keep: str | None = None) -> None:
        """Drop `name` from every registry but `keep` (where an assignment replaces it in
        place, so the registration order, e.g. of a ModuleList, is kept)."""
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table != keep and name in d.get(table, ()):
                del d[table][name]
        if keep != "_buffers":
            d.get("_non_persistent", set()).discard(name)
        d.pop(name, None)

    def __getattr__(self, name: str):
        # only called when normal lookup fails: look in the registries
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        d = self.__dict__
        if not any(name in d[t] for t in ("_parameters", "_buffers", "_modules")):
            object.__delattr__(self, name)
        self._forget(name)

    def register_parameter(self, name: str, param: ta.Tensor | None) -> None:
        if param is not None and not is_parameter(param):
            raise TypeError(
                f"register_parameter({name!r}): expected a leaf tensor that requires grad "
                "(use nn.Parameter(tensor)) or None"
            )
        self._forget(name, keep="_parameters")
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: ta.Tensor | None,
                        persistent: bool = True) -> None:
        """A tensor that is state but not a parameter (moved by to(); in state_dict only
        if persistent)."""
        if tensor is not None and type(tensor) is not ta.Tensor:
            raise TypeError(f"register_buffer({name!r}): expected a ta.Tensor or None")
        self._forget(name, keep="_buffers")
        self._buffers[name] = tensor
        self._non_persistent.discard(name)
        if not persistent:
            self._non_persistent.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module({name!r}): {type(module).__name__} is not a Module")
        self._forget(name, keep="_modules")
        self._modules[name] = module

    register_module = add_module

    # ------------------------------------------------------------------ traversal
    def named_modules(self, prefix: str = "", remove_duplicate: bool = True, _memo=None):
        """(dotted name, module) for this module and every descendant; a module reachable
        by several paths is listed once, under its first, unless remove_duplicate=False."""
        memo = set() if _memo is None else _memo
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                path = f"{prefix}.{name}" if prefix else name
                yield from child.named_modules(path, remove_duplicate, memo)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        seen = set()
        for name, child in self._modules.items():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self):
        for _, m in self.named_children():
            yield m

    def _named_members(self, table: str, remove_duplicate: bool):
        seen = set()
        for prefix, module in self.named_modules(remove_duplicate=remove_duplicate):
            for name, t in getattr(module, table).items():
                if t is None or (remove_duplicate and id(t) in seen):
                    continue
                seen.add(id(t))
                yield (f"{prefix}.{name}" if prefix else name), t

    def named_parameters(self, remove_duplicate: bool = True):
        """(name, parameter) pairs; a tied parameter appears once, under its first name."""
        yield from self._named_members("_parameters", remove_duplicate)

    def parameters(self):
        for _, p in self.named_parameters():
            yield p

    def named_buffers(self, remove_duplicate: bool = True):
        yield from self._named_members("_buffers", remove_duplicate)

    def buffers(self):
        for _, b in self.named_buffers():
            yield b

    def apply(self, fn):
        """fn(module) for every descendant, then for self (as torch: children first)."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------------------------ state
    def state_dict(self, keep_vars: bool = False) -> OrderedDict:
        """name -> tensor for every parameter and persistent buffer, tied ones under each
        of their names (as torch). Tensors are detached views of the live memory unless
        keep_vars."""
        out = OrderedDict()
        for prefix, module in self.named_modules(remove_duplicate=False):
            dot = f"{prefix}." if prefix else ""
            for name, p in module._parameters.items():
                if p is not None:
                    out[dot + name] = p if keep_vars else p.detach()
            for name, b in module._buffers.items():
                if b is not None and name not in module._non_persistent:
                    out[dot + name] = b if keep_vars else b.detach()
        return out

    def load_state_dict(self, state_dict, strict: bool = True) -> IncompatibleKeys:
        """Copy values into the parameters and buffers in place (ties stay tied).

        Every key is checked before anything is written: a shape mismatch always raises,
        and with strict=True so do missing and unexpected keys, and so does a value that
        is neither a Tensor nor an array (None, a list: RuntimeError naming the key, as
        torch). Values may be ta.Tensors or NumPy arrays; they are cast to each target's
        dtype and device. A state_dict that is not a mapping (a list, a path) is a
        TypeError, as torch's.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}; "
                            f"load a file first (nn.load(path)) and pass the dict it returns")
        own = self.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        problems = []
        if strict and missing:
            problems.append("missing keys: " + ", ".join(missing))
        if strict and unexpected:
            problems.append("unexpected keys: " + ", ".join(unexpected))
        sources = {}
        for key, target in own.items():
            if key not in state_dict:
                continue
            value = state_dict[key]
            if type(value) is not ta.Tensor:
                if not (hasattr(value, "shape") and hasattr(value, "dtype")):  # an array
                    problems.append(f"while copying the parameter named {key!r}: expected a "
                                    f"Tensor or an array from the checkpoint, got "
                                    f"{type(value).__name__}")
                    continue
                value = ta.tensor(value)
            if tuple(value.shape) != tuple(target.shape):
                problems.append(
                    f"size mismatch for {key}: the checkpoint has shape {tuple(value.shape)}, "
                    f"the model has {tuple(target.shape)}"
                )
            sources[key] = value
        if problems:
            raise RuntimeError(
                f"load_state_dict into {type(self).__name__}: " + "; ".join(problems)
            )
        with ta.no_grad():
            for key, value in sources.items():
                own[key].copy_(value.to(own[key].device))
        return IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------------ modes and moves
    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            m.__dict__["training"] = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        zero_grads(self.parameters(), set_to_none)

    def to(self, *args, **kwargs) -> Module:
        """Move (and/or cast, for floating point tensors) every parameter and buffer, in
        place in this tree: model.to("cuda"), model.to(ta.float64). Tied tensors stay
        tied; gradients move with their parameters."""
        moved = {}  # id(old tensor) -> new tensor, so a tied tensor is moved once

        def convert(t: ta.Tensor) -> ta.Tensor:
            if t.is_floating_point():
                return t.to(*args, **kwargs)
            device = kwargs.get("device")
            for a in args:  # integer and bool tensors change device, never dtype
                if isinstance(a, str):
                    device = a
                elif type(a) is ta.Tensor:
                    device = a.device
            return t if device is None else t.to(device)

        with ta.no_grad():
            for module in self.modules():
                for table in ("_parameters", "_buffers"):
                    for name, t in getattr(module, table).items():
                        if t is None:
                            continue
                        if id(t) not in moved:
                            new = convert(t)
                            if new is not t and table == "_parameters":
                                grad = t.grad
                                new = Parameter(new, t.requires_grad)
                                if grad is not None:
                                    new.grad = convert(grad)
                            moved[id(t)] = new
                        getattr(module, table)[name] = moved[id(t)]
        return self

    def double(self) -> Module:
        return self.to(ta.float64)

    def float(self) -> Module:
        return self.to(ta.float32)

    def cpu(self) -> Module:
        return self.to("cpu")

    def cuda(self, device=None) -> Module:
        return self.to("cuda" if device is None else f"cuda:{int(device)}")

    # ------------------------------------------------------------------ calling
    def __call__(self, *args, **kwargs):
        required = _TENSOR_ARGS.get(type(self))
        if required is None:
            required = _TENSOR_ARGS[type(self)] = _tensor_args(type(self))
        if required:
            _check_tensor_args(self, required, args, kwargs)
        with ta.memory.module_scope(self):
            return self.forward(*args, **kwargs)

    def scope_name(self) -> str:
        """The memory-ledger scope of this module in the running call: its dotted name
        from the root, under the scope the root was called in."""
        return ta.memory.scope_of_call(self)

    # ------------------------------------------------------------------ printing
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = []
        for name, child in self._modules.items():
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n" + "\n".join(lines) + "\n)"


# Which forward arguments must be tensors, per Module class: for this package's own layers,
# every required positional argument of forward (x, idx, input, target). A user's module
# may take anything, so only the nn package's classes are checked; a container
# (Sequential) passes its input to a child, which checks it.
# Keyed weakly: a user's class (and, through its methods, its module's globals and the model
# in them) must not stay alive because it was once called.
_TENSOR_ARGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _tensor_args(cls) -> tuple:
    if cls.__module__.partition(".")[0] != "nn" or cls.forward is Module.forward:
        return ()
    if cls.forward is Sequential.forward:
        return ()
    params = list(inspect.signature(cls.forward).parameters.values())[1:]
    return tuple(p.name for p in params
                 if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty)


def _check_tensor_args(module: Module, names: tuple, args: tuple, kwargs: dict) -> None:
    """A non-Tensor where a layer needs a tensor is a TypeError naming the layer and the
    argument, as torch's (`layer_norm(): argument 'input' (position 1) must be Tensor`),
    not an AttributeError from deep inside an op."""
    for i, name in enumerate(names):
        value = args[i] if i < len(args) else kwargs.get(name, _MISSING)
        if value is _MISSING or type(value) is ta.Tensor:
            continue  # a missing argument: Python's own TypeError says so
        raise TypeError(f"{type(module).__name__}.forward(): argument {name!r} (position "
                        f"{i + 1}) must be Tensor, not {type(value).__name__}")


_MISSING = object()


class Sequential(Module):
    """Modules applied one after another: Sequential(Linear(4, 8), ReLU(), Linear(8, 2))."""

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        for i, m in enumerate(modules):
            self.add_module(str(i), m)

    def __getitem__(self, i):
        items = list(self._modules.values())
        if isinstance(i, slice):
            return Sequential(*items[i])
        return items[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


class ModuleList(Module):
    """A list of submodules, registered under "0", "1", ... (transformer.h.0, ...)."""

    def __init__(self, modules=()) -> None:
        super().__init__()
        self.extend(modules)

    def _key(self, i: int) -> str:
        n = len(self._modules)
        if not -n <= i < n:
            raise IndexError(f"ModuleList index {i} out of range for length {n}")
        return str(i % n)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return ModuleList(list(self._modules.values())[i])
        return self._modules[self._key(i)]

    def __setitem__(self, i: int, module: Module) -> None:
        self.add_module(self._key(i), module)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules) -> ModuleList:
        for m in modules:
            self.append(m)
        return self


class ModuleDict(Module):
    """A dict of submodules, registered under their keys (transformer.wte, ...)."""

    def __init__(self, modules=None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        self._forget(key)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def update(self, modules) -> None:
        items = modules.items() if hasattr(modules, "items") else modules
        for key, m in items:
            self.add_module(key, m)
