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


# ----------------------------------------------------------------------------- post-accumulate
def _post_accumulate_run(lib, hook_factory, passes=2, inputs=False):
    """Hooks on two leaves; `passes` backwards; what each hook saw of .grad, in order."""
    a = lib.tensor([1.0, 2.0], requires_grad=True)
    b = lib.tensor([3.0, 4.0], requires_grad=True)
    seen = []
    for name, t in (("a", a), ("b", b)):
        t.register_post_accumulate_grad_hook(hook_factory(name, seen))
    for _ in range(passes):
        loss = (a * b).sum() + (a * a).sum()  # two gradients summed into a before its hook
        if inputs:
            loss.backward(inputs=[a])
        else:
            loss.backward()
    return a, b, seen


def test_post_accumulate_grad_hook_sees_the_summed_grad_like_torch():
    torch = pytest.importorskip("torch")

    def factory(name, seen):
        return lambda p: seen.append((name, p.grad.tolist()))

    for inputs in (False, True):
        _, _, ours = _post_accumulate_run(ta, factory, inputs=inputs)
        _, _, theirs = _post_accumulate_run(torch, factory, inputs=inputs)
        assert sorted(ours) == sorted(theirs)
        # each pass's .grad is the running sum: 2a+b = [5, 8], then [10, 16]
        assert ("a", [5.0, 8.0]) in ours and ("a", [10.0, 16.0]) in ours


def test_post_accumulate_grad_hook_may_change_grad_in_place_and_is_removable():
    a = ta.tensor([1.0, 2.0], requires_grad=True)

    def scale(p):
        p.grad.mul_(10)

    handle = a.register_post_accumulate_grad_hook(scale)
    (a * 3).sum().backward()
    assert a.grad.tolist() == [30.0, 30.0]
    handle.remove()
    (a * 3).sum().backward()
    assert a.grad.tolist() == [33.0, 33.0]


def test_post_accumulate_grad_hook_not_run_by_autograd_grad():
    a = ta.tensor([1.0, 2.0], requires_grad=True)
    calls = []
    a.register_post_accumulate_grad_hook(lambda p: calls.append(1))
    (g,) = ta.autograd.grad((a * 3).sum(), a)
    assert g.tolist() == [3.0, 3.0] and calls == [] and a.grad is None


def test_post_accumulate_grad_hook_errors_match_torch():
    torch = pytest.importorskip("torch")
    for lib in (ta, torch):
        x = lib.ones(2, requires_grad=True)
        with pytest.raises(RuntimeError, match="non-leaf"):
            (x * 2).register_post_accumulate_grad_hook(lambda p: None)
        with pytest.raises(RuntimeError, match="doesn't require gradient"):
            lib.ones(2).register_post_accumulate_grad_hook(lambda p: None)
        x.register_post_accumulate_grad_hook(lambda p: p.grad * 2)
        with pytest.raises(RuntimeError, match="should return None"):
            (x * 2).sum().backward()


def test_queued_callback_runs_after_every_gradient_before_backward_returns():
    a = ta.tensor([1.0, 2.0], requires_grad=True)
    b = ta.tensor([3.0, 4.0], requires_grad=True)
    order = []

    def hook(p):
        order.append("hook")
        if len(order) == 1:  # queued once, from the first hook
            ta.autograd.queue_callback(lambda: order.append(("callback", a.grad.tolist(),
                                                             b.grad.tolist())))

    a.register_post_accumulate_grad_hook(hook)
    b.register_post_accumulate_grad_hook(hook)
    (a * b).sum().backward()
    assert order == ["hook", "hook", ("callback", [3.0, 4.0], [1.0, 2.0])]
    with pytest.raises(RuntimeError, match="queue_callback: only a backward in progress"):
        ta.autograd.queue_callback(lambda: None)
