"""The blocked attention op and activation checkpointing."""

import numpy as np
import pytest

import tinygrad_attn as ta
import tinygrad_attn.functional as F


def _qkv(B=2, H=2, T=9, D=4, Tk=None, dtype=ta.float64):
    Tk = T if Tk is None else Tk
    q = ta.randn(B, H, T, D, dtype=dtype, requires_grad=True)
    k = ta.randn(B, H, Tk, D, dtype=dtype, requires_grad=True)
    v = ta.randn(B, H, Tk, D + 1, dtype=dtype, requires_grad=True)
    return q, k, v


def _reference(q, k, v, mask=None, causal=False):
    """softmax(q k^T / sqrt(d) + mask) v, composed from the engine's own primitives."""
    s = (q @ k.mT) * q.shape[-1] ** -0.5
    if causal:
        keep = ta.ones(q.shape[-2], k.shape[-2], dtype=ta.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == ta.bool else s + mask
    return s.softmax(-1) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [1, 3, 4, 128])
def test_matches_the_composed_attention_in_value_and_gradient(causal, block):
    q, k, v = _qkv()
    g = ta.randn(2, 2, 9, 5, dtype=ta.float64)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, block_size=block)
    grads = ta.autograd.grad(out, [q, k, v], g)
    ref = _reference(q, k, v, causal=causal)
    ref_grads = ta.autograd.grad(ref, [q, k, v], g)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), atol=1e-12)
    for a, b in zip(grads, ref_grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(causal):
    q, k, v = _qkv(B=1, H=2, T=5, D=3)
    assert ta.gradcheck(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, block_size=2),
        [q, k, v])


def test_gradcheck_with_bool_and_additive_masks_and_noncontiguous_inputs():
    q, k, v = _qkv(B=1, H=2, T=5, D=3)
    keep = (ta.rand(5, 5) > 0.4) | ta.eye(5, dtype=ta.bool)
    bias = ta.randn(1, 2, 5, 5, dtype=ta.float64)
    for mask in (keep, bias):
        assert ta.gradcheck(
            lambda q, k, v, mask=mask: F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, block_size=2), [q, k, v])
    qt = ta.randn(1, 5, 2, 3, dtype=ta.float64, requires_grad=True)  # heads via transpose
    assert ta.gradcheck(
        lambda qt, k, v: F.scaled_dot_product_attention(qt.transpose(1, 2), k, v,
                                                        is_causal=True, block_size=2),
        [qt, k, v])


def test_cross_attention_lengths_and_torch_agreement():
    torch = pytest.importorskip("torch")
    q, k, v = _qkv(T=6, Tk=11)
    for causal in (False, True):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, block_size=4)
        tq, tk, tv = (torch.tensor(t.detach().numpy()) for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
        np.testing.assert_allclose(out.detach().numpy(), ref.numpy(), atol=1e-12)


@pytest.mark.parametrize("block", [16, 32, 64, 100, 256])
@pytest.mark.parametrize("T, Tk", [(150, 150), (70, 130), (130, 70)])
def test_causal_strips_match_the_composed_attention(block, T, Tk):
    """T not a multiple of the inner tile (64) nor of the block, and Tq != Tk: strips of
    min(block, 64) rows, a partial last strip, several key blocks per strip, float64."""
    q, k, v = _qkv(B=1, H=2, T=T, D=3, Tk=Tk)
    g = ta.randn(1, 2, T, 4, dtype=ta.float64)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, block_size=block)
    grads = ta.autograd.grad(out, [q, k, v], g)
    ref = _reference(q, k, v, causal=True)
    ref_grads = ta.autograd.grad(ref, [q, k, v], g)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), atol=1e-12)
    for a, b in zip(grads, ref_grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-10)


@pytest.mark.parametrize("block", [1, 7, 16, 64, 128, 300])
@pytest.mark.parametrize("T, Tk", [(200, 200), (64, 64), (50, 90), (90, 50)])
def test_the_causal_tiling_covers_the_visible_scores_once_and_skips_the_future(block, T, Tk):
    """Every visible score (key <= query) lies in exactly one tile; a tile's hidden scores
    lie only in its last strip-wide corner of keys (at most rows * (rows - 1) / 2 of them),
    whatever the block size, and no tile is all hidden."""
    from tinygrad_attn.ops.attention import INNER_TILE, _strips
    rows = min(block, INNER_TILE)
    seen = np.zeros((T, Tk), int)
    for a, b, chunks in _strips(True, block, T, Tk):
        assert b - a <= rows
        for c0, c1 in chunks:
            assert c1 - c0 <= block
            tile = np.arange(c0, c1)[None, :] <= np.arange(a, b)[:, None]
            assert tile.any()
            assert (~tile).sum() <= (b - a) * (b - a - 1) // 2
            seen[a:b, c0:c1] += tile
    assert (seen == np.tril(np.ones((T, Tk), int))).all()


def test_float32_strided_heads_agree_with_float64():
    """q, k, v as the GPT hands them (views of one (B, T, 3C) projection), float32, against
    the same op in float64: rounding only."""
    B, T, H, D = 3, 150, 2, 8
    x = ta.randn(B, T, 3 * H * D, dtype=ta.float64)
    g = ta.randn(B, H, T, D, dtype=ta.float64)
    got = {}
    for dtype in (ta.float32, ta.float64):
        xx = x.to(dtype).requires_grad_()
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in xx.split(H * D, dim=2))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, block_size=32)
        out.backward(g.to(dtype))
        got[dtype] = out.detach().numpy(), xx.grad.numpy()
    for a, b in zip(got[ta.float32], got[ta.float64]):
        assert np.abs(a - b).max() <= 2e-6 * np.abs(b).max()


def test_never_materializes_the_full_score_matrix():
    B, H, T, D = 2, 2, 64, 8
    q, k, v = (ta.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    full = B * H * T * T * 4
    with ta.memory.profile() as prof:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, block_size=16)
        out.sum().backward()
    sizes = [e["bytes"] for e in prof.events if e["kind"] == "alloc"]
    assert max(sizes) < full
    saved = prof.summary()["saved_peak"]
    # q, k, v, out (B*H*T*D floats each) and the logsumexp (B*H*T floats)
    assert saved["unique_bytes"] == 4 * B * H * T * D * 4 + B * H * T * 4


def test_bad_inputs_are_clear_errors():
    q, k, v = _qkv()
    with pytest.raises(ta.ShapeError, match="scaled_dot_product_attention: shapes"):
        F.scaled_dot_product_attention(q, k[..., :3], v)
    with pytest.raises(ta.ShapeError, match="attn_mask of shape"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=ta.ones(3, 4, dtype=ta.bool))
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        F.scaled_dot_product_attention(q, k, v, block_size=0)
    with pytest.raises(RuntimeError, match="dropout probability has to be between 0 and 1"):
        F.scaled_dot_product_attention(q, k, v, dropout_p=1.5)


def _block(w1, w2):
    def block(h):
        return F.dropout((h @ w1).tanh(), 0.3) @ w2 + h
    return block


def test_checkpoint_gradients_equal_plain_ones_exactly_with_dropout():
    w1 = ta.randn(8, 16, dtype=ta.float64, requires_grad=True)
    w2 = ta.randn(16, 8, dtype=ta.float64, requires_grad=True)
    x = ta.randn(4, 8, dtype=ta.float64, requires_grad=True)
    block = _block(w1, w2)

    def run(ck):
        ta.manual_seed(5)
        for t in (w1, w2, x):
            t.grad = None
        y = x
        for _ in range(2):
            y = ta.checkpoint(block, y) if ck else block(y)
        (y * y).sum().backward()
        return [t.grad.numpy().copy() for t in (w1, w2, x)]

    for plain, ck in zip(run(False), run(True)):
        np.testing.assert_array_equal(plain, ck)


def test_checkpoint_saves_only_the_block_inputs():
    w1 = ta.randn(8, 64, requires_grad=True)
    w2 = ta.randn(64, 8, requires_grad=True)
    x = ta.randn(32, 8, requires_grad=True)
    block = _block(w1, w2)
    with ta.memory.profile() as prof:
        y = ta.checkpoint(block, ta.checkpoint(block, x))
        del y
    by_op = prof.summary()["saved_peak"]["by_op"]
    assert set(by_op) == {"Checkpoint"}
    assert by_op["Checkpoint"]["unique_bytes"] == 2 * x.nbytes


def test_checkpoint_bad_input():
    with pytest.raises(TypeError, match="checkpoint: first argument must be callable"):
        ta.checkpoint(3, ta.ones(2))
