"""ta.functional.adamw_update_: torch.optim.AdamW's arithmetic in one in-place call."""

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.memory import state as ledger_state

HYPER = dict(lr=0.01, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)


def _reference(p, g, m, v, step, lr, beta1, beta2, eps, weight_decay):
    """The textbook AdamW step in float64 NumPy."""
    p = p * (1 - lr * weight_decay)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    denom = np.sqrt(v) / np.sqrt(1 - beta2**step) + eps
    return p - lr / (1 - beta1**step) * m / denom, m, v


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("dtype", [ta.float64, ta.float32])
def test_matches_the_textbook_step(layout, dtype):
    rng = np.random.default_rng(0)
    shape = (300, 257)  # 77,100 elements: more than one 65,536-element block
    arrays = [rng.standard_normal(shape) for _ in range(2)] + [np.zeros(shape)] * 2

    def make(a):
        if layout == "transposed":
            return ta.tensor(a.T.copy(), dtype=dtype).T
        if layout == "sliced":
            big = np.zeros((shape[0], shape[1] * 2))
            big[:, ::2] = a
            return ta.tensor(big, dtype=dtype)[:, ::2]
        return ta.tensor(a, dtype=dtype)

    p, g, m, v = (make(a) for a in arrays)
    ref = [a.astype(np.float64) for a in arrays[:1]] + [arrays[2], arrays[3]]
    storages = [t.untyped_storage() for t in (p, m, v)]
    versions = [s.version for s in storages]
    for step in (1, 2, 3):
        gs = rng.standard_normal(shape)
        g.copy_(ta.tensor(gs, dtype=dtype))
        ref = list(_reference(ref[0], gs, ref[1], ref[2], step, **HYPER))
        with ta.no_grad():
            out = ta.functional.adamw_update_(p, g, m, v, step=step, **HYPER)
        assert out is p
    tol = 1e-12 if dtype == ta.float64 else 2e-6
    for t, r in zip((p, m, v), ref):
        np.testing.assert_allclose(t.numpy(), r, rtol=tol, atol=tol)
    assert [t.untyped_storage() for t in (p, m, v)] == storages  # in place
    assert [s.version for s in storages] == [n + 3 for n in versions]


def test_agrees_with_torch_adamw_in_float32():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    w = rng.standard_normal((128, 96)).astype(np.float32)
    p, m, v = ta.tensor(w), ta.zeros(128, 96), ta.zeros(128, 96)
    q = torch.tensor(w, requires_grad=True)
    opt = torch.optim.AdamW([q], lr=HYPER["lr"], betas=(HYPER["beta1"], HYPER["beta2"]),
                            eps=HYPER["eps"], weight_decay=HYPER["weight_decay"])
    for step in range(1, 6):
        g = rng.standard_normal(w.shape).astype(np.float32)
        q.grad = torch.tensor(g)
        opt.step()
        ta.functional.adamw_update_(p, ta.tensor(g), m, v, step=step, **HYPER)
    np.testing.assert_allclose(p.numpy(), q.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(v.numpy(), opt.state[q]["exp_avg_sq"].numpy(), rtol=1e-6)


def test_allocates_no_storage():
    p, g, m, v = ta.randn(512, 384), ta.randn(512, 384), ta.zeros(512, 384), ta.zeros(512, 384)
    made = []

    class Watch:
        def on_alloc(self, st):
            made.append(st.nbytes)

        def on_free(self, st):
            pass

    ledger_state.observers.append(Watch())
    try:
        ta.functional.adamw_update_(p, g, m, v, step=1, **HYPER)
    finally:
        ledger_state.observers.pop()
    assert made == []


def test_bad_input_is_refused_and_changes_nothing():
    p, m, v = ta.randn(4, 3), ta.zeros(4, 3), ta.zeros(4, 3)
    before = p.numpy().copy()
    with pytest.raises(ta.ShapeError, match=r"adamw_update_: grad has shape \(3, 4\), param "
                                             r"has \(4, 3\)"):
        ta.functional.adamw_update_(p, ta.randn(3, 4), m, v, step=1, **HYPER)
    with pytest.raises(TypeError, match="adamw_update_: exp_avg is float64, param is float32"):
        ta.functional.adamw_update_(p, ta.randn(4, 3), ta.zeros(4, 3, dtype=ta.float64), v,
                                    step=1, **HYPER)
    with pytest.raises(ValueError, match=r"adamw_update_: exp_avg and exp_avg_sq share "
                                          r"memory \(shape \(4, 3\)\)"):
        ta.functional.adamw_update_(p, ta.randn(4, 3), m, m, step=1, **HYPER)
    with pytest.raises(ValueError, match="adamw_update_: param and grad share memory"):
        ta.functional.adamw_update_(p, p[:], m, v, step=1, **HYPER)
    with pytest.raises(ValueError, match=r"adamw_update_: need .* betas=\(1.0, 0.95\)"):
        ta.functional.adamw_update_(p, ta.randn(4, 3), m, v, step=1,
                                    **{**HYPER, "beta1": 1.0})
    with pytest.raises(ValueError, match="adamw_update_: need .* lr=-0.1"):
        ta.functional.adamw_update_(p, ta.randn(4, 3), m, v, step=1, **{**HYPER, "lr": -0.1})
    with pytest.raises(ValueError, match="step counts from 1"):
        ta.functional.adamw_update_(p, ta.randn(4, 3), m, v, step=0, **HYPER)
    leaf = ta.randn(4, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="adamw_update_: .* under ta.no_grad"):
        ta.functional.adamw_update_(leaf, ta.randn(4, 3), m, v, step=1, **HYPER)
    with pytest.raises(TypeError, match="adamw_update_: grad must be a Tensor"):
        ta.functional.adamw_update_(p, before, m, v, step=1, **HYPER)
    np.testing.assert_array_equal(p.numpy(), before)
    assert not m.numpy().any() and not v.numpy().any()
