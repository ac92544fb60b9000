"""Gradcheck rows (float64, finite differences) for the index-writing ops (scatter*,
index_*, masked_*) and the shaping ops (flip ... pad), on contiguous, transposed and sliced
inputs, and on the GPU (or the fake CuPy). tests/test_registry.py counts these rows."""

from __future__ import annotations

import pytest
from test_gradcheck_ops import DEVICE, _mask, _t, check

import tinygrad_attn as ta

VIEWS = ["contiguous", "transposed", "sliced"]
F = ta.functional


def _src(shape, seed=2):
    ta.manual_seed(seed)
    return ta.randn(*shape, dtype=ta.float64, device=DEVICE["name"])


def _idx():
    return _t([[0, 1, 0, 2], [2, 2, 1, 0]])


ROWS = {
    "scatter": lambda x: x.scatter(0, _t([[0, 1, 2, 0]]), x[1:2] * 2),
    "scatter_value": lambda x: ta.scatter(x, 1, _t([[3], [0], [1]]), value=2.0),
    "scatter_add": lambda x: x.scatter_add(0, _idx(), x[:2] * 3),
    "scatter_reduce_sum": lambda x: x.scatter_reduce(0, _idx(), x[1:] * 2, "sum",
                                                     include_self=False),
    "scatter_reduce_mean": lambda x: x.scatter_reduce(0, _idx(), x[1:] * 2, "mean"),
    "scatter_reduce_prod": lambda x: x.scatter_reduce(0, _idx(), x[1:] + 1, "prod"),
    "scatter_reduce_amax": lambda x: ta.scatter_reduce(x, 0, _idx(), x[1:] * 2, "amax"),
    "scatter_reduce_amin": lambda x: x.scatter_reduce(0, _idx(), x[1:] * 2, "amin",
                                                      include_self=False),
    "index_add": lambda x: x.index_add(0, _t([2, 0, 2]), x * 2, alpha=0.5),
    "index_copy": lambda x: x.index_copy(1, _t([3, 0]), x[:, 1:3] * 2),
    "index_fill": lambda x: x.index_fill(1, _t([1, 3]), -1.0),
    "masked_select": lambda x: x.masked_select(_mask((3, 4))),
    "masked_select_broadcast": lambda x: ta.masked_select(x, _mask((1, 4), seed=3)),
    "masked_scatter": lambda x: x.masked_scatter(_mask((3, 4)), x.flip(0) * 2),
    "flip": lambda x: x.flip(0) * x.flip((0, 1)),
    "roll": lambda x: x.roll((1, -2), (0, 1)) + ta.roll(x, 5),
    "repeat": lambda x: x.repeat(2, 1, 3),
    "tile": lambda x: ta.tile(x, (2,)),
    "repeat_interleave": lambda x: x.repeat_interleave(2, dim=1),
    "repeat_interleave_counts": lambda x: x.repeat_interleave(_t([1, 0, 3]), dim=0),
    "repeat_interleave_flat": lambda x: ta.repeat_interleave(x, 2),
    "diagonal": lambda x: x.diagonal() * 2 + x.diagonal(1, 1, 0).sum(),
    "diagonal_offset": lambda x: ta.diagonal(x.unsqueeze(0), -1, 1, 2),
    "diag": lambda x: x.diag(1),
    "diag_of_vector": lambda x: ta.diag(x[1], -1),
    "meshgrid": lambda x: ta.meshgrid(x[0], x[1, :3], indexing="xy"),
    "movedim": lambda x: x.unsqueeze(0).movedim(0, 2) * 2,
    "moveaxis": lambda x: ta.moveaxis(x.unsqueeze(2), (0, 2), (2, 0)) * 2,
    "swapaxes": lambda x: x.swapaxes(0, 1) * 2,
    "swapdims": lambda x: ta.swapdims(x, 1, 0) * 2,
    "unfold": lambda x: x.unfold(1, 2, 1) * 3,
    "unfold_step": lambda x: x.unfold(0, 2, 2) * 3,
    "pad": lambda x: F.pad(x, (2, 1, -1, 2), value=3.0),
    "pad_reflect": lambda x: F.pad(x.unsqueeze(0), (2, 1, 1, 2), mode="reflect"),
    "pad_replicate": lambda x: F.pad(x, (3, 1), mode="replicate"),
    "pad_circular": lambda x: F.pad(x.unsqueeze(0), (1, 2, 2, 0), mode="circular"),
    "einsum_matmul": lambda x: ta.einsum("ij,kj->ik", x, x * 2),
    "einsum_batched": lambda x: ta.einsum("bij,bkj->bik", x.view(3, 2, 2), x.view(3, 2, 2)),
    "einsum_trace_sum": lambda x: ta.einsum("ii", x[:, :3]) + ta.einsum("ij->", x),
    "einsum_outer_ellipsis": lambda x: ta.einsum("...i,j->...ij", x, x[0]),
    "einsum_three": lambda x: ta.einsum("ij,jk,kl->il", x, x.T, x),
}


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("op", list(ROWS))
def test_gradcheck(op, view):
    check(ROWS[op], [((3, 4), view, "real")])


def test_gradcheck_src_of_scatter_separately():
    # src as its own leaf (larger than the index, as torch allows); plain scatter with
    # unique positions per row (with repeats the last write wins, and torch's gradient too
    # is only defined for unique ones)
    check(lambda x, s: x.scatter_reduce(0, _idx(), s, "prod")
          + x.scatter(1, _t([[3, 1, 0], [0, 2, 1]]), s),
          [((3, 4), "transposed", "real"), ((2, 5), "sliced", "real")])
    check(lambda x, s: x.index_add(1, _t([0, 3, 0]), s) * x.masked_scatter(_mask((3, 4)), s),
          [((3, 4), "contiguous", "real"), ((3, 3), "transposed", "real")])


def test_gradcheck_scatter_prod_with_zeros():
    # zeros in self and in src, one zero and two at a position (index columns 0 and 2 send
    # both src rows to row 0): the zero-safe branches of the prod gradient, whose recorded
    # text gives the second derivative
    idx = _t([[0, 1, 0, 2], [0, 2, 0, 0]])
    zero_self = _t([[True, False, False, True], [False, False, False, False],
                    [False, True, False, False]])
    zero_src = _t([[True, False, True, False], [True, False, False, True]])
    check(lambda x, s: x.masked_fill(zero_self, 0.0).scatter_reduce(
              0, idx, s.masked_fill(zero_src, 0.0), "prod"),
          [((3, 4), "contiguous", "real"), ((2, 4), "transposed", "real")])
    check(lambda x, s: x.masked_fill(zero_self, 0.0).scatter_reduce(
              0, idx, s.masked_fill(zero_src, 0.0), "prod", include_self=False),
          [((3, 4), "sliced", "real"), ((2, 4), "contiguous", "real")])


def _setitem_mixed(x):
    y = x * 1
    y[1, _t([0, 2])] = x[0, :2] * 3  # an int and an index array: torch's placement
    y[_t([True, False, True])] = y[_t([True, False, True])] * 2  # a row mask
    return y


def test_gradcheck_advanced_index_edges():
    # a 0-d mask (True: a new dim of one; False: of none), on a 0-d tensor and on rows; a
    # write by an int and an index array, and by a mask (the backward writes zeros there)
    check(lambda x: x[1, 2][True] * 2 + x[0, 1][False].sum() + x[True, 1:, _t([3, 0])],
          [((3, 4), "transposed", "real")])
    check(_setitem_mixed, [((3, 4), "sliced", "real")])


@pytest.mark.parametrize("op", list(ROWS))
def test_gradcheck_on_device(gpu_device, op, monkeypatch):
    monkeypatch.setitem(DEVICE, "name", gpu_device)
    check(ROWS[op], [((3, 4), "transposed", "real")])


TESTS_OF = {"scatter": test_gradcheck_src_of_scatter_separately}
COVERED = set(ROWS) | set(TESTS_OF)
