"""A small CNN (two convolutions, pooling, batch norm, a linear head) trained a few steps in
float64, step by step against the same network in torch: losses, every gradient, the
updated weights and BatchNorm's running statistics, with SGD (momentum) and AdamW."""

from __future__ import annotations

import numpy as np
import pytest

import nn
import tinygrad_attn as ta


def _net(m):
    """The same architecture from nn or torch.nn: (N, 3, 8, 8) -> 5 classes. The convolutions
    feeding batch norm have no bias, as usual: its gradient is zero up to rounding, which
    AdamW would scale up into noise."""
    return m.Sequential(
        m.Conv2d(3, 6, 3, padding=1, bias=False),  # (N, 6, 8, 8)
        m.BatchNorm2d(6),
        m.ReLU(),
        m.MaxPool2d(2),                          # (N, 6, 4, 4)
        m.Conv2d(6, 8, 3, groups=2, bias=False),  # (N, 8, 2, 2)
        m.BatchNorm2d(8, momentum=None),
        m.ReLU(),
        m.AvgPool2d(2, ceil_mode=True),          # (N, 8, 1, 1)
        m.Flatten(),                             # (N, 8)
        m.Linear(8, 5),
    )


@pytest.mark.parametrize("optimizer", ["SGD", "AdamW"])
def test_small_cnn_trains_like_torch_step_by_step(optimizer):
    torch = pytest.importorskip("torch")
    ta.manual_seed(0)
    ours = _net(nn).double()
    theirs = _net(torch.nn).double()
    theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()})
    if optimizer == "SGD":
        opt = nn.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
        opt_t = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    else:
        opt = nn.optim.AdamW(ours.parameters(), lr=0.01, weight_decay=0.1)
        opt_t = torch.optim.AdamW(theirs.parameters(), lr=0.01, weight_decay=0.1)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6, 3, 8, 8)), rng.integers(0, 5, 6)  # one synthetic batch
    losses = []
    for step in range(4):
        loss = nn.functional.cross_entropy(ours(ta.tensor(x)), ta.tensor(y))
        loss_t = torch.nn.functional.cross_entropy(theirs(torch.tensor(x)), torch.tensor(y))
        np.testing.assert_allclose(loss.item(), loss_t.item(), rtol=1e-10, err_msg=f"step {step}")
        losses.append(loss.item())
        opt.zero_grad()
        opt_t.zero_grad()
        loss.backward()
        loss_t.backward()
        params = dict(ours.named_parameters())
        for name, p in theirs.named_parameters():
            np.testing.assert_allclose(params[name].grad.numpy(), p.grad.numpy(), rtol=1e-8,
                                       atol=1e-12, err_msg=f"grad of {name} at step {step}")
        opt.step()
        opt_t.step()
    state, state_t = ours.state_dict(), theirs.state_dict()
    assert list(state) == list(state_t)
    for key, value in state_t.items():  # weights, running statistics, batch counters
        np.testing.assert_allclose(state[key].numpy(), value.numpy(), rtol=1e-8, atol=1e-12,
                                   err_msg=key)
    assert losses[-1] < losses[0]  # it fits the batch
    ours.eval()
    theirs.eval()
    x = rng.standard_normal((2, 3, 8, 8))
    np.testing.assert_allclose(ours(ta.tensor(x)).detach().numpy(),
                               theirs(torch.tensor(x)).detach().numpy(), rtol=1e-8, atol=1e-12)
