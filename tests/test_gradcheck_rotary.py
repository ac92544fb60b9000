"""apply_rotary_emb: gradcheck rows (float64, finite differences) on contiguous, transposed
and sliced inputs and on the GPU (or the fake CuPy); the same op against the rotate-half
formula written in torch; what it saves; its errors. tests/test_registry.py counts the
rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rows_vs_torch import Case, case_ids, check_case, randn
from test_gradcheck_ops import DEVICE, _t, check

import tinygrad_attn as ta

VIEWS = ["contiguous", "transposed", "sliced"]


def _tables(T, half, dtype=np.float64):
    """cos, sin of the angles t * 10000^(-i / half), as a model builds them: (T, half)."""
    inv_freq = 1.0 / (10000.0 ** (np.arange(half) / half))
    angles = np.outer(np.arange(T), inv_freq)
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def _rope(x, T=None):
    """The op on x (..., T, D) with tables of x's shape: constants on the input's device."""
    T = x.shape[-2] if T is None else T
    cos, sin = _tables(T, x.shape[-1] // 2)
    return ta.functional.apply_rotary_emb(x, _t(cos, dtype=ta.float64),
                                          _t(sin, dtype=ta.float64))


GRAD_ROWS = {
    "apply_rotary_emb": lambda x: _rope(x),
    "apply_rotary_emb_row_tables": lambda x: ta.functional.apply_rotary_emb(
        x, _t([[0.3, -0.8]], dtype=ta.float64), _t([[0.9, 0.1]], dtype=ta.float64)),
}


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("op", list(GRAD_ROWS))
def test_gradcheck(op, view):
    check(GRAD_ROWS[op], [((3, 4), view, "real")])


@pytest.mark.parametrize("op", list(GRAD_ROWS))
def test_gradcheck_on_device(gpu_device, op, monkeypatch):
    monkeypatch.setitem(DEVICE, "name", gpu_device)
    check(GRAD_ROWS[op], [((3, 4), "transposed", "real")])


def test_rotary_on_head_views():
    """(B, nh, T, hs) head views of a fused projection, tables broadcast over (B, nh)."""
    def heads(x):  # x: (B, T, nh * hs) -> (B, nh, T, hs), a transposed view
        return _rope(x.view(2, 5, 3, 4).transpose(1, 2))

    check(heads, [((2, 5, 12), "contiguous", "real")])


# ----------------------------------------------------------------------------- vs torch
def _reference(torch, x, cos, sin):
    """The rotate-half formula with full-width tables, as GPT-NeoX and Llama write it."""
    h = x.shape[-1] // 2
    rotate_half = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return x * torch.cat((cos, cos), -1) + rotate_half * torch.cat((sin, sin), -1)


def _with(cos, sin):
    """fn(lib, x) of a Case: the op (or the torch formula) with constant tables (the
    tables are not inputs of the row: rows give float64 inputs a gradient)."""
    def fn(lib, x):
        c, s = lib.tensor(cos), lib.tensor(sin)
        if lib is ta:
            return ta.functional.apply_rotary_emb(x, c, s)
        return _reference(lib, x, c, s)

    return fn


ROWS = {
    "apply_rotary_emb": [
        Case(_with(*_tables(5, 4)), (randn(2, 3, 5, 8),), layout=layout) for layout in VIEWS
    ] + [
        Case(_with(*_tables(4, 3)), (randn(4, 6),)),
        Case(_with(randn(2, 1, 3, seed=2), randn(4, 3, seed=3)), (randn(2, 4, 6, seed=1),)),
        Case(_with(*_tables(3, 2, np.float32)), (randn(3, 4, dtype=np.float32),), grad=False),
    ],
}
PARAMS, IDS = case_ids(ROWS)


@pytest.mark.parametrize("name,k", PARAMS, ids=IDS)
def test_matches_torch(name, k):
    torch = pytest.importorskip("torch")
    check_case(ROWS[name][k], torch)


# ----------------------------------------------------------------------------- memory, errors
def test_saves_only_the_tables():
    cos, sin = (ta.tensor(a, dtype=ta.float32) for a in _tables(8, 4))
    x = ta.randn(2, 3, 8, 8, requires_grad=True)
    q = x * 1.0  # an intermediate that the rotation must not keep alive
    y = ta.functional.apply_rotary_emb(q, cos, sin)
    saved = y.grad_fn.saved_tensors
    assert len(saved) == 2 and saved[0] is cos and saved[1] is sin
    assert y.shape == (2, 3, 8, 8) and y.is_contiguous()
    # a rotation keeps norms: each (i, i + 4) pair keeps its length
    xs, out = x.detach().numpy(), y.detach().numpy()
    pairs = xs[..., :4] ** 2 + xs[..., 4:] ** 2
    np.testing.assert_allclose(out[..., :4] ** 2 + out[..., 4:] ** 2, pairs, rtol=1e-5)
    # position 0 is the identity rotation
    np.testing.assert_array_equal(out[:, :, 0], xs[:, :, 0])
    y.backward(ta.ones(*y.shape))
    # the gradient is the inverse rotation of ones: [cos + sin, cos - sin] per pair
    c, s = cos.numpy(), sin.numpy()
    want = np.concatenate((c + s, c - s), -1)
    np.testing.assert_allclose(x.grad.numpy()[1, 2], want, rtol=1e-6)
    assert math.isclose(float(x.grad.numpy()[0, 0, 0, 0]), 1.0)


def test_errors_name_the_op_and_shapes():
    cos, sin = (ta.tensor(a, dtype=ta.float32) for a in _tables(5, 2))
    with pytest.raises(ta.ShapeError, match=r"apply_rotary_emb: x of shape \(5, 3\)"):
        ta.functional.apply_rotary_emb(ta.zeros(5, 3), cos, sin)
    with pytest.raises(ta.ShapeError, match=r"apply_rotary_emb: cos of shape \(5, 2\).*"
                                            r"\(6, 2\)"):
        ta.functional.apply_rotary_emb(ta.zeros(6, 4), cos, sin)
    with pytest.raises(TypeError, match="apply_rotary_emb: .*float64, .*float32"):
        ta.functional.apply_rotary_emb(ta.zeros(5, 4), cos.double(), sin)
    with pytest.raises(ValueError, match="apply_rotary_emb: sin requires grad"):
        ta.functional.apply_rotary_emb(ta.zeros(5, 4), cos, sin.requires_grad_())


TESTS_OF = {"apply_rotary_emb": test_rotary_on_head_views}
COVERED = set(GRAD_ROWS) | set(TESTS_OF)
