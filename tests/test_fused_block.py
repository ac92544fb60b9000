"""The fused transformer nodes in use: add_layer_norm (a residual add and the layer_norm
after it) and linear (a GEMM with its bias). Each keeps the ledger's byte figures of the
composition it replaces exactly (a GPT step, under each save policy), honours the
"layer_norm" recompute policy byte for byte, and its compiled kernels agree with the
reference ones."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TINY_GPT

import nn
import tinygrad_attn as ta
import tinygrad_attn.functional as F
from tinygrad_attn.backend.kernels import reference
from tinygrad_attn.ops.nn import AddLayerNorm, LayerNorm

B, T = 3, 16


class _PlainLayerNorm(nn.LayerNorm):
    """A LayerNorm of another type: the GPT falls back to the add and the module apart."""


class _ComposedLinear(nn.Linear):
    """The Linear as it was: a matmul node, then an in-place add node for the bias."""

    def forward(self, x):
        y = x @ self.weight.mT
        return y if self.bias is None else y.add_(self.bias)


def _unfuse(model):
    for m in model.modules():
        if type(m) is nn.LayerNorm:
            m.__class__ = _PlainLayerNorm
    for block in model.transformer.h:  # c_fc stays: its bias runs in bias_gelu either way
        for lin in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_proj):
            lin.__class__ = _ComposedLinear
    return model


def _step(fused: bool, **policies):
    ta.manual_seed(0)
    model = nn.GPT(nn.GPTConfig(**TINY_GPT)).double()
    if not fused:
        _unfuse(model)
    idx = ta.randint(0, 13, (B, T))
    with ta.memory.save_policies(**policies), ta.memory.profile(raw=False) as prof:
        _, loss = model(idx, idx)
        loss.backward()
    grads = {k: p.grad.numpy().copy() for k, p in model.named_parameters()}
    return prof.summary()["saved_peak"], grads, prof


@pytest.mark.parametrize("policies", [{}, {"layer_norm": "recompute"},
                                      {"gelu": "recompute", "layer_norm": "recompute"}],
                         ids=["save", "layer_norm-recompute", "all-recompute"])
def test_a_gpt_step_saves_what_the_unfused_composition_saves_to_the_byte(policies):
    fused, g_fused, _ = _step(True, **policies)
    plain, g_plain, _ = _step(False, **policies)
    for key in ("unique_bytes", "unique_bytes_without_parameters", "nominal_bytes"):
        assert fused[key] == plain[key], key
    # and in each module: the fused node runs in the norm's scope and keeps what it kept
    assert ({k: v["unique_bytes"] for k, v in fused["by_module"].items()}
            == {k: v["unique_bytes"] for k, v in plain["by_module"].items()})
    for k in g_plain:
        np.testing.assert_allclose(g_fused[k], g_plain[k], rtol=1e-9, atol=1e-12, err_msg=k)


def test_every_residual_add_of_the_gpt_is_fused_into_its_norm():
    fused, _, _ = _step(True)
    plain, _, _ = _step(False)
    L = TINY_GPT["n_layer"]
    ops = {k: v["nodes"] for k, v in fused["by_op"].items()}
    # the embedding sum into h.0.ln_1, each block's attention add into its ln_2, its MLP
    # add into the next ln_1 (the last into ln_f): 2 L + 1 norms, all fused
    assert ops["AddLayerNorm"] == 2 * L + 1 and "LayerNorm" not in ops
    assert ops["Linear"] == 3 * L  # c_attn, attn.c_proj, mlp.c_proj: biased Linears
    assert plain["by_op"]["LayerNorm"]["nodes"] == 2 * L + 1
    scopes = {n["scope"] for n in fused["nodes"] if n["node"] == "AddLayerNormBackward"}
    assert scopes == {f"transformer.h.{i}.ln_{j}" for i in range(L) for j in (1, 2)} | {
        "transformer.ln_f"}


def test_the_fused_node_saves_the_sum_and_rstd_and_its_formula_says_so():
    x, r = ta.randn(4, 6, 8, requires_grad=True), ta.randn(4, 6, 8, requires_grad=True)
    w, b = ta.ones(8, requires_grad=True), ta.zeros(8, requires_grad=True)
    for mode in ("save", "recompute"):
        with ta.memory.save_policies(layer_norm=mode):
            s, y = F.add_layer_norm(x * 1, r, 8, w, b)
        node = y.grad_fn
        assert s.grad_fn is node and (y._output_nr, s._output_nr) == (0, 1)
        kept = [t for t in node.saved_tensor_list()
                if not t.shares_storage(w) and not t.shares_storage(b)]
        assert kept[0].shares_storage(s)  # the sum is the residual stream: no new bytes
        measured = sum(t.untyped_storage().nbytes for t in kept)
        assert measured == AddLayerNorm.saved_bytes_formula(x.shape, 4, mode)
        assert measured == LayerNorm.saved_bytes_formula(x.shape, 4, mode)


def test_a_linear_after_the_fused_norm_keeps_a_recipe_under_recompute():
    x = ta.randn(4, 8, dtype=ta.float64, requires_grad=True)
    r = ta.randn(4, 8, dtype=ta.float64, requires_grad=True)
    w = ta.randn(5, 8, dtype=ta.float64, requires_grad=True)
    bias = ta.randn(5, dtype=ta.float64, requires_grad=True)
    grads = {}
    for mode in ("save", "recompute"):
        with ta.memory.save_policies(layer_norm=mode):
            s, h = F.add_layer_norm(x, r, 8)
            y = F.linear(h, w, bias)
        kept = y.grad_fn.saved_tensor_list()
        assert [t.shares_storage(h) for t in kept] == ([True, False] if mode == "save"
                                                       else [False])
        (y.sum() + (s * s).sum()).backward()
        grads[mode] = [t.grad.numpy().copy() for t in (x, r, w, bias)]
        for t in (x, r, w, bias):
            t.grad = None
    for a, b in zip(*grads.values()):
        np.testing.assert_array_equal(a, b)
    with ta.memory.save_policies(layer_norm="recompute"):
        s, h = F.add_layer_norm(x, r, 8)
        y = F.linear(h, w, bias)
    with ta.no_grad():
        h.add_(1.0)
    with pytest.raises(RuntimeError, match="recipe of AddLayerNormBackward.*in-place"):
        y.sum().backward()


def test_the_linear_node_adds_its_bias_in_place_and_saves_what_matmul_saves():
    x = ta.randn(2, 3, 8, requires_grad=True)
    w, b = ta.randn(5, 8, requires_grad=True), ta.randn(5, requires_grad=True)
    y = F.linear(x, w, b)
    assert y.grad_fn.name == "LinearBackward" and y.grad_fn.next_functions[0][0].name \
        == "AccumulateGrad"  # one node: x's edge goes straight to the leaf
    assert y.untyped_storage().version == 0  # the bias went into a fresh output
    kept = y.grad_fn.saved_tensor_list()
    assert len(kept) == 2 and kept[0] is x and kept[1].shares_storage(w)
    matmul = (x @ w.mT).grad_fn.saved_tensor_list()
    assert ([t.untyped_storage().nbytes for t in kept]
            == [t.untyped_storage().nbytes for t in matmul])
    # only what the other gradient needs: a frozen weight keeps no x
    w.requires_grad_(False)
    assert [t.shape for t in F.linear(x, w, b).grad_fn.saved_tensor_list()] == [(5, 8)]


def test_only_the_normed_output_or_only_the_sum_gets_a_gradient():
    x, r = ta.randn(3, 8, requires_grad=True), ta.randn(8, requires_grad=True)
    w = ta.randn(8, requires_grad=True)
    s, y = F.add_layer_norm(x, r, 8, w)
    (s * 3).sum().backward()  # y unused: add's gradient, none for the weight
    np.testing.assert_array_equal(x.grad.numpy(), np.full((3, 8), 3.0, np.float32))
    np.testing.assert_array_equal(r.grad.numpy(), np.full(8, 9.0, np.float32))
    assert w.grad is None


# ----------------------------------------------------------------------------- kernels
def _rand(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _close(a, b, dtype):
    if a is None or b is None:
        assert a is None and b is None
        return
    assert a.dtype == b.dtype == np.dtype(dtype) and a.shape == b.shape
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.abs(b).max(
        initial=0.0))))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows, table", [(0, 0), (5, 5), (300, 300), (64, 16), (2048, 1)])
@pytest.mark.parametrize("affine", [True, False])
def test_add_layer_norm_kernels_agree(compiled, dtype, rows, table, affine):
    n = 7 if rows < 2048 else 128
    x, r = _rand((rows, n), dtype), _rand((table, n), dtype, 1)
    w, b = (_rand(n, dtype, 2), _rand(n, dtype, 3)) if affine else (None, None)
    ref = reference.add_layer_norm_forward(x, r, w, b, 1e-5)
    fast = compiled.add_layer_norm_forward(x, r, w, b, 1e-5)
    if rows == 0:
        assert fast is NotImplemented or fast[0].shape == (0, n)
        return
    for a, e in zip(fast, ref):
        _close(a, e, dtype)
    s, _, rstd = ref
    # the compiled sum and norm are layer_norm's, to the bit
    np.testing.assert_array_equal(fast[1], compiled.layer_norm_forward(s, w, b, 1e-5)[0])
    g, gs = _rand((rows, n), dtype, 4), _rand((rows, n), dtype, 5)
    for residual_grad in (gs, None):
        needs = (True, affine, affine)
        ref_b = reference.add_layer_norm_backward(g, s, rstd, w, residual_grad, needs)
        fast_b = compiled.add_layer_norm_backward(g, s, rstd, w, residual_grad, needs)
        for a, e in zip(fast_b, ref_b):
            _close(a, e, dtype)


def test_the_compiled_kernels_run_in_a_gpt_step(numba_mode):
    from tinygrad_attn.backend import kernels

    before = dict(kernels.calls)
    _step(True)
    for name in ("add_layer_norm_forward", "add_layer_norm_backward"):
        assert kernels.calls[name, "numba"] > before.get((name, "numba"), 0), name
