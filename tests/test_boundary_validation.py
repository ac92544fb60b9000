"""Bad arguments at the API boundary raise clear errors naming the op or argument: tensor
data, random dtypes, softmax on integers, device strings, memory limits."""

import pytest

import tinygrad_attn as ta
from tinygrad_attn import memory


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("data", [[2**63], [2**70], 2**64])
def test_tensor_refuses_integer_overflow(torch, data):
    with pytest.raises(ValueError, match=r"tensor\(\): integer out of range of int64"):
        ta.tensor(data)
    with pytest.raises(ValueError, match="Overflow"):
        torch.tensor(data)


def test_tensor_keeps_int64_extremes_and_big_floats():
    assert ta.tensor([-(2**63), 2**63 - 1]).tolist() == [-(2**63), 2**63 - 1]
    assert ta.tensor([2**70], dtype=ta.float32).item() == pytest.approx(2.0**70)


@pytest.mark.parametrize("data, dtype", [([300], "uint8"), ([2**40], "int32")])
def test_tensor_refuses_values_that_do_not_fit_the_dtype(torch, data, dtype):
    with pytest.raises(RuntimeError, match=f"cannot be converted to {dtype} without overflow"):
        ta.tensor(data, dtype=dtype)
    with pytest.raises(RuntimeError, match="overflow"):
        torch.tensor(data, dtype=getattr(torch, dtype))


def test_negative_into_uint8_is_refused_not_wrapped():
    # torch wraps -1 to 255 here; we refuse (docs/differences.md)
    with pytest.raises(RuntimeError, match="value -1 cannot be converted to uint8"):
        ta.tensor([-1], dtype="uint8")


def test_tensor_refuses_ragged_lists(torch):
    with pytest.raises(ValueError, match=r"tensor\(\): nested lists must be rectangular"):
        ta.tensor([[1, 2], [3]])
    with pytest.raises(ValueError):
        torch.tensor([[1, 2], [3]])


@pytest.mark.parametrize("data, kind", [(["a"], "str"), ("a", "str"), ([1, None], "NoneType"),
                                        (None, "NoneType")])
def test_tensor_refuses_non_numbers(data, kind):
    with pytest.raises(TypeError, match=f"tensor\\(\\): data must be numbers or bools, got {kind}"):
        ta.tensor(data)


@pytest.mark.parametrize("make, name", [
    (lambda: ta.randn(4, dtype=ta.int64), "randn"),
    (lambda: ta.rand(4, dtype=ta.bool), "rand"),
    (lambda: ta.randn_like(ta.ones(2, dtype=ta.int64)), "randn_like"),
    (lambda: ta.rand_like(ta.ones(2), dtype=ta.int32), "rand_like"),
])
def test_random_floats_refuse_integer_dtypes(torch, make, name):
    with pytest.raises(RuntimeError, match=f"{name}: dtype \\w+ is not supported"):
        make()
    with pytest.raises(RuntimeError):
        torch.randn(4, dtype=torch.int64)


def test_randint_takes_any_dtype():
    assert ta.randint(0, 3, (4,), dtype=ta.float32).dtype == ta.float32


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_refuses_integers_naming_the_op(torch, name):
    with pytest.raises(RuntimeError, match=f"{name}: expected a floating-point tensor, got int64"):
        getattr(ta.tensor([1, 2]), name)(-1)
    with pytest.raises(RuntimeError, match=name):
        getattr(torch.tensor([1, 2]), name)(-1)


# ----------------------------------------------------------------------------- devices
@pytest.mark.skipif(ta.cuda.is_available(), reason="checks the error raised without a GPU")
@pytest.mark.parametrize("make", [
    lambda: ta.tensor([1.0], device="cuda"),
    lambda: ta.randn(2, device="cuda"),
    lambda: ta.rand(2, device="cuda:1"),
    lambda: ta.randint(0, 3, (2,), device="cuda"),
    lambda: ta.arange(3, device="cuda"),
    lambda: ta.full((2,), 1.0, device="cuda"),
    lambda: ta.ones(2).to("cuda"),
])
def test_cuda_without_cupy_is_a_clear_error(make):
    with pytest.raises(RuntimeError, match="needs CuPy and a CUDA GPU"):
        make()


@pytest.mark.parametrize("device", ["tpu", "gpu", "CPU", "cuda:x", "cuda:-1", "cuda:"])
def test_one_device_parser_names_the_valid_forms(device):
    expected = f"unknown device '{device}'.*'cpu', 'cuda' or 'cuda:N'"
    for make in (lambda: ta.zeros(2, device=device), lambda: ta.randn(2, device=device),
                 lambda: ta.tensor([1.0], device=device), lambda: ta.ones(2).to(device),
                 lambda: memory.set_limit("1MiB", device), lambda: memory.live_bytes(device)):
        with pytest.raises(ValueError, match=expected):
            make()


def test_device_forms_accepted():
    assert ta.ones(1, device="cpu:0").device == "cpu"
    assert ta.ones(1).to("float64").dtype == ta.float64  # a dtype name is not a device
    with pytest.raises(TypeError, match="device must be a string"):
        ta.ones(1, device=1.5)


# ----------------------------------------------------------------------------- memory limits
@pytest.mark.parametrize("size", ["-1", -1, "nan", "inf", "1e400", float("nan"), "-2GiB"])
def test_set_limit_refuses_negative_and_non_finite_sizes(size):
    with pytest.raises(ValueError, match=r"set_limit: size: a size must be finite and >= 0.*"
                                         r"'6GiB'"):
        memory.set_limit(size)
    assert memory.get_limit() is None
    ta.zeros(10)  # nothing was left behind that fails later allocations


def test_parse_bytes_names_the_argument_and_forms():
    with pytest.raises(ValueError, match=r"size: cannot parse a size from 'lots'.*'512MB'"):
        memory.parse_bytes("lots")
    with pytest.raises(TypeError, match="size: expected a byte count"):
        memory.parse_bytes([1])
    assert memory.parse_bytes("1.5k") == 1500 and memory.parse_bytes(0) == 0


def test_set_limit_none_removes_the_limit():
    memory.set_limit("1KiB")
    try:
        assert memory.get_limit() == 1024
    finally:
        memory.set_limit(None)
    assert memory.get_limit() is None
    ta.zeros(1000)
