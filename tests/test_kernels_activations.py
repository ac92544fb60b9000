"""The activation kernels: gelu (exact and tanh), bias_gelu and dropout, compiled (numba)
against the NumPy reference, and the ops that call them on both paths.

Agreement is checked kernel by kernel on edge values (0, -0, +-large, +-inf, nan) and on
sizes that are not a multiple of the compiled kernels' block; dropout bit for bit. The ops
are gradchecked on the numba path and must allocate the same Storages on both paths.
Everything here that needs numba skips without it (numba is never imported at module level).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import nn
import tinygrad_attn as ta
import tinygrad_attn.functional as F
from tinygrad_attn.backend import kernels
from tinygrad_attn.backend.kernels import reference

EDGE = [0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 3.0, -3.0, 9.0, -9.0, 20.0, -20.0, 1e4, -1e4,
        1e13, -1e13, 1e30, -1e30, np.inf, -np.inf, np.nan]
SIZES = [0, 1, 7, 16384 + 3, 3 * 16384 + 5]  # 16384: the compiled kernels' block





def _inputs(n, dtype, seed=0):
    """x: edge values then normal draws of spread 4; g: standard normal."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 4
    k = min(n, len(EDGE))
    x[:k] = EDGE[:k]
    return x.astype(dtype), rng.standard_normal(n).astype(dtype)


def _check32(ours, truth, x):
    """float32 agreement: within 2e-6 relative, or 2e-6 absolute times max(1, |x|) where the
    value is a difference near 0 (gelu of a negative x is 0.5 - 0.5 erf in both)."""
    with np.errstate(all="ignore"):
        tol = 2e-6 * np.maximum(1.0, np.abs(x.astype(np.float64)))
        bad = ~(np.abs(ours - truth) <= np.maximum(tol, 2e-6 * np.abs(truth)))
    bad &= ~((ours == truth) | (np.isnan(ours) & np.isnan(truth)))  # infinities, nan
    assert not bad.any(), (x[bad][:5], ours[bad][:5], truth[bad][:5])


def _check64(ours, truth, x):
    """float64 agreement: 1e-13 relative, or 1e-14 absolute times max(1, x^2) where the
    tanh approximation's 1 + tanh(u) and 1 - tanh(u)^2 cancel (tanh near -1): there the
    one-ulp difference between NumPy's tanh and the C library's is no longer relative."""
    tol = 1e-14 * np.maximum(1.0, np.square(x))
    with np.errstate(all="ignore"):
        bad = ~(np.abs(ours - truth) <= np.maximum(tol, 1e-13 * np.abs(truth)))
    bad &= ~((ours == truth) | (np.isnan(ours) & np.isnan(truth)))
    assert not bad.any(), (x[bad][:5], ours[bad][:5], truth[bad][:5])


# ----------------------------------------------------------------------------- agreement
@pytest.mark.parametrize("name", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("n", SIZES)
def test_gelu_kernels_agree_with_the_reference(compiled, name, n):
    fwd, bwd = name + "_forward", name + "_backward"
    for dtype in (np.float32, np.float64):
        x, g = _inputs(n, dtype)
        with np.errstate(all="ignore"):
            ours = (getattr(compiled, fwd)(x), getattr(compiled, bwd)(x, g))
            ref = (getattr(reference, fwd)(x), getattr(reference, bwd)(x, g))
        for a, b in zip(ours, ref):
            assert a.dtype == dtype and a.shape == x.shape
            if dtype == np.float64:
                _check64(a, b, x)
            else:
                np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
                _check32(a, b, x)


def test_float64_exact_gelu_is_the_references_arithmetic_to_the_bit(compiled):
    """float64 gelu is the reference's formula, operation for operation. The one thing the
    two paths may not share is exp: the compiled kernel calls the C library's, and NumPy
    has a SIMD exp of its own on AVX-512 machines, which differs from it in the last bit
    on a few percent of these values. So the forward (no exp) is the reference to the bit,
    the backward is the reference's formula with the C library's exp to the bit, and the
    reference itself to float64 rounding (cdf + x phi cancels for x < 0: 1e-12 relative)."""
    x, g = _inputs(3 * 16384 + 5, np.float64)
    with np.errstate(all="ignore"):
        assert compiled.gelu_forward(x).tobytes() == reference.gelu_forward(x).tobytes()
        ours = compiled.gelu_backward(x, g)
        libm_exp = np.array([math.exp(v) for v in (-0.5 * x * x)])
        cdf, _ = reference.gelu_cdf(x)
        formula = g * (cdf + x * (reference._INV_SQRT_2PI * libm_exp))
        assert ours.tobytes() == formula.tobytes()
        np.testing.assert_allclose(ours, reference.gelu_backward(x, g), rtol=1e-12, atol=0)


def test_the_gelu_loops_exp_of_non_positive_values_is_exp32_to_the_bit(compiled):
    """The gelu loops take exp only of values <= 0, through a copy of exp32 without its
    overflow and nan checks: on every such value it must be exp32's result, bit for bit,
    including the underflow to 0 below -87.3 and the values around it."""
    numba = pytest.importorskip("numba")
    from tinygrad_attn.backend.kernels.compiled import _common, activations

    @numba.njit
    def both(v, a, b):
        for i in range(v.size):
            a[i] = _common.exp32(v[i])
            b[i] = activations._exp_nonpos32(v[i])

    rng = np.random.default_rng(0)
    v = np.concatenate([-rng.exponential(20.0, 100_000), np.linspace(-88.0, -86.5, 3001),
                        [0.0, -0.0, -1e-30, -87.0, -87.3, -87.33, -88.72, -1e4, -np.inf]])
    v = v.astype(np.float32)
    a, b = np.empty_like(v), np.empty_like(v)
    both(v, a, b)
    assert a.tobytes() == b.tobytes()
    assert (a[v < -87.34] == 0).all() and a[v == 0].tolist() == [1.0, 1.0]


def test_gelu_tanh_float32_keeps_its_relative_accuracy_where_tanh_nears_minus_one(compiled):
    # 1 + tanh(u) and 1 - tanh(u) come from exp(-2|u|) directly, never as a difference: on
    # x in [-4, -1] both directions stay within a few float32 ulps of the float64 values,
    # where the reference's float32 1 + tanh(u) loses digits to the cancellation
    x = np.linspace(-4.0, -1.0, 3001)
    g = np.ones_like(x)
    x32, g32 = x.astype(np.float32), g.astype(np.float32)
    x64 = x32.astype(np.float64)
    for ours, truth in ((compiled.gelu_tanh_forward(x32), reference.gelu_tanh_forward(x64)),
                        (compiled.gelu_tanh_backward(x32, g32),
                         reference.gelu_tanh_backward(x64, g.astype(np.float64)))):
        np.testing.assert_allclose(ours, truth, rtol=2e-6)
    with np.errstate(all="ignore"):
        ref32 = reference.gelu_tanh_forward(x32).astype(np.float64)
    assert np.max(np.abs(ref32 / reference.gelu_tanh_forward(x64) - 1)) > 1e-4


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (1, 1), (7,), (33, 17), (4, 1000, 13)])
def test_bias_gelu_kernels_agree_with_the_reference(compiled, approximate, shape):
    rng = np.random.default_rng(1)
    for dtype in (np.float32, np.float64):
        x = (rng.standard_normal(shape) * 3).astype(dtype)
        if x.size >= len(EDGE):
            x.reshape(-1)[:len(EDGE)] = EDGE
        b = rng.standard_normal(shape[-1:]).astype(dtype)
        g = rng.standard_normal(shape).astype(dtype)
        with np.errstate(all="ignore"):
            y, (gx, gb) = (compiled.bias_gelu_forward(x, b, approximate),
                           compiled.bias_gelu_backward(x, b, g, approximate))
            y_ref, (gx_ref, _) = (reference.bias_gelu_forward(x, b, approximate),
                                  reference.bias_gelu_backward(x, b, g, approximate))
        assert y.dtype == gx.dtype == gb.dtype == dtype and gb.shape == b.shape
        # the bias gradient is the sum of the gx returned with it: 64 chunks of rows each
        # summed in the dtype, their sums added in float64, so within the bound of a
        # sequential sum of one chunk's rows
        lead = tuple(range(len(shape) - 1))
        gb_truth = gx.astype(np.float64).sum(axis=lead)
        scale = np.abs(gx.astype(np.float64)).sum(axis=lead)
        finite = np.isfinite(gb_truth)
        bound = (math.ceil(math.prod(shape[:-1]) / 64) + 1) * np.finfo(dtype).eps
        assert np.all(np.abs(gb - gb_truth)[finite] <= bound * scale[finite] + 1e-300)
        np.testing.assert_array_equal(np.isfinite(gb), finite)
        for ours, ref in ((y, y_ref), (gx, gx_ref)):
            if dtype == np.float64:
                _check64(ours, ref, x + b)
            else:
                _check32(ours, ref, x + b)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
@pytest.mark.parametrize("n", SIZES)
def test_dropout_kernels_are_the_reference_bit_for_bit(compiled, p, n):
    rng = np.random.default_rng(2)
    u = rng.random(n, dtype=np.float32)
    for dtype in (np.float32, np.float64):
        x, g = _inputs(n, dtype)
        with np.errstate(all="ignore"):
            (y, keep), (y_ref, keep_ref) = (compiled.dropout_forward(x, u, p),
                                            reference.dropout_forward(x, u, p))
            back, back_ref = (compiled.dropout_backward(g, keep, 1 / (1 - p)),
                              reference.dropout_backward(g, keep, 1 / (1 - p)))
        assert keep.dtype == np.bool_ and np.array_equal(keep, keep_ref)
        assert y.dtype == back.dtype == dtype
        assert y.tobytes() == y_ref.tobytes() and back.tobytes() == back_ref.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dropout_backward_with_streaming_stores_is_the_reference_bit_for_bit(compiled, dtype):
    """Outputs of 32 MiB or more take streaming stores for their whole blocks from the
    first 64-byte boundary on, plain stores before it and after the last whole block.
    Here the streaming path is forced on small outputs at every alignment an array of
    `dtype` can have, so every split of head, blocks and tail is checked."""
    from tinygrad_attn.backend.kernels.compiled import activations as act

    n, scale = 3 * 16384 + 5, 1 / 0.7
    x, g = _inputs(n, dtype)
    keep = np.random.default_rng(3).random(n) >= 0.3
    ref = reference.dropout_backward(g, keep, scale)
    step = np.dtype(dtype).itemsize
    buf = np.empty(n + 64 // step, dtype)
    t = np.dtype(dtype).type
    for off in range(64 // step):
        out = buf[off:off + n]
        out[:] = np.nan
        head = (-out.ctypes.data) % 64 // step
        assert (out.ctypes.data + head * step) % 64 == 0
        act._dropout_grad_map_streaming(g, keep, t(scale), t(1), t(0), out, head)
        assert out.tobytes() == ref.tobytes()


def test_streaming_stores_are_for_large_outputs_only(compiled):
    from tinygrad_attn.backend.kernels.compiled import activations as act

    assert act._stream_head(np.empty(1000, np.float32)) == -1
    big = np.empty(act._NT_MIN_BYTES // 4 + 3, np.float32)
    head = act._stream_head(big)
    assert 0 <= head < 16 and (big.ctypes.data + 4 * head) % 64 == 0
    assert act._stream_head(big[1:]) == (head - 1) % 16
    assert act._stream_head(big[:act._NT_MIN_BYTES // 4 - 1]) == -1


def test_compiled_kernels_decline_what_they_do_not_take(compiled):
    x = np.ones((4, 5), np.float32)
    assert compiled.gelu_backward(x, np.ones((5,), np.float32)) is NotImplemented
    assert compiled.bias_gelu_forward(x, np.ones(4, np.float32)) is NotImplemented
    assert compiled.dropout_forward(x, np.ones((4, 5)), 0.5) is NotImplemented  # float64 u
    assert compiled.dropout_backward(x, np.ones((4, 5), np.float32), 2.0) is NotImplemented


def test_the_choice_falls_back_to_the_reference_for_strided_or_declined_operands(numba_mode):
    kernels.calls.clear()
    x = np.linspace(-3, 3, 20, dtype=np.float32).reshape(4, 5)
    kernels.gelu_forward(x)
    kernels.gelu_forward(x.T)  # not C-contiguous: the reference
    kernels.gelu_backward(x, np.broadcast_to(np.float32(1), x.shape))  # stride 0: reference
    keep = np.ones((4, 5), bool)
    kernels.dropout_backward(x, keep, 2.0)
    kernels.dropout_backward(x, keep.T.copy().T, 2.0)  # an F-ordered mask: declined
    assert kernels.calls["gelu_forward", "numba"] == 1
    assert kernels.calls["gelu_forward", "numpy"] == 1
    assert kernels.calls["gelu_backward", "numpy"] == 1
    assert kernels.calls["dropout_backward", "numba"] == 1
    assert kernels.calls["dropout_backward", "numpy"] == 1


# ----------------------------------------------------------------------------- the ops
def test_ops_run_the_compiled_kernels_in_numba_mode(numba_mode):
    kernels.calls.clear()
    x = ta.randn(4, 6, requires_grad=True)
    b = ta.randn(6, requires_grad=True)
    loss = (F.gelu(x) + F.gelu(x, approximate="tanh") + F.bias_gelu(x, b)
            + F.bias_gelu(x, b, approximate="tanh") + F.dropout(x, 0.3))
    loss.backward(ta.ones(4, 6))
    for name in ("gelu_forward", "gelu_backward", "gelu_tanh_forward", "gelu_tanh_backward",
                 "dropout_forward", "dropout_backward"):
        assert kernels.calls[name, "numba"] == 1, name
    assert kernels.calls["bias_gelu_forward", "numba"] == 2
    assert kernels.calls["bias_gelu_backward", "numba"] == 2
    assert not any(path == "numpy" for _, path in kernels.calls)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gradcheck_gelu_and_bias_gelu_on_the_numba_path(numba_mode, approximate):
    ta.manual_seed(0)
    x = ta.randn(3, 5, 7, dtype=ta.float64, requires_grad=True)
    b = ta.randn(7, dtype=ta.float64, requires_grad=True)
    assert ta.gradcheck(lambda x: F.gelu(x, approximate=approximate), [x])
    assert ta.gradcheck(lambda x, b: F.bias_gelu(x, b, approximate=approximate), [x, b])
    with ta.memory.save_policies(gelu="recompute"):  # y rebuilt from x and b in backward
        w = ta.randn(7, 2, dtype=ta.float64, requires_grad=True)
        assert ta.gradcheck(
            lambda x, b, w: F.bias_gelu(x, b, approximate=approximate) @ w, [x, b, w])


def test_gradcheck_dropout_on_the_numba_path(numba_mode):
    x = ta.randn(5, 9, dtype=ta.float64, requires_grad=True)

    def fn(x):
        ta.manual_seed(3)  # the same mask on every call
        return F.dropout(x, 0.4)

    assert ta.gradcheck(fn, [x])


def _run_all(mode):
    """Forward and backward of every op here under `mode`: outputs, gradients and the
    Storage allocations (op, phase, bytes) in order."""
    kernels.set_kernels(mode)
    ta.manual_seed(0)
    x = ta.randn(8, 33, requires_grad=True)
    b = ta.randn(33, requires_grad=True)
    with ta.memory.profile(raw=False) as prof:
        outs = [F.gelu(x), F.gelu(x, approximate="tanh"), F.bias_gelu(x, b),
                F.bias_gelu(x, b, approximate="tanh"), F.dropout(x, 0.25)]
        sum(o * (k + 1.0) for k, o in enumerate(outs)).sum().backward()
    allocs = [(e["op"], e["phase"], e["bytes"]) for e in prof.events if e["kind"] == "alloc"]
    return [o.detach().numpy() for o in outs], (x.grad.numpy(), b.grad.numpy()), allocs


def test_both_paths_allocate_the_same_storages_and_agree():
    pytest.importorskip("numba")
    before = kernels.get_kernels()
    try:
        ours, our_grads, our_allocs = _run_all("numba")
        ref, ref_grads, ref_allocs = _run_all("numpy")
    finally:
        kernels.set_kernels(before)
    assert our_allocs == ref_allocs and len(our_allocs) > 10
    for a, r in zip(ours + list(our_grads), ref + list(ref_grads)):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-6)
    assert ours[-1].tobytes() == ref[-1].tobytes()  # dropout: bit for bit, same mask


def test_dropout_op_is_bit_identical_between_paths():
    pytest.importorskip("numba")
    before, results = kernels.get_kernels(), []
    try:
        for mode in ("numba", "numpy"):
            kernels.set_kernels(mode)
            ta.manual_seed(7)
            x = ta.randn(3, 40000, requires_grad=True)
            y = F.dropout(x, 0.2)
            y.backward(ta.randn(3, 40000))
            results.append((y.detach().numpy().tobytes(), x.grad.numpy().tobytes()))
    finally:
        kernels.set_kernels(before)
    assert results[0] == results[1]


# ----------------------------------------------------------------------------- bias_gelu
def test_bias_gelu_is_gelu_of_x_plus_bias_and_saves_x_and_the_bias(mode):
    x = ta.randn(2, 3, 8, dtype=ta.float64, requires_grad=True)
    b = ta.randn(8, dtype=ta.float64, requires_grad=True)
    for approximate in ("none", "tanh"):
        y = F.bias_gelu(x, b, approximate=approximate)
        (sx, sb) = y.grad_fn.saved_tensor_list()
        assert sx.shares_storage(x) and sb.shares_storage(b)  # not x + b
        gx, gb = ta.autograd.grad(y.sum(), [x, b])
        x2, b2 = x.detach().requires_grad_(), b.detach().requires_grad_()
        y2 = F.gelu(x2 + b2, approximate=approximate)
        gx2, gb2 = ta.autograd.grad(y2.sum(), [x2, b2])
        np.testing.assert_allclose(y.detach().numpy(), y2.detach().numpy(), rtol=1e-13)
        np.testing.assert_allclose(gx.numpy(), gx2.numpy(), rtol=1e-13)
        np.testing.assert_allclose(gb.numpy(), gb2.numpy(), rtol=1e-12)


def test_bias_gelu_errors():
    x = ta.randn(3, 4)
    with pytest.raises(ta.errors.ShapeError, match="bias_gelu: expected a bias of shape"):
        F.bias_gelu(x, ta.randn(3))
    with pytest.raises(ta.errors.ShapeError, match="bias_gelu"):
        F.bias_gelu(ta.randn(()), ta.randn(1))
    with pytest.raises(RuntimeError, match="approximate must be 'none' or 'tanh'"):
        F.bias_gelu(x, ta.randn(4), approximate="exact")
    with pytest.raises(RuntimeError, match="expected floating tensors"):
        F.bias_gelu(ta.ones(3, 4, dtype=ta.int64), ta.ones(4, dtype=ta.int64))
    with pytest.raises(TypeError, match="bias must be a Tensor"):
        F.bias_gelu(x, None)
    with pytest.raises(TypeError, match="bias_gelu: input must be a Tensor, got list"):
        F.bias_gelu([[1.0] * 4], ta.randn(4))


def test_bias_gelu_promotes_as_gelu_of_the_sum_would():
    x = ta.randn(3, 4, requires_grad=True)
    b = ta.randn(4, dtype=ta.float64, requires_grad=True)
    y = F.bias_gelu(x, b)
    assert y.dtype is ta.float64
    y.sum().backward()
    assert x.grad.dtype is ta.float32 and b.grad.dtype is ta.float64


# ----------------------------------------------------------------------------- the GPT MLP
def _mlp_grads(model, idx, fused):
    for p in model.parameters():
        p.grad = None
    mlps = [blk.mlp for blk in model.transformer.h]
    if not fused:  # the unfused path: a GELU the MLP does not recognise as its own
        for m in mlps:
            m.gelu = type("PlainGELU", (nn.GELU,), {})()
    _, loss = model(idx, idx)
    loss.backward()
    if not fused:
        for m in mlps:
            m.gelu = nn.GELU()
    return loss.item(), {k: p.grad.numpy().copy() for k, p in model.named_parameters()}


def test_gpt_mlp_fuses_bias_and_gelu_with_the_same_parameters_and_values():
    from conftest import TINY_GPT

    ta.manual_seed(0)
    model = nn.GPT(nn.GPTConfig(**TINY_GPT)).double()
    keys = list(model.state_dict())
    assert "transformer.h.0.mlp.c_fc.bias" in keys and "transformer.h.0.mlp.c_fc.weight" in keys
    idx = ta.randint(0, 13, (2, 16))
    kernels.calls.clear()
    loss, grads = _mlp_grads(model, idx, fused=True)
    assert sum(n for (name, _), n in kernels.calls.items()
               if name == "bias_gelu_backward") == len(model.transformer.h)
    loss2, grads2 = _mlp_grads(model, idx, fused=False)
    assert math.isclose(loss, loss2, rel_tol=1e-13)
    for k in grads:
        np.testing.assert_allclose(grads[k], grads2[k], rtol=1e-9, atol=1e-13, err_msg=k)
    assert list(model.state_dict()) == keys
