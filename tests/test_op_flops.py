"""Function.flops of the matmul family (Matmul, Linear, ScaledDotProductAttention,
CausalAttention, Conv, ConvTranspose), as the op observers hear it: each forward call's
summed count against torch's FlopCounterMode for the same call (2 per multiply-add, 0 for
every other op), in float32 and float64.

torch's side runs under no_grad with the math attention kernel: on CPU its fused kernel
(taken for float32 when E == Ev) is one FlopCounterMode does not count. torch counts a
matrix-vector product (aten.mv, aten.dot) as 0; the engine counts its multiply-adds, so
those rows compare with torch's count of the same product written with 2-D operands.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import nn as tnn
import tinygrad_attn as ta
from tinygrad_attn.memory import state as ledger_state

DTYPES = (np.float32, np.float64)


class _Heard:
    """An op observer that keeps every record."""

    def __init__(self):
        self.records = []

    def on_op(self, record):
        self.records.append(record)


def _records(call):
    """The op records heard while call() runs, under no_grad."""
    obs = _Heard()
    ledger_state.op_observers.append(obs)
    try:
        with ta.no_grad():
            call()
    finally:
        ledger_state.op_observers.remove(obs)
    return obs.records


def _ours(fn, arrays) -> int:
    tensors = [ta.tensor(a) for a in arrays]
    return sum(r["flops"] for r in _records(lambda: fn(ta.functional, *tensors)))


def _torch_flops(torch, fn, arrays) -> int:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    tensors = [torch.from_numpy(a) for a in arrays]
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as counter:
            fn(torch.nn.functional, *tensors)
    return counter.get_total_flops()


def _arrays(shapes, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) if isinstance(s, tuple) else s
            for s in shapes]


def _mm(F, a, b):
    return a @ b


def _mm_t(F, a, b):  # non-contiguous operands: transposed views
    return a.mT @ b.mT


def _linear(F, x, w, b=None):
    return F.linear(x, w, b)


def _sdpa(block_size=None, **kw):
    def fn(F, q, k, v, mask=None):
        tile = {"block_size": block_size} if F is ta.functional else {}  # not torch's
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw, **tile)
    return fn


def _conv(name, **kw):
    def fn(F, x, w, b=None):
        return getattr(F, name)(x, w, b, **kw)
    return fn


BOOL_MASK = np.tril(np.ones((5, 7), dtype=bool))

ROWS = {
    "mm": (_mm, [(3, 4), (4, 5)]),
    "3d@2d": (_mm, [(2, 3, 4), (4, 5)]),
    "4d@3d broadcast": (_mm, [(2, 1, 3, 4), (5, 4, 6)]),
    "1d@2d": (_mm, [(4,), (4, 5)]),
    "1d@3d": (_mm, [(4,), (2, 4, 5)]),
    "empty rows": (_mm, [(0, 4), (4, 5)]),
    "empty inner": (_mm, [(3, 0), (0, 5)]),
    "empty batch": (_mm, [(2, 0, 3, 4), (4, 5)]),
    "transposed": (_mm_t, [(4, 3), (5, 4)]),
    "transposed 3d": (_mm_t, [(2, 4, 3), (2, 5, 4)]),
    "linear": (_linear, [(6, 4), (5, 4), (5,)]),
    "linear no bias": (_linear, [(6, 4), (5, 4)]),
    "linear 3d": (_linear, [(2, 3, 4), (5, 4), (5,)]),
    "linear 3d no bias": (_linear, [(2, 3, 4), (5, 4)]),
    "linear 1d": (_linear, [(4,), (5, 4), (5,)]),
    "sdpa 4d": (_sdpa(), [(2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4)]),
    "sdpa causal": (_sdpa(is_causal=True), [(2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4)]),
    "sdpa float mask": (_sdpa(), [(2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4), (5, 7)]),
    "sdpa bool mask": (_sdpa(), [(2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4), BOOL_MASK]),
    "sdpa 3d": (_sdpa(), [(3, 5, 4), (3, 7, 4), (3, 7, 4)]),
    "sdpa 3d causal": (_sdpa(is_causal=True), [(3, 6, 4), (3, 6, 4), (3, 6, 4)]),
    "sdpa Ev != E": (_sdpa(), [(2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6)]),
    "sdpa blocks": (_sdpa(block_size=2, is_causal=True),
                    [(1, 2, 9, 4), (1, 2, 9, 4), (1, 2, 9, 3)]),
    "sdpa gqa": (_sdpa(enable_gqa=True), [(2, 4, 5, 4), (2, 2, 7, 4), (2, 2, 7, 3)]),
    "conv1d": (_conv("conv1d"), [(2, 3, 10), (6, 3, 3), (6,)]),
    "conv1d stride pad": (_conv("conv1d", stride=2, padding=1), [(2, 3, 11), (4, 3, 3)]),
    "conv1d groups": (_conv("conv1d", groups=2), [(1, 4, 10), (6, 2, 3)]),
    "conv1d unbatched": (_conv("conv1d", padding=2), [(3, 10), (6, 3, 3), (6,)]),
    "conv2d": (_conv("conv2d"), [(2, 3, 6, 7), (4, 3, 3, 2), (4,)]),
    "conv2d stride pad dilation": (_conv("conv2d", stride=(2, 1), padding=1, dilation=2),
                                   [(2, 3, 9, 8), (4, 3, 3, 3)]),
    "conv2d groups": (_conv("conv2d", groups=3, padding=1), [(2, 6, 5, 5), (9, 2, 3, 3)]),
    "conv2d unbatched": (_conv("conv2d", stride=2), [(3, 7, 7), (5, 3, 3, 3), (5,)]),
    "conv_transpose1d": (_conv("conv_transpose1d"), [(2, 4, 10), (4, 3, 3), (3,)]),
    "conv_transpose1d stride groups": (
        _conv("conv_transpose1d", stride=2, padding=1, output_padding=1, groups=2),
        [(2, 4, 6), (4, 3, 3)]),
    "conv_transpose1d unbatched": (_conv("conv_transpose1d"), [(4, 5), (4, 2, 3)]),
    "conv_transpose2d": (_conv("conv_transpose2d", stride=2, padding=1),
                         [(2, 3, 4, 5), (3, 4, 3, 3), (4,)]),
    "conv_transpose2d groups": (_conv("conv_transpose2d", groups=2, dilation=2),
                                [(1, 4, 5, 5), (4, 3, 2, 3)]),
    "conv_transpose2d unbatched": (_conv("conv_transpose2d"), [(3, 4, 4), (3, 2, 2, 2)]),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(ROWS))
def test_flops_match_torch(name, dtype):
    torch = pytest.importorskip("torch")
    fn, shapes = ROWS[name]
    arrays = _arrays(shapes, dtype)
    expected = _torch_flops(torch, fn, arrays)
    assert _ours(fn, arrays) == expected
    if "empty" not in name:  # every other row does multiply-adds: a count of 0 is wrong
        assert expected > 0


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("a_shape, b_shape, mk", [
    ((3, 4), (4,), 12),  # torch: aten.mv, counted 0
    ((4,), (4,), 4),  # torch: aten.dot, counted 0
    ((2, 3, 4), (4,), 24),  # torch folds it into one mv
])
def test_matrix_vector_counts_its_multiply_adds(a_shape, b_shape, mk, dtype):
    torch = pytest.importorskip("torch")
    a, b = _arrays([a_shape, b_shape], dtype)
    assert _ours(_mm, [a, b]) == 2 * mk
    # the same product with b as a (K, 1) matrix (and a as a (1, K) one): torch counts mm
    a2 = a.reshape(1, -1) if a.ndim == 1 else a
    assert _torch_flops(torch, _mm, [a2, b.reshape(-1, 1)]) == 2 * mk


def _attention_inputs(dtype, B, H, T, E, Ev, seed=0):
    return _arrays([(B, H, T, E), (B, H, T, E), (B, H, T, Ev)], dtype, seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kw, dims", [
    ({}, (2, 3, 5, 4, 4)),
    ({}, (2, 3, 5, 4, 6)),  # Ev != E
    ({"block_size": 2}, (1, 2, 7, 4, 3)),  # several row blocks: the full product still
    ({"training": True, "dropout_p": 1.0}, (1, 2, 5, 4, 4)),  # every probability dropped
])
def test_causal_attention_matches_torch_causal_sdpa(kw, dims, dtype):
    torch = pytest.importorskip("torch")
    arrays = _attention_inputs(dtype, *dims)

    def ours(F, q, k, v):
        return F.causal_attention(q, k, v, **kw)

    def theirs(F, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    expected = _torch_flops(torch, theirs, arrays)
    assert expected > 0
    assert _ours(ours, arrays) == expected


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_causal_attention_broadcast_group_dim(dtype):
    # k and v with a size-1 group dim (the GPT's grouped path): counted for every query head
    torch = pytest.importorskip("torch")
    q, k, v = _arrays([(2, 2, 3, 5, 4), (2, 2, 1, 5, 4), (2, 2, 1, 5, 6)], dtype)
    records = _records(lambda: ta.functional.causal_attention(
        ta.tensor(q), ta.tensor(k), ta.tensor(v)))
    assert [r["op"] for r in records] == ["CausalAttention"]

    def theirs(F, q, k, v):
        return F.scaled_dot_product_attention(q, k.expand(2, 2, 3, 5, 4),
                                              v.expand(2, 2, 3, 5, 6), is_causal=True)

    assert records[0]["flops"] == _torch_flops(torch, theirs, [q, k, v])
    assert records[0]["flops"] == 2 * 12 * 5 * 5 * (4 + 6)


@pytest.mark.parametrize("n_kv_head", [None, 2], ids=["heads", "grouped"])
def test_gpt_attention_block_matches_torch(n_kv_head):
    """The GPT's "views" attention (c_attn, F.causal_attention, c_proj) against the same
    projections and torch's causal sdpa."""
    torch = pytest.importorskip("torch")
    ta.manual_seed(0)
    cfg = tnn.GPTConfig(block_size=8, n_layer=1, n_head=4, n_embd=16, attn="views",
                        n_kv_head=n_kv_head)
    block = tnn.gpt.CausalSelfAttention(cfg)
    B, T, C = 2, 6, 16
    x = _arrays([(B, T, C)], np.float32)[0]
    records = _records(lambda: block(ta.tensor(x)))
    ops = [r["op"] for r in records]
    assert ops.count("CausalAttention") == 1 and ops.count("Linear") == 2
    params = [p.detach().numpy() for p in (block.c_attn.weight, block.c_attn.bias,
                                           block.c_proj.weight, block.c_proj.bias)]
    kv = block.kv_embd

    def theirs(F, x, wa, ba, wp, bp):
        q, k, v = F.linear(x, wa, ba).split([C, kv, kv], dim=2)
        q, k, v = (t.reshape(B, T, -1, C // 4).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=n_kv_head is not None)
        return F.linear(y.transpose(1, 2).reshape(B, T, C), wp, bp)

    expected = _torch_flops(torch, theirs, [x] + params)
    assert sum(r["flops"] for r in records) == expected
    attn = 2 * B * 4 * T * T * (2 * C // 4)
    assert next(r for r in records if r["op"] == "CausalAttention")["flops"] == attn


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_elementwise_ops_are_heard_with_zero_flops(dtype):
    torch = pytest.importorskip("torch")
    a, b = _arrays([(3, 4), (3, 4)], dtype)

    def fn(F, a, b):
        return F.gelu(a + b)

    records = _records(lambda: fn(ta.functional, ta.tensor(a), ta.tensor(b)))
    assert [r["op"] for r in records] == ["Add", "Gelu"]
    assert [r["flops"] for r in records] == [0, 0]
    assert _torch_flops(torch, fn, [a, b]) == 0


def test_hand_counts_without_torch():
    f32 = np.float32
    a, b = np.ones((3, 4), f32), np.ones((4, 5), f32)
    records = _records(lambda: ta.tensor(a) @ ta.tensor(b))
    assert [(r["op"], r["flops"]) for r in records] == [("Matmul", 120)]
    # linear: 2 * rows 6 * in 4 * out 5, the bias add not counted
    x, w, bias = np.ones((2, 3, 4), f32), np.ones((5, 4), f32), np.ones(5, f32)
    records = _records(lambda: ta.functional.linear(ta.tensor(x), ta.tensor(w), ta.tensor(bias)))
    assert [(r["op"], r["flops"]) for r in records] == [("Linear", 240)]
    # attention: 2 * B*H 6 * Lq 5 * S 7 * (E 4 + Ev 3), the causal mask not subtracted
    q, k, v = np.ones((2, 3, 5, 4), f32), np.ones((2, 3, 7, 4), f32), np.ones((2, 3, 7, 3), f32)
    records = _records(lambda: ta.functional.scaled_dot_product_attention(
        ta.tensor(q), ta.tensor(k), ta.tensor(v), is_causal=True))
    assert [(r["op"], r["flops"]) for r in records] == [
        ("ScaledDotProductAttention", 2 * 6 * 5 * 7 * 7)]
    # conv1d: 2 * batch 2 * output length 8 * kernel 3 * C_out 6 * C_in/groups 2
    x, w = np.ones((2, 4, 10), f32), np.ones((6, 2, 3), f32)
    records = _records(lambda: ta.functional.conv1d(ta.tensor(x), ta.tensor(w), groups=2))
    assert [(r["op"], r["flops"]) for r in records] == [("Conv", 2 * 2 * 8 * 3 * 6 * 2)]
    # conv_transpose1d: the input length (10), not the output's (12)
    x, w = np.ones((1, 4, 10), f32), np.ones((4, 3, 3), f32)
    records = _records(lambda: ta.functional.conv_transpose1d(ta.tensor(x), ta.tensor(w)))
    assert [(r["op"], r["flops"]) for r in records] == [
        ("ConvTranspose", 2 * 10 * math.prod((4, 3, 3)))]
