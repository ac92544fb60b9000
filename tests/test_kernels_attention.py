"""The blocked attention's tile kernels: the compiled (numba) twins agree with the NumPy
reference, the op is exact on either path (gradcheck), and both paths allocate the same
Storages.

attention_block_forward (one key block of the online softmax: scores -> p, the running
max, sum and output moved on), attention_block_probs (backward's p rebuilt from the
scores and the row logsumexp) and attention_block_dscores (the scores' gradient), each on
a tile of scores of shape (..., bq, bk), in place. Everything that needs numba skips
without it.
"""

from __future__ import annotations

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.backend import kernels
from tinygrad_attn.backend.kernels import reference

F = ta.functional
DTYPES = [np.float32, np.float64]
TOL = {np.float32: {"rtol": 3e-6, "atol": 1e-6}, np.float64: {"rtol": 1e-13, "atol": 1e-14}}
LEAD, BQ, BK, D = (2, 3), 5, 7, 3  # odd sizes: no tile is a multiple of a vector


def _tile(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(LEAD + (BQ, BK)) * 3).astype(dtype)


def _mask(case, dtype):
    """(keep, add) of one tile: None, a (bq, bk) causal keep as the op makes it, a keep of
    the tile's whole shape with one row masked throughout, additive masks of both shapes."""
    rng = np.random.default_rng(1)
    causal = np.arange(BK)[None, :] <= np.arange(BQ)[:, None] + 1
    if case == "none":
        return None, None
    if case == "causal":
        return causal, None
    if case == "full_keep":
        keep = rng.random(LEAD + (BQ, BK)) < 0.7
        keep[0, 1, 2] = False  # a row with no key in this tile
        return keep, None
    if case == "add":
        return None, rng.standard_normal((BQ, BK)).astype(dtype)
    assert case == "causal_and_full_add", case
    return causal, rng.standard_normal(LEAD + (BQ, BK)).astype(dtype)


MASKS = ["none", "causal", "full_keep", "add", "causal_and_full_add"]


def _state(dtype, first: bool):
    """m, l, acc before the tile: the first key block's (-inf, 0, 0) or a later one's."""
    shape = LEAD + (BQ, 1)
    if first:
        return (np.full(shape, -np.inf, dtype), np.zeros(shape, dtype),
                np.zeros(LEAD + (BQ, D), dtype))
    rng = np.random.default_rng(2)
    m = rng.standard_normal(shape).astype(dtype)
    m[1, 0, 3] = -np.inf  # a row that has seen no key yet
    return (m, rng.random(shape).astype(dtype) + 1,
            rng.standard_normal(LEAD + (BQ, D)).astype(dtype))


def _both(fn_name, compiled, *args):
    """Run the kernel on copies of args in each implementation; the arrays each wrote."""
    out = {}
    for name, impl in (("ref", reference), ("fast", compiled)):
        copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        result = getattr(impl, fn_name)(*copies)
        assert result is None, (name, result)
        out[name] = copies
    return out["fast"], out["ref"]


@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("case", MASKS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_block_forward_agrees_with_the_reference(compiled, dtype, case, first):
    keep, add = _mask(case, dtype)
    m, l, acc = _state(dtype, first)
    fast, ref = _both("attention_block_forward", compiled, _tile(dtype), m, l, acc, keep, add,
                      0.37)
    for a, b, what in zip(fast[:4], ref[:4], ("p", "m", "l", "acc")):
        assert a.dtype == b.dtype == dtype and a.shape == b.shape, what
        np.testing.assert_allclose(a, b, **TOL[dtype], err_msg=what)
    if case == "full_keep":
        p, m_new, l_new = ref[0], ref[1], ref[2]
        assert (p[0, 1, 2] == 0).all()  # the row with no key here gets p = 0, not nan
        assert np.isfinite(l_new).all() and np.isfinite(fast[2]).all()
        if first:
            assert m_new[0, 1, 2, 0] == fast[1][0, 1, 2, 0] == -np.inf


@pytest.mark.parametrize("dtype", DTYPES)
def test_block_forward_passes_a_nan_score_on_to_its_row(compiled, dtype):
    s = _tile(dtype)
    s[1, 2, 4, 3] = np.nan
    m, l, acc = _state(dtype, False)
    fast, ref = _both("attention_block_forward", compiled, s, m, l, acc, None, None, 1.0)
    for got in (fast, ref):
        assert np.isnan(got[2][1, 2, 4, 0]) and np.isnan(got[0][1, 2, 4, 3])
        assert np.isfinite(np.delete(got[2].reshape(-1), 1 * 15 + 2 * 5 + 4)).all()


@pytest.mark.parametrize("case", MASKS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_block_probs_agree_with_the_reference(compiled, dtype, case):
    keep, add = _mask(case, dtype)
    lse = np.random.default_rng(3).standard_normal(LEAD + (BQ, 1)).astype(dtype) + 4
    fast, ref = _both("attention_block_probs", compiled, _tile(dtype), lse, keep, add, 0.37)
    np.testing.assert_allclose(fast[0], ref[0], **TOL[dtype])
    if keep is not None:
        assert (fast[0][~np.broadcast_to(keep, fast[0].shape)] == 0).all()


@pytest.mark.parametrize("scale", [1.0, 0.125])
@pytest.mark.parametrize("dtype", DTYPES)
def test_block_dscores_is_the_reference_bit_for_bit(compiled, dtype, scale):
    rng = np.random.default_rng(5)
    p = rng.random(LEAD + (BQ, BK)).astype(dtype)
    d = rng.standard_normal(LEAD + (BQ, 1)).astype(dtype)
    fast, ref = _both("attention_block_dscores", compiled, _tile(dtype), p, d, scale)
    assert fast[0].tobytes() == ref[0].tobytes()


def test_compiled_declines_what_it_does_not_take(compiled):
    s = _tile(np.float32)
    m, l, acc = _state(np.float32, True)
    causal, _ = _mask("causal", np.float32)
    lse = np.zeros(LEAD + (BQ, 1), np.float32)
    declined = [
        ("attention_block_forward", (s, m, l, acc, causal[::-1], None, 1.0)),  # strided
        ("attention_block_forward", (s, m, l, acc, None, np.zeros((BQ, BK)), 1.0)),  # f64
        ("attention_block_forward", (s, m, l, acc, np.ones((1, BK), bool), None, 1.0)),
        ("attention_block_probs", (s, lse, None, np.zeros(BK, np.float32), 1.0)),  # 1-D
        ("attention_block_dscores", (s, s[..., :1], lse, 1.0)),  # p not of dp's shape
    ]
    for name, args in declined:
        before = s.copy()
        assert getattr(compiled, name)(*args) is NotImplemented, name
        assert s.tobytes() == before.tobytes(), name  # a declined call writes nothing


# ----------------------------------------------------------------------------- the op
def _qkv(dtype=ta.float32, T=20, seed=0):
    """q, k, v as the GPT makes them: views of one (B, T, 3C) projection, heads split."""
    ta.manual_seed(seed)
    qkv = ta.randn(2, T, 3 * 8, dtype=dtype, requires_grad=True)
    q, k, v = (t.view(2, T, 2, 4).transpose(1, 2) for t in qkv.split(8, dim=2))
    return qkv, q, k, v


def test_the_op_runs_the_compiled_tiles(mode):
    before = kernels.calls.copy()
    qkv, q, k, v = _qkv()
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, block_size=8)
    out.backward(ta.randn(*out.shape))
    ran = kernels.calls - before
    # 20 keys in tiles of 8: 1 + 2 + 3 causal tiles forward, as many backward
    assert ran["attention_block_forward", mode] == 6
    assert ran["attention_block_probs", mode] == 6
    assert ran["attention_block_dscores", mode] == 6


def test_both_paths_give_the_same_attention(numba_mode):
    got = {}
    for m in ("numpy", "numba"):
        kernels.set_kernels(m)
        qkv, q, k, v = _qkv(T=33)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, block_size=16)
        out.backward(ta.ones(*out.shape))
        got[m] = out.detach().numpy(), qkv.grad.numpy()
    np.testing.assert_allclose(got["numba"][0], got["numpy"][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["numba"][1], got["numpy"][1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("masking", ["causal", "bool", "float"])
def test_gradcheck(mode, masking):
    qkv, q, k, v = _qkv(ta.float64, T=9, seed=1)
    rng = np.random.default_rng(2)
    keep = rng.random((9, 9)) < 0.8
    keep[:, 0] = True  # every query sees a key
    masks = {"causal": (None, True), "bool": (ta.tensor(keep), False),
             "float": (ta.tensor(rng.standard_normal((2, 1, 9, 9))), False)}
    mask, causal = masks[masking]

    def attention(qkv):
        q, k, v = (t.view(2, 9, 2, 4).transpose(1, 2) for t in qkv.split(8, dim=2))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              block_size=4)

    assert ta.gradcheck(attention, [qkv])


def test_the_compiled_path_allocates_what_the_reference_does(numba_mode):
    counts = {}
    for m in ("numpy", "numba"):
        kernels.set_kernels(m)
        qkv, q, k, v = _qkv(T=24)
        with ta.memory.step_stats() as st:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, block_size=8)
            out.backward(ta.ones(*out.shape))
        counts[m] = st.allocations, st.allocated_bytes
    assert counts["numba"] == counts["numpy"] and counts["numpy"][0] > 0
