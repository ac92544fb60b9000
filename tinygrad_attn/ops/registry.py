"""The op registry: each public op function says, where it is defined, what it is called.

    @op(Exp, method=True, ta=True, functional=True)
    def exp(x): return Exp.apply(x)

records that `exp` applies the Function class `Exp` and is public as `x.exp()`, `ta.exp`
and `ta.functional.exp` / `nn.functional.exp`. Every name list of the engine is built from
here: `ta.ops.*` (every registered function), Tensor's methods, `ta.*` and the functional
modules. tests/test_registry.py walks it: every Function class must be reachable from a
public name, every name must exist, every differentiable op must have a gradcheck row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..autograd import Function


@dataclass(frozen=True)
class Entry:
    """One public op function and its public names."""

    fn: Callable
    classes: tuple  # the Function classes it applies (none: not differentiable)
    methods: tuple  # Tensor attributes that run it (written out in tensor.py or attached)
    ta: tuple  # the ta.<name> names (the function's own, and aliases torch has: ta.clip)
    functional: bool  # ta.functional.<name> and nn.functional.<name>

    @property
    def name(self) -> str:
        return self.fn.__name__


REGISTRY: dict[str, Entry] = {}


def op(*classes: type, method: bool | str | tuple = False, ta: bool | str | tuple = False,
       functional: bool = False) -> Callable:
    """Register the decorated function as a public op.

    classes: the Function classes it applies, directly or through another op function;
    none for an op without a gradient (a comparison, an argmax).
    method: True for a Tensor method of the function's name, or the method name(s). A
    method whose signature matches the function (self first) is the function itself;
    tensor.py writes out the others (`view(*shape)`) and must call this function.
    ta: True for ta.<name>, or the name(s) it has under ta (("clamp", "clip"): torch's
    aliases), which must be torch functions of the same signature.
    functional: also public as ta.functional.<name> and nn.functional.<name>.
    """
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, Function)):
            raise TypeError(f"op: {cls!r} is not a Function class")
    if method is True:
        methods = None  # the function's name, known once the decorator sees it
    elif method is False:
        methods = ()
    else:
        methods = (method,) if isinstance(method, str) else tuple(method)

    def register(fn: Callable) -> Callable:
        name = fn.__name__
        known = REGISTRY.get(name)
        if known is not None and known.fn.__module__ != fn.__module__:
            raise ValueError(f"op: {name!r} is registered twice ({known.fn.__module__} and "
                             f"{fn.__module__})")
        if ta is True:
            ta_names = (name,)
        elif ta is False:
            ta_names = ()
        else:
            ta_names = (ta,) if isinstance(ta, str) else tuple(ta)
        REGISTRY[name] = Entry(fn, classes, (name,) if methods is None else methods,
                               ta_names, functional)
        return fn

    return register


def names(where: str) -> dict[str, Callable]:
    """{public name: function} for one place: "ops" (every registered function), "ta",
    "functional" (ta.functional and nn.functional) or "method" (Tensor's attributes)."""
    if where == "ops":
        return {e.name: e.fn for e in REGISTRY.values()}
    if where == "method":
        return {m: e.fn for e in REGISTRY.values() for m in e.methods}
    if where == "ta":
        return {n: e.fn for e in REGISTRY.values() for n in e.ta}
    if where == "functional":
        return {e.name: e.fn for e in REGISTRY.values() if e.functional}
    raise ValueError(f"names: unknown place {where!r}; expected ops, method, ta or functional")
