"""Attention dropout in F.scaled_dot_product_attention (dropout_p > 0).

torch drops attention weights after the softmax and scales the rest by 1 / (1 - p), always
(the functional has no training flag). The engine's mask comes from its own generator, so
only p = 0 and p = 1 can be compared with torch value for value (ROWS); elsewhere the tests
check the mask's statistics, that it is a pure function of the seed (forward, backward,
block size, checkpoint replay), and the gradients against the composed attention under the
same mask.
"""

from __future__ import annotations

import numpy as np
import pytest
from rows_vs_torch import Case, case_ids, check_case, randn

import tinygrad_attn as ta
import tinygrad_attn.functional as F


def _sdpa(lib, q, k, v, mask=None, **kw):
    fn = lib.functional if lib is ta else lib.nn.functional
    return fn.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


ROWS = {
    "scaled_dot_product_attention": [
        Case(lambda lib, q, k, v: _sdpa(lib, q, k, v, dropout_p=0.0),
             (randn(2, 3, 4), randn(2, 5, 4, seed=1), randn(2, 5, 3, seed=2)), "transposed"),
        # every weight dropped: zeros, and zero gradients, as torch's
        Case(lambda lib, q, k, v: _sdpa(lib, q, k, v, dropout_p=1.0),
             (randn(2, 3, 4), randn(2, 5, 4, seed=1), randn(2, 5, 3, seed=2))),
        Case(lambda lib, q, k, v: _sdpa(lib, q, k, v, dropout_p=1.0, is_causal=True),
             (randn(1, 4, 4), randn(1, 4, 4, seed=1), randn(1, 4, 4, seed=2)), "sliced"),
        Case(lambda lib, q, k, v: _sdpa(lib, q, k, v, dropout_p=1.5),
             (randn(1, 3, 4), randn(1, 3, 4, seed=1), randn(1, 3, 4, seed=2)),
             raises=RuntimeError),
        # (torch refuses a negative p for 4-D inputs; on 3-D ones its math path runs it)
        Case(lambda lib, q, k, v: _sdpa(lib, q, k, v, dropout_p=-0.1),
             (randn(1, 2, 3, 4), randn(1, 2, 3, 4, seed=1), randn(1, 2, 3, 4, seed=2)),
             raises=RuntimeError),
    ],
}
PARAMS, IDS = case_ids(ROWS)


@pytest.mark.parametrize("name,k", PARAMS, ids=IDS)
def test_matches_torch(name, k):
    torch = pytest.importorskip("torch")
    check_case(ROWS[name][k], torch)


def _qkv(B=2, H=3, T=40, Tk=None, D=8, dtype=ta.float64, requires_grad=True):
    Tk = T if Tk is None else Tk
    return (ta.randn(B, H, T, D, dtype=dtype, requires_grad=requires_grad),
            ta.randn(B, H, Tk, D, dtype=dtype, requires_grad=requires_grad),
            ta.randn(B, H, Tk, D + 1, dtype=dtype, requires_grad=requires_grad))


def _seeded(seed, q, k, v, **kw):
    ta.manual_seed(seed)
    return F.scaled_dot_product_attention(q, k, v, **kw)


def _dropped_weights(seed, q, k, p, **kw):
    """The attention weights after dropout, read through v = I: out = W @ I = W."""
    Tk = k.shape[-2]
    eye = ta.eye(Tk, dtype=q.dtype).reshape(1, 1, Tk, Tk) + ta.zeros(
        *q.shape[:-2], Tk, Tk, dtype=q.dtype)
    return _seeded(seed, q.detach(), k.detach(), eye, dropout_p=p, **kw).numpy()


def _probs(q, k, causal=False):
    s = (q @ k.mT) * q.shape[-1] ** -0.5
    if causal:
        keep = ta.ones(q.shape[-2], k.shape[-2], dtype=ta.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s.softmax(-1)


def test_p0_is_the_plain_kernel_and_draws_nothing():
    q, k, v = _qkv()
    ta.manual_seed(3)
    plain = F.scaled_dot_product_attention(q, k, v, is_causal=True).detach().numpy()
    after_plain = ta.rand(4).numpy()
    ta.manual_seed(3)
    zero = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)
    np.testing.assert_array_equal(zero.detach().numpy(), plain)
    np.testing.assert_array_equal(ta.rand(4).numpy(), after_plain)  # no seed was drawn


@pytest.mark.parametrize("causal", [False, True])
def test_kept_weights_are_scaled_probabilities_and_about_p_are_dropped(causal):
    p = 0.3
    q, k, _ = _qkv(B=2, H=4, T=64)
    w = _dropped_weights(1, q, k, p, is_causal=causal)
    probs = _probs(q, k, causal).detach().numpy()
    kept = w != 0
    np.testing.assert_allclose(w[kept], probs[kept] / (1 - p), rtol=1e-12)
    visible = probs > 0  # (the causal mask's zeros are not dropout's)
    frac = 1 - kept[visible].mean()
    n = visible.sum()  # 32768 or about half: the binomial sd is under 0.004
    assert abs(frac - p) < 5 * np.sqrt(p * (1 - p) / n), frac
    # the expectation is kept: each row of weights still sums to 1 on average (a row's
    # sum has variance sum_j P_j^2 p / (1 - p); five standard deviations of the mean)
    row_var = (probs ** 2).sum(-1) * p / (1 - p)
    assert abs(w.sum(-1).mean() - 1) < 5 * np.sqrt(row_var.sum()) / row_var.size


def test_the_mask_is_a_function_of_the_seed_not_of_the_tiling():
    q, k, v = _qkv(T=37, Tk=29)
    outs = [_seeded(5, q, k, v, dropout_p=0.4, block_size=bs).detach().numpy()
            for bs in (3, 16, 128)]
    np.testing.assert_allclose(outs[0], outs[2], atol=1e-14)
    np.testing.assert_allclose(outs[1], outs[2], atol=1e-14)
    again = _seeded(5, q, k, v, dropout_p=0.4).detach().numpy()
    np.testing.assert_array_equal(again, outs[2])
    other = _seeded(6, q, k, v, dropout_p=0.4).detach().numpy()
    assert np.abs(other - again).max() > 0.1
    # two calls in a row draw two masks
    ta.manual_seed(5)
    first = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4).detach().numpy()
    second = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4).detach().numpy()
    assert np.abs(first - second).max() > 0.1


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_equal_the_composed_attention_under_the_same_mask(causal):
    p = 0.25
    q, k, v = _qkv(T=21, Tk=21)
    g = ta.randn(2, 3, 21, 9, dtype=ta.float64)
    out = _seeded(9, q, k, v, dropout_p=p, is_causal=causal, block_size=8)
    grads = ta.autograd.grad(out, [q, k, v], g)
    keep = ta.tensor(_dropped_weights(9, q, k, p, is_causal=causal, block_size=8) != 0)
    ref = (_probs(q, k, causal) * keep.double() / (1 - p)) @ v
    ref_grads = ta.autograd.grad(ref, [q, k, v], g)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), atol=1e-12)
    for a, b in zip(grads, ref_grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-10)


def test_gradcheck_with_a_fixed_seed_masks_and_noncontiguous_inputs():
    q, k, v = _qkv(B=1, H=2, T=5, D=3)
    keep = (ta.rand(5, 5) > 0.4) | ta.eye(5, dtype=ta.bool)
    bias = ta.randn(1, 2, 5, 5, dtype=ta.float64, requires_grad=True)

    def run(q, k, v, mask=None, causal=False):
        return _seeded(11, q, k, v, attn_mask=mask, dropout_p=0.3, is_causal=causal,
                       block_size=2)

    assert ta.gradcheck(lambda q, k, v: run(q, k, v, causal=True), [q, k, v])
    assert ta.gradcheck(lambda q, k, v: run(q, k, v, keep), [q, k, v])
    assert ta.gradcheck(run, [q, k, v, bias])  # the float mask's gradient too
    qt = ta.randn(1, 5, 2, 3, dtype=ta.float64, requires_grad=True)  # heads via transpose
    vs = ta.randn(1, 2, 5, 8, dtype=ta.float64, requires_grad=True)  # every other column
    assert ta.gradcheck(lambda qt, k, vs: run(qt.transpose(1, 2), k, vs[..., ::2]),
                        [qt, k, vs])


def test_grouped_query_heads_see_the_mask_of_their_query_head():
    q = ta.randn(1, 4, 6, 3, dtype=ta.float64)
    k, v = (ta.randn(1, 2, 6, 3, dtype=ta.float64) for _ in range(2))
    grouped = _seeded(2, q, k, v, dropout_p=0.5, enable_gqa=True).numpy()
    repeated = _seeded(2, q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1),
                       dropout_p=0.5).numpy()
    np.testing.assert_allclose(grouped, repeated, atol=1e-14)


def test_dropout_saves_no_more_than_the_plain_kernel():
    def saved(p):
        q, k, v = _qkv(T=48, dtype=ta.float32)
        with ta.memory.profile() as prof:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, block_size=16)
            out.sum().backward()
        return prof.summary()["saved_peak"]["unique_bytes"]

    B, H, T, D = 2, 3, 48, 8
    # q and k (D wide), v and out (D + 1 wide), one logsumexp per row: float32 each
    want = (2 * B * H * T * D + 2 * B * H * T * (D + 1) + B * H * T) * 4
    assert saved(0.5) == saved(0.0) == want


def test_checkpoint_replays_the_same_mask():
    q, k, v = _qkv(T=12)

    def block(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, block_size=4)

    def grads(ck):
        ta.manual_seed(4)
        out = ta.checkpoint(block, q, k, v) if ck else block(q, k, v)
        return [g.numpy() for g in ta.autograd.grad((out * out).sum(), [q, k, v])]

    for plain, ck in zip(grads(False), grads(True)):
        np.testing.assert_array_equal(plain, ck)


def test_float16_and_float32_run_in_float32_with_the_same_mask():
    q, k, v = _qkv(T=10, dtype=ta.float32, requires_grad=False)
    full = _seeded(8, q, k, v, dropout_p=0.2).numpy()
    half = _seeded(8, q.half(), k.half(), v.half(), dropout_p=0.2)
    assert half.dtype == ta.float16
    np.testing.assert_allclose(half.float().numpy(), full, atol=1e-2)


def test_statistics_agree_with_torchs_dropout_rate():
    torch = pytest.importorskip("torch")
    q = randn(4, 4, 32, 8)
    tq = torch.tensor(q)
    tw = torch.nn.functional.scaled_dot_product_attention(
        tq, tq, torch.eye(32, dtype=torch.float64).expand(4, 4, 32, 32), dropout_p=0.6)
    ours = _dropped_weights(0, ta.tensor(q), ta.tensor(q), 0.6)
    theirs = tw.numpy()
    assert abs((ours == 0).mean() - (theirs == 0).mean()) < 0.03
    assert abs(ours.sum(-1).mean() - theirs.sum(-1).mean()) < 0.05


def test_dropout_runs_on_every_device(device):
    q, k, v = (t.to(device).detach().requires_grad_() for t in _qkv(B=1, H=2, T=24))
    out = _seeded(3, q, k, v, dropout_p=0.5, block_size=8)
    out.sum().backward()
    assert out.device.startswith(device) and q.grad.device.startswith(device)
    # the same seed on the same device gives the same mask: the rebuilt output agrees
    again = _seeded(3, q.detach(), k.detach(), v.detach(), dropout_p=0.5, block_size=24)
    np.testing.assert_allclose(again.cpu().numpy(), out.detach().cpu().numpy(), atol=1e-12)
    eye = ta.eye(24, dtype=q.dtype, device=device).reshape(1, 1, 24, 24) + ta.zeros(
        1, 2, 24, 24, dtype=q.dtype, device=device)
    w = _seeded(4, q.detach(), k.detach(), eye, dropout_p=0.5).cpu().numpy()
    assert 0.4 < (w == 0).mean() < 0.6  # 1152 weights
