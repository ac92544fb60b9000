"""copy.deepcopy and pickle of tensors, views, modules and optimizers.

Views copied together keep sharing one Storage (an in-place write to the copy is seen by
its views: a deep-copied model loaded with new weights computes with them), their strides
and offsets are kept, and requires_grad, .grad and is_leaf follow torch. Copies go through
the one allocation path, so the ledger counts them.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from conftest import TINY_GPT

import nn
import tinygrad_attn as ta


def _pickled(obj):
    return pickle.loads(pickle.dumps(obj))


def _deep(obj):
    return copy.deepcopy(obj)


ROUND_TRIPS = {"deepcopy": _deep, "pickle": _pickled}
VIEWS = {
    "slice view": lambda base: base[2:].view(2, 2),
    "transposed": lambda base: base.view(2, 3).transpose(0, 1),
    "stepped": lambda base: base[1::2],
    "expanded": lambda base: base[:1].expand(4),
}


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("how", list(ROUND_TRIPS))
def test_views_copied_together_share_the_copy_storage(how, view):
    base = ta.arange(6.0)
    v = VIEWS[view](base)
    base_c, v_c = ROUND_TRIPS[how]([base, v])
    assert v_c.shares_storage(base_c) and not v_c.shares_storage(base)
    assert (v_c.shape, v_c.stride(), v_c.storage_offset()) == (
        v.shape, v.stride(), v.storage_offset())
    base_c.add_(100)
    np.testing.assert_array_equal(v_c.numpy(), v.numpy() + 100)
    assert base.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize("how", list(ROUND_TRIPS))
def test_a_view_alone_keeps_its_offset_and_the_whole_storage(how):
    torch = pytest.importorskip("torch")
    v = ta.arange(6.0)[2:].view(2, 2)
    want = copy.deepcopy(torch.arange(6.0)[2:].view(2, 2))
    got = ROUND_TRIPS[how](v)
    assert got.storage_offset() == want.storage_offset() == 2
    assert got.untyped_storage().nbytes == want.untyped_storage().nbytes()  # all of it
    assert got.tolist() == want.tolist()


def _leaf_state(lib, how):
    x = lib.ones(3, dtype=lib.float64, requires_grad=True)
    (x * x).sum().backward()  # after backward: the graph's accumulator is no obstacle
    c = ROUND_TRIPS[how](x)
    return c.requires_grad, c.is_leaf, None if c.grad is None else c.grad.tolist()


@pytest.mark.parametrize("how", list(ROUND_TRIPS))
def test_leaf_flags_and_grad_match_torch(how):
    torch = pytest.importorskip("torch")
    assert _leaf_state(ta, how) == _leaf_state(torch, how)


def _non_leaf(lib, how):
    y = lib.ones(3, requires_grad=True) * 2
    try:
        c = ROUND_TRIPS[how](y)
    except Exception as e:  # noqa: BLE001 - the type is compared
        return type(e)
    return c.requires_grad, c.is_leaf, c.tolist()


@pytest.mark.parametrize("how", list(ROUND_TRIPS))
def test_non_leaf_matches_torch(how):
    torch = pytest.importorskip("torch")
    assert _non_leaf(ta, how) == _non_leaf(torch, how)


def test_non_leaf_deepcopy_message():
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(ta.ones(3, requires_grad=True) * 2)
    with ta.no_grad():
        view = ta.ones(3, requires_grad=True)[1:]
    assert copy.deepcopy(view).is_leaf  # a view made under no_grad is a leaf


def test_copies_are_counted_by_the_ledger():
    x = ta.zeros(256)
    before = ta.memory.live_bytes()
    c = copy.deepcopy([x, x[1:]])
    assert ta.memory.live_bytes() - before == x.nbytes
    del c
    assert ta.memory.live_bytes() == before


@pytest.mark.parametrize("how", list(ROUND_TRIPS))
def test_linear_copy_computes_with_the_weights_loaded_into_it(how):
    lin = nn.Linear(2, 2)
    lin(ta.ones(1, 2)).sum().backward()
    c = ROUND_TRIPS[how](lin)
    c.load_state_dict({"weight": ta.zeros(2, 2), "bias": ta.ones(2)})
    assert c(ta.ones(1, 2)).tolist() == [[1.0, 1.0]]
    assert c.weight.untyped_storage().category == "parameter"
    assert c.weight.grad is None  # a parameter's grad stays behind, as torch's Parameter


@pytest.mark.parametrize("how", list(ROUND_TRIPS))
def test_gpt_copy_keeps_ties_and_values(how):
    model = nn.GPT(nn.GPTConfig(**TINY_GPT))
    idx = ta.tensor([[1, 2, 3, 4]])
    _, loss = model(idx, idx)
    loss.backward()
    c = ROUND_TRIPS[how](model)
    assert c.transformer.wte.weight is c.lm_head.weight
    assert c(idx, idx)[1].item() == loss.item()
    with ta.no_grad():
        c.lm_head.weight.mul_(0)  # the copy's tied weight is one Storage of its own
    assert model(idx, idx)[1].item() == loss.item()


@pytest.mark.parametrize("how", list(ROUND_TRIPS))
@pytest.mark.parametrize("make", [lambda ps: nn.optim.AdamW(ps, lr=0.1),
                                  lambda ps: nn.optim.SGD(ps, lr=0.1, momentum=0.9)])
def test_optimizer_copied_with_its_params_steps_them(how, make):
    lin = nn.Linear(3, 2)
    opt = make(lin.parameters())
    lin(ta.ones(1, 3)).sum().backward()
    opt.step()
    lin_c, opt_c = ROUND_TRIPS[how]((lin, opt))
    assert opt_c.param_groups[0]["params"][0] is lin_c.weight
    assert all(any(p is q for q in lin_c.parameters()) for p in opt_c.state)
    for model, o in ((lin, opt), (lin_c, opt_c)):  # the same next step on both
        o.zero_grad()
        model(ta.ones(1, 3)).sum().backward()
        o.step()
    np.testing.assert_array_equal(lin_c.weight.detach().numpy(), lin.weight.detach().numpy())


def test_optimizer_copied_alone_keeps_the_original_params_apart():
    torch = pytest.importorskip("torch")
    lin = nn.Linear(3, 2)
    opt = nn.optim.AdamW(lin.parameters())
    lin(ta.ones(1, 3)).sum().backward()
    opt.step()
    tlin = torch.nn.Linear(3, 2)
    topt = torch.optim.AdamW(tlin.parameters())
    tlin(torch.ones(1, 3)).sum().backward()
    topt.step()
    same_ta = next(iter(copy.deepcopy(opt).state)) is lin.weight
    same_torch = next(iter(copy.deepcopy(topt).state)) is tlin.weight
    assert same_ta == same_torch


def test_pickle_keeps_the_device(device):
    x = ta.arange(4.0, device=device)
    views = _pickled([x, x[1:]])
    assert views[0].device == x.device and views[1].shares_storage(views[0])
    assert views[1].cpu().tolist() == [1.0, 2.0, 3.0]
