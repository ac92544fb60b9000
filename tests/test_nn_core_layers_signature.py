"""nn.Linear, nn.LayerNorm and nn.Embedding take torch's constructor arguments, in torch's
order and with torch's defaults, and give torch's values for them: factory kwargs (dtype,
device), LayerNorm's eps / elementwise_affine / bias, Embedding's padding_idx, max_norm,
scale_grad_by_freq, _weight / _freeze and from_pretrained; errors and reprs as torch's."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import nn
import tinygrad_attn as ta


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def _params(fn):
    """(name, kind, default) of each argument after self / cls."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()
            if p.name not in ("self", "cls")]


def _host(t):
    return t.detach().numpy()


def _copy_into(ours, values: np.ndarray):
    with ta.no_grad():
        ours.copy_(ta.tensor(values))


# ------------------------------------------------------------------------- signatures
@pytest.mark.parametrize("name", ["Linear", "LayerNorm", "Embedding"])
def test_constructor_arguments_are_torchs(torch, name):
    assert _params(getattr(nn, name).__init__) == _params(getattr(torch.nn, name).__init__)


def test_from_pretrained_arguments_are_torchs(torch):
    assert (_params(nn.Embedding.from_pretrained)
            == _params(torch.nn.Embedding.from_pretrained))
    assert isinstance(inspect.getattr_static(nn.Embedding, "from_pretrained"), classmethod)


# ------------------------------------------------------------------------- factory kwargs
@pytest.mark.parametrize("make", [
    lambda **kw: nn.Linear(4, 3, **kw),
    lambda **kw: nn.Linear(4, 3, bias=False, **kw),
    lambda **kw: nn.LayerNorm((2, 3), **kw),
    lambda **kw: nn.Embedding(5, 3, padding_idx=1, **kw),
], ids=["linear", "linear-nobias", "layernorm", "embedding"])
@pytest.mark.parametrize("dtype", [ta.float64, ta.float16])
def test_dtype_and_device_make_the_parameters(make, dtype, device):
    layer = make(dtype=dtype, device=device)
    params = list(layer.parameters())
    assert params
    for p in params:
        assert p.dtype is dtype and p.device.type == device
        assert p.requires_grad and p.is_leaf
    default = make()
    assert all(p.dtype is ta.float32 and p.device == ta.device("cpu")
               for p in default.parameters())


def test_linear_in_float64_runs_and_matches_torch(torch):
    ours = nn.Linear(4, 3, dtype=ta.float64)
    ref = torch.nn.Linear(4, 3, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(_host(ours.weight)))
        ref.bias.copy_(torch.from_numpy(_host(ours.bias)))
    x = np.linspace(-1.0, 1.0, 8).reshape(2, 4)
    y = ours(ta.tensor(x))
    assert y.dtype is ta.float64
    np.testing.assert_allclose(_host(y), ref(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-12, atol=1e-12)


def test_linear_initialisation_is_torchs_bounds():
    layer = nn.Linear(16, 64)
    bound = 1.0 / 4.0  # 1 / sqrt(in_features)
    for p in (layer.weight, layer.bias):
        values = _host(p)
        assert np.abs(values).max() <= bound
        assert np.abs(values).max() > 0.8 * bound  # spread over the interval, not squeezed
    assert abs(float(_host(layer.weight).std()) - bound / np.sqrt(3.0)) < 0.02


def test_linear_without_bias_registers_none_as_torch(torch):
    ours, ref = nn.Linear(3, 2, bias=False), torch.nn.Linear(3, 2, bias=False)
    assert ours.bias is None and ref.bias is None
    assert list(ours._parameters) == list(ref._parameters) == ["weight", "bias"]
    assert list(ours.state_dict()) == list(ref.state_dict()) == ["weight"]


def test_linear_with_no_inputs_warns_as_torch(torch):
    with pytest.warns(UserWarning):
        torch.nn.Linear(0, 3)
    with pytest.warns(UserWarning, match="zero-element"):
        layer = nn.Linear(0, 3)
    np.testing.assert_array_equal(_host(layer.bias), np.zeros(3, np.float32))  # bound 0


# ------------------------------------------------------------------------- LayerNorm
def _layer_norm_pair(torch, *args, **kwargs):
    ours, ref = nn.LayerNorm(*args, **kwargs), torch.nn.LayerNorm(*args, **kwargs)
    ours.double(), ref.double()
    rng = np.random.default_rng(0)
    for name in ("weight", "bias"):
        mine, theirs = getattr(ours, name), getattr(ref, name)
        assert (mine is None) == (theirs is None)
        if mine is not None:
            values = rng.standard_normal(tuple(mine.shape))
            _copy_into(mine, values)
            with torch.no_grad():
                theirs.copy_(torch.from_numpy(values))
    return ours, ref


@pytest.mark.parametrize("args,kwargs", [
    ((6,), {}),
    ((6, 0.5), {}),  # eps given positionally: eps, never the bias
    ((6,), {"eps": 2.0}),
    ((6, 1e-5, False), {}),
    ((6,), {"bias": False}),
    (((2, 6),), {"elementwise_affine": False, "bias": True}),
    (([2, 6], 0.25, True, False), {}),
])
def test_layer_norm_forward_and_backward_match_torch(torch, args, kwargs):
    ours, ref = _layer_norm_pair(torch, *args, **kwargs)
    assert ours.eps == ref.eps and ours.normalized_shape == ref.normalized_shape
    assert ours.elementwise_affine == ref.elementwise_affine
    x = np.random.default_rng(1).standard_normal((3, 2, 6)) * 0.3
    g = np.random.default_rng(2).standard_normal((3, 2, 6))
    xo, xr = ta.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    yo, yr = ours(xo), ref(xr)
    np.testing.assert_allclose(_host(yo), yr.detach().numpy(), rtol=1e-10, atol=1e-12)
    yo.backward(ta.tensor(g))
    yr.backward(torch.from_numpy(g))
    np.testing.assert_allclose(_host(xo.grad), xr.grad.numpy(), rtol=1e-9, atol=1e-11)
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(_host(getattr(ours, name).grad), p.grad.numpy(),
                                   rtol=1e-9, atol=1e-11)


def test_layer_norm_eps_positional_is_eps():
    layer = nn.LayerNorm(16, 1e-6)
    assert layer.eps == 1e-6
    assert layer.bias is not None and layer.weight is not None


def test_layer_norm_without_affine_or_bias_registers_none_as_torch(torch):
    for kwargs in ({"elementwise_affine": False}, {"bias": False},
                   {"elementwise_affine": False, "bias": False}):
        ours, ref = nn.LayerNorm(4, **kwargs), torch.nn.LayerNorm(4, **kwargs)
        assert (ours.weight is None) == (ref.weight is None)
        assert ours.bias is None and ref.bias is None
        assert list(ours._parameters) == list(ref._parameters) == ["weight", "bias"]
        assert list(ours.state_dict()) == list(ref.state_dict())
        assert len(list(ours.parameters())) == len(list(ref.parameters()))


def test_layer_norm_initialisation_is_ones_and_zeros():
    layer = nn.LayerNorm((2, 3), dtype=ta.float64)
    np.testing.assert_array_equal(_host(layer.weight), np.ones((2, 3)))
    np.testing.assert_array_equal(_host(layer.bias), np.zeros((2, 3)))


# ------------------------------------------------------------------------- Embedding
def _embedding_pair(torch, *args, **kwargs):
    """Ours and torch's, both float64, with the same (padding row non-zero) table."""
    ours = nn.Embedding(*args, **kwargs, dtype=ta.float64)
    ref = torch.nn.Embedding(*args, **kwargs, dtype=torch.float64)
    table = np.random.default_rng(3).standard_normal(tuple(ours.weight.shape))
    _copy_into(ours.weight, table)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(table))
    return ours, ref


IDX = np.array([[1, 2, 1, 0], [4, 1, 3, 1], [2, 2, 0, 4]])


def _forward_backward(torch, ours, ref, idx=IDX):
    g = np.random.default_rng(4).standard_normal(idx.shape + (ours.embedding_dim,))
    yo, yr = ours(ta.tensor(idx)), ref(torch.from_numpy(idx))
    np.testing.assert_allclose(_host(yo), yr.detach().numpy(), rtol=1e-12, atol=1e-12)
    yo.backward(ta.tensor(g))
    yr.backward(torch.from_numpy(g))
    np.testing.assert_allclose(_host(ours.weight.grad), ref.weight.grad.numpy(),
                               rtol=1e-12, atol=1e-12)
    return ours.weight.grad


@pytest.mark.parametrize("padding_idx,row", [(1, 1), (0, 0), (-1, 4), (-5, 0), (4, 4)])
def test_padding_idx_forward_and_gradient_match_torch(torch, padding_idx, row):
    ours, ref = _embedding_pair(torch, 5, 3, padding_idx=padding_idx)
    assert ours.padding_idx == ref.padding_idx == row
    grad = _forward_backward(torch, ours, ref)
    np.testing.assert_array_equal(_host(grad)[row], np.zeros(3))
    assert np.abs(_host(grad)).sum(axis=1)[[r for r in range(5) if r != row]].min() > 0


def test_padding_row_gradient_is_zero_even_for_inf_and_nan(torch):
    ours, ref = _embedding_pair(torch, 5, 3, padding_idx=2)
    idx = np.array([2, 1, 2])
    g = np.array([[np.inf, 1.0, 2.0], [3.0, 4.0, 5.0], [np.nan, 0.0, 1.0]])
    ours(ta.tensor(idx)).backward(ta.tensor(g))
    ref(torch.from_numpy(idx)).backward(torch.from_numpy(g))
    np.testing.assert_array_equal(_host(ours.weight.grad), ref.weight.grad.numpy())
    np.testing.assert_array_equal(_host(ours.weight.grad)[2], np.zeros(3))


def test_padding_idx_second_order_matches_torch(torch):
    ours, ref = _embedding_pair(torch, 5, 3, padding_idx=1)
    idx = np.array([1, 2, 2, 4, 1])
    yo, yr = ours(ta.tensor(idx)), ref(torch.from_numpy(idx))
    (go,) = ta.autograd.grad((yo**3).sum(), [ours.weight], create_graph=True)
    (gr,) = torch.autograd.grad((yr**3).sum(), [ref.weight], create_graph=True)
    np.testing.assert_allclose(_host(go), gr.detach().numpy(), rtol=1e-12, atol=1e-12)
    (go**2).sum().backward()
    (gr**2).sum().backward()
    np.testing.assert_allclose(_host(ours.weight.grad), ref.weight.grad.numpy(),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kwargs", [{"scale_grad_by_freq": True},
                                    {"scale_grad_by_freq": True, "padding_idx": 2},
                                    {"padding_idx": 0}])
def test_recorded_backward_is_the_adjoint_of_the_weight_gradient(kwargs):
    """gw = L(g) is linear in g; with create_graph its backward must be L's adjoint:
    <L(g), v> == <g, L^T v>. (torch's double backward leaves the 1/count of
    scale_grad_by_freq out of L^T; this is the derivative of the gradient it computes.)"""
    layer = nn.Embedding(5, 3, dtype=ta.float64, **kwargs)
    idx = ta.tensor([[2, 0, 2], [4, 2, 0]])
    g = ta.randn(2, 3, 3, dtype=ta.float64, requires_grad=True)
    v = ta.randn(5, 3, dtype=ta.float64)
    (gw,) = ta.autograd.grad(layer(idx), [layer.weight], grad_outputs=[g], create_graph=True)
    (gw * v).sum().backward()
    assert abs(float((gw * v).sum().item()) - float((g * g.grad).sum().item())) < 1e-12
    assert float(g.grad.abs().sum().item()) > 0


def test_padding_row_is_zero_at_initialisation(torch):
    for padding_idx, row in ((3, 3), (-2, 8)):
        layer = nn.Embedding(10, 4, padding_idx=padding_idx)
        values = _host(layer.weight)
        np.testing.assert_array_equal(values[row], np.zeros(4, np.float32))
        assert np.all(np.abs(values[np.arange(10) != row]).sum(axis=1) > 0)
        t = torch.nn.Embedding(10, 4, padding_idx=padding_idx)
        assert torch.count_nonzero(t.weight[row]) == 0


def test_embedding_initialisation_is_standard_normal():
    values = _host(nn.Embedding(400, 50).weight)
    assert abs(values.mean()) < 0.02 and abs(values.std() - 1.0) < 0.02


def test_scale_grad_by_freq_matches_torch(torch):
    ours, ref = _embedding_pair(torch, 5, 3, scale_grad_by_freq=True)
    _forward_backward(torch, ours, ref)
    ours, ref = _embedding_pair(torch, 5, 3, scale_grad_by_freq=True, padding_idx=1)
    grad = _forward_backward(torch, ours, ref)
    np.testing.assert_array_equal(_host(grad)[1], np.zeros(3))


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
def test_max_norm_renormalises_the_looked_up_rows_as_torch(torch, norm_type):
    ours, ref = _embedding_pair(torch, 6, 4, max_norm=1.2, norm_type=norm_type)
    before = _host(ours.weight).copy()
    idx = np.array([[0, 2, 2], [5, 0, 3]])
    _forward_backward(torch, ours, ref, idx)
    after = _host(ours.weight)
    np.testing.assert_allclose(after, ref.weight.detach().numpy(), rtol=1e-12, atol=1e-12)
    untouched = [1, 4]  # rows not looked up keep their values, whatever their norm
    np.testing.assert_array_equal(after[untouched], before[untouched])
    norms = np.linalg.norm(after[[0, 2, 3, 5]], ord=norm_type, axis=1)
    assert np.all(norms <= 1.2 + 1e-9)
    assert not np.array_equal(after, before)  # the table has rows above 1.2 to renormalise


def test_max_norm_with_padding_idx_matches_torch(torch):
    ours, ref = _embedding_pair(torch, 5, 3, max_norm=0.5, padding_idx=0)
    _forward_backward(torch, ours, ref)
    np.testing.assert_allclose(_host(ours.weight), ref.weight.detach().numpy(),
                               rtol=1e-12, atol=1e-12)


def test_padding_idx_on_the_device(device):
    layer = nn.Embedding(5, 3, padding_idx=1, scale_grad_by_freq=True, max_norm=1.0,
                         device=device)
    idx = ta.tensor([[1, 2], [1, 2]], device=device)
    layer(idx).sum().backward()
    grad = layer.weight.grad
    assert grad.device.type == device
    expected = np.zeros((5, 3), np.float32)
    expected[2] = 1.0  # two occurrences of 2, each gradient 1, divided by the count 2
    np.testing.assert_array_equal(grad.cpu().numpy(), expected)


def test_padding_path_keeps_the_index_only():
    layer = nn.Embedding(50, 8, padding_idx=0)
    idx = ta.tensor([[0, 3, 7], [7, 0, 1]])
    out = layer(idx)
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 1 and saved[0].dtype is ta.int64 and tuple(saved[0].shape) == (2, 3)


def test_from_pretrained_freezes_and_shares_the_table(torch):
    table = np.arange(12.0).reshape(4, 3)
    ours = nn.Embedding.from_pretrained(ta.tensor(table))
    ref = torch.nn.Embedding.from_pretrained(torch.from_numpy(table))
    assert ours.weight.requires_grad is ref.weight.requires_grad is False
    assert repr(ours) == repr(ref)
    np.testing.assert_array_equal(_host(ours(ta.tensor([3, 1]))), table[[3, 1]])
    assert list(ours.parameters()) and list(ours.state_dict()) == ["weight"]

    source = ta.tensor(table)
    thawed = nn.Embedding.from_pretrained(source, freeze=False, padding_idx=2)
    assert thawed.weight.requires_grad and thawed.padding_idx == 2
    np.testing.assert_array_equal(_host(thawed.weight), table)  # the padding row is kept
    with ta.no_grad():
        source[0, 0] = -1.0
    assert _host(thawed.weight)[0, 0] == -1.0  # over the given memory, as torch's Parameter
    thawed(ta.tensor([2, 0])).sum().backward()
    np.testing.assert_array_equal(_host(thawed.weight.grad)[[0, 2]],
                                  [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])


def test_weight_and_freeze_arguments_as_torch(torch):
    table = np.ones((3, 2))
    ours = nn.Embedding(3, 2, _weight=ta.tensor(table), padding_idx=1)
    ref = torch.nn.Embedding(3, 2, _weight=torch.from_numpy(table), padding_idx=1)
    np.testing.assert_array_equal(_host(ours.weight), ref.weight.detach().numpy())
    assert ours.weight.requires_grad and ref.weight.requires_grad
    assert not nn.Embedding(3, 2, _freeze=True).weight.requires_grad
    assert not torch.nn.Embedding(3, 2, _freeze=True).weight.requires_grad


@pytest.mark.parametrize("build", [
    lambda lib: lib.nn.Embedding(10, 3, padding_idx=10),
    lambda lib: lib.nn.Embedding(10, 3, padding_idx=-11),
    lambda lib: lib.nn.Embedding.from_pretrained(lib.zeros(3, 2), padding_idx=3),
    lambda lib: lib.nn.Embedding(10, 3, _weight=lib.zeros(3, 3)),
    lambda lib: lib.nn.Embedding.from_pretrained(lib.zeros(3)),
], ids=["padding-high", "padding-low", "pretrained-padding", "weight-shape", "pretrained-1d"])
def test_embedding_errors_are_torchs(torch, build):
    with pytest.raises(AssertionError) as theirs:
        build(torch)
    with pytest.raises(AssertionError) as mine:
        build(ta)
    assert str(mine.value) == str(theirs.value)


def test_sparse_is_refused_by_name():
    with pytest.raises(NotImplementedError, match="sparse=True"):
        nn.Embedding(4, 2, sparse=True)
    with pytest.raises(NotImplementedError, match="sparse=True"):
        nn.Embedding.from_pretrained(ta.zeros(4, 2), sparse=True)


def test_out_of_range_index_is_refused_before_renormalising():
    layer = nn.Embedding(4, 2, max_norm=0.1)
    before = _host(layer.weight).copy()
    with pytest.raises(IndexError, match="embedding: index 4 is out of range"):
        layer(ta.tensor([0, 4]))
    np.testing.assert_array_equal(_host(layer.weight), before)


# ------------------------------------------------------------------------- reprs
@pytest.mark.parametrize("build", [
    lambda lib: lib.nn.Linear(4, 4),
    lambda lib: lib.nn.Linear(3, 5, bias=False),
    lambda lib: lib.nn.LayerNorm(16),
    lambda lib: lib.nn.LayerNorm((2, 3), 1e-6, False, False),
    lambda lib: lib.nn.LayerNorm([8], bias=False),
    lambda lib: lib.nn.Embedding(10, 3),
    lambda lib: lib.nn.Embedding(10, 3, padding_idx=0),
    lambda lib: lib.nn.Embedding(10, 3, padding_idx=-1, max_norm=1.0, norm_type=1.0,
                                 scale_grad_by_freq=True),
    lambda lib: lib.nn.Embedding(10, 3, max_norm=2, norm_type=2),
])
def test_reprs_are_torchs(torch, build):
    assert repr(build(ta)) == repr(build(torch))
