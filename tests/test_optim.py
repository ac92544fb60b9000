"""nn.optim and nn.utils against torch.optim / torch.nn.utils on the same float64 parameters
and gradients; in-place updates that allocate no parameter-sized Storage per step."""

import math

import numpy as np
import pytest

import nn.optim as optim
import nn.utils as nn_utils
import tinygrad_attn as ta
from tinygrad_attn.memory import state as ledger_state

SHAPES = [(4, 5), (5,), (3, 2, 2)]


def _torch():
    return pytest.importorskip("torch")


def _arrays(seed, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


def _params(arrays):
    return [ta.tensor(a.copy(), dtype=ta.float64, requires_grad=True) for a in arrays]


def _torch_params(arrays):
    torch = _torch()
    return [torch.tensor(a.copy(), dtype=torch.float64, requires_grad=True) for a in arrays]


def _set_grads(ours, theirs, grads):
    torch = _torch()
    for p, q, g in zip(ours, theirs, grads):
        p.grad = ta.tensor(g, dtype=ta.float64)
        q.grad = torch.tensor(g, dtype=torch.float64)


def _assert_close(ours, theirs, tol=1e-10):
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=tol, atol=tol)


def _run_against_torch(make_ours, make_theirs, steps=6, shapes=SHAPES):
    """Step both optimizers on identical params and gradients; compare after every step."""
    arrays = _arrays(0, shapes)
    ours, theirs = _params(arrays), _torch_params(arrays)
    opt, ref = make_ours(ours), make_theirs(theirs)
    for step in range(steps):
        _set_grads(ours, theirs, _arrays(100 + step, shapes))
        opt.step()
        ref.step()
        _assert_close(ours, theirs)
    return opt, ours


SGD_CASES = [
    dict(lr=0.1),
    dict(lr=0.1, weight_decay=0.05),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, weight_decay=0.01),
    dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01),
    dict(lr=0.05, momentum=0.9, nesterov=True),
    dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02),
]


@pytest.mark.parametrize("kw", SGD_CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in
                                                                  kw.items()))
def test_sgd_matches_torch(kw):
    torch = _torch()
    _run_against_torch(lambda ps: optim.SGD(ps, **kw),
                       lambda ps: torch.optim.SGD(ps, foreach=False, **kw))


ADAMW_CASES = [
    dict(),
    dict(lr=1e-2, weight_decay=0.1),
    dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.0),
    dict(lr=0.5, betas=(0.0, 0.5), weight_decay=0.3),
]


@pytest.mark.parametrize("kw", ADAMW_CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in
                                                                    kw.items()) or "defaults")
def test_adamw_matches_torch(kw):
    torch = _torch()
    _run_against_torch(lambda ps: optim.AdamW(ps, **kw),
                       lambda ps: torch.optim.AdamW(ps, foreach=False, **kw))


def test_param_groups_with_their_own_hyperparameters_match_torch():
    torch = _torch()

    def groups(ps, lib):
        return [{"params": ps[:1], "lr": 0.01, "weight_decay": 0.1},
                {"params": ps[1:], "lr": 0.001}]

    _run_against_torch(lambda ps: optim.AdamW(groups(ps, None), weight_decay=0.0),
                       lambda ps: torch.optim.AdamW(groups(ps, torch), weight_decay=0.0,
                                                    foreach=False))
    _run_against_torch(lambda ps: optim.SGD(groups(ps, None), lr=0.1, momentum=0.9),
                       lambda ps: torch.optim.SGD(groups(ps, torch), lr=0.1, momentum=0.9,
                                                  foreach=False))


def test_a_parameter_without_grad_is_skipped_like_torch():
    torch = _torch()
    arrays = _arrays(0)
    ours, theirs = _params(arrays), _torch_params(arrays)
    opt = optim.AdamW(ours, lr=0.1)
    ref = torch.optim.AdamW(theirs, lr=0.1, foreach=False)
    for step in range(3):
        _set_grads(ours, theirs, _arrays(100 + step))
        ours[1].grad, theirs[1].grad = None, None
        opt.step()
        ref.step()
    _assert_close(ours, theirs)
    np.testing.assert_array_equal(ours[1].detach().numpy(), arrays[1])
    assert ours[1] not in opt.state


@pytest.mark.parametrize("make", [
    lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True),
    lambda ps: optim.AdamW([{"params": ps[:1], "lr": 0.02}, {"params": ps[1:]}], lr=0.01),
], ids=["sgd", "adamw"])
def test_state_dict_round_trip_continues_identically(make):
    arrays = _arrays(0)
    ours = _params(arrays)
    opt = make(ours)
    for step in range(3):
        for p, g in zip(ours, _arrays(100 + step)):
            p.grad = ta.tensor(g, dtype=ta.float64)
        opt.step()

    # a second optimizer on copies of the parameters, given a deep copy of the state
    copies = [ta.tensor(p.detach().numpy().copy(), requires_grad=True) for p in ours]
    saved = opt.state_dict()
    assert sorted(saved["state"]) == [0, 1, 2]
    assert [g["params"] for g in saved["param_groups"]] in ([[0, 1, 2]], [[0], [1, 2]])
    cloned = {"param_groups": [dict(g) for g in saved["param_groups"]],
              "state": {i: {k: v.clone() if isinstance(v, ta.Tensor) else v
                            for k, v in s.items()} for i, s in saved["state"].items()}}
    resumed = make(copies)
    resumed.load_state_dict(cloned)
    for state in resumed.state.values():  # fresh buffers, not the ones passed in
        for v in state.values():
            if isinstance(v, ta.Tensor):
                assert v.untyped_storage().category == "optimizer_state"

    for step in range(3, 6):
        for a, b, g in zip(ours, copies, _arrays(100 + step)):
            a.grad = ta.tensor(g, dtype=ta.float64)
            b.grad = ta.tensor(g, dtype=ta.float64)
        opt.step()
        resumed.step()
        for a, b in zip(ours, copies):
            np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


def test_load_state_dict_checks_groups_and_shapes():
    ps = _params(_arrays(0))
    opt = optim.AdamW(ps)
    for p in ps:
        p.grad = ta.ones_like(p)
    opt.step()
    sd = opt.state_dict()
    with pytest.raises(ValueError, match="different number of parameter groups"):
        optim.AdamW([{"params": ps[:1]}, {"params": ps[1:]}]).load_state_dict(sd)
    other = _params(_arrays(0, [(5, 4), (5,), (3, 2, 2)]))
    with pytest.raises(ValueError, match="shape"):
        optim.AdamW(other).load_state_dict(sd)


class _BigAllocations:
    """A storage observer that records allocations of at least `threshold` bytes."""

    def __init__(self, threshold):
        self.threshold = threshold
        self.allocated = []
        self.live = set()

    def on_alloc(self, storage):
        if storage.nbytes >= self.threshold:
            self.allocated.append((storage.nbytes, storage.phase, storage.category))
            self.live.add(storage.id)

    def on_free(self, storage):
        self.live.discard(storage.id)


@pytest.mark.parametrize("make, state_buffers, temporaries", [
    (lambda ps: optim.SGD(ps, lr=0.1), 0, 0),
    (lambda ps: optim.SGD(ps, lr=0.1, weight_decay=0.1), 0, 0),
    (lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.1), 1, 0),
    (lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1), 1, 0),
    # AdamW: one fused ta.functional.adamw_update_ call per parameter, which runs through a
    # block-sized scratch buffer: no parameter-sized Storage
    (lambda ps: optim.AdamW(ps, lr=0.1, weight_decay=0.1), 2, 0),
    (lambda ps: optim.Adam(ps, lr=0.1), 2, 0),
    # the rest: the temporaries their docstrings count (the gradient read is one of them
    # when maximize or a coupled weight decay is set)
    (lambda ps: optim.Adam(ps, lr=0.1, weight_decay=0.1), 2, 1),
    (lambda ps: optim.AdamW(ps, lr=0.1, amsgrad=True), 3, 6),
    (lambda ps: optim.Adadelta(ps, weight_decay=0.1, maximize=True), 2, 7),
    (lambda ps: optim.RMSprop(ps, centered=True), 2, 6),
    (lambda ps: optim.RMSprop(ps, momentum=0.9), 2, 3),
    (lambda ps: optim.Adagrad(ps), 1, 3),
    (lambda ps: optim.NAdam(ps), 2, 6),
    (lambda ps: optim.Adamax(ps, maximize=True), 2, 5),
    (lambda ps: optim.Rprop(ps), 2, 5),
    (lambda ps: optim.ASGD(ps, t0=-1, weight_decay=0.1), 1, 2),  # averaging from step 1
], ids=["sgd", "sgd-wd", "sgd-momentum", "sgd-nesterov", "adamw", "adam", "adam-wd",
        "amsgrad", "adadelta", "rmsprop-centered", "rmsprop-momentum", "adagrad", "nadam",
        "adamax", "rprop", "asgd"])
def test_steps_after_the_first_allocate_no_parameter_sized_storage(make, state_buffers,
                                                                   temporaries):
    """Per parameter and step (after the first): `temporaries` parameter-sized Storages,
    all freed within the step; the state is `state_buffers` parameter-sized buffers."""
    params = [ta.randn(64, 32, dtype=ta.float64, requires_grad=True) for _ in range(3)]
    nbytes = params[0].nbytes
    grads = [[ta.randn(64, 32, dtype=ta.float64) for _ in params] for _ in range(5)]
    opt = make(params)
    for p, g in zip(params, grads[0]):
        p.grad = g
    opt.step()  # the first step creates the state
    state_bytes = sum(v.nbytes for s in opt.state.values() for v in s.values()
                      if isinstance(v, ta.Tensor))
    assert all(v.untyped_storage().category == "optimizer_state"
               for s in opt.state.values() for v in s.values() if isinstance(v, ta.Tensor))
    live_before = ta.memory.live_bytes()

    watch = _BigAllocations(nbytes)
    ledger_state.observers.append(watch)
    try:
        for step_grads in grads[1:]:
            for p, g in zip(params, step_grads):
                p.grad = g
            storages = [p.untyped_storage() for p in params]
            opt.step()
            assert [p.untyped_storage() for p in params] == storages  # updated in place
            assert not watch.live, "a parameter-sized temporary outlived the step"
    finally:
        ledger_state.observers.remove(watch)

    assert len(watch.allocated) == temporaries * len(params) * 4, watch.allocated
    assert all(phase == "optimizer" for _, phase, _ in watch.allocated)
    assert ta.memory.live_bytes() == live_before
    assert state_bytes == state_buffers * len(params) * nbytes


def test_zero_grad():
    ps = _params(_arrays(0))
    opt = optim.SGD(ps, lr=0.1)
    for p in ps:
        p.grad = ta.ones_like(p)
    grads = [p.grad for p in ps]
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is g and not g.numpy().any() for p, g in zip(ps, grads))
    opt.zero_grad()
    assert all(p.grad is None for p in ps)


def test_configure_adamw_groups_like_nanogpt():
    named = {
        "wte.weight": ta.randn(10, 4, requires_grad=True),
        "h.0.ln_1.weight": ta.ones(4, requires_grad=True),
        "h.0.attn.c_attn.weight": ta.randn(12, 4, requires_grad=True),
        "h.0.attn.c_attn.bias": ta.zeros(12, requires_grad=True),
        "frozen": ta.randn(3, 3),
    }
    named["lm_head.weight"] = named["wte.weight"]  # tied: optimized once
    opt = optim.configure_adamw(named, weight_decay=0.1, lr=6e-4, betas=(0.9, 0.95))
    decay, no_decay = opt.param_groups
    assert [p.shape for p in decay["params"]] == [(10, 4), (12, 4)]
    assert [p.shape for p in no_decay["params"]] == [(4,), (12,)]
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    assert decay["lr"] == 6e-4 and decay["betas"] == (0.9, 0.95)
    # also takes (name, param) pairs, or anything with named_parameters()
    opt2 = optim.configure_adamw(list(named.items()), 0.1, 6e-4, (0.9, 0.95))
    assert [len(g["params"]) for g in opt2.param_groups] == [2, 2]


def test_bad_arguments_are_clear_errors():
    p = ta.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="more than one"):
        optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    with pytest.raises(ValueError, match="Nesterov momentum requires"):
        optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1: 1.0"):
        optim.AdamW([p], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="can't optimize a non-leaf Tensor"):
        optim.SGD([p * 2], lr=0.1)


# ---------------------------------------------------------------------- nn.utils
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    torch = _torch()
    arrays = _arrays(0)
    ours, theirs = _params(arrays), _torch_params(arrays)
    _set_grads(ours, theirs, _arrays(1))
    ours[0].grad = ours[0].grad.T.contiguous().T  # a non-contiguous gradient too
    total = nn_utils.clip_grad_norm_(ours, max_norm, norm_type)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type, foreach=False)
    assert isinstance(total, ta.Tensor) and total.shape == ()
    assert total.item() == pytest.approx(expected.item(), rel=1e-12)
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_clip_grad_norm_skips_missing_grads_and_keeps_grad_storage():
    ps = _params(_arrays(0))
    ps[0].grad = ta.full((4, 5), 3.0, dtype=ta.float64)
    storage = ps[0].grad.untyped_storage()
    total = nn_utils.clip_grad_norm_(ps, max_norm=1.0)
    assert total.item() == pytest.approx(3.0 * math.sqrt(20))
    assert ps[0].grad.untyped_storage() is storage
    assert math.sqrt((ps[0].grad.numpy() ** 2).sum()) == pytest.approx(1.0, rel=1e-5)
    assert nn_utils.clip_grad_norm_(ps[1:], 1.0).item() == 0.0


def _nanogpt_get_lr(it, learning_rate, warmup_iters, lr_decay_iters, min_lr):
    # nanoGPT train.py, verbatim
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def test_cosine_lr_schedule():
    max_lr, min_lr, warmup, total = 1e-3, 1e-4, 10, 110
    lr = [nn_utils.cosine_lr(s, max_lr, warmup, total, min_lr) for s in range(130)]
    assert lr == [_nanogpt_get_lr(s, max_lr, warmup, total, min_lr) for s in range(130)]
    assert lr[0] == pytest.approx(max_lr / 11)
    assert lr[9] == pytest.approx(max_lr * 10 / 11)
    assert lr[10] == pytest.approx(max_lr)  # warmup done: the peak
    assert lr[60] == pytest.approx((max_lr + min_lr) / 2)  # halfway through the decay
    assert lr[110] == pytest.approx(min_lr) and lr[129] == min_lr
    assert all(a >= b for a, b in zip(lr[10:], lr[11:]))  # monotone after warmup
    assert nn_utils.cosine_lr(5, 1.0, 0, 5, 0.1) == pytest.approx(0.1)  # no warmup


@pytest.mark.parametrize("norm_type", [0.0, -math.inf, "inf", 2])
def test_clip_grad_norm_other_norms_match_torch(norm_type):
    torch = _torch()
    arrays = _arrays(0)
    ours, theirs = _params(arrays), _torch_params(arrays)
    grads = _arrays(3)
    grads[1][2] = 0.0  # a zero for the 0-"norm" to skip
    _set_grads(ours, theirs, grads)
    total = nn_utils.clip_grad_norm_(ours, 0.5, norm_type, foreach=True)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 0.5, norm_type, foreach=False)
    assert total.item() == pytest.approx(expected.item(), rel=1e-12)
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_the_deprecated_clip_grad_norm_warns_and_clips():
    ours = _params(_arrays(0))
    for p, g in zip(ours, _arrays(1)):
        p.grad = ta.tensor(g, dtype=ta.float64)
    with pytest.warns(FutureWarning, match="deprecated in favor of"):
        total = nn_utils.clip_grad_norm(ours, 0.5)
    assert total.item() > 0.5
    assert nn_utils.get_total_norm([p.grad for p in ours]).item() == pytest.approx(0.5)


def test_clip_grad_norm_refuses_a_nonfinite_norm_when_asked():
    torch = _torch()
    ours, theirs = _params(_arrays(0)), _torch_params(_arrays(0))
    grads = _arrays(1)
    grads[0][0, 0] = math.inf
    _set_grads(ours, theirs, grads)
    with pytest.raises(RuntimeError) as mine:
        nn_utils.clip_grad_norm_(ours, 1.0, error_if_nonfinite=True)
    with pytest.raises(RuntimeError) as ref:
        torch.nn.utils.clip_grad_norm_(theirs, 1.0, error_if_nonfinite=True)
    assert str(mine.value) == str(ref.value)
    assert math.isinf(nn_utils.clip_grad_norm_(ours, 1.0).item())  # scaled by it otherwise
    assert nn_utils.clip_grad_norm_([ta.zeros(2, requires_grad=True)], 1.0).item() == 0.0


def test_get_total_norm_and_clip_grads_with_norm_match_torch():
    torch = _torch()
    arrays = _arrays(0)
    ours, theirs = _params(arrays), _torch_params(arrays)
    _set_grads(ours, theirs, _arrays(4))
    total = nn_utils.get_total_norm([p.grad for p in ours], 3.0)
    expected = torch.nn.utils.get_total_norm([q.grad for q in theirs], 3.0)
    assert total.item() == pytest.approx(expected.item(), rel=1e-12)
    nn_utils.clip_grads_with_norm_(ours, 0.25, total)
    torch.nn.utils.clip_grads_with_norm_(theirs, 0.25, expected)
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_clip_grad_value_matches_torch():
    torch = _torch()
    arrays = _arrays(0)
    ours, theirs = _params(arrays), _torch_params(arrays)
    _set_grads(ours, theirs, _arrays(5))
    assert nn_utils.clip_grad_value_(ours, 0.3) is None
    torch.nn.utils.clip_grad_value_(theirs, 0.3)
    for p, q in zip(ours, theirs):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
    assert max(abs(p.grad.numpy()).max() for p in ours) == 0.3


def test_parameters_to_vector_and_back_match_torch():
    torch = _torch()
    arrays = _arrays(0)
    ours, theirs = _params(arrays), _torch_params(arrays)
    vec = nn_utils.parameters_to_vector(ours)
    np.testing.assert_array_equal(
        vec.detach().numpy(), torch.nn.utils.parameters_to_vector(theirs).detach().numpy())
    assert vec.shape == (sum(a.size for a in arrays),)
    vec.sum().backward()  # the vector is differentiable in the parameters
    assert all((p.grad.numpy() == 1).all() for p in ours)
    new = np.arange(vec.shape[0], dtype=np.float64)
    nn_utils.vector_to_parameters(ta.tensor(new), ours)
    torch.nn.utils.vector_to_parameters(torch.tensor(new), theirs)
    for p, q in zip(ours, theirs):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
    with pytest.raises(TypeError, match="expected torch.Tensor"):
        nn_utils.vector_to_parameters(new, ours)
    with pytest.raises(RuntimeError, match="vector_to_parameters: vec has shape"):
        nn_utils.vector_to_parameters(ta.zeros(3, dtype=ta.float64), ours)
