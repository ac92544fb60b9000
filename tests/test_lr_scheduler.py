"""nn.optim.lr_scheduler against torch.optim.lr_scheduler: the learning rates (and, for
OneCycleLR, the momenta) over 100 steps, two param groups, are torch's; state_dict and
load_state_dict resume a schedule mid-way as if it had run straight through."""

import copy
import warnings

import numpy as np
import pytest

import nn.optim as optim
import tinygrad_attn as ta

STEPS = 100


def _decay(epoch):
    return 0.95 ** epoch


def _shrink(epoch):
    return 0.98 if epoch % 3 else 1.0


CASES = {
    "StepLR": lambda s, o: s.StepLR(o, step_size=7, gamma=0.5),
    "MultiStepLR": lambda s, o: s.MultiStepLR(o, milestones=[10, 30, 30, 60], gamma=0.3),
    "ExponentialLR": lambda s, o: s.ExponentialLR(o, gamma=0.97),
    "CosineAnnealingLR": lambda s, o: s.CosineAnnealingLR(o, T_max=30, eta_min=1e-3),
    "LambdaLR": lambda s, o: s.LambdaLR(o, lr_lambda=_decay),
    "LambdaLR-per-group": lambda s, o: s.LambdaLR(o, lr_lambda=[_decay, _shrink]),
    "MultiplicativeLR": lambda s, o: s.MultiplicativeLR(o, lr_lambda=_shrink),
    "LinearLR": lambda s, o: s.LinearLR(o, start_factor=0.25, end_factor=0.9, total_iters=20),
    "ConstantLR": lambda s, o: s.ConstantLR(o, factor=0.5, total_iters=10),
    "PolynomialLR": lambda s, o: s.PolynomialLR(o, total_iters=50, power=2.0),
    "CosineAnnealingWarmRestarts": lambda s, o: s.CosineAnnealingWarmRestarts(
        o, T_0=10, T_mult=2, eta_min=0.01),
    "CosineAnnealingWarmRestarts-T_mult=1": lambda s, o: s.CosineAnnealingWarmRestarts(
        o, T_0=7),
    "OneCycleLR": lambda s, o: s.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=STEPS + 1),
    "OneCycleLR-linear-three-phase": lambda s, o: s.OneCycleLR(
        o, max_lr=0.8, epochs=10, steps_per_epoch=11, pct_start=0.25,
        anneal_strategy="linear", three_phase=True, div_factor=10.0),
    "CyclicLR": lambda s, o: s.CyclicLR(o, base_lr=[0.01, 0.02], max_lr=0.1, step_size_up=7,
                                        step_size_down=12),
    "CyclicLR-triangular2": lambda s, o: s.CyclicLR(o, base_lr=0.01, max_lr=0.1,
                                                    step_size_up=10, mode="triangular2"),
    "CyclicLR-exp_range": lambda s, o: s.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=6,
                                                  mode="exp_range", gamma=0.97,
                                                  base_momentum=0.5, max_momentum=0.95),
    "CyclicLR-scale_fn": lambda s, o: s.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=5,
                                                 scale_fn=_decay, scale_mode="iterations",
                                                 cycle_momentum=False),
    "SequentialLR": lambda s, o: s.SequentialLR(
        o, [s.LinearLR(o, start_factor=0.1, total_iters=10), s.CosineAnnealingLR(o, T_max=90)],
        milestones=[10]),
    "SequentialLR-three": lambda s, o: s.SequentialLR(
        o, [s.ConstantLR(o, factor=0.3, total_iters=5), s.ExponentialLR(o, gamma=0.95),
            s.StepLR(o, step_size=9, gamma=0.7)], milestones=[5, 40]),
    "ChainedScheduler": lambda s, o: s.ChainedScheduler(
        [s.ExponentialLR(o, gamma=0.99), s.StepLR(o, step_size=10, gamma=0.5),
         s.LinearLR(o, start_factor=0.5, total_iters=15)]),
}

PLATEAU = {
    "min-rel": dict(),
    "max-abs": dict(mode="max", threshold_mode="abs", threshold=0.05, patience=2),
    "min-abs-cooldown": dict(threshold_mode="abs", patience=1, cooldown=3, factor=0.5,
                             min_lr=[0.02, 0.001]),
    "max-rel-eps": dict(mode="max", patience=0, factor=0.9, eps=1e-3, min_lr=0.01),
}


def _metric(step):
    """A loss that falls, stalls, rises and falls again."""
    return 1.0 / (1 + step % 17) + 0.01 * (step // 17) + 0.001 * np.sin(step)


def _optimizer(lib, make_tensor, beta_optimizer):
    params = [make_tensor(), make_tensor()]
    groups = [{"params": params[:1]}, {"params": params[1:], "lr": 0.05}]
    if beta_optimizer:
        return lib.Adam(groups, lr=0.1)
    return lib.SGD(groups, lr=0.1, momentum=0.9)


def _pair(beta_optimizer=False):
    torch = pytest.importorskip("torch")
    ours = _optimizer(optim, lambda: ta.zeros(2, requires_grad=True), beta_optimizer)
    theirs = _optimizer(torch.optim, lambda: torch.zeros(2, requires_grad=True),
                        beta_optimizer)
    return torch, ours, theirs


def _momenta(opt):
    return [g["betas"][0] if "betas" in g else g["momentum"] for g in opt.param_groups]


def _run(scheduler, opt, steps, metric=None, start=0):
    """The lrs and momenta after each of `steps` epochs (optimizer.step, then the
    schedule's, as a training loop calls them)."""
    seen = []
    for step in range(start, start + steps):
        opt.step()
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric(step))
        seen.append((list(scheduler.get_last_lr()), _momenta(opt)))
    return seen


@pytest.mark.parametrize("name", list(CASES))
def test_lr_sequence_matches_torch(name):
    torch, ours, theirs = _pair(beta_optimizer=name in ("OneCycleLR", "CyclicLR"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notes on chaining order
        ref = CASES[name](torch.optim.lr_scheduler, theirs)
        expected = [(list(ref.get_last_lr()), _momenta(theirs))] + _run(ref, theirs, STEPS)
    sched = CASES[name](optim.lr_scheduler, ours)
    got = [(list(sched.get_last_lr()), _momenta(ours))] + _run(sched, ours, STEPS)
    np.testing.assert_allclose(np.array([g[0] for g in got]),
                               np.array([e[0] for e in expected]), rtol=1e-13, atol=0)
    np.testing.assert_allclose(np.array([g[1] for g in got]),
                               np.array([e[1] for e in expected]), rtol=1e-13, atol=0)
    assert [g["lr"] for g in ours.param_groups] == got[-1][0]
    assert len({round(lr[0], 12) for lr, _ in got}) > 1  # the schedule moved


@pytest.mark.parametrize("name", list(PLATEAU))
def test_reduce_lr_on_plateau_matches_torch(name):
    torch, ours, theirs = _pair()
    ref = torch.optim.lr_scheduler.ReduceLROnPlateau(theirs, **PLATEAU[name])
    sched = optim.lr_scheduler.ReduceLROnPlateau(ours, **PLATEAU[name])
    expected, got = _run(ref, theirs, STEPS, _metric), _run(sched, ours, STEPS, _metric)
    assert got == expected
    assert got[-1][0] != got[0][0]  # it reduced


@pytest.mark.parametrize("name", list(CASES) + ["ReduceLROnPlateau"])
def test_state_dict_resumes_mid_way(name):
    def make(opt):
        if name == "ReduceLROnPlateau":
            return optim.lr_scheduler.ReduceLROnPlateau(opt, patience=2, cooldown=1)
        return CASES[name](optim.lr_scheduler, opt)

    metric = _metric if name == "ReduceLROnPlateau" else None
    beta = name in ("OneCycleLR", "CyclicLR")
    straight_opt = _optimizer(optim, lambda: ta.zeros(2, requires_grad=True), beta)
    straight = _run(make(straight_opt), straight_opt, STEPS, metric)

    first_opt = _optimizer(optim, lambda: ta.zeros(2, requires_grad=True), beta)
    first = make(first_opt)
    head = _run(first, first_opt, 40, metric)
    saved_opt = copy.deepcopy(first_opt.state_dict())
    saved = copy.deepcopy(first.state_dict())
    assert "optimizer" not in saved

    # a fresh optimizer and schedule, then the saved states, as a resumed script does
    opt = _optimizer(optim, lambda: ta.zeros(2, requires_grad=True), beta)
    sched = make(opt)
    opt.load_state_dict(saved_opt)
    sched.load_state_dict(saved)
    tail = _run(sched, opt, STEPS - 40, metric, start=40)
    assert head + tail == straight


def test_resuming_needs_initial_lr_and_checks_arguments():
    opt = _optimizer(optim, lambda: ta.zeros(2, requires_grad=True), False)
    s = optim.lr_scheduler
    with pytest.raises(KeyError, match="initial_lr"):
        s.StepLR(opt, step_size=3, last_epoch=5)
    with pytest.raises(TypeError, match="is not an Optimizer"):
        s.StepLR(object(), step_size=3)
    with pytest.raises(ValueError, match="Expected 2 lr_lambdas, but got 1"):
        s.LambdaLR(opt, lr_lambda=[_decay])
    with pytest.raises(ValueError, match="Factor should be < 1.0."):
        s.ReduceLROnPlateau(opt, factor=1.0)
    with pytest.raises(ValueError, match="total_steps OR"):
        s.OneCycleLR(opt, max_lr=1.0)
    with pytest.raises(ValueError, match="expects all schedulers to belong to the same"):
        other = _optimizer(optim, lambda: ta.zeros(2, requires_grad=True), False)
        s.ChainedScheduler([s.StepLR(opt, 2), s.StepLR(other, 2)])
    with pytest.raises(ValueError, match="does not support `ReduceLROnPlateau`"):
        s.SequentialLR(opt, [s.StepLR(opt, 2), s.ReduceLROnPlateau(opt)], milestones=[3])
    sched = s.OneCycleLR(opt, max_lr=1.0, total_steps=2, cycle_momentum=False)
    sched.step()
    sched.step()
    with pytest.raises(ValueError, match="Tried to step 3 times"):
        sched.step()
