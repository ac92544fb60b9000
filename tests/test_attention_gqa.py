"""scaled_dot_product_attention(enable_gqa=True): grouped-query attention with torch's
semantics (k and v heads repeated to q's), as expand views where k and v share a head
count; values and gradients against torch, what it saves, and its errors."""

import numpy as np
import pytest

import tinygrad_attn as ta
import tinygrad_attn.functional as F


def _arrays(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


def _both(torch, arrays, **kw):
    """Run ours and torch's on the same float64 arrays: (outputs, grads) of each."""
    w = np.random.default_rng(9)
    results = []
    for lib in ("ta", "torch"):
        if lib == "ta":
            ts = [ta.tensor(a, requires_grad=True) for a in arrays]
            mask = kw.get("attn_mask")
            kws = dict(kw, attn_mask=None if mask is None else ta.tensor(mask))
            out = F.scaled_dot_product_attention(*ts, enable_gqa=True, block_size=3, **kws)
            cot = ta.tensor(w.standard_normal(tuple(out.shape)))
        else:
            ts = [torch.tensor(a, requires_grad=True) for a in arrays]
            mask = kw.get("attn_mask")
            kws = dict(kw, attn_mask=None if mask is None else torch.tensor(mask))
            out = torch.nn.functional.scaled_dot_product_attention(*ts, enable_gqa=True,
                                                                   **kws)
            cot = torch.tensor(cot.numpy())
        (out * cot).sum().backward()
        results.append((out.detach().numpy(), [t.grad.numpy() for t in ts]))
    return results


@pytest.mark.parametrize("case", ["causal", "bool_mask", "float_mask", "unequal_kv",
                                  "equal_heads", "three_dims"])
def test_matches_torch_in_value_and_gradient(case):
    torch = pytest.importorskip("torch")
    shapes = [(2, 6, 7, 4), (2, 2, 7, 4), (2, 2, 7, 5)]
    kw = {}
    if case == "causal":
        kw["is_causal"] = True
    elif case == "bool_mask":
        kw["attn_mask"] = np.tril(np.ones((7, 7), bool)) | np.eye(7, k=2, dtype=bool)
    elif case == "float_mask":  # one additive mask per query head
        kw["attn_mask"] = np.random.default_rng(3).standard_normal((2, 6, 7, 7))
    elif case == "unequal_kv":
        shapes = [(2, 6, 7, 4), (2, 2, 7, 4), (2, 3, 7, 5)]
    elif case == "equal_heads":
        shapes = [(2, 3, 7, 4), (2, 3, 7, 4), (2, 3, 7, 5)]
    elif case == "three_dims":
        shapes = [(4, 7, 4), (2, 7, 4), (2, 7, 5)]
    (ours, our_grads), (theirs, their_grads) = _both(torch, _arrays(shapes), **kw)
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)
    for name, a, b in zip("qkv", our_grads, their_grads):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11, err_msg=name)


def test_grouped_kv_heads_are_expand_views_and_the_merge_is_free():
    """k and v are expanded over the group without a copy; the output is laid out heads
    innermost, so a GPT's merge of heads is a no-op; saved: q, k, v, out, logsumexp."""
    B, H, Hk, T, D = 2, 8, 2, 16, 4
    q = ta.randn(B, H, T, D, requires_grad=True)
    k, v = (ta.randn(B, Hk, T, D, requires_grad=True) for _ in range(2))
    with ta.memory.profile() as prof:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        merged = out.transpose(1, 2).contiguous()
        assert merged.shares_storage(out)  # contiguous() had nothing to do
        out.sum().backward()
    saved = prof.summary()["saved_peak"]["unique_bytes"]
    assert out.shape == (B, H, T, D)
    assert prof.summary()["copies"] == []
    # q, k and v themselves (not H-head copies of k, v), out, and the logsumexp
    assert saved == (B * H * T * D * 2 + 2 * B * Hk * T * D) * 4 + B * H * T * 4
    assert k.grad.shape == (B, Hk, T, D) and v.grad.shape == (B, Hk, T, D)


def test_errors_name_the_op_and_the_shapes():
    q = ta.randn(2, 6, 5, 4)
    with pytest.raises(ta.ShapeError, match=r"scaled_dot_product_attention: enable_gqa .*"
                                            r"\(2, 6, 5, 4\), k \(2, 4, 5, 4\)"):
        F.scaled_dot_product_attention(q, ta.randn(2, 4, 5, 4), ta.randn(2, 4, 5, 4),
                                       enable_gqa=True)
    with pytest.raises(ta.ShapeError, match="scaled_dot_product_attention: shapes"):
        F.scaled_dot_product_attention(q, ta.randn(2, 3, 5, 4), ta.randn(2, 3, 5, 4))
    with pytest.raises(IndexError, match="scaled_dot_product_attention: enable_gqa needs a "
                                         "head dim"):
        F.scaled_dot_product_attention(ta.randn(5, 4), ta.randn(5, 4), ta.randn(5, 4),
                                       enable_gqa=True)
    with pytest.raises(ta.ShapeError, match=r"attn_mask of shape \(3, 5\)"):
        F.scaled_dot_product_attention(q, ta.randn(2, 3, 5, 4), ta.randn(2, 3, 5, 4),
                                       attn_mask=ta.ones(3, 5, dtype=ta.bool),
                                       enable_gqa=True)
