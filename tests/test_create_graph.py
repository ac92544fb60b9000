"""create_graph=True: gradients with a graph, torch's argument semantics, and derivatives of
order two and three against torch (float64)."""

from __future__ import annotations

import numpy as np
import pytest

import tinygrad_attn as ta

F64 = ta.float64


def _pair(shape, seed=0, positive=False):
    """The same float64 leaf in both frameworks."""
    torch = pytest.importorskip("torch")
    a = np.random.default_rng(seed).standard_normal(shape)
    if positive:
        a = np.abs(a) + 0.5
    return (ta.tensor(a, dtype=F64, requires_grad=True),
            torch.tensor(a, dtype=torch.float64, requires_grad=True))


def _close(ours, theirs, tol=1e-10):
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=tol,
                               atol=tol)


# ----------------------------------------------------------------------------- d2/dx2 tanh
def test_second_derivative_of_tanh_by_hand():
    x = ta.tensor([-2.0, -0.5, 0.0, 0.7, 3.0], dtype=F64, requires_grad=True)
    (g,) = ta.autograd.grad(x.tanh().sum(), x, create_graph=True)
    (h,) = ta.autograd.grad(g.sum(), x)
    t = np.tanh(x.detach().numpy())
    np.testing.assert_allclose(g.detach().numpy(), 1 - t * t, rtol=1e-14)
    np.testing.assert_allclose(h.numpy(), -2 * t * (1 - t * t), rtol=1e-12, atol=1e-15)
    assert g.grad_fn is not None and h.grad_fn is None  # the second grad was not asked a graph


def _nth(fn, x, n):
    """The n-th derivative of fn at x, contracted at each order with a fixed random
    cotangent (a sum along ones can hide a missing term: the rows of a softmax or a
    layer_norm sum to constants)."""
    rng = np.random.default_rng(10)
    y = fn(x)
    for k in range(n):
        v = _like(x, rng.standard_normal(tuple(y.shape)))
        (y,) = _grad_any(y, x, v, create_graph=k < n - 1)
    return y


def _like(x, a):
    if isinstance(x, ta.Tensor):
        return ta.tensor(a, dtype=F64)
    import torch

    return torch.tensor(a, dtype=torch.float64)


def _grad_any(y, x, v, create_graph):
    if isinstance(x, ta.Tensor):
        return ta.autograd.grad(y, x, v, create_graph=create_graph)
    import torch

    return torch.autograd.grad(y, x, v, create_graph=create_graph)


THIRD_ORDER = {
    "tanh": (lambda x: x.tanh(), lambda x: x.tanh()),
    "softmax": (lambda x: x.softmax(-1), lambda x: x.softmax(-1)),
    "gelu": (lambda x: ta.nn.functional.gelu(x),
             lambda x: __import__("torch").nn.functional.gelu(x)),
    "bias_gelu": (lambda x: ta.nn.functional.bias_gelu(x, _bias(x)),
                  lambda x: __import__("torch").nn.functional.gelu(x + _bias(x))),
    # torch's fused layer_norm has a wrong third derivative in 2.13 (0.34 off at this point;
    # finite differences of its second derivative agree with the composed formula to
    # 1e-10): the reference is torch's composition of the same function
    "layer_norm": (lambda x: ta.nn.functional.layer_norm(x, (4,)),
                   lambda x: (x - x.mean(-1, keepdim=True))
                   / (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()),
}


def _bias(x):
    return _like(x, np.linspace(-0.5, 0.5, 4))


def test_torchs_fused_layer_norm_third_derivative_is_the_one_that_differs():
    """Why the layer_norm row above composes torch's formula: torch's fused op and the
    composition agree at order 2 and differ at order 3, where finite differences side with
    the composition (and so with ours)."""
    torch = pytest.importorskip("torch")
    fused = lambda x: torch.nn.functional.layer_norm(x, (4,))  # noqa: E731
    composed = THIRD_ORDER["layer_norm"][1]
    a = torch.tensor(np.random.default_rng(3).standard_normal((3, 4)))
    second = [_nth(f, a.clone().requires_grad_(), 2) for f in (fused, composed)]
    third = [_nth(f, a.clone().requires_grad_(), 3) for f in (fused, composed)]
    _close(second[0], second[1], tol=1e-12)
    assert float((third[0] - third[1]).abs().max()) > 1e-3

    def second_along(arr):  # the second derivative, contracted with the third cotangent
        x = torch.tensor(arr, requires_grad=True)
        rng = np.random.default_rng(10)
        y = composed(x)
        for k in range(2):
            v = torch.tensor(rng.standard_normal(tuple(y.shape)))
            (y,) = torch.autograd.grad(y, x, v, create_graph=k < 1)
        return y.numpy()

    w = np.random.default_rng(10)
    for _ in range(2):
        w.standard_normal((3, 4))
    w3 = w.standard_normal((3, 4))
    eps, num = 1e-6, np.zeros((3, 4))
    for i in np.ndindex(3, 4):
        plus, minus = a.numpy().copy(), a.numpy().copy()
        plus[i] += eps
        minus[i] -= eps
        num[i] = ((second_along(plus) - second_along(minus)) / (2 * eps) * w3).sum()
    np.testing.assert_allclose(third[1].detach().numpy(), num, atol=1e-7)


@pytest.mark.parametrize("order", [2, 3])
@pytest.mark.parametrize("op", list(THIRD_ORDER))
def test_higher_order_matches_torch(op, order):
    ours_fn, theirs_fn = THIRD_ORDER[op]
    x, tx = _pair((3, 4), seed=order)
    _close(_nth(ours_fn, x, order), _nth(theirs_fn, tx, order), tol=1e-9)


# ----------------------------------------------------------------------------- semantics
def test_backward_create_graph_gives_grad_a_graph_and_retains():
    x, tx = _pair((5,), seed=1)
    (x ** 3).sum().backward(create_graph=True)
    (tx ** 3).sum().backward(create_graph=True)
    assert x.grad.grad_fn is not None and x.grad.requires_grad
    _close(x.grad, tx.grad)
    # differentiating .grad accumulates into .grad, as torch does
    gx = x.grad
    gx.sum().backward()
    tgx = tx.grad
    tgx.sum().backward()
    _close(x.grad, tx.grad)


def test_retain_graph_defaults_to_create_graph():
    x = ta.tensor([0.5, 1.5], dtype=F64, requires_grad=True)
    y = (x.exp() * x).sum()
    ta.autograd.grad(y, x, create_graph=True)
    (again,) = ta.autograd.grad(y, x)  # the graph was retained
    np.testing.assert_allclose(again.numpy(), np.exp([0.5, 1.5]) * (1 + np.array([0.5, 1.5])))
    with pytest.raises(RuntimeError, match="second time"):
        ta.autograd.grad(y, x)
    z = (x.exp() * x).sum()
    ta.autograd.grad(z, x, create_graph=True, retain_graph=False)
    with pytest.raises(RuntimeError, match="second time"):
        ta.autograd.grad(z, x)


def test_gradient_without_create_graph_has_no_graph():
    x = ta.tensor([0.5, 1.5], dtype=F64, requires_grad=True)
    (g,) = ta.autograd.grad((x * x).sum(), x)
    assert g.grad_fn is None and not g.requires_grad


def test_allow_unused_and_materialize_grads():
    torch = pytest.importorskip("torch")
    x, tx = _pair((3,), seed=2)
    u, tu = _pair((2,), seed=3)
    with pytest.raises(RuntimeError, match="not used"):
        ta.autograd.grad((x * 2).sum(), [x, u])
    with pytest.raises(RuntimeError):
        torch.autograd.grad((tx * 2).sum(), [tx, tu])
    gx, gu = ta.autograd.grad((x * 2).sum(), [x, u], allow_unused=True)
    assert gu is None
    gx, gu = ta.autograd.grad((x * 2).sum(), [x, u], materialize_grads=True)
    tgx, tgu = torch.autograd.grad((tx * 2).sum(), [tx, tu], materialize_grads=True)
    _close(gu, tgu)
    assert tuple(gu.shape) == (2,)
    with pytest.raises(ValueError):
        ta.autograd.grad((x * 2).sum(), [x, u], allow_unused=False, materialize_grads=True)
    with pytest.raises(ValueError):
        torch.autograd.grad((tx * 2).sum(), [tx, tu], allow_unused=False,
                            materialize_grads=True)


def test_is_grads_batched_stacks_one_vjp_per_vector():
    torch = pytest.importorskip("torch")
    x, tx = _pair((3,), seed=4)
    v = np.eye(3)
    (jac,) = ta.autograd.grad(x.sin() * x, x, ta.tensor(v, dtype=F64), is_grads_batched=True)
    (tjac,) = torch.autograd.grad(tx.sin() * tx, tx, torch.tensor(v), is_grads_batched=True)
    assert tuple(jac.shape) == (3, 3)
    _close(jac, tjac)


def test_backward_inputs_accumulates_only_there():
    x, tx = _pair((3,), seed=5)
    w, tw = _pair((3,), seed=6)
    (x * w).sum().backward(inputs=[w])
    (tx * tw).sum().backward(inputs=[tw])
    assert x.grad is None and tx.grad is None
    _close(w.grad, tw.grad)
    with pytest.raises(RuntimeError, match="cannot be empty"):
        (x * w).sum().backward(inputs=[])


def test_grad_outputs_that_require_grad_are_differentiated():
    """The double-vjp trick: the vjp is linear in its cotangent, and its derivative with
    respect to the cotangent is the Jacobian-vector product."""
    torch = pytest.importorskip("torch")
    x, tx = _pair((4,), seed=7)
    u = ta.zeros(4, dtype=F64, requires_grad=True)
    tu = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    (g,) = ta.autograd.grad(x.exp() * x, x, u, create_graph=True)
    (tg,) = torch.autograd.grad(tx.exp() * tx, tx, tu, create_graph=True)
    v = np.linspace(1, 2, 4)
    (jvp,) = ta.autograd.grad(g, u, ta.tensor(v, dtype=F64))
    (tjvp,) = torch.autograd.grad(tg, tu, torch.tensor(v))
    _close(jvp, tjvp)


def test_hessian_vector_product_of_an_mlp_loss():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    w1, b1, w2 = rng.standard_normal((4, 3)), rng.standard_normal(4), rng.standard_normal((1, 4))
    xs = rng.standard_normal((5, 3))
    vec = rng.standard_normal((4, 3))

    def loss(lib, W1, xs_):
        h = lib.tanh(xs_ @ W1.T + lib.tensor(b1))
        return ((h @ lib.tensor(w2).T) ** 2).mean()

    W1 = ta.tensor(w1, dtype=F64, requires_grad=True)
    tW1 = torch.tensor(w1, requires_grad=True)
    (g,) = ta.autograd.grad(loss(ta, W1, ta.tensor(xs)), W1, create_graph=True)
    (tg,) = torch.autograd.grad(loss(torch, tW1, torch.tensor(xs)), tW1, create_graph=True)
    (hv,) = ta.autograd.grad((g * ta.tensor(vec)).sum(), W1)
    (thv,) = torch.autograd.grad((tg * torch.tensor(vec)).sum(), tW1)
    _close(g, tg)
    _close(hv, thv)


def test_hooks_see_plain_tensors_and_may_replace_in_a_recorded_backward():
    x = ta.tensor([0.3, 0.6], dtype=F64, requires_grad=True)
    y = x * x
    seen = []
    y.register_hook(lambda g: seen.append(type(g)) or g * 2)
    (g,) = ta.autograd.grad(y.sum(), x, create_graph=True)
    assert seen == [ta.Tensor]
    np.testing.assert_allclose(g.detach().numpy(), 4 * np.array([0.3, 0.6]))
    (h,) = ta.autograd.grad(g.sum(), x)
    np.testing.assert_allclose(h.numpy(), [4.0, 4.0])


def test_custom_function_backward_in_tensor_ops_is_differentiable():
    class Cube(ta.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 3 * x * x

    x = ta.tensor([0.5, -1.0, 2.0], dtype=F64, requires_grad=True)
    (g,) = ta.autograd.grad(Cube.apply(x).sum(), x, create_graph=True)
    (h,) = ta.autograd.grad(g.sum(), x)
    np.testing.assert_allclose(h.numpy(), 6 * np.array([0.5, -1.0, 2.0]))


def test_a_backward_with_no_recorded_meaning_raises_naming_the_op():
    class Opaque(ta.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            arr = np.asarray(g._array())  # leaves the NumPy API: the graph would be lost
            return ta.tensor(arr * 2)

    x = ta.tensor([1.0, 2.0], dtype=F64, requires_grad=True)
    with pytest.raises(RuntimeError, match="OpaqueBackward.*create_graph"):
        ta.autograd.grad(Opaque.apply(x).sum(), x, create_graph=True)
    (g,) = ta.autograd.grad(Opaque.apply(x).sum(), x)  # first order is unaffected
    np.testing.assert_allclose(g.numpy(), [2.0, 2.0])


def test_gradgradcheck_catches_a_wrong_second_derivative():
    class WrongSecond(ta.autograd.Function):
        """y = x^3 with a backward whose own derivative is wrong (it hides x behind a
        detached copy: right values, no graph through x)."""

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 3 * (x * x).detach()

    x = ta.tensor([0.5, -1.0], dtype=F64, requires_grad=True)
    assert ta.gradcheck(WrongSecond.apply, (x,))
    with pytest.raises(ta.GradcheckError):
        ta.gradgradcheck(WrongSecond.apply, (x,))
    assert ta.gradgradcheck(WrongSecond.apply, (x,), raise_exception=False) is False
    assert ta.gradgradcheck(lambda x: x * x * x, (x,))


def test_gradgradcheck_takes_grad_outputs_like_torch():
    x = ta.tensor([[0.5, -1.0], [2.0, 0.1]], dtype=F64, requires_grad=True)
    go = ta.tensor([[1.0, 2.0], [0.5, -1.0]], dtype=F64, requires_grad=True)
    assert ta.gradgradcheck(lambda x: (x.sin() * x), (x,), (go,))
    assert ta.gradgradcheck(lambda x: (x.sin() * x), (x,), gen_non_contig_grad_outputs=True)


def test_grad_runs_only_the_nodes_that_lead_to_its_inputs():
    """As torch: autograd.grad(out, x) neither runs nor frees the part of the graph that
    does not lead to x, so a later backward through it still works."""
    x = ta.tensor([1.0, 2.0], dtype=F64, requires_grad=True)
    w = ta.tensor([0.5, -0.5], dtype=F64, requires_grad=True)
    h = w.exp()
    (g,) = ta.autograd.grad((x * h).sum(), x)
    np.testing.assert_allclose(g.numpy(), np.exp([0.5, -0.5]))
    assert w.grad is None
    h.sum().backward()  # ExpBackward was not freed by the grad call
    np.testing.assert_allclose(w.grad.numpy(), np.exp([0.5, -0.5]))


@pytest.mark.parametrize("op", ["relu", "relu6", "hardtanh", "leaky_relu"])
def test_a_piecewise_linear_gradient_still_has_a_graph(op):
    """As torch: the first gradient of a piecewise-linear op is constant in x, yet it
    requires grad, and differentiating it gives zeros, not "does not require grad"."""
    torch = pytest.importorskip("torch")
    x, tx = _pair((5,), seed=11)
    (g,) = ta.autograd.grad(getattr(ta.nn.functional, op)(x).sum(), x, create_graph=True)
    (tg,) = torch.autograd.grad(getattr(torch.nn.functional, op)(tx).sum(), tx,
                                create_graph=True)
    assert g.requires_grad and tg.requires_grad
    (h,) = ta.autograd.grad(g.sum(), x)
    (th,) = torch.autograd.grad(tg.sum(), tx)
    _close(h, th)
    assert not h.numpy().any()


def test_gradcheck_takes_torchs_keywords():
    x = ta.tensor([0.5, -1.0], dtype=F64, requires_grad=True)

    class Wrong(ta.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 3

    assert ta.gradcheck(lambda x: x.exp(), (x,), raise_exception=False, fast_mode=False)
    assert ta.gradcheck(Wrong.apply, (x,), raise_exception=False) is False
    with pytest.raises(ta.GradcheckError):
        ta.gradcheck(Wrong.apply, (x,))
    with pytest.raises(NotImplementedError):
        ta.gradcheck(lambda x: x.exp(), (x,), check_forward_ad=True)


def test_backward_takes_torchs_positional_order():
    """torch.autograd.backward(tensors, grad_tensors, retain_graph, create_graph,
    grad_variables, inputs)."""
    x = ta.tensor([1.0, 2.0], dtype=F64, requires_grad=True)
    w = ta.tensor([3.0, 4.0], dtype=F64, requires_grad=True)
    ta.autograd.backward([(x * w).sum()], None, None, False, None, [w])
    assert x.grad is None
    np.testing.assert_allclose(w.grad.numpy(), [1.0, 2.0])
