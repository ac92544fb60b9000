"""Conformance with torch 2.13 for the fused transformer nodes: add_layer_norm against
torch's composition (s = x + residual, layer_norm(s)) and linear against
torch.nn.functional.linear, on contiguous and strided inputs, 0-d and empty operands,
broadcast residuals and biases, float32 and float64 (values, dtypes, shapes, gradients)
and the error types of bad shapes. Run by tests/rows_vs_torch.py; tests/test_registry.py
reads ROWS."""

from __future__ import annotations

import numpy as np
import pytest
from rows_vs_torch import Case, case_ids, check_case

import tinygrad_attn as ta

F32, F64, I64 = np.float32, np.float64, np.int64


def r(*shape, dtype=F64, seed=0):
    return np.asarray(np.random.default_rng(seed).standard_normal(shape), dtype=dtype)


def _add_layer_norm(normalized_shape, affine=(True, True), eps=1e-5):
    def fn(lib, x, residual, *params):
        it = iter(params)
        w = next(it) if affine[0] else None
        b = next(it) if affine[1] else None
        if lib is ta:
            return ta.functional.add_layer_norm(x, residual, normalized_shape, w, b, eps)
        s = x + residual
        return s, lib.nn.functional.layer_norm(s, normalized_shape, w, b, eps)
    return fn


def _linear(lib, x, w, b=None):
    return (ta.functional if lib is ta else lib.nn.functional).linear(x, w, b)


def _linear_nobias(lib, x, w):
    return _linear(lib, x, w)


ALN, ALN_PLAIN = _add_layer_norm((4,)), _add_layer_norm((4,), (False, False))
ROWS = {
    "add_layer_norm": [
        Case(ALN, (r(3, 4), r(3, 4, seed=1), r(4, seed=2), r(4, seed=3)), lay)
        for lay in ("contiguous", "transposed", "sliced")] + [
        Case(ALN, (r(2, 3, 4), r(3, 4, seed=1), r(4, seed=2), r(4, seed=3))),  # a (T, C) table
        Case(ALN, (r(2, 3, 4), r(2, 1, 4, seed=1), r(4, seed=2), r(4, seed=3))),
        Case(ALN, (r(2, 3, 4), r(4, seed=1), r(4, seed=2), r(4, seed=3)), "transposed"),
        Case(ALN_PLAIN, (r(0, 4), r(0, 4, seed=1))),  # empty batch
        Case(ALN_PLAIN, (r(4), r(4, seed=1))),  # one row, no leading dims
        Case(_add_layer_norm((2, 4), (True, False)), (r(3, 2, 4), r(3, 2, 4, seed=1),
                                                       r(2, 4, seed=2))),
        Case(_add_layer_norm((4,), eps=1e-2), (r(3, 4, dtype=F32), r(3, 4, dtype=F32, seed=1),
                                               r(4, dtype=F32, seed=2), r(4, dtype=F32,
                                                                         seed=3)),
             all_grads=True),
        # mixed float dtypes: the add promotes, as torch's, before the norm
        Case(ALN_PLAIN, (r(3, 4, dtype=F32), r(3, 4, seed=1)), all_grads=True),
        Case(ALN_PLAIN, (r(3, 4), r(3, 1, 4, seed=1))),  # a residual that grows x
        Case(ALN_PLAIN, (r(3, 4), r(3, 3, seed=1)), raises=RuntimeError),
        Case(_add_layer_norm((3,), (False, False)), (r(2, 4), r(2, 4, seed=1)),
             raises=RuntimeError),
        Case(ALN, (r(3, 4), r(3, 4, seed=1), r(3, seed=2), r(4, seed=3)), raises=RuntimeError),
        Case(ALN, (r(3, 4, dtype=F32), r(3, 4, dtype=F32, seed=1), r(4, seed=2),
                   r(4, dtype=F32, seed=3)), raises=RuntimeError)],
    "linear": [
        Case(_linear, (r(3, 5), r(4, 5, seed=1), r(4, seed=2)), lay)
        for lay in ("contiguous", "transposed", "sliced")] + [
        Case(_linear, (r(2, 3, 5), r(4, 5, seed=1), r(4, seed=2)), "transposed"),
        Case(_linear, (r(5), r(4, 5, seed=1), r(4, seed=2))),  # a 1-D input
        Case(_linear, (r(0, 5), r(4, 5, seed=1), r(4, seed=2))),  # empty batch
        Case(_linear, (r(3, 0), r(4, 0, seed=1), r(4, seed=2))),  # no input features
        Case(_linear, (r(2, 3, 5, dtype=F32), r(4, 5, dtype=F32, seed=1),
                       r(4, dtype=F32, seed=2)), all_grads=True),
        Case(_linear_nobias, (r(2, 3, 5), r(4, 5, seed=1))),
        Case(_linear, (r(3, 5), r(4, 5, seed=1), r(seed=2))),  # a 0-d bias broadcasts
        Case(_linear, (r(3, 5), r(4, 5, seed=1), r(3, 4, seed=2))),  # a bias of y's shape
        Case(_linear, (r(3, 5), r(4, 6, seed=1), r(4, seed=2)), raises=RuntimeError),
        Case(_linear, (r(3, 5), r(4, 5, seed=1), r(3, seed=2)), raises=RuntimeError),
        Case(_linear, (r(3, 5, dtype=F32), r(4, 5, seed=1), r(4, seed=2)),
             raises=RuntimeError),
        Case(_linear, (r(3, 5), r(4, 5, seed=1), r(4, dtype=F32, seed=2)),
             raises=RuntimeError)],
}


PARAMS, IDS = case_ids(ROWS)


@pytest.mark.parametrize("name, k", PARAMS, ids=IDS)
def test_matches_torch(name, k):
    torch = pytest.importorskip("torch")
    check_case(ROWS[name][k], torch)
