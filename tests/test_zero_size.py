"""Zero-size tensors through every op, reached through views, against torch.

Every conformance row with an empty operand (in test_conformance and the other row
tables) runs again with each empty operand made by a view of another tensor: a split
piece of an empty tensor (its offset past the end of a zero-size storage), an empty slice
with a nonzero offset, a transposed empty slice, or an expanded empty slice. The ops with no
such row get one here (EXTRA). Values, shapes, dtypes and gradients (of the leaves the views
came from) are compared with torch; a test checks that every registered op is covered.
"""

from __future__ import annotations

import numpy as np
import pytest
import rows_vs_torch as R
import test_activations
import test_conformance as C
import test_losses
import test_ops_indexing_more
import test_ops_math
import test_ops_reduce
import test_random_rows
import test_recurrent_rows
import test_torch_functions
from rows_vs_torch import Case, check_case

import nn
import tinygrad_attn as ta
from tinygrad_attn.ops.registry import REGISTRY

B, I64, F32, F64 = np.bool_, np.int64, np.float32, np.float64
TABLES = (C, test_ops_math, test_ops_reduce, test_activations, test_losses,
          test_ops_indexing_more, test_torch_functions, test_random_rows, test_recurrent_rows)
HOWS = ("split", "sliced", "transposed", "expanded")


def F(lib):
    return lib.functional if lib is ta else lib.nn.functional


def z(*shape, dtype=F64):
    return np.zeros(shape, dtype=dtype)


def ints(*shape, high=3):
    return np.random.default_rng(0).integers(0, high, size=shape).astype(I64)


# ----------------------------------------------------------------------------- the views
def _recipe(how: str, shape: tuple):
    """(parent shape, fn(lib, parent tensor) -> an empty view of `shape`)."""
    shape = tuple(shape)
    zero = shape.index(0)
    nonzero = [d for d, n in enumerate(shape) if n]
    if how == "split" and nonzero:  # a later piece of an empty tensor: offset past the end
        d = nonzero[0]
        parent = shape[:d] + (2 * shape[d],) + shape[d + 1:]
        return parent, lambda lib, p: _dense(p).split(shape[d], dim=d)[1]
    if how == "transposed" and len(shape) >= 2:
        swapped = shape[:-2] + (shape[-1], shape[-2])
        inner, cut = _recipe("sliced", swapped)
        return inner, lambda lib, p: cut(lib, p).transpose(-1, -2)
    if how == "expanded":  # a size-1 slice at a nonzero offset, expanded to 0
        parent = shape[:zero] + (2,) + shape[zero + 1:]
        index = (slice(None),) * zero + (slice(1, 2),)
        return parent, lambda lib, p: _dense(p)[index].expand(*shape)
    parent = shape[:zero] + (3,) + shape[zero + 1:]  # "sliced": empty, 3 rows in
    index = (slice(None),) * zero + (slice(3, None),)
    return parent, lambda lib, p: _dense(p)[index]


def _dense(p):
    # torch's contiguous strides for an empty leaf (the engine's factories give an empty
    # array NumPy's zero strides), so that the views' offsets are torch's too
    return p.reshape(-1).view(tuple(p.shape)) if p.numel() == 0 else p


def _parent_values(arr, shape, seed):
    rng = np.random.default_rng(seed)
    if arr.dtype == B:
        return rng.random(shape) < 0.5
    if arr.dtype.kind in "iu":
        return rng.integers(0, 2, size=shape).astype(arr.dtype)
    return rng.uniform(0.2, 0.9, size=shape).astype(arr.dtype)


def through_views(case: Case, k: int) -> Case:
    """`case` with every empty array operand replaced by a parent and a view of it."""
    views, inputs = {}, []
    for i, a in enumerate(case.inputs):
        if isinstance(a, np.ndarray) and a.size == 0 and a.ndim:
            parent, cut = _recipe(HOWS[(k + i) % len(HOWS)], a.shape)
            views[i] = cut
            inputs.append(_parent_values(a, parent, k + i))
        else:
            inputs.append(a)

    def fn(lib, *args, **kwargs):
        args = [views[i](lib, a) if i in views else a for i, a in enumerate(args)]
        return case.fn(lib, *args, **kwargs)

    return Case(fn, tuple(inputs), "contiguous", case.grad, None, case.all_grads,
                case.kwargs)


# ----------------------------------------------------------------------------- extra rows
def _std_mean(lib, x):
    return lib.std_mean(x, dim=1)


def _setitem(lib, x):
    y = x * 1.0
    y[:, :2] = 5.0
    return y


def _sdpa(lib, q, k, v):
    return F(lib).scaled_dot_product_attention(q, k, v, is_causal=True)


def _rope(lib, x):
    half = x.shape[-1] // 2
    angles = np.outer(np.arange(x.shape[-2]), 1.0 / 10 ** np.arange(half))
    cos, sin = (lib.tensor(f(angles)) for f in (np.cos, np.sin))
    if lib is ta:
        return ta.functional.apply_rotary_emb(x, cos, sin)
    x1, x2 = x[..., :half], x[..., half:]
    return lib.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _batch_norm(lib, x):
    mean, var = lib.zeros(3, dtype=lib.float64), lib.ones(3, dtype=lib.float64)
    return F(lib).batch_norm(x, mean, var)


def _checkpoint_of(lib, x):
    return C._checkpoint(lib, x)


def _meshgrid(lib, a, b):
    return lib.meshgrid(a, b, indexing="ij")


def _masked_scatter(lib, x, mask, src):
    return x.masked_scatter(mask, src)


EXTRA = {
    "adaptive_avg_pool1d": [Case(lambda lib, x: F(lib).adaptive_avg_pool1d(x, 2), (z(0, 2, 4),))],
    "adaptive_avg_pool2d": [Case(lambda lib, x: F(lib).adaptive_avg_pool2d(x, 2),
                                 (z(0, 2, 4, 4),))],
    "avg_pool1d": [Case(lambda lib, x: F(lib).avg_pool1d(x, 2), (z(0, 2, 4),))],
    # the samplers: an empty draw is empty in torch's shape and dtype, whatever the stream
    "bernoulli": [Case(lambda lib, x: lib.bernoulli(x), (z(0, 3),))],
    "normal": [Case(lambda lib, x: lib.normal(x, 1.0), (z(0, 3),))],
    "poisson": [Case(lambda lib, x: lib.poisson(x), (z(3, 0),))],
    "bernoulli_": [Case(lambda lib, x: (x * 1.0).bernoulli_(0.5), (z(0, 3),))],
    "cauchy_": [Case(lambda lib, x: (x * 1.0).cauchy_(), (z(0, 3),))],
    "exponential_": [Case(lambda lib, x: (x * 1.0).exponential_(), (z(2, 0),))],
    "geometric_": [Case(lambda lib, x: (x * 1.0).geometric_(0.5), (z(0, 3),))],
    "log_normal_": [Case(lambda lib, x: (x * 1.0).log_normal_(), (z(0, 3),))],
    "normal_": [Case(lambda lib, x: (x * 1.0).normal_(), (z(0, 2, 3),))],
    "random_": [Case(lambda lib, x: (x * 1.0).random_(0, 5), (z(0, 3),))],
    "uniform_": [Case(lambda lib, x: (x * 1.0).uniform_(), (z(3, 0),))],
    "avg_pool2d": [Case(lambda lib, x: F(lib).avg_pool2d(x, 2), (z(0, 2, 4, 4),))],
    "max_pool1d": [Case(lambda lib, x: F(lib).max_pool1d(x, 2), (z(0, 2, 4),))],
    "max_pool2d": [Case(lambda lib, x: F(lib).max_pool2d(x, 2), (z(0, 2, 4, 4),))],
    "conv1d": [Case(lambda lib, x, w: F(lib).conv1d(x, w), (z(0, 2, 5), C.r(3, 2, 2)))],
    "conv2d": [Case(lambda lib, x, w: F(lib).conv2d(x, w, padding=1),
                    (z(0, 2, 4, 4), C.r(3, 2, 3, 3)))],
    "conv_transpose1d": [Case(lambda lib, x, w: F(lib).conv_transpose1d(x, w),
                              (z(0, 2, 5), C.r(2, 3, 2)))],
    "conv_transpose2d": [Case(lambda lib, x, w: F(lib).conv_transpose2d(x, w, stride=2),
                              (z(0, 2, 3, 3), C.r(2, 3, 2, 2)))],
    "amin": [Case(lambda lib, x: lib.amin(x, dim=1), (z(0, 3),))],
    "argmax": [Case(lambda lib, x: x.argmax(dim=1), (z(0, 3),))],
    "argmin": [Case(lambda lib, x: x.argmin(dim=1), (z(0, 3),))],
    "max": [Case(lambda lib, x: x.max(dim=1), (z(0, 3),))],
    "min": [Case(lambda lib, x: x.min(dim=1), (z(0, 3),))],
    "argsort": [Case(lambda lib, x: lib.argsort(x, dim=1), (z(0, 3),))],
    "topk": [Case(lambda lib, x: lib.topk(x, 2, dim=1), (z(0, 3),))],
    "kthvalue": [Case(lambda lib, x: lib.kthvalue(x, 2, dim=1), (z(0, 3),))],
    "mode": [Case(lambda lib, x: lib.mode(x, dim=1), (z(0, 3),))],
    "count_nonzero": [Case(lambda lib, x: lib.count_nonzero(x, dim=1), (z(0, 3),))],
    "norm": [Case(lambda lib, x: lib.norm(x, dim=1), (z(0, 3),))],
    "std_mean": [Case(_std_mean, (z(0, 3),))],
    "var_mean": [Case(lambda lib, x: lib.var_mean(x, dim=1), (z(0, 3),))],
    "normalize": [Case(lambda lib, x: F(lib).normalize(x, dim=1), (z(0, 3),))],
    "rms_norm": [Case(lambda lib, x: F(lib).rms_norm(x, [3]), (z(0, 3),))],
    "group_norm": [Case(lambda lib, x: F(lib).group_norm(x, 1), (z(0, 2, 3),))],
    "batch_norm": [Case(_batch_norm, (z(0, 3, 2),))],
    "dropout": [Case(lambda lib, x: F(lib).dropout(x, 0.0), (z(0, 3),))],
    "scaled_dot_product_attention": [Case(_sdpa, (z(1, 2, 0, 4), z(1, 2, 0, 4),
                                                  z(1, 2, 0, 4)))],
    "apply_rotary_emb": [Case(_rope, (z(2, 0, 4),))],
    "causal_attention": [Case(lambda lib, q, k, v: (
        F(lib).causal_attention(q, k, v) if lib is ta
        else F(lib).scaled_dot_product_attention(q, k, v, is_causal=True)),
        (z(1, 2, 0, 4), z(1, 2, 0, 4), z(1, 2, 0, 4)))],
    "checkpoint": [Case(_checkpoint_of, (z(0, 3),))],
    "add_layer_norm": [Case(lambda lib, x, r: (
        F(lib).add_layer_norm(x, r, 3) if lib is ta
        else (x + r, F(lib).layer_norm(x + r, (3,)))), (z(0, 3), z(0, 3)))],
    "linear": [Case(lambda lib, x, w, b: F(lib).linear(x, w, b), (z(0, 3), z(2, 3), z(2)))],
    "bitwise_left_shift": [Case(lambda lib, a, b: lib.bitwise_left_shift(a, b),
                                (z(0, 3, dtype=I64), ints(3)))],
    "bitwise_right_shift": [Case(lambda lib, a, b: lib.bitwise_right_shift(a, b),
                                 (z(0, 3, dtype=I64), ints(3)))],
    "isclose": [Case(lambda lib, a, b: lib.isclose(a, b), (z(0, 3), z(0, 3)))],
    "isfinite": [Case(lambda lib, x: lib.isfinite(x), (z(0, 3),))],
    "isinf": [Case(lambda lib, x: lib.isinf(x), (z(0, 3),))],
    "isnan": [Case(lambda lib, x: lib.isnan(x), (z(0, 3),))],
    "logical_not": [Case(lambda lib, x: lib.logical_not(x), (z(0, 3, dtype=B),))],
    "as_strided": [Case(lambda lib, x: x.as_strided((0, 2), (2, 1), 1), (z(0, 3),))],
    "chunk": [Case(lambda lib, x: x.chunk(2, 1), (z(0, 4),))],
    "clone": [Case(lambda lib, x: x.clone(), (z(0, 3),))],
    "contiguous": [Case(lambda lib, x: x.contiguous(), (z(0, 3),))],
    "diag": [Case(lambda lib, x: lib.diag(x), (z(0),)), Case(lambda lib, x: lib.diag(x),
                                                             (z(0, 3),))],
    "diagonal": [Case(lambda lib, x: lib.diagonal(x, 1, 0, 1), (z(0, 3),))],
    "expand": [Case(lambda lib, x: x.expand(2, 0, 3), (z(0, 3),))],
    "flatten": [Case(lambda lib, x: x.flatten(), (z(0, 3),))],
    "unflatten": [Case(lambda lib, x: x.unflatten(1, (3, 1)), (z(0, 3),))],
    "getitem": [Case(lambda lib, x: x[:, 1:], (z(0, 3),)),
                Case(lambda lib, x, i: x[i], (z(0, 3), z(0, dtype=I64)))],
    "setitem": [Case(_setitem, (z(0, 3),))],
    "inplace": [Case(C._inplace("add_"), (z(0, 3), z(0, 3))),
                Case(C._inplace("mul_"), (z(0, 3), C.r(3)))],
    "narrow": [Case(lambda lib, x: x.narrow(1, 1, 2), (z(0, 3),))],
    "squeeze": [Case(lambda lib, x: x.squeeze(1), (z(0, 1, 3),))],
    "unsqueeze": [Case(lambda lib, x: x.unsqueeze(0), (z(0, 3),))],
    "transpose": [Case(lambda lib, x: x.transpose(0, 1), (z(0, 3),))],
    "movedim": [Case(lambda lib, x: lib.movedim(x, 0, 1), (z(0, 3),))],
    "moveaxis": [Case(lambda lib, x: lib.moveaxis(x, 0, 1), (z(0, 3),))],
    "swapaxes": [Case(lambda lib, x: lib.swapaxes(x, 0, 1), (z(0, 3),))],
    "swapdims": [Case(lambda lib, x: lib.swapdims(x, 0, 1), (z(0, 3),))],
    "unfold": [Case(lambda lib, x: x.unfold(1, 2, 1), (z(0, 3),))],
    "to": [Case(lambda lib, x: x.to(lib.float32), (z(0, 3),), all_grads=True)],
    "stack": [Case(lambda lib, a, b: lib.stack([a, b]), (z(0, 3), z(0, 3)))],
    "meshgrid": [Case(_meshgrid, (z(0), C.r(3)))],
    "pad": [Case(lambda lib, x: F(lib).pad(x, (1, 1)), (z(0, 3),))],
    "repeat": [Case(lambda lib, x: x.repeat(2, 1), (z(0, 3),))],
    "repeat_interleave": [Case(lambda lib, x: x.repeat_interleave(2, dim=1), (z(0, 3),))],
    "roll": [Case(lambda lib, x: lib.roll(x, 1, 1), (z(0, 3),))],
    "tile": [Case(lambda lib, x: lib.tile(x, (2, 1)), (z(0, 3),))],
    "triu": [Case(lambda lib, x: lib.triu(x), (z(0, 3),))],
    "tril_indices": [Case(lambda lib: lib.tril_indices(0, 3), ())],
    "triu_indices": [Case(lambda lib: lib.triu_indices(0, 3), ())],
    "gather": [Case(lambda lib, x, i: lib.gather(x, 1, i), (z(0, 3), z(0, 2, dtype=I64)))],
    "take_along_dim": [Case(lambda lib, x, i: lib.take_along_dim(x, i, dim=1),
                            (z(0, 3), z(0, 2, dtype=I64)))],
    "scatter": [Case(lambda lib, x, i, s: lib.scatter(x, 1, i, s),
                     (z(0, 3), z(0, 2, dtype=I64), z(0, 2)))],
    "scatter_reduce": [Case(lambda lib, x, i, s: lib.scatter_reduce(x, 1, i, s, "sum"),
                            (z(0, 3), z(0, 2, dtype=I64), z(0, 2)))],
    "index_add": [Case(lambda lib, x, i, s: lib.index_add(x, 1, i, s),
                       (z(0, 3), ints(2), z(0, 2)))],
    "index_copy": [Case(lambda lib, x, i, s: lib.index_copy(x, 1, i, s),
                        (z(0, 3), np.array([2, 0]), z(0, 2)))],
    "index_fill": [Case(lambda lib, x, i: lib.index_fill(x, 1, i, 1.5), (z(0, 3), ints(2)))],
    "masked_fill": [Case(lambda lib, x, m: x.masked_fill(m, 1.5),
                         (z(0, 3), z(0, 3, dtype=B)))],
    "masked_scatter": [Case(_masked_scatter, (z(0, 3), z(0, 3, dtype=B), C.r(4)))],
    "one_hot": [Case(lambda lib, i: F(lib).one_hot(i, 4), (z(0, dtype=I64),))],
}

# Registered ops with no zero-size row through views, and why.
NOT_COVERED = {
    "adamw_update_": "the optimizer's fused in-place step: a parameter, not an operand; "
                     "tests/test_fused_adamw.py covers it",
    "is_nonzero": "an empty tensor has no truth value: every empty row raises "
                  "(tests/test_torch_functions.py checks that it does)",
}


def _derived_cases():
    """(name, case) for every row of every table with an empty operand, through views."""
    out = []
    for table in TABLES:
        for name, cases in table.ROWS.items():
            for case in cases:
                if isinstance(case, Case) and case.raises is None and any(
                        isinstance(a, np.ndarray) and a.size == 0 and a.ndim
                        for a in case.inputs):
                    out.append((name, case))
                elif isinstance(case, R.Call) and case.raises is None and any(
                        isinstance(a, R.T) and 0 in a.shape for a in case.args):
                    out.append((case.name or name, case))
    for name, cases in EXTRA.items():
        out.extend((name, case) for case in cases)
    return out


DERIVED = _derived_cases()


def _run_call(name: str, call: R.Call, k: int):
    """rows_vs_torch.run_case for a Call row, its empty operands made through views."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(k)
    ta_args, torch_args, leaves = [], [], []
    for i, spec in enumerate(call.args):
        if not isinstance(spec, R.T):
            ta_args.append(spec)
            torch_args.append(spec)
            continue
        empty = 0 in spec.shape
        if empty:
            parent, cut = _recipe(HOWS[(k + i) % len(HOWS)], spec.shape)
        else:
            parent, cut = R._base_shape(spec), lambda lib, p, s=spec: R._view(lib, p, s)
        base = R._values(spec, parent, rng).astype(spec.dtype)
        need = spec.grad and spec.dtype.startswith("float")
        tl = ta.tensor(base, dtype=spec.dtype, requires_grad=need)
        pl = torch.tensor(base, requires_grad=need)
        ta_args.append(cut(ta, tl))
        torch_args.append(cut(torch, pl))
        if need:
            leaves.append((tl, pl))
    ours = R._call("ta", ta, name, call, ta_args)
    theirs = R._call("torch", torch, name, call, torch_args)
    R._compare(ours, theirs, call.rtol)
    if leaves and not isinstance(theirs, bool) and theirs.requires_grad:
        upstream = np.zeros(tuple(theirs.shape))
        ours.backward(ta.tensor(upstream.astype(ours.dtype.name)))
        theirs.backward(torch.tensor(upstream.astype(ours.dtype.name)))
        for tl, pl in leaves:
            if pl.grad is None or pl.grad._is_zerotensor():
                assert tl.grad is None or not np.any(tl.grad.numpy())
                continue
            R._compare(tl.grad, pl.grad, call.rtol)


@pytest.mark.parametrize("k", range(len(DERIVED)), ids=[f"{n}-{i}" for i, (n, _) in
                                                         enumerate(DERIVED)])
def test_zero_size_operand_through_a_view_matches_torch(k):
    name, case = DERIVED[k]
    if isinstance(case, R.Call):
        _run_call(name, case, k)
    else:
        check_case(through_views(case, k), pytest.importorskip("torch"))


def test_every_registered_op_has_a_zero_size_row():
    covered = {name for name, _ in DERIVED}
    missing = sorted(set(REGISTRY) - covered - set(NOT_COVERED))
    assert not missing, f"ops with no zero-size row through views: {missing}"
    assert not set(NOT_COVERED) & covered


def test_the_views_are_what_they_say():
    """The recipes really make empty views at a nonzero offset (past the storage's end for
    a split piece of an empty tensor), so the rows above exercise that case."""
    torch = pytest.importorskip("torch")
    for how in HOWS:
        for shape in ((0, 3), (2, 0, 4), (0,)):
            parent, cut = _recipe(how, shape)
            for lib in (ta, torch):
                view = cut(lib, lib.zeros(parent))
                assert tuple(view.shape) == shape
                assert view.storage_offset() > 0 or (how == "split" and len(shape) == 1)
    piece = _recipe("split", (0, 3))[1](ta, ta.zeros(0, 6))
    assert piece.storage_offset() == 3 and piece.untyped_storage().size == 0


# ----------------------------------------------------------------------------- the GPT
CONFIG = dict(vocab_size=13, block_size=16, n_layer=2, n_head=4, n_embd=32)


@pytest.mark.parametrize("attn", ["views", "naive", "flash"])
def test_gpt_on_an_empty_batch(attn):
    """A (2, 0) batch: (2, 0, vocab) logits, and with targets torch's loss, the mean over
    no tokens (nan), whose backward gives every parameter a zero gradient."""
    torch = pytest.importorskip("torch")
    model = nn.GPT(nn.GPTConfig(**CONFIG, attn=attn))
    idx = ta.zeros(2, 0, dtype=ta.int64)
    logits, loss = model(idx)
    assert logits.shape == (2, 0, 13) and loss is None
    logits, loss = model(idx, idx)
    assert logits.shape == (2, 0, 13)
    empty = torch.zeros(2, 0, 13, requires_grad=True)
    ref = torch.nn.functional.cross_entropy(empty.view(-1, 13), torch.zeros(0, dtype=int),
                                            ignore_index=-1)
    assert np.isnan(loss.item()) and np.isnan(ref.item())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.shape == p.shape, name
        assert not np.any(p.grad.numpy()), name
