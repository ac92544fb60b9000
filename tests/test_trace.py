"""ta.autograd.trace(): a backward run recorded step by step, checked event by event against
gradients worked out by hand (or by torch), and shown to change nothing it watches."""

import math

import numpy as np
import pytest

import nn
import tinygrad_attn as ta
from tinygrad_attn.autograd import engine
from tinygrad_attn.memory import state as ledger_state

X = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
W = [[0.5, -1.0, 2.0], [1.0, 0.0, -2.0]]


def _norm(values) -> float:
    return float(np.linalg.norm(np.asarray(values, dtype=np.float64)))


def _leaves():
    return ta.tensor(X, requires_grad=True), ta.tensor(W, requires_grad=True)


def test_three_line_example_event_by_event():
    x, w = _leaves()
    y = (x * w).sum()
    z = y * 2 + y
    with ta.autograd.trace(params={"x": x, "w": w}) as tr:
        z.backward()

    # dz/dy = 2 + 1 = 3, so d/d(x*w) = 3 everywhere, x.grad = 3w and w.grad = 3x
    assert [(e.kind, getattr(e, "name", getattr(e, "into", None))) for e in tr.events] == [
        ("run", "AddBackward"),  # z = (y*2) + y
        ("run", "MulBackward"),  # y * 2: a scalar constant is not saved, nothing to free
        ("sum", "SumBackward"),  # y gets 1 from the add and 2 from y*2: the fan-in sum
        ("run", "SumBackward"),
        ("run", "MulBackward"),  # x * w
        ("free", "MulBackward"),  # it saved x and w
        ("leaf", "w"),
        ("leaf", "x"),
    ]
    add, mul2, fan_in, total, mul, freed, leaf_w, leaf_x = tr.events

    assert [(g.shape, g.dtype, g.norm) for g in add.received] == [((), "float32", 1.0)]
    assert [(g.shape, g.norm) for g in add.handed] == [((), 1.0), ((), 1.0)]
    assert [(g.shape, g.norm) for g in mul2.received] == [((), 1.0)]
    assert [(g.shape, g.norm) for g in mul2.handed[:1]] == [((), 2.0)]
    assert mul2.handed[1] is None  # the 2: no gradient edge
    # the add's gradient is shared (it handed the same one on twice): the sum allocates
    assert (fan_in.slot, fan_in.how, fan_in.bytes) == (0, "new-buffer", 4)
    assert [(g.shape, g.norm) for g in total.received] == [((), 3.0)]
    assert total.handed[0].shape == (2, 3)
    assert total.handed[0].norm == pytest.approx(3 * math.sqrt(6))
    assert mul.received[0].norm == pytest.approx(3 * math.sqrt(6))
    assert mul.handed[0].shape == mul.handed[1].shape == (2, 3)
    assert mul.handed[0].norm == pytest.approx(3 * _norm(W))  # x's: 3w
    assert mul.handed[1].norm == pytest.approx(3 * _norm(X))  # w's: 3x
    assert freed.tensors == (((2, 3), 24, False), ((2, 3), 24, False))
    assert freed.bytes == 48
    assert (leaf_w.shape, leaf_w.how, leaf_w.bytes) == ((2, 3), "set", 24)
    assert leaf_w.norm == pytest.approx(3 * _norm(X))
    assert leaf_x.norm == pytest.approx(3 * _norm(W))
    assert x.grad.numpy().tolist() == (3 * np.array(W, dtype=np.float32)).tolist()

    table = str(tr).splitlines()
    assert len(table) == 1 + len(tr.events)
    assert table[1].split()[:3] == ["1", "run", "AddBackward:"]
    assert "MulBackward frees (2, 3) 24 B, (2, 3) 24 B: 48 B" in table[6]
    assert "w (2, 3)" in table[7] and "becomes .grad" in table[7]
    dicts = tr.to_list()
    assert dicts[2] == {"into": "SumBackward", "slot": 0, "how": "new-buffer", "bytes": 4,
                        "kind": "sum"}
    assert dicts[0]["received"][0]["norm"] == 1.0


def test_fan_in_sum_in_place_and_norms_match_torch():
    torch = pytest.importorskip("torch")
    x, w = _leaves()
    h = x * w
    loss = (h.exp() * h).sum()  # h reaches the last mul twice: directly and through exp
    with ta.autograd.trace(params={"x": x, "w": w}) as tr:
        loss.backward()
    kinds = [(e.kind, getattr(e, "name", getattr(e, "into", None))) for e in tr.events]
    assert kinds == [
        ("run", "SumBackward"), ("run", "MulBackward"), ("free", "MulBackward"),
        ("run", "ExpBackward"), ("free", "ExpBackward"),
        ("sum", "MulBackward"),  # exp's gradient added into h's pending one
        ("run", "MulBackward"), ("free", "MulBackward"), ("leaf", "w"), ("leaf", "x"),
    ]
    fan_in = tr.events[5]
    assert (fan_in.slot, fan_in.how, fan_in.bytes) == (0, "in-place", 24)

    tx = torch.tensor(X, requires_grad=True)
    tw = torch.tensor(W, requires_grad=True)
    th = tx * tw
    th.retain_grad()
    te = th.exp()
    te.retain_grad()
    (te * th).sum().backward()
    outer, exp_run, inner = tr.runs[1], tr.runs[2], tr.runs[3]
    assert outer.handed[0].norm == pytest.approx(te.grad.norm().item(), rel=1e-6)
    assert exp_run.received[0].norm == pytest.approx(te.grad.norm().item(), rel=1e-6)
    assert inner.received[0].norm == pytest.approx(th.grad.norm().item(), rel=1e-6)
    assert inner.handed[0].norm == pytest.approx(tx.grad.norm().item(), rel=1e-6)
    assert inner.handed[1].norm == pytest.approx(tw.grad.norm().item(), rel=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6)


def test_slices_share_one_gradient_buffer():
    a = ta.randn(4, 12, requires_grad=True)
    q, k, v = a[:, 0:4], a[:, 4:8], a[:, 8:12]
    loss = (q * k + v).sum()
    with ta.autograd.trace(params={"a": a}) as tr:
        loss.backward()
    routes = [e for e in tr.events if e.kind == "route"]
    assert [(r.into, r.slot, r.lazy, r.shape, r.target_shape, r.how) for r in routes] == [
        ("AccumulateGrad(a)", 0, "slice", (4, 4), (4, 12), "first"),  # held as it is
        ("AccumulateGrad(a)", 0, "slice", (4, 4), (4, 12), "new-buffer"),  # one (4, 12) buffer
        ("AccumulateGrad(a)", 0, "slice", (4, 4), (4, 12), "in-place"),  # written into it
    ]
    slice_runs = [e for e in tr.runs if e.name == "SliceBackward"]
    assert len(slice_runs) == 3
    for run in slice_runs:
        handed = run.handed[0]
        assert (handed.shape, handed.lazy) == ((4, 12), "slice")
        assert handed.norm == pytest.approx(run.received[0].norm)
    assert not [e for e in tr.events if e.kind == "sum"]  # the routes say it all
    (leaf,) = [e for e in tr.events if e.kind == "leaf"]
    assert (leaf.name, leaf.shape, leaf.how, leaf.bytes) == ("a", (4, 12), "set", 4 * 12 * 4)
    assert leaf.norm == pytest.approx(float(np.linalg.norm(a.grad.numpy())), rel=1e-6)
    assert "written into the shared buffer" in str(tr)


@pytest.mark.parametrize("model", ["softmax", "linear"])
def test_freed_bytes_equal_saved_bytes_before_backward(model):
    if model == "softmax":
        x = ta.randn(2, 3, requires_grad=True)
        w = ta.randn(3, 4, requires_grad=True)
        t = ta.randn(2, 4)
        loss = ((x @ w).softmax(-1) * t).sum()
    else:
        layer = nn.Linear(8, 5)  # its weight is a parameter: saved but not counted
        x = ta.randn(3, 8, requires_grad=True)
        loss = layer(x).tanh().sum()
    before = ta.memory.saved_bytes(loss)
    assert before > 0
    with ta.autograd.trace() as tr:
        loss.backward()
    freed = [e for e in tr.events if e.kind == "free"]
    assert freed
    assert tr.freed_bytes() == before
    for e in freed:
        assert all(b > 0 for _, b, _ in e.tensors)
    if model == "linear":
        assert any(p for e in freed for _, _, p in e.tensors)


def _step(traced: bool):
    """One small forward and backward from a fixed seed; the grads and the ledger after."""
    ta.manual_seed(3)
    x = ta.randn(6, 8, requires_grad=True)
    w = ta.randn(8, 12, requires_grad=True)
    q, k, v = (x @ w).split(4, dim=-1)
    loss = ((q @ k.mT).softmax(-1) @ v).sum() + q.exp().sum()
    ta.memory.reset_peak()
    start = ta.memory.live_bytes()
    if traced:
        with ta.autograd.trace() as tr:
            loss.backward()
        assert tr.events
    else:
        loss.backward()
    ledger = (ta.memory.live_bytes() - start, ta.memory.max_live_bytes() - start)
    return x.grad.numpy().copy(), w.grad.numpy().copy(), ledger


def test_tracing_changes_no_gradient_and_no_allocation():
    x_plain, w_plain, ledger_plain = _step(traced=False)
    x_traced, w_traced, ledger_traced = _step(traced=True)
    assert np.array_equal(x_plain, x_traced)
    assert np.array_equal(w_plain, w_traced)
    assert ledger_plain == ledger_traced
    assert ledger_plain[1] > 0


def test_trace_unregisters_itself_even_when_backward_fails():
    x = ta.randn(3, requires_grad=True)
    loss = (x * x).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="second time"):
        with ta.autograd.trace():
            loss.backward()
    assert engine._tracers == []
    assert not [o for o in ledger_state.observers if isinstance(o, ta.autograd.Trace)]


def test_module_scope_is_recorded():
    x = ta.randn(3, 4, requires_grad=True)
    w = ta.randn(4, 2, requires_grad=True)
    with ta.memory.scope("mlp.fc1"):
        h = x @ w
    loss = h.tanh().sum()
    with ta.autograd.trace() as tr:
        loss.backward()
    assert [(e.name, e.scope) for e in tr.runs] == [
        ("SumBackward", ""), ("TanhBackward", ""), ("MatmulBackward", "mlp.fc1")]
    assert "MatmulBackward [mlp.fc1]: got (3, 2)" in str(tr)


def test_checkpoint_recomputation_is_traced_inside_its_node():
    x = ta.randn(3, 4, requires_grad=True)
    w = ta.randn(4, 4, requires_grad=True)
    h = ta.checkpoint(lambda a, b: (a @ b).tanh(), x, w)
    loss = h.sum()
    with ta.autograd.trace(params={"x": x, "w": w}) as tr:
        loss.backward()
    names = [e.name for e in tr.runs]
    assert names[:2] == ["SumBackward", "CheckpointBackward"]
    assert names[2:] == ["TanhBackward", "MatmulBackward"]  # the recomputed block's backward
    outer = tr.runs[1]
    assert outer.handed[0] is None  # the block itself, not a tensor
    assert [g.shape for g in outer.handed[1:]] == [(3, 4), (4, 4)]
    assert outer.handed[1].norm == pytest.approx(float(np.linalg.norm(x.grad.numpy())), rel=1e-6)
    # the inner backward's leaves are the block's detached inputs; the outer ones come last
    leaves = [(e.name, e.shape) for e in tr.events if e.kind == "leaf"]
    assert leaves == [("", (4, 4)), ("", (3, 4)), ("w", (4, 4)), ("x", (3, 4))]
    assert tr.events.index(outer) < tr.events.index(tr.runs[3])


def test_trace_on_each_device(device):
    x = ta.tensor(X, device=device, requires_grad=True)
    w = ta.tensor(W, device=device, requires_grad=True)
    z = (x * w).sum() * 3
    with ta.autograd.trace(params={"x": x}) as tr:
        z.backward()
    leaf_x = [e for e in tr.events if e.kind == "leaf" and e.name == "x"][0]
    assert leaf_x.norm == pytest.approx(3 * _norm(W))
    assert tr.freed_bytes() == 48
