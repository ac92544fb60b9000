"""Index-writing and shaping ops against torch: values, dtypes, shapes, gradients, errors;
and the view ops' promise: they share the input's storage and allocate nothing.

ROWS is the table (op name -> cases) that tests/rows_vs_torch.py runs.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from rows_vs_torch import Case, arr, case_ids, check_case, randn

import tinygrad_attn as ta
from tinygrad_attn.memory import state as ledger_state

I64, F32, B = np.int64, np.float32, np.bool_
X = randn(3, 4)
IDX = arr([[0, 1, 0, 2], [2, 2, 1, 0]], I64)
UNIQUE = arr([[1, 0, 2, 3], [0, 2, 1, 1]], I64)
MASK = arr([[True, False, True, False], [False, False, True, True], [True, True, False, False]],
           B)


def _fn(lib):
    return lib.functional if lib is ta else lib.nn.functional


def _scatter_rows():
    return [
        Case(lambda lib, x, i, s: x.scatter(0, i, s), (X, UNIQUE[:1] % 3, randn(1, 4, seed=3))),
        Case(lambda lib, x, i: lib.scatter(x, 1, i, value=2.5), (X, arr([[3], [0], [1]], I64)),
             "transposed"),
        Case(lambda lib, x, i: x.scatter(1, i, 1.5), (X, arr([[3], [0], [1]], I64)), "sliced"),
        Case(lambda lib, x, i, s: x.scatter(0, i, s), (arr([1, 2, 3], I64), arr([2, 0], I64),
                                                       arr([7, 8], I64))),
        Case(lambda lib, x, i, s: x.scatter(0, i, s), (X, arr([[5, 0, 0, 0]], I64),
                                                       randn(1, 4)), raises=RuntimeError),
        Case(lambda lib, x, i, s: x.scatter(0, i, s), (X, arr([[0.0, 1, 0, 0]]), randn(1, 4)),
             raises=RuntimeError),
    ]


BOOLS = np.array([[True, False, True], [False, False, True]])

ROWS = {
    "scatter": _scatter_rows(),
    "scatter_add": [
        Case(lambda lib, x, i, s: x.scatter_add(0, i, s), (X, IDX, randn(2, 4, seed=4))),
        Case(lambda lib, x, i, s: lib.scatter_add(x, 0, i, s), (X, IDX, randn(2, 4, seed=4)),
             "transposed"),
        Case(lambda lib, x, i, s: x.scatter_add(0, i, s), (arr([0, 0], I64), arr([1, 1, 0], I64),
                                                           arr([1, 2, 3], I64))),
        Case(lambda lib, x, i, s: x.scatter_add(0, i, s), (np.zeros(0), np.zeros(0, I64),
                                                           np.zeros(0))),
    ],
    "scatter_reduce": [
        Case(lambda lib, x, i, s, r=r, inc=inc: x.scatter_reduce(0, i, s, r, include_self=inc),
             (X, IDX, randn(2, 4, seed=5)), layout)
        for r in ("sum", "prod", "mean", "amax", "amin") for inc in (True, False)
        for layout in ("contiguous", "transposed")
    ] + [
        Case(lambda lib, x, i, s: x.scatter_reduce(0, i, s, "prod"),
             (arr([[0.0, 2, 1, 0], [1, 0, 3, 2], [2, 1, 0, 1]]), IDX, arr([[0.0, 1, 2, 0],
                                                                          [3, 0, 0, 1]]))),
        Case(lambda lib, x, i, s: x.scatter_reduce(0, i, s, "amax"),
             (arr([[1.0, 2, 2, 0], [1, 0, 3, 2], [2, 1, 0, 1]]), IDX, arr([[1.0, 2, 2, 0],
                                                                          [2, 0, 3, 2]]))),
        Case(lambda lib, x, i, s: x.scatter_reduce(0, i, s, "mean"),
             (arr([4, 5, 6], I64), arr([0, 0, 2], I64), arr([1, 2, 3], I64))),
        Case(lambda lib, x, i, s: x.scatter_reduce(0, i, s, "median"), (X, IDX, randn(2, 4)),
             raises=RuntimeError),
    ],
    "index_add": [
        Case(lambda lib, x, i, s: x.index_add(0, i, s), (X, arr([2, 0, 2], I64), randn(3, 4))),
        Case(lambda lib, x, i, s: lib.index_add(x, 1, i, s, alpha=2.0),
             (X, arr([3, 3], I64), randn(3, 2)), "transposed"),
        Case(lambda lib, x, i, s: x.index_add(0, i, s), (arr([1, 2], I64), arr([1, 1], I64),
                                                         arr([5, 6], I64))),
        Case(lambda lib, x, i, s: x.index_add(0, i, s), (X, arr([5], I64), randn(1, 4)),
             raises=RuntimeError),
        # no promotion: the source must have the input's dtype
        Case(lambda lib, x, i, s: x.index_add(0, i, s),
             (X, arr([0], I64), randn(1, 4, dtype=np.float32)), raises=RuntimeError),
        Case(lambda lib, x, i, s: x.index_add(0, i, s),
             (X, arr([0], I64), arr([[1, 2, 3, 4]], I64)), raises=RuntimeError),
    ],
    "index_copy": [
        Case(lambda lib, x, i, s: x.index_copy(1, i, s), (X, arr([3, 0], I64), randn(3, 2)),
             "sliced"),
        Case(lambda lib, x, i, s: lib.index_copy(x, 0, i, s), (X, arr([1], I64), randn(1, 4))),
        Case(lambda lib, x, i, s: x.index_copy(0, i, s),
             (X, arr([1], I64), randn(1, 4, dtype=np.float32)), raises=RuntimeError),
    ],
    "index_fill": [
        Case(lambda lib, x, i: x.index_fill(1, i, -1.0), (X, arr([1, 3], I64)), "transposed"),
        Case(lambda lib, x, i: x.index_fill(0, i, 7), (arr([1, 2, 3], I64), arr([0, 2], I64))),
        Case(lambda lib, x, i: x.index_fill(0, i, 1.0), (X, arr([5], I64)), raises=IndexError),
    ],
    "masked_select": [
        Case(lambda lib, x, m: x.masked_select(m), (X, MASK)),
        Case(lambda lib, x, m: lib.masked_select(x, m), (X, MASK[:1]), "transposed"),
        Case(lambda lib, x, m: x.masked_select(m), (arr(2.0), arr(True, B))),
        Case(lambda lib, x, m: x.masked_select(m), (arr([1, 2], I64), arr([False, True], B))),
        Case(lambda lib, x, m: x.masked_select(m), (np.zeros((0, 2)), np.zeros((0, 2), B))),
    ],
    "masked_scatter": [
        Case(lambda lib, x, m, s: x.masked_scatter(m, s), (X, MASK, randn(3, 4, seed=6))),
        Case(lambda lib, x, m, s: x.masked_scatter(m, s), (X, MASK[:1], randn(2, 4, seed=6)),
             "sliced"),
    ],
    "nonzero": [
        Case(lambda lib, x: x.nonzero(), (arr([[0, 1], [2, 0]], I64),)),
        Case(lambda lib, x: lib.nonzero(x, as_tuple=True), (MASK,), "transposed"),
        Case(lambda lib, x: x.nonzero(), (arr(3.0),)),
        Case(lambda lib, x: x.nonzero(), (np.zeros((0, 3)),)),
    ],
    "one_hot": [
        Case(lambda lib, x: _fn(lib).one_hot(x), (arr([0, 2, 1], I64),)),
        Case(lambda lib, x: _fn(lib).one_hot(x, 4), (arr([[0, 3], [1, 1]], I64),), "transposed"),
        Case(lambda lib, x: _fn(lib).one_hot(x, 3), (arr(1, I64),)),
        Case(lambda lib, x: _fn(lib).one_hot(x, 2), (arr([0, 2], I64),), raises=RuntimeError),
        Case(lambda lib, x: _fn(lib).one_hot(x), (arr([-1], I64),), raises=RuntimeError),
    ],
    "flip": [
        Case(lambda lib, x: x.flip(0), (X,)), Case(lambda lib, x: lib.flip(x, (0, 1)), (X,),
                                                   "transposed"),
        Case(lambda lib, x: x.flip(-1), (X,), "sliced"),
        Case(lambda lib, x: x.flip(0), (arr(1.0),)),
        Case(lambda lib, x: x.flip(1), (np.zeros((0, 2)),)),
        Case(lambda lib, x: x.flip(0), (arr([1, 2, 3], I64),)),
    ],
    "roll": [
        Case(lambda lib, x: x.roll(1, 0), (X,)), Case(lambda lib, x: lib.roll(x, (1, -3), (0, 1)),
                                                      (X,), "transposed"),
        Case(lambda lib, x: x.roll(5), (X,), "sliced"), Case(lambda lib, x: x.roll(1), (arr(2.0),)),
    ],
    "repeat": [
        Case(lambda lib, x: x.repeat(2, 1, 3), (X,)), Case(lambda lib, x: x.repeat((1, 2)), (X,),
                                                           "transposed"),
        Case(lambda lib, x: x.repeat(3), (arr(2.0),)), Case(lambda lib, x: x.repeat(0, 2), (X,)),
        Case(lambda lib, x: x.repeat(2), (X,), raises=RuntimeError),
    ],
    "tile": [
        Case(lambda lib, x: lib.tile(x, (2,)), (X,), "sliced"),
        Case(lambda lib, x: x.tile((2, 1, 1)), (arr([1, 2], I64),)),
    ],
    "repeat_interleave": [
        Case(lambda lib, x: x.repeat_interleave(2, dim=1), (X,), "transposed"),
        Case(lambda lib, x: lib.repeat_interleave(x, 2), (X,), "sliced"),
        Case(lambda lib, x, r: x.repeat_interleave(r, dim=0), (X, arr([1, 0, 3], I64))),
        Case(lambda lib, r: lib.repeat_interleave(r), (arr([2, 0, 1], I64),)),
        Case(lambda lib, x, r: x.repeat_interleave(r, dim=0), (X, arr([1, 2], I64)),
             raises=RuntimeError),
    ],
    "diagonal": [
        Case(lambda lib, x: x.diagonal(), (X,)), Case(lambda lib, x: x.diagonal(1), (X,),
                                                      "transposed"),
        Case(lambda lib, x: lib.diagonal(x, -1, 1, 0), (X,), "sliced"),
        Case(lambda lib, x: x.diagonal(5), (X,)),
        Case(lambda lib, x: x.diagonal(0, 0, 2), (randn(2, 3, 2),)),
        Case(lambda lib, x: x.diagonal(), (arr([1.0]),), raises=IndexError),
    ],
    "diag": [
        Case(lambda lib, x: x.diag(), (X,)), Case(lambda lib, x: lib.diag(x, -1), (X,), "sliced"),
        Case(lambda lib, x: lib.diag(x[0], 1), (X,), "transposed"),
        Case(lambda lib, x: x.diag(), (arr([1, 2], I64),)),
    ],
    "tril_indices": [Case(lambda lib: lib.tril_indices(3, 4, 1), ()),
                     Case(lambda lib: lib.tril_indices(0, 2), ())],
    "triu_indices": [Case(lambda lib: lib.triu_indices(3, 3, -1), ()),
                     Case(lambda lib: lib.triu_indices(4, 2), ())],
    "meshgrid": [
        Case(lambda lib, a, b: lib.meshgrid(a, b, indexing="ij"), (randn(3), randn(2, seed=1))),
        Case(lambda lib, a, b: lib.meshgrid([a, b], indexing="xy"), (randn(3), randn(2, seed=1))),
        Case(lambda lib, a, b: lib.meshgrid(a, b, indexing="ij"), (arr([1, 2], I64), arr(3, I64))),
    ],
    "movedim": [
        Case(lambda lib, x: x.movedim(0, -1), (randn(2, 3, 4),)),
        Case(lambda lib, x: lib.movedim(x, (0, 1), (2, 0)), (randn(2, 3, 4),), "transposed"),
        Case(lambda lib, x: lib.moveaxis(x, 1, 0), (X,), "sliced"),
    ],
    "swapaxes": [
        Case(lambda lib, x: x.swapaxes(0, 1), (X,), "sliced"),
        Case(lambda lib, x: lib.swapdims(x, -1, 0), (X,), "transposed"),
    ],
    "unfold": [
        Case(lambda lib, x: x.unfold(1, 2, 1), (X,)), Case(lambda lib, x: x.unfold(0, 2, 1), (X,),
                                                           "transposed"),
        Case(lambda lib, x: x.unfold(-1, 1, 2), (X,), "sliced"),
        Case(lambda lib, x: x.unfold(0, 1, 1), (arr(2.0),)),
        Case(lambda lib, x: x.unfold(1, 5, 1), (X,), raises=RuntimeError),
    ],
    "pad": [
        Case(lambda lib, x, m=m: _fn(lib).pad(x.unsqueeze(0), (2, 1, 1, 2), mode=m), (X,), lay)
        for m in ("constant", "reflect", "replicate", "circular")
        for lay in ("contiguous", "transposed")
    ] + [
        Case(lambda lib, x: _fn(lib).pad(x, (-1, 2, 1, -2), value=3.0), (X,), "sliced"),
        Case(lambda lib, x: _fn(lib).pad(x, (1, 1), value=7), (arr([1, 2], I64),)),
        Case(lambda lib, x: _fn(lib).pad(x, (1, 2, 3)), (X,), raises=RuntimeError),
        Case(lambda lib, x: _fn(lib).pad(x.unsqueeze(0), (4, 0), mode="reflect"), (X,),
             raises=RuntimeError),
    ],
    "einsum": [
        Case(lambda lib, a: lib.einsum("ij,kj->ik", a, a), (np.arange(6).reshape(2, 3),)),
        Case(lambda lib, a: lib.einsum("ij,kj->ik", a, a), (BOOLS,), raises=RuntimeError),
        Case(lambda lib, a, b: lib.einsum("bhqd,bhkd->bhqk", a, b),
             (randn(2, 3, 4, 5), randn(2, 3, 6, 5, seed=1))),
        Case(lambda lib, a, b: lib.einsum("ij,jk", a, b), (X, randn(4, 2, seed=1)), "transposed"),
        Case(lambda lib, a: lib.einsum("ii->i", a), (randn(3, 3),), "sliced"),
        Case(lambda lib, a: lib.einsum("ii", a), (randn(3, 3),)),
        Case(lambda lib, a: lib.einsum("ij->", a), (X,)),
        Case(lambda lib, a, b: lib.einsum("i,j->ij", a, b), (randn(3), randn(4, seed=1))),
        Case(lambda lib, a, b: lib.einsum("...ij,...jk->...ik", a, b),
             (randn(2, 3, 4), randn(4, 5, seed=1))),
        Case(lambda lib, a, b, c: lib.einsum("bij,bjk,bkl->bil", a, b, c),
             (randn(2, 3, 4), randn(2, 4, 5, seed=1), randn(2, 5, 3, seed=2))),
        Case(lambda lib, a, b: lib.einsum("ij,kj->ik", a, b), (randn(1, 4), X)),
        Case(lambda lib, a, b: lib.einsum("iij,jk->ik", a, b), (randn(3, 3, 2), randn(2, 4))),
        Case(lambda lib, a, b: lib.einsum("i,i", a, b), (randn(3).astype(F32),
                                                         randn(3, seed=1).astype(F32))),
        Case(lambda lib, a: lib.einsum("i->", a), (np.zeros(0),)),
        Case(lambda lib, a, b: lib.einsum("ij,jk", a, b), (X, randn(3, 2)), raises=RuntimeError),
    ],
}

PARAMS, IDS = case_ids(ROWS)


@pytest.mark.parametrize("name,k", PARAMS, ids=IDS)
def test_matches_torch(name, k):
    torch = pytest.importorskip("torch")
    check_case(ROWS[name][k], torch)


# ----------------------------------------------------------------------------- views
class _Allocs:
    def __init__(self):
        self.allocs = []

    def on_alloc(self, storage):
        self.allocs.append(storage)

    def __getattr__(self, name):
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


@contextlib.contextmanager
def _count_allocs():
    obs = _Allocs()
    ledger_state.observers.append(obs)
    try:
        yield obs.allocs
    finally:
        ledger_state.observers.remove(obs)


VIEWS = {
    "diagonal": lambda lib, x: x.diagonal(1),
    "diagonal_dims": lambda lib, x: x.diagonal(-1, 1, 0),
    "unfold": lambda lib, x: x.unfold(1, 2, 1),
    "movedim": lambda lib, x: x.movedim(0, 1),
    "moveaxis": lambda lib, x: lib.moveaxis(x, 1, 0),
    "swapaxes": lambda lib, x: x.swapaxes(0, 1),
    "swapdims": lambda lib, x: x.swapdims(1, 0),
    "meshgrid": lambda lib, x: lib.meshgrid(x[0], x[:, 1], indexing="ij")[1],
}


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("name", list(VIEWS))
def test_view_ops_share_storage_and_allocate_nothing(name, layout):
    base = ta.randn(3, 4, requires_grad=True)
    x = base if layout == "contiguous" else ta.randn(4, 3).transpose(0, 1)
    with _count_allocs() as allocs:
        y = VIEWS[name](ta, x)
    assert allocs == [], f"{name} allocated {allocs}"
    assert y.shares_storage(x)
    torch = pytest.importorskip("torch")
    ref = VIEWS[name](torch, torch.tensor(x.detach().numpy().copy()))  # same op, values
    np.testing.assert_array_equal(y.detach().numpy(), ref.numpy())


def test_unfold_windows_overlap_in_memory():
    x = ta.arange(6.0)
    w = x.unfold(0, 3, 1)  # (4, 3), strides (1, 1)
    assert w.stride() == (1, 1) and w.shares_storage(x)
    x[2] = 10.0  # one write shows in the three windows that hold it
    assert w[:, :].numpy()[[0, 1, 2], [2, 1, 0]].tolist() == [10.0, 10.0, 10.0]


def test_diagonal_backward_is_one_input_sized_buffer():
    x = ta.randn(4, 5, requires_grad=True)
    x.diagonal(1).sum().backward()
    expected = np.zeros((4, 5), dtype=np.float32)
    expected[[0, 1, 2, 3], [1, 2, 3, 4]] = 1
    np.testing.assert_array_equal(x.grad.numpy(), expected)


def test_einsum_attention_scores_are_one_matmul_and_no_copy():
    q, k = ta.randn(2, 3, 4, 5), ta.randn(2, 3, 6, 5)
    with _count_allocs() as allocs:
        scores = ta.einsum("bhqd,bhkd->bhqk", q, k)
    assert scores.shape == (2, 3, 4, 6)
    assert len(allocs) == 1 and allocs[0].nbytes == scores.nbytes  # the matmul's output


def test_einsum_reshape_that_must_copy_is_recorded():
    a = ta.randn(4, 3).transpose(0, 1)  # (3, 4), column-major
    b = ta.randn(3, 4, 5)
    with _count_allocs() as allocs:
        ta.einsum("ij,ijk->k", a, b)
    assert [s.copy_reason for s in allocs if s.copy_reason] == ["reshape-copy"]


def test_flip_copies_as_torch_does():
    x = ta.randn(3, 4)
    y = x.flip(0)
    assert not y.shares_storage(x) and y.is_contiguous()
