"""causal_attention (the "views" attention as one node): values, dtypes, shapes and gradients
against torch's scaled_dot_product_attention(is_causal=True) and against the composition it
replaces, on both kernel paths; the bytes it saves; its dropout; its errors. The gradcheck
rows (and their gradgradcheck twins) are in tests/test_gradcheck_attention_views.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rows_vs_torch import Case, case_ids, check_case, randn

import nn as tnn
import tinygrad_attn as ta
from tinygrad_attn.ops.attention import _dropout_keep
from tinygrad_attn.ops.attention_views import CausalAttention, _dropout_seed

F = ta.functional
F32 = np.float32


def _causal(block_size=None, scale=None):
    """fn(lib, q, k, v) of a Case: the op, or torch's math attention with is_causal."""
    def fn(lib, q, k, v):
        if lib is ta:
            return F.causal_attention(q, k, v, scale=scale, block_size=block_size)
        return lib.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                              scale=scale)
    return fn


def _qkv(*shape, dv=None, dtype=np.float64, seed=0):
    vshape = shape if dv is None else shape[:-1] + (dv,)
    return (randn(*shape, seed=seed, dtype=dtype), randn(*shape, seed=seed + 1, dtype=dtype),
            randn(*vshape, seed=seed + 2, dtype=dtype))


ROWS = {
    "causal_attention": [
        Case(_causal(2), _qkv(2, 3, 5, 4)),  # T 5 in blocks of 2: not a multiple
        Case(_causal(), _qkv(2, 3, 5, 4, dv=3)),  # one block, Dv != D
        Case(_causal(3, scale=0.3), _qkv(3, 7, 4), layout="transposed"),
        Case(_causal(4), _qkv(2, 9, 4), layout="sliced"),
        Case(_causal(), _qkv(1, 1, 4)),  # T = 1: the query sees only itself
        Case(_causal(), _qkv(4, 3)),  # 2-D: no batch dim
        Case(_causal(2), _qkv(0, 2, 5, 4)),  # B = 0: empty
        Case(_causal(), _qkv(2, 0, 4)),  # T = 0: empty
        Case(_causal(2), _qkv(2, 3, 6, 4, dtype=F32), all_grads=True),
        Case(_causal(), _qkv(2, 70, 8, dtype=F32)),  # T > 64: the default blocks
    ],
}
PARAMS, IDS = case_ids(ROWS)


@pytest.mark.parametrize("name,k", PARAMS, ids=IDS)
def test_matches_torch(name, k):
    torch = pytest.importorskip("torch")
    check_case(ROWS[name][k], torch)


# ----------------------------------------------------------------------------- the composition
def _heads(x, B, T, nh, hs):
    q, k, v = x.split(nh * hs, dim=2)
    return [t.view(B, T, nh, hs).transpose(1, 2) for t in (q, k, v)]


def _composition(q, k, v, scale):
    T = q.shape[-2]
    future = (ta.ones(T, T).tril() == 0).view(1, 1, T, T)
    return F.masked_softmax(q @ k.mT, future, scale=scale) @ v


def _run(fn, x_np, g_np, dtype):
    x = ta.tensor(x_np, dtype=dtype, requires_grad=True)
    y = fn(x)
    y.backward(ta.tensor(g_np, dtype=dtype))
    return y.detach().numpy(), x.grad.numpy()


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
@pytest.mark.parametrize("dtype", [ta.float32, ta.float64])
@pytest.mark.parametrize("T,bs", [(5, 2), (64, None), (70, None), (33, 16), (9, 100)])
def test_matches_the_composition_on_both_kernel_paths(kernels, dtype, T, bs):
    if kernels == "numba":
        pytest.importorskip("numba")
    B, nh, hs = 2, 3, 4
    rng = np.random.default_rng(T)
    x_np = rng.standard_normal((B, T, 3 * nh * hs))
    g_np = rng.standard_normal((B, nh, T, hs))
    scale = 1 / math.sqrt(hs)
    ta.backend.set_kernels(kernels)
    ta.backend.kernels.calls.clear()
    try:
        ours = _run(lambda x: F.causal_attention(*_heads(x, B, T, nh, hs), block_size=bs),
                    x_np, g_np, dtype)
        calls = dict(ta.backend.kernels.calls)
        theirs = _run(lambda x: _composition(*_heads(x, B, T, nh, hs), scale), x_np, g_np,
                      dtype)
    finally:
        ta.backend.set_kernels("auto")
    assert calls.get(("causal_softmax_block", kernels), 0) >= 1
    assert calls.get(("causal_softmax_block_backward", kernels), 0) >= 1
    tol = 1e-5 if dtype is ta.float32 else 1e-12
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype == dtype.np
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_saved_probabilities_upper_triangle_is_zero_and_blocks_agree():
    q, k, v = (ta.tensor(a) for a in _qkv(2, 3, 11, 4))
    outs = []
    for bs in (1, 3, 4, 11, 64):
        y = F.causal_attention(q.requires_grad_(), k, v, block_size=bs)
        P = y.grad_fn.saved_tensors[3].numpy()
        assert P.shape == (2, 3, 11, 11)
        assert (np.triu(P, 1) == 0).all()
        np.testing.assert_allclose(P.sum(-1), 1.0, rtol=1e-12)
        outs.append(y.detach().numpy())
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=1e-12, atol=1e-14)


# ----------------------------------------------------------------------------- saved bytes
class _Attn(tnn.Module):
    """q, k, v views of one Linear's output and one attention: old (the composition) or
    new (the op), the ledger's scopes as in the GPT."""

    def __init__(self, C, nh, new):
        super().__init__()
        self.c_attn = tnn.Linear(C, 3 * C)
        self.nh, self.new = nh, new

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = _heads(self.c_attn(x), B, T, self.nh, C // self.nh)
        scale = 1 / math.sqrt(C // self.nh)
        if self.new:
            return F.causal_attention(q, k, v, scale=scale)
        return _composition(q, k, v, scale)


def _saved(new, B=2, T=96, C=16, nh=2):
    ta.manual_seed(0)
    model = _Attn(C, nh, new)
    x = ta.randn(B, T, C)
    with ta.memory.profile() as prof:
        y = model(x)
    saved = prof.summary()["saved_peak"]
    del y
    return saved


def test_saves_the_bytes_the_composition_saved():
    old, new = _saved(False), _saved(True)
    B, T, C, nh = 2, 96, 16, 2
    assert new["unique_bytes"] == old["unique_bytes"]
    # the Linear's input and its (B, T, 3C) output that q, k, v view, the (B, nh, T, T)
    # probabilities
    assert new["unique_bytes"] == (B * T * C + B * T * 3 * C + B * nh * T * T) * 4
    per_module = {key: row["unique_bytes"] for key, row in new["by_module"].items()}
    assert per_module == {key: row["unique_bytes"] for key, row in old["by_module"].items()}


def test_saves_q_k_v_and_the_probabilities_only():
    q, k, v = (ta.tensor(a, requires_grad=True) for a in _qkv(2, 3, 70, 4, dtype=F32))
    y = F.causal_attention(q, k, v)
    saved = y.grad_fn.saved_tensors
    assert len(saved) == 4 and saved[0] is q and saved[1] is k and saved[2] is v
    assert saved[3].shape == (2, 3, 70, 70) and saved[3].dtype is ta.float32
    with ta.no_grad():  # nothing saved without a graph
        assert F.causal_attention(q, k, v).grad_fn is None


def test_dropout_saves_no_mask():
    q, k, v = (ta.tensor(a, requires_grad=True) for a in _qkv(2, 3, 70, 4, dtype=F32))
    y = F.causal_attention(q, k, v, dropout_p=0.2)
    assert [t.shape for t in y.grad_fn.saved_tensors[3:]] == [(2, 3, 70, 70)]


# ----------------------------------------------------------------------------- dropout
def test_dropout_equals_the_composition_with_the_same_mask():
    B, nh, T, hs, p = 2, 3, 9, 4, 0.3
    rng = np.random.default_rng(3)
    x_np, g_np = rng.standard_normal((B, T, 3 * nh * hs)), rng.standard_normal((B, nh, T, hs))
    scale = 1 / math.sqrt(hs)
    ta.manual_seed(11)
    plan = _dropout_seed(p, None, "cpu")  # the draw the op makes after the same seed
    keep = _dropout_keep(np, plan, (B, nh), T, T, 0, T, 0, T)
    z = ta.tensor(keep / (1 - p))

    def composed(x):
        q, k, v = _heads(x, B, T, nh, hs)
        future = (ta.ones(T, T).tril() == 0).view(1, 1, T, T)
        return (F.masked_softmax(q @ k.mT, future, scale=scale) * z) @ v

    def op(x):
        ta.manual_seed(11)
        return F.causal_attention(*_heads(x, B, T, nh, hs), dropout_p=p, block_size=4)

    for a, b in zip(_run(op, x_np, g_np, ta.float64), _run(composed, x_np, g_np, ta.float64)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


def test_dropout_statistics():
    """With v the identity, y = P * keep / (1 - p) itself: about p of the kept triangle is
    dropped, the rest scaled by 1 / (1 - p); in eval mode (training=False) y = P."""
    T, p = 200, 0.25
    q, k = (ta.tensor(a) for a in _qkv(4, T, 8, dtype=F32)[:2])
    eye = ta.tensor(np.broadcast_to(np.eye(T, dtype=F32), (4, T, T)).copy())
    ta.manual_seed(5)
    y = F.causal_attention(q, k, eye, dropout_p=p).numpy()
    P = F.causal_attention(q, k, eye, dropout_p=p, training=False).numpy()
    lower = np.tril(np.ones((T, T), bool))
    dropped = (y == 0) & lower
    n = 4 * lower.sum()
    assert abs(dropped.sum() / n - p) < 4 * math.sqrt(p * (1 - p) / n)
    np.testing.assert_allclose(y[~dropped & lower], (P / (1 - p))[~dropped & lower],
                               rtol=1e-6)
    assert (y[:, ~lower] == 0).all()
    ta.manual_seed(5)  # the same seed, the same mask; another seed, another one
    assert (F.causal_attention(q, k, eye, dropout_p=p).numpy() == y).all()
    assert (F.causal_attention(q, k, eye, dropout_p=p).numpy() != y).any()
    gen = ta.Generator().manual_seed(1)
    assert (F.causal_attention(q, k, eye, dropout_p=1.0, generator=gen).numpy() == 0).all()
    assert (F.causal_attention(q, k, eye, dropout_p=0.0).numpy() == P).all()


# ----------------------------------------------------------------------------- errors
def test_errors_name_the_op_and_shapes():
    q = ta.zeros(2, 5, 4)
    with pytest.raises(ta.ShapeError, match=r"causal_attention: shapes q \(2, 5, 4\), "
                                            r"k \(2, 6, 4\)"):
        F.causal_attention(q, ta.zeros(2, 6, 4), ta.zeros(2, 6, 4))
    with pytest.raises(ta.ShapeError, match="causal_attention: .*k \\(2, 5, 3\\)"):
        F.causal_attention(q, ta.zeros(2, 5, 3), ta.zeros(2, 5, 4))
    with pytest.raises(ta.ShapeError, match="causal_attention: the leading dims"):
        F.causal_attention(q, ta.zeros(3, 5, 4), ta.zeros(3, 5, 4))
    with pytest.raises(ta.ShapeError, match="causal_attention: q, k, v need"):
        F.causal_attention(ta.zeros(4), ta.zeros(4), ta.zeros(4))
    with pytest.raises(RuntimeError, match="causal_attention: .*float32, float64"):
        F.causal_attention(q, q.double(), q)
    with pytest.raises(RuntimeError, match="causal_attention: .*int64"):
        F.causal_attention(*(ta.zeros(2, 5, 4, dtype=ta.int64),) * 3)
    with pytest.raises(ValueError, match="causal_attention: dropout probability"):
        F.causal_attention(q, q, q, dropout_p=1.5)
    with pytest.raises(ValueError, match="causal_attention: block_size"):
        F.causal_attention(q, q, q, block_size=0)
    with pytest.raises(TypeError, match="causal_attention: k must be a Tensor"):
        F.causal_attention(q, np.zeros((2, 5, 4)), q)
    assert CausalAttention.__doc__.count("Saves") == 1
