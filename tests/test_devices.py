"""The same computations on every device: values and gradients match the CPU's, and
mixing devices is an error, never a silent transfer."""

import numpy as np
import pytest

import tinygrad_attn as ta


def _attention_step(x, w):
    B, T, C = x.shape
    q, k, v = (x @ w).split(C, dim=-1)
    att = (q @ k.mT) * C ** -0.5
    mask = ta.ones(T, T, dtype=ta.bool, device=x.device).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(-1)
    return (att @ v).relu().sum()


def test_same_values_and_grads_as_cpu(device):
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((2, 5, 4))
    w_np = rng.standard_normal((4, 12))
    results = {}
    for dev in ("cpu", device):
        x = ta.tensor(x_np, dtype=ta.float64, device=dev, requires_grad=True)
        w = ta.tensor(w_np, dtype=ta.float64, device=dev, requires_grad=True)
        loss = _attention_step(x, w)
        loss.backward()
        results[dev] = (loss.item(), x.grad.cpu().numpy(), w.grad.cpu().numpy())
    (l0, gx0, gw0), (l1, gx1, gw1) = results["cpu"], results[device]
    assert l0 == pytest.approx(l1, rel=1e-12)
    np.testing.assert_allclose(gx1, gx0, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gw1, gw0, rtol=1e-10, atol=1e-12)
    assert x.grad.device == ta.backend.canonical_device(device)


def test_to_device_round_trip_has_a_gradient(device):
    x = ta.randn(3, 4, dtype=ta.float64, requires_grad=True)
    y = x.to(device)
    assert y.device == ta.backend.canonical_device(device)
    (y * 2).cpu().sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((3, 4), 2.0))


@pytest.mark.skipif(ta.cuda.is_available(), reason="checks the error raised without a GPU")
def test_cuda_without_gpu_is_a_clear_error():
    with pytest.raises(RuntimeError, match="CuPy and a CUDA GPU"):
        ta.zeros(2, device="cuda")
    with pytest.raises(RuntimeError, match="CuPy and a CUDA GPU"):
        ta.zeros(2).to("cuda")


def test_unknown_device_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        ta.zeros(2, device="tpu")


@pytest.mark.skipif(not ta.cuda.is_available(), reason="needs a GPU")
def test_mixed_devices_raise():
    a, b = ta.ones(2), ta.ones(2, device="cuda")
    with pytest.raises(ta.DeviceMismatchError, match="add"):
        a + b


def test_numpy_dlpack_round_trip_shares_memory():
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = ta.from_dlpack(arr.T)  # strided producer: kept strided, no copy
    assert t.shape == (4, 3) and t.stride() == (1, 4) and not t.is_contiguous()
    arr[0, 1] = 100.0
    assert t[1, 0].item() == 100.0
    back = np.from_dlpack(t)
    back[2, 2] = -1.0
    assert arr[2, 2] == -1.0
    assert ta.from_numpy(arr).shares_storage(ta.from_numpy(arr)) is False  # two Storages


def test_cuda_dlpack_with_torch(device):
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    src = torch.arange(6, dtype=torch.float32, device=device).reshape(2, 3)
    t = ta.from_dlpack(src)
    src[1, 2] = 42.0
    assert t[1, 2].item() == 42.0
    back = torch.from_dlpack(t)
    assert back.data_ptr() == src.data_ptr()


def test_tensor_from_an_array_keeps_its_dtype_on_every_device(device):
    # an array's dtype is kept whether or not it has to cross to another device (the GPU
    # path once cast float64 to float32 and int32 to int64, unlike the CPU path)
    for arr, want in ((np.arange(3.0), ta.float64), (np.arange(3, dtype=np.int32), ta.int32),
                      (np.arange(3, dtype=np.float16), ta.float16)):
        t = ta.tensor(arr, device=device)
        assert (t.dtype, t.device) == (want, ta.backend.canonical_device(device))
        np.testing.assert_array_equal(t.cpu().numpy(), arr)
    assert ta.tensor([1.0, 2.0], device=device).dtype == ta.float32  # Python data: defaults
    assert ta.tensor([1, 2], device=device).dtype == ta.int64


def test_rng_state_round_trips_on_every_device(device):
    # CuPy's generators cannot export their state: a CUDA stream's state is a draw count,
    # JSON-able like the CPU's (the trainer writes it into checkpoints as JSON)
    import json

    ta.manual_seed(3)
    ta.randn(4, device=device)
    state = json.loads(json.dumps(ta.get_rng_state()))
    a = [ta.randn(5, device=device).cpu().numpy(), ta.rand(3, device=device).cpu().numpy()]
    ta.manual_seed(99)
    ta.set_rng_state(state)
    b = [ta.randn(5, device=device).cpu().numpy(), ta.rand(3, device=device).cpu().numpy()]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0][:3], a[1])  # real draws, not a constant


def test_the_installed_array_module_is_read_live_by_every_backend_module(monkeypatch):
    """_install_array_module rebinds the one `cp` (in backend/devices.py); the backend's
    other modules and `ta.backend.cp` read that one, so none keeps a stale copy."""
    import fake_cupy
    from conftest import install_fake_cupy

    had_cuda = ta.cuda.is_available()
    previous = install_fake_cupy(monkeypatch)
    try:
        assert ta.backend.cp is fake_cupy and ta.backend.devices.cp is fake_cupy
        assert ta.backend.xp_for("cuda:0") is fake_cupy
        x = ta.arange(6, dtype=ta.float32, device="cuda").reshape(2, 3).mT.contiguous()
        assert isinstance(x._array(), fake_cupy.ndarray)  # layout.strided built it
        assert x.tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
        assert ta.backend.is_array(x._array())
    finally:
        ta.backend._install_array_module(previous)
    assert ta.backend.cp is previous and ta.backend.cuda_is_available() == had_cuda
