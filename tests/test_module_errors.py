"""Errors that name what is wrong, as torch's: a state_dict that is not a mapping, a value
that is not a tensor, and a layer called with something other than a Tensor."""

from __future__ import annotations

import numpy as np
import pytest

import nn
import tinygrad_attn as ta


@pytest.mark.parametrize("bad", [[1, 2], "model.safetensors", None, 3])
def test_load_state_dict_wants_a_mapping(bad):
    with pytest.raises(TypeError, match="Expected state_dict to be dict-like, got"):
        nn.Linear(2, 2).load_state_dict(bad)
    opt = nn.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(TypeError, match="Expected state_dict to be dict-like"):
        opt.load_state_dict(bad)


@pytest.mark.parametrize("value", [None, [[1.0, 2.0], [3.0, 4.0]], 1.0])
def test_a_non_tensor_value_names_its_key(value):
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError):
        torch.nn.Linear(2, 2).load_state_dict({"weight": value, "bias": torch.zeros(2)})
    lin = nn.Linear(2, 2)
    before = lin.bias.tolist()
    with pytest.raises(RuntimeError, match="'weight'.*got " + type(value).__name__):
        lin.load_state_dict({"weight": value, "bias": ta.ones(2)})
    assert lin.bias.tolist() == before  # checked before anything is written


def test_arrays_still_load():
    lin = nn.Linear(2, 2)
    lin.load_state_dict({"weight": np.ones((2, 2), np.float32), "bias": np.zeros(2)})
    assert lin.weight.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_optimizer_state_entries_are_named():
    opt = nn.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(KeyError, match="'param_groups'"):
        opt.load_state_dict({"state": {}})
    with pytest.raises(KeyError, match="'state'"):
        opt.load_state_dict({"param_groups": []})
    groups = opt.state_dict()["param_groups"]
    with pytest.raises(TypeError, match="state of parameter 0"):
        opt.load_state_dict({"state": {0: None}, "param_groups": groups})


LAYERS = {
    "LayerNorm": (lambda: nn.LayerNorm(4), lambda: torch_mod().LayerNorm(4), "x"),
    "Linear": (lambda: nn.Linear(2, 2), lambda: torch_mod().Linear(2, 2), "x"),
    "ReLU": (lambda: nn.ReLU(), lambda: torch_mod().ReLU(), "x"),
    "Embedding": (lambda: nn.Embedding(3, 2), lambda: torch_mod().Embedding(3, 2), "idx"),
    "Dropout": (lambda: nn.Dropout(0.1), lambda: torch_mod().Dropout(0.1), "x"),
    "GELU": (lambda: nn.GELU(), lambda: torch_mod().GELU(), "x"),
    "Sequential": (lambda: nn.Sequential(nn.Linear(2, 2)),
                   lambda: torch_mod().Sequential(torch_mod().Linear(2, 2)), "x"),
}


def torch_mod():
    return pytest.importorskip("torch").nn


@pytest.mark.parametrize("value", [None, [1.0, 2.0], 1.0])
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_called_with_a_non_tensor(name, value):
    ours, theirs, arg = LAYERS[name]
    with pytest.raises(TypeError):
        theirs()(value)
    with pytest.raises(TypeError, match=rf"\.forward\(\): argument '{arg}' \(position 1\) "
                       rf"must be Tensor, not {type(value).__name__}"):
        ours()(value)


def test_loss_and_gpt_name_their_arguments():
    with pytest.raises(TypeError, match="CrossEntropyLoss.forward.*'target'.*NoneType"):
        nn.CrossEntropyLoss()(ta.zeros(2, 3), None)
    gpt = nn.GPT(nn.GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4))
    with pytest.raises(TypeError, match="GPT.forward.*'idx'.*list"):
        gpt([[1, 2]])
    assert gpt(ta.tensor([[1, 2]]))[1] is None  # targets may stay None


def test_user_modules_are_not_checked():
    class Doubler(nn.Module):
        def forward(self, xs):
            return [2 * v for v in xs]

    assert Doubler()([1, 2]) == [2, 4]
