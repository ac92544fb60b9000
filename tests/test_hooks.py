"""What a tensor hook may return: None (keep the gradient) or a Tensor of the gradient's shape,
dtype and device. Anything else raises as PyTorch does, on a leaf and on a non-leaf alike."""

import pytest

import tinygrad_attn as ta


def _run_ta(leaf: bool, hook):
    x = ta.ones(2, 3, requires_grad=True)
    t = x if leaf else x * 1
    t.register_hook(hook)
    (t * 2).sum().backward()
    return x


def _run_torch(torch, leaf: bool, hook):
    x = torch.ones(2, 3, requires_grad=True)
    t = x if leaf else x * 1
    t.register_hook(hook)
    (t * 2).sum().backward()
    return x


@pytest.mark.parametrize("leaf", [True, False], ids=["leaf", "non-leaf"])
def test_hook_returning_none_or_a_same_shaped_tensor_is_used(leaf):
    torch = pytest.importorskip("torch")
    for ta_hook, torch_hook in ((lambda g: None, lambda g: None),
                                (lambda g: g * 3, lambda g: g * 3)):
        ours = _run_ta(leaf, ta_hook).grad.numpy()
        theirs = _run_torch(torch, leaf, torch_hook).grad.numpy()
        assert ours.tolist() == theirs.tolist()
    assert _run_ta(leaf, lambda g: g * 3).grad.numpy().tolist() == [[6.0] * 3] * 2


@pytest.mark.parametrize("leaf", [True, False], ids=["leaf", "non-leaf"])
def test_hook_changing_the_shape_raises_runtime_error(leaf):
    torch = pytest.importorskip("torch")

    def reshaping_hook(g):
        return ta.ones(3, 2)

    def torch_reshaping_hook(g):
        return torch.ones(3, 2)

    with pytest.raises(RuntimeError, match="has changed the size of value") as theirs:
        _run_torch(torch, leaf, torch_reshaping_hook)
    assert "torch_reshaping_hook" in str(theirs.value)
    with pytest.raises(RuntimeError, match=r"hook 'reshaping_hook' has changed the size of "
                                           r"value.*shape \(2, 3\).*\(3, 2\)"):
        _run_ta(leaf, reshaping_hook)


@pytest.mark.parametrize("leaf", [True, False], ids=["leaf", "non-leaf"])
def test_hook_changing_the_dtype_raises_runtime_error(leaf):
    torch = pytest.importorskip("torch")

    def widening_hook(g):
        return g.to(ta.float64)

    with pytest.raises(RuntimeError, match="has changed the type of value"):
        _run_torch(torch, leaf, lambda g: g.double())
    with pytest.raises(RuntimeError, match=r"hook 'widening_hook' has changed the type of "
                                           r"value.*shape \(2, 3\).*float32.*float64"):
        _run_ta(leaf, widening_hook)


@pytest.mark.parametrize("leaf", [True, False], ids=["leaf", "non-leaf"])
@pytest.mark.parametrize("returned", [3, 2.5, "grad", [1.0, 2.0]],
                         ids=["int", "float", "str", "list"])
def test_hook_returning_a_non_tensor_raises_type_error(leaf, returned):
    torch = pytest.importorskip("torch")

    def number_hook(g):
        return returned

    with pytest.raises(TypeError, match=f"hook returned '{type(returned).__name__}'"):
        _run_torch(torch, leaf, number_hook)
    with pytest.raises(TypeError, match=r"hook 'number_hook' on a tensor of shape \(2, 3\).*"
                                        f"hook returned '{type(returned).__name__}'"):
        _run_ta(leaf, number_hook)


def test_hook_returning_a_numpy_array_raises_type_error():
    x = ta.ones(2, 3, requires_grad=True)
    x.register_hook(lambda g: g.numpy())
    with pytest.raises(TypeError, match="hook '<lambda>'.*hook returned 'ndarray'"):
        (x * 2).sum().backward()
    assert x.grad is None  # nothing was accumulated from the refused gradient


@pytest.mark.parametrize("leaf", [True, False], ids=["leaf", "non-leaf"])
def test_hook_moving_the_gradient_to_another_device_raises_runtime_error(gpu_device, leaf):
    x = ta.ones(2, 3, device=gpu_device, requires_grad=True)
    t = x if leaf else x * 1

    def host_hook(g):
        return g.to("cpu")

    t.register_hook(host_hook)
    with pytest.raises(RuntimeError, match=r"hook 'host_hook' has changed the type of value.*"
                                           r"shape \(2, 3\) was cuda.*returned cpu"):
        (t * 2).sum().backward()
