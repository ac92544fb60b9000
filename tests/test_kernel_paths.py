"""A whole GPT training step on each kernel path: the same numbers, the same bytes.

The compiled kernels (numba) must agree with the NumPy reference to float32 tolerance, and
must not cost memory: every Storage the step allocates, every byte it saves for backward and
its tensor-level peak are the same on both paths (the compiled kernels write into the same
outputs the reference allocates, and allocate no Storage of their own).
"""

from __future__ import annotations

import numpy as np
import pytest

import nn
import tinygrad_attn as ta
from tinygrad_attn.backend import kernels

# the kernels a GPT step runs compiled on the numba path
EXPECTED_COMPILED = {"bias_gelu_forward", "bias_gelu_backward", "adamw_update_many"}
EXPECTED_VIEWS = {"causal_softmax_block", "causal_softmax_block_backward", "dropout_forward",
                  "dropout_backward"}  # the views attention, and dropout (flash has none)
CONFIG = dict(vocab_size=29, block_size=16, n_layer=2, n_head=2, n_embd=32)


@pytest.fixture
def restore_kernels():
    before = ta.backend.get_kernels()
    yield
    ta.backend.set_kernels(before)


def _step(mode: str, attn: str, policy: str):
    """One AdamW step of a small GPT under `mode`: (loss, grads, ledger summary,
    Storage allocations by count and bytes, the kernels that ran)."""
    ta.backend.set_kernels(mode)
    ta.manual_seed(0)
    model = nn.GPT(nn.GPTConfig(**CONFIG, attn=attn, dropout=0.1 if attn == "views" else 0.0))
    opt = nn.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    rng = np.random.default_rng(0)
    idx = ta.tensor(rng.integers(0, CONFIG["vocab_size"], (4, 16)))
    tgt = ta.tensor(rng.integers(0, CONFIG["vocab_size"], (4, 16)))
    kernels.calls.clear()
    with ta.memory.save_policies(gelu=policy, layer_norm=policy, softmax=policy):
        with ta.memory.profile() as prof:
            _, loss = model(idx, tgt)
            loss.backward()
            opt.step()
    allocs = [e for e in prof.events if e["kind"] == "alloc"]
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    return dict(loss=loss.item(), grads=grads, summary=prof.summary(),
                n_alloc=len(allocs), alloc_bytes=sum(e["bytes"] for e in allocs),
                ran=dict(kernels.calls))


@pytest.mark.parametrize("attn", ["views", "flash"])
@pytest.mark.parametrize("policy", ["save", "recompute"])
def test_step_agrees_and_costs_the_same_bytes(restore_kernels, attn, policy):
    pytest.importorskip("numba")
    ref = _step("numpy", attn, policy)
    fast = _step("numba", attn, policy)
    assert not any(path == "numba" for _, path in ref["ran"])
    compiled = {name for name, path in fast["ran"] if path == "numba"}
    assert EXPECTED_COMPILED | (EXPECTED_VIEWS if attn == "views" else set()) <= compiled
    np.testing.assert_allclose(fast["loss"], ref["loss"], rtol=1e-5)
    for name, g in ref["grads"].items():
        np.testing.assert_allclose(fast["grads"][name], g, rtol=2e-3, atol=2e-5,
                                   err_msg=name)
    # (the parameters after the step are not compared: Adam's first step is lr * g / (|g| +
    # eps), which turns a gradient's float32 rounding into a visible change where |g| is
    # near eps; tests/test_kernels_optim.py checks the update itself bit for bit)
    # memory: not a byte more on the compiled path
    assert fast["n_alloc"] <= ref["n_alloc"]
    assert fast["alloc_bytes"] <= ref["alloc_bytes"]
    s_ref, s_fast = ref["summary"], fast["summary"]
    assert s_fast["tensor_peak_above_start"] <= s_ref["tensor_peak_above_start"]
    assert s_fast["saved_peak"]["unique_bytes"] == s_ref["saved_peak"]["unique_bytes"]


def test_reference_path_runs_no_compiled_kernel(restore_kernels):
    ref = _step("numpy", "views", "save")
    assert ref["ran"] and all(path == "numpy" for _, path in ref["ran"])
