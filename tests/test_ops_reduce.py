"""Reductions, scans and sorting against torch: values, dtypes, shapes, gradients, errors.

ROWS is the table (op name -> cases) that tests/rows_vs_torch.py runs; each case covers one of
0-d, empty, non-contiguous input, an accepted dtype, or an error torch raises.
"""

from __future__ import annotations

import numpy as np
import pytest
from rows_vs_torch import Case, arr, case_ids, check_case, randn

import tinygrad_attn as ta

I64, F32, B = np.int64, np.float32, np.bool_
INF = float("inf")
X = randn(3, 4)
ZEROS = arr([[0.0, 2.0, 0.0, 1.5], [1.0, 0.0, 3.0, 2.0], [0.5, 1.5, -2.0, 0.0]])
TIES = arr([[1.0, 2.0, 2.0], [3.0, 3.0, 0.0]])


def _rows_for_scan(name):
    def f(lib, x, d=1):
        return getattr(x, name)(d)

    return [
        Case(f, (X,)), Case(f, (X,), "transposed"), Case(f, (X,), "sliced"),
        Case(lambda lib, x: getattr(lib, name)(x, 0), (arr(2.5),)),
        Case(lambda lib, x: getattr(x, name)(0), (np.zeros((0, 3)),)),
        Case(lambda lib, x: getattr(x, name)(-1), (randn(2, 3, seed=1).astype(F32),)),
        Case(lambda lib, x: getattr(x, name)(2), (X,), raises=IndexError),
    ]


BOOLS = np.array([[True, False, True], [False, False, True]])

ROWS = {
    "cumsum": _rows_for_scan("cumsum") + [
        Case(lambda lib, x: x.cumsum(0), (arr([1, 2, 3], I64),)),
        Case(lambda lib, x: x.cumsum(0), (arr([True, False, True], B),)),
        Case(lambda lib, x: x.cumsum(0, dtype=lib.float64), (arr([1, 2], I64),)),
    ],
    "cumprod": _rows_for_scan("cumprod") + [
        Case(lambda lib, x: x.cumprod(1), (ZEROS,)),
        Case(lambda lib, x: x.cumprod(0), (ZEROS,), "transposed"),
        Case(lambda lib, x: x.cumprod(0), (arr([2, 3, 4], I64),)),
    ],
    "cummax": _rows_for_scan("cummax") + [Case(lambda lib, x: x.cummax(1), (TIES,)),
                                          Case(lambda lib, x: x.cummax(0), (arr([3, 1, 5], I64),))],
    "cummin": _rows_for_scan("cummin") + [Case(lambda lib, x: x.cummin(1), (TIES,))],
    "logcumsumexp": _rows_for_scan("logcumsumexp") + [
        Case(lambda lib, x: x.logcumsumexp(0), (arr([2.0, -1000.0, 3.0, -INF]),)),
    ],
    "prod": [
        Case(lambda lib, x: x.prod(), (X,)), Case(lambda lib, x: x.prod(1), (X,), "transposed"),
        Case(lambda lib, x: x.prod(0, keepdim=True), (X,), "sliced"),
        Case(lambda lib, x: x.prod(1), (ZEROS,)), Case(lambda lib, x: x.prod(0), (ZEROS,)),
        Case(lambda lib, x: x.prod(), (ZEROS,)), Case(lambda lib, x: x.prod(), (arr(3.0),)),
        Case(lambda lib, x: x.prod(0), (np.zeros((0, 2)),)),
        Case(lambda lib, x: x.prod(), (arr([2, 3], I64),)),
        Case(lambda lib, x: x.prod(), (arr([True, True], B),)),
        Case(lambda lib, x: lib.prod(x, 1, dtype=lib.float64), (arr([[2, 3]], I64),)),
    ],
    "amax": [
        Case(lambda lib, x: x.amax(), (X,)), Case(lambda lib, x: x.amax(1), (TIES,)),
        Case(lambda lib, x: x.amax((0, 1)), (TIES,), "transposed"),
        Case(lambda lib, x: lib.amax(x, 0, keepdim=True), (X,), "sliced"),
        Case(lambda lib, x: x.amax(), (arr(2.0),)),
        Case(lambda lib, x: x.amax(1), (np.zeros((0, 2)),)),
        Case(lambda lib, x: x.amax(0), (arr([3, 1], I64),)),
        Case(lambda lib, x: x.amax(), (np.zeros((0, 2)),), raises=RuntimeError),
    ],
    "amin": [
        Case(lambda lib, x: x.amin(1), (TIES,)), Case(lambda lib, x: x.amin(), (TIES,)),
        Case(lambda lib, x: lib.amin(x, -1), (X,), "transposed"),
    ],
    "any": [
        Case(lambda lib, x: x.any(), (arr([0, 1], I64),)),
        Case(lambda lib, x: x.any(1), (arr([[0, 0], [0, 2]], I64),), "transposed"),
        Case(lambda lib, x: lib.any(x, 0, keepdim=True), (arr([[False, True]], B),)),
        Case(lambda lib, x: x.any(), (arr([0, 3], np.uint8),)),
        Case(lambda lib, x: x.any(), (np.zeros((0,)),)), Case(lambda lib, x: x.any(), (arr(1.0),)),
        Case(lambda lib, x: x.any(0), (X,), "sliced"),
    ],
    "all": [
        Case(lambda lib, x: x.all(), (arr([0, 1], I64),)),
        Case(lambda lib, x: x.all(dim=1), (arr([[1, 0], [2, 2]], I64),), "transposed"),
        Case(lambda lib, x: x.all(), (np.zeros((0,)),)),
        Case(lambda lib, x: x.all(1), (arr([[3, 0], [1, 1]], np.uint8),)),
    ],
    "count_nonzero": [
        Case(lambda lib, x: x.count_nonzero(), (ZEROS,)),
        Case(lambda lib, x: lib.count_nonzero(x, 0), (ZEROS,), "transposed"),
        Case(lambda lib, x: x.count_nonzero(), (arr(0.0),)),
        Case(lambda lib, x: x.count_nonzero(dim=1), (arr([[True, False]], B),)),
    ],
    "var_mean": [
        Case(lambda lib, x: lib.var_mean(x, 1), (X,)),
        Case(lambda lib, x: lib.var_mean(x, 0, correction=0, keepdim=True), (X,), "transposed"),
        Case(lambda lib, x: lib.var_mean(x), (X,), "sliced"),
    ],
    "std_mean": [
        Case(lambda lib, x: lib.std_mean(x, 1), (X,)),
        Case(lambda lib, x: lib.std_mean(x, (0, 1), correction=0), (X,), "transposed"),
    ],
    "vector_norm": [
        # dtype= widens a floating input only
        Case(lambda lib, x: lib.linalg.vector_norm(x, dtype=lib.float64),
             (np.array([1.0, -2.0], np.float32),), all_grads=True),
        Case(lambda lib, x: lib.linalg.vector_norm(x, dtype=lib.float32), (X,),
             raises=RuntimeError),
        Case(lambda lib, x: lib.linalg.vector_norm(x, dtype=lib.float64),
             (np.array([1, -2], np.int64),), raises=RuntimeError),
    ] + [
        Case(lambda lib, x, o=o: lib.linalg.vector_norm(x, o), (arr([1.0, -3.0, 3.0, 0.0]),))
        for o in (1, 2, 3, 0.5, INF, -INF, 0)
    ] + [
        Case(lambda lib, x, o=o: lib.linalg.vector_norm(x, o), (np.zeros(3),))
        for o in (1, 2, 3, INF)
    ] + [
        Case(lambda lib, x: lib.linalg.vector_norm(x, 2, dim=1), (X,), "transposed"),
        Case(lambda lib, x: lib.linalg.vector_norm(x, 1, dim=(0, 1), keepdim=True), (X,), "sliced"),
        Case(lambda lib, x: lib.linalg.vector_norm(x), (arr(-2.0),)),
        Case(lambda lib, x: lib.linalg.vector_norm(x), (np.zeros((0, 2)),)),
        Case(lambda lib, x: lib.linalg.vector_norm(x), (arr([1, 2], I64),), raises=RuntimeError),
    ],
    "norm": [
        Case(lambda lib, x: x.norm(), (X,)),
        Case(lambda lib, x: x.norm(1, dim=1), (X,), "transposed"),
        Case(lambda lib, x: lib.norm(x, dim=0, keepdim=True), (X,), "sliced"),
        Case(lambda lib, x: x.norm(p="fro"), (X.astype(F32),)),
    ],
    "sort": [
        Case(lambda lib, x: x.sort(), (X,)), Case(lambda lib, x: x.sort(0, descending=True), (X,),
                                                  "transposed"),
        Case(lambda lib, x: lib.sort(x, dim=-1, stable=True), (TIES,), "sliced"),
        Case(lambda lib, x: x.sort(descending=True, stable=True), (TIES,)),
        Case(lambda lib, x: x.sort(), (arr(1.5),)),
        Case(lambda lib, x: x.sort(0), (np.zeros((0, 2)),)),
        Case(lambda lib, x: x.sort(stable=True), (arr([3, 1, 3, 2], I64),)),
        Case(lambda lib, x: x.sort(descending=True), (arr([1.0, np.nan, 0.0]),)),
    ],
    "argsort": [
        Case(lambda lib, x: x.argsort(stable=True), (TIES,)),
        Case(lambda lib, x: lib.argsort(x, dim=0, descending=True, stable=True), (TIES,),
             "transposed"),
        Case(lambda lib, x: x.argsort(), (arr(1.0),)),
    ],
    "topk": [
        Case(lambda lib, x: x.topk(2), (X,)), Case(lambda lib, x: x.topk(2, 0, largest=False), (X,),
                                                   "transposed"),
        Case(lambda lib, x: lib.topk(x, 1, dim=1), (X,), "sliced"),
        Case(lambda lib, x: x.topk(1), (arr(2.0),)), Case(lambda lib, x: x.topk(0), (X,)),
        Case(lambda lib, x: x.topk(2), (arr([5, 1, 7], I64),)),
        Case(lambda lib, x: x.topk(5), (X,), raises=RuntimeError),
        Case(lambda lib, x: x.topk(1), (BOOLS,), raises=RuntimeError),  # no bool kernel
    ],
    "kthvalue": [
        Case(lambda lib, x: x.kthvalue(2), (X,)),
        Case(lambda lib, x: x.kthvalue(3, 0, keepdim=True), (X,), "transposed"),
        Case(lambda lib, x: lib.kthvalue(x, 1, 1), (X,), "sliced"),
        Case(lambda lib, x: x.kthvalue(1), (arr(2.0),)),
        Case(lambda lib, x: x.kthvalue(5), (X,), raises=RuntimeError),
        Case(lambda lib, x: x.kthvalue(1), (BOOLS,), raises=RuntimeError),
    ],
    "median": [
        Case(lambda lib, x: x.median(), (BOOLS,), raises=RuntimeError),
        Case(lambda lib, x: x.median(1), (BOOLS,), raises=RuntimeError),
        Case(lambda lib, x: x.median(), (X,)),
        Case(lambda lib, x: x.median(), (arr([3.0, 3.0, 1.0]),)),
        Case(lambda lib, x: x.median(1), (X,), "transposed"),
        Case(lambda lib, x: lib.median(x, 0, keepdim=True), (X,), "sliced"),
        Case(lambda lib, x: x.median(), (arr(2.0),)),
        Case(lambda lib, x: x.median(), (np.zeros(0),)),
        Case(lambda lib, x: x.median(1), (arr([[1.0, np.nan, 0.0], [2.0, 1.0, 3.0]]),)),
        Case(lambda lib, x: x.median(0), (arr([4, 1, 3, 2], I64),)),
        Case(lambda lib, x: x.median(0), (np.zeros((0, 2)),), raises=IndexError),
    ],
    "mode": [
        Case(lambda lib, x: x.mode(1), (arr([[2.0, 1, 2, 1, 3], [0, 0, 5, 5, 5]]),)),
        Case(lambda lib, x: x.mode(0), (arr([[2.0, 1], [2, 4], [7, 4]]),), "transposed"),
        Case(lambda lib, x: x.mode(), (arr([1, 2, 2, 3, 3, 1], I64),)),
        Case(lambda lib, x: x.mode(1), (np.zeros((2, 0)),), raises=IndexError),
    ],
    "take_along_dim": [
        Case(lambda lib, x, i: lib.take_along_dim(x, i, 1),
             (X, arr([[0, 3], [1, 1], [2, 0]], I64))),
        Case(lambda lib, x, i: x.take_along_dim(i, 0), (X, arr([[2, 0, 1, 1]], I64)), "transposed"),
        Case(lambda lib, x, i: lib.take_along_dim(x, i), (X, arr([11, 0, 0], I64)), "sliced"),
    ],
}

PARAMS, IDS = case_ids(ROWS)


@pytest.mark.parametrize("name,k", PARAMS, ids=IDS)
def test_matches_torch(name, k):
    torch = pytest.importorskip("torch")
    check_case(ROWS[name][k], torch)


def test_take_along_dim_checks_bounds_where_torch_reads_past_the_end():
    # a deliberate difference: torch's CPU kernel does not check these indices
    x = ta.randn(3, 4)
    with pytest.raises(RuntimeError, match="take_along_dim: index out of range"):
        ta.take_along_dim(x, ta.tensor([[1], [0], [5]]), 1)


def test_cumprod_gradient_with_zeros_is_exact():
    x = ta.tensor([2.0, 0.0, 3.0, 0.0, 4.0], requires_grad=True)
    x.cumprod(0).sum().backward()
    assert x.grad.tolist() == [1.0, 8.0, 0.0, 0.0, 0.0]


def test_amax_ties_split_the_gradient_evenly():
    x = ta.tensor([[1.0, 2.0, 2.0], [3.0, 3.0, 3.0]], requires_grad=True)
    x.amax(1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])


def test_sort_and_topk_save_only_their_indices():
    x = ta.randn(4, 5, requires_grad=True)
    for values in (x.sort(1)[0], x.topk(2)[0], x.median(1)[0], x.kthvalue(2)[0]):
        saved = values.grad_fn.saved_tensor_list() if values.grad_fn.name != "SqueezeBackward" \
            else values.grad_fn.next_functions[0][0].saved_tensor_list()
        assert [t.dtype for t in saved] == [ta.int64]
