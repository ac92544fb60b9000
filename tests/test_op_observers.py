"""Op observers (memory.state.op_observers): each op call outside another op's forward is
heard once, with its op, scope, phase, whether it re-runs forward work in backward, and its
FLOPs; a container's inner ops are heard instead of itself; the memory planner's OpRecorder
hears only its own thread; the per-thread depth and recompute counters survive exceptions."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn import nn
from tinygrad_attn.memory import state
from tinygrad_attn.memory.planfit import OpRecorder


class Listener:
    """A plain op observer: keeps every record it hears."""

    def __init__(self) -> None:
        self.records: list = []

    def on_op(self, record: dict) -> None:
        self.records.append(record)

    def ops(self) -> list:
        return [r["op"] for r in self.records]


@pytest.fixture
def listener():
    obs = Listener()
    state.op_observers.append(obs)
    try:
        yield obs
    finally:
        if obs in state.op_observers:
            state.op_observers.remove(obs)
        assert state.local.op_depth == 0 and state.local.recomputing == 0


def _host(t):
    return t.detach().numpy()


def _x(*shape, dtype=np.float64):
    n = int(np.prod(shape))
    return ta.tensor((np.arange(n, dtype=dtype) / n - 0.5).reshape(shape))


# ----------------------------------------------------------------------------- top level
def test_one_record_per_top_level_call_with_its_name_and_labels(listener):
    x = _x(2, 3)
    y = x + x
    z = ta.exp(y)
    assert listener.ops() == ["Add", "Exp"]
    for r in listener.records:
        assert set(r) == {"op", "scope", "phase", "recompute", "flops", "seconds"}
        assert r["phase"] == "other" and r["scope"] == "" and r["recompute"] is False
        assert r["flops"] == 0 and r["seconds"] >= 0.0
    np.testing.assert_allclose(_host(z), np.exp(2 * _host(x)))

    listener.records.clear()
    with ta.memory.phase("forward"):
        x * 2.0
    with ta.memory.phase("optimizer"):
        x * 3.0
    with ta.memory.scope("blk"):
        x * 4.0
    assert [(r["op"], r["phase"], r["scope"]) for r in listener.records] == [
        ("Mul", "forward", ""), ("Mul", "optimizer", ""), ("Mul", "other", "blk")]


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 4)

    def forward(self, x):
        return self.lin(x).relu()


def test_a_module_call_is_heard_in_its_scope_and_the_forward_phase():
    ta.manual_seed(0)
    model = _Tiny()  # built before listening: its initialisation's ops are not asked about
    x = _x(2, 3, dtype=np.float32)
    obs = Listener()
    state.op_observers.append(obs)
    try:
        out = model(x)
    finally:
        state.op_observers.remove(obs)
    # Linear's forward does its matmul and bias itself: one record, 2 * 2 * 3 * 4 FLOPs
    assert [(r["op"], r["phase"], r["scope"], r["flops"]) for r in obs.records] == [
        ("Linear", "forward", "lin", 2 * 2 * 3 * 4), ("Relu", "forward", "", 0)]
    expected = np.maximum(_host(x) @ _host(model.lin.weight).T + _host(model.lin.bias), 0)
    np.testing.assert_allclose(_host(out), expected, rtol=1e-6)


def test_nothing_is_heard_once_removed_and_results_do_not_change():
    w = _x(3, 5)
    x = _x(4, 3)
    plain = _host(ta.exp(x @ w).sum(1))
    obs = Listener()
    state.op_observers.append(obs)
    heard = _host(ta.exp(x @ w).sum(1))
    state.op_observers.remove(obs)
    assert obs.ops() == ["Matmul", "Exp", "Sum"]
    assert obs.records[0]["flops"] == 2 * 4 * 3 * 5
    after = _host(ta.exp(x @ w).sum(1))
    assert obs.ops() == ["Matmul", "Exp", "Sum"]  # nothing more after removal
    assert state.op_observers == []
    np.testing.assert_array_equal(plain, heard)
    np.testing.assert_array_equal(plain, after)
    np.testing.assert_allclose(plain, np.exp(_host(x) @ _host(w)).sum(1))


# ----------------------------------------------------------------------------- nesting
class ExpPlusOne(ta.autograd.Function):
    """exp(x) + 1, through two other ops inside forward."""

    @staticmethod
    def forward(ctx, x):
        e = ta.exp(x)
        ctx.save_for_backward(e)
        return e + 1.0

    @staticmethod
    def backward(ctx, g):
        (e,) = ctx.saved_tensors
        return g * e


class ExpPlusOneContainer(ExpPlusOne):
    container = True


def test_ops_inside_a_forward_are_the_outer_ops_work(listener):
    x = _x(2, 2)
    y = ExpPlusOne.apply(x)
    assert listener.ops() == ["ExpPlusOne"]
    assert listener.records[0]["phase"] == "other"
    np.testing.assert_allclose(_host(y), np.exp(_host(x)) + 1.0)
    assert state.local.op_depth == 0


def test_a_container_is_heard_through_its_inner_ops(listener):
    x = _x(2, 2)
    y = ExpPlusOneContainer.apply(x)
    assert listener.ops() == ["Exp", "Add"]
    np.testing.assert_allclose(_host(y), np.exp(_host(x)) + 1.0)
    # a container inside a plain op's forward is that op's work, like the rest of it
    listener.records.clear()

    class Outer(ta.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return ExpPlusOneContainer.apply(x) * 2.0

        @staticmethod
        def backward(ctx, g):  # pragma: no cover - not run
            return g

    Outer.apply(x)
    assert listener.ops() == ["Outer"]


# ----------------------------------------------------------------------------- recompute
def test_checkpoint_rerun_is_heard_as_recompute_in_backward(listener):
    w = _x(3, 5).requires_grad_()
    x = _x(4, 3).requires_grad_()

    def block(t):
        return (t @ w).transpose(0, 1).tanh()

    y = ta.checkpoint(block, x)
    forward = [(r["op"], r["phase"], r["recompute"]) for r in listener.records]
    assert forward == [("Matmul", "other", False), ("Transpose", "other", False),
                       ("Tanh", "other", False)]
    listener.records.clear()
    y.sum().backward()
    heard = [(r["op"], r["phase"], r["recompute"]) for r in listener.records]
    # the rerun, marked; then TransposeBackward's transpose: backward work, not a rerun
    assert ("Matmul", "backward", True) in heard
    assert ("Transpose", "backward", True) in heard
    assert ("Tanh", "backward", True) in heard
    assert ("Transpose", "backward", False) in heard
    assert heard.index(("Transpose", "backward", False)) > heard.index(("Tanh", "backward", True))
    rerun = [r for r in listener.records if r["recompute"]]
    assert [r["op"] for r in rerun] == ["Matmul", "Transpose", "Tanh"]
    assert [r["flops"] for r in rerun] == [2 * 4 * 3 * 5, 0, 0]
    assert all(not r["recompute"] for r in listener.records if r["phase"] != "backward")
    # the gradients are the plain call's
    X, W = _host(x), _host(w)
    gx = (1 - np.tanh(X @ W) ** 2)
    np.testing.assert_allclose(_host(x.grad), gx @ W.T, rtol=1e-10)
    np.testing.assert_allclose(_host(w.grad), X.T @ gx, rtol=1e-10)


def test_checkpoint_of_a_module_is_heard_in_its_scope_both_times():
    ta.manual_seed(0)
    model = _Tiny()
    x = _x(2, 3, dtype=np.float32).requires_grad_()
    with OpRecorder() as rec:
        ta.checkpoint(model, x).sum().backward()
    linear = [(r["phase"], r["scope"], r["recompute"]) for r in rec.records if r["op"] == "Linear"]
    assert linear == [("forward", "lin", False), ("backward", "lin", True)]


def test_save_policy_recompute_is_heard_as_recompute(listener):
    w1 = _x(3, 5).requires_grad_()
    w2 = _x(5, 2).requires_grad_()
    x = _x(4, 3)
    with ta.memory.save_policies(gelu="recompute"):
        h = ta.nn.functional.gelu(x @ w1)
        out = h @ w2  # its backward needs h: rebuilt from the Gelu node
        assert listener.ops() == ["Matmul", "Gelu", "Matmul"]
        listener.records.clear()
        out.sum().backward()
    redone = [(r["op"], r["phase"], r["flops"]) for r in listener.records if r["recompute"]]
    assert redone == [("Gelu", "backward", 0)]
    assert all(r["op"] != "Gelu" for r in listener.records if not r["recompute"])
    # under the default policy, nothing in backward is a recompute
    listener.records.clear()
    h = ta.nn.functional.gelu(x @ w1)
    (h @ w2).sum().backward()
    assert [r for r in listener.records if r["recompute"]] == []


# ----------------------------------------------------------------------------- OpRecorder
def test_op_recorder_hears_only_its_own_thread():
    x = _x(2, 2)
    other_done = []

    def work():
        ta.exp(x) * 5.0
        other_done.append(True)

    with OpRecorder() as rec:
        assert rec in state.op_observers
        x + 1.0
        t = threading.Thread(target=work)
        t.start()
        t.join()
        x - 1.0
    assert other_done == [True]
    assert [r["op"] for r in rec.records] == ["Add", "Sub"]
    assert rec not in state.op_observers
    assert rec.recomputed() == [] and rec.recompute_flops() == 0


def test_op_recorder_counts_a_checkpointed_matmul_exactly():
    x = _x(8, 16).requires_grad_()
    w = _x(16, 32).requires_grad_()
    with OpRecorder() as rec:
        ta.checkpoint(lambda a: a @ w, x).sum().backward()
    assert rec.recompute_flops() == 2 * 8 * 16 * 32
    redone = rec.recomputed()
    assert [(r["op"], r["phase"], r["flops"]) for r in redone] == [
        ("Matmul", "backward", 2 * 8 * 16 * 32)]
    assert rec.recompute_seconds() == redone[0]["seconds"] >= 0.0
    forward = [r for r in rec.records if r["op"] == "Matmul" and not r["recompute"]]
    assert [r["flops"] for r in forward] == [2 * 8 * 16 * 32]


# ----------------------------------------------------------------------------- thread state
def test_depth_is_restored_after_an_op_raises(listener):
    a, b = _x(2, 3), _x(2, 3)
    with pytest.raises(Exception):  # noqa: B017 - the engine's own shape error
        a @ b
    assert state.local.op_depth == 0
    assert listener.records == []  # a failed call is not heard

    class Failing(ta.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return ta.exp(x) @ x  # raises in the inner op, one level down

        @staticmethod
        def backward(ctx, g):  # pragma: no cover - not run
            return g

    with pytest.raises(Exception):  # noqa: B017
        Failing.apply(a)
    assert state.local.op_depth == 0
    assert listener.records == []
    a + b  # and the next call is heard at top level again
    assert listener.ops() == ["Add"]


def test_recomputing_is_restored_after_a_rerun_raises(listener):
    x = _x(2, 2).requires_grad_()
    calls = []

    def block(t):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("second call")
        return ta.exp(t)

    y = ta.checkpoint(block, x)
    with pytest.raises(ValueError, match="second call"):
        y.sum().backward()
    assert len(calls) == 2
    assert state.local.recomputing == 0 and state.local.op_depth == 0
    listener.records.clear()
    x * 2.0  # heard again as plain forward work
    assert [(r["op"], r["recompute"]) for r in listener.records] == [("Mul", False)]


def test_a_new_thread_starts_at_depth_zero_not_recomputing():
    seen = []

    def look():
        seen.append((state.local.op_depth, state.local.recomputing))

    with ta.autograd.graph.recomputing():
        assert state.local.recomputing == 1
        t = threading.Thread(target=look)
        t.start()
        t.join()
    assert seen == [(0, 0)]
    assert state.local.recomputing == 0
