"""Every nn.optim optimizer, option by option, against torch.optim: the same float64
parameters and gradients give the same trajectory over 20 steps; the state_dict has torch's
structure, loads from torch's own state_dict and resumes a run exactly."""

import copy

import numpy as np
import pytest

import nn.optim as optim
import tinygrad_attn as ta

SHAPES = [(4, 3), (5,)]
STEPS = 20

CASES = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, weight_decay=0.05, maximize=True)),
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.2, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02, maximize=True)),
    ("Adam", dict(lr=1e-2)),
    ("Adam", dict(lr=1e-2, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)),
    ("Adam", dict(lr=1e-2, amsgrad=True)),
    ("Adam", dict(lr=1e-2, amsgrad=True, maximize=True, weight_decay=0.1)),
    ("Adam", dict(lr=1e-2, maximize=True, foreach=True)),
    ("AdamW", dict(lr=1e-2)),
    ("AdamW", dict(lr=1e-2, weight_decay=0.3, amsgrad=True, fused=True)),
    ("AdamW", dict(lr=1e-2, maximize=True, capturable=True)),
    ("Adadelta", dict()),
    ("Adadelta", dict(lr=0.5, rho=0.7, eps=1e-4, weight_decay=0.1, maximize=True)),
    ("RMSprop", dict()),
    ("RMSprop", dict(lr=1e-2, alpha=0.9, centered=True)),
    ("RMSprop", dict(lr=1e-2, momentum=0.8, weight_decay=0.1)),
    ("RMSprop", dict(lr=1e-2, momentum=0.5, centered=True, maximize=True, foreach=True)),
    ("Adagrad", dict()),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.5,
                     eps=1e-8, maximize=True)),
    ("NAdam", dict()),
    ("NAdam", dict(lr=1e-2, weight_decay=0.1, momentum_decay=0.01)),
    ("NAdam", dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True, maximize=True)),
    ("RAdam", dict(lr=1e-2)),
    ("RAdam", dict(lr=1e-2, betas=(0.9, 0.9), weight_decay=0.1)),
    ("RAdam", dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True, maximize=True)),
    ("Adamax", dict()),
    ("Adamax", dict(lr=1e-2, weight_decay=0.1, maximize=True)),
    ("Rprop", dict()),
    ("Rprop", dict(lr=0.05, etas=(0.3, 1.5), step_sizes=(1e-3, 0.2), maximize=True)),
    ("ASGD", dict(lr=0.05)),
    ("ASGD", dict(lr=0.05, lambd=1e-2, alpha=0.5, t0=5, weight_decay=0.1, maximize=True)),
]
IDS = [f"{name}-" + (",".join(f"{k}={v}" for k, v in kw.items()) or "defaults")
       for name, kw in CASES]
FLAGS = ("foreach", "fused", "capturable")  # ours accepts them; torch runs its plain path


def _arrays(seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in SHAPES]


def _ours(arrays):
    return [ta.tensor(a, dtype=ta.float64, requires_grad=True) for a in arrays]


def _set_grads(params, step):
    for i, (p, g) in enumerate(zip(params, _arrays(100 + step))):
        grad = ta.tensor(g, dtype=ta.float64)
        # the first parameter's gradient is a non-contiguous view
        p.grad = ta.tensor(g.T.copy(), dtype=ta.float64).T if i == 0 else grad


def _values(params):
    return [p.detach().numpy().copy() for p in params]


def _from_torch(state_dict, torch):
    """torch's optimizer state_dict with its tensors as ours (what a converted checkpoint
    holds)."""
    def convert(value):
        return ta.tensor(value.detach().numpy()) if torch.is_tensor(value) else value
    return {"state": {i: {k: convert(v) for k, v in s.items()}
                      for i, s in state_dict["state"].items()},
            "param_groups": copy.deepcopy(state_dict["param_groups"])}


@pytest.mark.parametrize("name, kw", CASES, ids=IDS)
def test_trajectory_and_state_dict_match_torch(name, kw):
    torch = pytest.importorskip("torch")
    torch_kw = {k: v for k, v in kw.items() if k not in FLAGS}
    arrays = _arrays(0)
    ours = _ours(arrays)
    theirs = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    opt = getattr(optim, name)(ours, **kw)
    ref = getattr(torch.optim, name)(theirs, foreach=False, **torch_kw)
    assert set(opt.defaults) == set(ref.defaults)
    resumed = None
    for step in range(STEPS):
        if step == STEPS // 2:
            # torch's state_dict, converted, resumes torch's run in ours
            sd, ref_sd = opt.state_dict(), ref.state_dict()
            assert sorted(sd["state"]) == sorted(ref_sd["state"])
            for i, entries in ref_sd["state"].items():
                assert sorted(sd["state"][i]) == sorted(entries)
                for key, value in entries.items():
                    mine = sd["state"][i][key]
                    assert str(mine.dtype).split(".")[-1] == str(value.dtype).split(".")[-1]
                    assert tuple(mine.shape) == tuple(value.shape), key
            for group, ref_group in zip(sd["param_groups"], ref_sd["param_groups"]):
                assert set(group) == set(ref_group)
            clones = _ours([q.detach().numpy() for q in theirs])
            resumed = getattr(optim, name)(clones, **kw)
            resumed.load_state_dict(_from_torch(ref_sd, torch))
        _set_grads(ours, step)
        for q, g in zip(theirs, _arrays(100 + step)):
            q.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        ref.step()
        expected = [q.detach().numpy() for q in theirs]
        for got, want in zip(_values(ours), expected):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)
        if resumed is not None:
            _set_grads(clones, step)
            resumed.step()
            for got, want in zip(_values(clones), expected):
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)
    # and the values moved: a trajectory, not a fixed point
    assert not np.allclose(_values(ours)[0], arrays[0])


@pytest.mark.parametrize("name, kw", CASES[::3], ids=IDS[::3])
def test_state_dict_round_trip_resumes_exactly(name, kw):
    ours = _ours(_arrays(0))
    opt = getattr(optim, name)(ours, **kw)
    for step in range(4):
        _set_grads(ours, step)
        opt.step()
    saved = opt.state_dict()
    for entries in saved["state"].values():
        step = entries.get("step")
        assert step is None or (step.dtype == ta.float32 and step.shape == ()
                                and step.item() == 4)
    snapshot = {"state": {i: {k: v.clone() for k, v in s.items()}
                          for i, s in saved["state"].items()},
                "param_groups": copy.deepcopy(saved["param_groups"])}
    copies = _ours(_values(ours))
    resumed = getattr(optim, name)(copies, **kw)
    resumed.load_state_dict(snapshot)
    assert resumed.param_groups[0]["params"] == copies[:len(resumed.param_groups[0]["params"])]
    for step in range(4, 8):
        _set_grads(ours, step)
        _set_grads(copies, step)
        opt.step()
        resumed.step()
    for a, b in zip(_values(ours), _values(copies)):
        np.testing.assert_array_equal(a, b)


def test_load_state_dict_casts_to_the_parameters_dtype_and_copies():
    ours = _ours(_arrays(0))
    opt = optim.Adam(ours, lr=0.1)
    _set_grads(ours, 0)
    opt.step()
    sd = opt.state_dict()
    half = [ta.tensor(a, dtype=ta.float32, requires_grad=True) for a in _arrays(0)]
    other = optim.Adam(half, lr=0.5)
    other.load_state_dict(sd)
    assert other.param_groups[0]["lr"] == 0.1  # the saved hyperparameters win
    state = other.state[half[0]]
    assert state["exp_avg"].dtype == ta.float32 and state["step"] == 1
    assert state["exp_avg"].untyped_storage() is not sd["state"][0]["exp_avg"].untyped_storage()
    sd["param_groups"][0]["lr"] = 7.0  # the loaded groups are copies
    assert other.param_groups[0]["lr"] == 0.1


BAD = [
    ("SGD", dict(lr=-1), "Invalid learning rate: -1"),
    ("SGD", dict(momentum=-0.5), "Invalid momentum value: -0.5"),
    ("SGD", dict(weight_decay=-1), "Invalid weight_decay value: -1"),
    ("SGD", dict(nesterov=True), "Nesterov momentum requires a momentum and zero dampening"),
    ("Adam", dict(eps=-1), "Invalid epsilon value: -1"),
    ("Adam", dict(betas=(1.0, 0.9)), "Invalid beta parameter at index 0: 1.0"),
    ("AdamW", dict(betas=(0.9, -0.1)), "Invalid beta parameter at index 1: -0.1"),
    ("Adadelta", dict(rho=1.5), "Invalid rho value: 1.5"),
    ("RMSprop", dict(alpha=-1), "Invalid alpha value: -1"),
    ("Adagrad", dict(lr_decay=-1), "Invalid lr_decay value: -1"),
    ("Adagrad", dict(initial_accumulator_value=-1),
     "Invalid initial_accumulator_value value: -1"),
    ("NAdam", dict(momentum_decay=-1), "Invalid momentum_decay value: -1"),
    ("RAdam", dict(lr=-0.5), "Invalid learning rate: -0.5"),
    ("Adamax", dict(weight_decay=-2), "Invalid weight_decay value: -2"),
]


@pytest.mark.parametrize("name, kw, message", BAD, ids=[f"{n}-{m}" for n, _, m in BAD])
def test_bad_arguments_raise_torchs_errors(name, kw, message):
    torch = pytest.importorskip("torch")
    for lib, params in ((optim, _ours(_arrays(0))), (torch.optim, [torch.zeros(2)])):
        with pytest.raises(ValueError) as info:
            getattr(lib, name)(params, **kw)
        assert str(info.value) == message, lib


def test_bad_parameter_lists_raise_torchs_errors():
    p = _ours(_arrays(0))
    with pytest.raises(ValueError, match="optimizer got an empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="some parameters appear in more than one"):
        optim.SGD([{"params": p}, {"params": p[:1]}])
    with pytest.raises(ValueError, match="can't optimize a non-leaf Tensor"):
        optim.SGD([p[0] * 2])
    with pytest.raises(TypeError, match="should be an iterable of Tensors or dicts"):
        optim.SGD(p[0])
    with pytest.raises(TypeError, match="ordered collections"):
        optim.SGD([{"params": set(p)}])
    with pytest.raises(RuntimeError, match="differentiable=True is not supported"):
        optim.Adam(p, differentiable=True)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "Adagrad", "RMSprop"])
def test_repr_and_groups_are_torchs(name):
    torch = pytest.importorskip("torch")
    ours = getattr(optim, name)([{"params": _ours(_arrays(0))[:1]},
                                 {"params": _ours(_arrays(1))[1:], "lr": 0.5}], lr=0.25)
    theirs = getattr(torch.optim, name)([{"params": [torch.zeros(2, requires_grad=True)]},
                                         {"params": [torch.zeros(3, requires_grad=True)],
                                          "lr": 0.5}], lr=0.25)
    assert repr(ours) == repr(theirs)
    ours.add_param_group({"params": _ours(_arrays(2))[:1], "weight_decay": 0.125})
    theirs.add_param_group({"params": [torch.zeros(4, requires_grad=True)],
                            "weight_decay": 0.125})
    assert repr(ours) == repr(theirs)
    assert ours.defaults == theirs.defaults


def test_step_runs_the_closure_with_grad_and_the_hooks_in_order():
    w = ta.tensor([1.0, -2.0], dtype=ta.float64, requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    calls = []
    pre = opt.register_step_pre_hook(lambda o, args, kwargs: calls.append(("pre", o)))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append(("post", o)))

    def closure():
        calls.append(("closure", ta.is_grad_enabled()))
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss

    with ta.no_grad():  # the closure still records: step enables grad for it
        loss = opt.step(closure)
    assert loss.item() == 5.0
    assert calls == [("pre", opt), ("closure", True), ("post", opt)]
    np.testing.assert_allclose(w.detach().numpy(), [0.8, -1.6])  # w - 0.1 * 2w
    pre.remove()
    calls.clear()
    assert opt.step() is None
    assert [c[0] for c in calls] == ["post"]


def test_a_user_optimizer_subclasses_the_base_as_in_torch():
    class SignSGD(optim.Optimizer):
        def __init__(self, params, lr=0.01):
            super().__init__(params, dict(lr=lr))

        def step(self, closure=None):
            with ta.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            p.sub_(p.grad.sign() * group["lr"])
                            self.state[p]["steps"] = self.state[p].get("steps", 0) + 1

    w = ta.tensor([1.0, -2.0, 3.0], requires_grad=True)
    opt = SignSGD([w], lr=0.5)
    (w * w).sum().backward()
    opt.step()
    np.testing.assert_allclose(w.detach().numpy(), [0.5, -1.5, 2.5])
    assert opt.state_dict()["state"] == {0: {"steps": 1}}
    scheduler = optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scheduler.step()
    assert opt.param_groups[0]["lr"] == 0.25 and opt.param_groups[0]["initial_lr"] == 0.5


DEVICE_CASES = [("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1)),
                ("Adam", dict(lr=0.1, amsgrad=True, maximize=True)),
                ("AdamW", dict(lr=0.1)), ("Adadelta", {}), ("RMSprop", dict(centered=True)),
                ("Adagrad", {}), ("NAdam", {}), ("RAdam", {}), ("Adamax", {}), ("Rprop", {}),
                ("ASGD", dict(t0=1))]


def test_every_optimizer_runs_on_the_device_as_on_the_cpu(device):
    """The state lives on the parameter's device; a CPU state_dict loads onto it."""
    for name, kw in DEVICE_CASES:
        results = []
        for where in ("cpu", device):
            params = [p.to(where).detach().requires_grad_() for p in _ours(_arrays(0))]
            opt = getattr(optim, name)(params, **kw)
            for step in range(3):
                for p, g in zip(params, _arrays(100 + step)):
                    p.grad = ta.tensor(g, dtype=ta.float64).to(where)
                opt.step()
            for state in opt.state.values():
                for value in state.values():
                    if isinstance(value, ta.Tensor):
                        assert str(value.device).startswith(where), (name, value.device)
            results.append((_values([p.to("cpu") for p in params]), opt.state_dict()))
        (cpu_values, cpu_state), (device_values, _) = results
        for a, b in zip(cpu_values, device_values):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14, err_msg=name)
        moved = [p.to(device).detach().requires_grad_() for p in _ours(_arrays(0))]
        again = getattr(optim, name)(moved, **kw)
        again.load_state_dict(cpu_state)
        for state in again.state.values():
            for value in state.values():
                if isinstance(value, ta.Tensor):
                    assert str(value.device).startswith(device), name
