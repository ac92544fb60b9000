"""The recurrent cells against torch: rnn_tanh_cell, rnn_relu_cell, lstm_cell, gru_cell
called as torch's functions (torch.lstm_cell(input, (h, c), w_ih, w_hh, b_ih, b_hh)) on the
same values, comparing outputs, shapes, dtypes (float32 and float64) and gradients, on
contiguous, transposed, sliced and expanded inputs, with and without biases, an empty
batch, and the exception type of each wrong shape or dtype."""

from __future__ import annotations

import numpy as np
import pytest
from rows_vs_torch import Case, case_ids, check_case, randn

import tinygrad_attn as ta

B, I, H = 3, 4, 5
F32, F64 = np.float32, np.float64


def _operands(gates: int, states: int, batch=B, dtype=F64, bias=True, seed=0) -> tuple:
    """input, hidden states, w_ih, w_hh (and b_ih, b_hh), as NumPy arrays."""
    arrays = [randn(batch, I, seed=seed, dtype=dtype)]
    arrays += [randn(batch, H, seed=seed + 1 + k, dtype=dtype) for k in range(states)]
    arrays += [randn(gates * H, I, seed=seed + 5, dtype=dtype) * 0.5,
               randn(gates * H, H, seed=seed + 6, dtype=dtype) * 0.5]
    if bias:
        arrays += [randn(gates * H, seed=seed + 7, dtype=dtype),
                   randn(gates * H, seed=seed + 8, dtype=dtype)]
    return tuple(arrays)


def _plain(name):
    return lambda lib, x, h, *weights: getattr(lib, name)(x, h, *weights)


def _lstm(lib, x, h, c, *weights):
    return lib.lstm_cell(x, (h, c), *weights)


def _projected(fn, states: int):
    """The engine's cell given the input projection (w_ih=None), computed by the engine's
    matmul, against torch's cell projecting the input itself: the same values, and the
    gradients of x, w_ih and b_ih reach them through the matmul."""
    def call(lib, x, *rest):
        hx, (w_ih, w_hh, *biases) = rest[:states], rest[states:]
        b_ih, b_hh = biases if biases else (None, None)
        if lib is not ta:
            return fn(lib, x, *hx, w_ih, w_hh, b_ih, b_hh)
        p = x @ w_ih.mT if b_ih is None else x @ w_ih.mT + b_ih
        return fn(lib, p, *hx, None, w_hh, None, b_hh)

    return call


CELLS = {"rnn_tanh_cell": (_plain("rnn_tanh_cell"), 1, 1),
         "rnn_relu_cell": (_plain("rnn_relu_cell"), 1, 1),
         "lstm_cell": (_lstm, 4, 2),
         "gru_cell": (_plain("gru_cell"), 3, 1)}


def _rows(name: str) -> list:
    fn, gates, states = CELLS[name]
    rows = [Case(fn, _operands(gates, states), layout=layout)
            for layout in ("contiguous", "transposed", "sliced", "expanded")]
    rows += [
        Case(fn, _operands(gates, states, bias=False, seed=3)),
        Case(fn, _operands(gates, states, dtype=F32, seed=4), all_grads=True),
        Case(fn, _operands(gates, states, dtype=F32, bias=False, seed=5), layout="transposed",
             all_grads=True),
        Case(fn, _operands(gates, states, batch=0)),  # an empty batch
        Case(fn, _operands(gates, states, batch=1, seed=6)),
    ]
    # b_ih alone (torch takes either bias without the other)
    full = _operands(gates, states, seed=7)
    rows.append(Case(fn, full[:-1]))
    # the input projection given (w_ih=None), as nn's layers call the cell
    rows += [Case(_projected(fn, states), _operands(gates, states, seed=8), layout="sliced"),
             Case(_projected(fn, states), _operands(gates, states, bias=False, dtype=F32),
                  all_grads=True)]
    # errors: the types torch raises
    bad_input = (randn(B, I + 1),) + full[1:]  # input size differs from w_ih's
    bad_batch = full[:1] + (randn(B + 1, H),) + full[2:]  # hidden batch differs from input's
    bad_gates = full[:-4] + (randn(gates * H + 1, I),) + full[-3:]  # w_ih is not G * H rows
    bad_bias = full[:-1] + (randn(gates * H - 1),)
    one_d = (randn(I),) + tuple(randn(H, seed=k) for k in range(states)) + full[-4:]
    mixed = (randn(B, I, dtype=F32),) + full[1:]  # float32 input, float64 weights
    rows += [Case(fn, args, raises=RuntimeError)
             for args in (bad_input, bad_batch, bad_gates, bad_bias, mixed)]
    rows.append(Case(fn, one_d, raises=IndexError))
    return rows


def _lstm_hx_errors() -> list:
    x, h, c, *weights = _operands(4, 2)
    return [
        Case(lambda lib, x, h, *w: lib.lstm_cell(x, h, *w), (x, h, *weights),
             raises=TypeError),  # hx is a tensor, not the tuple (h, c)
        Case(lambda lib, x, h, *w: lib.lstm_cell(x, (h,), *w), (x, h, *weights),
             raises=RuntimeError),  # one hidden state
        Case(_lstm, (x, h, randn(B, H - 1), *weights), raises=RuntimeError),  # c's size
    ]


ROWS = {name: _rows(name) for name in CELLS}
ROWS["lstm_cell"] += _lstm_hx_errors()
PARAMS, IDS = case_ids(ROWS)


@pytest.mark.parametrize("name,k", PARAMS, ids=IDS)
def test_matches_torch(name, k):
    torch = pytest.importorskip("torch")
    check_case(ROWS[name][k], torch)


def test_the_rows_cover_both_dtypes_views_and_errors():
    for name, cases in ROWS.items():
        assert {c.layout for c in cases} == {"contiguous", "transposed", "sliced", "expanded"}
        assert {c.inputs[0].dtype for c in cases} == {np.dtype(F32), np.dtype(F64)}
        assert {c.raises for c in cases} >= {None, RuntimeError, IndexError}, name
        assert any(c.inputs[0].shape[0] == 0 for c in cases), name
