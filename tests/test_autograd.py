"""The backward engine: accumulation, graph lifetime, grad mode, hooks, in-place checks."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.autograd import AccumulateGrad

DEVICE = {"name": "cpu"}  # where leaf() builds tensors: test_engine_on_device switches it


def leaf(values, dtype=ta.float64):
    return ta.tensor(np.asarray(values, dtype=np.float64), dtype=dtype, requires_grad=True,
                     device=DEVICE["name"])


def host(t):
    return t.detach().cpu().numpy()


# ----------------------------------------------------------------------------- accumulation
def test_grad_accumulates_over_two_backward_calls():
    x = leaf([1.0, -2.0, 3.0])
    (x * x).sum().backward()
    np.testing.assert_allclose(host(x.grad), [2.0, -4.0, 6.0])
    first = x.grad
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(host(x.grad), [5.0, -1.0, 9.0])
    assert x.grad is first  # accumulated in place into the same tensor


def test_retain_graph_allows_second_backward():
    x = leaf([0.5, 1.5])
    y = (x.exp() * x).sum()
    y.backward(retain_graph=True)
    once = host(x.grad).copy()
    np.testing.assert_allclose(once, np.exp([0.5, 1.5]) * (1 + np.array([0.5, 1.5])))
    y.backward()
    np.testing.assert_allclose(host(x.grad), 2 * once)


def test_second_backward_without_retain_graph_raises():
    x = leaf([0.5, 1.5])
    y = x.exp().sum()
    y.backward()
    with pytest.raises(RuntimeError, match=r"second time.*retain_graph=True"):
        y.backward()


def test_saved_tensors_freed_after_backward():
    x = leaf([1.0, 2.0, 3.0])
    y = x.exp()
    node = y.grad_fn
    assert len(node.saved_tensor_list()) == 1
    y.sum().backward()
    assert node.saved_tensor_list() == []
    assert node._saved is None


def test_saved_intermediate_storage_dies_after_backward():
    x = leaf([1.0, 2.0, 3.0])
    h = x * 3.0 + 1.0          # an intermediate, saved by log (log saves its input)
    out = h.log().sum()
    ref = weakref.ref(h.untyped_storage())
    del h
    assert ref() is not None   # kept alive only by LogBackward's saved tensors
    gc.disable()
    try:
        out.backward()
        assert ref() is None   # freed by refcount at backward, no gc needed
    finally:
        gc.enable()
    np.testing.assert_allclose(host(x.grad), 3.0 / (3.0 * np.array([1.0, 2.0, 3.0]) + 1.0))


@pytest.mark.parametrize("op", ["softmax", "exp", "tanh"])
def test_saved_output_storage_dies_after_backward(op):
    # these ops save their own output; it must be freed by refcount alone (no cycle
    # output -> node -> output), so the cyclic collector is switched off here
    gc.disable()
    try:
        x = leaf(np.arange(6.0).reshape(2, 3) / 6.0)
        s = getattr(x * 2.0, op)(-1) if op == "softmax" else getattr(x * 2.0, op)()
        out = (s * 3.0).sum()  # mul by a Python scalar saves nothing
        ref = weakref.ref(s.untyped_storage())
        del s
        assert ref() is not None
        out.backward()
        assert ref() is None
        assert x.grad is not None
    finally:
        gc.enable()


def test_retain_graph_keeps_saved_tensors():
    x = leaf([1.0, 2.0])
    h = x * 3.0 + 1.0
    out = h.log().sum()
    ref = weakref.ref(h.untyped_storage())
    del h
    out.backward(retain_graph=True)
    assert ref() is not None
    out.backward()
    assert ref() is None


# ----------------------------------------------------------------------------- grad mode
def test_no_grad_context_records_nothing():
    x = leaf([1.0, 2.0])
    with ta.no_grad():
        assert not ta.is_grad_enabled()
        y = x * 2.0 + x.exp()
        z = y.sum()
    assert ta.is_grad_enabled()
    for t in (y, z):
        assert not t.requires_grad and t.grad_fn is None
    with pytest.raises(RuntimeError, match="does not require grad"):
        z.backward()


def test_enable_grad_inside_no_grad():
    x = leaf([1.0, 2.0])
    with ta.no_grad():
        with ta.enable_grad():
            y = (x * x).sum()
        z = x * x
    assert y.requires_grad and y.grad_fn is not None and y.grad_fn.name == "SumBackward"
    assert not z.requires_grad and z.grad_fn is None
    y.backward()
    np.testing.assert_allclose(host(x.grad), [2.0, 4.0])


def test_grad_mode_decorators():
    @ta.no_grad()
    def f(t):
        assert not ta.is_grad_enabled()
        return t * 2.0

    @ta.enable_grad()
    def g(t):
        return t * 2.0

    x = leaf([1.0])
    y = f(x)
    assert not y.requires_grad and y.grad_fn is None
    assert ta.is_grad_enabled()
    with ta.no_grad():
        z = g(x)
        assert not ta.is_grad_enabled()
    assert z.requires_grad and z.grad_fn.name == "MulBackward"


def test_no_grad_restores_mode_after_exception():
    with pytest.raises(ZeroDivisionError):
        with ta.no_grad():
            raise ZeroDivisionError
    assert ta.is_grad_enabled()


def test_set_grad_enabled():
    x = leaf([1.0])
    with ta.set_grad_enabled(False):
        y = x * 2.0
    with ta.set_grad_enabled(True):
        z = x * 2.0
    assert y.grad_fn is None and z.grad_fn is not None


# ----------------------------------------------------------------------------- detach etc.
def test_detach_shares_storage():
    x = leaf([1.0, 2.0, 3.0])
    y = x * 2.0
    d = y.detach()
    assert d.shares_storage(y) and d.data_ptr() == y.data_ptr()
    assert not d.requires_grad and d.grad_fn is None and d.is_leaf
    with ta.no_grad():
        d.mul_(10.0)
    np.testing.assert_allclose(host(y), [20.0, 40.0, 60.0])
    assert y._version == d._version == 1


def test_requires_grad_on_int_tensor_raises():
    t = ta.tensor([1, 2, 3])
    with pytest.raises(RuntimeError, match=r"requires_grad_.*floating point.*int64"):
        t.requires_grad_()
    assert not t.requires_grad


def test_requires_grad_false_on_non_leaf_raises():
    y = leaf([1.0]) * 2.0
    with pytest.raises(RuntimeError, match="only leaves"):
        y.requires_grad_(False)


# ----------------------------------------------------------------------------- graph inspection
def test_grad_fn_names_and_next_functions():
    a = leaf(np.ones((2, 3)))
    b = leaf(np.ones((3, 4)))
    c = a @ b
    y = c.exp()
    assert c.grad_fn.name == "MatmulBackward"
    assert y.grad_fn.name == "ExpBackward"
    (nxt, nr), = y.grad_fn.next_functions
    assert nxt is c.grad_fn and nr == 0
    acc_a, acc_b = (e[0] for e in c.grad_fn.next_functions)
    assert isinstance(acc_a, AccumulateGrad) and acc_a.variable is a
    assert isinstance(acc_b, AccumulateGrad) and acc_b.variable is b
    assert acc_a.name == "AccumulateGrad"
    assert a.is_leaf and not c.is_leaf


def test_next_functions_none_for_inputs_without_grad():
    a = leaf([1.0, 2.0])
    b = ta.tensor([3.0, 4.0], dtype=ta.float64)
    y = a * b
    assert y.grad_fn.next_functions[1] is None
    assert isinstance(y.grad_fn.next_functions[0][0], AccumulateGrad)


def test_saved_tensor_list_shows_what_was_saved():
    a = leaf(np.arange(1.0, 7.0).reshape(2, 3))
    b = leaf(np.arange(12.0).reshape(3, 4))
    s = a.softmax(-1)
    (saved,) = s.grad_fn.saved_tensor_list()
    assert saved.shares_storage(s) and saved.shape == s.shape  # softmax saves its output
    e = a.exp()
    (saved,) = e.grad_fn.saved_tensor_list()
    assert saved.shares_storage(e)                               # exp saves its output
    m = a @ b
    sa, sb = m.grad_fn.saved_tensor_list()                        # matmul saves both inputs
    assert sa.shares_storage(a) and sb.shares_storage(b)
    assert (a + b[0, :3]).grad_fn.saved_tensor_list() == []      # add saves nothing
    assert a.T.grad_fn.saved_tensor_list() == []                  # views save nothing
    lg = a.log()
    (saved,) = lg.grad_fn.saved_tensor_list()
    assert saved.shares_storage(a)                               # log saves its input
    assert lg.grad_fn.saved_bytes() == 6 * 8


def test_matmul_saves_only_what_the_other_grad_needs():
    a = leaf(np.ones((2, 3)))
    b = ta.ones(3, 4, dtype=ta.float64)
    m = a @ b  # only a needs a grad, and ga = g @ b^T needs b only
    (saved,) = m.grad_fn.saved_tensor_list()
    assert saved.shares_storage(b)


# ----------------------------------------------------------------------------- hooks
def test_hook_on_leaf_can_replace_grad_and_be_removed():
    x = leaf([1.0, 2.0])
    seen = []

    def double(g):
        seen.append(g.numpy().copy())
        return g * 2.0

    handle = x.register_hook(double)
    (x * x).sum().backward()
    np.testing.assert_allclose(seen[0], [2.0, 4.0])
    np.testing.assert_allclose(host(x.grad), [4.0, 8.0])
    handle.remove()
    x.grad = None
    (x * x).sum().backward()
    np.testing.assert_allclose(host(x.grad), [2.0, 4.0])
    assert len(seen) == 1


def test_hook_on_non_leaf_replaces_grad_flowing_on():
    x = leaf([1.0, 2.0])
    h = x * 3.0
    seen = []

    def hook(g):
        seen.append(g.numpy().copy())
        return g * 10.0

    handle = h.register_hook(hook)
    (h * h).sum().backward(retain_graph=True)
    np.testing.assert_allclose(seen[0], 2 * 3.0 * np.array([1.0, 2.0]))  # d/dh = 2h
    np.testing.assert_allclose(host(x.grad), 10 * 3.0 * 2 * 3.0 * np.array([1.0, 2.0]))
    assert h.grad is None  # a hook does not retain the grad
    handle.remove()
    x.grad = None
    h2 = h * h
    h2.sum().backward()
    np.testing.assert_allclose(host(x.grad), 3.0 * 2 * 3.0 * np.array([1.0, 2.0]))


def test_hook_returning_none_keeps_grad():
    x = leaf([1.0, 2.0])
    seen = []
    x.register_hook(lambda g: seen.append(g.numpy().copy()))
    (x * 5.0).sum().backward()
    np.testing.assert_allclose(host(x.grad), [5.0, 5.0])
    np.testing.assert_allclose(seen[0], [5.0, 5.0])


def test_retain_grad_sees_grad_after_hooks():
    # as in PyTorch, the retained .grad is the gradient after every hook has run, whatever
    # the order the hook and retain_grad() were registered in
    for hook_first in (False, True):
        x = leaf([1.0, 2.0])
        h = x * 3.0
        if hook_first:
            h.register_hook(lambda g: g * 10.0)
            h.retain_grad()
        else:
            h.retain_grad()
            h.register_hook(lambda g: g * 10.0)
        (h * h).sum().backward()
        np.testing.assert_allclose(host(x.grad), [180.0, 360.0])
        np.testing.assert_allclose(host(h.grad), [60.0, 120.0], err_msg=f"{hook_first=}")


def test_hook_runs_once_with_summed_grad():
    x = leaf([0.5, -1.0])
    h = x * 2.0
    calls = []
    h.register_hook(lambda g: calls.append(g.numpy().copy()))
    long_branch = ((h * 3.0).tanh() * 2.0).exp()
    (h.exp() + long_branch + h).sum().backward()
    hv = np.array([1.0, -2.0])
    lb = np.exp(2 * np.tanh(3 * hv))
    expected = np.exp(hv) + lb * 2 * (1 - np.tanh(3 * hv) ** 2) * 3 + 1
    assert len(calls) == 1
    np.testing.assert_allclose(calls[0], expected)
    np.testing.assert_allclose(host(x.grad), 2 * expected)


def test_register_hook_without_grad_raises():
    with pytest.raises(RuntimeError, match="doesn't require grad"):
        ta.tensor([1.0]).register_hook(lambda g: g)


def test_retain_grad():
    x = leaf([1.0, 2.0])
    h = x * 3.0
    u = x * 4.0
    h.retain_grad()
    (h * h + u).sum().backward()
    np.testing.assert_allclose(host(h.grad), 2 * 3.0 * np.array([1.0, 2.0]))
    assert u.grad is None  # non-leaf grads are not kept unless asked for
    np.testing.assert_allclose(host(x.grad), 18.0 * np.array([1.0, 2.0]) + 4.0)


# ----------------------------------------------------------------------------- autograd.grad
def test_autograd_grad_returns_without_touching_grad():
    x = leaf([1.0, 2.0, 3.0])
    w = leaf([0.5, -1.0, 2.0])
    y = x * w
    gy = ta.tensor([1.0, 10.0, 100.0], dtype=ta.float64)
    gx, gw = ta.autograd.grad(y, [x, w], gy)
    np.testing.assert_allclose(gx.numpy(), [0.5, -10.0, 200.0])
    np.testing.assert_allclose(gw.numpy(), [1.0, 20.0, 300.0])
    assert x.grad is None and w.grad is None


def test_autograd_grad_of_non_leaf():
    x = leaf([1.0, 2.0])
    h = x * 3.0
    (gh,) = ta.autograd.grad((h * h).sum(), [h])
    np.testing.assert_allclose(gh.numpy(), [6.0, 12.0])
    assert x.grad is None and h.grad is None


def test_autograd_grad_runs_leaf_hooks():
    # hooks on non-leaves change what autograd.grad returns; hooks on leaves must as well
    # (as in PyTorch), and still without touching .grad
    x = leaf([1.0, 2.0])
    x.register_hook(lambda g: g * 10.0)
    (gx,) = ta.autograd.grad((x * x).sum(), [x])
    np.testing.assert_allclose(gx.numpy(), [20.0, 40.0])
    assert x.grad is None


def test_autograd_grad_unused_input():
    x = leaf([1.0, 2.0])
    z = leaf([3.0])
    with pytest.raises(RuntimeError, match=r"grad: input 1 of shape \(1,\).*allow_unused"):
        ta.autograd.grad((x * x).sum(), [x, z], retain_graph=True)
    gx, gz = ta.autograd.grad((x * x).sum(), [x, z], allow_unused=True)
    np.testing.assert_allclose(gx.numpy(), [2.0, 4.0])
    assert gz is None


# ----------------------------------------------------------------------------- in place
def test_inplace_on_saved_tensor_raises_at_backward():
    x = leaf([1.0, 2.0])
    y = x.exp()
    y.add_(1.0)
    z = y.sum()
    with pytest.raises(RuntimeError, match=r"ExpBackward.*in-place.*version 1; expected version 0"):
        z.backward()


def test_inplace_on_saved_input_raises_at_backward():
    x = leaf([1.0, 2.0])
    h = x * 2.0
    y = h.log()
    h.mul_(3.0)
    with pytest.raises(RuntimeError, match=r"LogBackward.*modified by an in-place"):
        y.sum().backward()


def test_inplace_on_unsaved_tensor_is_fine_and_rebases_history():
    x = leaf([1.0, 2.0])
    y = x * 2.0   # Mul by a scalar saves nothing
    y.add_(1.0)
    y.mul_(3.0)   # y = 3 * (2x + 1)
    assert y.grad_fn.name == "MulInplaceBackward"
    y.sum().backward()
    np.testing.assert_allclose(host(x.grad), [6.0, 6.0])
    np.testing.assert_allclose(host(y), [9.0, 15.0])


def test_inplace_on_leaf_requiring_grad_raises():
    x = leaf([1.0, 2.0])
    with pytest.raises(RuntimeError, match=r"add_: a leaf tensor that requires grad"):
        x.add_(1.0)
    with pytest.raises(RuntimeError, match=r"setitem: a leaf tensor that requires grad"):
        x[0] = 5.0
    np.testing.assert_allclose(host(x), [1.0, 2.0])
    assert x._version == 0


def test_inplace_bumps_version_shared_by_views():
    x = ta.zeros(3, 4)
    v = x[0]
    t = x.T
    assert x._version == v._version == t._version == 0
    x.add_(1.0)
    assert x._version == v._version == t._version == 1
    v.mul_(2.0)
    assert x._version == v._version == t._version == 2
    x[2] = 7.0
    assert t._version == 3
    np.testing.assert_array_equal(x.numpy(), [[2.0] * 4, [1.0] * 4, [7.0] * 4])
    d = x.detach()
    d.zero_()
    assert x._version == 4 and x.numpy().sum() == 0


def test_inplace_under_no_grad_on_leaf_is_allowed():
    w = leaf([1.0, 2.0])
    (w * w).sum().backward()
    with ta.no_grad():
        w.sub_(w.grad * 0.5)
    np.testing.assert_allclose(host(w), [0.0, 0.0])
    assert w.is_leaf and w.requires_grad and w.grad_fn is None
    assert w._version == 1
    w.grad = None
    (w + 1.0).sum().backward()  # still usable as a leaf afterwards
    np.testing.assert_allclose(host(w.grad), [1.0, 1.0])


def test_view_of_leaf_survives_optimizer_step():
    # a view of a parameter taken before an in-place update under no_grad still works after
    # it: a leaf has no history that the update could have made stale (as in PyTorch)
    w = leaf([1.0, 2.0, 3.0])
    head = w[:2]
    with ta.no_grad():
        w.sub_(1.0)
    np.testing.assert_allclose(host(head), [0.0, 1.0])
    (head * head).sum().backward()
    np.testing.assert_allclose(host(w.grad), [0.0, 2.0, 0.0])


# ----------------------------------------------------------------------------- custom Function
class Cube(ta.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3.0 * x * x


class WrongCube(Cube):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2.0 * x * x  # wrong: should be 3 x^2


def test_custom_function():
    x = leaf([1.0, -2.0, 0.5])
    y = Cube.apply(x)
    assert y.grad_fn.name == "CubeBackward"
    assert y.requires_grad
    (saved,) = y.grad_fn.saved_tensor_list()
    assert saved is x
    np.testing.assert_allclose(host(y), [1.0, -8.0, 0.125])
    y.sum().backward()
    np.testing.assert_allclose(host(x.grad), [3.0, 12.0, 0.75])
    assert ta.gradcheck(Cube.apply, [leaf(np.linspace(-1.5, 2.0, 6).reshape(2, 3))])


def test_custom_function_under_no_grad_records_nothing():
    x = leaf([2.0])
    with ta.no_grad():
        y = Cube.apply(x)
    assert y.grad_fn is None and not y.requires_grad
    np.testing.assert_allclose(y.numpy(), [8.0])


def test_gradcheck_reports_wrong_backward():
    x = leaf([1.0, 2.0])
    with pytest.raises(ta.GradcheckError) as info:
        ta.gradcheck(WrongCube.apply, [x])
    msg = str(info.value)
    assert "2 of 4 Jacobian entries differ" in msg
    assert "d out[0] / d in[0]: analytical +2, numerical +3" in msg
    assert "d out[1] / d in[1]: analytical +8, numerical +12" in msg


# ----------------------------------------------------------------------------- topology
def test_diamond_graph():
    vals = [0.3, -1.2, 2.0]
    x = leaf(vals)
    h = x * 2.0
    a = h.exp()             # branch 1
    b = h.tanh() * x        # branch 2 (also uses x directly)
    (a * b + a).sum().backward()
    # d/dx [e^2x tanh(2x) x + e^2x], by hand (PyTorch gives the same to 1e-13)
    xv = np.array(vals)
    e, t = np.exp(2 * xv), np.tanh(2 * xv)
    expected = 2 * e * t * xv + e * (2 * (1 - t**2) * xv + t) + 2 * e
    np.testing.assert_allclose(host(x.grad), expected, rtol=1e-12)


def test_fan_out_gradients_sum():
    x = leaf([1.0, 2.0, -3.0])
    y = (x * x + x + x.exp() * x).sum()
    y.backward()
    xv = np.array([1.0, 2.0, -3.0])
    np.testing.assert_allclose(host(x.grad), 2 * xv + 1 + np.exp(xv) * (xv + 1))


def test_fan_out_of_non_leaf_gradients_sum():
    x = leaf([1.0, 2.0])
    h = x * 2.0
    (h + h + h * h).sum().backward()
    xv = np.array([1.0, 2.0])
    np.testing.assert_allclose(host(x.grad), 2 * (2 + 2 * (2 * xv)))


class TwiceSum(ta.autograd.Function):
    """y = 2 (a + b); backward hands the SAME fresh tensor to both inputs."""

    @staticmethod
    def forward(ctx, a, b):
        return (a + b) * 2.0

    @staticmethod
    def backward(ctx, g):
        g2 = g * 2.0
        return g2, g2


def test_same_gradient_tensor_for_two_inputs_is_not_aliased():
    # a's node gets this gradient first and a second one later (from a * 5, created
    # earlier, so processed later); summing into it must not change b's pending gradient
    vals = [1.0, 2.0]
    x = leaf(vals)
    a, b = x.exp(), x.tanh()
    ((a * 5.0) + TwiceSum.apply(a, b)).sum().backward()
    xv = np.array(vals)  # d/dx [5 e^x + 2 (e^x + tanh x)]
    np.testing.assert_allclose(host(x.grad), 7 * np.exp(xv) + 2 * (1 - np.tanh(xv) ** 2),
                               rtol=1e-12)


def test_same_gradient_tensor_for_leaf_and_node():
    x = leaf([1.0, 2.0])
    b = x.tanh()
    y = (x * 3.0 + TwiceSum.apply(x, b)).sum()
    y.backward()
    xv = np.array([1.0, 2.0])
    np.testing.assert_allclose(host(x.grad), 3.0 + 2.0 + 2.0 * (1 - np.tanh(xv) ** 2))


def test_slice_grads_on_a_leaf():
    x = leaf([1.0, 2.0, 3.0, 4.0])
    (x[0:2].sum() + x[1:3].sum()).backward()
    np.testing.assert_array_equal(host(x.grad), [1.0, 2.0, 1.0, 0.0])
    x.grad = None
    (x[0:2] * 3.0).sum().backward()  # one slice alone: zeros where it doesn't read
    np.testing.assert_array_equal(host(x.grad), [3.0, 3.0, 0.0, 0.0])


def test_slice_grads_2d_leaf_with_steps():
    x = leaf(np.arange(12.0).reshape(3, 4))
    (x[:, ::2].sum() + 2.0 * x[1].sum() + (x[..., 1:] * x[..., 1:]).sum()).backward()
    xv = np.arange(12.0).reshape(3, 4)
    expected = np.zeros((3, 4))
    expected[:, ::2] += 1
    expected[1] += 2
    expected[:, 1:] += 2 * xv[:, 1:]
    np.testing.assert_allclose(host(x.grad), expected)


def test_backward_with_explicit_gradient():
    x = leaf([1.0, 2.0])
    y = x * x
    y.backward(ta.tensor([1.0, -1.0], dtype=ta.float64))
    np.testing.assert_allclose(host(x.grad), [2.0, -4.0])


def test_grad_dtype_matches_leaf():
    x = ta.tensor([1.0, 2.0], requires_grad=True)
    (x * 2.0).sum().backward()
    assert x.grad.dtype is ta.float32
    assert not x.grad.requires_grad and x.grad.grad_fn is None
    assert not x.grad.shares_storage(x)


ON_DEVICE = [
    test_grad_accumulates_over_two_backward_calls,
    test_retain_graph_allows_second_backward,
    test_second_backward_without_retain_graph_raises,
    test_saved_tensors_freed_after_backward,
    test_detach_shares_storage,
    test_requires_grad_false_on_non_leaf_raises,
    test_grad_fn_names_and_next_functions,
    test_saved_tensor_list_shows_what_was_saved,
    test_retain_grad_sees_grad_after_hooks,
    test_retain_grad,
    test_inplace_on_saved_tensor_raises_at_backward,
    test_inplace_on_saved_input_raises_at_backward,
    test_inplace_on_unsaved_tensor_is_fine_and_rebases_history,
    test_inplace_on_leaf_requiring_grad_raises,
    test_inplace_under_no_grad_on_leaf_is_allowed,
    test_view_of_leaf_survives_optimizer_step,
    test_custom_function,
    test_gradcheck_reports_wrong_backward,
    test_fan_out_gradients_sum,
    test_fan_out_of_non_leaf_gradients_sum,
    test_same_gradient_tensor_for_leaf_and_node,
    test_slice_grads_on_a_leaf,
    test_slice_grads_2d_leaf_with_steps,
]


@pytest.mark.parametrize("test", ON_DEVICE, ids=[t.__name__[5:] for t in ON_DEVICE])
def test_engine_on_device(gpu_device, test, monkeypatch):
    """The engine tests above whose tensors come from leaf(), with them on the GPU."""
    monkeypatch.setitem(DEVICE, "name", gpu_device)
    test()


# ----------------------------------------------------------------------------- backward twice
# A node that saved nothing has nothing a first backward could free: torch runs a second
# backward through it; one that saved something refuses (retain_graph=True is the way).
_TWICE = {
    "add": (lambda m, x: (x + 1).sum(), True),
    "sub-mean": (lambda m, x: (x - 1).mean(), True),
    "view": (lambda m, x: x.reshape(6).sum(), True),
    "exp": (lambda m, x: x.exp().sum(), False),
    "mul-tensor": (lambda m, x: (x * m.ones_like(x)).sum(), False),
}


@pytest.mark.parametrize("name", list(_TWICE))
def test_backward_twice_only_where_nothing_was_saved(name):
    torch = pytest.importorskip("torch")
    fn, allowed = _TWICE[name]
    data = np.arange(6.0).reshape(3, 2) / 4

    def run(m, x):
        y = fn(m, x)
        y.backward()
        try:
            y.backward()
        except RuntimeError as e:
            return None, str(e)
        return x.grad, ""

    ours, our_error = run(ta, ta.tensor(data, requires_grad=True))
    theirs, their_error = run(torch, torch.tensor(data, requires_grad=True))
    assert (ours is not None) == (theirs is not None) == allowed
    if allowed:
        np.testing.assert_allclose(host(ours), theirs.numpy(), rtol=0, atol=1e-15)
    else:
        assert "second time" in our_error and "retain_graph=True" in our_error
        assert "second time" in their_error


def test_backward_twice_through_add_doubles_the_leaf_grad():
    x = leaf([1.0, 2.0, 3.0])
    y = (x + 1).sum()
    y.backward()
    y.backward()
    np.testing.assert_array_equal(host(x.grad), [2.0, 2.0, 2.0])
    assert y.grad_fn._saved == ()  # nothing was saved, so nothing was released


# ----------------------------------------------------------------------------- no_grad views
def _no_grad_view_cases(m):
    """name -> a function doing the case with module m (ta or torch); each returns the
    tensor the in-place op wrote into (or raises)."""
    def leaf_view():
        a = m.ones(4, requires_grad=True)
        with m.no_grad():
            v = a[:2]
        return v.add_(1.0)

    def nonleaf_view():
        b = m.ones(4, requires_grad=True) * 2
        with m.no_grad():
            v = b[1:3]
        return v.mul_(2.0)

    def view_of_view():  # the second view is taken with grad mode on
        a = m.ones(4, requires_grad=True)
        with m.no_grad():
            v = a[:3]
        return v[:2].add_(1.0)

    def view_of_view_in_no_grad():
        a = m.ones(2, 3, requires_grad=True)
        with m.no_grad():
            w = a.reshape(6)[:4]
        return w.zero_()

    def setitem_into_view():
        a = m.ones(4, requires_grad=True)
        with m.no_grad():
            v = a[:2]
        v[0] = 5.0
        return v

    def other_operand_requires_grad():
        a = m.ones(4, requires_grad=True)
        with m.no_grad():
            v = a[:2]
        return v.add_(m.ones(2, requires_grad=True))

    def split_piece():
        a = m.ones(4, requires_grad=True)
        with m.no_grad():
            v = a.split(2)[1]
        return v.fill_(3.0)

    def inplace_under_no_grad():  # allowed: both in no_grad
        a = m.ones(4, requires_grad=True)
        with m.no_grad():
            v = a[:2]
        with m.no_grad():
            v.add_(1.0)
        return a

    def base_without_grad():  # allowed: nothing requires grad
        a = m.ones(4)
        with m.no_grad():
            v = a[:2]
        return v.add_(1.0)

    def view_of_detached():  # allowed: detach() is not a no_grad view
        a = m.ones(4, requires_grad=True)
        return a.detach()[:2].add_(1.0)

    return {f.__name__: f for f in (leaf_view, nonleaf_view, view_of_view,
                                     view_of_view_in_no_grad, setitem_into_view,
                                     other_operand_requires_grad, split_piece,
                                     inplace_under_no_grad, base_without_grad,
                                     view_of_detached)}


_NO_GRAD_VIEW_ALLOWED = {"inplace_under_no_grad", "base_without_grad", "view_of_detached"}


@pytest.mark.parametrize("name", list(_no_grad_view_cases(ta)))
def test_inplace_into_a_view_made_under_no_grad_as_torch(name):
    torch = pytest.importorskip("torch")
    ours_fn, theirs_fn = _no_grad_view_cases(ta)[name], _no_grad_view_cases(torch)[name]
    if name in _NO_GRAD_VIEW_ALLOWED:
        ours, theirs = ours_fn(), theirs_fn()
        np.testing.assert_array_equal(host(ours), theirs.detach().numpy())
        return
    with pytest.raises(RuntimeError, match="no_grad"):
        theirs_fn()
    with pytest.raises(RuntimeError, match=r"view \(shape .*\) was created in no_grad mode"):
        ours_fn()


def test_refused_inplace_into_a_no_grad_view_leaves_the_leaf_unchanged():
    a = leaf([1.0, 2.0, 3.0, 4.0])
    with ta.no_grad():
        v = a[1:3]
    with pytest.raises(RuntimeError, match="add_: a view"):
        v.add_(10.0)
    np.testing.assert_array_equal(host(a), [1.0, 2.0, 3.0, 4.0])
    assert not v.requires_grad and a.grad_fn is None


def test_custom_mark_dirty_on_a_no_grad_view_is_refused():
    class AddOne(ta.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x._array()[...] += 1
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    a = leaf([1.0, 2.0])
    with ta.no_grad():
        v = a[:1]
    with pytest.raises(RuntimeError, match="AddOne: a view"):
        AddOne.apply(v)
    with ta.no_grad():
        AddOne.apply(v)  # under no_grad the write is allowed
    np.testing.assert_array_equal(host(a), [3.0, 2.0])  # the refused write happened too
