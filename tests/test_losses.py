"""ops/losses.py, cross_entropy's extensions and nn/losses.py against torch.

ROWS is the table a conformance check reads (see tests/rows_vs_torch.py): every loss in each
reduction, on 0-d, empty, transposed, sliced and broadcast inputs, in float32 and float64,
with its keyword arguments, and the errors torch raises for bad shapes and values.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from rows_vs_torch import Call, T, cases, run_case

import nn
import tinygrad_attn as ta

F32, F64 = "float32", "float64"
REDUCTIONS = ("mean", "sum", "none")


def _pointwise(td="real", kwargs=({},), dtypes=(F32, F64)):
    rows = [Call((T((3, 4), d), T((3, 4), d, domain=td)), {"reduction": r, **kw}, where="F")
            for d in dtypes for r in REDUCTIONS for kw in kwargs]
    rows += [
        Call((T((3, 4), F64, "t"), T((3, 4), F64, "s", td)), where="F"),
        Call((T((), F64), T((), F64, domain=td)), where="F"),
        Call((T((0, 3), F32), T((0, 3), F32, domain=td)), where="F"),
        Call((T((0, 3), F32), T((0, 3), F32, domain=td)), {"reduction": "sum"}, where="F"),
        Call((T((3, 4), F64, "e"), T((3, 4), F64, domain=td)), {"reduction": "none"},
             where="F"),
        Call((T((3, 4), F32), T((3, 4), F32)), {"reduction": "avg"}, where="F",
             raises=ValueError),
        Call((T((3, 4), F32), T((3, 2), F32)), where="F", raises=ta.ShapeError,
             torch_raises=RuntimeError),
    ]
    return rows


F16, I64, B = "float16", "int64", "bool"


def _mixed(name, domain="real", grad=True):
    """Rows with the two operands of different dtypes: torch's result dtype per loss."""
    def call(a, b, raises=None, b_shape=(3, 4)):
        # torch computes some terms in an operand's own dtype (the target's log in kl_div,
        # log_sigmoid of a float32 input), the engine all in the promoted one
        rtol = 2e-3 if F16 in (a, b) else 1e-6 if {a, b} == {F32, F64} else None
        return Call((T((3, 4), a, grad=grad), T(b_shape, b, domain=domain, grad=grad)),
                    where="F", raises=raises, rtol=rtol)
    if name in ("mse_loss", "l1_loss", "smooth_l1_loss"):  # promoted, a 0-d target too
        return [call(F32, F64), call(F64, F32), call(F16, F32), call(F32, I64),
                call(I64, F32), call(F32, F64, b_shape=()), call(F16, F64, b_shape=()),
                call(F32, B, RuntimeError if name == "l1_loss" else None),
                call(I64, I64, RuntimeError)]
    if name == "huber_loss":  # computed promoted, returned in the input's dtype
        return [call(F32, F64), call(F64, F32), call(F16, F32), call(F32, I64),
                call(F32, F64, b_shape=()), call(F32, B), call(I64, F32, RuntimeError)]
    if name == "kl_div":  # promoted (a 0-d target as a 0-d tensor); integers raise
        return [call(F32, F64), call(F64, F32), call(F16, F32), call(F32, F64, b_shape=()),
                call(F32, I64, RuntimeError), call(I64, F32, RuntimeError)]
    if name == "binary_cross_entropy":  # no promotion at all
        return [call(F32, F64, RuntimeError), call(F64, F32, RuntimeError)]
    # with logits: the target's dtype, computed promoted; an integer target raises
    return [call(F32, F64), call(F64, F32), call(F16, F32), call(F32, I64, RuntimeError),
            call(F32, B, RuntimeError), call(I64, F32, RuntimeError)]


ROWS = {
    "mse_loss": _pointwise(),
    "l1_loss": _pointwise(),
    "smooth_l1_loss": _pointwise(kwargs=({}, {"beta": 0.5}, {"beta": 0.0})),
    "huber_loss": _pointwise(kwargs=({}, {"delta": 0.3})),
    "kl_div": _pointwise("positive") + [
        Call((T((3, 4), F64), T((3, 4), F64)), {"log_target": True, "reduction": r}, where="F")
        for r in REDUCTIONS + ("batchmean",)] + [
        Call((T((3, 4), F32), T((3, 4), F32, domain="positive")), {"reduction": "batchmean"},
             where="F")],
    "binary_cross_entropy": [
        Call((T((3, 4), d, domain="prob"), T((3, 4), d, domain="prob")), {"reduction": r},
             where="F") for d in (F32, F64) for r in REDUCTIONS] + [
        Call((T((3, 4), F64, "t", "prob"), T((3, 4), F64, "s", "prob"), T((4,), F64,
                                                                          domain="positive",
                                                                          grad=False)),
             where="F"),
        Call((T((), F64, domain="prob"), T((), F64, domain="prob")), where="F"),
        Call((T((0, 2), F32, domain="prob"), T((0, 2), F32, domain="prob")), where="F"),
        Call((T((3, 1), F32, domain="prob"), T((3,), F32, domain="prob")), where="F",
             raises=ValueError),
        Call((T((3,), F32, domain="positive"), T((3,), F32, domain="prob")), where="F",
             raises=RuntimeError)],
    "binary_cross_entropy_with_logits": [
        Call((T((3, 4), d), T((3, 4), d, domain="prob")), {"reduction": r}, where="F")
        for d in (F32, F64) for r in REDUCTIONS] + [
        Call((T((3, 4), F64, "t"), T((3, 4), F64, "s", "prob"),
              T((3, 1), F64, domain="positive", grad=False)), where="F"),
        Call((T((3, 4), F64), T((3, 4), F64, domain="prob")),
             {"pos_weight": None, "reduction": "sum"}, where="F"),
        Call((T((), F64), T((), F64, domain="prob")), where="F"),
        Call((T((0, 2), F32), T((0, 2), F32, domain="prob")), where="F"),
        Call((T((3, 1), F32), T((3,), F32, domain="prob")), where="F", raises=ValueError)],
}
for _name, _domain in (("mse_loss", "real"), ("l1_loss", "real"), ("smooth_l1_loss", "real"),
                       ("huber_loss", "real"), ("kl_div", "positive"),
                       ("binary_cross_entropy", "prob"),
                       ("binary_cross_entropy_with_logits", "prob")):
    # torch's huber_loss backward fails on mixed dtypes: its rows compare values only
    ROWS[_name] += _mixed(_name, _domain, grad=_name != "huber_loss")


def _class_rows(name):
    rows = []
    for r in REDUCTIONS:
        rows += [
            Call((T((5, 4), F32, "t"), T((5,), "int64", domain="positive")),
                 {"reduction": r}, where="F", name=name),
            Call((T((5, 4), F64, "s"), T((5,), "int64", domain="positive"),
                  T((4,), F64, domain="positive", grad=False)),
                 {"reduction": r, "ignore_index": 2}, where="F", name=name),
            Call((T((2, 4, 3), F64), T((2, 3), "int64", domain="positive")),
                 {"reduction": r}, where="F", name=name),
            Call((T((4,), F64), T((), "int64", domain="positive")), {"reduction": r},
                 where="F", name=name),
        ]
    rows += [Call((T((0, 4), F32), T((0,), "int64")), {"reduction": "sum"}, where="F",
                  name=name),
             Call((T((0, 4), F32), T((0,), "int64")), where="F", name=name),  # mean: nan
             Call((T((5, 4), F32), T((4,), "int64")), where="F", name=name,
                  raises=ta.ShapeError, torch_raises=(ValueError, RuntimeError)),
             Call((T((5, 4), F32), T((5,), F32)), where="F", name=name,
                  raises=RuntimeError)]
    return rows



ROWS["nll_loss"] = [c for c in _class_rows("nll_loss")
                    if not (c.raises and c.args[1].dtype == F32)] + [
    # no promotion: the weight must have the input's dtype
    Call((T((5, 4), F32), T((5,), "int64", domain="positive"),
          T((4,), F64, domain="positive", grad=False)), where="F", raises=RuntimeError)]
ROWS["cross_entropy"] = [c for c in _class_rows("cross_entropy") if not c.raises] + [
    Call((T((5, 4), F64, "t"), T((5,), "int64", domain="positive")),
         {"label_smoothing": s, "reduction": r}, where="F")
    for s in (0.1, 0.7) for r in REDUCTIONS] + [
    Call((T((5, 4), F64), T((5,), "int64", domain="positive"),
          T((4,), F64, domain="positive", grad=False)),
         {"label_smoothing": 0.2, "reduction": r, "ignore_index": 1}, where="F")
    for r in REDUCTIONS] + [
    Call((T((5, 4), d, "s"), T((5, 4), d, domain="prob")), {"reduction": r}, where="F")
    for d in (F32, F64) for r in REDUCTIONS] + [
    Call((T((5, 4), F64), T((5, 4), F64, domain="prob"),
          T((4,), F64, domain="positive", grad=False)),
         {"label_smoothing": 0.3, "reduction": r}, where="F") for r in REDUCTIONS] + [
    Call((T((2, 4, 3), F64), T((2, 4, 3), F64, domain="prob")), where="F"),
    Call((T((5, 4), F64), T((5,), "int64", domain="positive")), {"label_smoothing": 1.5},
         where="F", raises=RuntimeError)]


@pytest.fixture(autouse=True)
def _class_targets(monkeypatch):
    """Integer targets in the class range: rows_vs_torch draws 0..5 for a 'positive' int64; a
    class count of 4 needs 0..3, so those draws are taken modulo 4 here."""
    import rows_vs_torch

    original = rows_vs_torch._values

    def values(spec, shape, rng):
        v = original(spec, shape, rng)
        return v % 4 if spec.dtype == "int64" and spec.domain == "positive" else v

    monkeypatch.setattr(rows_vs_torch, "_values", values)


@pytest.mark.parametrize("name, case", cases(ROWS))
def test_matches_torch(name, case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_case(name, case)


def test_broadcast_targets_warn_as_torch_does():
    x, t = ta.randn(3, 4), ta.randn(4)
    with pytest.warns(UserWarning, match=r"mse_loss: target of shape \(4,\) differs"):
        ta.functional.mse_loss(x, t)


MODULES = [
    ("MSELoss", {}, "real"), ("L1Loss", {"reduction": "sum"}, "real"),
    ("SmoothL1Loss", {"beta": 0.5}, "real"), ("HuberLoss", {"delta": 0.5}, "real"),
    ("KLDivLoss", {"reduction": "batchmean"}, "prob"), ("BCELoss", {}, "prob"),
    ("BCEWithLogitsLoss", {"reduction": "none"}, "prob"),
    ("NLLLoss", {"ignore_index": 1}, "class"),
    ("CrossEntropyLoss", {"label_smoothing": 0.1}, "class"),
    ("CrossEntropyLoss", {}, "prob"),
]


@pytest.mark.parametrize("name, kwargs, target", MODULES,
                         ids=[f"{m[0]}-{i}" for i, m in enumerate(MODULES)])
def test_nn_modules_match_torch(name, kwargs, target):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = rng.uniform(0.1, 0.9, (5, 4))
    t = {"real": rng.standard_normal((5, 4)), "prob": rng.uniform(0, 1, (5, 4)),
         "class": np.array([0, 3, 1, 1, 2])}[target]
    ours = getattr(nn, name)(**kwargs)(ta.tensor(x), ta.tensor(t))
    theirs = getattr(torch.nn, name)(**kwargs)(torch.tensor(x), torch.tensor(t))
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-10, atol=1e-12)


def test_nll_loss_saves_only_target_and_weight():
    x = ta.randn(4, 3, requires_grad=True)
    target, weight = ta.tensor([0, 2, 1, 1]), ta.tensor([1.0, 2.0, 3.0])
    saved = ta.functional.nll_loss(x, target, weight).grad_fn.saved_tensors
    assert [s.shares_storage(t) for s, t in zip(saved, (target, weight))] == [True, True]
    loss = ta.functional.mse_loss(x, x.detach() * 2)
    assert all(s.shares_storage(x) for s in loss.grad_fn.saved_tensors[:1])
