"""Second derivatives through in-place ops, checkpoints and save policies, against torch.

Each program runs in both frameworks on the same float64 leaves: the first gradients with
create_graph=True (contracted with a random cotangent), then the gradient of their
contraction with other random vectors. Version counters guard the recorded graph as they
guard the first one: a tensor the first gradient's graph saved, modified in place before
the second backward, is refused as torch refuses it.
"""

from __future__ import annotations

import numpy as np
import pytest

import tinygrad_attn as ta

F64 = ta.float64
TOL = 1e-10


def _torch():
    return pytest.importorskip("torch")


def _leaves(lib, arrays):
    return [lib.tensor(a, dtype=lib.float64, requires_grad=True) for a in arrays]


def _const(lib, a):
    return lib.tensor(a)


def _numpy(t):
    return None if t is None else t.detach().numpy()


def _second_order(lib, program, arrays, seed=1):
    """(first gradients, second gradients) of program(lib, *leaves): the first contracted
    with a random cotangent of the output, the second of sum_i <first_i, u_i>."""
    rng = np.random.default_rng(seed)
    xs = _leaves(lib, arrays)
    out = program(lib, *xs)
    v = _const(lib, rng.standard_normal(tuple(out.shape)))
    firsts = lib.autograd.grad(out, xs, v, create_graph=True, allow_unused=True)
    total = None
    for f in firsts:
        if f is None:
            continue
        term = (f * _const(lib, rng.standard_normal(tuple(f.shape)))).sum()
        total = term if total is None else total + term
    seconds = lib.autograd.grad(total, xs, allow_unused=True)
    return [_numpy(f) for f in firsts], [_numpy(s) for s in seconds]


def _check_against_torch(program, shapes, seed=0):
    torch = _torch()
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s) for s in shapes]
    ours = _second_order(ta, program, arrays)
    theirs = _second_order(torch, program, arrays)
    for kind, a_list, b_list in zip(("first", "second"), ours, theirs):
        for i, (a, b) in enumerate(zip(a_list, b_list)):
            if b is None or not np.any(b):
                assert a is None or not np.any(a), f"{kind} gradient {i}: expected zero"
                continue
            assert a is not None, f"{kind} gradient {i}: missing"
            np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL,
                                       err_msg=f"{kind} gradient of input {i}")


# ----------------------------------------------------------------------------- in-place ops
def _mul_(lib, x, z):
    y = x * 2
    y.mul_(z)
    return y * x


def _mul_scalar_(lib, x, z):
    y = x.tanh() * 1  # tanh saved its output: the in-place op writes into a copy
    y.mul_(-1.5)
    return y * z


def _div_(lib, x, z):
    y = x.exp() * 1
    y.div_(z * z + 1)
    return y * y


def _add_alpha_(lib, x, z):
    y = x * x
    y.add_(z * z, alpha=-0.5)
    return y.tanh()


def _sub_(lib, x, z):
    y = x.tanh() * 1
    y.sub_(z.exp())
    return y * y


def _add_itself_(lib, x, z):
    y = x * z
    y.add_(y)
    return y * x


def _masked_fill_(lib, x, z):
    mask = _const(lib, np.array([[True, False, False, True], [False, True, False, False],
                                 [True, True, False, False]]))
    y = x * x
    y.masked_fill_(mask, 1.5)
    return y * z


def _clamp_(lib, x, z):
    y = x * z
    y.clamp_(-0.5, 0.5)
    return y * y * x


def _copy_(lib, x, z):
    y = x * x
    y.copy_(z.tanh())
    return y * x


def _setitem(lib, x, z):
    y = x * x
    y[0] = z[1] * z[2]
    y[:, 1] = x[:, 2].exp()
    return y * y


def _result_methods(lib, x, z):
    y = x * 1
    y.exp_()  # saves its result, which no later op modifies
    w = y * z
    w.tanh_()
    return w * x


def _chain(lib, x, z):
    y = x.tanh() * 2
    y.mul_(z)
    y.add_(x * z, alpha=0.5)
    y[0] = z[1] * x[2]
    y.div_(1.5)
    y.clamp_(-1.0, 1.0)
    return (y * y).sum(1)


def _feeds_later_ops(lib, x, z):
    y = x * 1
    y.add_(z)
    y[1, ::2] = z[0, 1:3]
    return (y.softmax(-1) @ z.T).logsumexp(0)


INPLACE = {"mul_": _mul_, "mul_scalar": _mul_scalar_, "div_": _div_, "add_alpha": _add_alpha_,
           "sub_": _sub_, "add_itself": _add_itself_, "masked_fill_": _masked_fill_,
           "clamp_": _clamp_, "copy_": _copy_, "setitem": _setitem,
           "result_methods": _result_methods, "chain": _chain,
           "feeds_later_ops": _feeds_later_ops}


@pytest.mark.parametrize("name", list(INPLACE))
def test_inplace_second_derivative_matches_torch(name):
    _check_against_torch(INPLACE[name], [(3, 4), (3, 4)])


def test_inplace_on_the_first_gradient_then_differentiated():
    torch = _torch()
    a = np.random.default_rng(3).standard_normal((3, 4))
    results = []
    for lib in (ta, torch):
        (x,) = _leaves(lib, [a])
        (g,) = lib.autograd.grad((x.sin() * x).sum(), x, create_graph=True)
        g.mul_(x)  # a non-leaf with a graph: its history is rebased onto mul_
        (h,) = lib.autograd.grad(g.sum(), x)
        results.append((_numpy(g), _numpy(h)))
    for ours, theirs in zip(*results):
        np.testing.assert_allclose(ours, theirs, rtol=TOL, atol=TOL)


def test_saved_tensor_modified_before_the_first_backward_is_refused():
    torch = _torch()
    for lib in (ta, torch):
        x = lib.tensor([0.5, -1.0, 2.0], dtype=lib.float64, requires_grad=True)
        h = x * 1
        y = (h.exp() * h).sum()
        h.add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation|in-place"):
            lib.autograd.grad(y, x, create_graph=True)


def test_tensor_saved_by_the_recorded_graph_modified_before_the_second_backward():
    torch = _torch()
    for lib in (ta, torch):
        x = lib.tensor([0.5, -1.0, 2.0], dtype=lib.float64, requires_grad=True)
        h = x * 1
        (g,) = lib.autograd.grad((h * h * h).sum(), x, create_graph=True)
        h.mul_(2.0)  # the first gradient's graph multiplied by h: it saved h
        with pytest.raises(RuntimeError, match="modified by an inplace operation|in-place"):
            lib.autograd.grad(g.sum(), x)


def test_divisor_of_an_inplace_op_modified_before_the_second_backward_is_refused():
    # div_ saved its divisor, and the recorded backward divided by it again
    torch = _torch()
    for lib in (ta, torch):
        x = lib.tensor([0.5, -1.0, 2.0], dtype=lib.float64, requires_grad=True)
        z = lib.tensor([1.5, 2.0, -3.0], dtype=lib.float64, requires_grad=True)
        y, d = x.exp() * 1, z * 1
        y.div_(d)
        (gz,) = lib.autograd.grad((y * 1).sum(), z, create_graph=True)
        d.mul_(3.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation|in-place"):
            lib.autograd.grad(gz.sum(), x)


# ----------------------------------------------------------------------------- checkpoint
def _checkpointed(lib, x, w, p):
    def block(a, b, c):
        return (a @ b).tanh() * a.sum() + (a * c).sin().sum(0)

    if lib is ta:
        return ta.checkpoint(block, x, w, p)
    return block(x, w, p)  # the reference: the plain call (checkpointing changes no value)


def test_checkpoint_second_derivative_matches_the_plain_program_in_torch():
    _check_against_torch(_checkpointed, [(3, 4), (4, 4), (3, 4)])


def test_checkpoint_of_one_tensor_passed_twice():
    def program(lib, x):
        def block(a, b):
            return (a * b.exp()).tanh()

        return ta.checkpoint(block, x, x) if lib is ta else block(x, x)

    _check_against_torch(program, [(3, 4)])


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_checkpoint_closure_parameters_get_grad_with_a_graph():
    torch = _torch()
    rng = np.random.default_rng(5)
    a, wa, u, c = (rng.standard_normal(s) for s in [(3, 4), (4, 2), (4, 2), (3, 2)])
    results = []
    for lib in (ta, torch):
        x, w = _leaves(lib, [a, wa])

        def block(t, w=w):  # w is the block's own parameter, not an argument
            return (t @ w).tanh() * t.sum()

        out = ta.checkpoint(block, x) if lib is ta else block(x)
        # the loss is linear in out: the checkpoint node has no edge to w, so a cotangent
        # that depends on w would lose that dependence (as torch's reentrant checkpoint)
        (out * lib.tensor(c)).sum().backward(create_graph=True)
        assert w.grad.requires_grad
        second = lib.autograd.grad((w.grad * lib.tensor(u)).sum(), [x, w])
        results.append([_numpy(x.grad), _numpy(w.grad)] + [_numpy(s) for s in second])
    for ours, theirs in zip(*results):
        np.testing.assert_allclose(ours, theirs, rtol=TOL, atol=TOL)


def test_checkpoint_with_dropout_replays_the_mask_in_the_recorded_backward():
    a = np.random.default_rng(6).standard_normal((4, 5))

    def run(use_checkpoint):
        ta.manual_seed(11)
        (x,) = _leaves(ta, [a])

        def block(t):
            return ta.functional.dropout(t.tanh(), p=0.4) * t

        out = ta.checkpoint(block, x) if use_checkpoint else block(x)
        (g,) = ta.autograd.grad((out * out).sum(), x, create_graph=True)
        (h,) = ta.autograd.grad((g * g).sum(), x)
        return g.detach().numpy(), h.numpy()

    plain, checkpointed = run(False), run(True)
    for p, c in zip(plain, checkpointed):
        np.testing.assert_allclose(c, p, rtol=1e-12, atol=1e-12)
    assert np.count_nonzero(plain[0] == 0) > 0  # some elements were dropped


# ----------------------------------------------------------------------------- save policies
def _policy_program(lib, x, w1, b1, w2, gamma, beta):
    if lib is ta:
        fn = ta.functional
        gelu, bias_gelu = fn.gelu, fn.bias_gelu
    else:
        fn = lib.nn.functional
        gelu = fn.gelu

        def bias_gelu(t, b, approximate="none"):
            return fn.gelu(t + b, approximate=approximate)

    h = gelu(x @ w1, approximate="tanh")  # gelu's output feeds a matmul: a recipe there
    h2 = bias_gelu(h, b1) @ w2
    s = h2.softmax(-1)  # softmax's output feeds a mul
    n = fn.layer_norm(s * h2, (4,), gamma, beta)  # layer_norm's feeds a matmul
    return n @ w2.T


POLICY_SHAPES = [(3, 4), (4, 4), (4,), (4, 4), (4,), (4,)]


@pytest.mark.parametrize("mode", ["save", "recompute"])
def test_save_policies_second_derivative_matches_torch(mode):
    with ta.memory.save_policies(gelu=mode, softmax=mode, layer_norm=mode):
        _check_against_torch(_policy_program, POLICY_SHAPES, seed=7)


def test_recompute_really_rebuilds_the_output_in_the_recorded_backward():
    x = ta.tensor(np.random.default_rng(8).standard_normal((3, 4)), dtype=F64,
                  requires_grad=True)
    w = ta.tensor(np.random.default_rng(9).standard_normal((4, 4)), dtype=F64,
                  requires_grad=True)
    with ta.memory.save_policies(gelu="recompute"):
        h = ta.functional.gelu(x * 1)
        y = h @ w
    assert not any(t.shares_storage(h) for t in y.grad_fn.saved_tensor_list())
    (gw,) = ta.autograd.grad((y * y).sum(), w, create_graph=True)
    (gx,) = ta.autograd.grad(gw.sum(), x)  # through the rebuilt h, rejoined to gelu's node
    with ta.memory.save_policies(gelu="save"):
        h = ta.functional.gelu(x * 1)
        y = h @ w
    (gw_saved,) = ta.autograd.grad((y * y).sum(), w, create_graph=True)
    (gx_saved,) = ta.autograd.grad(gw_saved.sum(), x)
    np.testing.assert_allclose(gx.numpy(), gx_saved.numpy(), rtol=1e-12, atol=1e-12)
    assert np.any(gx.numpy())


# ----------------------------------------------------------------------------- corners
# The piecewise activations at their corners (0, +-3, the softplus threshold): which side's
# derivative a point takes is torch's choice, in the first derivative and in the second.
CORNERS = np.array([0.0, -0.0, -3.0, 3.0, 6.0, -1.0, 1.0, 20.0, -20.0, 0.5, -0.5, 2.0])
CORNER_OPS = {
    "elu": lambda F: F.elu, "elu_negative_alpha": lambda F: (lambda x: F.elu(x, alpha=-0.7)),
    "selu": lambda F: F.selu, "celu": lambda F: (lambda x: F.celu(x, alpha=0.5)),
    "softplus": lambda F: F.softplus,
    "softplus_at_threshold": lambda F: (lambda x: F.softplus(x, beta=2.0, threshold=1.0)),
    "softsign": lambda F: F.softsign, "hardswish": lambda F: F.hardswish,
    # (a piecewise-linear op's first derivative alone has no graph here: times x, it has)
    "relu6": lambda F: (lambda x: F.relu6(x) * x),
    "hardtanh": lambda F: (lambda x: F.hardtanh(x) * x), "mish": lambda F: F.mish,
    "silu": lambda F: F.silu, "logsigmoid": lambda F: F.logsigmoid,
    "leaky_relu": lambda F: (lambda x: F.leaky_relu(x, 0.2) * x),
}


@pytest.mark.parametrize("name", list(CORNER_OPS))
def test_activation_corners_first_and_second_derivative_match_torch(name, device):
    torch = _torch()
    results = []
    for lib, F in ((ta, ta.functional), (torch, torch.nn.functional)):
        x = lib.tensor(CORNERS, dtype=lib.float64, requires_grad=True)
        if lib is ta:
            x = ta.tensor(CORNERS, dtype=F64, device=device, requires_grad=True)
        (g,) = lib.autograd.grad(CORNER_OPS[name](F)(x).sum(), x, create_graph=True)
        (h,) = lib.autograd.grad(g.sum(), x)
        results.append((_numpy(g.cpu()), _numpy((x.detach() * 0 + h).cpu())))
    for kind, ours, theirs in zip(("first", "second"), *results):
        np.testing.assert_allclose(ours, theirs, rtol=TOL, atol=1e-12,
                                   err_msg=f"{name}: {kind} derivative")
