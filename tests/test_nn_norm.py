"""ops/norm.py, nn/norm.py and nn/init.py against torch.

ROWS (run by tests/rows_vs_torch.py): rms_norm, group_norm, batch_norm (train and eval, the
running statistics compared as outputs) and normalize on transposed, sliced, empty and
0-d-statistic inputs in float32 and float64, and the errors torch raises. Then the
modules (BatchNorm's buffers over several steps, momentum=None, eval mode, state_dict),
and nn.init's formulas: exactly where they are deterministic, statistically otherwise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from rows_vs_torch import Case, arr, case_ids, check_case, randn

import nn
import tinygrad_attn as ta

F32 = np.float32


def _f(lib):
    return lib.functional if lib is ta else lib.nn.functional


def _bn(training, momentum=0.1, affine=True):
    """batch_norm with fresh running statistics, returned beside y so their update is
    compared too."""
    def fn(lib, x, *wb):
        C = x.shape[1]
        rm = lib.tensor(np.linspace(-1.0, 1.0, C, dtype=np.float64)).to(x.dtype)
        rv = lib.tensor(np.linspace(0.5, 2.0, C, dtype=np.float64)).to(x.dtype)
        w, b = wb if affine else (None, None)
        y = _f(lib).batch_norm(x, rm, rv, w, b, training, momentum, 1e-5)
        return y, rm, rv
    return fn


X3 = randn(3, 4, 5)
W4, B4 = randn(4, seed=1), randn(4, seed=2)

ROWS = {
    "rms_norm": [
        Case(lambda lib, x: _f(lib).rms_norm(x, (5,)), (X3,)),
        Case(lambda lib, x: _f(lib).rms_norm(x, [5]), (X3,), layout="transposed"),
        Case(lambda lib, x, w: _f(lib).rms_norm(x, (4, 5), w, 1e-3), (X3, randn(4, 5, seed=3)),
             layout="sliced"),
        Case(lambda lib, x, w: _f(lib).rms_norm(x, (5,), w), (X3.astype(F32), randn(5, dtype=F32))),
        Case(lambda lib, x: _f(lib).rms_norm(x, (5,)), (randn(0, 5),)),
        Case(lambda lib, x: _f(lib).rms_norm(x, (4,)), (X3,), raises=RuntimeError),
        Case(lambda lib, x, w: _f(lib).rms_norm(x, (5,), w), (X3, randn(4)),
             raises=RuntimeError),
        Case(lambda lib, x: _f(lib).rms_norm(x, (5,)), (np.ones((2, 5), np.int64),),
             raises=NotImplementedError),
        # a weight of another dtype: the output keeps the input's, each gradient its own
        Case(lambda lib, x, w: _f(lib).rms_norm(x, (5,), w), (X3, randn(5, dtype=F32)),
             all_grads=True),
        Case(lambda lib, x, w: _f(lib).rms_norm(x, (5,), w), (X3.astype(F32), randn(5)),
             all_grads=True),
    ],
    "group_norm": [
        Case(lambda lib, x, w, b: _f(lib).group_norm(x, 2, w, b), (X3, W4, B4)),
        Case(lambda lib, x, w, b: _f(lib).group_norm(x, 4, w, b, 1e-3), (X3, W4, B4),
             layout="transposed"),
        Case(lambda lib, x: _f(lib).group_norm(x, 1), (randn(2, 4, 3, 2),), layout="sliced"),
        Case(lambda lib, x: _f(lib).group_norm(x, 2), (X3.astype(F32),)),
        Case(lambda lib, x: _f(lib).group_norm(x, 2), (randn(0, 4, 3),)),
        Case(lambda lib, x: _f(lib).group_norm(x, 3), (X3,), raises=RuntimeError),
        Case(lambda lib, x, w: _f(lib).group_norm(x, 2, w), (X3, randn(3)),
             raises=RuntimeError),
    ],
    "batch_norm": [
        Case(_bn(True), (X3, W4, B4)),
        Case(_bn(True, 0.3), (X3, W4, B4), layout="transposed"),
        Case(_bn(True, affine=False), (randn(6, 4),), layout="sliced"),
        Case(_bn(True, affine=False), (randn(2, 4, 3, 3),)),
        Case(_bn(False), (X3, W4, B4)),
        Case(_bn(False, affine=False), (X3,), layout="sliced"),
        Case(_bn(True), (X3.astype(F32), W4.astype(F32), B4.astype(F32))),
        Case(_bn(False), (X3.astype(F32), W4.astype(F32), B4.astype(F32))),
        Case(lambda lib, x: _f(lib).batch_norm(x, None, None, training=True), (randn(5, 3),)),
        Case(_bn(True), (randn(1, 4),), raises=ValueError),
        Case(_bn(True), (X3, randn(3), randn(3)), raises=RuntimeError),
    ],
    "normalize": [
        Case(lambda lib, x: _f(lib).normalize(x), (X3,)),
        Case(lambda lib, x: _f(lib).normalize(x, 1.0, -1), (X3,), layout="transposed"),
        Case(lambda lib, x: _f(lib).normalize(x, 3.0, 0, 1e-3), (X3,), layout="sliced"),
        Case(lambda lib, x: _f(lib).normalize(x, dim=0), (arr([[0.0, 1.0], [0.0, 2.0]]),)),
        Case(lambda lib, x: _f(lib).normalize(x), (X3.astype(F32),)),
        Case(lambda lib, x: _f(lib).normalize(x), (randn(0, 3),)),
    ],
}
PARAMS, IDS = case_ids(ROWS)


@pytest.mark.parametrize("name,k", PARAMS, ids=IDS)
def test_matches_torch(name, k):
    torch = pytest.importorskip("torch")
    check_case(ROWS[name][k], torch)


# ----------------------------------------------------------------------------- modules
def _copy_params(ours, theirs, torch):
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.copy_(torch.tensor(dict(ours.named_parameters())[name].detach().numpy()))


@pytest.mark.parametrize("cls,shape", [("BatchNorm1d", (6, 3)), ("BatchNorm1d", (4, 3, 5)),
                                       ("BatchNorm2d", (4, 3, 2, 2))])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm_module_tracks_running_stats_as_torch(cls, shape, momentum):
    torch = pytest.importorskip("torch")
    ours = getattr(nn, cls)(3, momentum=momentum).double()
    theirs = getattr(torch.nn, cls)(3, momentum=momentum).double()
    with ta.no_grad():
        ours.weight.copy_(ta.tensor([0.5, 1.5, -1.0], dtype=ta.float64))
    _copy_params(ours, theirs, torch)
    for step in range(3):
        x = randn(*shape, seed=step) * (step + 1) + step
        y, yt = ours(ta.tensor(x)), theirs(torch.tensor(x))
        np.testing.assert_allclose(y.detach().numpy(), yt.detach().numpy(), atol=1e-12)
    sd, sdt = ours.state_dict(), theirs.state_dict()
    assert list(sd) == list(sdt)  # weight, bias, running_mean, running_var, num_batches...
    for key in sd:
        np.testing.assert_allclose(sd[key].numpy(), sdt[key].numpy(), rtol=1e-12, err_msg=key)
    assert sd["num_batches_tracked"].dtype == ta.int64 and sd["num_batches_tracked"].item() == 3
    ours.eval()
    theirs.eval()
    x = randn(*shape, seed=9)
    np.testing.assert_allclose(ours(ta.tensor(x)).detach().numpy(),
                               theirs(torch.tensor(x)).detach().numpy(), atol=1e-12)
    assert ours.num_batches_tracked.item() == 3  # eval leaves the buffers alone


def test_batchnorm_without_running_stats_or_affine_matches_torch():
    torch = pytest.importorskip("torch")
    ours = nn.BatchNorm2d(2, affine=False, track_running_stats=False).double().eval()
    theirs = torch.nn.BatchNorm2d(2, affine=False, track_running_stats=False).double().eval()
    assert list(ours.state_dict()) == [] == list(theirs.state_dict())
    x = randn(3, 2, 2, 2)
    np.testing.assert_allclose(ours(ta.tensor(x)).numpy(), theirs(torch.tensor(x)).numpy(),
                               atol=1e-12)


def test_batchnorm_buffers_round_trip_through_save_and_load(tmp_path):
    bn = nn.BatchNorm1d(3)
    bn(ta.randn(5, 3) * 3 + 1)
    nn.save(bn.state_dict(), tmp_path / "bn.safetensors")
    fresh = nn.BatchNorm1d(3)
    fresh.load_state_dict(nn.load(tmp_path / "bn.safetensors"))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        np.testing.assert_array_equal(getattr(fresh, name).numpy(), getattr(bn, name).numpy())
    assert fresh.running_var.numpy().max() > 1.5  # the loaded values, not the fresh ones


def test_batchnorm_rejects_the_wrong_rank():
    with pytest.raises(ValueError, match=r"BatchNorm2d: expected 4D input \(got 3D"):
        nn.BatchNorm2d(3)(ta.randn(2, 3, 4))
    with pytest.raises(ValueError, match="BatchNorm1d: expected 2D or 3D input"):
        nn.BatchNorm1d(3)(ta.randn(2, 3, 4, 4))


def test_rmsnorm_and_groupnorm_modules_match_torch():
    torch = pytest.importorskip("torch")
    x = randn(2, 4, 3)
    for ours, theirs in ((nn.RMSNorm(3), torch.nn.RMSNorm(3)),
                         (nn.RMSNorm([4, 3], eps=1e-4), torch.nn.RMSNorm([4, 3], eps=1e-4)),
                         (nn.GroupNorm(2, 4), torch.nn.GroupNorm(2, 4))):
        ours, theirs = ours.double(), theirs.double()
        assert [n for n, _ in ours.named_parameters()] == \
            [n for n, _ in theirs.named_parameters()]
        np.testing.assert_allclose(ours(ta.tensor(x)).detach().numpy(),
                                   theirs(torch.tensor(x)).detach().numpy(), atol=1e-12)
    with pytest.raises(ValueError, match="divisible"):
        nn.GroupNorm(3, 4)


def test_identity_flatten_unflatten_are_views():
    x = ta.randn(2, 3, 4)
    assert nn.Identity(54, unused=1)(x) is x
    flat = nn.Flatten()(x)
    assert flat.shape == (2, 12) and flat.untyped_storage() is x.untyped_storage()
    assert nn.Flatten(0, 1)(x).shape == (6, 4)
    back = nn.Unflatten(1, (3, 4))(flat)
    assert back.shape == (2, 3, 4) and back.untyped_storage() is x.untyped_storage()
    np.testing.assert_array_equal(back.numpy(), x.numpy())


# ----------------------------------------------------------------------------- init
N = 200_000  # samples per statistical check: the moments below are good to ~1%


def _sample(fn, *shape, **kwargs):
    t = ta.empty(*shape, dtype=ta.float64)
    out = fn(t, **kwargs)
    assert out is t
    return t.numpy().ravel()


def test_calculate_gain_is_torchs_table():
    torch = pytest.importorskip("torch")
    for name in ("linear", "conv2d", "conv_transpose1d", "sigmoid", "tanh", "relu", "selu"):
        assert nn.init.calculate_gain(name) == torch.nn.init.calculate_gain(name)
    for slope in (None, 0.2, 1):
        assert nn.init.calculate_gain("leaky_relu", slope) == \
            torch.nn.init.calculate_gain("leaky_relu", slope)
    with pytest.raises(ValueError, match="unsupported nonlinearity 'swish'"):
        nn.init.calculate_gain("swish")


def test_constant_zeros_ones_are_exact_and_leave_no_history():
    w = nn.Parameter(ta.randn(3, 4))
    assert nn.init.constant_(w, 0.25) is w and w.is_leaf and w.requires_grad
    np.testing.assert_array_equal(w.detach().numpy(), np.full((3, 4), 0.25, np.float32))
    np.testing.assert_array_equal(nn.init.zeros_(w).detach().numpy(), 0)
    np.testing.assert_array_equal(nn.init.ones_(w).detach().numpy(), 1)


def test_init_is_reproducible_under_manual_seed():
    def draw():
        ta.manual_seed(7)
        return [f(ta.empty(4, 5)).numpy().copy() for f in (
            nn.init.uniform_, nn.init.normal_, nn.init.trunc_normal_, nn.init.xavier_uniform_,
            nn.init.kaiming_normal_, nn.init.orthogonal_)]
    for a, b in zip(draw(), draw()):
        np.testing.assert_array_equal(a, b)


def _fans(shape):
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


@pytest.mark.parametrize("kind", ["xavier_uniform", "kaiming_uniform", "uniform"])
def test_uniform_inits_have_torchs_bounds(kind):
    shape = (50, 40, 10, 10)
    fan_in, fan_out = _fans(shape)
    if kind == "xavier_uniform":
        x, bound = _sample(nn.init.xavier_uniform_, *shape, gain=2.0), \
            2.0 * math.sqrt(6.0 / (fan_in + fan_out))
    elif kind == "kaiming_uniform":
        x = _sample(nn.init.kaiming_uniform_, *shape, a=math.sqrt(5))
        bound = math.sqrt(3.0) * math.sqrt(2.0 / 6.0) / math.sqrt(fan_in)  # torch's formula
    else:
        x, bound = _sample(nn.init.uniform_, *shape, a=-0.5, b=1.5), None
        assert x.min() >= -0.5 and x.max() < 1.5
        assert abs(x.mean() - 0.5) < 0.01 and abs(x.std() - 2 / math.sqrt(12)) < 0.01
        return
    assert np.abs(x).max() <= bound
    assert np.abs(x).max() > 0.99 * bound  # the whole range is used
    assert abs(x.std() / (bound / math.sqrt(3.0)) - 1) < 0.01
    assert abs(x.mean()) < 0.01 * bound


@pytest.mark.parametrize("kind,mode", [("xavier_normal", None), ("kaiming_normal", "fan_in"),
                                       ("kaiming_normal", "fan_out"), ("normal", None)])
def test_normal_inits_have_torchs_std(kind, mode):
    shape = (40, 50, 10, 10)
    fan_in, fan_out = _fans(shape)
    if kind == "xavier_normal":
        x, std, mean = _sample(nn.init.xavier_normal_, *shape, gain=0.5), \
            0.5 * math.sqrt(2.0 / (fan_in + fan_out)), 0.0
    elif kind == "kaiming_normal":
        x = _sample(nn.init.kaiming_normal_, *shape, mode=mode, nonlinearity="relu")
        std, mean = math.sqrt(2.0) / math.sqrt(fan_in if mode == "fan_in" else fan_out), 0.0
    else:
        x, std, mean = _sample(nn.init.normal_, *shape, mean=3.0, std=0.5), 0.5, 3.0
    assert abs(x.std() / std - 1) < 0.01
    assert abs(x.mean() - mean) < 0.01 * std


def test_trunc_normal_matches_torchs_moments_and_bounds():
    torch = pytest.importorskip("torch")
    x = _sample(nn.init.trunc_normal_, N, mean=0.5, std=2.0, a=-1.0, b=3.0)
    torch.manual_seed(0)
    ref = torch.nn.init.trunc_normal_(torch.empty(N, dtype=torch.float64), 0.5, 2.0, -1.0,
                                      3.0).numpy()
    assert x.min() >= -1.0 and x.max() <= 3.0
    assert abs(x.mean() - ref.mean()) < 0.02 and abs(x.std() - ref.std()) < 0.02


@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (3, 2, 2, 2)])
def test_orthogonal_gives_orthonormal_rows_or_columns(shape):
    w = nn.init.orthogonal_(ta.empty(*shape, dtype=ta.float64), gain=2.0)
    flat = w.numpy().reshape(shape[0], -1)
    small = flat.T @ flat if flat.shape[0] >= flat.shape[1] else flat @ flat.T
    np.testing.assert_allclose(small, 4.0 * np.eye(min(flat.shape)), atol=1e-12)
    with pytest.raises(ValueError, match="2 or more dimensions"):
        nn.init.orthogonal_(ta.empty(3))


def test_fan_needs_two_dims():
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        nn.init.xavier_uniform_(ta.empty(5))
