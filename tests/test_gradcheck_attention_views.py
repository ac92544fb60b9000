"""causal_attention: gradcheck rows (float64, finite differences) on contiguous, transposed
and sliced q, k, v, on the GPT's head views of one fused projection, on a grouped
(broadcast) k and v, with dropout, with T not a multiple of the block and on the GPU (or
the fake CuPy). conftest.py runs each row also as gradgradcheck ([d2]). Conformance with
torch, saved bytes and the kernel paths: tests/test_attention_views.py."""

from __future__ import annotations

import pytest
from test_gradcheck_ops import DEVICE, check

import tinygrad_attn as ta

F = ta.functional
VIEWS = ["contiguous", "transposed", "sliced"]


def _attn(block_size=2, **kw):
    return lambda q, k, v: F.causal_attention(q, k, v, block_size=block_size, **kw)


def _dropped(q, k, v):
    """p = 0.3 with a generator seeded in the call: every evaluation sees one mask."""
    gen = ta.Generator(device=DEVICE["name"]).manual_seed(7)
    return F.causal_attention(q, k, v, dropout_p=0.3, generator=gen, block_size=2)


GRAD_ROWS = {
    "causal_attention": _attn(),  # T 5, blocks of 2: three blocks, the last one row
    "causal_attention_one_block": _attn(block_size=8),  # the whole product
    "causal_attention_scale": _attn(block_size=3, scale=0.7),
    "causal_attention_dropout": _dropped,
}


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("op", list(GRAD_ROWS))
def test_gradcheck(op, view):
    # (3, 5, 4): dim 0 the batch, then T 5 and D 4; the views transpose or slice dims 0, 1
    check(GRAD_ROWS[op], [((3, 5, 4), view, "real"), ((3, 5, 4), view, "real"),
                          ((3, 5, 2), view, "real")])


@pytest.mark.parametrize("op", list(GRAD_ROWS))
def test_gradcheck_on_device(gpu_device, op, monkeypatch):
    monkeypatch.setitem(DEVICE, "name", gpu_device)
    check(GRAD_ROWS[op], [((2, 3, 4), "transposed", "real")] * 2
          + [((2, 3, 2), "transposed", "real")])


def test_causal_attention_on_head_views():
    """(B, nh, T, hs) strided views of one (B, T, 3C) leaf, as the GPT splits its qkv."""
    B, T, nh, hs = 2, 5, 2, 3

    def heads(x):
        q, k, v = x.split(nh * hs, dim=2)
        q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in (q, k, v))
        return F.causal_attention(q, k, v, block_size=2)

    check(heads, [((B, T, 3 * nh * hs), "contiguous", "real")])


def test_causal_attention_grouped():
    """Grouped-query heads: q (B, nkv, g, T, hs), k and v (B, nkv, 1, T, hs) broadcast over
    the group; their gradients are summed back over it."""
    check(lambda q, k, v: F.causal_attention(q.view(2, 1, 2, 4, 3), k, v, block_size=3),
          [((2, 2, 4, 3), "contiguous", "real"), ((2, 1, 1, 4, 3), "contiguous", "real"),
           ((2, 1, 1, 4, 3), "transposed", "real")])


TESTS_OF = {"causal_attention_head_views": test_causal_attention_on_head_views,
            "causal_attention_grouped": test_causal_attention_grouped}
COVERED = set(GRAD_ROWS) | set(TESTS_OF)
