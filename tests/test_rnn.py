"""nn.RNN, nn.LSTM, nn.GRU and their cells against torch's: torch's weights loaded with
load_state_dict give torch's outputs, final states and gradients (of the input, the initial
states and every parameter) in float64 to 1e-10 and in float32 to 1e-5, batch_first,
bidirectional, two layers, unbatched and bias-free included; torch's parameter names,
shapes, init, errors and repr; dropout between layers; and the ledger's account of what a
sequence keeps for backward (docs/recurrent.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import nn
import tinygrad_attn as ta
from nn.rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell

T, B, I, H = 5, 3, 4, 6


def _torch_twin(torch, name: str, dtype, *args, **kwargs):
    """(torch module, ours with its weights loaded), both in `dtype` ("float32"/"float64")."""
    torch.manual_seed(0)
    theirs = getattr(torch.nn, name)(*args, **kwargs).to(getattr(torch, dtype))
    ours = {"RNN": RNN, "LSTM": LSTM, "GRU": GRU, "RNNCell": RNNCell, "LSTMCell": LSTMCell,
            "GRUCell": GRUCell}[name](*args, dtype=getattr(ta, dtype), **kwargs)
    result = ours.load_state_dict({k: v.detach().numpy() for k, v in
                                   theirs.state_dict().items()})
    assert result.missing_keys == [] and result.unexpected_keys == []
    return theirs, ours


def _leaves(lib, arrays):
    return [lib.tensor(a.copy(), requires_grad=True) for a in arrays]


def _flat(out) -> list:
    return [t for o in out for t in _flat(o)] if isinstance(out, (tuple, list)) else [out]


def _run(lib, module, x, states, pack):
    """Call module on x (and the initial states, packed as the module takes them), backward
    a weighted sum of every output; return (outputs, input and state grads)."""
    xs = _leaves(lib, [x])[0]
    hx = _leaves(lib, states)
    out = module(xs, pack(hx)) if hx else module(xs)
    outs = _flat(out)
    total = sum((o * lib.tensor(np.random.default_rng(k).standard_normal(tuple(o.shape))
                                .astype(x.dtype))).sum() for k, o in enumerate(outs))
    total.backward()
    return outs, [xs.grad] + [h.grad for h in hx]


def _compare(torch, name, dtype, x_shape, state_shapes, *args, **kwargs):
    theirs, ours = _torch_twin(torch, name, dtype, *args, **kwargs)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(x_shape).astype(dtype)
    states = [rng.standard_normal(s).astype(dtype) for s in state_shapes]
    pack = (lambda hs: tuple(hs)) if "LSTM" in name else (lambda hs: hs[0])
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == "float64" else dict(rtol=1e-5, atol=1e-5)
    their_out, their_grads = _run(torch, theirs, x, states, pack)
    our_out, our_grads = _run(ta, ours, x, states, pack)
    assert len(our_out) == len(their_out)
    for a, b in zip(our_out, their_out):
        assert tuple(a.shape) == tuple(b.shape) and a.dtype.name == dtype
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), **tol)
    for a, b in zip(our_grads, their_grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), **tol)
    params = dict(ours.named_parameters())
    assert list(params) == [n for n, _ in theirs.named_parameters()]
    for pname, p in theirs.named_parameters():
        assert params[pname].grad.dtype.name == dtype
        np.testing.assert_allclose(params[pname].grad.numpy(), p.grad.numpy(), **tol,
                                   err_msg=pname)


LAYERS = [  # (name, kwargs)
    ("LSTM", {}),
    ("LSTM", {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    ("LSTM", {"num_layers": 2, "bias": False}),
    ("GRU", {}),
    ("GRU", {"num_layers": 2, "bidirectional": True}),
    ("GRU", {"batch_first": True, "bias": False}),
    ("RNN", {}),
    ("RNN", {"nonlinearity": "relu", "num_layers": 2, "bidirectional": True,
             "batch_first": True}),
]


def _shapes(kwargs, batched=True):
    states = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    if not batched:
        return (T, I), (states, H)
    return ((B, T, I) if kwargs.get("batch_first") else (T, B, I)), (states, B, H)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name,kwargs", LAYERS, ids=[f"{n}-{k}" for n, k in LAYERS])
def test_layer_matches_torch(name, kwargs, dtype):
    torch = pytest.importorskip("torch")
    x_shape, h_shape = _shapes(kwargs)
    _compare(torch, name, dtype, x_shape, [], I, H, **kwargs)  # zero initial states
    given = [h_shape] * (2 if name == "LSTM" else 1)
    _compare(torch, name, dtype, x_shape, given, I, H, **kwargs)


@pytest.mark.parametrize("name,kwargs", [LAYERS[1], LAYERS[4], LAYERS[7]],
                         ids=["LSTM", "GRU", "RNN"])
def test_unbatched_layer_matches_torch(name, kwargs):
    torch = pytest.importorskip("torch")
    x_shape, h_shape = _shapes(kwargs, batched=False)
    _compare(torch, name, "float64", x_shape, [], I, H, **kwargs)
    _compare(torch, name, "float64", x_shape, [h_shape] * (2 if name == "LSTM" else 1), I, H,
             **kwargs)


CELLS = [("LSTMCell", {}), ("GRUCell", {}), ("RNNCell", {}),
         ("RNNCell", {"nonlinearity": "relu", "bias": False}), ("GRUCell", {"bias": False})]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name,kwargs", CELLS, ids=[f"{n}-{k}" for n, k in CELLS])
def test_cell_matches_torch(name, kwargs, dtype):
    torch = pytest.importorskip("torch")
    states = 2 if name == "LSTMCell" else 1
    for x_shape, h_shape in (((B, I), (B, H)), ((I,), (H,))):  # batched and unbatched
        _compare(torch, name, dtype, x_shape, [], I, H, **kwargs)
        _compare(torch, name, dtype, x_shape, [h_shape] * states, I, H, **kwargs)


# ----------------------------------------------------------------------------- torch's surface
def test_parameter_names_shapes_and_init_are_torchs():
    torch = pytest.importorskip("torch")
    for name, kwargs in LAYERS + CELLS:
        theirs, ours = _torch_twin(torch, name, "float32", I, H, **kwargs)
        assert [(k, tuple(v.shape)) for k, v in ours.state_dict().items()] == [
            (k, tuple(v.shape)) for k, v in theirs.state_dict().items()]
        assert repr(ours) == repr(theirs)
    # init: every parameter uniform in (-1/sqrt(H), 1/sqrt(H)), as torch's reset_parameters
    ta.manual_seed(0)
    big = LSTM(16, 64, num_layers=2)
    values = np.concatenate([p.detach().numpy().ravel() for p in big.parameters()])
    bound = 1 / math.sqrt(64)
    assert values.min() >= -bound and values.max() <= bound
    assert abs(values.std() - bound / math.sqrt(3)) < 0.01 * bound  # U(-b, b): b / sqrt 3
    assert abs(values.mean()) < 0.02 * bound
    assert len(big.all_weights) == 2 and len(big.all_weights[0]) == 4
    big.flatten_parameters()  # torch programs call it; nothing to compact here


def test_dropout_between_layers_in_training_only():
    torch = pytest.importorskip("torch")
    theirs, ours = _torch_twin(torch, "GRU", "float64", I, H, num_layers=2, dropout=1.0)
    x = np.random.default_rng(0).standard_normal((T, B, I))
    # p = 1 drops every output of layer 0: layer 1 sees zeros, deterministically, in both
    (a, ha), (b, hb) = ours(ta.tensor(x)), theirs(torch.tensor(x))
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-10)
    ours.eval(), theirs.eval()  # no dropout in eval: the full two-layer output
    (a, ha), (b, hb) = ours(ta.tensor(x)), theirs(torch.tensor(x))
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(ha.detach().numpy(), hb.detach().numpy(), rtol=1e-10)
    half = GRU(I, H, num_layers=2, dropout=0.5, dtype=ta.float64)
    half.load_state_dict(ours.state_dict())
    dropped = half(ta.tensor(x))[0].detach().numpy()
    assert not np.allclose(dropped, a.detach().numpy())  # training: some units zeroed
    half.eval()
    np.testing.assert_allclose(half(ta.tensor(x))[0].detach().numpy(), a.detach().numpy())


def test_errors_are_torchs():
    torch = pytest.importorskip("torch")
    for kwargs, kind in (({"dropout": 1.5}, ValueError), ({"num_layers": 0}, ValueError),
                         ({"proj_size": 6}, ValueError)):
        with pytest.raises(kind):
            torch.nn.LSTM(I, H, **kwargs)
        with pytest.raises(kind):
            LSTM(I, H, **kwargs)
    with pytest.raises(ValueError, match="hidden_size must be greater than zero"):
        GRU(I, 0)
    with pytest.raises(ValueError, match="proj_size argument is only supported for LSTM"):
        RNN(I, H, proj_size=2)
    with pytest.raises(ValueError, match="Unknown nonlinearity 'gelu'"):
        RNN(I, H, nonlinearity="gelu")
    with pytest.warns(UserWarning, match="num_layers greater than 1"):
        LSTM(I, H, dropout=0.5)
    with pytest.raises(NotImplementedError, match=r"LSTM\(proj_size=2\).*docs/differences"):
        LSTM(I, H, proj_size=2)
    lstm, theirs = LSTM(I, H, num_layers=2), torch.nn.LSTM(I, H, num_layers=2)
    def z(shape, dtype=np.float32):
        return np.zeros(shape, dtype=dtype)

    calls = [  # (args as arrays, exception type): each raises in torch too
        ((z((2, T, B, I)),), ValueError),  # 4-D input
        ((z((T, B, I + 1)),), RuntimeError),  # input size
        ((z((T, B, I)), (z((1, B, H)), z((2, B, H)))), RuntimeError),  # h0's layers
        ((z((T, B, I)), (z((2, B, H)), z((2, B + 1, H)))), RuntimeError),  # c0's batch
        ((z((T, B, I)), (z((2, H)), z((2, H)))), RuntimeError),  # 2-D states, batched input
        ((z((T, I)), (z((2, B, H)), z((2, B, H)))), RuntimeError),  # 3-D states, unbatched
        ((z((T, B, I), dtype=np.float64),), ValueError),  # float64 input, float32 weights
        ((z((0, B, I)),), RuntimeError),  # an empty sequence
    ]
    for args, kind in calls:
        with pytest.raises(kind):
            theirs(*(_packed(torch, a) for a in args))
        with pytest.raises(kind, match="LSTM"):
            lstm(*(_packed(ta, a) for a in args))
    with pytest.raises(ValueError, match="LSTMCell: Expected input to be 1D or 2D, got 3D"):
        LSTMCell(I, H)(ta.zeros(2, B, I))
    with pytest.raises(RuntimeError, match="Unknown nonlinearity: x"):
        RNNCell(I, H, nonlinearity="x")(ta.zeros(B, I))  # torch, too, refuses it in forward


def _packed(lib, a):
    return tuple(lib.tensor(v) for v in a) if isinstance(a, tuple) else lib.tensor(a)


# ----------------------------------------------------------------------------- the ledger
def _saved_after_forward(module, x, hx=None):
    """(ta.memory.saved_bytes of the graph, the profile's saved peak without parameters)."""
    with ta.memory.profile() as prof:
        out, h_n = module(x) if hx is None else module(x, hx)
        finals = list(h_n) if isinstance(h_n, tuple) else [h_n]
        loss = out.sum() + sum(h.sum() for h in finals)
        saved = ta.memory.saved_bytes(loss)
        loss.backward()
    return saved, prof.summary()["saved_peak"]["unique_bytes_without_parameters"]


@pytest.mark.parametrize("steps", [1, 6])
def test_ledger_explains_the_saved_bytes_per_time_step(steps):
    """What a sequence keeps for backward is exactly steps x (the cell's bytes per step)
    plus the input sequence, which the input projection's matmul keeps for w_ih's gradient
    (4 bytes per float32 element; the per-step figures are in each cell's docstring)."""
    x = ta.randn(steps, B, I)
    sequence = steps * B * I * 4
    per_step = {LSTM: 6 * B * H * 4,  # gates 4BH, c_t BH, h_{t-1} BH
                GRU: 5 * B * H * 4,  # r, z, n, hn 4BH, h_{t-1} BH
                RNN: 1 * B * H * 4}  # h_t (the next step's h_{t-1}: one storage)
    first = {LSTM: 0, GRU: 0, RNN: B * H * 4}  # RNN: h_0 as well as h_1 .. h_T
    for cls, step_bytes in per_step.items():
        want = steps * step_bytes + first[cls] + sequence
        assert _saved_after_forward(cls(I, H), x) == (want, want), cls.__name__
    # h0 and c0 given as two tensors: c0 is its own storage, B * H more (with hx=None the
    # layer makes one zeros tensor that serves as both)
    h0, c0 = ta.randn(1, B, H), ta.randn(1, B, H)
    want = steps * per_step[LSTM] + B * H * 4 + sequence
    assert _saved_after_forward(LSTM(I, H), x, (h0, c0)) == (want, want)
    # two bidirectional layers: 4 chains of steps, the input once (both directions'
    # projections keep the same storage) and layer 0's (T, B, 2H) output, which layer 1's
    # projections keep; the zeros of hx=None are one (4, B, H) storage, one B x H a chain
    for cls in (LSTM, GRU):
        want = 4 * steps * per_step[cls] + sequence + steps * B * 2 * H * 4
        layers = cls(I, H, num_layers=2, bidirectional=True)
        assert _saved_after_forward(layers, x) == (want, want), cls.__name__


def test_backward_frees_every_step_and_the_ops_say_what_they_keep():
    lstm = LSTM(I, H)
    x = ta.randn(T, B, I, requires_grad=True)
    with ta.memory.profile() as prof:
        out, (h_n, c_n) = lstm(x)
        (out.sum() + c_n.sum()).backward()
        assert not prof._tracker.nodes, "no node may hold saved tensors after backward"
    by_op = prof.summary()["saved_peak"]["by_op"]
    # one cell per step, and one Linear: the input projection of all T steps at once
    assert set(by_op) == {"LstmCell", "Linear"}
    assert by_op["LstmCell"]["nodes"] == T and by_op["Linear"]["nodes"] == 1
    assert x.grad.shape == (T, B, I) and np.abs(x.grad.numpy()).sum() > 0
    docs = ta.ops.recurrent.LstmCell.__doc__
    assert "6s * B * H" in docs and "24 bytes per element in float32" in docs


# ----------------------------------------------------------------------------- training
def _char_model(nn_lib, V, E):
    """Embedding -> 2-layer batch_first LSTM -> Linear, as a character model is written;
    nn_lib is torch.nn or the engine's nn."""

    class CharLSTM(nn_lib.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn_lib.Embedding(V, E)
            self.lstm = (LSTM if nn_lib is nn else nn_lib.LSTM)(E, H, num_layers=2,
                                                                batch_first=True)
            self.head = nn_lib.Linear(H, V)

        def forward(self, idx):
            out, _ = self.lstm(self.embed(idx))
            return self.head(out)

    return CharLSTM()


def test_training_steps_match_torch():
    """Five SGD steps with momentum of a small character LSTM on one batch, torch's
    initial weights loaded: the losses agree to 1e-10 in float64, and fall."""
    torch = pytest.importorskip("torch")
    V, E = 11, 5
    torch.manual_seed(0)
    theirs = _char_model(torch.nn, V, E).double()
    ours = _char_model(nn, V, E).double()
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    batch = np.random.default_rng(0).integers(0, V, size=(B, T + 1))
    losses = []
    for lib, model, optim in ((torch, theirs, torch.optim), (ta, ours, nn.optim)):
        opt = optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        F = torch.nn.functional if lib is torch else nn.functional
        idx, target = lib.tensor(batch[:, :-1]), lib.tensor(batch[:, 1:])
        run = []
        for _ in range(5):
            loss = F.cross_entropy(model(idx).reshape(-1, V), target.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.append(loss.item())
        losses.append(run)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-10)
    assert losses[0][-1] < losses[0][0] - 0.1  # it trains
