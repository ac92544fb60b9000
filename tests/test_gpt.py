"""The GPT: equal to PyTorch's nanoGPT (logits, loss and every gradient, float64), learns a
small task, and generates (greedy with top_k=1, an exact sampler otherwise)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

import nn
import tinygrad_attn as ta
from nn.gpt import sample

CONFIG = dict(vocab_size=13, block_size=16, n_layer=2, n_head=4, n_embd=32)


def host(t):
    return t.detach().cpu().numpy()


# ----------------------------------------------------------------------------- vs PyTorch
def _pair(bias, flash=False):
    """A tinygrad_attn GPT and nanoGPT in torch, float64, with the same weights."""
    torch = pytest.importorskip("torch")
    import torch_nanogpt

    torch.manual_seed(0)
    ref = torch_nanogpt.GPT(torch_nanogpt.GPTConfig(**CONFIG, bias=bias, flash=flash))
    ref = ref.double()
    model = nn.GPT(nn.GPTConfig(**CONFIG, bias=bias)).double()
    # torch -> ours by name: torch's state_dict has both tied names and (without flash) the
    # causal-mask buffers "attn.bias"; GPT.load_state_dict skips those as nanoGPT does
    state = {k: v.numpy() for k, v in ref.state_dict().items()}
    assert flash or any(k.endswith(".attn.bias") for k in state)
    model.load_state_dict(state)
    assert model.transformer.wte.weight is model.lm_head.weight  # still tied
    return torch, ref, model


def _batch(torch, B=3, T=11):
    rng = np.random.default_rng(1)
    idx = rng.integers(0, CONFIG["vocab_size"], (B, T))
    targets = rng.integers(0, CONFIG["vocab_size"], (B, T))
    targets[0, :3] = -1  # ignored positions
    return (ta.tensor(idx), ta.tensor(targets),
            torch.from_numpy(idx), torch.from_numpy(targets))


@pytest.mark.parametrize("bias", [True, False])
def test_gpt_matches_nanogpt_logits_loss_and_every_gradient(bias):
    torch, ref, model = _pair(bias)
    idx, targets, t_idx, t_targets = _batch(torch)
    logits, loss = model(idx, targets)
    t_logits, t_loss = ref(t_idx, t_targets)
    assert logits.dtype is ta.float64 and logits.shape == (3, 11, CONFIG["vocab_size"])
    np.testing.assert_allclose(host(logits), t_logits.detach().numpy(), rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(loss.item(), t_loss.item(), rtol=1e-5)

    loss.backward()
    t_loss.backward()
    t_params = dict(ref.named_parameters(remove_duplicate=False))
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    assert sorted(names) == sorted(t_params)
    for name, p in model.named_parameters(remove_duplicate=False):
        expected = t_params[name].grad.numpy()
        assert p.grad is not None, name
        np.testing.assert_allclose(host(p.grad), expected, rtol=1e-5,
                                   atol=1e-12 * np.abs(expected).max(), err_msg=name)


def test_gpt_matches_nanogpt_without_targets():
    torch, ref, model = _pair(bias=True)
    idx, _, t_idx, _ = _batch(torch)
    logits, loss = model(idx)
    t_logits, _ = ref(t_idx)
    assert loss is None and logits.shape == (3, 1, CONFIG["vocab_size"])
    np.testing.assert_allclose(host(logits), t_logits.detach().numpy(), rtol=1e-5, atol=1e-12)


def test_weights_go_back_into_nanogpt_with_flash_attention():
    torch, ref, model = _pair(bias=True, flash=True)
    import torch_nanogpt

    fresh = torch_nanogpt.GPT(torch_nanogpt.GPTConfig(**CONFIG, flash=True)).double()
    torch_nanogpt.load_from_ta(fresh, model.state_dict())  # ours -> torch, by name
    idx, targets, t_idx, t_targets = _batch(torch)
    _, loss = model(idx, targets)
    _, t_loss = fresh(t_idx, t_targets)
    np.testing.assert_allclose(loss.item(), t_loss.item(), rtol=1e-5)


def test_names_and_parameter_count_match_nanogpt():
    torch, ref, model = _pair(bias=True)
    keys = [k for k in ref.state_dict() if not k.endswith(".attn.bias")]
    assert list(model.state_dict()) == keys
    for non_embedding in (True, False):
        assert model.num_params(non_embedding) == ref.get_num_params(non_embedding)


def test_init_is_nanogpts():
    cfg = nn.GPTConfig(vocab_size=50, block_size=32, n_layer=3, n_head=2, n_embd=64)
    model = nn.GPT(cfg)
    sd = model.state_dict()
    assert abs(sd["transformer.wte.weight"].numpy().std() - 0.02) < 0.002
    assert abs(sd["transformer.h.0.mlp.c_fc.weight"].numpy().std() - 0.02) < 0.002
    proj = sd["transformer.h.1.mlp.c_proj.weight"].numpy().std()
    assert abs(proj - 0.02 / math.sqrt(2 * cfg.n_layer)) < 0.001
    assert not sd["transformer.h.0.attn.c_attn.bias"].numpy().any()
    np.testing.assert_array_equal(sd["transformer.ln_f.weight"].numpy(), 1.0)


def test_config_errors():
    model = nn.GPT(nn.GPTConfig(**CONFIG))
    with pytest.raises(ValueError, match="block size"):
        model(ta.zeros(1, 17, dtype=ta.long))
    with pytest.raises(ValueError, match="attention implementation"):
        nn.GPT(nn.GPTConfig(**CONFIG, attn="bogus"))
    with pytest.raises(ValueError, match="no attention dropout"):
        nn.GPT(nn.GPTConfig(**CONFIG, attn="flash", dropout=0.1))
    with pytest.raises(ValueError, match="divisible"):
        nn.GPT(nn.GPTConfig(**dict(CONFIG, n_head=5)))


def test_dropout_training_step_runs_and_eval_is_deterministic():
    model = nn.GPT(nn.GPTConfig(**CONFIG, dropout=0.2))
    idx = ta.randint(0, 13, (2, 8))
    _, loss = model(idx, idx)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    a, _ = model(idx, idx)
    b, _ = model(idx, idx)
    np.testing.assert_array_equal(host(a), host(b))


# ----------------------------------------------------------------------------- learning
def test_tiny_gpt_learns_to_reverse_a_sequence():
    """Input: L digits, a separator, then the digits reversed; the loss is on the reversed
    half only. A plain Adam written here (nn.optim is tested on its own)."""
    L, digits = 6, 8
    sep = digits
    model = nn.GPT(nn.GPTConfig(vocab_size=digits + 1, block_size=2 * L, n_layer=2,
                                n_head=2, n_embd=32))
    backwards = ta.arange(L - 1, -1, -1)

    def batch(B):
        x = ta.randint(0, digits, (B, L))
        seq = ta.cat([x, ta.full((B, 1), sep), x.index_select(1, backwards)], dim=1)
        targets = seq[:, 1:].contiguous()  # (B, 2L)
        targets[:, :L] = -1  # nothing to learn before the separator
        return seq[:, :-1], targets

    params = list(model.parameters())
    m1 = [ta.zeros_like(p) for p in params]
    m2 = [ta.zeros_like(p) for p in params]
    lr, b1, b2, eps = 3e-3, 0.9, 0.99, 1e-8
    start = time.perf_counter()
    for step in range(1, 151):
        idx, targets = batch(32)
        _, loss = model(idx, targets)
        model.zero_grad()
        loss.backward()
        with ta.no_grad():
            for p, m, v in zip(params, m1, m2):
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).add_(p.grad * p.grad, alpha=1 - b2)
                p.sub_((m / (1 - b1**step)) / ((v / (1 - b2**step)).sqrt() + eps) * lr)
    elapsed = time.perf_counter() - start

    idx, targets = batch(256)
    with ta.no_grad():
        logits, _ = model(idx, targets)
    scored = targets != -1
    right = (logits.argmax(-1) == targets) & scored
    accuracy = right.long().sum().item() / scored.long().sum().item()
    assert accuracy >= 0.95, f"token accuracy {accuracy:.3f} after 150 steps ({elapsed:.1f} s)"


# ----------------------------------------------------------------------------- generation
def test_generate_shape_and_greedy_top_k_1():
    model = nn.GPT(nn.GPTConfig(**dict(CONFIG, block_size=8))).eval()
    idx = ta.randint(0, 13, (2, 5))
    out = model.generate(idx, 7, top_k=1)
    assert out.shape == (2, 12) and out.dtype is ta.long
    assert out[:, :5].tolist() == idx.tolist()
    # greedy by hand, cropping the context to block_size as generate does
    expected = idx
    for _ in range(7):
        logits, _ = model(expected[:, -8:])
        expected = ta.cat([expected, logits[:, -1, :].argmax(-1, keepdim=True)], dim=1)
    assert out.tolist() == expected.tolist()
    ta.manual_seed(123)  # top_k=1 ignores the random stream
    assert model.generate(idx, 7, top_k=1, temperature=0.7).tolist() == out.tolist()
    assert model.lm_head.weight.grad is None  # generate records no graph
    sampled = model.generate(idx, 3)
    assert sampled.shape == (2, 8) and 0 <= sampled.numpy().min() <= sampled.numpy().max() < 13


def test_sampler_is_exact_and_respects_top_k_and_temperature():
    logits = ta.tensor([1.0, 2.0, 0.5, -1.0, 1.5], dtype=ta.float64)
    n = 40_000
    rows = logits.view(1, 5).expand(n, 5)

    def frequencies(**kw):
        picks = sample(rows, **kw).numpy()[:, 0]
        return np.bincount(picks, minlength=5) / n

    def expected(temperature=1.0, keep=None):
        z = logits.numpy() / temperature
        p = np.exp(z - z.max())
        if keep is not None:
            p[[i for i in range(5) if i not in keep]] = 0
        return p / p.sum()

    for kw, p in [({}, expected()),
                  ({"temperature": 0.5}, expected(0.5)),
                  ({"top_k": 2}, expected(keep={1, 4})),
                  ({"top_k": 3, "temperature": 2.0}, expected(2.0, keep={1, 4, 0}))]:
        freq = frequencies(**kw)
        assert np.all(freq[p == 0] == 0), kw
        sigma = np.sqrt(p * (1 - p) / n)
        assert np.all(np.abs(freq - p) <= 5 * sigma + 1e-12), (kw, freq, p)
    # ties at the cut-off are all kept, as with torch.topk
    tied = ta.tensor([[3.0, 1.0, 3.0, 0.0]]).expand(2000, 4)
    picks = sample(tied, top_k=1).numpy()[:, 0]
    assert set(picks.tolist()) == {0, 2}


@pytest.mark.parametrize("attn", ["naive", "flash"])
@pytest.mark.parametrize("checkpoint", [False, True])
def test_attention_implementations_and_checkpointing_agree(attn, checkpoint):
    """naive / views / flash, with and without block checkpointing: the same loss and the
    same gradients (float64, 1e-6), from the same weights."""
    def run(**kw):
        ta.manual_seed(3)
        model = nn.GPT(nn.GPTConfig(**dict(CONFIG, attn_block_size=3), **kw)).double()
        idx = ta.randint(0, 13, (3, 16))
        _, loss = model(idx, (idx + 1) % 13)
        loss.backward()
        return loss.item(), {k: p.grad.numpy().copy() for k, p in model.named_parameters()}

    ref_loss, ref_grads = run(attn="views")
    loss, grads = run(attn=attn, checkpoint=checkpoint)
    assert loss == pytest.approx(ref_loss, rel=1e-12)
    for k in ref_grads:
        np.testing.assert_allclose(grads[k], ref_grads[k], rtol=1e-6, atol=1e-10, err_msg=k)


def test_checkpointed_recompute_keeps_the_block_scope():
    model = nn.GPT(nn.GPTConfig(**CONFIG, checkpoint=True))
    idx = ta.randint(0, 13, (2, 8))
    with ta.memory.profile() as prof:
        _, loss = model(idx, idx)
        loss.backward()
    backward_scopes = {e["scope"] for e in prof.events
                       if e["kind"] == "alloc" and e["phase"] == "backward"}
    assert "transformer.h.0.attn.c_attn" in backward_scopes
    assert "transformer.h.1.mlp.c_fc" in backward_scopes


# ----------------------------------------------------------------------------- devices
@pytest.mark.parametrize("attn,checkpoint", [("views", False), ("flash", True)])
def test_training_steps_on_device_agree_with_cpu(device, attn, checkpoint):
    """Forward, backward and three AdamW steps of a tiny GPT (float64) give the CPU's losses
    and weights on the device, with the weights moved there by .to(device)."""
    def run(dev):
        ta.manual_seed(5)
        model = nn.GPT(nn.GPTConfig(**dict(CONFIG, n_layer=1, attn_block_size=4), attn=attn,
                                    checkpoint=checkpoint)).double().to(dev)
        opt = nn.optim.configure_adamw(model, weight_decay=0.1, lr=1e-2, betas=(0.9, 0.95))
        rng = np.random.default_rng(0)
        losses = []
        for _ in range(3):
            idx = ta.tensor(rng.integers(0, 13, (2, 9)), device=dev)
            _, loss = model(idx, (idx + 1) % 13)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
        assert all(p.device == ta.backend.canonical_device(dev) for p in model.parameters())
        return losses, {k: host(p) for k, p in model.named_parameters()}

    cpu_losses, cpu_weights = run("cpu")
    losses, weights = run(device)
    np.testing.assert_allclose(losses, cpu_losses, rtol=1e-10)
    assert cpu_losses[2] < cpu_losses[0]  # it trains
    for k, w in cpu_weights.items():
        np.testing.assert_allclose(weights[k], w, rtol=1e-8, atol=1e-12, err_msg=k)


def test_dropout_checkpointing_and_generate_on_device(device):
    """Dropout draws from the device's random stream; checkpointing replays it exactly
    (the same gradients as without checkpointing); generate stays on the device."""
    def grads(checkpoint):
        ta.manual_seed(7)
        model = nn.GPT(nn.GPTConfig(**CONFIG, dropout=0.3, checkpoint=checkpoint)).to(device)
        idx = ta.randint(0, 13, (2, 8), device=device)
        _, loss = model(idx, idx)
        loss.backward()
        return loss.item(), {k: host(p.grad) for k, p in model.named_parameters()}, model

    loss0, g0, _ = grads(False)
    loss1, g1, model = grads(True)
    assert loss1 == loss0
    for k in g0:
        np.testing.assert_allclose(g1[k], g0[k], rtol=1e-5, atol=1e-7, err_msg=k)
    out = model.eval().generate(ta.zeros(2, 1, dtype=ta.int64, device=device), 5, top_k=3)
    assert out.shape == (2, 6) and out.device == ta.backend.canonical_device(device)
    assert ((out >= 0) & (out < 13)).all().item()
