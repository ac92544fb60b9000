"""ta.func and ta.autograd.functional against torch.func and torch.autograd.functional: the
same functions of several inputs in both frameworks, float64, equal to 1e-10 in value and
nesting; nested transforms (grad of grad, hessians), a small MLP, functional_call with a
params dict, and a tiny GPT's loss."""

from __future__ import annotations

import numpy as np
import pytest

import nn
import tinygrad_attn as ta

ATOL = 1e-10
RNG = np.random.default_rng(0)


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def pair(torch, *shape, requires_grad=False):
    """The same float64 values as a ta tensor and a torch tensor."""
    arr = RNG.standard_normal(shape)
    return (ta.tensor(arr, requires_grad=requires_grad),
            torch.tensor(arr, requires_grad=requires_grad))


def check(ours, theirs, torch, lists_as_tuples=False):
    """Same nesting (tuples, lists, dicts), same shapes, values within ATOL. torch's
    vectorized forward-mode jacobian nests in lists where its other paths use tuples
    (lists_as_tuples); the engine's jacobian always answers in tuples."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, ta.Tensor), type(ours)
        assert tuple(ours.shape) == tuple(theirs.shape)
        np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=0,
                                   atol=ATOL)
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs)
        for k in theirs:
            check(ours[k], theirs[k], torch, lists_as_tuples)
    else:
        kind = tuple if lists_as_tuples and type(theirs) is list else type(theirs)
        assert type(ours) is kind, (type(ours), type(theirs))
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            check(a, b, torch, lists_as_tuples)


def f_sin_exp(lib):
    return lambda x, y: (x.sin() * y.exp()).sum()


def f_matmul(lib):
    return lambda x, y: (x @ y).tanh().sum()


def f_softmax(lib):
    return lambda x, y: (lib.softmax(x @ y, -1) * lib.softmax(x, 0).sum(-1, keepdim=True)).sum()


FUNCS = [f_sin_exp, f_matmul, f_softmax]
SHAPES = {f_sin_exp: ((3, 4), (3, 4)), f_matmul: ((3, 4), (4, 2)), f_softmax: ((3, 4), (4, 5))}


def inputs_for(torch, f):
    (x, tx), (y, ty) = (pair(torch, *s) for s in SHAPES[f])
    return (x, y), (tx, ty)


# ----------------------------------------------------------------------------- ta.func.grad
@pytest.mark.parametrize("f", FUNCS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("argnums", [0, 1, (0, 1), (1, 0), -1])
def test_grad_of_functions_of_two_inputs(torch, f, argnums):
    ours_in, theirs_in = inputs_for(torch, f)
    ours = ta.func.grad(f(ta), argnums=argnums)(*ours_in)
    theirs = torch.func.grad(f(torch), argnums=argnums)(*theirs_in)
    check(ours, theirs, torch)
    flat = ours if isinstance(ours, tuple) else (ours,)
    assert not any(g.requires_grad for g in flat)  # as torch's: no inputs required grad


@pytest.mark.parametrize("f", FUNCS, ids=lambda f: f.__name__)
def test_grad_and_value_with_aux(torch, f):
    ours_in, theirs_in = inputs_for(torch, f)

    def with_aux(lib):
        def g(x, y):
            out = f(lib)(x, y)
            return out, {"double": out * 2, "x": (x.exp(),)}
        return g

    ours = ta.func.grad_and_value(with_aux(ta), argnums=(0, 1), has_aux=True)(*ours_in)
    theirs = torch.func.grad_and_value(with_aux(torch), argnums=(0, 1),
                                       has_aux=True)(*theirs_in)
    check(ours, theirs, torch)
    grads, (value, aux) = ours
    assert not value.requires_grad and not aux["double"].requires_grad
    g_only, aux_only = ta.func.grad(with_aux(ta), has_aux=True)(*ours_in)
    check((g_only, aux_only), torch.func.grad(with_aux(torch), has_aux=True)(*theirs_in),
          torch)


def test_grad_of_pytree_arguments_and_kwargs(torch):
    (a, ta_), (b, tb), (c, tc) = pair(torch, 3), pair(torch, 2, 3), pair(torch, 3)

    def f(params, scale, *, shift):
        w, (bias,) = params["w"], params["rest"]
        return ((w @ scale).sin() + bias.sum() * shift).sum()

    ours = ta.func.grad(f)({"w": b, "rest": [c]}, a, shift=1.5)
    theirs = torch.func.grad(f)({"w": tb, "rest": [tc]}, ta_, shift=1.5)
    check(ours, theirs, torch)
    assert isinstance(ours["rest"], list)


def test_the_same_tensor_at_two_argnums_gets_a_gradient_each(torch):
    x, tx = pair(torch, 4)
    f = lambda a, b: (a * b.exp()).sum()  # noqa: E731
    check(ta.func.grad(f, argnums=(0, 1))(x, x), torch.func.grad(f, argnums=(0, 1))(tx, tx),
          torch)


def test_grad_of_a_function_that_ignores_its_input_is_zeros(torch):
    x, tx = pair(torch, 3)
    f = lambda lib: (lambda t: lib.ones(2, dtype=lib.float64).sum() + t.detach().sum())  # noqa: E731
    check(ta.func.grad(f(ta))(x), torch.func.grad(f(torch))(tx), torch)


# ----------------------------------------------------------------------------- nesting
def test_grad_of_grad_is_the_second_derivative_of_tanh():
    x0 = ta.tensor(0.3, dtype=ta.float64)
    d2 = ta.func.grad(ta.func.grad(lambda x: x.tanh()))(x0)
    t = np.tanh(0.3)
    assert abs(d2.item() - (-2 * t * (1 - t * t))) < ATOL
    xs = np.linspace(-2, 2, 7)
    d2s = ta.func.grad(lambda x: ta.func.grad(lambda u: u.tanh().sum())(x).sum())(ta.tensor(xs))
    t = np.tanh(xs)
    np.testing.assert_allclose(d2s.numpy(), -2 * t * (1 - t * t), rtol=0, atol=ATOL)
    assert not d2.requires_grad and not d2s.requires_grad


def test_third_derivative_and_mixed_partials_match_torch(torch):
    x, tx = pair(torch, 5)
    (y, ty) = pair(torch, 5)

    def third(lib, g):
        d1 = lambda a: g.func.grad(lambda u: (u.sin() * u.exp()).sum())(a).sum()  # noqa: E731
        d2 = lambda a: g.func.grad(d1)(a).sum()  # noqa: E731
        return g.func.grad(d2)

    check(third(ta, ta)(x), third(torch, torch)(tx), torch)

    def mixed(g):  # d/dy of (d/dx f(x, y)) . 1: the inner grad closes over the outer's y
        inner = lambda a, b: g.func.grad(lambda u: (u.sin() * b.exp() * u).sum())(a)  # noqa: E731
        return g.func.grad(lambda b: inner(x if g is ta else tx, b).sum())

    check(mixed(ta)(y), mixed(torch)(ty), torch)


def test_grad_closing_over_a_tensor_that_requires_grad_keeps_a_graph(torch):
    (x, tx), (w, tw) = pair(torch, 4), pair(torch, 4, requires_grad=True)
    g = ta.func.grad(lambda u: (u.sin() * w.exp()).sum())(x)
    tg = torch.func.grad(lambda u: (u.sin() * tw.exp()).sum())(tx)
    assert g.requires_grad and tg.requires_grad
    (g * g).sum().backward()
    (tg * tg).sum().backward()
    check(w.grad, tw.grad, torch)
    with ta.no_grad():
        plain = ta.func.grad(lambda u: (u.sin() * w.exp()).sum())(x)
    assert not plain.requires_grad
    check(plain, tg, torch)


def test_grad_of_an_input_that_requires_grad_is_differentiable(torch):
    x, tx = pair(torch, 4, requires_grad=True)
    g = ta.func.grad(lambda u: u.tanh().pow(3).sum())(x)
    tg = torch.func.grad(lambda u: u.tanh().pow(3).sum())(tx)
    assert g.requires_grad
    (h,) = ta.autograd.grad(g.sum(), x)
    (th,) = torch.autograd.grad(tg.sum(), tx)
    check(h, th, torch)


def test_a_closure_over_a_graph_keeps_that_graph_runnable():
    w = ta.tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)
    h = w.exp()  # history the caller will run backward through later
    with ta.no_grad():
        g = ta.func.grad(lambda u: (u * h).sum())(ta.tensor(np.ones(3)))
    np.testing.assert_allclose(g.numpy(), np.exp([0.5, -1.0, 2.0]), rtol=0, atol=ATOL)
    h.sum().backward()  # ExpBackward's saved output was not freed by the transform
    np.testing.assert_allclose(w.grad.numpy(), np.exp([0.5, -1.0, 2.0]), rtol=0, atol=ATOL)


def test_jvp_of_a_primal_that_requires_grad_is_differentiable(torch):
    (x, tx), (v, tv) = pair(torch, 4, requires_grad=True), pair(torch, 4)
    out, jv = ta.func.jvp(lambda u: u.sin().exp(), (x,), (v,))
    t_out, t_jv = torch.func.jvp(lambda u: u.sin().exp(), (tx,), (tv,))
    assert out.requires_grad and jv.requires_grad
    check(ta.autograd.grad((jv * out).sum(), x), torch.autograd.grad((t_jv * t_out).sum(), tx),
          torch)


# ----------------------------------------------------------------------------- vjp and jvp
def f_two_outputs(lib):
    return lambda x, y: {"prod": (x @ y).sin(), "pair": (x.exp().sum(0), lib.softmax(y, 0))}


def test_vjp_of_a_pytree_output_called_twice_with_aux(torch):
    (x, tx), (y, ty) = pair(torch, 3, 4), pair(torch, 4, 2)

    def with_aux(lib):
        return lambda a, b: (f_two_outputs(lib)(a, b), a.sum() * 3)

    out, fn, aux = ta.func.vjp(with_aux(ta), x, y, has_aux=True)
    t_out, t_fn, t_aux = torch.func.vjp(with_aux(torch), tx, ty, has_aux=True)
    check((out, aux), (t_out, t_aux), torch)
    for _ in range(2):
        ct = {"prod": pair(torch, 3, 2), "pair": (pair(torch, 4), pair(torch, 4, 2))}
        ours_ct = {"prod": ct["prod"][0], "pair": tuple(p[0] for p in ct["pair"])}
        theirs_ct = {"prod": ct["prod"][1], "pair": tuple(p[1] for p in ct["pair"])}
        check(fn(ours_ct), t_fn(theirs_ct), torch)
    assert not out["prod"].requires_grad


def test_vjp_cotangents_must_match_the_output():
    x = ta.tensor(np.arange(3.0))
    _, fn = ta.func.vjp(lambda t: t.sin(), x)
    with pytest.raises(RuntimeError, match=r"cotangent 0 has shape \(2,\).*\(3,\)"):
        fn(ta.ones(2, dtype=ta.float64))
    with pytest.raises(RuntimeError, match="pytree structure"):
        fn((ta.ones(3, dtype=ta.float64),))
    with pytest.raises(RuntimeError, match="f\\(\\*primals\\) to return Tensors.*got int"):
        ta.func.vjp(lambda t: 3, x)
    with pytest.raises(ValueError, match="argument 1 to be Tensors.*got int"):
        ta.func.vjp(lambda a, b: a, x, 3)
    with pytest.raises(RuntimeError, match="aux to be Tensors.*got int"):
        ta.func.grad(lambda a: (a.sum(), 1), has_aux=True)(x)


def test_jvp_of_a_pytree_output_with_aux(torch):
    (x, tx), (y, ty) = pair(torch, 3, 4), pair(torch, 4, 2)
    (u, tu), (v, tv) = pair(torch, 3, 4), pair(torch, 4, 2)

    def with_aux(lib):
        return lambda a, b: (f_two_outputs(lib)(a, b), {"aux": b * 2})

    ours = ta.func.jvp(with_aux(ta), (x, y), (u, v), has_aux=True)
    theirs = torch.func.jvp(with_aux(torch), (tx, ty), (tu, tv), has_aux=True)
    check(ours, theirs, torch)
    check(ta.func.jvp(f_two_outputs(ta), (x, y), (u, v)),
          torch.func.jvp(f_two_outputs(torch), (tx, ty), (tu, tv)), torch)


def test_jvp_checks_primals_and_tangents():
    x = ta.tensor(np.arange(3.0))
    with pytest.raises(RuntimeError, match="primals to be a tuple"):
        ta.func.jvp(lambda t: t.sin(), x, x)
    with pytest.raises(RuntimeError, match="same pytree structure"):
        ta.func.jvp(lambda t: t.sin(), (x,), (x, x))
    with pytest.raises(RuntimeError, match=r"tangent 0 has shape \(2,\) but primal 0 has shape "
                                           r"\(3,\)"):
        ta.func.jvp(lambda t: t.sin(), (x,), (ta.ones(2, dtype=ta.float64),))


# ----------------------------------------------------------------------------- Jacobians
@pytest.mark.parametrize("name", ["jacrev", "jacfwd"])
@pytest.mark.parametrize("argnums", [0, (0, 1)])
def test_jacobians_of_a_pytree_output(torch, name, argnums):
    (x, tx), (y, ty) = pair(torch, 3, 4), pair(torch, 4, 2)
    ours = getattr(ta.func, name)(f_two_outputs(ta), argnums=argnums)(x, y)
    theirs = getattr(torch.func, name)(f_two_outputs(torch), argnums=argnums)(tx, ty)
    check(ours, theirs, torch)


@pytest.mark.parametrize("name", ["jacrev", "jacfwd"])
def test_jacobians_with_aux_and_scalar_input(torch, name):
    x, tx = pair(torch)  # 0-d
    f = lambda lib: (lambda t: ((t * lib.arange(4, dtype=lib.float64)).exp(), t.cos()))  # noqa: E731
    ours = getattr(ta.func, name)(f(ta), has_aux=True)(x)
    theirs = getattr(torch.func, name)(f(torch), has_aux=True)(tx)
    check(ours, theirs, torch)


@pytest.mark.parametrize("f", FUNCS, ids=lambda f: f.__name__)
def test_hessian_of_a_function_of_two_inputs(torch, f):
    ours_in, theirs_in = inputs_for(torch, f)
    ours = ta.func.hessian(f(ta), argnums=(0, 1))(*ours_in)
    theirs = torch.func.hessian(f(torch), argnums=(0, 1))(*theirs_in)
    check(ours, theirs, torch)
    check(ta.func.hessian(f(ta))(*ours_in), torch.func.hessian(f(torch))(*theirs_in), torch)


def test_jacobian_arguments_are_checked():
    x = ta.tensor(np.arange(3.0))
    with pytest.raises(RuntimeError, match="argnums=2, but only 2 positional inputs"):
        ta.func.jacrev(lambda a, b: a * b, argnums=2)(x, x)
    with pytest.raises(RuntimeError, match="unique"):
        ta.func.grad(lambda a, b: (a * b).sum(), argnums=(0, 0))(x, x)
    with pytest.raises(RuntimeError, match="non-empty"):
        ta.func.grad(lambda a: a.sum(), argnums=())(x)
    with pytest.raises(RuntimeError, match="int or a tuple of ints, got float"):
        ta.func.grad(lambda a: a.sum(), argnums=1.0)(x)
    with pytest.raises(RuntimeError, match=r"scalar Tensor, got one of shape \(3,\)"):
        ta.func.grad(lambda a: a.sin())(x)
    with pytest.raises(RuntimeError, match="return a Tensor, got float"):
        ta.func.grad(lambda a: 3.0)(x)
    with pytest.raises(RuntimeError, match=r"tuple \(output, aux\)"):
        ta.func.grad(lambda a: a.sum(), has_aux=True)(x)
    with pytest.raises(RuntimeError, match="floating point.*int64"):
        ta.func.grad(lambda a: a.sum())(ta.arange(3))
    with pytest.raises(ValueError, match="chunk_size"):
        ta.func.jacrev(lambda a: a, chunk_size=0)
    with pytest.raises(ValueError, match="randomness"):
        ta.func.jacfwd(lambda a: a, randomness="sometimes")


# ----------------------------------------------------------------------------- a small MLP
def mlp_pair(torch):
    """A 2-layer tanh MLP in both frameworks, float64, the same weights."""
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(),
                                 torch.nn.Linear(5, 2)).double()
    ours = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return ours, theirs


def mlp_loss(model, target, lib):
    return lambda x: ((model(x) - target) ** 2).mean() + lib.softmax(model(x), -1)[..., 0].sum()


def test_mlp_loss_jvp_jacfwd_and_hessian(torch):
    ours, theirs = mlp_pair(torch)
    (x, tx), (t, tt), (v, tv) = pair(torch, 4, 3), pair(torch, 4, 2), pair(torch, 4, 3)
    f, tf = mlp_loss(ours, t, ta), mlp_loss(theirs, tt, torch)
    check(ta.func.jvp(f, (x,), (v,)), torch.func.jvp(tf, (tx,), (tv,)), torch)
    check(ta.func.jacfwd(lambda a: ours(a).tanh())(x),
          torch.func.jacfwd(lambda a: theirs(a).tanh())(tx), torch)
    check(ta.func.hessian(f)(x), torch.func.hessian(tf)(tx), torch)


def test_functional_call_grad_of_an_mlp_params_dict(torch):
    ours, theirs = mlp_pair(torch)
    (x, tx), (t, tt) = pair(torch, 4, 3), pair(torch, 4, 2)
    params = {k: p.detach() for k, p in ours.named_parameters()}
    t_params = {k: p.detach() for k, p in theirs.named_parameters()}

    def loss(model, lib, xx, tgt):
        return lambda p: ((ta.func.functional_call(model, p, (xx,)) if lib is ta else
                           torch.func.functional_call(model, p, (xx,))) - tgt).pow(2).sum()

    originals = dict(ours.named_parameters())
    g = ta.func.grad(loss(ours, ta, x, t))(params)
    tg = torch.func.grad(loss(theirs, torch, tx, tt))(t_params)
    check(g, tg, torch)
    assert not any(v.requires_grad for v in g.values())
    for k, p in ours.named_parameters():  # the module has its own parameters back
        assert p is originals[k] and p.requires_grad and p.grad is None, k
    h = ta.func.hessian(loss(ours, ta, x, t))({"2.bias": params["2.bias"]})
    th = torch.func.hessian(loss(theirs, torch, tx, tt))({"2.bias": t_params["2.bias"]})
    check(h, th, torch)


def test_functional_call_on_linear(torch):
    lin = nn.Linear(3, 2).double()
    w, b = ta.tensor(RNG.standard_normal((2, 3))), ta.tensor(RNG.standard_normal(2))
    x = ta.tensor(RNG.standard_normal((4, 3)))
    out = ta.func.functional_call(lin, {"weight": w, "bias": b}, x)
    assert not out.requires_grad  # no parameter of the module took part
    np.testing.assert_allclose(out.numpy(), x.numpy() @ w.numpy().T + b.numpy(), atol=ATOL)
    only_w = ta.func.functional_call(lin, ({"weight": w},), (x,))
    assert only_w.requires_grad  # the module's own bias took part
    np.testing.assert_allclose(only_w.detach().numpy(),
                               x.numpy() @ w.numpy().T + lin.bias.detach().numpy(), atol=ATOL)
    assert lin.weight is not w and lin.weight.requires_grad
    original = lin.weight

    class Boom(Exception):
        pass

    def explode(*_):
        assert lin.weight is w  # swapped in while the call runs
        raise Boom

    lin.forward = explode
    with pytest.raises(Boom):
        ta.func.functional_call(lin, {"weight": w}, (x,))
    del lin.forward
    assert lin.weight is original  # put back after the exception


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)
        self.b.weight = self.a.weight
        self.register_buffer("buf", ta.ones(2))

    def forward(self, x, scale=1.0):
        return self.b(self.a(x)) * scale + self.buf


def test_functional_call_ties_strictness_and_errors():
    m = _Tied().double()
    x = ta.tensor(RNG.standard_normal(2))
    zeros = ta.zeros(2, 2, dtype=ta.float64)
    tied = ta.func.functional_call(m, {"a.weight": zeros}, (x,))
    np.testing.assert_allclose(tied.detach().numpy(), m.b.bias.detach().numpy() + 1, atol=ATOL)
    untied = ta.func.functional_call(m, {"a.weight": zeros}, (x,), tie_weights=False)
    expected = m.b.weight.detach().numpy() @ m.a.bias.detach().numpy() + m.b.bias.detach().numpy()
    np.testing.assert_allclose(untied.detach().numpy(), expected + 1, atol=ATOL)
    scaled = ta.func.functional_call(m, {"buf": ta.zeros(2, dtype=ta.float64)}, (x,),
                                     {"scale": 0.0})
    np.testing.assert_allclose(scaled.detach().numpy(), [0.0, 0.0])
    assert m.buf.numpy().tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="tied"):
        ta.func.functional_call(m, {"a.weight": zeros, "b.weight": zeros + 1}, (x,))
    ta.func.functional_call(m, {"a.weight": zeros, "b.weight": zeros}, (x,))  # one value: fine
    with pytest.raises(ValueError, match="more than one of the dicts"):
        ta.func.functional_call(m, ({"buf": x}, {"buf": x}), (x,))
    with pytest.raises(TypeError, match="'buf' must be a Tensor, got int"):
        ta.func.functional_call(m, {"buf": 3}, (x,))
    ta.func.functional_call(m, {"zzz": x}, (x,))  # unknown names are ignored unless strict
    with pytest.raises(RuntimeError, match=r"unexpected key\(s\) \['zzz'\]"):
        ta.func.functional_call(m, {"zzz": x}, (x,), strict=True)
    with pytest.raises(RuntimeError, match=r"missing key\(s\) \['a.bias', 'b.bias', 'buf'\]"):
        ta.func.functional_call(m, {"a.weight": zeros}, (x,), strict=True)


# ----------------------------------------------------------------------------- a tiny GPT
GPT_CONFIG = dict(vocab_size=11, block_size=4, n_layer=1, n_head=2, n_embd=8)


def gpt_pair(torch):
    import torch_nanogpt

    torch.manual_seed(0)
    theirs = torch_nanogpt.GPT(torch_nanogpt.GPTConfig(**GPT_CONFIG, bias=True)).double()
    ours = nn.GPT(nn.GPTConfig(**GPT_CONFIG, bias=True)).double()
    ours.load_state_dict(torch_nanogpt.state_dict_to_ta(theirs))
    rng = np.random.default_rng(3)
    idx, targets = rng.integers(0, 11, (2, 4)), rng.integers(0, 11, (2, 4))
    return (ours, ta.tensor(idx), ta.tensor(targets),
            theirs, torch.from_numpy(idx), torch.from_numpy(targets))


def gpt_loss(call, model, idx, targets, rest):
    return lambda p: call(model, ({**rest, **p},), (idx, targets))[1]


def test_gpt_loss_grad_wrt_two_weight_matrices(torch):
    ours, idx, targets, theirs, t_idx, t_targets = gpt_pair(torch)
    names = ["transformer.h.0.attn.c_attn.weight", "transformer.h.0.mlp.c_proj.weight"]
    rest = {k: p.detach() for k, p in ours.named_parameters()}
    t_rest = {k: p.detach() for k, p in theirs.named_parameters()}
    params = {k: rest.pop(k) for k in names}
    t_params = {k: t_rest.pop(k) for k in names}
    f = gpt_loss(ta.func.functional_call, ours, idx, targets, rest)
    tf = gpt_loss(torch.func.functional_call, theirs, t_idx, t_targets, t_rest)
    g, value = ta.func.grad_and_value(f)(params)
    tg, t_value = torch.func.grad_and_value(tf)(t_params)
    check((g, value), (tg, t_value), torch)
    assert np.abs(g[names[0]].numpy()).max() > 1e-3  # a real gradient, not zeros
    assert not value.requires_grad and not g[names[1]].requires_grad


SMALL = "transformer.ln_f.weight"  # 8 numbers


def gpt_of_ln_f(torch):
    """The tiny GPT's loss as a function of ln_f.weight alone, in both frameworks, with a
    point and a direction."""
    ours, idx, targets, theirs, t_idx, t_targets = gpt_pair(torch)
    rest = {k: p.detach() for k, p in ours.named_parameters() if k != SMALL}
    t_rest = {k: p.detach() for k, p in theirs.named_parameters() if k != SMALL}
    h = lambda w: gpt_loss(ta.func.functional_call, ours, idx, targets, rest)({SMALL: w})  # noqa: E731
    th = lambda w: gpt_loss(torch.func.functional_call, theirs, t_idx, t_targets,  # noqa: E731
                            t_rest)({SMALL: w})
    p0, tp0 = ours.transformer.ln_f.weight.detach(), theirs.transformer.ln_f.weight.detach()
    v, tv = pair(torch, 8)
    return h, p0, v, th, tp0, tv


def test_gpt_loss_hvp_wrt_a_small_parameter(torch):
    h, p0, v, th, tp0, tv = gpt_of_ln_f(torch)
    _, thv = torch.func.jvp(torch.func.grad(th), (tp0,), (tv,))
    _, ours_hvp = ta.autograd.functional.hvp(h, p0, v)
    check(ours_hvp, thv, torch)
    _, vhp_fn = ta.func.vjp(ta.func.grad(h), p0)  # v^T H: the same numbers, H is symmetric
    check(vhp_fn(v), (thv,), torch)
    check(ta.func.hessian(h)(p0), torch.func.hessian(th)(tp0), torch)


def test_gpt_loss_forward_over_reverse_hvp(torch):
    h, p0, v, th, tp0, tv = gpt_of_ln_f(torch)
    _, thv = torch.func.jvp(torch.func.grad(th), (tp0,), (tv,))
    _, hv = ta.func.jvp(ta.func.grad(h), (p0,), (v,))
    check(hv, thv, torch)


# ----------------------------------------------------------------------------- autograd.functional
AF_CASES = {
    "single": (lambda lib: (lambda x: (x.sin() * x.exp()).sum(0)), [(3, 2)]),
    "tuple_in": (lambda lib: (lambda x, y: (x @ y).tanh()), [(2, 3), (3, 2)]),
    "tuple_out": (lambda lib: (lambda x, y: (lib.softmax(x, -1), (x * y).sum())),
                  [(2, 3), (2, 3)]),
}


def af_inputs(torch, name):
    fn, shapes = AF_CASES[name]
    made = [pair(torch, *s) for s in shapes]
    ours = tuple(m[0] for m in made)
    theirs = tuple(m[1] for m in made)
    if len(shapes) == 1:
        return fn(ta), ours[0], fn(torch), theirs[0]
    return fn(ta), ours, fn(torch), theirs


@pytest.mark.parametrize("name", sorted(AF_CASES))
@pytest.mark.parametrize("strategy", ["reverse-mode", "forward-mode"])
def test_af_jacobian(torch, name, strategy):
    f, x, tf, tx = af_inputs(torch, name)
    vectorize = strategy == "forward-mode"
    ours = ta.autograd.functional.jacobian(f, x, vectorize=vectorize, strategy=strategy)
    theirs = torch.autograd.functional.jacobian(tf, tx, vectorize=vectorize, strategy=strategy)
    check(ours, theirs, torch, lists_as_tuples=vectorize)


@pytest.mark.parametrize("name", ["single", "tuple_in"])
def test_af_vjp_jvp(torch, name):
    f, x, tf, tx = af_inputs(torch, name)
    t_out = tf(*tx) if isinstance(tx, tuple) else tf(tx)
    _, tv_out = pair(torch, *t_out.shape)
    v_out = ta.tensor(tv_out.numpy())
    check(ta.autograd.functional.vjp(f, x, v_out), torch.autograd.functional.vjp(tf, tx, tv_out),
          torch)
    v_in = tuple(ta.tensor(RNG.standard_normal(a.shape)) for a in (tx if isinstance(tx, tuple)
                                                                    else (tx,)))
    tv_in = tuple(torch.tensor(a.numpy()) for a in v_in)
    if not isinstance(tx, tuple):
        v_in, tv_in = v_in[0], tv_in[0]
    check(ta.autograd.functional.jvp(f, x, v_in), torch.autograd.functional.jvp(tf, tx, tv_in),
          torch)


def test_af_vjp_jvp_of_tuple_outputs(torch):
    f, x, tf, tx = af_inputs(torch, "tuple_out")
    v = (ta.tensor(RNG.standard_normal((2, 3))), ta.tensor(RNG.standard_normal(())))
    tv = tuple(torch.tensor(a.numpy()) for a in v)
    check(ta.autograd.functional.vjp(f, x, v), torch.autograd.functional.vjp(tf, tx, tv), torch)
    u = tuple(ta.tensor(RNG.standard_normal((2, 3))) for _ in range(2))
    tu = tuple(torch.tensor(a.numpy()) for a in u)
    check(ta.autograd.functional.jvp(f, x, u), torch.autograd.functional.jvp(tf, tx, tu), torch)


def scalar_two(lib):
    return lambda x, y: (x.sin() * (x @ y).exp().sum(-1, keepdim=True) + y.pow(3).sum()).sum()


@pytest.mark.parametrize("product", ["hvp", "vhp"])
def test_af_hessian_products(torch, product):
    (x, tx), (y, ty) = pair(torch, 2, 3), pair(torch, 3, 2)
    (u, tu), (w, tw) = pair(torch, 2, 3), pair(torch, 3, 2)
    ours = getattr(ta.autograd.functional, product)(scalar_two(ta), (x, y), (u, w))
    theirs = getattr(torch.autograd.functional, product)(scalar_two(torch), (tx, ty), (tu, tw))
    check(ours, theirs, torch)
    g = lambda lib: (lambda a: (a.tanh() ** 3).sum())  # noqa: E731
    check(getattr(ta.autograd.functional, product)(g(ta), x, u),
          getattr(torch.autograd.functional, product)(g(torch), tx, tu), torch)


@pytest.mark.parametrize("strategy", ["reverse-mode", "forward-mode"])
def test_af_hessian(torch, strategy):
    (x, tx), (y, ty) = pair(torch, 2, 3), pair(torch, 3, 2)
    vec = strategy == "forward-mode"
    check(ta.autograd.functional.hessian(scalar_two(ta), (x, y), vectorize=vec,
                                         outer_jacobian_strategy=strategy),
          torch.autograd.functional.hessian(scalar_two(torch), (tx, ty), vectorize=vec,
                                            outer_jacobian_strategy=strategy), torch,
          lists_as_tuples=vec)
    g = lambda lib: (lambda a: (a.sin() * a.exp()).sum())  # noqa: E731
    check(ta.autograd.functional.hessian(g(ta), x), torch.autograd.functional.hessian(g(torch), tx),
          torch)


def test_af_create_graph_keeps_a_graph_to_the_inputs(torch):
    x, tx = pair(torch, 3, requires_grad=True)
    f = lambda a: a.exp().sin()  # noqa: E731
    out, jv = ta.autograd.functional.jvp(f, x, ta.ones(3, dtype=ta.float64), create_graph=True)
    t_out, t_jv = torch.autograd.functional.jvp(f, tx, torch.ones(3, dtype=torch.float64),
                                                create_graph=True)
    assert out.requires_grad and jv.requires_grad
    check(ta.autograd.grad(jv.sum(), x), torch.autograd.grad(t_jv.sum(), tx), torch)
    jac = ta.autograd.functional.jacobian(f, x, create_graph=True)
    t_jac = torch.autograd.functional.jacobian(f, tx, create_graph=True)
    check(ta.autograd.grad(jac.sum(), x), torch.autograd.grad(t_jac.sum(), tx), torch)
    out, vj = ta.autograd.functional.vjp(f, x, ta.ones(3, dtype=ta.float64))
    assert not out.requires_grad and not vj.requires_grad


def test_af_errors():
    af = ta.autograd.functional
    x = ta.tensor(np.arange(3.0))
    with pytest.raises(RuntimeError, match=r"v has shape \(2,\) but output 0 has shape \(3,\)"):
        af.vjp(lambda a: a.sin(), x, ta.ones(2, dtype=ta.float64))
    with pytest.raises(RuntimeError, match=r"entry 1 of v has shape \(2,\) but input 1 has "
                                           r"shape \(3,\)"):
        af.jvp(lambda a, b: a * b, (x, x), (x, ta.ones(2, dtype=ta.float64)))
    with pytest.raises(RuntimeError, match="v has 1 Tensors but there are 2 inputs"):
        af.jvp(lambda a, b: a * b, (x, x), (x,))
    with pytest.raises(RuntimeError, match="v can be left out only"):
        af.vjp(lambda a: a.sin(), x)
    with pytest.raises(TypeError, match="a Tensor or a tuple of Tensors; element 1 has type list"):
        af.jacobian(lambda a, b: a, (x, [1.0]))
    with pytest.raises(RuntimeError, match="independent of input 1"):
        af.jacobian(lambda a, b: a.sin(), (x, x), strict=True)
    with pytest.raises(RuntimeError, match="does not require grad"):
        af.vjp(lambda a: a.detach(), x, x, strict=True)
    with pytest.raises(NotImplementedError, match="vectorize=True"):
        af.jacobian(lambda a: a, x, strategy="forward-mode")
    with pytest.raises(NotImplementedError, match="create_graph"):
        af.jacobian(lambda a: a, x, strategy="forward-mode", vectorize=True, create_graph=True)
    with pytest.raises(RuntimeError, match="single element"):
        af.hessian(lambda a: a.sin(), x)
    with pytest.raises(RuntimeError, match="single Tensor"):
        af.hvp(lambda a: (a.sum(), a.sum()), x, x)
    with pytest.raises(ValueError, match="strategy"):
        af.jacobian(lambda a: a, x, strategy="sideways")
    # torch's zeros for an unused input without strict
    jac = af.jacobian(lambda a, b: a.sin(), (x, x))
    np.testing.assert_array_equal(jac[1].numpy(), np.zeros((3, 3)))
