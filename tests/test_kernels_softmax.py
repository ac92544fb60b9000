"""The softmax kernels: the compiled (numba) twins agree with the NumPy reference, the ops
are exact on either path (gradcheck), and the compiled path allocates no more Storage.

Kernels over the last dim: softmax_forward / softmax_backward, log_softmax_forward /
log_softmax_backward, masked_softmax_forward (a bool or additive mask read through its
broadcast strides) / masked_softmax_backward.
"""

from __future__ import annotations

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.backend import kernels
from tinygrad_attn.backend.kernels import reference

F = ta.functional
# relative for probabilities (down to float32's smallest normal); an absolute floor where an
# output is a difference of O(1) terms (gradients, log-probabilities): a few ulp of those
TOL = {np.float32: {"rtol": 2e-6, "atol": 1e-37}, np.float64: {"rtol": 1e-13, "atol": 1e-300}}
DIFF_ATOL = {np.float32: 1e-6, np.float64: 1e-14}




def _rows(name, dtype):
    """Inputs whose last dim is normalized: odd sizes, -inf entries, a row of -inf only,
    large values, a nan, zero-size arrays."""
    rng = np.random.default_rng(0)
    if name == "odd":
        x = rng.standard_normal((3, 2, 33)) * 3
    elif name == "long":
        x = rng.standard_normal((2, 257)) * 5
    elif name == "one":
        x = rng.standard_normal((4, 1))
    elif name == "inf":
        x = rng.standard_normal((4, 6))
        x[0, 2] = x[1, 0] = x[1, 5] = -np.inf
        x[2, :] = -np.inf  # every entry masked: nan
        x[3, 1] = np.nan
    elif name == "large":
        x = np.array([[1e4, 0.0, -1e4, 3e4], [80.0, 88.0, -87.0, -200.0]])
    elif name == "empty_rows":
        x = np.zeros((0, 5))
    else:
        assert name == "empty_dim", name
        x = np.zeros((3, 0))
    return x.astype(dtype)


ROWS = ["odd", "long", "one", "inf", "large", "empty_rows", "empty_dim"]
DTYPES = [np.float32, np.float64]


def _agree(fast, ref, dtype, difference=False):
    assert fast.dtype == ref.dtype == dtype and fast.shape == ref.shape
    assert np.array_equal(np.isnan(fast), np.isnan(ref))
    tol = dict(TOL[dtype], **({"atol": DIFF_ATOL[dtype]} if difference else {}))
    np.testing.assert_allclose(fast, ref, **tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ROWS)
def test_softmax_and_log_softmax_agree_with_the_reference(compiled, name, dtype):
    x = _rows(name, dtype)
    g = np.random.default_rng(1).standard_normal(x.shape).astype(dtype)
    for fwd, bwd in (("softmax_forward", "softmax_backward"),
                     ("log_softmax_forward", "log_softmax_backward")):
        y = getattr(reference, fwd)(x)
        _agree(getattr(compiled, fwd)(x), y, dtype, difference=fwd.startswith("log"))
        _agree(getattr(compiled, bwd)(y, g), getattr(reference, bwd)(y, g), dtype, True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_infinite_gradient_entry_first_in_its_row(compiled, dtype):
    y = reference.softmax_forward(_rows("odd", dtype))
    g = np.random.default_rng(1).standard_normal(y.shape).astype(dtype)
    g[0, 0, 0], g[1, 1, 0] = np.inf, -np.inf
    for bwd in ("softmax_backward", "log_softmax_backward"):
        _agree(getattr(compiled, bwd)(y, g), getattr(reference, bwd)(y, g), dtype, True)


def test_rows_of_minus_inf_are_nan_and_the_rest_sums_to_one(compiled):
    x = _rows("inf", np.float32)
    y = compiled.softmax_forward(x)
    assert np.isnan(y[2]).all() and np.isnan(y[3]).all()  # all masked; a nan entry
    assert y[0, 2] == 0 and y[1, 0] == 0 and y[1, 5] == 0
    np.testing.assert_allclose(y[:2].sum(-1), 1, rtol=1e-6)


def _causal(T, dtype=bool):
    """(1, 1, T, T): True above the diagonal (masked); as a float, -inf there."""
    future = np.triu(np.ones((T, T), dtype=bool), 1)
    mask = future if dtype is bool else np.where(future, -np.inf, 0).astype(dtype)
    return mask.reshape(1, 1, T, T)


def _masks(name, dtype):
    """(scores, mask) pairs: the mask broadcasts to the scores and is read in place."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((2, 3, 7, 7)) * 4).astype(dtype)
    if name == "causal":
        return x, _causal(7)
    if name == "causal_sliced":  # the GPT's self.mask[:, :, :T, :T]: a non-contiguous view
        return x, _causal(9)[:, :, :7, :7]
    if name == "full":  # one mask per head and batch, and fully masked rows
        mask = rng.random(x.shape) < 0.4
        mask[0, 1, 3] = mask[1, 2, 0] = True
        return x, mask
    if name == "row_mask":  # (7, 1): a mask read with column stride 0
        mask = np.zeros((7, 1), dtype=bool)
        mask[2] = True
        return x, mask
    if name == "per_batch":  # (2, 1, 7, 7): broadcast over the heads only
        return x, rng.random((2, 1, 7, 7)) < 0.3
    if name == "float":
        return x, rng.standard_normal((3, 1, 7)).astype(dtype)
    if name == "float_causal":
        return x, _causal(7, dtype)
    if name == "none":
        return x, None
    assert name == "empty", name
    return np.zeros((0, 3, 7), dtype), np.zeros((3, 7), bool)


MASKS = ["causal", "causal_sliced", "full", "row_mask", "per_batch", "float", "float_causal",
         "none", "empty"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", MASKS)
def test_masked_softmax_agrees_with_the_reference(compiled, name, dtype):
    x, mask = _masks(name, dtype)
    g = np.random.default_rng(3).standard_normal(x.shape).astype(dtype)
    y = reference.masked_softmax_forward(x, mask, 0.375)
    fast = compiled.masked_softmax_forward(x, mask, 0.375)
    assert fast is not NotImplemented
    _agree(fast, y, dtype)
    boolean = mask is not None and mask.dtype == bool
    _agree(compiled.masked_softmax_backward(y, g, 0.375, boolean),
           reference.masked_softmax_backward(y, g, 0.375, boolean), dtype, True)


def test_masked_softmax_is_the_composition_it_replaces():
    """Bit for bit, on the reference: softmax((x * scale).masked_fill(mask, -inf))."""
    x, mask = _masks("full", np.float32)
    z = x * np.float32(0.375)
    z[np.broadcast_to(mask, x.shape)] = -np.inf
    assert np.array_equal(reference.masked_softmax_forward(x, mask, 0.375),
                          reference.softmax_forward(z), equal_nan=True)


def test_fully_masked_rows_get_a_zero_gradient_only_for_bool_masks(compiled):
    x, mask = _masks("full", np.float64)
    g = np.ones_like(x)
    for impl in (reference, compiled):
        y = impl.masked_softmax_forward(x, mask, 1.0)
        assert np.isnan(y[0, 1, 3]).all() and not np.isnan(y[0, 1, 2]).any()
        gx = impl.masked_softmax_backward(y, g, 1.0, True)
        assert (gx[0, 1, 3] == 0).all() and (gx[1, 2, 0] == 0).all()
        assert np.isnan(impl.masked_softmax_backward(y, g, 1.0, False)[0, 1, 3]).all()


def test_compiled_declines_what_it_does_not_take(compiled):
    x = np.zeros((2, 3), np.float32)
    assert compiled.masked_softmax_forward(x, np.zeros(3, np.float64), 1.0) is NotImplemented
    flipped = np.zeros((4, 3), bool)[::-1]  # a negative stride
    assert compiled.masked_softmax_forward(np.zeros((4, 3), np.float32), flipped,
                                           1.0) is NotImplemented


# ----------------------------------------------------------------------------- the ops
def test_the_ops_run_the_compiled_kernels_on_contiguous_rows(mode):
    before = kernels.calls.copy()
    x = ta.randn(4, 8, requires_grad=True)
    mask = ta.tensor(_causal(8)[0, 0, :4])
    for y in (x.softmax(-1), x.log_softmax(-1), F.masked_softmax(x, mask, scale=0.5)):
        y.backward(ta.randn(4, 8))  # a C-contiguous gradient (sum()'s is a stride-0 view)
    ran = kernels.calls - before
    for name in ("softmax_forward", "softmax_backward", "log_softmax_forward",
                 "log_softmax_backward", "masked_softmax_forward", "masked_softmax_backward"):
        assert ran[name, mode] == 1, name
    # another dim: the reference on a moved-axis view (the compiled kernels take C order)
    before = kernels.calls.copy()
    x.softmax(0)
    assert (kernels.calls - before)["softmax_forward", "numpy"] == 1


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "masked_bool", "masked_float",
                                "masked_none"])
def test_gradcheck(mode, op):
    ta.manual_seed(0)
    x = ta.randn(2, 3, 5, dtype=ta.float64, requires_grad=True)
    causal = ta.tensor(_causal(5)[0])  # (1, 5, 5) against (2, 3, 5): rows 0..2 of it
    fm = ta.randn(3, 5, dtype=ta.float64, requires_grad=True)
    fns = {"softmax": (lambda x: x.softmax(-1), [x]),
           "log_softmax": (lambda x: ta.log_softmax(x * 3, -1), [x]),
           "masked_bool": (lambda x: F.masked_softmax(x, causal[:, :3], scale=0.7), [x]),
           "masked_float": (lambda x, m: F.masked_softmax(x, m, scale=1.5), [x, fm]),
           "masked_none": (lambda x: F.masked_softmax(x, scale=2.0), [x])}
    fn, inputs = fns[op]
    assert ta.gradcheck(fn, inputs)


def test_fully_masked_row_through_the_op_matches_torch(mode):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(4).standard_normal((2, 4))
    mask = np.array([[True] * 4, [False, True, False, False]])
    ours = ta.tensor(x, requires_grad=True)
    y = F.masked_softmax(ours, ta.tensor(mask), scale=0.5)
    y.backward(ta.ones(2, 4, dtype=ta.float64))
    theirs = torch.tensor(x, requires_grad=True)
    ty = torch.softmax((theirs * 0.5).masked_fill(torch.tensor(mask), float("-inf")), -1)
    ty.backward(torch.ones(2, 4, dtype=torch.float64))
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), atol=1e-15)
    assert (ours.grad.numpy()[0] == 0).all()


def _allocations(fn):
    with ta.memory.step_stats() as st:
        fn()
    return st.allocations, st.allocated_bytes


def test_the_compiled_path_allocates_what_the_reference_does():
    pytest.importorskip("numba")
    x = ta.randn(2, 3, 16, 16, requires_grad=True)
    fm = ta.randn(16, 16, requires_grad=True)
    mask = ta.tensor(_causal(16))
    g = ta.randn(2, 3, 16, 16)
    steps = [lambda: x.softmax(-1).backward(g), lambda: x.log_softmax(-1).backward(g),
             lambda: F.masked_softmax(x, mask, scale=0.25).backward(g),
             lambda: F.masked_softmax(x, fm).backward(g)]
    before = kernels.get_kernels()
    try:
        for step in steps:
            counts = {}
            for m in ("numpy", "numba"):
                kernels.set_kernels(m)
                x.grad = fm.grad = None
                counts[m] = _allocations(step)
            assert counts["numba"] == counts["numpy"] and counts["numpy"][0] > 0
    finally:
        kernels.set_kernels(before)


def test_masked_softmax_saves_only_its_output():
    x = ta.randn(2, 4, 4, requires_grad=True)
    mask = ta.tensor(_causal(4)[0])
    y = F.masked_softmax(x, mask)
    (saved,) = y.grad_fn.saved_tensors
    assert saved.shares_storage(y) and not saved.shares_storage(mask)


def test_masked_softmax_checks_its_arguments():
    x = ta.randn(2, 3)
    with pytest.raises(RuntimeError, match="masked_softmax: expected a bool mask or one of"):
        F.masked_softmax(x, ta.zeros(3, dtype=ta.float64))
    with pytest.raises(ta.ShapeError, match=r"masked_softmax: mask of shape \(2, 3, 3\)"):
        F.masked_softmax(x, ta.zeros(2, 3, 3, dtype=ta.bool))
    with pytest.raises(TypeError, match="masked_softmax: mask must be a Tensor"):
        F.masked_softmax(x, np.zeros(3, bool))
    with pytest.raises(TypeError, match="masked_softmax: scale must be a number"):
        F.masked_softmax(x, scale=None)
    with pytest.raises(RuntimeError, match="masked_softmax: expected a floating-point"):
        F.masked_softmax(ta.tensor([1, 2]))
    assert F.masked_softmax is ta.functional.masked_softmax
    import nn.functional

    assert nn.functional.masked_softmax is F.masked_softmax


def test_a_row_made_nan_by_its_input_gets_a_zero_gradient_with_a_bool_mask(mode):
    """The one documented difference from torch's composition (docs/differences.md): the op
    saves only its output, where every entry of such a row is nan, masked or not."""
    x = ta.tensor([[np.nan, 1.0, 2.0], [0.5, 1.0, 2.0]], dtype=ta.float64, requires_grad=True)
    mask = ta.tensor([[False, True, False]])
    y = F.masked_softmax(x, mask)
    y.backward(ta.ones(2, 3, dtype=ta.float64))
    assert np.isnan(y.detach().numpy()[0]).all()
    assert (x.grad.numpy()[0] == 0).all() and not np.isnan(x.grad.numpy()[1]).any()
