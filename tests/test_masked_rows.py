"""Fully masked rows in attention: a query that may attend to no key.

torch 2.13's scaled_dot_product_attention gives such a row an output of zeros and
gradients of zero (dq's row, its share of dk and dv, the float mask's row), for a float
mask of -inf and a bool mask of False alike. One such row must not poison every weight
with nan: before, backward rebuilt p = exp(z - lse) with z = lse = -inf, which is nan.
Every attention path and both kernel paths (reference and compiled) are checked against
torch; masked_softmax itself keeps torch's composition (nan rows, docs/differences.md).
"""

from __future__ import annotations

import numpy as np
import pytest
from rows_vs_torch import Case, check_case

import tinygrad_attn as ta
from tinygrad_attn.backend import kernels
from tinygrad_attn.backend.kernels import reference

Tq, Tk, D = 6, 7, 3


def _sdpa(**kw):
    def fn(lib, q, k, v, mask):
        F = lib.functional if lib is ta else lib.nn.functional
        extra = {"block_size": kw["block_size"]} if lib is ta and "block_size" in kw else {}
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                              enable_gqa=kw.get("gqa", False), **extra)
    return fn


def _mask(kind, shape, dtype=np.float64):
    """A mask with a fully masked row (1), a row masked but for its last key (2) and, in
    a mask with a head dim, a second fully masked row in one head only."""
    keep = np.ones(shape, bool)
    keep[..., 1, :] = False
    keep[..., 2, :-1] = False
    if len(shape) == 4:
        keep[0, 1, 4, :] = False
    if kind == "bool":
        return keep
    return np.where(keep, np.random.default_rng(3).standard_normal(shape), -np.inf).astype(dtype)


def _qkv(Hq=2, Hk=2, dtype=np.float64):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((1, Hq, Tq, D)).astype(dtype),
            rng.standard_normal((1, Hk, Tk, D)).astype(dtype),
            rng.standard_normal((1, Hk, Tk, D)).astype(dtype))


CASES = {
    # (mask kind, mask shape, q heads, kv heads, block size)
    "float-full-shape": ("float", (1, 2, Tq, Tk), 2, 2, None),  # the compiled tiles read it
    "float-broadcast": ("float", (Tq, Tk), 2, 2, None),
    "float-blocked": ("float", (1, 2, Tq, Tk), 2, 2, 2),  # the empty row spans key blocks
    "bool-full-shape": ("bool", (1, 2, Tq, Tk), 2, 2, None),
    "bool-blocked": ("bool", (Tq, Tk), 2, 2, 3),
    "float-gqa": ("float", (1, 4, Tq, Tk), 4, 2, 4),
    "bool-gqa": ("bool", (1, 4, Tq, Tk), 4, 2, None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_attention_with_fully_masked_rows_matches_torch(mode, name):
    torch = pytest.importorskip("torch")
    kind, shape, hq, hk, bs = CASES[name]
    kw = {"gqa": hq != hk} | ({} if bs is None else {"block_size": bs})
    check_case(Case(_sdpa(**kw), _qkv(hq, hk) + (_mask(kind, shape),)), torch)


@pytest.mark.parametrize("kind", ["float", "bool"])
@pytest.mark.parametrize("dtype", [ta.float32, ta.float16])
def test_no_nan_in_any_gradient(mode, kind, dtype):
    q, k, v = (ta.tensor(a, dtype=dtype, requires_grad=True) for a in _qkv())
    mask = ta.tensor(_mask(kind, (1, 2, Tq, Tk), dtype.np))
    before = kernels.calls.copy()
    out = ta.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.backward(ta.ones(*out.shape, dtype=dtype))
    if mode == "numba" and dtype is ta.float32:  # the compiled tiles ran, not the reference
        assert (kernels.calls - before)["attention_block_probs", "numba"] == 1
    assert not np.any(out.detach().numpy()[0, :, 1])
    for t in (q, k, v):
        assert np.isfinite(t.grad.numpy()).all()
    assert not np.any(q.grad.numpy()[0, :, 1])  # the empty row's query gets no gradient


def test_is_causal_never_empties_a_row(mode):
    """Top-left causal alignment lets every query see key 0, even with Tq > Tk."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, n, D)) for n in (9, 4, 4))

    def fn(lib, q, k, v):
        F = lib.functional if lib is ta else lib.nn.functional
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    check_case(Case(fn, (q, k, v)), torch)


def test_masked_softmax_keeps_the_composition(mode):
    """masked_softmax is torch's softmax(x.masked_fill(mask, -inf)): a fully masked row is
    nan with a zero gradient, unlike attention (docs/differences.md, masked_softmax)."""
    x = ta.randn(3, 4, requires_grad=True)
    mask = ta.tensor(np.array([[False] * 4, [True] * 4, [True, False, True, True]]))
    y = ta.functional.masked_softmax(x, mask)
    y.backward(ta.ones(3, 4))
    assert np.isnan(y.detach().numpy()[1]).all()
    assert not np.isnan(y.detach().numpy()[[0, 2]]).any()
    assert not np.any(x.grad.numpy()[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_probs_of_an_empty_row_agree_with_the_reference(compiled, dtype):
    """The op gives an empty row lse = +inf: both kernels then write p = 0 over it, for
    finite scores and -inf ones alike."""
    s = np.random.default_rng(0).standard_normal((2, 4, 5)).astype(dtype)
    add = np.zeros((2, 4, 5), dtype)
    add[0, 1] = -np.inf
    lse = np.ones((2, 4, 1), dtype)
    lse[0, 1] = lse[1, 3] = np.inf
    got = []
    for impl in (reference, compiled):
        p = s.copy()
        assert impl.attention_block_probs(p, lse, None, add, 0.5) is None
        got.append(p)
    np.testing.assert_allclose(got[1], got[0], rtol=3e-6)
    assert not got[0][0, 1].any() and not got[0][1, 3].any()
    assert not got[1][0, 1].any() and not got[1][1, 3].any()
