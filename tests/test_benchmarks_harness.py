"""The vs-PyTorch harness compares like with like: benchmarks/torch_plain_step.py's plain
torch GPT, holding this engine's weights, computes this engine's loss and gradients for
each attention, and benchmarks/recipe.py's schedule and batches are nanoGPT's."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import nn
import tinygrad_attn as ta
from nn.utils import cosine_lr

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: its dataclasses look it up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("attn", ["naive", "views", "flash"])
def test_plain_torch_twin_has_our_loss_and_gradients(attn):
    torch = pytest.importorskip("torch")
    vs_torch = _load("vs_torch")
    cfg = vs_torch.CONFIGS["tiny"]
    ta.manual_seed(0)
    ours = nn.GPT(nn.GPTConfig(vocab_size=cfg.vocab_size, block_size=cfg.block_size,
                               n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                               dropout=0.0, attn=attn))
    theirs = vs_torch.torch_twin(None, cfg, attn, ours, "plain")
    assert type(theirs).__name__ == "PlainGPT"
    assert theirs.transformer.wte.weight is theirs.lm_head.weight  # tied, as nanoGPT
    assert not any(isinstance(m, torch.nn.Dropout) for m in theirs.modules())  # p = 0
    rng = np.random.default_rng(3)
    idx = rng.integers(0, cfg.vocab_size, (cfg.batch, cfg.block_size))
    tgt = rng.integers(0, cfg.vocab_size, (cfg.batch, cfg.block_size))
    _, loss = ours(ta.tensor(idx), ta.tensor(tgt))
    loss.backward()
    _, tloss = theirs(torch.from_numpy(idx), torch.from_numpy(tgt))
    tloss.backward()
    assert loss.item() == pytest.approx(tloss.item(), rel=1e-5)
    grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), grads[name].grad.numpy(),
                                   rtol=2e-3, atol=2e-6, err_msg=name)


def test_plain_step_keeps_nanogpts_names_and_dropout_layout():
    pytest.importorskip("torch")
    plain = _load("torch_plain_step")
    model = plain.PlainGPT(65, 16, 2, 4, 32, attn="views", dropout_modules=True)
    names = set(model.state_dict())
    assert {"transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight",
            "transformer.h.1.attn.c_attn.weight", "transformer.h.0.mlp.c_proj.bias",
            "transformer.ln_f.weight"} <= names
    # nanoGPT's layout: attn_dropout, resid_dropout, the MLP's, and the embedding's
    drops = [n for n, m in model.named_modules() if type(m).__name__ == "Dropout"]
    assert len(drops) == 3 * 2 + 1
    opt = plain.make_optimizer(model)
    decay, no_decay = opt.param_groups
    assert all(p.dim() >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert all(p.dim() < 2 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0


def test_recipe_schedule_is_nanogpts_and_the_trainers():
    recipe = _load("recipe")
    cfg = recipe.RECIPE
    assert (cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["block_size"],
            cfg["batch_size"], cfg["eval_iters"]) == (4, 4, 128, 64, 12, 20)
    for step in (0, 50, 99, 100, 101, 1000, 1999, 2000, 2001):
        ours = cosine_lr(step, cfg["lr"], cfg["warmup"], 2000, cfg["min_lr"])
        assert recipe.get_lr(step, cfg, 2000) == ours
    assert recipe.get_lr(0, cfg, 2000) == pytest.approx(1e-3 / 101)
    assert recipe.get_lr(2000, cfg, 2000) == pytest.approx(1e-4)
    assert recipe.get_lr(1050, cfg, 2000) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert math.isclose(recipe.get_lr(100, cfg, 2000), 1e-3)


def test_recipe_evaluates_at_the_start_every_n_and_at_the_end():
    recipe = _load("recipe")
    assert recipe.eval_points(2000, 250) == [0, 250, 500, 750, 1000, 1250, 1500, 1750, 2000]
    assert recipe.eval_points(50, 250) == [0, 50]
    assert recipe.eval_points(600, 250) == [0, 250, 500, 600]
    assert recipe.eval_points(10, 0) == [0, 10]


def test_recipe_batches_are_windows_and_their_next_tokens(tmp_path):
    recipe = _load("recipe")
    data = np.arange(100, dtype=np.int64) * 3
    x, y = recipe.windows(data, np.array([0, 5, 90]), 8)
    assert x.shape == y.shape == (3, 8)
    np.testing.assert_array_equal(x[1], data[5:13])
    np.testing.assert_array_equal(y[1], data[6:14])
    cfg = dict(recipe.RECIPE, eval_iters=3)
    summary = recipe.prepare(str(tmp_path / "d.npz"), 7, 1, cfg)
    with np.load(tmp_path / "d.npz") as f:
        assert f["train_starts"].shape == (7, cfg["batch_size"])
        assert f["eval_val"].shape == (3, cfg["batch_size"])
        assert int(f["vocab_size"]) == summary["vocab_size"]
        assert f["train_starts"].max() < len(f["train"]) - cfg["block_size"]
        assert f["eval_val"].max() < len(f["val"]) - cfg["block_size"]
        again = recipe.prepare(str(tmp_path / "e.npz"), 7, 1, cfg)
        with np.load(tmp_path / "e.npz") as g:  # one seed, the same batches
            np.testing.assert_array_equal(f["train_starts"], g["train_starts"])
        assert again == summary
