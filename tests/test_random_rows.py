"""The sampling ops against torch on the cases where a sample is determined (uniform_(2., 2.),
normal_(m, 0.), bernoulli of 0s and 1s, a one-hot multinomial, ...) or where only a
property of it is compared (exponential_ >= 0): values, dtypes, shapes, the zero gradients
torch gives, and torch's exception types. Distributions are tested in
test_random_functions.py; tests/test_registry.py reads ROWS."""

from __future__ import annotations

import numpy as np
import pytest
from rows_vs_torch import Case, arr, case_ids, check_case, randn

F64 = randn(3, 4)
F32 = randn(3, 4, dtype=np.float32)
F16 = randn(2, 3, dtype=np.float16)
I64 = np.arange(6, dtype=np.int64).reshape(2, 3)
BOOLS = np.array([True, False, True])
ZERO_ONE = arr([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
ONE_HOT = arr([[0.0, 0.0, 2.5], [4.0, 0.0, 0.0]])


def _fill(method, *args, **kwargs):
    """fn(lib, x): the fill on a copy of x (a non-leaf: its gradient is torch's zeros)."""
    def fn(lib, x, *more):
        y = x.clone()
        getattr(y, method)(*args, *more, **kwargs)
        return y

    return fn


def _leaf_fill(method, *args):
    def fn(lib, x):
        return getattr(x, method)(*args)  # a float64 leaf requires grad here

    return fn


def _positive(method, *args):
    def fn(lib, x):
        return getattr(x.clone(), method)(*args).ge(0)

    return fn


def _normal(*args, **kwargs):
    def fn(lib, *tensors):
        it = iter(tensors)
        return lib.normal(*(next(it) if a is None else a for a in args), **kwargs)

    return fn


def _multinomial(n, replacement=False, method=False):
    def fn(lib, w):
        if method:
            return w.multinomial(n, replacement)
        return lib.multinomial(w, n, replacement=replacement)

    return fn


ROWS = {
    "uniform_": [
        Case(_fill("uniform_", 2.0, 2.0), (F64,)),
        Case(_fill("uniform_", 2.0, 2.0), (F64,), layout="transposed"),
        Case(_fill("uniform_", -1.5, -1.5), (F32,), layout="sliced"),
        Case(_fill("uniform_", 0.5, 0.5), (F16,)),
        Case(_fill("uniform_", 3.0, 2.0), (F64,), raises=RuntimeError),
        Case(_fill("uniform_"), (I64,), raises=NotImplementedError),
        Case(_leaf_fill("uniform_"), (F32,), layout="expanded", raises=RuntimeError),
    ],
    "normal_": [
        Case(_fill("normal_", 1.5, 0.0), (F64,)),
        Case(_fill("normal_", -2.0, 0.0), (F32,), layout="transposed"),
        Case(_fill("normal_", 0.0, -1.0), (F64,), raises=RuntimeError),
        Case(_fill("normal_"), (I64,), raises=NotImplementedError),
    ],
    "log_normal_": [
        Case(_positive("log_normal_"), (F64,)),
        Case(_positive("log_normal_", 0.0, 0.5), (F32,), layout="sliced"),
        Case(_fill("log_normal_", 1.0, 0.0), (F64,), raises=RuntimeError),
        Case(_fill("log_normal_"), (I64,), raises=RuntimeError),
    ],
    "exponential_": [
        Case(_positive("exponential_"), (F64,)),
        Case(_positive("exponential_", 3.0), (F32,), layout="transposed"),
        Case(_fill("exponential_", 0.0), (F64,), raises=RuntimeError),
        Case(_fill("exponential_"), (I64,), raises=RuntimeError),
    ],
    "cauchy_": [
        Case(lambda lib, x: x.clone().cauchy_() * 0, (F64,)),
        Case(_fill("cauchy_", 0.0, 0.0), (F64,), raises=RuntimeError),
        Case(_fill("cauchy_"), (I64,), raises=RuntimeError),
    ],
    "geometric_": [
        Case(lambda lib, x: x.clone().geometric_(0.5).ge(1), (F64,)),
        Case(lambda lib, x: x.clone().geometric_(0.2).ge(1), (I64,)),
        Case(_fill("geometric_", 1.0), (F64,), raises=RuntimeError),
        Case(_fill("geometric_", 0.0), (F64,), raises=RuntimeError),
    ],
    "bernoulli_": [
        Case(_fill("bernoulli_", 0.0), (F64,)),
        Case(_fill("bernoulli_", 1.0), (F32,), layout="transposed"),
        Case(_fill("bernoulli_", 1.0), (I64,)),
        Case(_fill("bernoulli_", 0.0), (BOOLS,)),
        Case(_fill("bernoulli_"), (randn(2, 3), ZERO_ONE)),  # p a tensor of 0s and 1s
        Case(_fill("bernoulli_"), (randn(2, 3), ZERO_ONE[:1])),  # broadcast over the rows
        Case(_fill("bernoulli_"), (randn(2, 3), ZERO_ONE[:, :2]), raises=RuntimeError),
        Case(_fill("bernoulli_", 2.0), (F64,), raises=RuntimeError),
        Case(_leaf_fill("bernoulli_", 0.5), (F32,), layout="expanded", raises=RuntimeError),
    ],
    "random_": [
        Case(_fill("random_", 5, 6), (F64,)),
        Case(_fill("random_", 1), (I64,)),
        Case(_fill("random_", -3, -2), (F32,), layout="sliced"),
        Case(_fill("random_", 0, 1), (BOOLS,)),
        Case(lambda lib, x: x.clone().random_(3).lt(3), (I64,)),
        Case(lambda lib, x: x.clone().random_().ge(0), (F64,)),
        Case(_fill("random_", 5, 2), (I64,), raises=RuntimeError),
        Case(_fill("random_", 2, 3), (BOOLS,), raises=RuntimeError),
        Case(_fill("random_", -1, 3), (np.zeros(3, np.uint8),), raises=RuntimeError),
    ],
    "bernoulli": [
        Case(lambda lib, p: lib.bernoulli(p), (ZERO_ONE,)),
        Case(lambda lib, p: lib.bernoulli(p), (ZERO_ONE,), layout="transposed"),
        Case(lambda lib, p: p.bernoulli(), (ZERO_ONE.astype(np.float32),)),
        Case(lambda lib, p: lib.bernoulli(p, 1.0), (F32,)),
        Case(lambda lib, p: lib.bernoulli(p), (I64,), raises=NotImplementedError),
        Case(lambda lib, p: lib.bernoulli(p), (arr([2.0, 0.5]),), raises=RuntimeError),
        Case(lambda lib, p: lib.bernoulli(p, 2.0), (F32,), raises=RuntimeError),
    ],
    "poisson": [
        Case(lambda lib, r: lib.poisson(r * 0), (F64,)),
        Case(lambda lib, r: lib.poisson(r).ge(0), (np.abs(F32),), layout="transposed"),
        Case(lambda lib, r: lib.poisson(r), (arr([-1.0, 2.0]),), raises=RuntimeError),
        Case(lambda lib, r: lib.poisson(r), (I64,), raises=NotImplementedError),
    ],
    "normal": [
        Case(lambda lib, m, s: lib.normal(m, s * 0), (F64, F64)),
        Case(lambda lib, m: lib.normal(m, 0.0), (F64,), layout="sliced"),
        Case(lambda lib, m: lib.normal(m, 0.0), (F16,)),
        Case(lambda lib, s: lib.normal(2.0, s * 0), (F64,)),
        Case(lambda lib, m, s: lib.normal(m, s * 0), (F64[:, :1], F32[0]), all_grads=True),
        Case(_fill("bernoulli_"), (F64[:2, :3], ZERO_ONE.astype(np.float32)), all_grads=True),
        Case(_normal(1.5, 0.0, (2, 3)), ()),
        Case(lambda lib: lib.normal(1.5, 0.0, (2, 3), dtype=lib.float64), ()),
        Case(lambda lib, m: lib.normal(m, -1.0), (F64,), raises=RuntimeError),
        Case(lambda lib, m, s: lib.normal(m, -(s * s) - 1), (F64, F64), raises=RuntimeError),
        Case(lambda lib, m, s: lib.normal(m, s), (F64, randn(2)), raises=RuntimeError),
        Case(lambda lib, m: lib.normal(m, 1.0), (I64,), raises=NotImplementedError),
        Case(_normal(0.0, 1.0), (), raises=TypeError),
    ],
    "multinomial": [
        Case(_multinomial(1), (ONE_HOT,)),
        Case(_multinomial(4, replacement=True), (ONE_HOT,)),
        Case(_multinomial(1, method=True), (ONE_HOT[0],)),
        Case(_multinomial(3, replacement=True), (ONE_HOT,), layout="transposed"),
        Case(_multinomial(2), (np.ones((0, 3)),)),
        Case(lambda lib, w: lib.multinomial(w, 4).sort()[0], (F64 * F64 + 0.1,)),
        Case(_multinomial(1), (arr([1.0, -1.0]),), raises=RuntimeError),
        Case(_multinomial(1), (arr([1.0, np.inf]),), raises=RuntimeError),
        Case(_multinomial(1), (arr([1.0, np.nan]),), raises=RuntimeError),
        Case(_multinomial(1), (arr([[1.0, 1.0], [0.0, 0.0]]),), raises=RuntimeError),
        Case(_multinomial(3), (arr([1.0, 1.0]),), raises=RuntimeError),
        Case(_multinomial(0), (arr([1.0, 1.0]),), raises=RuntimeError),
        Case(_multinomial(1), (np.ones((2, 2, 2)),), raises=RuntimeError),
        Case(_multinomial(1), (I64,), raises=RuntimeError),
    ],
}


PARAMS, IDS = case_ids(ROWS)


@pytest.mark.parametrize(("op", "k"), PARAMS, ids=IDS)
def test_row(op, k):
    torch = pytest.importorskip("torch")
    check_case(ROWS[op][k], torch)
