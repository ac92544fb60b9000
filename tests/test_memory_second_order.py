"""The ledger counts a gradient's graph (what a create_graph backward records) apart."""

from __future__ import annotations

import tinygrad_attn as ta

F64 = ta.float64


def _saved_peak(fn):
    with ta.memory.profile() as prof:
        keep = fn()
    summary = prof.summary()["saved_peak"]
    del keep
    return summary


def test_plain_backward_records_no_gradient_graph():
    x = ta.randn(4, dtype=F64, requires_grad=True)

    def step():
        y = x.exp()
        return ta.autograd.grad(y, x, ta.ones(4, dtype=F64))

    sv = _saved_peak(step)
    assert sv["graph_of_gradient"] == {"unique_bytes": 0, "nominal_bytes": 0, "nodes": 0,
                                       "by_op": {}, "by_module": {}}
    assert sv["unique_bytes"] == 32  # Exp keeps its output: 4 float64


def test_create_graph_keeps_exactly_what_the_derivative_of_the_gradient_needs():
    """g = v * exp(x) is recorded as Mul(v, y) with y = exp(x) the saved output: its own
    derivative with respect to y needs v (32 bytes), with respect to v would need y (v needs
    no gradient, so y is not saved again)."""
    x = ta.randn(4, dtype=F64, requires_grad=True)
    v = ta.randn(4, dtype=F64)

    def step():
        y = x.exp()
        return y, ta.autograd.grad(y, x, v, create_graph=True)

    sv = _saved_peak(step)
    second = sv["graph_of_gradient"]
    assert second["unique_bytes"] == 32 and second["nodes"] == 1
    assert second["by_op"] == {"Mul": {"unique_bytes": 32, "nominal_bytes": 32, "nodes": 1}}
    assert sv["unique_bytes"] == 64  # y (first order) + v (the gradient's graph)
    assert [n["order"] for n in sv["nodes"]] in ([1, 2], [2, 1])


def test_report_names_the_gradient_graph():
    x = ta.randn(3, dtype=F64, requires_grad=True)
    with ta.memory.profile() as prof:
        y = x.tanh()
        g = ta.autograd.grad(y, x, ta.randn(3, dtype=F64), create_graph=True)
    assert "the gradient's graph (recorded by a create_graph backward)" in prof.report()
    assert "gradient's graph by op" in prof.report()
    del g
