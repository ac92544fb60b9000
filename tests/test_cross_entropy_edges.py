"""cross_entropy's edge cases, where the reductions differ: rows with ignore_index, all of
them ignored, no rows at all. PyTorch is the reference."""

import math

import numpy as np
import pytest

import tinygrad_attn as ta

ce = ta.functional.cross_entropy


@pytest.mark.parametrize("dtype", [ta.float32, ta.float64])
def test_every_target_ignored(dtype):
    logits = ta.randn(3, 4, dtype=dtype, requires_grad=True)
    target = ta.tensor([-100, -100, -100])
    mean = ce(logits, target)
    assert mean.dtype == dtype and math.isnan(mean.item())  # 0 / 0
    mean.backward()
    assert logits.grad.numpy().tolist() == [[0.0] * 4] * 3  # no row contributes
    logits.grad = None
    total = ce(logits, target, reduction="sum")
    assert total.dtype == dtype and total.item() == 0.0
    total.backward()
    assert not logits.grad.numpy().any()
    logits.grad = None
    rows = ce(logits, target, reduction="none")
    assert rows.dtype == dtype and rows.detach().numpy().tolist() == [0.0, 0.0, 0.0]
    rows.sum().backward()
    assert not logits.grad.numpy().any()


def test_no_rows():
    logits = ta.zeros(0, 4, requires_grad=True)
    target = ta.zeros(0, dtype=ta.int64)
    assert math.isnan(ce(logits, target).item())
    assert ce(logits, target, reduction="sum").item() == 0.0
    assert ce(logits, target, reduction="none").shape == (0,)
    ce(logits, target).backward()
    assert logits.grad.shape == (0, 4)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("targets", [[-1, -1, -1, -1], [2, -1, 0, -1], [1, 3, 0, 2], []])
def test_matches_torch(reduction, targets):
    torch = pytest.importorskip("torch")
    n = len(targets)
    logits = ta.randn(n, 4, dtype=ta.float64, requires_grad=True)
    ours = ce(logits, ta.tensor(targets, dtype=ta.int64), ignore_index=-1, reduction=reduction)
    tl = torch.tensor(logits.detach().numpy(), requires_grad=True)
    ref = torch.nn.functional.cross_entropy(tl, torch.tensor(targets, dtype=torch.int64),
                                            ignore_index=-1, reduction=reduction)
    np.testing.assert_allclose(ours.detach().numpy(), ref.detach().numpy(), rtol=1e-12)
    assert ours.shape == tuple(ref.shape)
    (ours.sum() if reduction == "none" else ours).backward()
    (ref.sum() if reduction == "none" else ref).backward()
    np.testing.assert_allclose(logits.grad.numpy(), tl.grad.numpy(), rtol=1e-12, atol=1e-15)
