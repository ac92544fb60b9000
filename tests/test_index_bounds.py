"""Index writes with negative and out-of-range positions, per op as torch 2.13 takes them:
scatter, scatter_add, scatter_reduce refuse any i < 0 (RuntimeError), index_add and
index_copy too (index_add: RuntimeError, IndexError for a 1-D input; index_copy:
IndexError), index_fill and setitem count -n <= i < 0 from the end."""

from __future__ import annotations

import numpy as np
import pytest

import tinygrad_attn as ta

OPS = {
    "scatter": lambda lib, x, i: x.scatter(1, i, lib.ones(i.shape)),
    "scatter value": lambda lib, x, i: x.scatter(1, i, 1.0),
    "scatter_add": lambda lib, x, i: x.scatter_add(1, i, lib.ones(i.shape)),
    "scatter_reduce": lambda lib, x, i: x.scatter_reduce(1, i, lib.ones(i.shape), "amax"),
    "index_add": lambda lib, x, i: x.index_add(1, i[0], lib.ones(2, i.shape[1])),
    "index_add 1-d": lambda lib, x, i: x[0].index_add(0, i[0], lib.ones(i.shape[1])),
    "index_copy": lambda lib, x, i: x.index_copy(1, i[0], lib.ones(2, i.shape[1])),
    "index_fill": lambda lib, x, i: x.index_fill(1, i[0], 1.0),
    "setitem": lambda lib, x, i: x.__setitem__((slice(None), i[0]), 1.0) or x,
}
POSITIONS = {"-1": [[-1], [0]], "-3": [[-3], [1]], "3": [[3], [0]], "-4": [[-4], [0]],
             "in range": [[2], [1]]}


def _run(lib, name, pos):
    x = lib.zeros(2, 3)
    try:
        return None, OPS[name](lib, x, lib.tensor(pos))
    except Exception as e:  # noqa: BLE001 - the type is compared
        return type(e), None


@pytest.mark.parametrize("pos", list(POSITIONS))
@pytest.mark.parametrize("name", list(OPS))
def test_index_positions_match_torch(name, pos):
    torch = pytest.importorskip("torch")
    want_err, want = _run(torch, name, POSITIONS[pos])
    got_err, got = _run(ta, name, POSITIONS[pos])
    if want_err is not None:
        assert got_err is want_err, (name, pos, got_err, want_err)
    else:
        assert got_err is None, (name, pos, got_err)
        np.testing.assert_array_equal(np.asarray(got.tolist()), want.numpy())


def test_scatter_negative_message_names_the_op_and_size():
    with pytest.raises(RuntimeError, match=r"scatter: index -1 is out of bounds for dimension "
                       r"0 with size 3"):
        ta.zeros(3).scatter(0, ta.tensor([-1]), ta.ones(1))
