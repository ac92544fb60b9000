"""Conformance with torch 2.13 for the engine's core ops, in the spirit of PyTorch's OpInfo.

ROWS maps each registered op name to cases run by tests/rows_vs_torch.py: the same call in both
libraries on the same values and layouts (contiguous, transposed, sliced with a step,
expanded), including 0-d and zero-size operands, broadcasting and every dtype the op takes
(bool, int32, int64, float16, float32, float64); each compares values, result dtype and
shape, the gradient (and its dtype) of every differentiable input, or the exception type
torch raises. The other tables (test_ops_math, test_ops_reduce, test_activations,
test_losses, test_ops_indexing_more) cover the newer op families; tests/test_registry.py
fails for a registered op with no row in any of them. Deliberate differences are listed
once, in rows_vs_torch.DIFFERENCES and docs/differences.md.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

import numpy as np
import pytest
from rows_vs_torch import DIFFERENCES, Case, arr, case_ids, check_case

import tinygrad_attn as ta

B, I32, I64 = np.bool_, np.int32, np.int64
F16, F32, F64 = np.float16, np.float32, np.float64


def r(*shape, dtype=F64, seed=0, lo=None):
    """Random values of `shape` and `dtype` (ints in [-4, 5), or [lo, 5); bool: coin flips;
    floats: normal, or uniform in [lo, lo + 2] when lo is given)."""
    rng = np.random.default_rng(seed)
    if dtype == B:
        out = rng.random(shape) < 0.5
    elif np.dtype(dtype).kind in "iu":
        out = rng.integers(-4 if lo is None else lo, 5, size=shape)
    elif lo is not None:
        out = rng.uniform(lo, lo + 2, size=shape)
    else:
        out = rng.standard_normal(shape)
    return np.asarray(out, dtype=dtype)  # a 0-d array, not a NumPy scalar, for shape ()


def F(lib):
    """The functional module: ta.functional or torch.nn.functional."""
    return lib.functional if lib is ta else lib.nn.functional


def _bias_gelu(lib, x, b, approximate="none"):
    if lib is ta:
        return ta.functional.bias_gelu(x, b, approximate=approximate)
    return lib.nn.functional.gelu(x + b, approximate=approximate)


def _float_layouts(fn, *, lo=None, extra=(), seed=0):
    """float64 rows of a one-input op in every layout, plus 0-d and zero-size inputs."""
    x = r(3, 4, lo=lo, seed=seed)
    rows = [Case(fn, (x,) + tuple(extra), layout) for layout in
            ("contiguous", "transposed", "sliced", "expanded")]
    rows.append(Case(fn, (r(lo=lo, seed=seed),) + tuple(extra)))  # 0-d
    rows.append(Case(fn, (r(0, 4, lo=lo),) + tuple(extra)))  # zero-size
    return rows


def unary(fn, *, lo=None, dtypes=(F32, F16, I64, I32, B), all_grads=True):
    """Rows of an elementwise one-input op: layouts, 0-d, empty, then each other dtype."""
    rows = _float_layouts(fn, lo=lo)
    for dt in dtypes:
        lo_dt = None if lo is None else (max(1, int(lo)) if np.dtype(dt).kind in "iu" else lo)
        x = r(2, 3, dtype=dt, lo=lo_dt) if dt != B else r(2, 3, dtype=B)
        rows.append(Case(fn, (x,), all_grads=all_grads))
    return rows


def binary(fn, *, lo=None, ints=True, bools=True, shape_error=True, scalars=True, grad=True):
    """Rows of an elementwise two-input op: layouts, broadcasting, 0-d tensors, Python
    scalars, mixed dtypes (torch's promotion), zero-size, and a shape mismatch."""
    y = r(4, lo=lo, seed=1)
    rows = [Case(fn, (r(3, 4, lo=lo), y), layout) for layout in
            ("contiguous", "transposed", "sliced", "expanded")]
    rows += [
        Case(fn, (r(3, 1, lo=lo), r(1, 4, lo=lo, seed=2))),  # both broadcast
        Case(fn, (r(2, 3, lo=lo), r(lo=lo, seed=3))),  # a 0-d tensor
        Case(fn, (r(lo=lo), r(lo=lo, seed=3))),  # two 0-d tensors
    ]
    if scalars:
        rows += [Case(fn, (r(2, 3, lo=lo), 1.5)),  # a Python float
                 Case(fn, (r(2, 3, lo=lo), 2))]  # a Python int
    rows += [
        Case(fn, (r(0, 3, lo=lo), r(3, lo=lo, seed=1))),  # zero-size
        # float32 with a 0-d float64 tensor stays float32; each gets its own dtype's grad
        Case(fn, (r(2, 3, dtype=F32, lo=lo), r(lo=lo, seed=4)), all_grads=True),
        # float16 stays float16 (its float32 0-d operand's gradient is summed in float16:
        # not compared, see DIFFERENCES["float16"])
        Case(fn, (r(2, 3, dtype=F16, lo=lo), r(dtype=F32, lo=lo, seed=4))),
        Case(fn, (r(2, 3, dtype=F32, lo=lo), r(3, dtype=F64, lo=lo, seed=5)), all_grads=True),
    ]
    if ints:
        ilo = None if lo is None else max(1, int(lo))
        rows += [
            Case(fn, (r(2, 3, dtype=I64, lo=ilo), r(3, dtype=F32, lo=lo)), all_grads=True),
            Case(fn, (r(2, 3, dtype=I32, lo=ilo), r(3, dtype=I64, lo=ilo, seed=1))),
            *([Case(fn, (r(2, 3, dtype=I64, lo=ilo), 2.5))] if scalars else []),
            Case(fn, (r(2, 3, dtype=I32, lo=ilo), r(dtype=F64, lo=lo))),
            Case(fn, (r(2, 3, dtype=np.uint8, lo=1), r(3, dtype=np.int8, lo=1))),
        ]
    if bools:
        rows.append(Case(fn, (r(2, 3, dtype=B), r(3, dtype=I64, lo=1))))
    if shape_error:
        rows.append(Case(fn, (r(2, 3), r(4)), raises=RuntimeError))
    if not grad:
        rows = [dataclasses.replace(c, grad=False, all_grads=False) for c in rows]
    return rows


def _sdpa(lib, q, k, v, mask=None, **kw):
    return F(lib).scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


def _masked_softmax(lib, x, mask=None, scale=1.0, dim=-1):
    """ta's fused op against torch's composition of the same steps."""
    if lib is ta:
        return ta.functional.masked_softmax(x, mask, scale=scale, dim=dim)
    z = x * scale
    if mask is not None:
        z = z.masked_fill(mask, float("-inf")) if mask.dtype == lib.bool else z + mask
    return lib.softmax(z, dim)


def _causal(T):
    """True above the diagonal (the future a query may not see), as (1, 1, T, T)."""
    return np.triu(np.ones((T, T), dtype=B), 1).reshape(1, 1, T, T)


def _adamw(lib, p, g):
    if lib is ta:
        m, v = ta.zeros_like(p), ta.zeros_like(p)
        with ta.no_grad():
            return ta.functional.adamw_update_(p, g, m, v, lr=0.1, beta1=0.9, beta2=0.99,
                                               eps=1e-8, weight_decay=0.01, step=1)
    p.grad = g
    lib.optim.AdamW([p], lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01).step()
    return p.detach()


def _adamw_leaf(lib, p, g):
    leaf = (ta if lib is ta else lib).tensor(p.detach().numpy().copy(),
                                             requires_grad=lib is not ta)
    return _adamw(lib, leaf, g)


def _checkpoint(lib, x):
    def block(t):
        return (t * 2.0).tanh() * t

    if lib is ta:
        return ta.checkpoint(block, x)
    return lib.utils.checkpoint.checkpoint(block, x, use_reentrant=False)


def _inplace(how):
    def fn(lib, x, other):
        y = x * 1.0  # a non-leaf, so that the in-place op is recorded
        getattr(y, how)(other)
        return y

    return fn


def _setitem(lib, x, v):
    y = x * 1.0
    y[1:, ::2] = v
    return y


def _logical(lib, a, b):
    return ta.ops.logical(a, b, "and") if lib is ta else lib.logical_and(a, b)


def _compare(how):
    return lambda lib, a, b: getattr(a, how)(b)


ROWS = {
    # ------------------------------------------------------------------ elementwise binary
    "add": binary(lambda lib, a, b: a + b) + [
        Case(lambda lib, a, b: a + b, (r(3, dtype=B), r(3, dtype=B, seed=1)))],
    "sub": binary(lambda lib, a, b: a - b, bools=False) + [
        Case(lambda lib, a, b: a - b, (r(3, dtype=B), r(3, dtype=B, seed=1)),
             raises=RuntimeError),
        Case(lambda lib, a: 1.5 - a, (r(2, 3),))],
    "mul": binary(lambda lib, a, b: a * b) + [
        Case(lambda lib, a: 2.0 * a, (r(2, 3),))],
    "div": binary(lambda lib, a, b: a / b, lo=0.5) + [
        Case(lambda lib, a, b: a / b, (arr([1, 3], I64), arr([2, 2], I64))),
        Case(lambda lib, a: 1.0 / a, (r(2, 3, lo=0.5),)),
        Case(lambda lib, a, b: a / b, (arr([1.0, -1.0, 0.0]), arr([0.0, 0.0, 0.0])))],
    "pow": binary(lambda lib, a, b: a ** b, lo=0.5, ints=False) + [
        Case(lambda lib, a: a ** 2, (arr([2, 3], I64),)),
        Case(lambda lib, a: a ** 0.5, (arr([2, 3], I64),)),
        Case(lambda lib, a: a ** -1, (arr([2, 3], I64),), raises=RuntimeError),
        Case(lambda lib, a: a ** 0.0, (arr([0.0, 1.0, -2.0]),)),  # torch: grad 0 at x = 0
        Case(lambda lib, a, b: a ** b, (arr([0.0, 2.0, 0.0]), arr([0.0, 0.0, 2.0]))),
        Case(lambda lib, a: (-2.0) ** a, (arr([1.0, 2.0]),)),  # grad nan: log(-2)
        Case(lambda lib, a: 0.0 ** a, (arr([1.0, 2.0, 0.0]),)),  # grad 0 at base 0
        Case(lambda lib, a: a ** 3.0, (arr([-1.5, 0.0, 2.0]),))],
    "remainder": binary(lambda lib, a, b: a % b, lo=0.5) + [
        Case(lambda lib, a, b: a % b, (arr([5, -7, 7], I64), arr([3, 3, -3], I64)))],
    # torch has no derivative for floor_divide: values and dtypes only
    "floor_divide": binary(lambda lib, a, b: a // b, lo=0.5, bools=False, grad=False) + [
        Case(lambda lib, a, b: a // b, (arr([5, -7, 7], I64), arr([3, 3, -3], I64)))],
    "maximum": binary(lambda lib, a, b: lib.maximum(a, b), scalars=False) + [
        Case(lambda lib, a: lib.maximum(a, 0.5), (r(3),), raises=TypeError),
        Case(lambda lib, a, b: lib.maximum(a, b), (arr([1.0, 2.0, 3.0]), arr([1.0, 0.0, 3.0]))),
        Case(lambda lib, a, b: lib.maximum(a, b), (arr([1, 5], I64), arr([3, 2], I64)))],
    "minimum": binary(lambda lib, a, b: lib.minimum(a, b), scalars=False) + [
        Case(lambda lib, a, b: lib.minimum(a, b), (arr([1.0, 2.0, 3.0]), arr([1.0, 0.0, 3.0])))],
    "compare": [Case(_compare(how), (r(3, 4), r(4, seed=1)), layout)
                for how in ("eq", "ne", "lt", "le", "gt", "ge")
                for layout in ("contiguous", "transposed")] + [
        Case(_compare("lt"), (arr([1, 2], I64), 1.5)),
        Case(_compare("eq"), (arr([1.0, 2.0], F32), arr(1.0))),
        Case(_compare("ge"), (r(0, 3), r(3))),
        Case(_compare("gt"), (r(2, 3, dtype=B), r(3, dtype=I32))),
        Case(_compare("lt"), (r(2, 3), r(4)), raises=RuntimeError)],
    "logical": [
        Case(_logical, (r(2, 3, dtype=B), r(3, dtype=B, seed=1))),
        Case(_logical, (r(2, 3, dtype=I64), r(3, dtype=F32, seed=1))),
        Case(_logical, (r(), r(0, 2)))],
    # ------------------------------------------------------------------ elementwise unary
    "neg": unary(lambda lib, x: -x, dtypes=(F32, F16, I64, I32)) + [
        Case(lambda lib, x: -x, (r(3, dtype=B),), raises=RuntimeError)],
    "exp": unary(lambda lib, x: x.exp()),
    "log": unary(lambda lib, x: x.log(), lo=0.5) + [
        Case(lambda lib, x: x.log(), (arr([0.0, -1.0, 1.0]),))],
    "sqrt": unary(lambda lib, x: x.sqrt(), lo=0.5) + [
        Case(lambda lib, x: x.sqrt(), (arr([0.0, 4.0, -1.0]),))],
    "rsqrt": unary(lambda lib, x: x.rsqrt(), lo=0.5) + [
        Case(lambda lib, x: x.rsqrt(), (arr([0.0, 4.0]),))],
    "abs": unary(lambda lib, x: x.abs(), dtypes=(F32, F16, I64, I32)) + [
        Case(lambda lib, x: x.abs(), (arr([0.0, -1.0, 2.0]),))],  # sign(0) = 0
    "tanh": unary(lambda lib, x: x.tanh()),
    "sigmoid": unary(lambda lib, x: x.sigmoid()) + [
        Case(lambda lib, x: x.sigmoid(), (arr([-800.0, 0.0, 800.0]),))],
    "relu": unary(lambda lib, x: x.relu(), dtypes=(F32, F16, I64, I32)) + [
        Case(lambda lib, x: x.relu(), (arr([0.0, -1.0, 2.0]),))],  # grad 0 at 0
    "gelu": unary(lambda lib, x: F(lib).gelu(x), dtypes=(F32,)) + [
        Case(lambda lib, x: F(lib).gelu(x, approximate="tanh"), (r(3, 4),), "transposed"),
        Case(lambda lib, x: F(lib).gelu(x, approximate="bad"), (r(3),), raises=RuntimeError)],
    "silu": unary(lambda lib, x: F(lib).silu(x), dtypes=(F32,)),
    # torch has no fused op: its rows are gelu(x + bias)
    "bias_gelu": [Case(_bias_gelu, (r(3, 4), r(4, seed=1)), layout) for layout in
                  ("contiguous", "transposed", "sliced", "expanded")] + [
        Case(_bias_gelu, (r(2, 3, 4), r(4, seed=1)), kwargs={"approximate": "tanh"}),
        Case(_bias_gelu, (r(0, 4), r(4, seed=1))),
        Case(_bias_gelu, (r(5), r(5, seed=1)), kwargs={"approximate": "tanh"}),
        Case(_bias_gelu, (r(3, 4, dtype=F32), r(4, dtype=F32, seed=1)), all_grads=True),
        Case(_bias_gelu, (r(3, 4, dtype=F32), r(4, seed=1)), all_grads=True),  # float64
        Case(_bias_gelu, (r(3, 4), r(3, seed=1)), raises=RuntimeError),
        Case(_bias_gelu, (r(3, 4, dtype=I64), r(4, dtype=I64)), raises=RuntimeError),
        Case(_bias_gelu, (r(3, 4), r(4)), kwargs={"approximate": "bad"},
             raises=RuntimeError)],
    "bitwise_not": [Case(lambda lib, x: ~x, (r(2, 3, dtype=dt),)) for dt in (B, I64, I32)] + [
        Case(lambda lib, x: ~x, (arr(5, I64),)), Case(lambda lib, x: ~x, (r(0, 2, dtype=B),)),
        Case(lambda lib, x: ~x, (r(3),), raises=TypeError)],
    "clamp": _float_layouts(lambda lib, x: x.clamp(-0.5, 0.5)) + [
        Case(lambda lib, x: x.clamp(0.0, 1.0), (arr([0.0, 1.0, 2.0, -1.0, 0.5]),)),  # bounds
        Case(lambda lib, x: x.clamp(min=0.0), (r(2, 3, dtype=F32),), all_grads=True),
        Case(lambda lib, x: x.clamp(max=1), (arr([0, 3, 1], I64),)),
        # an integer tensor with float bounds gives the default float, as torch
        Case(lambda lib, x: x.clamp(0.5, 2.5), (arr([0, 3, 1], I64),)),
        Case(lambda lib, x: x.clamp(max=2.5), (arr([0, 3, 1], I32),)),
        Case(lambda lib, x: x.clamp(1, 2), (arr([True, False]),)),
        Case(lambda lib, x, lo, hi: x.clamp(lo, hi), (r(3, 4), r(4, seed=1) - 1,
                                                      r(4, seed=2) + 1)),
        Case(lambda lib, x, lo: x.clamp(min=lo), (arr([1.0, 2.0]), arr([1.0, 3.0]))),
        Case(lambda lib, x: x.clamp(), (r(3),), raises=RuntimeError),
    ],
    # ------------------------------------------------------------------ reductions
    "sum": _float_layouts(lambda lib, x: x.sum()) + [
        Case(lambda lib, x: x.sum(1), (r(3, 4),), "transposed"),
        Case(lambda lib, x: x.sum((0, 1), keepdim=True), (r(2, 3, 4),), "sliced"),
        Case(lambda lib, x: x.sum(0), (r(),)), Case(lambda lib, x: x.sum(-1), (r(3, 0),)),
        Case(lambda lib, x: x.sum(), (r(2, 3, dtype=B),)),
        Case(lambda lib, x: x.sum(0), (r(2, 3, dtype=I32),)),
        Case(lambda lib, x: x.sum(0), (r(2, 3, dtype=np.uint8, lo=0),)),
        Case(lambda lib, x: x.sum(1), (r(2, 3, dtype=F32),), all_grads=True),
        Case(lambda lib, x: x.sum(2), (r(2, 3),), raises=IndexError)],
    "mean": _float_layouts(lambda lib, x: x.mean()) + [
        Case(lambda lib, x: x.mean(0), (r(3, 4),), "transposed"),
        Case(lambda lib, x: x.mean(0), (r(),)), Case(lambda lib, x: x.mean(-1), (r(3, 0),)),
        Case(lambda lib, x: x.mean((0, 1), keepdim=True), (r(2, 3, 4),)),
        Case(lambda lib, x: x.mean(1), (r(2, 3, dtype=F16),), all_grads=True),
        Case(lambda lib, x: x.mean(), (arr([1, 2], I64),), raises=RuntimeError)],
    "var": _float_layouts(lambda lib, x: x.var()) + [
        Case(lambda lib, x: x.var(1), (r(3, 4),), "transposed"),
        Case(lambda lib, x: x.var(0, correction=0), (r(3, 4),)),
        Case(lambda lib, x: x.var(), (arr([1.5]),)),  # one element: nan value and grads
        Case(lambda lib, x: x.var(0), (r(),)),
        Case(lambda lib, x: x.var(1, keepdim=True), (r(2, 3, dtype=F32),), all_grads=True),
        Case(lambda lib, x: x.var(), (arr([1, 2], I64),), raises=RuntimeError)],
    "std": _float_layouts(lambda lib, x: x.std()) + [
        Case(lambda lib, x: x.std(0), (r(3, 4),), "sliced"),
        Case(lambda lib, x: x.std(), (arr([1.5]),)),
        Case(lambda lib, x: x.std(), (arr([1, 2], I64),), raises=RuntimeError)],
    "max": [Case(lambda lib, x: x.max(), (r(3, 4),), layout) for layout in
            ("contiguous", "transposed", "sliced", "expanded")] + [
        Case(lambda lib, x: x.max(), (arr([3.0, 1.0, 3.0]),)),  # a tie: the grad is split
        Case(lambda lib, x: x.max(0), (arr([[3.0, 1.0], [3.0, 2.0]]),)),  # to the index
        Case(lambda lib, x: x.max(1, keepdim=True), (r(3, 4),), "transposed"),
        Case(lambda lib, x: x.max(0), (r(),)), Case(lambda lib, x: x.max(), (r(),)),
        Case(lambda lib, x: x.max(), (r(2, 3, dtype=F32),), all_grads=True),
        Case(lambda lib, x: x.max(1), (r(2, 3, dtype=I64),)),
        Case(lambda lib, x: x.max(1), (r(3, 0),), raises=IndexError),
        Case(lambda lib, x: x.max(), (r(0, 3),), raises=RuntimeError)],
    "min": [Case(lambda lib, x: x.min(), (r(3, 4),), layout) for layout in
            ("contiguous", "transposed", "sliced")] + [
        Case(lambda lib, x: x.min(), (arr([1.0, 1.0, 3.0]),)),
        Case(lambda lib, x: x.min(1), (r(3, 4),), "transposed"),
        Case(lambda lib, x: x.min(-1), (r(),)),
        Case(lambda lib, x: x.min(), (r(2, 3, dtype=I32),))],
    "argmax": [Case(lambda lib, x: x.argmax(), (r(3, 4),), "transposed"),
               Case(lambda lib, x: x.argmax(1), (r(3, 4),), "sliced"),
               Case(lambda lib, x: x.argmax(1, keepdim=True), (r(3, 4, dtype=I64),)),
               Case(lambda lib, x: x.argmax(0), (r(),)), Case(lambda lib, x: x.argmax(), (r(),)),
               Case(lambda lib, x: x.argmax(0), (arr([1.0, 3.0, 3.0]),))],
    "argmin": [Case(lambda lib, x: x.argmin(), (r(3, 4),), "transposed"),
               Case(lambda lib, x: x.argmin(0), (r(3, 4, dtype=F32),)),
               Case(lambda lib, x: x.argmin(-1), (r(),))],
    "logsumexp": _float_layouts(lambda lib, x: x.logsumexp(-1)) + [
        Case(lambda lib, x: x.logsumexp(0), (r(),)),
        Case(lambda lib, x: x.logsumexp((0, 1), keepdim=True), (r(2, 3, 4),)),
        Case(lambda lib, x: x.logsumexp(1), (arr([[-np.inf, -np.inf], [0.0, 1.0]]),)),
        Case(lambda lib, x: x.logsumexp(0), (arr([1, 4], I64),)),
        Case(lambda lib, x: x.logsumexp(1), (r(2, 3, dtype=F32),), all_grads=True)],
    "softmax": _float_layouts(lambda lib, x: x.softmax(-1)) + [
        Case(lambda lib, x: x.softmax(0), (r(3, 4),), "transposed"),
        Case(lambda lib, x: x.softmax(0), (r(),)), Case(lambda lib, x: x.softmax(0), (r(3, 0),)),
        Case(lambda lib, x: x.softmax(1), (arr([[-np.inf, 0.0], [800.0, 0.0]]),)),
        Case(lambda lib, x: x.softmax(1), (r(2, 3, dtype=F32),), all_grads=True),
        Case(lambda lib, x: x.softmax(2), (r(2, 3),), raises=IndexError)],
    "masked_softmax": [
        Case(_masked_softmax, (r(3, 4), r(3, 4, dtype=B, seed=1)), lay)
        for lay in ("contiguous", "transposed", "sliced")] + [
        # the GPT's call: a (1, 1, T, T) causal buffer against (B, nh, T, T) scores, scaled
        Case(lambda lib, x, m: _masked_softmax(lib, x, m, scale=0.125), (r(2, 3, 5, 5),
                                                                         _causal(5))),
        Case(lambda lib, x, m: _masked_softmax(lib, x, m[..., :4, :4], scale=0.5),
             (r(2, 3, 4, 4), _causal(6))),  # a sliced (non-contiguous) mask view
        # float (additive) masks: broadcast, with their gradient (float64 requires grad)
        Case(_masked_softmax, (r(2, 3, 4), r(3, 4, seed=1))),
        Case(lambda lib, x, m: _masked_softmax(lib, x, m, scale=2.0), (r(2, 3, 4),
                                                                       r(4, seed=1))),
        Case(lambda lib, x, m: _masked_softmax(lib, x, m, scale=0.5, dim=1),
             (r(2, 3, 4), r(3, 1, dtype=B, seed=2))),  # another dim, a (3, 1) mask
        Case(lambda lib, x: _masked_softmax(lib, x, scale=0.25), (r(3, 4),), "transposed"),
        # every entry of a row masked: nan, as torch's composition; a bool mask's gradient
        # there is zero (masked_fill's backward), a float mask's is nan
        Case(_masked_softmax, (r(3, 4), arr([[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]], B))),
        Case(_masked_softmax, (r(2, 4), arr([[-np.inf] * 4, [0.0, -np.inf, 1.0, 2.0]]))),
        Case(_masked_softmax, (arr([[800.0, 0.0, -800.0], [1e-300, 0.0, 3.0]]),
                               arr([False, False, True], B))),  # large values
        Case(_masked_softmax, (r(0, 4), r(4, dtype=B))),  # zero-size
        Case(_masked_softmax, (r(3, 0), r(3, 0, dtype=B))),
        Case(lambda lib, x, m: _masked_softmax(lib, x, m, dim=0), (r(), arr(False, B))),
        Case(lambda lib, x, m: _masked_softmax(lib, x, m, scale=0.125), (
            r(2, 2, 5, 5, dtype=F32), _causal(5)), all_grads=True),
        Case(_masked_softmax, (r(2, 3, 4, dtype=F32), r(3, 4, dtype=F32, seed=3)),
             all_grads=True),
        Case(lambda lib, x, m: _masked_softmax(lib, x, m, dim=2), (r(2, 3), r(3, dtype=B)),
             raises=IndexError)],
    "log_softmax": _float_layouts(lambda lib, x: x.log_softmax(-1)) + [
        Case(lambda lib, x: x.log_softmax(0), (r(),)),
        Case(lambda lib, x: x.log_softmax(1), (r(2, 3, dtype=F32),), all_grads=True)],
    "matmul": [Case(lambda lib, a, b: a @ b, (r(3, 4), r(4, 2, seed=1)), layout)
               for layout in ("contiguous", "transposed", "sliced", "expanded")] + [
        Case(lambda lib, a, b: a @ b, (r(2, 3, 4), r(4, 2, seed=1))),
        Case(lambda lib, a, b: a @ b, (r(2, 1, 3, 4), r(3, 4, 2, seed=1))),
        Case(lambda lib, a, b: a @ b, (r(4), r(4, 2, seed=1))),
        Case(lambda lib, a, b: a @ b, (r(3, 4), r(4, seed=1))),
        Case(lambda lib, a, b: a @ b, (r(4), r(4, seed=1))),
        Case(lambda lib, a, b: a @ b, (r(8, 8), r(8, 0))),
        Case(lambda lib, a, b: a @ b, (r(8, 0), r(0, 8))),
        Case(lambda lib, a, b: a @ b, (r(2, 3, dtype=F32), r(3, 2, dtype=F32)), all_grads=True),
        Case(lambda lib, a, b: a @ b, (r(2, 3, dtype=I64), r(3, 2, dtype=I64))),
        Case(lambda lib, a, b: a @ b, (r(2, 2, dtype=I64), r(2, 2, dtype=F32)),
             raises=RuntimeError),
        Case(lambda lib, a, b: a @ b, (r(2, 3), r(2, 3)), raises=RuntimeError),
        Case(lambda lib, a, b: a @ b, (r(), r(3)), raises=RuntimeError)],
    # ------------------------------------------------------------------ views and copies
    "view": [Case(lambda lib, x: x.view(4, 3), (r(3, 4),)),
             Case(lambda lib, x: x.view(-1), (r(2, 3, dtype=I32),)),
             Case(lambda lib, x: x.view(1, 1), (r(),)),
             Case(lambda lib, x: x.view(0, 5), (r(5, 0),)),
             Case(lambda lib, x: x.view(12), (r(3, 4),), "transposed", raises=RuntimeError),
             Case(lambda lib, x: x.view(4, 2), (r(6),), raises=RuntimeError)],
    "reshape": [Case(lambda lib, x: x.reshape(2, 6), (r(3, 4),), lay) for lay in
                ("contiguous", "transposed", "sliced", "expanded")] + [
        Case(lambda lib, x: x.reshape(()), (r(1, 1),)), Case(lambda lib, x: x.reshape(-1), (r(),)),
        Case(lambda lib, x: x.reshape(3, -1), (r(3, 0),)),
        Case(lambda lib, x: x.reshape(5), (r(2, 3),), raises=RuntimeError)],
    "permute": [Case(lambda lib, x: x.permute(2, 0, 1), (r(2, 3, 4),), lay) for lay in
                ("contiguous", "transposed", "sliced")] + [
        Case(lambda lib, x: x.permute(1, 0), (r(0, 3, dtype=B),)),
        Case(lambda lib, x: x.permute(0, 0), (r(2, 3),), raises=RuntimeError)],
    "transpose": [Case(lambda lib, x: x.transpose(0, 1), (r(3, 4),), lay) for lay in
                  ("contiguous", "sliced", "expanded")] + [
        Case(lambda lib, x: x.transpose(0, -1), (r(),)),
        Case(lambda lib, x: x.transpose(0, 2), (r(2, 3),), raises=IndexError)],
    "swapdims": [Case(lambda lib, x: lib.swapdims(x, 0, 1), (r(3, 4, dtype=F32),))],
    "moveaxis": [Case(lambda lib, x: lib.moveaxis(x, 0, -1), (r(2, 3, 4),), "transposed")],
    "expand": [Case(lambda lib, x: x.expand(2, 3, 4), (r(3, 1),)),
               Case(lambda lib, x: x.expand(3, -1), (r(4),)),
               Case(lambda lib, x: x.expand(2, 3), (r(),)),
               Case(lambda lib, x: x.expand(0, 4), (r(1, 4),)),
               Case(lambda lib, x: x.expand(3, 4), (r(2, 4),), raises=RuntimeError)],
    "flatten": [Case(lambda lib, x: x.flatten(), (r(2, 3, 4),), "transposed"),
                Case(lambda lib, x: x.flatten(1), (r(2, 3, 4),)),
                Case(lambda lib, x: x.flatten(), (r(),))],
    "unflatten": [Case(lambda lib, x: x.unflatten(1, (2, 2)), (r(3, 4),), "sliced"),
                  Case(lambda lib, x: x.unflatten(0, (-1, 2)), (r(6),))],
    "squeeze": [Case(lambda lib, x: x.squeeze(), (r(3, 1, 4, 1),)),
                Case(lambda lib, x: x.squeeze(1), (r(3, 1, 4),)),
                Case(lambda lib, x: x.squeeze(0), (r(3, 4),)),
                Case(lambda lib, x: x.squeeze(0), (r(),)),
                Case(lambda lib, x: x.squeeze(-1), (r(),))],
    "unsqueeze": [Case(lambda lib, x: x.unsqueeze(0), (r(),)),
                  Case(lambda lib, x: x.unsqueeze(-1), (r(3, 4),), "transposed"),
                  Case(lambda lib, x: x.unsqueeze(3), (r(3, 4),), raises=IndexError)],
    "narrow": [Case(lambda lib, x: x.narrow(1, 1, 2), (r(3, 4),), "transposed"),
               Case(lambda lib, x: x.narrow(0, 0, 0), (r(3, 4),)),
               Case(lambda lib, x: x.narrow(1, -4, 2), (r(3, 4),)),
               Case(lambda lib, x: x.narrow(1, 4, 0), (r(3, 4),)),
               # errors: torch's types (a bad start IndexError, a bad length RuntimeError)
               Case(lambda lib, x: x.narrow(1, 2, 3), (r(3, 4),), raises=RuntimeError),
               Case(lambda lib, x: x.narrow(1, 0, -1), (r(3, 4),), raises=RuntimeError),
               Case(lambda lib, x: x.narrow(1, 5, 0), (r(3, 4),), raises=IndexError),
               Case(lambda lib, x: x.narrow(1, -5, 1), (r(3, 4),), raises=IndexError)],
    "split": [Case(lambda lib, x: x.split(2, 1), (r(3, 5),)),
              Case(lambda lib, x: x.split([1, 3], 1), (r(3, 4),), "transposed"),
              Case(lambda lib, x: x.split(2), (r(0, 2),))],
    "chunk": [Case(lambda lib, x: x.chunk(3, 1), (r(2, 7),)),
              Case(lambda lib, x: x.chunk(2, 0), (r(3, 4),), "sliced")],
    "unbind": [Case(lambda lib, x: x.unbind(1), (r(3, 4),), "transposed"),
               Case(lambda lib, x: x.unbind(0), (r(2, 0),))],
    "contiguous": [Case(lambda lib, x: x.contiguous(), (r(3, 4),), lay) for lay in
                   ("transposed", "sliced", "expanded")] + [
        Case(lambda lib, x: x.contiguous(), (r(),))],
    "clone": [Case(lambda lib, x: x.clone(), (r(3, 4),), "transposed"),
              Case(lambda lib, x: x.clone(), (r(2, dtype=B),)),
              Case(lambda lib, x: x.clone(), (r(),))],
    "as_strided": [Case(lambda lib, x: x.as_strided((2, 2), (1, 2)), (r(6),)),
                   Case(lambda lib, x: x.as_strided((3,), (0,), 1), (r(4),))],
    "getitem": [Case(lambda lib, x: x[1:, ::2], (r(3, 4),), "transposed"),
                Case(lambda lib, x: x[..., 0], (r(2, 3),)),
                Case(lambda lib, x: x[None, 1], (r(2, 3),)),
                Case(lambda lib, x: x[...], (r(),)),
                Case(lambda lib, x: x[5], (r(2),), raises=IndexError)],
    "to": [Case(lambda lib, x: x.to(lib.float32), (r(2, 3),)),
           Case(lambda lib, x: x.to(lib.float64), (r(2, 3, dtype=F32),), all_grads=True),
           Case(lambda lib, x: x.to(lib.int64), (r(2, 3),)),
           Case(lambda lib, x: x.to(lib.bool), (r(2, 3, dtype=I32),)),
           Case(lambda lib, x: x.to(lib.float16), (r(),))],
    # ------------------------------------------------------------------ combining
    "cat": [Case(lambda lib, a, b: lib.cat([a, b], 1), (r(3, 4), r(3, 2, seed=1)), "transposed"),
            Case(lambda lib, a, b: lib.cat([a, b]), (r(0, 3), r(2, 3, seed=1))),
            Case(lambda lib, a, b: lib.cat([a, b]), (r(2, 3, dtype=F32), r(1, 3)),
                 all_grads=True),
            Case(lambda lib, a, b: lib.cat([a, b]), (r(2, 3, dtype=I64), r(1, 3, dtype=B))),
            Case(lambda lib, a, b: lib.cat([a, b]), (r(2, 3), r(2, 4)), raises=RuntimeError)],
    "stack": [Case(lambda lib, a, b: lib.stack([a, b], 1), (r(3, 4), r(3, 4, seed=1)), "sliced"),
              Case(lambda lib, a, b: lib.stack([a, b]), (r(), r(seed=1))),
              Case(lambda lib, a, b: lib.stack([a, b]), (r(2, dtype=I64), r(2, dtype=F32)),
                   all_grads=True),
              Case(lambda lib, a, b: lib.stack([a, b]), (r(2), r(3)), raises=RuntimeError)],
    "where": [Case(lambda lib, c, a, b: lib.where(c, a, b), (r(3, 4, dtype=B), r(3, 4), r(4)),
                   lay) for lay in ("contiguous", "transposed")] + [
        Case(lambda lib, c, a: lib.where(c, a, 0.0), (r(2, 3, dtype=B), r(2, 3))),
        Case(lambda lib, c, a, b: lib.where(c, a, b),
             (arr([True, False], B), arr([1, 2], I64), arr([0.5, 1.5], F32)), all_grads=True),
        Case(lambda lib, c, a, b: lib.where(c, a, b), (r(2, 3, dtype=B), r(2, 3, dtype=F32),
                                                     r()), all_grads=True),
        Case(lambda lib, c, a, b: lib.where(c, a, b), (r(dtype=B), r(0, 2), r(2))),
        Case(lambda lib, c, a, b: lib.where(c, a, b), (r(2, dtype=B), r(3), r(3)),
             raises=RuntimeError)],
    "masked_fill": [
        Case(lambda lib, x, m: x.masked_fill(m, -1.5), (r(3, 4), r(4, dtype=B)), lay)
        for lay in ("contiguous", "transposed", "expanded")] + [
        Case(lambda lib, x, m: x.masked_fill(m, 0.5), (arr([1, 4], I64), arr([True, False], B))),
        Case(lambda lib, x, m: x.masked_fill(m, -np.inf), (r(), r(dtype=B))),
        Case(lambda lib, x, m, v: x.masked_fill(m, v), (r(2, 3), r(3, dtype=B), r(seed=2))),
        Case(lambda lib, x, m: x.masked_fill(m, 1.0), (r(2, 3), r(4, dtype=B)),
             raises=RuntimeError)],
    "tril": [Case(lambda lib, x: x.tril(), (r(3, 4),), "transposed"),
             Case(lambda lib, x: x.tril(-1), (r(2, 3, 3, dtype=I64),)),
             Case(lambda lib, x: x.tril(1), (r(0, 3),)),
             Case(lambda lib, x: x.tril(), (r(3),), raises=RuntimeError)],
    "triu": [Case(lambda lib, x: x.triu(1), (r(3, 4),), "sliced"),
             Case(lambda lib, x: x.triu(), (r(3, 3, dtype=B),))],
    "gather": [Case(lambda lib, x, i: x.gather(1, i), (r(3, 4), arr([[0, 3], [1, 1], [2, 0]], I64)),
                    lay) for lay in ("contiguous", "transposed")] + [
    ],
    "index_select": [
        Case(lambda lib, x, i: x.index_select(0, i), (r(3, 4), arr([2, 0, 2], I64)), "sliced"),
        Case(lambda lib, x, i: x.index_select(1, i), (r(3, 4, dtype=I32), arr([], I64))),
        Case(lambda lib, x, i: x.index_select(0, i), (r(3, 4), arr([5], I64)),
             raises=IndexError)],
    # ------------------------------------------------------------------ nn
    "layer_norm": [
        Case(lambda lib, x, w, b: F(lib).layer_norm(x, (4,), w, b), (r(3, 4), r(4, seed=1),
                                                                    r(4, seed=2)), lay)
        for lay in ("contiguous", "transposed", "sliced")] + [
        Case(lambda lib, x: F(lib).layer_norm(x, (3, 4)), (r(2, 3, 4),)),
        Case(lambda lib, x: F(lib).layer_norm(x, (4,)), (r(0, 4),)),
        Case(lambda lib, x, w: F(lib).layer_norm(x, (4,), w), (r(2, 4, dtype=F32),
                                                               r(4, dtype=F32)), all_grads=True),
        Case(lambda lib, x: F(lib).layer_norm(x, (3,)), (r(2, 4),), raises=RuntimeError),
        # no promotion: weight and bias must have the input's dtype
        Case(lambda lib, x, w: F(lib).layer_norm(x, (4,), w), (r(2, 4, dtype=F32), r(4)),
             raises=RuntimeError),
        Case(lambda lib, x, w, b: F(lib).layer_norm(x, (4,), w, b),
             (r(2, 4), r(4, seed=1), r(4, seed=2, dtype=F32)), raises=RuntimeError)],
    "embedding": [
        Case(lambda lib, i, w: F(lib).embedding(i, w), (arr([[0, 2], [1, 0]], I64), r(3, 4))),
        Case(lambda lib, i, w: F(lib).embedding(i, w), (arr(1, I64), r(3, 4)), "contiguous"),
        Case(lambda lib, i, w: F(lib).embedding(i, w), (arr([], I64), r(3, 4))),
        Case(lambda lib, i, w: F(lib).embedding(i, w), (arr([3], I64), r(3, 4)),
             raises=IndexError)],
    "dropout": [
        Case(lambda lib, x: F(lib).dropout(x, 0.0), (r(3, 4),), "transposed"),
        Case(lambda lib, x: F(lib).dropout(x, 0.5, training=False), (r(3, 4),)),
        Case(lambda lib, x: F(lib).dropout(x, 0.0), (r(),)),
        Case(lambda lib, x: F(lib).dropout(x, 1.5), (r(3),), raises=ValueError)],
    "scaled_dot_product_attention": [
        Case(_sdpa, (r(2, 3, 4), r(2, 5, 4, seed=1), r(2, 5, 2, seed=2))),
        Case(lambda lib, q, k, v: _sdpa(lib, q, k, v, is_causal=True),
             (r(2, 4, 3), r(2, 4, 3, seed=1), r(2, 4, 3, seed=2)), "sliced"),
        Case(_sdpa, (r(1, 3, 4), r(1, 3, 4, seed=1), r(1, 3, 4, seed=2), r(3, 3, dtype=B))),
        # a float mask that requires grad gets its gradient, as in torch
        Case(_sdpa, (r(2, 3, 4), r(2, 3, 4, seed=1), r(2, 3, 4, seed=2), r(3, 3, seed=3))),
        Case(_sdpa, (r(2, 3, 4, dtype=F32), r(2, 3, 4, dtype=F32, seed=1),
                     r(2, 3, 4, dtype=F32, seed=2)), all_grads=True),
        Case(_sdpa, (r(2, 3, 4), r(2, 3, 5, seed=1), r(2, 3, 4, seed=2)),
             raises=RuntimeError),
        # q, k, v of one dtype; a float mask of q's dtype or float32
        Case(_sdpa, (r(2, 3, 4, dtype=F32), r(2, 3, 4, seed=1), r(2, 3, 4, seed=2, dtype=F32)),
             raises=RuntimeError),
        Case(_sdpa, (r(1, 3, 4), r(1, 3, 4, seed=1), r(1, 3, 4, seed=2),
                     r(3, 3, seed=3, dtype=F32))),
        Case(_sdpa, (r(1, 3, 4, dtype=F32), r(1, 3, 4, seed=1, dtype=F32),
                     r(1, 3, 4, seed=2, dtype=F32), r(3, 3, seed=3)), raises=RuntimeError)],
    "checkpoint": [Case(_checkpoint, (r(3, 4),), "transposed"), Case(_checkpoint, (r(),))],
    "adamw_update_": [Case(_adamw_leaf, (r(3, 4, dtype=F32), r(3, 4, dtype=F32, seed=1)),
                           grad=False)],
    # ------------------------------------------------------------------ in place
    "inplace": [
        Case(_inplace("add_"), (r(3, 4), r(4, seed=1)), "transposed"),
        Case(_inplace("mul_"), (r(3, 4), r(seed=1))),
        Case(_inplace("div_"), (r(3, 4), r(4, lo=0.5, seed=1))),
        Case(_inplace("sub_"), (r(2, 3, dtype=F32), r(3, dtype=F64)), all_grads=True),
        Case(lambda lib, x: x.add_(0.5), (arr([1, 2], I64),), raises=RuntimeError),
        Case(lambda lib, x, y: x.mul_(y), (arr([1, 2], I64), arr([1.5, 2.0], F32)),
             raises=RuntimeError),
        Case(lambda lib, x: x.div_(2), (arr([1, 2], I64),), raises=RuntimeError),
        Case(lambda lib, x, y: x.add_(y), (r(2, dtype=F32), arr([1, 2], I64)), grad=False),
        Case(lambda lib, x, y: x.add_(y), (r(2, 3), r(3, 3)), raises=RuntimeError)],
    "setitem": [Case(_setitem, (r(3, 4), r(2, 2, seed=1))), Case(_setitem, (r(3, 4), 0.5))],
}


PARAMS, IDS = case_ids(ROWS)


@pytest.mark.parametrize("name, k", PARAMS, ids=IDS)
def test_matches_torch(name, k):
    torch = pytest.importorskip("torch")
    check_case(ROWS[name][k], torch)


def test_differences_are_written_down_once():
    """docs/differences.md holds one entry per key of DIFFERENCES, and no other."""
    doc = (pathlib.Path(__file__).parents[1] / "docs" / "differences.md").read_text()
    keys = set(re.findall(r"^- \*\*`?([\w./]+)`?\*\*", doc, re.M))
    assert keys == set(DIFFERENCES), (keys ^ set(DIFFERENCES))


def test_promotion_matches_torch_for_every_pair():
    torch = pytest.importorskip("torch")
    names = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32",
             "float64")
    for a in names:
        for b in names:
            ours = ta.promote_types(getattr(ta, a if a != "bool" else "bool_"),
                                    getattr(ta, b if b != "bool" else "bool_"))
            theirs = torch.promote_types(getattr(torch, a), getattr(torch, b))
            assert ours.name == str(theirs).removeprefix("torch."), (a, b)
            for shapes in (((2,), ()), ((), (2,)), ((), ())):
                x = ta.zeros(shapes[0], dtype=a if a != "bool" else ta.bool_)
                y = ta.zeros(shapes[1], dtype=b if b != "bool" else ta.bool_)
                tx = torch.zeros(shapes[0], dtype=getattr(torch, a))
                ty = torch.zeros(shapes[1], dtype=getattr(torch, b))
                assert (x + y).dtype.name == str((tx + ty).dtype).removeprefix("torch."), \
                    (a, b, shapes)


def test_default_dtype_drives_creation_and_promotion():
    assert ta.get_default_dtype() is ta.float32
    ta.set_default_dtype(ta.float64)
    try:
        assert ta.tensor([1.5]).dtype is ta.float64
        assert (ta.tensor([1, 2]) + 0.5).dtype is ta.float64
        assert ta.tensor([2]).exp().dtype is ta.float64
        assert (ta.ones(2, dtype=ta.float32) * 0.5).dtype is ta.float32
    finally:
        ta.set_default_dtype(ta.float32)
    assert ta.tensor([1.5]).dtype is ta.float32
    with pytest.raises(TypeError, match="set_default_dtype"):
        ta.set_default_dtype(ta.int64)


def test_a_float32_op_stays_float32_and_each_grad_has_its_inputs_dtype():
    """The result dtype is computed in: a 0-d float64 operand is cast before the call."""
    x = ta.ones(1000, requires_grad=True)
    s = ta.tensor(2.0, dtype=ta.float64, requires_grad=True)
    steps = [x * s]
    steps.append(steps[-1] + 0.5)
    steps.append(steps[-1].exp())
    steps[-1].sum().backward()
    assert [t.dtype for t in steps] == [ta.float32] * 3
    assert x.grad.dtype is ta.float32 and s.grad.dtype is ta.float64
