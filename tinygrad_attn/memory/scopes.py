"""Module scopes: the ledger's name for each nn.Module call ("transformer.h.3.attn").

A module's scope is its dotted path from the module the call started at (the root, whose
own name is ""), under the scope that root was called in; so every byte allocated in its
forward (and, through the graph nodes, in backward) is attributed to the module that asked
for it. A module reached by several paths is named after the first (as named_modules()); one
called from a forward without being registered in the tree (kept in a plain list) is named
after its caller and its class ("Outer.Linear").

Modules are duck-typed (anything with named_modules()), so this module imports nothing from
the engine and sits, with state.py, below the layers that use it: nn.Module.__call__ enters
`module_scope(self)`, and ta.checkpoint (below the memory layer) names its node with
`scope_of_call(fn)` and replays its forward's `running_calls()` around the recompute.
The running calls are per thread (state.local), as the labels are: two threads calling two
models (or one) each name their own calls.
"""

from __future__ import annotations

from . import state


class _Call:
    """One running module call: the module, its dotted name from the root of the call, and
    (on the root's entry only) the ledger scope the root was called in and the tree's names."""

    __slots__ = ("module", "name", "prefix", "names")

    def __init__(self, module, name: str, prefix: str = "") -> None:
        self.module, self.name, self.prefix = module, name, prefix
        self.names = None  # id(module) -> (module, dotted name), read from the root's tree


def _name_in(calls: list, module) -> str:
    """`module`'s dotted name in the running call whose entries are `calls` (non-empty)."""
    root = calls[0]
    if root.names is None:  # once per root call, on its first submodule call
        root.names = {id(m): (m, name) for name, m in root.module.named_modules()}
    hit = root.names.get(id(module))
    if hit is not None and hit[0] is module:
        return hit[1]
    parent, kind = calls[-1].name, type(module).__name__
    return f"{parent}.{kind}" if parent else kind


def _scope(prefix: str, name: str) -> str:
    if prefix:
        return f"{prefix}.{name}" if name else prefix
    return name


def scope_of_call(fn) -> str:
    """The scope a call of `fn` made now runs under: a module's own scope (its name in the
    running call, or, called as a root, the current scope); for anything else, the current
    scope."""
    calls = state.local.module_calls
    if not calls or not hasattr(fn, "named_modules"):
        return state.local.labels["scope"]
    name = calls[-1].name if calls[-1].module is fn else _name_in(calls, fn)
    return _scope(calls[0].prefix, name)


class module_scope:  # noqa: N801 - used like a function: with ta.memory.module_scope(self)
    """The ledger labels of one module call: its scope (see the module docstring) and, on the
    root call of a model made outside any phase, the "forward" phase (a caller that set
    another phase, e.g. evaluation inside the optimizer's, keeps it)."""

    __slots__ = ("module", "label")

    def __init__(self, module) -> None:
        self.module = module

    def __enter__(self) -> None:
        here = state.local  # this thread's
        calls, current = here.module_calls, here.labels
        if calls:
            call = _Call(self.module, _name_in(calls, self.module))
            changes = {"scope": _scope(calls[0].prefix, call.name)}
        else:  # a root called inside a scope (a checkpoint's recompute, say) extends it
            call = _Call(self.module, "", prefix=current["scope"])
            changes = {"scope": call.prefix}
            if current["phase"] == "other":
                changes["phase"] = "forward"
        calls.append(call)
        self.label = state.labelled(**changes)
        self.label.__enter__()

    def __exit__(self, *exc) -> None:
        self.label.__exit__(*exc)
        state.local.module_calls.pop()


def running_calls() -> tuple:
    """The module calls running now (for resume_calls)."""
    return tuple(state.local.module_calls)


class resume_calls:  # noqa: N801 - used like a function
    """Run a block as if inside the module calls `calls` (from running_calls()): a
    checkpoint's recompute names the modules it reruns as its forward did."""

    __slots__ = ("calls", "previous")

    def __init__(self, calls: tuple) -> None:
        self.calls = calls

    def __enter__(self) -> None:
        running = state.local.module_calls
        self.previous = running[:]
        running[:] = self.calls

    def __exit__(self, *exc) -> None:
        state.local.module_calls[:] = self.previous
