"""The GPT's options (norm, pos_emb, mlp, n_kv_head), each alone and all together, against
the same options written in torch (tests/torch_nanogpt.py): logits, loss and every gradient
in float64 from the same weights, in training mode (dropout 0) and without targets; the
parameter names each option brings; its errors."""

from __future__ import annotations

import numpy as np
import pytest

import nn
import tinygrad_attn as ta

CONFIG = dict(vocab_size=13, block_size=16, n_layer=2, n_head=4, n_embd=32)
OPTIONS = {
    "rmsnorm": dict(norm="rmsnorm"),
    "rope": dict(pos_emb="rope"),
    "swiglu": dict(mlp="swiglu"),
    "gqa": dict(n_kv_head=2),
    "mqa": dict(n_kv_head=1),
    "all": dict(norm="rmsnorm", pos_emb="rope", mlp="swiglu", n_kv_head=2),
}


def host(t):
    return t.detach().cpu().numpy()


def _pair(torch, options, bias=True, attn="views", flash=False):
    import torch_nanogpt

    torch.manual_seed(0)
    ref = torch_nanogpt.GPT(torch_nanogpt.GPTConfig(**CONFIG, **options, bias=bias,
                                                    flash=flash)).double()
    model = nn.GPT(nn.GPTConfig(**CONFIG, **options, bias=bias, attn=attn,
                                attn_block_size=5)).double()
    state = {k: v.numpy() for k, v in ref.state_dict().items()}
    model.load_state_dict(state)
    assert list(model.state_dict()) == [k for k in state if not k.endswith(".attn.bias")]
    return ref, model


def _batch(torch, B=3, T=11):
    rng = np.random.default_rng(1)
    idx = rng.integers(0, CONFIG["vocab_size"], (B, T))
    targets = rng.integers(0, CONFIG["vocab_size"], (B, T))
    targets[0, :3] = -1
    return ta.tensor(idx), ta.tensor(targets), torch.from_numpy(idx), torch.from_numpy(targets)


@pytest.mark.parametrize("attn,flash", [("views", False), ("flash", True)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_option_matches_torch_logits_loss_and_every_gradient(option, bias, attn, flash):
    torch = pytest.importorskip("torch")
    ref, model = _pair(torch, OPTIONS[option], bias, attn, flash)
    assert model.training and ref.training  # training mode; dropout is 0
    idx, targets, t_idx, t_targets = _batch(torch)
    logits, loss = model(idx, targets)
    t_logits, t_loss = ref(t_idx, t_targets)
    assert logits.dtype is ta.float64
    np.testing.assert_allclose(host(logits), t_logits.detach().numpy(), rtol=1e-10,
                               atol=1e-12)
    assert loss.item() == pytest.approx(t_loss.item(), rel=1e-12)
    loss.backward()
    t_loss.backward()
    t_params = dict(ref.named_parameters())
    names = list(model.named_parameters())
    assert len(names) == len(t_params)
    for name, p in names:
        np.testing.assert_allclose(host(p.grad), t_params[name].grad.numpy(), rtol=1e-7,
                                   atol=1e-11, err_msg=name)
    # inference: the last position's logits, in eval mode
    model.eval()
    ref.eval()
    last, none = model(idx)
    assert none is None
    np.testing.assert_allclose(host(last), ref(t_idx)[0].detach().numpy(), rtol=1e-10,
                               atol=1e-12)


def test_parameters_of_each_option():
    C, L = CONFIG["n_embd"], CONFIG["n_layer"]
    base = nn.GPT(nn.GPTConfig(**CONFIG))
    names = set(dict(base.named_parameters()))
    rope = nn.GPT(nn.GPTConfig(**CONFIG, pos_emb="rope"))
    assert set(dict(rope.named_parameters())) == names - {"transformer.wpe.weight"}
    assert rope.num_params() == base.num_params()  # wpe was never counted
    assert "rope_cos" not in str(list(rope.state_dict()))  # buffers, not weights
    h = rope.transformer.h
    assert h[0].attn.rope_cos is h[1].attn.rope_cos  # one table for every layer
    assert h[0].attn.rope_cos.shape == (CONFIG["block_size"], C // CONFIG["n_head"] // 2)
    rms = nn.GPT(nn.GPTConfig(**CONFIG, norm="rmsnorm"))
    assert base.num_params() - rms.num_params() == (2 * L + 1) * C  # no LayerNorm biases
    swiglu = nn.GPT(nn.GPTConfig(**CONFIG, mlp="swiglu"))
    w1 = dict(swiglu.named_parameters())["transformer.h.0.mlp.w1.weight"]
    assert w1.shape == (nn.gpt.swiglu_hidden(C), C) == (88, 32)
    assert nn.gpt.swiglu_hidden(128) == 344
    gqa = nn.GPT(nn.GPTConfig(**CONFIG, n_kv_head=2))
    c_attn = dict(gqa.named_parameters())["transformer.h.0.attn.c_attn.weight"]
    assert c_attn.shape == (C + 2 * 2 * (C // 4), C)


def test_views_and_flash_agree_with_every_option_and_checkpointing():
    def run(**kw):
        ta.manual_seed(3)
        model = nn.GPT(nn.GPTConfig(**CONFIG, **OPTIONS["all"], attn_block_size=3,
                                    **kw)).double()
        idx = ta.randint(0, 13, (3, 16))
        _, loss = model(idx, (idx + 1) % 13)
        loss.backward()
        return loss.item(), {k: p.grad.numpy().copy() for k, p in model.named_parameters()}

    ref_loss, ref_grads = run(attn="views")
    loss, grads = run(attn="flash", checkpoint=True)
    assert loss == pytest.approx(ref_loss, rel=1e-12)
    for k in ref_grads:
        np.testing.assert_allclose(grads[k], ref_grads[k], rtol=1e-6, atol=1e-10, err_msg=k)


def test_grouped_attention_makes_no_copy_of_k_or_v():
    model = nn.GPT(nn.GPTConfig(**CONFIG, n_kv_head=1, pos_emb="rope"))
    idx = ta.randint(0, 13, (2, 16))
    with ta.memory.profile() as prof:
        model(idx, idx)[1].backward()
    forward_copies = [c for c in prof.summary()["copies"]
                      if c["phase"] == "forward" and ".attn" in (c["scope"] or "")]
    # only the merge of heads, once per layer, as in the default model
    assert [c["reason"] for c in forward_copies] == ["contiguous"] * CONFIG["n_layer"]


def test_option_errors():
    with pytest.raises(ValueError, match="unknown norm 'batchnorm'"):
        nn.GPT(nn.GPTConfig(**CONFIG, norm="batchnorm"))
    with pytest.raises(ValueError, match="unknown pos_emb 'alibi'"):
        nn.GPT(nn.GPTConfig(**CONFIG, pos_emb="alibi"))
    with pytest.raises(ValueError, match="unknown mlp 'relu'"):
        nn.GPT(nn.GPTConfig(**CONFIG, mlp="relu"))
    with pytest.raises(ValueError, match=r"n_kv_head \(3\) must be a positive divisor of "
                                         r"n_head \(4\)"):
        nn.GPT(nn.GPTConfig(**CONFIG, n_kv_head=3))
    with pytest.raises(ValueError, match="attn='naive'"):
        nn.GPT(nn.GPTConfig(**CONFIG, attn="naive", pos_emb="rope"))
    with pytest.raises(ValueError, match="head size n_embd // n_head = 5 must be even"):
        nn.GPT(nn.GPTConfig(**dict(CONFIG, n_embd=20), pos_emb="rope"))
