"""In-place ops: they write into the tensor's Storage and declare it with ctx.mark_dirty.

mark_dirty bumps the version counter the tensor shares with its views, and autograd through
the op rebases the tensor's history (its grad_fn becomes the in-place op's node, whose input
edge is the tensor's previous history), as in PyTorch. Two cases are refused with a clear
error, before anything is written: an in-place op on a leaf that requires grad (it would
destroy the value the gradient is for), and, while recording, an in-place op on a view of
another tensor (its base's history cannot be rewritten here).

Memory overlap is refused as torch refuses it, also before anything is written: a target
with internal overlap (a dim of size > 1 with stride 0, as `expand` makes) would receive
several results in one element, and an operand that partly overlaps the target would be
read after some of it was overwritten. `fill_`/`zero_` (every element gets the same value)
and masked_fill_ on an expanded target (torch: only a deprecation warning) stay allowed.
"""

from __future__ import annotations

import warnings

from .. import backend
from .. import shape as shp
from ..autograd import Function, GradMode, check_inplace
from ..autograd.graph import Recorded, _rejoined, recording
from ..backend.dtypes import checked_scalar, scalar_as
from ..errors import ShapeError
from ..shape import has_internal_overlap, overlap_status
from ._util import Tensor, check_same_device, from_array, sum_to, unbroadcast
from .elementwise import div
from .indexing import resolve_index
from .registry import op

# ----------------------------------------------------------------------------- overlap
_INTERNAL = ("unsupported operation: more than one element of the written-to tensor refers to "
             "a single memory location. Please clone() the tensor before performing the "
             "operation.")
_PARTIAL = ("unsupported operation: some elements of the input tensor and the written-to "
            "tensor refer to a single memory location. Please clone() the tensor before "
            "performing the operation.")


def _geometry(t: Tensor) -> tuple:
    return t._shape, t._strides, t._offset


def check_internal_overlap(op: str, shape, strides) -> None:
    if has_internal_overlap(shape, strides):
        raise RuntimeError(f"{op}: {_INTERNAL} (written-to shape {tuple(shape)}, strides "
                           f"{tuple(strides)})")


def check_partial_overlap(op: str, target: tuple, storage, *operands, full: bool = False):
    """Refuse an operand that views part of the memory being written (torch's
    assert_no_partial_overlap; with `full`, assert_no_overlap: the same memory too)."""
    for o in operands:
        if type(o) is Tensor and o._storage is storage:
            status = overlap_status(target, _geometry(o))
            if status == "partial" or (full and status == "full"):
                raise RuntimeError(f"{op}: {_PARTIAL} (written-to shape {tuple(target[0])}, "
                                   f"input shape {tuple(o.shape)})")


def _check_broadcast_into(op: str, target: Tensor, other) -> None:
    if type(other) is Tensor and other.shape != target.shape:
        out = shp.broadcast_shapes(target.shape, other.shape, op=op)
        if out != target.shape:
            raise ShapeError(
                f"{op}: operand of shape {tuple(other.shape)} does not broadcast to the "
                f"in-place target's shape {tuple(target.shape)}"
            )


def _check_cast_back(op: str, x: Tensor, *operands, floating: bool = False) -> None:
    """torch's rule for in-place results: the promoted dtype must cast back to x's without
    leaving its category (float into an integer tensor, anything but bool into bool)."""
    result = backend.promote(x, *operands)
    if floating:
        result = backend.floating(result)
    if backend.category(result) > backend.category(x.dtype):
        raise RuntimeError(f"{op}: result type {result.name} can't be cast to the desired "
                           f"output type {x.dtype.name} (in-place on shape {tuple(x.shape)}); "
                           f"use the out-of-place op or cast first")


def _value(x, dtype):
    """An operand's array, or a Python number as an arithmetic operand: an int beyond the
    dtype's range wraps into it, as torch's (scalar_as)."""
    if type(x) is Tensor:
        return x._array()
    return scalar_as(x, dtype) if isinstance(x, (bool, int, float)) else x


def _bound(op: str, bound, dtype):
    """A clamp bound: a Python int must fit the dtype (and is then that dtype's scalar); a
    float bound of an integer tensor is left to the cast-back rules."""
    if type(bound) is int:
        return checked_scalar(op, bound, dtype)
    if type(bound) is float and dtype.is_floating_point:
        checked_scalar(op, bound, dtype)
    return bound


def _stored(op: str, x, dtype):
    """A Python number stored as a value (fill_, masked_fill_, setitem, clamp_'s bounds):
    it must fit the dtype, as torch checks it."""
    return x._array() if type(x) is Tensor else checked_scalar(op, x, dtype)


class AddInplace(Function):
    """x += alpha * other;  gx = g, g_other = alpha * g (summed to its shape). Saves nothing."""

    @staticmethod
    def forward(ctx, x, other, alpha=1):
        X = x._array()
        if alpha != 1:
            checked_scalar("add_", alpha, x.dtype)  # alpha must fit, as torch checks it
        if type(other) is Tensor:
            O = other._array() if alpha == 1 else other._array() * alpha
        else:  # a number: its product with alpha wraps into x's dtype as one operand
            O = _value(other * alpha if alpha != 1 else other, x.dtype)
        xp = backend.xp_for(x.device)
        xp.add(X, O, out=X, casting="unsafe")
        ctx.mark_dirty(x)
        ctx.alpha, ctx.other_shape = alpha, getattr(other, "shape", ())
        return x

    @staticmethod
    def backward(ctx, g):
        nx, no = ctx.needs_input_grad[:2]
        go = None
        if no:
            go = g if ctx.alpha == 1 else from_array(g._array() * ctx.alpha)
            go = unbroadcast(go, ctx.other_shape)
        return (g if nx else None), go


class MulInplace(Function):
    """x *= other;  gx = g * other, g_other = g * x_old. Saves other, and x_old only if the
    other operand needs a gradient (a copy made before the write, reason 'inplace-save')."""

    @staticmethod
    def forward(ctx, x, other):
        X, O = x._array(), _value(other, x.dtype)
        old = None
        if ctx.needs_input_grad[1]:
            old = from_array(backend.copy(X), "inplace-save")
        ctx.scalar = None if type(other) is Tensor else other
        ctx.other_shape = getattr(other, "shape", ())
        # saved before the write: if `other` views x's memory (x.mul_(x)), backward will
        # see its version moved and refuse, instead of using the overwritten values
        ctx.save_for_backward(other if type(other) is Tensor else None, old)
        backend.xp_for(x.device).multiply(X, O, out=X, casting="unsafe")
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        other, old = ctx.saved_tensors
        nx, no = ctx.needs_input_grad[:2]
        G = g._array()
        O = ctx.scalar if other is None else other._array()
        gx = from_array(G * O) if nx else None
        go = unbroadcast(from_array(G * _old_value(ctx, old)._array()), ctx.other_shape) \
            if no else None
        return gx, go


def _old_value(ctx, old):
    """The copy of x an in-place op made before its write, as its backward reads it: in a
    recorded backward (create_graph=True) it takes the history x had before the write (the
    op's input edge), so that the next derivative flows through it into x's producer."""
    if recording() and ctx.next_functions[0] is not None:
        return Recorded(_rejoined(old.t, *ctx.next_functions[0]))
    return old


class DivInplace(Function):
    """x /= other;  gx = g / other, g_other = -g * x_new / other. Saves other and x_new."""

    @staticmethod
    def forward(ctx, x, other):
        X, O = x._array(), _value(other, x.dtype)
        if type(other) is Tensor and other._storage is x._storage and ctx.needs_input_grad[1]:
            raise RuntimeError(
                f"div_: the divisor (shape {tuple(other.shape)}) shares memory with the "
                "tensor being divided in place and needs a gradient; use x / y instead"
            )
        backend.xp_for(x.device).true_divide(X, O, out=X, casting="unsafe")
        ctx.mark_dirty(x)
        ctx.scalar = None if type(other) is Tensor else other
        ctx.other_shape = getattr(other, "shape", ())
        ctx.save_for_backward(other if type(other) is Tensor else None,
                              x if ctx.needs_input_grad[1] else None)
        return x

    @staticmethod
    def backward(ctx, g):
        other, new = ctx.saved_tensors
        nx, no = ctx.needs_input_grad[:2]
        G = g._array()
        O = ctx.scalar if other is None else other._array()
        gx = from_array(G / O) if nx else None
        go = unbroadcast(from_array(-G * new._array() / O), ctx.other_shape) if no else None
        return gx, go


class FillInplace(Function):
    """x[...] = value;  gx = 0 (the old values are gone), g_value = sum(g). Saves nothing."""

    @staticmethod
    def forward(ctx, x, value):
        x._array()[...] = _stored("fill_", value, x.dtype)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        gv = from_array(g._array().sum()) if ctx.needs_input_grad[1] else None
        return None, gv


class CopyInplace(Function):
    """x[...] = src (broadcast, cast to x's dtype);  gx = 0, g_src = g summed to src's shape.

    Saves nothing.
    """

    @staticmethod
    def forward(ctx, x, src):
        ctx.src_shape, ctx.src_dtype = src.shape, src.dtype
        x._array()[...] = src._array()
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        gs = None
        if ctx.needs_input_grad[1]:
            gs = unbroadcast(g, ctx.src_shape)
            if gs.dtype is not ctx.src_dtype:
                gs = from_array(backend.copy(gs._array(), ctx.src_dtype))
        return None, gs


class MaskedFillInplace(Function):
    """x[mask] = value;  gx = g with zeros where mask. Saves the mask."""

    @staticmethod
    def forward(ctx, x, mask, value):
        if mask.dtype.name != "bool":
            raise TypeError(f"masked_fill_: mask must be a bool tensor, got {mask.dtype.name}")
        _check_broadcast_into("masked_fill_", x, mask)
        xp = backend.xp_for(x.device)
        X = x._array()
        xp.copyto(X, _stored("masked_fill_", value, x.dtype),
                  where=xp.broadcast_to(mask._array(), X.shape), casting="unsafe")
        ctx.mark_dirty(x)
        ctx.save_for_backward(mask)
        return x

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return from_array(backend.masked_fill(g._array(), mask._array(), 0)), None, None


class ClampInplace(Function):
    """x = clamp(x, lo, hi);  gx = g where lo <= x_old <= hi. Saves that mask (bool)."""

    @staticmethod
    def forward(ctx, x, lo, hi):
        if lo is None and hi is None:
            raise ValueError("clamp_: at least one of min and max must be given")
        X = x._array()
        xp = backend.xp_for(x.device)
        # a number must fit x's dtype, as torch checks it (an int is then read in that dtype)
        lo, hi = (_bound("clamp_", b, x.dtype) for b in (lo, hi))
        if ctx.needs_input_grad[0]:
            inside = xp.ones(X.shape, dtype=bool)
            if lo is not None:
                inside &= X >= lo
            if hi is not None:
                inside &= X <= hi
            ctx.save_for_backward(from_array(inside))
        xp.clip(X, lo, hi, out=X)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        (inside,) = ctx.saved_tensors
        return from_array(g._array() * inside._array()), None, None


class SetItem(Function):
    """x[index] = value;  gx = g with zeros at index, g_value = g[index] summed to its shape.

    Saves nothing but the index.
    """

    @staticmethod
    def forward(ctx, x, value, index):
        X = x._array()
        # torch checks a stored number's range, but not float16's (1e5 becomes inf there)
        V = value if x.dtype is backend.float16 else _stored("setitem", value, x.dtype)
        try:
            index.write(X, V)
        except ValueError as e:
            vshape = tuple(value.shape) if type(value) is Tensor else ()
            raise ShapeError(
                f"setitem: cannot assign a value of shape {vshape} to the indexed part of a "
                f"tensor of shape {tuple(x.shape)}: {e}"
            ) from None
        ctx.mark_dirty(x)
        ctx.index, ctx.basic = index, index.arrays is None
        ctx.value_shape = value.shape if type(value) is Tensor else None
        return x

    @staticmethod
    def backward(ctx, g):
        nx, nv = ctx.needs_input_grad[:2]
        G = g._array()
        gx = gv = None
        if nx:
            out = backend.copy(G)
            ctx.index.write(out, 0)
            gx = from_array(out)
        if nv:
            part = ctx.index.read(G)  # a view for a basic index, a new array for an advanced one
            if part.shape != tuple(ctx.value_shape):
                part = sum_to(part, ctx.value_shape, backend.xp_for(g.device))
            elif ctx.basic:
                part = backend.copy(part)  # a gradient needs memory of its own
            gv = from_array(part)
        return gx, gv


_KINDS = {"add": AddInplace, "mul": MulInplace, "div": DivInplace, "fill": FillInplace,
          "copy": CopyInplace, "masked_fill": MaskedFillInplace, "clamp": ClampInplace}


def _guard(op: str, x: Tensor, *others) -> None:
    """mark_dirty's refusals, made before the op writes anything."""
    recording = GradMode.enabled and (
        x.requires_grad or any(type(o) is Tensor and o.requires_grad for o in others))
    check_inplace(op, x, recording)


# torch's in-place forms of the other ops (x.exp_(), x.scatter_(...)): the op's result, made
# out of place and copied in (kind "result"; tensor.py makes each method from its name)
RESULT_METHODS = tuple(f"{name}_" for name in (
    "abs", "absolute", "acos", "acosh", "addcdiv", "addcmul", "addmm", "arccos", "arccosh",
    "arcsin", "arcsinh", "arctan", "arctan2", "arctanh", "asin", "asinh", "atan", "atan2",
    "atanh", "baddbmm", "bitwise_and", "bitwise_left_shift", "bitwise_not", "bitwise_or",
    "bitwise_right_shift", "bitwise_xor", "ceil", "clip", "copysign", "cos", "cosh",
    "cumprod", "cumsum", "divide", "eq", "erf", "erfc", "erfinv", "exp", "exp2", "expm1",
    "fix", "floor", "floor_divide", "fmod", "frac", "ge", "greater", "greater_equal", "gt",
    "hypot", "index_add", "index_copy", "index_fill", "le", "lerp", "less", "less_equal",
    "log", "log10", "log1p", "log2", "logical_and", "logical_not", "logical_or",
    "logical_xor", "lt", "masked_scatter", "multiply", "nan_to_num", "ne", "neg", "negative",
    "not_equal", "pow", "reciprocal", "relu", "remainder", "round", "rsqrt", "scatter",
    "scatter_add", "scatter_reduce", "sgn", "sigmoid", "sign", "sin", "sinh", "sqrt",
    "square", "subtract", "tan", "tanh", "tril", "triu", "true_divide", "trunc"))


@op(AddInplace, MulInplace, DivInplace, FillInplace, CopyInplace, MaskedFillInplace,
    ClampInplace, method=("add_", "sub_", "mul_", "div_", "zero_", "fill_", "copy_",
                          "masked_fill_", "clamp_") + RESULT_METHODS)
def inplace(x: Tensor, kind: str, *args):
    if kind == "result":  # inplace(x, "result", "exp_", x.exp()): the result, copied in
        op, result = args
        _guard(op, x, result)
        check_internal_overlap(op, x._shape, x._strides)
        _check_broadcast_into(op, x, result)
        if result.shape != x.shape:
            raise ShapeError(f"{op}: the result's shape {tuple(result.shape)} is not the "
                             f"in-place target's {tuple(x.shape)}")
        _check_cast_back(op, x, result)
        return CopyInplace.apply(x, result)
    op = "div_" if kind == "rounded_div" else f"{kind}_"
    _guard(op, x, *args)
    check_same_device(op, x, *args)
    if kind == "masked_fill":
        if has_internal_overlap(x._shape, x._strides):
            warnings.warn("masked_fill_: use of masked_fill_ on expanded tensors is deprecated; "
                          "clone() the tensor first", UserWarning, stacklevel=3)
        check_partial_overlap(op, _geometry(x), x._storage, args[0])
    elif kind != "fill":  # fill_ and zero_ give every element one value: allowed as torch
        check_internal_overlap(op, x._shape, x._strides)
        check_partial_overlap(op, _geometry(x), x._storage, *args)
    if kind in ("add", "mul", "div", "copy", "rounded_div"):
        _check_broadcast_into(op, x, args[0])
    if kind in ("add", "mul", "div"):
        _check_cast_back(op, x, args[0], floating=kind == "div")
    if kind == "copy" and type(args[0]) is not Tensor:
        raise TypeError(f"copy_: src must be a Tensor, got {type(args[0]).__name__}")
    if kind == "rounded_div":  # x.div_(y, rounding_mode=...): the rounded quotient, copied in
        quotient = div(x, args[0], rounding_mode=args[1])
        _check_cast_back("div_", x, quotient.dtype)
        return CopyInplace.apply(x, quotient)
    fn = _KINDS[kind]
    if kind == "add":
        out = fn.apply(x, args[0], alpha=args[1])
    else:
        out = fn.apply(x, *args)
    return out


@op(SetItem, method="__setitem__")
def setitem(x: Tensor, index, value) -> None:
    _guard("setitem", x, value)
    check_same_device("setitem", x, value)
    resolved = resolve_index(x, index, "setitem")
    if type(value) is int and not -(1 << 63) <= value < 1 << 63:  # torch reads it as int64
        raise ValueError(f"setitem: the int {value} overflows int64 (target of shape "
                         f"{tuple(x.shape)})")
    if type(value) is not Tensor and not isinstance(value, (int, float, bool)):
        value = Tensor(value, dtype=x.dtype, device=x.device)
    shares = type(value) is Tensor and value._storage is x._storage
    if shares or 0 in x._strides:  # only then can the write overlap itself
        _check_setitem_overlap(x, resolved, value)
    SetItem.apply(x, value, index=resolved)


def _check_setitem_overlap(x: Tensor, resolved, value) -> None:
    """torch's checks for x[index] = value: a basic index copies into the view x[index]
    (copy_'s checks); an advanced one is index_put_ on the basic part's view, which only
    warns about an expanded target and refuses a value over any of its memory."""
    view = shp.index_geometry(x._shape, x._strides, x._offset, resolved.basic)
    if resolved.arrays is None:
        check_internal_overlap("setitem", view[0], view[1])
        check_partial_overlap("setitem", view, x._storage, value)
        return
    if has_internal_overlap(view[0], view[1]):
        warnings.warn("setitem: use of index_put_ on expanded tensors is deprecated; clone() "
                      "the tensor first", UserWarning, stacklevel=4)
    check_partial_overlap("setitem", view, x._storage, value, full=True)


_ADAMW_NAMES = ("param", "grad", "exp_avg", "exp_avg_sq")


def _check_adamw_quad(op: str, tensors) -> None:
    """One (param, grad, exp_avg, exp_avg_sq): tensors of param's shape and float dtype, on
    one device, four distinct buffers (p, m, v are written while g, m, v are read)."""
    names, param = _ADAMW_NAMES, tensors[0]
    for name, t in zip(names, tensors):
        if type(t) is not Tensor:
            raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
    if GradMode.enabled and any(t.requires_grad for t in tensors):
        raise RuntimeError(f"{op}: an optimizer update is not differentiable; call it under "
                           "ta.no_grad()")
    for name, t in zip(names[1:], tensors[1:]):
        if t.shape != param.shape:
            raise ShapeError(f"{op}: {name} has shape {tuple(t.shape)}, param has "
                             f"{tuple(param.shape)}")
        if t.dtype != param.dtype:
            raise TypeError(f"{op}: {name} is {t.dtype.name}, param is {param.dtype.name}")
    check_same_device(op, *tensors)
    for t in (tensors[0], tensors[2], tensors[3]):  # the three written (grad is only read)
        check_internal_overlap(op, t._shape, t._strides)
    for i in range(4):
        for j in range(i + 1, 4):
            if tensors[i]._storage is tensors[j]._storage:
                raise ValueError(f"{op}: {names[i]} and {names[j]} share memory (shape "
                                 f"{tuple(param.shape)}); each needs its own buffer")
    if not param.dtype.is_floating_point:
        raise TypeError(f"{op}: param must be floating point, got {param.dtype.name}")


def _adamw_quads(op: str, param, grad, exp_avg, exp_avg_sq) -> list:
    """The (param, grad, exp_avg, exp_avg_sq) quadruples of a call: one, or one per entry
    of four equal-length sequences."""
    if type(param) is Tensor or not isinstance(param, (list, tuple)):
        return [(param, grad, exp_avg, exp_avg_sq)]
    seqs = (param, grad, exp_avg, exp_avg_sq)
    for name, seq in zip(_ADAMW_NAMES, seqs):
        if not isinstance(seq, (list, tuple)) or len(seq) != len(param):
            raise TypeError(f"{op}: with a list of {len(param)} params, {name} must be a list "
                            f"of {len(param)} tensors too, got {type(seq).__name__}"
                            + (f" of {len(seq)}" if isinstance(seq, (list, tuple)) else ""))
    return list(zip(*seqs))


def _shares_buffers(quads) -> bool:
    """Whether a buffer written (a param, an exp_avg, an exp_avg_sq) is also another
    quadruple's operand (grads may share among themselves: they are only read)."""
    written = [t._storage for q in quads for t in (q[0], q[2], q[3])]
    ids = {id(st) for st in written}
    return len(ids) != len(written) or any(id(q[1]._storage) in ids for q in quads)


@op()  # no graph node; ta.functional names it by hand, nn.functional does not
def adamw_update_(param, grad, exp_avg, exp_avg_sq, *, lr: float, beta1: float,
                  beta2: float, eps: float, weight_decay: float, step: int):
    """One fused AdamW step, in place on param, exp_avg and exp_avg_sq (torch.optim.AdamW's
    arithmetic; see backend.adamw_update). Not differentiable: call it under ta.no_grad().

    The four may also be equal-length lists of tensors (a parameter group at one step, as
    torch's foreach and fused AdamW take): one call then updates every parameter as one
    call each would, in order, and the compiled kernel does it in one parallel pass (one
    at a time where a buffer written is another entry's operand). Everything is checked
    before anything is written.

    It allocates no Storage: on CPU the update runs block by block through one small
    scratch buffer (or in one pass, compiled) instead of the parameter-sized temporaries
    that a chain of in-place ops (grad * grad, exp_avg_sq.sqrt(), ...) needs. Returns
    param."""
    op = "adamw_update_"
    quads = _adamw_quads(op, param, grad, exp_avg, exp_avg_sq)
    for quad in quads:
        _check_adamw_quad(op, quad)
    if len(quads) > 1:
        check_same_device(op, *(q[0] for q in quads))
    if int(step) < 1:
        raise ValueError(f"{op}: step counts from 1, got {step}")
    if not (lr >= 0 and eps >= 0 and weight_decay >= 0 and 0 <= beta1 < 1 and 0 <= beta2 < 1):
        raise ValueError(f"{op}: need lr, eps, weight_decay >= 0 and betas in [0, 1); got "
                         f"lr={lr}, eps={eps}, weight_decay={weight_decay}, "
                         f"betas=({beta1}, {beta2})")
    hyper = (lr, beta1, beta2, eps, weight_decay, int(step))
    if len(quads) == 1 or _shares_buffers(quads):  # shared: one after another, in order
        for q in quads:
            backend.kernels.adamw_update(*(t._array() for t in q), *hyper)
    elif quads:  # the compiled kernel updates the whole list at once
        arrays = [[t._array() for t in q] for q in quads]
        backend.kernels.adamw_update_many(*zip(*arrays), *hyper)
    for q in quads:
        for t in (q[0], q[2], q[3]):
            t._storage.version += 1  # not a Function (no ctx): the three writes, declared here
    return param
