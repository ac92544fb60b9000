"""torch.autograd.functional: Jacobians, Hessians and vector products of a function of tensors.

Each function takes `func` and its `inputs` (a Tensor or a tuple of Tensors) and answers in
torch's shapes: a Tensor where the inputs (or outputs) were a single Tensor, a tuple where
they were a tuple. All of them are built on the tape: `func` runs on fresh aliases of the
inputs (views, no copy; a differentiable view of an input that requires grad, so that
with create_graph=True the result still reaches it), then `autograd.grad` runs backward.

- `vjp`: v^T J, one reverse pass.
- `jvp`: J v by the double-vjp trick. g(u) = J^T u is computed with a graph, u being a
  dummy cotangent that requires grad; g is linear in u, so the vjp of g with respect to u
  along v is J v, exactly, whatever value u holds (zeros here). It costs one forward and
  two reverse passes (the second runs backward through the graph of the first), and every
  op of func needs a differentiable backward.
- `jacobian`: one vjp per output element ("reverse-mode"), or one jvp per input element
  ("forward-mode", which torch runs only with vectorize=True); both loop here.
- `hessian`: the jacobian of the gradient, reverse over reverse (or forward over reverse).
- `vhp`: v^T H, the vjp of the gradient (a double backward).
- `hvp`: H v. A Hessian is symmetric wherever func is twice continuously differentiable,
  so H v is (v^T H)^T and hvp runs the same double backward as vhp; torch runs the
  double-vjp trick on the gradient instead, a third reverse pass through a third-order
  graph. The two agree except where the Hessian is not symmetric (points where func is
  not twice differentiable).

Without create_graph the results and func's outputs are returned detached.
"""

from __future__ import annotations

import contextlib

from .. import autograd, creation, ops
from ..tensor import Tensor
from .graph import AccumulateGrad, enable_grad, no_grad

__all__ = ["hessian", "hvp", "jacobian", "jvp", "vhp", "vjp"]

STRATEGIES = ("forward-mode", "reverse-mode")


# ----------------------------------------------------------------------------- public API
def vjp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """(func(inputs), v^T J): the vector-Jacobian product, one reverse pass.

    v matches func's outputs (a Tensor or a tuple of them); it may be left out when func
    returns one single-element Tensor. The product has the inputs' shapes.
    """
    with enable_grad():
        in_tuple, inputs = _as_tuple(inputs, "inputs", "vjp")
        inputs = _lift(inputs, create_graph)
        out_tuple, outputs = _as_tuple(func(*inputs), "outputs of func", "vjp")
        _check_outputs(outputs, strict, "vjp")
        if v is None:
            _single_element(outputs, "vjp", "func returns")
        else:
            v = _vectors(v, outputs, out_tuple, create_graph, "vjp", "output")
        grads = _grad(outputs, inputs, v, create_graph, _keep(create_graph, outputs, inputs))
        result = _zeros_for_unused(grads, inputs, strict, "vjp")
    return _post(outputs, out_tuple, create_graph), _post(result, in_tuple, create_graph)


def jvp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """(func(inputs), J v): the Jacobian-vector product by the double-vjp trick (module doc).

    v matches the inputs; it may be left out when the input is one single-element Tensor.
    The product has the outputs' shapes.
    """
    with enable_grad():
        in_tuple, inputs = _as_tuple(inputs, "inputs", "jvp")
        inputs = _lift(inputs, create_graph)
        if v is None:
            _single_element(inputs, "jvp", "the input is")
        else:
            v = _vectors(v, inputs, in_tuple, create_graph, "jvp", "input")
        out_tuple, outputs = _as_tuple(func(*inputs), "outputs of func", "jvp")
        _check_outputs(outputs, strict, "jvp")
        result = _double_vjp(outputs, inputs, v, create_graph, strict, "jvp")
    return _post(outputs, out_tuple, create_graph), _post(result, out_tuple, create_graph)


def jacobian(func, inputs, create_graph: bool = False, strict: bool = False,
             vectorize: bool = False, strategy: str = "reverse-mode"):
    """The Jacobian of func at inputs: J[i][j] of shape outputs[i].shape + inputs[j].shape.

    A single Tensor input (or output) drops its level of the nesting, as in torch.
    "reverse-mode" takes one vjp per output element, "forward-mode" one jvp per input
    element (the double-vjp trick: the gradient with a graph once, then one reverse pass
    through it per element). torch runs forward-mode only with vectorize=True and without
    create_graph or strict, and so does this; vectorize=True is accepted and runs the same
    loop (there is no vmap).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"jacobian: strategy must be one of {STRATEGIES}, got {strategy!r}")
    if strategy == "forward-mode":
        _forward_mode_allowed("jacobian", create_graph, strict, vectorize)
    if vectorize and strict:
        raise RuntimeError(
            "jacobian: strict=True and vectorize=True are not supported together (as in "
            "torch); set strict=False or vectorize=False"
        )
    with enable_grad():
        in_tuple, inputs = _as_tuple(inputs, "inputs", "jacobian")
        inputs = _lift(inputs, create_graph)
        out_tuple, outputs = _as_tuple(func(*inputs), "outputs of func", "jacobian")
        _check_outputs(outputs, strict, "jacobian")
        if strategy == "forward-mode":
            jac = _jacobian_by_columns(outputs, inputs)
        else:
            jac = _jacobian_by_rows(outputs, inputs, create_graph, strict)
    jac = tuple(_post(row, True, create_graph) for row in jac)
    return _unpack(jac, out_tuple, in_tuple)


def hessian(func, inputs, create_graph: bool = False, strict: bool = False,
            vectorize: bool = False, outer_jacobian_strategy: str = "reverse-mode"):
    """The Hessian of a scalar func: H[i][j] of shape inputs[i].shape + inputs[j].shape.

    The jacobian of the gradient: the inner jacobian keeps its graph, the outer one runs
    backward through it (reverse over reverse); outer_jacobian_strategy="forward-mode"
    (with vectorize=True, as in torch) takes jvps of the gradient instead.
    """
    if outer_jacobian_strategy not in STRATEGIES:
        raise ValueError(
            f"hessian: outer_jacobian_strategy must be one of {STRATEGIES}, got "
            f"{outer_jacobian_strategy!r}"
        )
    in_tuple, inputs = _as_tuple(inputs, "inputs", "hessian")

    def scalar_func(*args):
        out = func(*args)
        _check_scalar_output(out, "hessian")
        _check_outputs((out,), strict, "hessian")
        return out.reshape(())

    def gradient(*args):
        jac = jacobian(scalar_func, args, create_graph=True, strict=strict)
        if strict:
            for i, g in enumerate(jac):
                if not g.requires_grad:
                    raise RuntimeError(
                        f"hessian: the gradient with respect to input {i} does not depend on "
                        "the inputs (strict=True): func must be twice differentiable"
                    )
        return jac

    res = jacobian(gradient, inputs, create_graph=create_graph, strict=strict,
                   vectorize=vectorize, strategy=outer_jacobian_strategy)
    return _unpack(res, in_tuple, in_tuple)  # jacobian saw tuples on both sides


def vhp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """(func(inputs), v^T H) for a scalar func: the vjp of its gradient (a double backward).

    v matches the inputs (it may be left out for one single-element input); the product has
    the inputs' shapes.
    """
    return _hessian_product("vhp", func, inputs, v, create_graph, strict)


def hvp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """(func(inputs), H v) for a scalar func, computed as (v^T H)^T: the same double backward
    as vhp, exact wherever the Hessian is symmetric (func twice continuously
    differentiable; see the module doc for how torch differs)."""
    return _hessian_product("hvp", func, inputs, v, create_graph, strict)


# ----------------------------------------------------------------------------- the products
def _hessian_product(name: str, func, inputs, v, create_graph: bool, strict: bool):
    with enable_grad():
        in_tuple, inputs = _as_tuple(inputs, "inputs", name)
        inputs = _lift(inputs, create_graph)
        if v is None:
            _single_element(inputs, name, "the input is")
        else:
            v = _vectors(v, inputs, in_tuple, create_graph, name, "input")
        out = func(*inputs)
        _check_scalar_output(out, name)
        _check_outputs((out,), strict, name)
        first = _grad((out,), inputs, None, True, True)
        pairs = []
        for i, g in enumerate(first):
            if g is None or not g.requires_grad:
                if strict:
                    raise RuntimeError(
                        f"{name}: the gradient with respect to input {i} does not depend on "
                        "the inputs (strict=True): func must be twice differentiable"
                    )
                continue
            pairs.append((g, v[i] if v is not None else None))
        if pairs:
            grads = _grad(tuple(g for g, _ in pairs), inputs, tuple(w for _, w in pairs),
                          create_graph, _keep(create_graph, (out,), inputs))
        else:
            grads = (None,) * len(inputs)
        result = _zeros_for_unused(grads, inputs, strict, name)
    return _post((out,), False, create_graph), _post(result, in_tuple, create_graph)


def _double_vjp(outputs, inputs, v, create_graph: bool, strict: bool, name: str) -> tuple:
    """J v by the double-vjp trick: g = J^T u with a graph (u: zeros that require grad),
    then the vjp of g with respect to u along v. g is linear in u, so the value of u never
    enters the result."""
    u = tuple(_dummy_cotangent(o) for o in outputs)
    live = tuple(o for o, d in zip(outputs, u) if d is not None)
    dummies = tuple(d for d in u if d is not None)
    first = _grad(live, inputs, dummies, True, True)
    pairs = []
    for i, g in enumerate(first):
        if g is not None and g.requires_grad:
            pairs.append((g, v[i] if v is not None else None))
        elif strict:
            raise RuntimeError(
                f"{name}: the output of func is independent of input {i} (strict=True)"
            )
    if pairs and dummies:
        second = _grad(tuple(g for g, _ in pairs), dummies, tuple(w for _, w in pairs),
                       create_graph, _keep(create_graph, outputs, inputs))
    else:
        second = (None,) * len(dummies)
    found = iter(second)
    result = []
    for o, d in zip(outputs, u):
        g = next(found) if d is not None else None
        result.append(creation.zeros_like(o) if g is None else g)
    return tuple(result)


def _dummy_cotangent(o: Tensor):
    """The u of the double-vjp trick for output o (None if o has no gradient to take)."""
    if not o.requires_grad:
        return None
    return creation.zeros_like(o).requires_grad_()


def _jacobian_by_rows(outputs, inputs, create_graph: bool, strict: bool) -> tuple:
    """One vjp per output element: row k of the Jacobian is the gradient along e_k."""
    keep = _keep(create_graph, outputs, inputs)
    jac = []
    for i, out in enumerate(outputs):
        rows = [[] for _ in inputs]
        n = out.numel() if out.requires_grad else 0
        for k in range(n):
            last = i == len(outputs) - 1 and k == n - 1
            grads = _grad((out,), inputs, (_one_hot(out, k),), create_graph,
                          keep or not last)
            for j, g in enumerate(grads):
                if g is None and strict:
                    raise RuntimeError(
                        f"jacobian: output {i} of func is independent of input {j} "
                        "(strict=True)"
                    )
                if g is not None and strict and create_graph and not g.requires_grad:
                    raise RuntimeError(
                        f"jacobian: the jacobian of output {i} with respect to input {j} does "
                        "not depend on the inputs (strict=True with create_graph=True)"
                    )
                rows[j].append(g)
        jac.append(tuple(_stack_rows(rows[j], out, x) for j, x in enumerate(inputs)))
    return tuple(jac)


def _jacobian_by_columns(outputs, inputs, create_graph: bool = False) -> tuple:
    """One jvp per input element, by the double-vjp trick: the gradient g = J^T u once with
    a graph, then one reverse pass of g_j along e_k per element k of input j (with a graph
    of its own if create_graph)."""
    u = tuple(_dummy_cotangent(o) for o in outputs)
    live = tuple(o for o, d in zip(outputs, u) if d is not None)
    dummies = tuple(d for d in u if d is not None)
    first = _grad(live, inputs, dummies, True, True) if live else (None,) * len(inputs)
    columns = [[[] for _ in inputs] for _ in outputs]  # [output][input] -> columns
    for j, (x, g) in enumerate(zip(inputs, first)):
        if g is None or not g.requires_grad:
            continue
        for k in range(x.numel()):
            found = iter(_grad((g,), dummies, (_one_hot(x, k),), create_graph, True))
            for i, d in enumerate(u):
                col = next(found) if d is not None else None
                columns[i][j].append(col)
    return tuple(
        tuple(_stack_columns(columns[i][j], out, x) for j, x in enumerate(inputs))
        for i, out in enumerate(outputs)
    )


def _stack_rows(rows: list, out: Tensor, x: Tensor) -> Tensor:
    """(out.numel() gradients of x's shape) -> one Tensor of out.shape + x.shape."""
    shape = tuple(out.shape) + tuple(x.shape)
    if not rows or all(r is None for r in rows):
        return creation.zeros(shape, dtype=x.dtype, device=x.device)
    rows = [creation.zeros_like(x) if r is None else r for r in rows]
    return ops.stack(rows, 0).view(shape)


def _stack_columns(cols: list, out: Tensor, x: Tensor) -> Tensor:
    """(x.numel() tangents of out's shape) -> one Tensor of out.shape + x.shape."""
    shape = tuple(out.shape) + tuple(x.shape)
    if not cols or all(c is None for c in cols):
        return creation.zeros(shape, dtype=out.dtype, device=out.device)
    cols = [creation.zeros_like(out) if c is None else c for c in cols]
    return ops.stack(cols, out.ndim).view(shape)


# ----------------------------------------------------------------------------- the tape
def _grad(outputs, inputs, grad_outputs, create_graph: bool, retain_graph: bool) -> tuple:
    """autograd.grad over those outputs that require grad (None for an input none of them
    reaches; all None when no output requires grad)."""
    if grad_outputs is None:
        grad_outputs = (None,) * len(outputs)
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs)
             if o is not None and o.requires_grad]
    if not pairs:
        return (None,) * len(inputs)
    ctx = enable_grad() if create_graph else contextlib.nullcontext()
    with ctx:
        return tuple(autograd.grad([o for o, _ in pairs], list(inputs),
                                   [g for _, g in pairs], retain_graph=retain_graph,
                                   create_graph=create_graph, allow_unused=True))


def _keep(create_graph: bool, outputs, fresh) -> bool:
    """Whether backward must keep the graph: it is asked for (create_graph), or the graph
    reaches tensors other than the fresh aliases (a closure over a tensor with history,
    whose graph belongs to the caller and must stay runnable)."""
    return create_graph or reaches_outside(outputs, fresh)


def reaches_outside(tensors, fresh) -> bool:
    """Whether the graph behind `tensors` leads to a tensor that requires grad other than
    the ones in `fresh`: a leaf, or a history that enters through a differentiable alias.

    Gradients taken of these tensors then need a graph of their own for whoever can
    differentiate those outside tensors; with only fresh leaves behind them they need none.
    """
    fresh_ids = {id(t) for t in fresh}
    stack = []
    for t in tensors:
        if t is None or not t.requires_grad:
            continue
        if t.grad_fn is None:
            if id(t) not in fresh_ids:
                return True
            continue
        stack.append(t.grad_fn)
    seen = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, AccumulateGrad):
            if id(node.variable) not in fresh_ids:
                return True
            continue
        stack.extend(edge[0] for edge in node.next_functions if edge is not None)
    return False


def fresh_alias(x: Tensor, op: str, connect: bool = True) -> Tensor:
    """The tensor a transform differentiates with respect to, over x's memory (no copy).

    An x that requires grad gets (with `connect`) a differentiable view: its own gradient
    slot, its graph still leading to x, so a gradient taken with a graph can be
    differentiated again with respect to x. Any other x gets a detached alias that requires
    grad (a new leaf).
    """
    if not x.dtype.is_floating_point:
        raise RuntimeError(
            f"{op}: only Tensors of floating point dtype can be differentiated; got an input "
            f"of shape {tuple(x.shape)} and dtype {x.dtype.name}"
        )
    if connect and x.requires_grad:
        return x.view_as(x)
    return x.detach().requires_grad_()


def _lift(inputs: tuple, create_graph: bool) -> tuple:
    """torch's preprocessing: a differentiable alias of an input that requires grad when the
    caller wants a graph (so the result reaches it), else a detached alias (a new leaf)."""
    lifted = []
    for x in inputs:
        if create_graph and x.requires_grad:
            lifted.append(x.view_as(x))
        else:
            lifted.append(fresh_alias(x, "autograd.functional", connect=False))
    return tuple(lifted)


def _one_hot(like: Tensor, k: int) -> Tensor:
    """e_k in like's shape, dtype and device (a fresh buffer: the engine may hand it on)."""
    e = creation.zeros(like.numel(), dtype=like.dtype, device=like.device)
    with no_grad():
        e[k] = 1
    return e.view(tuple(like.shape))


# ----------------------------------------------------------------------------- checks
def _as_tuple(x, what: str, name: str) -> tuple:
    """(was it a tuple, the Tensors as a tuple); anything else is a TypeError."""
    is_tuple = isinstance(x, tuple)
    items = x if is_tuple else (x,)
    for i, t in enumerate(items):
        if not isinstance(t, Tensor):
            where = f"element {i} has type" if is_tuple else "got"
            raise TypeError(
                f"{name}: the {what} must be a Tensor or a tuple of Tensors; {where} "
                f"{type(t).__name__}"
            )
    return is_tuple, items


def _single_element(tensors: tuple, name: str, what: str) -> None:
    if len(tensors) != 1 or tensors[0].numel() != 1:
        shapes = [tuple(t.shape) for t in tensors]
        raise RuntimeError(
            f"{name}: v can be left out only when {what} a single Tensor with a single "
            f"element; got shapes {shapes}. Pass v."
        )


def _vectors(v, like: tuple, like_tuple: bool, create_graph: bool, name: str,
             what: str) -> tuple:
    """v as a tuple matching `like` in length and shapes (detached unless create_graph)."""
    _, v = _as_tuple(v, "v", name)
    if len(v) != len(like):
        raise RuntimeError(
            f"{name}: v has {len(v)} Tensors but there {'are' if len(like) != 1 else 'is'} "
            f"{len(like)} {what}{'s' if len(like) != 1 else ''}"
        )
    for i, (a, b) in enumerate(zip(v, like)):
        if tuple(a.shape) != tuple(b.shape):
            entry = f"entry {i} of v" if like_tuple else "v"
            raise RuntimeError(
                f"{name}: {entry} has shape {tuple(a.shape)} but {what} {i} has shape "
                f"{tuple(b.shape)}"
            )
    if create_graph:
        return tuple(a.view_as(a) if a.requires_grad else a for a in v)
    return tuple(a.detach() for a in v)


def _check_outputs(outputs: tuple, strict: bool, name: str) -> None:
    if not strict:
        return
    for i, o in enumerate(outputs):
        if not o.requires_grad:
            raise RuntimeError(
                f"{name}: output {i} of func does not require grad (strict=True): it must be "
                "computed from the inputs with differentiable ops"
            )


def _check_scalar_output(out, name: str) -> None:
    if not isinstance(out, Tensor):
        raise RuntimeError(
            f"{name}: func must return a single Tensor; got {type(out).__name__}"
        )
    if out.numel() != 1:
        raise RuntimeError(
            f"{name}: the Tensor func returns must have a single element; got shape "
            f"{tuple(out.shape)}"
        )


def _forward_mode_allowed(name: str, create_graph: bool, strict: bool,
                          vectorize: bool) -> None:
    if not vectorize:
        raise NotImplementedError(
            f"{name}: forward-mode runs only with vectorize=True (as in torch; here it is a "
            "loop of jvps by the double-vjp trick); pass vectorize=True, or use "
            "strategy='reverse-mode'"
        )
    if create_graph:
        raise NotImplementedError(
            f"{name}: forward-mode with create_graph=True is not supported (as in torch); use "
            "strategy='reverse-mode'"
        )
    if strict:
        raise RuntimeError(
            f"{name}: forward-mode with strict=True is not supported (as in torch); set "
            "strict=False or use strategy='reverse-mode'"
        )


def _zeros_for_unused(grads: tuple, inputs: tuple, strict: bool, name: str) -> tuple:
    out = []
    for i, (g, x) in enumerate(zip(grads, inputs)):
        if g is None:
            if strict:
                raise RuntimeError(
                    f"{name}: the output of func is independent of input {i} (strict=True)"
                )
            g = creation.zeros_like(x)
        out.append(g)
    return tuple(out)


# ----------------------------------------------------------------------------- results
def _post(tensors: tuple, as_tuple: bool, create_graph: bool):
    """Detach unless create_graph; a single Tensor where the caller gave one."""
    if not create_graph:
        tensors = tuple(t.detach() for t in tensors)
    return tensors if as_tuple else tensors[0]


def _unpack(nested: tuple, outer_tuple: bool, inner_tuple: bool):
    """torch's nesting: drop the inner level (inputs) and the outer one (outputs) where each
    was a single Tensor."""
    if not inner_tuple:
        nested = tuple(row[0] for row in nested)
    return nested if outer_tuple else nested[0]
