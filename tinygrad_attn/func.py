"""torch.func's transforms, built on the tape: grad, grad_and_value, vjp, jvp, jacrev, jacfwd,
hessian and functional_call.

torch.func transforms functions of tensors that need not require grad. Here each transform
records a graph and runs the backward engine on it. Inside `grad(f)(x)`:

1. every tensor of the differentiated arguments is replaced by a fresh alias over its
   memory (no copy): a detached alias that requires grad (a new leaf), or, for a tensor
   that already requires grad, a differentiable view of it, so the graph still leads to it;
2. f runs under enable_grad (so a transform works inside no_grad too);
3. autograd.grad takes the gradient with respect to the aliases. It keeps a graph
   (create_graph=True) exactly when the graph behind f's output reaches a tensor that
   requires grad other than the fresh leaves: an input that required grad, a tensor f
   closes over, or the alias of an enclosing transform. That is what makes
   `grad(grad(f))(x)` work: the outer grad's alias requires grad, so the inner gradient
   is taken with a graph the outer one can run backward through. With nothing outside to
   reach, the gradient is a plain first-order backward and comes back without history,
   as torch's does. Under no_grad no graph is kept.

jvp and jacfwd have no forward-mode engine underneath: they use the double-vjp trick
(see ta.autograd.functional). hessian is jacrev(jacrev(f)).
"""

from __future__ import annotations

import contextlib
import functools

from . import creation
from .autograd import enable_grad, is_grad_enabled
from .autograd import functional as _af
from .tensor import Tensor

__all__ = ["functional_call", "grad", "grad_and_value", "hessian", "jacfwd", "jacrev", "jvp",
           "vjp"]

RANDOMNESS = ("error", "different", "same")


# ----------------------------------------------------------------------------- grad
def grad(func, argnums=0, has_aux: bool = False):
    """A function that returns the gradient of func (a scalar) with respect to the arguments
    `argnums` (an int, or a tuple of them), as the arguments' pytrees; with has_aux, func
    returns (output, aux) and the new function returns (gradient, aux).

        >>> ta.func.grad(lambda x: x.sin().sum())(x)          # == x.cos()
    """

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        grads, value = _grad_and_value(func, argnums, has_aux, args, kwargs)
        return (grads, value[1]) if has_aux else grads

    return wrapper


def grad_and_value(func, argnums=0, has_aux: bool = False):
    """Like grad, but the new function returns (gradient, value), or with has_aux
    (gradient, (value, aux)): func runs once for both."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return _grad_and_value(func, argnums, has_aux, args, kwargs)

    return wrapper


def _grad_and_value(func, argnums, has_aux: bool, args: tuple, kwargs: dict):
    name = "grad_and_value(f)(*args)"
    nums = _argnums(argnums, len(args), name)
    caller_records = is_grad_enabled()
    with enable_grad():
        args, fresh, specs = _lift_args(args, nums, name)
        out, aux = _split_aux(func(*args, **kwargs), has_aux, name)
        if not isinstance(out, Tensor):
            raise RuntimeError(
                f"{name}: expected f(*args) to return a Tensor, got {type(out).__name__}"
            )
        if out.ndim != 0:
            raise RuntimeError(
                f"{name}: expected f(*args) to return a scalar Tensor, got one of shape "
                f"{tuple(out.shape)}; use vjp or jacrev for a non-scalar output"
            )
        outside = _af.reaches_outside((out,), fresh)
        graph = caller_records and outside
        grads = _af._grad((out,), fresh, None, graph, outside)
        grads = [creation.zeros_like(x) if g is None else g for g, x in zip(grads, fresh)]
    grads = _unflatten_args(grads, specs, argnums)
    value = _result(out, fresh, caller_records)
    if has_aux:
        return grads, (value, _results(aux, fresh, caller_records, name))
    return grads, value


# ----------------------------------------------------------------------------- vjp / jvp
def vjp(func, *primals, has_aux: bool = False):
    """(func(*primals), vjp_fn) or, with has_aux, (output, vjp_fn, aux).

    vjp_fn(cotangents) takes cotangents shaped as the output pytree and returns, as a
    tuple with one entry per primal, v^T J in the primals' shapes; it may be called again
    (the graph is kept while vjp_fn lives, unless retain_graph=False).
    """
    name = "vjp(f, *primals)"
    caller_records = is_grad_enabled()
    with enable_grad():
        lifted, fresh, specs = _lift_args(primals, tuple(range(len(primals))), name)
        out, aux = _split_aux(func(*lifted), has_aux, name)
        out_leaves, out_spec = _flatten(out, name, "f(*primals) to return")
    outside = _af.reaches_outside(out_leaves, fresh)

    def vjp_fn(cotangents, retain_graph: bool = True, create_graph: bool | None = None):
        cts, ct_spec = _flatten(cotangents, "vjp_fn(cotangents)", "the cotangents to be")
        if ct_spec != out_spec:
            raise RuntimeError(
                "vjp_fn(cotangents): the cotangents must have the pytree structure of the "
                f"output: cotangents {_describe(ct_spec)}, output {_describe(out_spec)}"
            )
        for i, (c, o) in enumerate(zip(cts, out_leaves)):
            if tuple(c.shape) != tuple(o.shape):
                raise RuntimeError(
                    f"vjp_fn(cotangents): cotangent {i} has shape {tuple(c.shape)} but "
                    f"output {i} has shape {tuple(o.shape)}"
                )
        if create_graph is None:
            create_graph = is_grad_enabled() and (
                outside or any(c.requires_grad for c in cts))
        grads = _af._grad(out_leaves, fresh, cts, create_graph, retain_graph)
        grads = [creation.zeros_like(x) if g is None else g for g, x in zip(grads, fresh)]
        return tuple(_unflatten_all(grads, specs))

    result = _unflatten([_result(o, fresh, caller_records) for o in out_leaves], out_spec)
    if has_aux:
        return result, vjp_fn, _results(aux, fresh, caller_records, name)
    return result, vjp_fn


def jvp(func, primals, tangents, *, strict: bool = False, has_aux: bool = False):
    """(func(*primals), J t) or, with has_aux, (output, J t, aux): the Jacobian-vector
    product along `tangents` (a tuple shaped as `primals`).

    There is no forward-mode engine: J t comes from the double-vjp trick. g(u) = J^T u is
    taken with a graph (u: zeros that require grad, one per output); g is linear in u, so
    the vjp of g along t with respect to u is J t, exactly, whatever u holds. That is one
    forward and two reverse passes, the second through the graph of the first, so every
    op of func needs a differentiable backward. `strict` is accepted and changes nothing
    (as in torch).
    """
    name = "jvp(f, primals, tangents)"
    if not isinstance(primals, tuple):
        raise RuntimeError(
            f"{name}: expected primals to be a tuple (f(*primals) must be valid), got "
            f"{type(primals).__name__}"
        )
    if not isinstance(tangents, tuple):
        raise RuntimeError(f"{name}: expected tangents to be a tuple, got "
                           f"{type(tangents).__name__}")
    p_leaves, p_spec = _flatten(primals, name, "the primals to be")
    t_leaves, t_spec = _flatten(tangents, name, "the tangents to be")
    if p_spec != t_spec:
        raise RuntimeError(
            f"{name}: primals and tangents must have the same pytree structure: primals "
            f"{_describe(p_spec)}, tangents {_describe(t_spec)}"
        )
    for i, (p, t) in enumerate(zip(p_leaves, t_leaves)):
        if tuple(p.shape) != tuple(t.shape):
            raise RuntimeError(
                f"{name}: tangent {i} has shape {tuple(t.shape)} but primal {i} has shape "
                f"{tuple(p.shape)}"
            )
    caller_records = is_grad_enabled()
    with enable_grad():
        lifted, fresh, _ = _lift_args(primals, tuple(range(len(primals))), name)
        out, aux = _split_aux(func(*lifted), has_aux, name)
        out_leaves, out_spec = _flatten(out, name, "f(*primals) to return")
        outside = _af.reaches_outside(out_leaves, fresh)
        graph = caller_records and (outside or any(t.requires_grad for t in t_leaves))
        if not graph:
            t_leaves = [t.detach() for t in t_leaves]
        tangent_out = _af._double_vjp(tuple(out_leaves), tuple(fresh), tuple(t_leaves),
                                      graph, False, name)
    result = _unflatten([_result(o, fresh, caller_records) for o in out_leaves], out_spec)
    tangent_out = _unflatten(list(tangent_out), out_spec)
    if has_aux:
        return result, tangent_out, _results(aux, fresh, caller_records, name)
    return result, tangent_out


# ----------------------------------------------------------------------------- Jacobians
def jacrev(func, argnums=0, *, has_aux: bool = False, chunk_size: int | None = None):
    """A function that returns the Jacobian of func with respect to `argnums`, by reverse
    mode: one vjp per output element (row). For each output leaf, a Tensor of shape
    output.shape + input.shape, nested as argnums (an int: as that argument's pytree; a
    tuple: a tuple of them). `chunk_size` is accepted (rows run one at a time anyway)."""
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"jacrev: chunk_size must be greater than 0, got {chunk_size}")

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return _jacobian(func, argnums, has_aux, args, kwargs, "jacrev")

    return wrapper


def jacfwd(func, argnums=0, has_aux: bool = False, *, randomness: str = "error"):
    """A function that returns the Jacobian of func with respect to `argnums`, column by
    column: one jvp per input element, each by the double-vjp trick. The gradient
    g = J^T u (u: dummy cotangents) is taken once with a graph; column k is then one more
    reverse pass, of g along e_k with respect to u. So it costs one forward, one reverse
    pass and one reverse pass per input element (through a second-order graph): unlike
    torch's, it is never cheaper than jacrev, and it needs every op's double backward.
    Results are nested as jacrev's. `randomness` is checked and has no effect (no vmap)."""
    if randomness not in RANDOMNESS:
        raise ValueError(f"jacfwd: randomness must be one of {RANDOMNESS}, got {randomness!r}")

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return _jacobian(func, argnums, has_aux, args, kwargs, "jacfwd")

    return wrapper


def hessian(func, argnums=0):
    """A function that returns the Hessian of func with respect to `argnums`: jacrev of
    jacrev, nested as jacrev's twice (a tuple argnums gives H[i][j]).

    torch uses jacfwd(jacrev(f)), cheap where forward mode is real; here jacfwd is itself
    built from reverse passes, and over jacrev it would need third derivatives of every
    op, where jacrev(jacrev(f)) needs second ones."""
    return jacrev(jacrev(func, argnums), argnums)


def _jacobian(func, argnums, has_aux: bool, args: tuple, kwargs: dict, name: str):
    label = f"{name}(f)(*args)"
    nums = _argnums(argnums, len(args), label)
    caller_records = is_grad_enabled()
    with enable_grad():
        args, fresh, specs = _lift_args(args, nums, label)
        out, aux = _split_aux(func(*args, **kwargs), has_aux, label)
        out_leaves, out_spec = _flatten(out, label, "f(*args) to return")
        outside = _af.reaches_outside(out_leaves, fresh)
        graph = caller_records and outside
        outs, ins = tuple(out_leaves), tuple(fresh)
        if name == "jacrev":
            jac = _af._jacobian_by_rows(outs, ins, graph, False)
        else:
            jac = _af._jacobian_by_columns(outs, ins, graph)
    per_output = [_unflatten_args(list(row), specs, argnums) for row in jac]
    result = _unflatten(per_output, out_spec)
    if has_aux:
        return result, _results(aux, fresh, caller_records, label)
    return result


# ----------------------------------------------------------------------------- functional_call
def functional_call(module, parameter_and_buffer_dicts, args=None, kwargs=None, *,
                    tie_weights: bool = True, strict: bool = False):
    """module(*args, **kwargs) with some of its parameters and buffers replaced, by name
    ("0.weight", "transformer.h.0.attn.c_attn.weight"), by the given tensors; the module's
    own are back in place afterwards, also when the call raises.

    `parameter_and_buffer_dicts` is a dict or a sequence of dicts (a name in two of them
    is an error). `args` that is not a tuple is the single argument. With tie_weights, a
    replacement for one of several names that share one tensor in the module (a tied
    embedding) replaces it under all of them, and different values for tied names are an
    error. A name that is no parameter or buffer of the module is ignored, unless strict,
    which also wants every parameter and buffer given. So
    `grad(lambda p: loss(functional_call(model, p, (x,))))(params)` differentiates a loss
    with respect to a dict of tensors.
    """
    given = _merged_dicts(parameter_and_buffer_dicts)
    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = (args,)
    with _swapped(module, given, tie_weights, strict):
        return module(*args, **(kwargs or {}))


def _merged_dicts(dicts) -> dict:
    if isinstance(dicts, dict):
        dicts = (dicts,)
    elif not isinstance(dicts, (tuple, list)) or not all(isinstance(d, dict) for d in dicts):
        raise ValueError(
            "functional_call: parameter_and_buffer_dicts must be a dict or a tuple/list of "
            f"dicts, got {type(dicts).__name__}"
        )
    merged: dict = {}
    for d in dicts:
        twice = sorted(k for k in d if k in merged)
        if twice:
            raise ValueError(
                f"functional_call: {twice} appear in more than one of the dicts; which value "
                "to use is ambiguous"
            )
        merged.update(d)
    for key, value in merged.items():
        if not isinstance(value, Tensor):
            raise TypeError(
                f"functional_call: the value for {key!r} must be a Tensor, got "
                f"{type(value).__name__}"
            )
    return merged


@contextlib.contextmanager
def _swapped(module, given: dict, tie_weights: bool, strict: bool):
    """The module's registries hold the given tensors until the block ends."""
    names: dict = {}  # name -> the module's tensor under it
    for table in ("named_parameters", "named_buffers"):
        for name, t in getattr(module, table)(remove_duplicate=False):
            names[name] = t
    given = dict(given)
    if tie_weights:
        _tie(names, given)
    unexpected = [k for k in given if k not in names]
    if strict:
        missing = [k for k in names if k not in given]
        if unexpected or missing:
            raise RuntimeError(
                f"functional_call: error(s) in reparametrizing {type(module).__name__} "
                f"(strict=True): unexpected key(s) {unexpected}, missing key(s) {missing}"
            )
    restore = []
    try:
        for name, value in given.items():
            if name not in names:
                continue
            table, key = _slot(module, name)
            restore.append((table, key, table[key]))
            table[key] = value
        yield
    finally:
        for table, key, old in reversed(restore):
            table[key] = old


def _tie(names: dict, given: dict) -> None:
    """Fill in the other names of a tied tensor from the one given (all given: one value)."""
    groups: dict = {}
    for name, t in names.items():
        groups.setdefault(id(t), []).append(name)
    for group in groups.values():
        passed = [n for n in group if n in given]
        if len(group) < 2 or not passed:
            continue
        value = given[passed[0]]
        if any(given[n] is not value for n in passed[1:]):
            raise ValueError(
                f"functional_call: different values for the names {passed}, which are tied "
                "(one tensor in the module); pass one of them, or tie_weights=False"
            )
        for n in group:
            given[n] = value


def _slot(module, name: str) -> tuple:
    """The registry (a module's _parameters or _buffers) and key that hold `name`."""
    *path, key = name.split(".")
    owner = module
    for part in path:
        owner = owner._modules[part]
    table = owner._parameters if key in owner._parameters else owner._buffers
    return table, key


# ----------------------------------------------------------------------------- arguments
def _argnums(argnums, n_args: int, name: str) -> tuple:
    """argnums as a tuple of non-negative positions, checked as torch checks them."""
    if isinstance(argnums, bool) or not isinstance(argnums, (int, tuple)):
        raise RuntimeError(
            f"{name}: argnums must be an int or a tuple of ints, got "
            f"{type(argnums).__name__}"
        )
    nums = argnums if isinstance(argnums, tuple) else (argnums,)
    if not nums:
        raise RuntimeError(f"{name}: argnums must be non-empty")
    out = []
    for a in nums:
        if isinstance(a, bool) or not isinstance(a, int):
            raise RuntimeError(f"{name}: argnums must be ints, got {type(a).__name__}")
        if not -n_args <= a < n_args:
            raise RuntimeError(
                f"{name}: got argnums={a}, but only {n_args} positional inputs"
            )
        out.append(a % n_args)
    if len(set(out)) != len(out):
        raise RuntimeError(f"{name}: argnums must be unique, got {argnums}")
    return tuple(out)


def _lift_args(args: tuple, nums: tuple, name: str) -> tuple:
    """(args with the differentiated ones replaced by fresh aliases, the aliases in order,
    the pytree spec of each differentiated argument)."""
    args = list(args)
    fresh, specs = [], []
    for i in nums:
        leaves, spec = _flatten(args[i], name, f"argument {i} to be", ValueError)
        lifted = [_af.fresh_alias(t, name) for t in leaves]
        args[i] = _unflatten(lifted, spec)
        fresh.extend(lifted)
        specs.append((spec, len(leaves)))
    return tuple(args), fresh, specs


def _unflatten_all(flat: list, specs: list) -> list:
    """One pytree per differentiated argument, from the leaves in order."""
    out, start = [], 0
    for spec, n in specs:
        out.append(_unflatten(flat[start:start + n], spec))
        start += n
    return out


def _unflatten_args(flat: list, specs: list, argnums):
    """As the argnums were given: one pytree for an int, a tuple of them for a tuple."""
    trees = _unflatten_all(flat, specs)
    return tuple(trees) if isinstance(argnums, tuple) else trees[0]


def _split_aux(out, has_aux: bool, name: str):
    if not has_aux:
        return out, None
    if not (isinstance(out, tuple) and len(out) == 2):
        raise RuntimeError(
            f"{name}: with has_aux=True, f must return a tuple (output, aux); got "
            f"{type(out).__name__}" + (f" of length {len(out)}" if isinstance(out, tuple)
                                       else "")
        )
    return out


def _result(t: Tensor, fresh: list, caller_records: bool) -> Tensor:
    """A tensor handed back to the caller: with its history if that reaches the caller's
    tensors (and the caller records), else detached (its graph ends at the fresh leaves)."""
    if caller_records and _af.reaches_outside((t,), fresh):
        return t
    return t.detach()


def _results(tree, fresh: list, caller_records: bool, name: str):
    leaves, spec = _flatten(tree, name, "aux to be")
    return _unflatten([_result(t, fresh, caller_records) for t in leaves], spec)


# ----------------------------------------------------------------------------- pytrees
# A spec is "*" for a Tensor, None for None, or (type, keys, child specs) for a tuple, list
# or dict (keys: the dict's keys in order, else None). Specs compare with ==.
_LEAF = "*"


def _flatten(tree, name: str, what: str, error=RuntimeError) -> tuple:
    """(the Tensors of a nested tuple/list/dict, in order; its spec). Anything else in it is
    `error`: torch's ValueError for arguments, RuntimeError for outputs, aux and tangents."""
    leaves: list = []
    spec = _flatten_into(tree, leaves, name, what, error)
    return leaves, spec


def _flatten_into(tree, leaves: list, name: str, what: str, error):
    if isinstance(tree, Tensor):
        leaves.append(tree)
        return _LEAF
    if tree is None:
        return None
    if isinstance(tree, (tuple, list)):
        kids = tuple(_flatten_into(t, leaves, name, what, error) for t in tree)
        return (type(tree), None, kids)
    if isinstance(tree, dict):
        keys = tuple(tree)
        kids = tuple(_flatten_into(tree[k], leaves, name, what, error) for k in keys)
        return (type(tree), keys, kids)
    raise error(
        f"{name}: expected {what} Tensors or (nested) tuples, lists or dicts of Tensors; got "
        f"{type(tree).__name__}"
    )


def _unflatten(leaves, spec):
    it = iter(leaves)
    return _build(spec, it)


def _build(spec, it):
    if spec == _LEAF:
        return next(it)
    if spec is None:
        return None
    kind, keys, kids = spec
    children = [_build(k, it) for k in kids]
    if keys is not None:
        return kind(zip(keys, children))
    if kind is tuple or kind is list:
        return kind(children)
    return kind(*children)  # a namedtuple


def _describe(spec) -> str:
    """A spec as text: * for a Tensor, (*, *) for a tuple, [*] for a list, {'a': *}."""
    if spec == _LEAF:
        return "*"
    if spec is None:
        return "None"
    kind, keys, kids = spec
    if keys is not None:
        return "{" + ", ".join(f"{k!r}: {_describe(s)}" for k, s in zip(keys, kids)) + "}"
    inner = ", ".join(_describe(s) for s in kids)
    if issubclass(kind, list):
        return f"[{inner}]"
    return f"({inner}{',' if len(kids) == 1 else ''})"
