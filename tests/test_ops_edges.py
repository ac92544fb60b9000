"""Edges of pad, einsum and the range factories, against torch 2.13.

A negative pad crops its side in every mode (reflect and replicate read the output's
positions from the whole input, circular wraps around what is left after the crop); einsum
takes a 0-d operand's empty subscripts and reads '.' only as one '...' per operand;
linspace and arange have no bool form, and linspace's end points must fit the dtype.
"""

from __future__ import annotations

import numpy as np
import pytest
from rows_vs_torch import Case, check_case

import tinygrad_attn as ta


def _pad(mode, pads):
    return lambda lib, x: (ta.functional.pad if lib is ta else
                           lib.nn.functional.pad)(x, pads, mode=mode)


ROW = np.arange(6, dtype=np.float64).reshape(1, 1, 6)
GRID = np.arange(12, dtype=np.float64).reshape(1, 3, 4)
PAD_ROWS = {
    "reflect": [(-1, 2), (2, -2), (-2, -2), (-2, 5), (-5, 1), (-3, -3), (-1, 6), (6, -1)],
    "replicate": [(-1, 2), (2, -2), (-2, -2), (-1, 6), (-2, 5), (6, -1), (-3, -3),
                  (-4, -3)],
    "circular": [(-1, 2), (2, -2), (-2, -2), (-3, -3), (-4, -3), (-1, 5), (-1, 6),
                 (-2, 5), (6, -1)],
    "constant": [(-1, 2), (2, -2), (-2, -2), (-3, -3), (-4, -3), (-7, 1), (6, -1)],
}


def _pad_cases():
    for mode, rows in PAD_ROWS.items():
        for pads in rows:
            yield f"{mode}{pads}", mode, pads, ROW
        for pads in ((-1, 1, 1, -1), (1, -2, -1, 2)):
            yield f"{mode}{pads} 2-d", mode, pads, GRID


def _torch_outcome(torch, mode, pads, x):
    try:
        torch.nn.functional.pad(torch.tensor(x), pads, mode=mode)
    except RuntimeError:
        return RuntimeError
    return None


@pytest.mark.parametrize("name,mode,pads,x", list(_pad_cases()),
                         ids=[c[0] for c in _pad_cases()])
def test_negative_pads_match_torch(name, mode, pads, x):
    torch = pytest.importorskip("torch")
    raises = _torch_outcome(torch, mode, pads, x)
    check_case(Case(_pad(mode, pads), (x,), raises=raises), torch)


def test_non_constant_pad_sizes_match_torch():
    torch = pytest.importorskip("torch")
    for ndim in range(1, 6):
        for k in (2, 4, 6):
            def run(lib, ndim=ndim, k=k):
                x = lib.zeros(*(3,) * ndim)
                try:
                    _pad("reflect", (1,) * k)(lib, x)
                except NotImplementedError:
                    return NotImplementedError
                except RuntimeError:
                    return RuntimeError
                return None
            assert run(ta) is run(torch), (ndim, k)


EINSUM_ROWS = [
    Case(lambda lib, x: lib.einsum("->", x), (np.array(3.0),)),
    Case(lambda lib, x: lib.einsum("", x), (np.array(3.0),)),
    Case(lambda lib, x, y: lib.einsum(",->", x, y), (np.array(3.0), np.array(2.0))),
    Case(lambda lib, x, y: lib.einsum("i,->i", x, y), (np.ones(2), np.array(2.0))),
    Case(lambda lib, x: lib.einsum("...->", x), (np.array(3.0),)),
    Case(lambda lib, x: lib.einsum("i->i", x), (np.ones(3),)),
    Case(lambda lib, x: lib.einsum("...i...->i", x), (np.ones((2, 3)),), raises=RuntimeError),
    Case(lambda lib, x, y: lib.einsum("i,...j...->ij", x, y), (np.ones(2), np.ones((2, 3))),
         raises=RuntimeError),
    Case(lambda lib, x: lib.einsum("...i->...i...", x), (np.ones((2, 3)),),
         raises=RuntimeError),
    Case(lambda lib, x: lib.einsum("i.j", x), (np.ones((2, 2)),), raises=RuntimeError),
    Case(lambda lib, x: lib.einsum("ij", x), (np.ones(2),), raises=RuntimeError),
    Case(lambda lib, x: lib.einsum("i,j", x), (np.ones(2),), raises=RuntimeError),
]


@pytest.mark.parametrize("k", range(len(EINSUM_ROWS)))
def test_einsum_edges_match_torch(k):
    torch = pytest.importorskip("torch")
    check_case(EINSUM_ROWS[k], torch)


def test_einsum_messages_name_the_operand():
    with pytest.raises(RuntimeError, match=r"operand 1 \('\.\.\.j\.\.\.'\).*ellipsis was "
                       "already found"):
        ta.einsum("i,...j...->ij", ta.ones(2), ta.ones(2, 3))
    x = ta.ones(3, requires_grad=True)
    y = ta.einsum("i->i", x)
    assert y is not x and y.grad_fn is not None  # a view of the operand, as torch's


RANGES = {
    "linspace bool": lambda lib: lib.linspace(5, 10, 3, dtype=lib.bool),
    "arange bool": lambda lib: lib.arange(3, dtype=lib.bool),
    "arange bool 2": lambda lib: lib.arange(0, 3, dtype=lib.bool),
    "linspace int": lambda lib: lib.linspace(5, 10, 3, dtype=lib.int64),
    "linspace uint8 300": lambda lib: lib.linspace(0, 300, 3, dtype=lib.uint8),
    "linspace float32 1e39": lambda lib: lib.linspace(0, 1e39, 3),
    "full bool 2.5": lambda lib: lib.full((2,), 2.5, dtype=lib.bool),
    "full int8 300": lambda lib: lib.full((2,), 300, dtype=lib.int8),
}


@pytest.mark.parametrize("name", list(RANGES))
def test_range_factories_match_torch(name):
    torch = pytest.importorskip("torch")

    def run(lib):
        try:
            return RANGES[name](lib).tolist()
        except NotImplementedError:
            return NotImplementedError
        except RuntimeError:
            return RuntimeError

    assert run(ta) == run(torch)
