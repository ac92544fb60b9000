"""Save policies: softmax, gelu and layer_norm keep their output or rebuild it in backward."""

import numpy as np
import pytest
from conftest import TINY_GPT

import nn
import tinygrad_attn as ta
import tinygrad_attn.functional as F
from tinygrad_attn.ops.nn import LayerNorm
from tinygrad_attn.ops.nonlinear import Gelu
from tinygrad_attn.ops.reduce import Softmax

B, T, C, L = 3, 16, 16, 2


@pytest.mark.parametrize("mode", ["save", "recompute"])
def test_each_op_saves_what_it_declares_and_its_formula_predicts(mode):
    x = ta.randn(4, 6, 8, requires_grad=True)
    w, b = ta.ones(8, requires_grad=True), ta.zeros(8, requires_grad=True)
    ops = {"softmax": (Softmax, lambda: F.softmax(x * 1, -1)),
           "gelu": (Gelu, lambda: F.gelu(x * 1)),
           "layer_norm": (LayerNorm, lambda: F.layer_norm(x * 1, 8, w, b))}
    for name, (cls, run) in ops.items():
        with ta.memory.save_policies(**{name: mode}):
            y = run()
        node = y.grad_fn
        activations = [t for t in node.saved_tensor_list()
                       if not t.shares_storage(w) and not t.shares_storage(b)]
        measured = sum(t.untyped_storage().nbytes for t in activations)
        assert measured == cls.saved_bytes_formula(x.shape, 4, mode), name
        assert cls.saves[mode]
    softmax_in = x * 1
    with ta.memory.save_policies(softmax=mode):
        y = F.softmax(softmax_in, -1)
    (kept,) = y.grad_fn.saved_tensor_list()
    assert kept.shares_storage(softmax_in if mode == "recompute" else y)


def _gpt_step(**policies):
    ta.manual_seed(0)
    model = nn.GPT(nn.GPTConfig(**TINY_GPT)).double()
    idx = ta.randint(0, 13, (B, T))
    with ta.memory.save_policies(**policies), ta.memory.profile(raw=False) as prof:
        _, loss = model(idx, idx)
        loss.backward()
    grads = {k: p.grad.numpy().copy() for k, p in model.named_parameters()}
    return prof.summary()["saved_peak"]["unique_bytes_without_parameters"], grads


def test_recompute_in_a_gpt_saves_exactly_the_outputs_and_changes_no_gradient():
    base, grads = _gpt_step()
    f = 8  # float64
    expected = {
        # the MLP's second matmul no longer keeps gelu's (B, T, 4C) output
        "gelu": L * B * T * 4 * C * f,
        # the Linear after each of ln_1, ln_2 (per block) and ln_f no longer keeps (B, T, C)
        "layer_norm": (2 * L + 1) * B * T * C * f,
        # softmax then keeps its input instead of its output: the same bytes
        "softmax": 0,
    }
    for op, saved_less in expected.items():
        saved, g = _gpt_step(**{op: "recompute"})
        assert base - saved == saved_less, op
        for k in grads:
            np.testing.assert_array_equal(g[k], grads[k], err_msg=f"{op}: {k}")


def test_policy_table_and_errors():
    assert ta.memory.save_policy() == {"softmax": "save", "gelu": "save", "layer_norm": "save"}
    with ta.memory.save_policies(gelu="recompute"):
        assert ta.memory.save_policy("gelu") == "recompute"
    assert ta.memory.save_policy("gelu") == "save"
    with pytest.raises(ValueError, match="unknown op 'relu'"):
        ta.memory.save_policy("relu", "recompute")
    with pytest.raises(ValueError, match="mode must be 'save' or 'recompute'"):
        ta.memory.save_policy("gelu", "sometimes")


def test_a_rebuilt_output_modified_in_place_is_refused():
    x = ta.randn(4, 8, requires_grad=True)
    w = ta.randn(8, 8, requires_grad=True)
    with ta.memory.save_policies(gelu="recompute"):
        h = F.gelu(x * 1)
        y = h @ w             # keeps a recipe of h, not h
    with ta.no_grad():
        h.add_(1.0)
    with pytest.raises(RuntimeError, match="recipe of GeluBackward.*in-place"):
        y.sum().backward()


@pytest.mark.parametrize("op", ["softmax", "gelu", "layer_norm"])
def test_gradcheck_under_recompute_with_noncontiguous_input(op):
    x = ta.randn(5, 4, dtype=ta.float64, requires_grad=True)
    w = ta.randn(5, 3, dtype=ta.float64, requires_grad=True)
    lw = ta.randn(5, dtype=ta.float64, requires_grad=True)
    first = {"softmax": lambda t: F.softmax(t, -1), "gelu": F.gelu,
             "layer_norm": lambda t: F.layer_norm(t, 5, lw, lw * 0.5)}[op]

    def fn(x, w, lw):
        return first(x.T) @ w  # the matmul keeps a recipe of first's output

    with ta.memory.save_policies(**{op: "recompute"}):
        assert ta.gradcheck(fn, [x, w, lw])
