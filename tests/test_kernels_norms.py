"""The norm and loss kernels: the compiled (numba) twins against the NumPy reference, the
ops' gradients on the compiled path, and the Storage the two paths allocate.

layer_norm_forward/backward, rms_norm_forward/backward, cross_entropy_forward/backward
work on the (rows, n) view; the two agree to a few ulp (the compiled sums run in another
order, some in float64), the weight gradients are checked against exact sums. Without
numba every test here skips.
"""

from __future__ import annotations

import numpy as np
import pytest

import tinygrad_attn as ta
import tinygrad_attn.functional as F
from tinygrad_attn import memory
from tinygrad_attn.backend import kernels
from tinygrad_attn.backend.kernels import reference

SHAPES = [(0, 7), (5, 1), (33, 7), (300, 5), (64, 384)]  # 300: many rows per chunk
DTYPES = [np.float32, np.float64]





def _rand(shape, dtype, seed=0, offset=0.0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 2 + offset).astype(dtype)


def _close(a, b, dtype, ulps=4, mag=None):
    """a and b agree within `ulps` units in the last place of the largest |b| (or `mag`):
    the two paths round differently, in sums of another order, not more."""
    if a is None or b is None:
        assert a is None and b is None
        return
    assert a.dtype == b.dtype == np.dtype(dtype) and a.shape == b.shape
    if mag is None:
        mag = float(np.abs(b).max()) if b.size else 1.0
    np.testing.assert_allclose(a, b, rtol=0, atol=ulps * float(np.spacing(dtype(mag))))


def _wide(a):
    return a.astype(np.longdouble)


def _row_sums(sums, terms, dtype):
    """The weight gradients, sums over the rows, against the sums of the same `terms` in
    long double: the reference adds its rows one after another in the input's dtype, so
    its own error grows with the rows; the compiled sums must stay within a few ulp."""
    for got, term in zip(sums, terms):
        if got is not None:
            _close(got, term.sum(axis=0).astype(dtype), dtype, ulps=8)


def _params(n, dtype, weight, bias):
    w = _rand(n, dtype, 1) if weight else None
    b = _rand(n, dtype, 2) if bias else None
    return w, b


# ----------------------------------------------------------------------------- layer_norm
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("weight, bias", [(True, True), (False, False), (True, False)])
def test_layer_norm_forward_agrees(compiled, dtype, shape, weight, bias):
    x = _rand(shape, dtype)
    w, b = _params(shape[1], dtype, weight, bias)
    for fast, ref in zip(compiled.layer_norm_forward(x, w, b, 1e-5),
                         reference.layer_norm_forward(x, w, b, 1e-5)):
        _close(fast, ref, dtype)
    y, rstd = compiled.layer_norm_forward(x, w, b, 1e-5)
    assert y.shape == x.shape and rstd.shape == (shape[0], 1)


NEEDS3 = [(True, True, True), (True, False, False), (False, True, False), (False, False, True),
          (False, True, True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("needs", NEEDS3)
@pytest.mark.parametrize("weight", [True, False])
def test_layer_norm_backward_agrees(compiled, dtype, shape, needs, weight):
    x = _rand(shape, dtype)
    xhat, rstd = reference.layer_norm_forward(x, None, None, 1e-5)  # no weight: y is xhat
    g = _rand(shape, dtype, 3)
    w, _ = _params(shape[1], dtype, weight, False)
    fast = compiled.layer_norm_backward(g, x, rstd, w, needs)
    ref = reference.layer_norm_backward(g, x, rstd, w, needs)
    terms = np.abs(g).max(initial=0) * (np.abs(w).max(initial=0) if weight else 1)
    terms *= rstd.max(initial=0)
    _close(fast[0], ref[0], dtype, mag=terms)  # gx cancels: the ulp of its terms, g w rstd
    assert [f is not None for f in fast] == [bool(v) for v in needs]
    _row_sums(fast[1:], [g * _wide(xhat), _wide(g)], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_large_offset_keeps_the_variance(compiled, dtype):
    """x + 1e4 with unit spread: the variance from E[x^2] - E[x]^2 would be lost in float32
    rounding; both paths take it from the centred values."""
    x = _rand((40, 96), dtype, offset=1e4)
    x64 = x.astype(np.float64)
    true_rstd = 1 / np.sqrt(x64.var(axis=1, keepdims=True) + 1e-5)
    true_xhat = (x64 - x64.mean(axis=1, keepdims=True)) * true_rstd
    # float32: x's own rounding near 1e4 (ulp 1e-3) bounds what either path can do
    tol = 1e-11 if dtype == np.float64 else 2e-3
    for fn in (compiled.layer_norm_forward, reference.layer_norm_forward):
        xhat, rstd = fn(x, None, None, 1e-5)  # no weight or bias: y is xhat
        np.testing.assert_allclose(rstd, true_rstd, rtol=tol)
        np.testing.assert_allclose(xhat, true_xhat, atol=tol)


# ----------------------------------------------------------------------------- rms_norm
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("weight", [True, False])
def test_rms_norm_forward_agrees(compiled, dtype, shape, weight):
    x = _rand(shape, dtype, offset=1e4 if shape[0] == 33 else 0.0)
    w, _ = _params(shape[1], dtype, weight, False)
    eps = float(np.finfo(dtype).eps)
    for fast, ref in zip(compiled.rms_norm_forward(x, w, eps),
                         reference.rms_norm_forward(x, w, eps)):
        _close(fast, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("needs", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("weight", [True, False])
def test_rms_norm_backward_agrees(compiled, dtype, shape, needs, weight):
    x = _rand(shape, dtype)
    _, rstd = reference.rms_norm_forward(x, None, 1e-6)
    g = _rand(shape, dtype, 3)
    w, _ = _params(shape[1], dtype, weight, False)
    fast = compiled.rms_norm_backward(g, x, rstd, w, needs)
    ref = reference.rms_norm_backward(g, x, rstd, w, needs)
    terms = np.abs(g).max(initial=0) * (np.abs(w).max(initial=0) if weight else 1)
    terms *= rstd.max(initial=0)
    _close(fast[0], ref[0], dtype, mag=terms)  # gx cancels: the ulp of its terms, g w rstd
    assert [f is not None for f in fast] == [bool(v) for v in needs]
    _row_sums(fast[1:], [g * _wide(x * rstd)], dtype)  # xhat as the kernels round it


# ----------------------------------------------------------------------------- cross_entropy
def _targets(n, c, seed=4, ignore=-100, every=3, dtype=np.int64):
    """Class indices with every `every`-th row set to `ignore` (every=1: all ignored)."""
    t = np.random.default_rng(seed).integers(0, c, n).astype(dtype)
    t[::every] = ignore
    return t


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, c", [(0, 5), (1, 1), (7, 1), (37, 65), (300, 11)])
@pytest.mark.parametrize("every", [3, 1])
def test_cross_entropy_forward_agrees(compiled, dtype, n, c, every):
    logits = _rand((n, c), dtype, offset=50.0)
    target = _targets(n, c, every=every)
    fast = compiled.cross_entropy_forward(logits, target, -100)
    ref = reference.cross_entropy_forward(logits, target, -100)
    assert fast[0].shape == (n,) and fast[1].shape == (n, 1)
    mag = float(np.abs(ref[1]).max()) if n else 1.0  # the loss is lse - logit: lse's ulp
    for f, r in zip(fast, ref):
        _close(f, r, dtype, mag=mag)
    assert np.all(fast[0][target == -100] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, c", [(0, 5), (1, 1), (37, 65), (300, 11)])
@pytest.mark.parametrize("every", [3, 1])
@pytest.mark.parametrize("per_row", [False, True])
def test_cross_entropy_backward_agrees(compiled, dtype, n, c, every, per_row):
    logits = _rand((n, c), dtype, offset=-20.0)
    target = _targets(n, c, ignore=7, every=every, dtype=np.int32)
    _, lse = reference.cross_entropy_forward(logits, target, 7)
    scale = _rand(n, dtype, 5) if per_row else np.asarray(0.25, dtype)
    fast = compiled.cross_entropy_backward(logits, lse, target, 7, scale)
    ref = reference.cross_entropy_backward(logits, lse, target, 7, scale)
    _close(fast, ref, dtype)
    assert np.all(fast[target == 7] == 0)


def test_cross_entropy_rows_of_minus_inf(compiled):
    """-inf logits get probability 0; a row of nothing but -inf has no logsumexp (nan) on
    both paths."""
    logits = _rand((4, 6), np.float32)
    logits[0, :3] = -np.inf
    logits[1] = -np.inf
    target = np.array([4, 2, 0, 5])
    fast = compiled.cross_entropy_forward(logits, target, -100)
    ref = reference.cross_entropy_forward(logits, target, -100)
    for f, r in zip(fast, ref):
        np.testing.assert_allclose(f, r, rtol=1e-6)
    assert np.isnan(fast[1][1, 0]) and np.isfinite(fast[0][[0, 2, 3]]).all()
    grad = compiled.cross_entropy_backward(logits, fast[1], target, -100, np.float32(1.0))
    assert np.all(grad[0, :3] == 0) and np.isnan(grad[1]).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_rows_far_from_their_first_logit(compiled, dtype):
    """The compiled sum is shifted by a row's first logit; where that one is far below the
    row's max (a term would overflow, or the sum would pass its bound) the row is summed
    again from its max. Either way lse is the reference's to a few ulp."""
    logits = _rand((6, 40), dtype)
    logits[0, 0] = -100.0  # exp(x - x[0]) overflows float32 for the other terms
    logits[1, 0] = -47.0  # no overflow, but the sum passes 2^64
    logits[2, 0] = -40.0  # under the bound: the shifted sum stands
    logits[3, 0] = 300.0  # far above the rest: every other term is 0, the sum is 1
    logits[4, 1:] += 88.3  # just past exp32's clamp at 88 for the terms after the first
    target = np.arange(6)
    fast = compiled.cross_entropy_forward(logits, target, -100)
    ref = reference.cross_entropy_forward(logits, target, -100)
    mag = float(np.abs(ref[1]).max())
    for f, r in zip(fast, ref):
        _close(f, r, dtype, mag=mag)
    x64 = logits.astype(np.float64)
    m = x64.max(axis=1, keepdims=True)
    true_lse = np.log(np.exp(x64 - m).sum(axis=1, keepdims=True)) + m
    np.testing.assert_allclose(fast[1], true_lse, rtol=4 * float(np.finfo(dtype).eps))


def test_compiled_declines_what_it_does_not_take(compiled):
    """No classes, a uint64 target or a scale of another dtype: NotImplemented, so the
    reference runs (and raises or computes as it always did)."""
    logits = _rand((3, 4), np.float32)
    assert compiled.cross_entropy_forward(logits[:, :0].copy(), np.zeros(3, np.int64),
                                          -100) is NotImplemented
    assert compiled.cross_entropy_forward(logits, np.zeros(3, np.uint64), -100) \
        is NotImplemented
    lse = np.zeros((3, 1), np.float32)
    assert compiled.cross_entropy_backward(logits, lse, np.zeros(3, np.int64), -100,
                                           np.float64(1.0)) is NotImplemented
    assert compiled.layer_norm_forward(logits[:, :0].copy(), None, None, 1e-5) \
        is NotImplemented


# ----------------------------------------------------------------------------- through the ops
def _t(a, grad=True):
    return ta.tensor(a, requires_grad=grad)


def test_gradcheck_on_the_compiled_path(numba_mode):
    before = dict(kernels.calls)
    x, w, b = (_t(_rand(s, np.float64, i)) for i, s in enumerate([(3, 4, 5), (4, 5), (4, 5)]))
    ta.gradcheck(lambda x, w, b: F.layer_norm(x, (4, 5), w, b), (x, w, b))
    ta.gradcheck(lambda x: F.layer_norm(x, 5), (x,))
    ta.gradcheck(lambda x, w: F.rms_norm(x, (4, 5), w, eps=1e-3), (x, w))
    ta.gradcheck(lambda x: F.rms_norm(x, (5,)), (x,))
    logits = _t(_rand((9, 6), np.float64, 5))
    target = ta.tensor(_targets(9, 6, ignore=2, every=4))
    for reduction in ("mean", "sum", "none"):
        ta.gradcheck(lambda z, r=reduction: F.cross_entropy(z, target, ignore_index=2,
                                                            reduction=r), (logits,))
    for name in ("layer_norm_forward", "layer_norm_backward", "rms_norm_forward",
                 "rms_norm_backward", "cross_entropy_forward", "cross_entropy_backward"):
        assert kernels.calls[name, "numba"] > before.get((name, "numba"), 0), name


def _step(kind, dtype=np.float32):
    """One forward and backward of op `kind`; returns the output, the gradients and the
    Storage allocations (bytes, in order) under a memory profile."""
    x = _t(_rand((6, 8, 16), dtype))
    params = [_t(_rand(16, dtype, 1)), _t(_rand(16, dtype, 2))]
    with memory.profile() as prof:
        if kind == "layer_norm":
            y = F.layer_norm(x, 16, *params)
        elif kind == "rms_norm":
            y = F.rms_norm(x, 16, params[0])
            params = params[:1]
        else:
            target = ta.tensor(_targets(48, 16, every=5))
            y = F.cross_entropy(x.reshape(48, 16), target, reduction="sum")
            params = []
        y.backward(ta.ones_like(y))
    allocs = [e["bytes"] for e in prof.events if e["kind"] == "alloc"]
    grads = [t.grad.numpy() for t in [x, *params]]
    return y.detach().numpy(), grads, allocs, prof.summary()["tensor_peak_above_start"]


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm", "cross_entropy"])
def test_both_paths_allocate_the_same_storage(kind):
    pytest.importorskip("numba")
    before = kernels.get_kernels()
    try:
        kernels.set_kernels("numpy")
        y0, g0, allocs0, peak0 = _step(kind)
        kernels.set_kernels("numba")
        y1, g1, allocs1, peak1 = _step(kind)
    finally:
        kernels.set_kernels(before)
    assert allocs1 == allocs0 and peak1 == peak0
    np.testing.assert_allclose(y1, y0, rtol=1e-5, atol=1e-5)
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_saved_tensors_unchanged(mode):
    """layer_norm and rms_norm keep their input x + rstd (+ weight, bias), cross_entropy
    logits + lse (+ target): the input itself, no copy of it."""
    x = _t(_rand((2, 3, 4), np.float32))
    w, b = _t(_rand(4, np.float32, 1)), _t(_rand(4, np.float32, 2))
    y = F.layer_norm(x, 4, w, b)
    xs, rstd, ws, bs = y.grad_fn.saved_tensors
    assert xs is x and rstd.shape == (2, 3, 1) and ws is w and bs is b
    y = F.rms_norm(x, (3, 4), None)
    xs, rstd, ws = y.grad_fn.saved_tensors
    assert xs is x and rstd.shape == (2, 1, 1) and ws is None
    target = ta.tensor([1, 0, 3, 3, -100, 2])
    loss = F.cross_entropy(x.reshape(6, 4), target)
    logits, lse, ts = loss.grad_fn.saved_tensors
    assert logits.shape == (6, 4) and lse.shape == (6, 1) and ts is target


def test_half_precision_takes_the_reference_and_strided_rows_are_copied_once(numba_mode):
    before = kernels.calls.copy()
    x = ta.tensor(_rand((4, 8), np.float16))
    y = F.layer_norm(x, 8)
    assert y.dtype == ta.float16
    assert (kernels.calls - before)["layer_norm_forward", "numpy"] == 1
    x32 = ta.tensor(_rand((8, 4), np.float32)).transpose(0, 1)  # rows not contiguous
    before = kernels.calls.copy()
    np.testing.assert_allclose(F.layer_norm(x32, 8).numpy(),
                               F.layer_norm(x32.contiguous(), 8).numpy(), rtol=1e-6)
    # the strided x is copied to contiguous rows (the copy the op keeps), so it runs compiled
    assert (kernels.calls - before)["layer_norm_forward", "numba"] == 2


def test_errors_are_unchanged_on_the_compiled_path(numba_mode):
    logits = _t(_rand((4, 5), np.float32))
    with pytest.raises(IndexError, match="Target 5 is out of bounds for 5 classes"):
        F.cross_entropy(logits, ta.tensor([0, 5, 1, 2]))
    with pytest.raises(IndexError, match="Target -3 is out of bounds"):
        F.cross_entropy(logits, ta.tensor([0, -3, 1, 2]))
    with pytest.raises(RuntimeError, match="expected a weight of the input's dtype"):
        F.layer_norm(logits, 5, ta.ones(5, dtype=ta.float64))
    with pytest.raises(ta.ShapeError, match="does not end with"):
        F.rms_norm(logits, (4,))


def test_all_ignored_and_empty_batches(mode):
    logits = _t(_rand((3, 5), np.float32))
    target = ta.tensor([-100, -100, -100])
    loss = F.cross_entropy(logits, target)
    assert np.isnan(loss.item())
    loss.backward()
    assert np.all(logits.grad.numpy() == 0)
    assert F.cross_entropy(logits, target, reduction="sum").item() == 0
    empty = _t(np.zeros((0, 5), np.float32))
    assert F.cross_entropy(empty, ta.tensor(np.zeros(0, np.int64)), reduction="sum").item() == 0
    y = F.layer_norm(_t(np.zeros((0, 5), np.float32)), 5)
    assert y.shape == (0, 5)


@pytest.mark.parametrize("view", ["columns", "transposed", "every_other_row"])
def test_a_strided_input_is_kept_as_one_contiguous_copy(mode, view):
    """layer_norm copies a strided x to rows once and keeps that copy, not x (backward reads
    it without a second copy); the values and gradients are those of a contiguous x."""
    base = ta.tensor(_rand((4, 6, 5), np.float64), requires_grad=True)
    pick = {"columns": lambda a: a[:, :, :3], "transposed": lambda a: a.transpose(0, 1),
            "every_other_row": lambda a: a[::2]}[view]
    g = None
    results = []
    for contiguous in (False, True):
        base.grad = None
        x = pick(base)
        x = x.contiguous() if contiguous else x
        y = F.layer_norm(x, x.shape[-1])
        kept = y.grad_fn.saved_tensors[0]
        assert kept.is_contiguous() and tuple(kept.shape) == tuple(x.shape)
        assert contiguous or not kept.shares_storage(base)
        g = g if g is not None else ta.tensor(_rand(tuple(y.shape), np.float64, 7))
        y.backward(g)
        results.append((y.detach().numpy(), base.grad.numpy()))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
