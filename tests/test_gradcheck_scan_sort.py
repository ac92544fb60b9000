"""Gradcheck rows (float64, finite differences) for the scans, the extra reductions and the
sorting/selection ops, on contiguous, transposed and sliced inputs, and on the GPU (or the
fake CuPy). tests/test_registry.py counts these rows with the ones of test_gradcheck_ops."""

from __future__ import annotations

import pytest
from test_gradcheck_ops import DEVICE, _t, check

import tinygrad_attn as ta

VIEWS = ["contiguous", "transposed", "sliced"]


def _zeroed(x):
    """x with some entries exactly zero: the zero-safe gradient paths of prod/cumprod."""
    return x * _t([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]],
                  dtype=ta.float64)


ROWS = {
    "cumsum": lambda x: x.cumsum(1),
    "cumsum_dim0": lambda x: ta.cumsum(x, 0),
    "cumprod": lambda x: x.cumprod(1),
    "cumprod_zeros": lambda x: _zeroed(x).cumprod(1) + _zeroed(x).cumprod(0),
    "cummax": lambda x: x.cummax(1)[0],
    "cummin": lambda x: ta.cummin(x, 0)[0],
    "logcumsumexp": lambda x: x.logcumsumexp(1) + ta.logcumsumexp(x * 3, 0),
    "prod": lambda x: x.prod(1),
    "prod_all": lambda x: x.prod(),
    "prod_zeros": lambda x: _zeroed(x).prod(1) + _zeroed(x).prod(0, keepdim=True).sum(),
    "prod_dims": lambda x: ta.prod(x.unsqueeze(0), 1, keepdim=True),
    "amax": lambda x: x.amax(1),
    "amax_all": lambda x: ta.amax(x, (0, 1)),
    "amin": lambda x: x.amin(0, keepdim=True),
    "var_mean": lambda x: ta.var_mean(x, 1),
    "std_mean": lambda x: ta.std_mean(x, 0, correction=0),
    "norm": lambda x: x.norm() + x.norm(1, dim=1).sum(),
    "vector_norm": lambda x: ta.linalg.vector_norm(x, 3, dim=0),
    "vector_norm_inf": lambda x: ta.linalg.vector_norm(x, float("inf"), dim=1),
    "vector_norm_2": lambda x: ta.linalg.vector_norm(x),
    "vector_norm_frac": lambda x: ta.linalg.vector_norm(x, 1.5, dim=(0, 1), keepdim=True),
    "sort": lambda x: x.sort(1)[0],
    "sort_descending": lambda x: ta.sort(x, 0, descending=True)[0],
    "topk": lambda x: x.topk(2)[0],
    "topk_smallest": lambda x: ta.topk(x, 2, dim=0, largest=False)[0],
    "kthvalue": lambda x: x.kthvalue(2, 1)[0],
    "median": lambda x: x.median() + x.median(1)[0].sum(),
    "mode": lambda x: x.mode(1)[0],
    "take_along_dim": lambda x: ta.take_along_dim(x, _t([[0, 3, 3], [1, 0, 2], [2, 2, 2]]), 1),
    "take_along_dim_flat": lambda x: x.take_along_dim(_t([11, 0, 0, 5])),
}


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("op", list(ROWS))
def test_gradcheck(op, view):
    check(ROWS[op], [((3, 4), view, "real")])


@pytest.mark.parametrize("op", list(ROWS))
def test_gradcheck_on_device(gpu_device, op, monkeypatch):
    monkeypatch.setitem(DEVICE, "name", gpu_device)
    check(ROWS[op], [((3, 4), "transposed", "real")])


TESTS_OF: dict = {}
COVERED = set(ROWS) | set(TESTS_OF)
