"""The recurrent cells (rnn_tanh_cell, rnn_relu_cell, lstm_cell, gru_cell): gradcheck rows
(float64, finite differences) with every operand contiguous, transposed or sliced, with
and without biases, and on the GPU (or the fake CuPy); what each cell saves. The rows
against torch are in test_recurrent_rows.py; tests/test_registry.py counts these rows."""

from __future__ import annotations

import numpy as np
import pytest
from test_gradcheck_ops import DEVICE, check

import tinygrad_attn as ta

VIEWS = ["contiguous", "transposed", "sliced"]
B, I, H = 3, 4, 2  # batch, input size, hidden size: small, so finite differences are cheap


def _specs(gates: int, states: int, view: str, bias: bool, projected: bool = False) -> list:
    """(shape, view, domain) of input, hidden states, w_ih, w_hh (all in `view`) and the
    biases (1-D, contiguous). projected: no w_ih and b_ih, the input is the projection
    (B, G*H), as a layer passes it."""
    if projected:
        two_d = [(B, gates * H)] + [(B, H)] * states + [(gates * H, H)]
        return [(shape, view, "real") for shape in two_d] + [
            ((gates * H,), "contiguous", "real")] * bias
    two_d = [(B, I)] + [(B, H)] * states + [(gates * H, I), (gates * H, H)]
    specs = [(shape, view, "real") for shape in two_d]
    return specs + [((gates * H,), "contiguous", "real")] * (2 * bias)


def _projected(cell, states: int):
    """cell(p, hx, None, w_hh, None, b_hh): the input projection p given, as a layer does."""
    def fn(p, *rest):
        hx = (rest[0], rest[1]) if states == 2 else rest[0]
        w_hh, *b_hh = rest[states:]
        return cell(p, hx, None, w_hh, None, *b_hh)

    return fn


def _lstm(x, h, c, *weights):
    return ta.lstm_cell(x, (h, c), *weights)


def _lstm_b_ih_only(x, h, c, w_ih, w_hh, b_ih):
    return ta.lstm_cell(x, (h, c), w_ih, w_hh, b_ih)


def _relu_away_from_kink(x, h, *weights):
    # shifts the pre-activations away from 0, where relu's derivative jumps
    return ta.rnn_relu_cell(x * 2.0, h, *weights)


# name: (fn, gates, hidden states, biases)
GRAD_ROWS = {
    "rnn_tanh_cell": (ta.rnn_tanh_cell, 1, 1, True),
    "rnn_tanh_cell_nobias": (ta.rnn_tanh_cell, 1, 1, False),
    "rnn_relu_cell": (_relu_away_from_kink, 1, 1, True),
    "lstm_cell": (_lstm, 4, 2, True),
    "lstm_cell_nobias": (_lstm, 4, 2, False),
    "gru_cell": (ta.gru_cell, 3, 1, True),
    "gru_cell_nobias": (ta.gru_cell, 3, 1, False),
}
PROJECTED_ROWS = {  # w_ih=None: the input is x @ w_ih^T already
    "rnn_tanh_cell_projected": (_projected(ta.rnn_tanh_cell, 1), 1, 1, True),
    "rnn_relu_cell_projected": (_projected(ta.rnn_relu_cell, 1), 1, 1, False),
    "lstm_cell_projected": (_projected(ta.lstm_cell, 2), 4, 2, True),
    "gru_cell_projected": (_projected(ta.gru_cell, 1), 3, 1, True),
}


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("row", list(GRAD_ROWS))
def test_gradcheck(row, view):
    fn, gates, states, bias = GRAD_ROWS[row]
    check(fn, _specs(gates, states, view, bias), seed=3)


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("row", list(PROJECTED_ROWS))
def test_gradcheck_projected_input(row, view):
    fn, gates, states, bias = PROJECTED_ROWS[row]
    check(fn, _specs(gates, states, view, bias, projected=True), seed=4)


@pytest.mark.parametrize("row", ["rnn_tanh_cell", "lstm_cell", "gru_cell"])
def test_gradcheck_on_device(gpu_device, row, monkeypatch):
    monkeypatch.setitem(DEVICE, "name", gpu_device)
    fn, gates, states, bias = GRAD_ROWS[row]
    check(fn, _specs(gates, states, "transposed", bias))


def test_gradcheck_one_bias_and_one_step_of_a_chain():
    """b_ih without b_hh (torch allows either alone), and two LSTM steps chained: the
    second step's c is the first one's saved output, so backward reads it twice."""
    check(_lstm_b_ih_only, _specs(4, 2, "contiguous", False) + [((8,), "contiguous", "real")])

    def two_steps(x, h, c, w_ih, w_hh):
        h1, c1 = ta.lstm_cell(x, (h, c), w_ih, w_hh)
        return ta.lstm_cell(x * 0.5, (h1, c1), w_ih, w_hh)

    check(two_steps, _specs(4, 2, "sliced", False))


@pytest.mark.parametrize("layer", ["LSTM", "GRU", "RNN"])
def test_gradcheck_through_two_bidirectional_layers(layer, derivative_order):
    """The layers' plumbing (the sequence's projection, its slices, the reverse direction,
    the stacks, the cat of the directions, the final states) against finite differences,
    without torch: gradients of the input and the initial states in float64. The d2 row
    (second derivatives) runs on one sequence of two steps: its finite differences of a
    recorded backward through 2 layers x 2 directions cost a few thousand cell backwards
    at the d1 row's size."""
    import nn.rnn

    ta.manual_seed(5)
    module = getattr(nn.rnn, layer)(3, H, num_layers=2, bidirectional=True, batch_first=True,
                                    dtype=ta.float64)
    lstm = layer == "LSTM"

    def run(x, *states):
        out, h_n = module(x, tuple(states) if lstm else states[0])
        finals = h_n if lstm else (h_n,)
        return (out.sum(dim=1),) + tuple(f * 0.5 for f in finals)

    batch, steps = (2, 3) if derivative_order == 1 else (1, 2)
    check(run, [((batch, steps, 3), "sliced", "real")] +
          [((4, batch, H), "contiguous", "real")] * (2 if lstm else 1))


# ----------------------------------------------------------------------------- what they save
def _cell_inputs(gates: int, dtype=ta.float32):
    ta.manual_seed(1)
    x, h, c = ta.randn(B, I, dtype=dtype), ta.randn(B, H, dtype=dtype), ta.randn(B, H, dtype=dtype)
    w_ih = ta.randn(gates * H, I, dtype=dtype, requires_grad=True)
    w_hh = ta.randn(gates * H, H, dtype=dtype, requires_grad=True)
    return x, h, c, w_ih, w_hh


def test_lstm_cell_saves_gates_c_and_its_own_c_output():
    x, h, c, w_ih, w_hh = _cell_inputs(4)
    h.requires_grad_()
    hy, cy = ta.lstm_cell(x, (h, c), w_ih, w_hh)
    saved = hy.grad_fn.saved_tensor_list()
    # x (gw_ih), h (gw_hh), w_hh (gh: h needs a gradient), the (B, 4H) gates, c and c'
    # (which shares its storage with the output cy); w_ih is left out: x needs no grad
    assert [tuple(t.shape) for t in saved] == [(B, I), (B, H), (4 * H, H), (B, 4 * H),
                                               (B, H), (B, H)]
    assert saved[0] is x and saved[1] is h and saved[2] is w_hh and saved[4] is c
    assert saved[5].untyped_storage() is cy.untyped_storage() and saved[5] is not cy
    assert hy.grad_fn is cy.grad_fn
    # the saved gates are the activations: sigmoid for i, f, o, tanh for g
    pre = x.numpy() @ w_ih.detach().numpy().T + h.detach().numpy() @ w_hh.detach().numpy().T
    sig = 1 / (1 + np.exp(-pre))
    want = np.concatenate([sig[:, :2 * H], np.tanh(pre[:, 2 * H:3 * H]), sig[:, 3 * H:]], 1)
    np.testing.assert_allclose(saved[3].numpy(), want, rtol=1e-5, atol=1e-6)
    # x, h, gates, c, c' and w_hh (a plain leaf here, not tagged as a parameter)
    assert ta.memory.saved_bytes(hy) == 4 * (B * I + B * H + 4 * B * H + 2 * B * H) + w_hh.nbytes


def test_gru_and_rnn_cells_save_what_their_docstrings_say():
    x, h, _, w_ih, w_hh = _cell_inputs(3)
    y = ta.gru_cell(x, h, w_ih, w_hh)
    saved = y.grad_fn.saved_tensor_list()
    # x for gw_ih, h (dz and gw_hh read it), one (B, 4H) buffer: r, z, n, hn
    assert [tuple(t.shape) for t in saved] == [(B, I), (B, H), (B, 4 * H)]
    assert ta.memory.saved_bytes(y) == 4 * (B * I + B * H + 4 * B * H)
    x, h, _, w_ih, w_hh = _cell_inputs(1)
    y = ta.rnn_tanh_cell(x, h, w_ih, w_hh)
    saved = y.grad_fn.saved_tensor_list()
    assert [tuple(t.shape) for t in saved] == [(B, I), (B, H), (B, H)]
    assert saved[2].untyped_storage() is y.untyped_storage()  # its own output
    # nothing needs the weights' inputs when only x needs a gradient: the weights are kept
    x.requires_grad_()
    w_ih.requires_grad_(False)
    w_hh.requires_grad_(False)
    y = ta.rnn_relu_cell(x, h, w_ih, w_hh)
    assert [t is w_ih for t in y.grad_fn.saved_tensor_list()] == [True, False]


def test_a_projected_input_is_not_saved():
    """With w_ih=None the cell's input is the projection: its gradient is the gates'
    gradient itself, so nothing of it is kept (the projection's matmul keeps x)."""
    x, h, c, _, w_hh = _cell_inputs(4)
    p = ta.randn(B, 4 * H, requires_grad=True)
    hy, cy = ta.lstm_cell(p, (h, c), None, w_hh)
    saved = hy.grad_fn.saved_tensor_list()
    assert not any(t is p for t in saved)
    assert [tuple(t.shape) for t in saved] == [(B, H), (B, 4 * H), (B, H), (B, H)]
    (hy.sum() + cy.sum()).backward()
    assert p.grad.shape == (B, 4 * H) and w_hh.grad.shape == (4 * H, H)
    with pytest.raises(ta.ShapeError, match=r"input has inconsistent input_size: got 4 "
                                            r"expected 8 \(with w_ih=None"):
        ta.lstm_cell(x, (h, c), None, w_hh)


def _gradient_of(fn):
    """The inputs' gradient of sum(fn(*xs) ** 2 / 2) over fn's outputs, recorded
    (create_graph=True): gradcheck of it checks fn's second derivative (the d1 row), and
    the d2 row's gradgradcheck checks its third."""
    def gradient(*xs):
        with ta.enable_grad():  # gradcheck's finite differences run under no_grad
            outs = fn(*xs)
            outs = outs if isinstance(outs, tuple) else (outs,)
            loss = sum(((o * o) / 2).sum() for o in outs)
            return ta.autograd.grad(loss, xs, create_graph=True)

    return gradient


@pytest.mark.parametrize("row", ["lstm_cell", "gru_cell"])
def test_gradcheck_of_a_cells_gradient(row):
    """Through the buffer the cell keeps (its activated gates): a recorded backward reads
    it as the node's hidden output, so every order of derivative flows back through the
    gates; one example of two inputs and one hidden unit keeps the third order cheap."""
    fn, gates, states, _ = GRAD_ROWS[row]
    specs = [((2, 2), "contiguous", "real")] + [((2, 1), "sliced", "real")] * states + [
        ((gates, 2), "transposed", "real"), ((gates, 1), "contiguous", "real")]
    check(_gradient_of(fn), specs, seed=6)


TESTS_OF = {"lstm_cell": test_gradcheck_one_bias_and_one_step_of_a_chain}
COVERED = set(GRAD_ROWS) | set(PROJECTED_ROWS) | set(TESTS_OF)
