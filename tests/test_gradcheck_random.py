"""Gradients of the sampling ops (float64, finite differences where they apply).

torch does not differentiate through a sample: a fill's target and the inputs of bernoulli,
poisson and normal get zero gradients. With a generator seeded afresh on every call, a fill
and a bernoulli or poisson draw are locally constant in their inputs, so finite differences
agree with that zero, on contiguous and non-contiguous inputs. normal's sample moves with
its mean (finite differences give 1, torch's gradient is 0): its test checks torch's zero.
tests/test_registry.py counts COVERED.
"""

from __future__ import annotations

import pytest
from test_gradcheck_ops import check

import tinygrad_attn as ta

VIEWS = ["contiguous", "transposed", "sliced"]


def _seeded():
    return ta.Generator().manual_seed(7)


def _fill(method, *args):
    def fn(x):
        y = x * 1  # a non-leaf: the fill rebases its history
        getattr(y, method)(*args, generator=_seeded())
        return y * x  # the gradient x gets is then exactly the filled values

    return fn


GRAD_ROWS = {
    "uniform_": _fill("uniform_", -1.0, 2.0),
    "normal_": _fill("normal_", 0.5, 2.0),
    "log_normal_": _fill("log_normal_"),
    "exponential_": _fill("exponential_", 2.0),
    "cauchy_": _fill("cauchy_"),
    "geometric_": _fill("geometric_", 0.3),
    "bernoulli_": _fill("bernoulli_", 0.4),
    "random_": _fill("random_", -3, 9),
    "bernoulli": lambda p: ta.bernoulli(p.abs(), generator=_seeded()) * p,
    "bernoulli_p": lambda x: ta.bernoulli(x, 0.5, generator=_seeded()) + x,
    "poisson": lambda r: ta.poisson(r * 3, generator=_seeded()) * r,
}


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("op", list(GRAD_ROWS))
def test_gradcheck(op, view):
    domain = "unit" if op == "bernoulli" else "positive" if op == "poisson" else "real"
    check(GRAD_ROWS[op], [((3, 4), view, domain)])


def test_bernoulli_tensor_p_of_a_fill_gets_a_zero_gradient():
    def fn(x, p):
        y = x * 1
        y.bernoulli_(p.abs(), generator=_seeded())
        return y + p

    check(fn, [((3, 4), "transposed", "real"), ((4,), "contiguous", "unit")])


def test_normal_gives_its_inputs_zero_gradients_as_torch():
    torch = pytest.importorskip("torch")
    for make_args in (lambda m, s: (m, s), lambda m, s: (m, 1.5), lambda m, s: (0.5, s)):
        grads = []
        for lib in (ta, torch):
            m = lib.ones(3, 4, dtype=lib.float64, requires_grad=True)
            s = lib.ones(3, 4, dtype=lib.float64, requires_grad=True)
            out = lib.normal(*make_args(m, s))
            assert out.requires_grad
            (out * 2).sum().backward()
            grads.append([None if t.grad is None else t.grad.tolist() for t in (m, s)])
        assert grads[0] == grads[1]
        assert any(g is not None for g in grads[0])
        assert all(g is None or g == [[0.0] * 4] * 3 for g in grads[0])


TESTS_OF = {"normal": test_normal_gives_its_inputs_zero_gradients_as_torch,
            "bernoulli__tensor_p": test_bernoulli_tensor_p_of_a_fill_gets_a_zero_gradient}
COVERED = set(GRAD_ROWS) | set(TESTS_OF)
