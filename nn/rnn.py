"""Recurrent layers: RNN, LSTM and GRU over sequences, and their one-step cells.

Each time step of each layer and direction is one engine op (ta.rnn_tanh_cell,
ta.rnn_relu_cell, ta.lstm_cell, ta.gru_cell): the gate matmuls and nonlinearities in one
graph node that saves only what its backward needs (docs/recurrent.md: the bytes per
step). The input projection x @ w_ih^T + b_ih of a whole sequence is one GEMM before the
steps, and each cell gets its slice (w_ih=None). Parameters carry torch's names, shapes
and gate order (weight_ih_l{k}{_reverse}, weight_hh_l{k}, bias_ih_l{k}, bias_hh_l{k};
LSTM i, f, g, o, GRU r, z, n), so a torch model's state_dict loads as it is, and torch's
init: every parameter U(-1/sqrt(H), 1/sqrt(H)).

Shapes, as torch's: input (T, B, I), or (B, T, I) with batch_first, or unbatched (T, I);
h0 (and c0) (num_layers * num_directions, B, H), or (.., H) unbatched; the output
(T, B, num_directions * H) and h_n (and c_n) of h0's shape.
"""

from __future__ import annotations

import math
import warnings

import tinygrad_attn as ta

from . import functional as F
from .module import Module, Parameter

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}
_STEP = {"RNN_TANH": ta.rnn_tanh_cell, "RNN_RELU": ta.rnn_relu_cell, "LSTM": ta.lstm_cell,
         "GRU": ta.gru_cell}


def _uniform(shape, bound: float) -> ta.Tensor:
    return (ta.rand(*shape) * 2.0 - 1.0) * bound


class RNNBase(Module):
    """The stack of layers and directions shared by RNN, LSTM and GRU (torch's RNNBase).

    mode: "RNN_TANH", "RNN_RELU", "LSTM" or "GRU". dropout: applied to the output of each
    layer but the last, in training mode only. proj_size (LSTM projections) is refused:
    see docs/differences.md.
    """

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device=None,
                 dtype=None) -> None:
        super().__init__()
        if mode not in _GATES:
            raise ValueError(f"Unrecognized RNN mode: {mode!r}; expected one of "
                             f"{sorted(_GATES)}")
        if (isinstance(dropout, bool) or not isinstance(dropout, (int, float))
                or not 0 <= dropout <= 1):
            raise ValueError("dropout should be a number in range [0, 1] representing the "
                             f"probability of an element being zeroed, got {dropout!r}")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, "
                          "so non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={num_layers}", stacklevel=2)
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size),
                            ("num_layers", num_layers), ("proj_size", proj_size)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} should be of type int, got: {type(value).__name__}")
        if hidden_size <= 0:
            raise ValueError("hidden_size must be greater than zero")
        if num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable "
                             "projections")
        if proj_size and mode != "LSTM":
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if proj_size:
            raise NotImplementedError(
                f"LSTM(proj_size={proj_size}): projected LSTMs are not implemented (the "
                "cell op is torch's lstm_cell, which has no projection); use proj_size=0 "
                "(see docs/differences.md)")
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.num_layers, self.bias, self.batch_first = num_layers, bias, batch_first
        self.dropout, self.bidirectional = float(dropout), bidirectional
        self.proj_size = proj_size
        directions = 2 if bidirectional else 1
        rows = _GATES[mode] * hidden_size
        bound = 1.0 / math.sqrt(hidden_size)
        self._flat_weights_names = []
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * directions
            for direction in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if direction else "")
                shapes = {"weight_ih": (rows, width), "weight_hh": (rows, hidden_size)}
                if bias:
                    shapes.update(bias_ih=(rows,), bias_hh=(rows,))
                for kind, shape in shapes.items():
                    setattr(self, kind + suffix, Parameter(_uniform(shape, bound)))
                    self._flat_weights_names.append(kind + suffix)
        if dtype is not None or device is not None:
            self.to(*(a for a in (device, dtype) if a is not None))

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def all_weights(self) -> list:
        """[[w_ih, w_hh, b_ih, b_hh] per layer and direction], as torch's."""
        per = 4 if self.bias else 2
        names = self._flat_weights_names
        return [[getattr(self, n) for n in names[k: k + per]] for k in range(0, len(names),
                                                                            per)]

    def flatten_parameters(self) -> None:
        """torch compacts cuDNN's weight buffer here; the engine has none to compact."""

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size)
        with ta.no_grad():
            for p in self.parameters():
                p.copy_(_uniform(tuple(p.shape), bound).to(p.dtype))

    # ------------------------------------------------------------------ forward
    def forward(self, input, hx=None):  # noqa: A002 - torch's name
        name = type(self).__name__
        if input.ndim not in (2, 3):
            raise ValueError(f"{name}: Expected input to be 2D or 3D, got {input.ndim}D "
                             f"instead (shape {tuple(input.shape)})")
        weight = self.weight_ih_l0
        if input.dtype is not weight.dtype:
            raise ValueError(f"{name} input dtype ({input.dtype.name}) does not match weight "
                             f"dtype ({weight.dtype.name}). Convert input: "
                             f"input.to({weight.dtype.name}), or convert model: "
                             f"model.to({input.dtype.name})")
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"{name}: input.size(-1) must be equal to input_size. Expected "
                               f"{self.input_size}, got {input.shape[-1]}")
        batched = input.ndim == 3
        x = input if batched else input.unsqueeze(1)  # (T, 1, I) unbatched
        time_dim = 1 if batched and self.batch_first else 0  # of x, the layer's input
        T, B = x.shape[time_dim], x.shape[1 - time_dim]
        if T == 0:
            raise RuntimeError(f"{name}: Expected sequence length to be larger than 0 in RNN, "
                               f"got input of shape {tuple(input.shape)}")
        states = self._initial_states(hx, batched, B, x)
        finals = []  # per state kind (h, and c for LSTM): one (B, H) per layer and direction
        for layer in range(self.num_layers):
            last_layer = layer == self.num_layers - 1
            # the last layer's steps are stacked straight into torch's (B, T, H) when
            # batch_first; the layers below stay (T, B, H)
            out_dim = 1 if last_layer and batched and self.batch_first else 0
            outputs = []
            for direction in range(self.num_directions):
                k = layer * self.num_directions + direction
                hs, last = self._run_direction(x, time_dim, [s[k] for s in states], layer,
                                               direction)
                outputs.append(ta.stack(hs, dim=out_dim))
                finals.append(last)
            time_dim = out_dim
            x = outputs[0] if len(outputs) == 1 else ta.cat(outputs, dim=-1)
            if self.training and self.dropout > 0 and not last_layer:
                x = F.dropout(x, self.dropout, training=True)
        output = x
        # (layers * directions, B, H); one layer and direction: a view of the last step's
        h_n = [finals[0][j].unsqueeze(0) if len(finals) == 1 else
               ta.stack([f[j] for f in finals], dim=0) for j in range(len(states))]
        if not batched:
            output, h_n = output.squeeze(1), [h.squeeze(1) for h in h_n]
        return output, (tuple(h_n) if self.mode == "LSTM" else h_n[0])

    def _run_direction(self, x, time_dim: int, state: list, layer: int, direction: int):
        """One layer in one direction over all T steps: ([h_t in time order], [h_T, c_T]).

        The input projection x @ w_ih^T + b_ih of every step is one GEMM (its matmul keeps
        x, the layer's input, once); each step's cell gets its slice (w_ih=None) and adds
        h @ w_hh^T + b_hh."""
        suffix = f"_l{layer}" + ("_reverse" if direction else "")
        w_ih, w_hh = getattr(self, "weight_ih" + suffix), getattr(self, "weight_hh" + suffix)
        b_ih = getattr(self, "bias_ih" + suffix) if self.bias else None
        b_hh = getattr(self, "bias_hh" + suffix) if self.bias else None
        step = _STEP[self.mode]
        projected = F.linear(x, w_ih, b_ih)  # (T, B, G*H), or (B, T, G*H) with time_dim 1
        T = x.shape[time_dim]
        hs = [None] * T
        for t in (reversed(range(T)) if direction else range(T)):
            p_t = projected[t] if time_dim == 0 else projected[:, t]  # (B, G*H), a view
            if self.mode == "LSTM":
                state = list(step(p_t, tuple(state), None, w_hh, None, b_hh))
            else:
                state = [step(p_t, state[0], None, w_hh, None, b_hh)]
            hs[t] = state[0]
        return hs, state

    def _initial_states(self, hx, batched: bool, B: int, like):
        """[h0] or [h0, c0], each (num_layers * num_directions, B, H); zeros if hx is None."""
        name = type(self).__name__
        kinds = 2 if self.mode == "LSTM" else 1
        shape = (self.num_layers * self.num_directions, B, self.hidden_size)
        if hx is None:  # h0 and c0 are one zeros tensor: nothing writes into either
            zeros = ta.zeros(*shape, dtype=like.dtype, device=like.device)
            return [zeros] * kinds
        given = list(hx) if isinstance(hx, (tuple, list)) else [hx]
        if self.mode == "LSTM" and (not isinstance(hx, (tuple, list)) or len(given) != 2):
            raise RuntimeError(f"{name}: hx must be a tuple (h_0, c_0), got "
                               f"{type(hx).__name__}")
        if len(given) != kinds or any(type(h) is not ta.Tensor for h in given):
            raise TypeError(f"{name}: hx must be a Tensor, got {type(hx).__name__}")
        want = 3 if batched else 2
        if any(h.ndim != want for h in given):
            what = "hx and cx" if kinds == 2 else "hx"
            dims = ", ".join(f"{h.ndim}-D" for h in given)
            raise RuntimeError(
                f"{name}: For {'batched 3-D' if batched else 'unbatched 2-D'} input, {what} "
                f"should also be {want}-D but got ({dims}) tensors")
        states = given if batched else [h.unsqueeze(1) for h in given]
        for j, h in enumerate(states):
            if tuple(h.shape) != shape:
                which = f"hidden[{j}]" if kinds == 2 else "hidden"
                got = list(h.shape if batched else given[j].shape)
                expected = shape if batched else (shape[0], shape[2])
                raise RuntimeError(f"{name}: Expected {which} size {expected}, got {got}")
        return states

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s


class RNN(RNNBase):
    """Elman RNN: h_t = tanh (or relu)(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: bool = True, batch_first: bool = False,
                 dropout: float = 0.0, bidirectional: bool = False, device=None,
                 dtype=None, proj_size: int = 0) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or "
                             "'relu'.")
        self.nonlinearity = nonlinearity
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size,
                         hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, device, dtype)  # proj_size: refused, as torch does


class LSTM(RNNBase):
    """Long short-term memory: gates i, f, g, o; returns (output, (h_n, c_n))."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device=None,
                 dtype=None) -> None:
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, proj_size, device, dtype)


class GRU(RNNBase):
    """Gated recurrent unit: gates r, z, n; returns (output, h_n)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, device=None, dtype=None,
                 proj_size: int = 0) -> None:
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, proj_size, device, dtype)


# ----------------------------------------------------------------------------- cells
class RNNCellBase(Module):
    """One step of a recurrent layer as a module: weight_ih, weight_hh, bias_ih, bias_hh."""

    _gates = 1

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        rows = self._gates * hidden_size
        bound = 1.0 / math.sqrt(hidden_size) if hidden_size > 0 else 0.0
        self.weight_ih = Parameter(_uniform((rows, input_size), bound))
        self.weight_hh = Parameter(_uniform((rows, hidden_size), bound))
        self.bias_ih = Parameter(_uniform((rows,), bound)) if bias else None
        self.bias_hh = Parameter(_uniform((rows,), bound)) if bias else None
        if dtype is not None or device is not None:
            self.to(*(a for a in (device, dtype) if a is not None))

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0.0
        with ta.no_grad():
            for p in self.parameters():
                p.copy_(_uniform(tuple(p.shape), bound).to(p.dtype))

    def _batched(self, x, hx: tuple):
        """(x, hx) as 2-D batches, and whether the call was unbatched."""
        name = type(self).__name__
        if x.ndim not in (1, 2):
            raise ValueError(f"{name}: Expected input to be 1D or 2D, got {x.ndim}D "
                             f"instead (shape {tuple(x.shape)})")
        for h in hx:
            if h is not None and h.ndim != x.ndim:
                raise RuntimeError(f"{name}: Expected hidden to be {x.ndim}D for a "
                                   f"{x.ndim}D input, got {h.ndim}D (shape "
                                   f"{tuple(h.shape)})")
        if x.ndim == 2:
            return x, hx, False
        return x.unsqueeze(0), tuple(None if h is None else h.unsqueeze(0) for h in hx), True

    def _zeros(self, x):
        return ta.zeros(x.shape[0], self.hidden_size, dtype=x.dtype, device=x.device)

    def _weights(self) -> tuple:
        return self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        nonlinearity = getattr(self, "nonlinearity", "tanh")
        if nonlinearity != "tanh":
            s += f", nonlinearity={nonlinearity}"
        return s


class RNNCell(RNNCellBase):
    """h' = tanh (or relu)(x W_ih^T + b_ih + h W_hh^T + b_hh), one engine op."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, device, dtype)
        self.nonlinearity = nonlinearity  # checked in forward, as torch does

    def forward(self, input, hx=None):  # noqa: A002 - torch's name
        if self.nonlinearity not in ("tanh", "relu"):
            raise RuntimeError(f"RNNCell: Unknown nonlinearity: {self.nonlinearity}; "
                               "expected 'tanh' or 'relu'")
        x, (h,), unbatched = self._batched(input, (hx,))
        h = self._zeros(x) if h is None else h
        step = ta.rnn_tanh_cell if self.nonlinearity == "tanh" else ta.rnn_relu_cell
        out = step(x, h, *self._weights())
        return out.squeeze(0) if unbatched else out


class LSTMCell(RNNCellBase):
    """One LSTM step: (input, (h, c)) -> (h', c'), one engine op."""

    _gates = 4

    def forward(self, input, hx=None):  # noqa: A002 - torch's name
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise TypeError(f"LSTMCell: hx must be a tuple (h, c), got {type(hx).__name__}")
        x, (h, c), unbatched = self._batched(input, (None, None) if hx is None else tuple(hx))
        h = self._zeros(x) if h is None else h
        c = self._zeros(x) if c is None else c
        h, c = ta.lstm_cell(x, (h, c), *self._weights())
        return (h.squeeze(0), c.squeeze(0)) if unbatched else (h, c)


class GRUCell(RNNCellBase):
    """One GRU step: (input, h) -> h', one engine op."""

    _gates = 3

    def forward(self, input, hx=None):  # noqa: A002 - torch's name
        x, (h,), unbatched = self._batched(input, (hx,))
        h = self._zeros(x) if h is None else h
        out = ta.gru_cell(x, h, *self._weights())
        return out.squeeze(0) if unbatched else out


__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]
