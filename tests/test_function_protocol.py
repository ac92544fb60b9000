"""The ctx protocol of ta.Function, checked against torch.autograd.Function.

Custom ops below use only the public API (ta.Function, ctx.*, tensor methods), as a user's
op would: ctx.mark_dirty for in-place writes, ctx.mark_non_differentiable for outputs
without a gradient, ctx.set_materialize_grads(False) for None instead of zeros. Also the
op-side protocol (what the engine reads from a Function).
"""

from __future__ import annotations

import numpy as np
import pytest

import tinygrad_attn as ta


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def _host(t):
    return t.detach().numpy()


# ----------------------------------------------------------------------------- mark_dirty
class ScaleInplace(ta.Function):
    """x *= k, written through the tensor's memory; gx = k * g. Saves nothing."""

    @staticmethod
    def forward(ctx, x, k):
        x.detach().numpy()[...] *= k
        ctx.mark_dirty(x)
        ctx.k = k
        return x

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


def _torch_scale_inplace(torch):
    class TorchScaleInplace(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            x.detach().numpy()[...] *= k
            ctx.mark_dirty(x)
            ctx.k = k
            return x

        @staticmethod
        def backward(ctx, g):
            return g * ctx.k, None

    return TorchScaleInplace


VALUES = [1.0, -2.0, 0.5]


def test_mark_dirty_values_grads_and_version_match_torch(torch):
    TorchScaleInplace = _torch_scale_inplace(torch)
    a = ta.tensor(VALUES, dtype=ta.float64, requires_grad=True)
    ta_ = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True)
    h, th = a * 2.0, ta_ * 2.0
    y, ty = ScaleInplace.apply(h, 3.0), TorchScaleInplace.apply(th, 3.0)
    assert y is h and ty is th                       # the returned tensor is the input
    assert h._version == th._version == 1            # mark_dirty bumped it once
    assert h.grad_fn.name == "ScaleInplaceBackward"  # history rebased onto the op
    np.testing.assert_array_equal(_host(h), th.detach().numpy())
    (h * h).sum().backward()
    (th * th).sum().backward()
    np.testing.assert_array_equal(_host(a.grad), ta_.grad.numpy())
    np.testing.assert_array_equal(_host(a.grad), 72.0 * np.array(VALUES))  # d(36 a^2)/da


def test_mark_dirty_after_an_inplace_method_bumps_twice_as_torch(torch):
    class AddOneInplace(ta.Function):
        @staticmethod
        def forward(ctx, x):
            x.add_(1.0)  # grad mode is off inside forward: a plain in-place write
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    class TorchAddOneInplace(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x.add_(1.0)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    h = ta.tensor(VALUES, dtype=ta.float64, requires_grad=True) * 1.0
    th = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True) * 1.0
    AddOneInplace.apply(h)
    TorchAddOneInplace.apply(th)
    assert h._version == th._version == 2
    np.testing.assert_array_equal(_host(h), th.detach().numpy())


def test_mark_dirty_makes_a_saved_tensor_stale_as_torch(torch):
    TorchScaleInplace = _torch_scale_inplace(torch)
    h = ta.tensor(VALUES, dtype=ta.float64, requires_grad=True) * 1.0
    th = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True) * 1.0
    y, ty = h.exp(), th.exp()  # exp saves its own output, not h
    z, tz = (h * h).sum(), (th * th).sum()  # mul saves h
    ScaleInplace.apply(h, 2.0)
    TorchScaleInplace.apply(th, 2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        tz.backward()
    with pytest.raises(RuntimeError, match=r"MulBackward.*modified by an in-place"):
        z.backward()
    y.sum().backward()  # exp kept its own output: unaffected, in both
    ty.sum().backward()


def test_mark_dirty_refuses_a_leaf_that_requires_grad_as_torch(torch):
    TorchScaleInplace = _torch_scale_inplace(torch)
    a = ta.tensor(VALUES, dtype=ta.float64, requires_grad=True)
    ta_ = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        TorchScaleInplace.apply(ta_, 2.0)
    with pytest.raises(RuntimeError,
                       match=r"ScaleInplace: a leaf tensor that requires grad \(shape \(3,\)\)"):
        ScaleInplace.apply(a, 2.0)
    # forward wrote before declaring it, in both: the memory moved on and so did the version
    np.testing.assert_array_equal(_host(a), ta_.detach().numpy())
    assert a._version == ta_._version == 1
    assert a.grad_fn is None and a.is_leaf


def test_mark_dirty_refuses_a_view_of_a_leaf_as_torch(torch):
    TorchScaleInplace = _torch_scale_inplace(torch)
    a = ta.tensor(VALUES, dtype=ta.float64, requires_grad=True)
    ta_ = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad"):
        TorchScaleInplace.apply(ta_[:2], 2.0)
    with pytest.raises(RuntimeError, match=r"ScaleInplace: a view \(shape \(2,\)\) of a leaf"):
        ScaleInplace.apply(a[:2], 2.0)


def test_mark_dirty_under_no_grad_writes_a_leaf_as_torch(torch):
    TorchScaleInplace = _torch_scale_inplace(torch)
    a = ta.tensor(VALUES, dtype=ta.float64, requires_grad=True)
    ta_ = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True)
    with ta.no_grad():
        ScaleInplace.apply(a, 2.0)
    with torch.no_grad():
        TorchScaleInplace.apply(ta_, 2.0)
    np.testing.assert_array_equal(_host(a), ta_.detach().numpy())
    assert a._version == ta_._version == 1
    assert a.is_leaf and a.requires_grad


def test_mark_dirty_tensor_must_be_returned_as_torch(torch):
    class Forgets(ta.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.mark_dirty(x)
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return g

    class TorchForgets(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.mark_dirty(x)
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return g

    with pytest.raises(RuntimeError, match="marked as dirty .* were not returned"):
        TorchForgets.apply(torch.ones(2, requires_grad=True) * 1.0)
    with pytest.raises(RuntimeError, match=r"Forgets: a tensor marked dirty \(shape \(2,\)\) "
                                           "was not returned"):
        Forgets.apply(ta.ones(2, requires_grad=True) * 1.0)


def test_views_taken_before_a_dirty_write_are_stale():
    h = ta.tensor(VALUES, dtype=ta.float64, requires_grad=True) * 1.0
    v = h[:2]
    ScaleInplace.apply(h, 2.0)
    with pytest.raises(RuntimeError, match="view whose base was modified in place"):
        v * 1.0
    (h[:2] * 1.0).sum().backward()  # a view taken after the write is fine


def test_builtin_inplace_ops_refuse_views_before_writing(torch):
    a = ta.tensor(VALUES, dtype=ta.float64, requires_grad=True)
    ta_ = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad"):
        ta_[:2].add_(1.0)
    with pytest.raises(RuntimeError, match=r"add_: a view \(shape \(2,\)\) of a leaf tensor"):
        a[:2].add_(1.0)
    h = a * 1.0
    with pytest.raises(RuntimeError, match=r"mul_: in-place modification of a view"):
        h[1:].mul_(2.0)  # torch rewrites the base's history here; this engine refuses
    np.testing.assert_array_equal(_host(a), VALUES)  # nothing was written
    assert a._version == h._version == 0


# ----------------------------------------------------------------------------- non-differentiable
class SortValues(ta.Function):
    """(sorted values, int64 indices); gx scatters g back through the indices."""

    @staticmethod
    def forward(ctx, x):
        order = np.argsort(x.detach().numpy(), kind="stable")
        idx = ta.from_numpy(order)
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(idx)
        return ta.from_numpy(x.detach().numpy()[order]), idx

    @staticmethod
    def backward(ctx, g_values, g_idx):
        ctx.seen_g_idx = g_idx
        (idx,) = ctx.saved_tensors
        gx = np.zeros_like(g_values.numpy())
        gx[idx.numpy()] = g_values.numpy()
        return ta.from_numpy(gx)


def test_mark_non_differentiable_int_output_as_torch(torch):
    class TorchSortValues(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            values, idx = torch.sort(x, stable=True)
            ctx.mark_non_differentiable(idx)
            ctx.save_for_backward(idx)
            return values, idx

        @staticmethod
        def backward(ctx, g_values, g_idx):
            ctx.seen_g_idx = g_idx
            (idx,) = ctx.saved_tensors
            gx = torch.zeros_like(g_values)
            gx[idx] = g_values
            return gx

    x = ta.tensor([3.0, 1.0, 2.0], dtype=ta.float64, requires_grad=True)
    tx = torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    (v, i), (tv, ti) = SortValues.apply(x), TorchSortValues.apply(tx)
    assert (v.requires_grad, i.requires_grad) == (tv.requires_grad, ti.requires_grad)
    assert i.grad_fn is None and ti.grad_fn is None and not i.requires_grad
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    node, tnode = v.grad_fn, tv.grad_fn
    weights = [1.0, 2.0, 3.0]
    (v * ta.tensor(weights, dtype=ta.float64)).sum().backward()
    (tv * torch.tensor(weights, dtype=torch.float64)).sum().backward()
    np.testing.assert_array_equal(_host(x.grad), tx.grad.numpy())
    # backward still got a gradient for the indices: zeros of their shape and dtype
    g_idx, tg_idx = node.seen_g_idx, tnode.seen_g_idx
    assert g_idx.dtype == ta.int64 and tg_idx.dtype == torch.int64
    np.testing.assert_array_equal(g_idx.numpy(), tg_idx.numpy())


def test_mark_non_differentiable_float_output_as_torch(torch):
    class MinAndMax(ta.Function):
        @staticmethod
        def forward(ctx, x):
            lo, hi = x.min(), x.max()
            ctx.mark_non_differentiable(hi)
            ctx.save_for_backward(x, lo)
            return lo, hi

        @staticmethod
        def backward(ctx, g_lo, g_hi):
            ctx.seen_g_hi = g_hi
            x, lo = ctx.saved_tensors
            return g_lo * (x == lo).double()

    class TorchMinAndMax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            lo, hi = x.min(), x.max()
            ctx.mark_non_differentiable(hi)
            ctx.save_for_backward(x, lo)
            return lo, hi

        @staticmethod
        def backward(ctx, g_lo, g_hi):
            ctx.seen_g_hi = g_hi
            x, lo = ctx.saved_tensors
            return g_lo * (x == lo).double()

    x = ta.tensor([3.0, 1.0, 2.0], dtype=ta.float64, requires_grad=True)
    tx = torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    (lo, hi), (tlo, thi) = MinAndMax.apply(x), TorchMinAndMax.apply(tx)
    assert not hi.requires_grad and hi.grad_fn is None and not thi.requires_grad
    assert lo.requires_grad and tlo.requires_grad
    node, tnode = lo.grad_fn, tlo.grad_fn
    lo.backward()
    tlo.backward()
    np.testing.assert_array_equal(_host(x.grad), tx.grad.numpy())
    assert node.seen_g_hi.item() == tnode.seen_g_hi.item() == 0.0
    with pytest.raises(RuntimeError, match="does not require grad"):
        thi.backward()
    with pytest.raises(RuntimeError, match="does not require grad"):
        hi.backward()


# ----------------------------------------------------------------------------- materialize
def _two_outputs(lib, materialize: bool):
    class TwoOutputs(lib.autograd.Function):
        """(2x, 3x); backward records what it was given."""

        seen = []

        @staticmethod
        def forward(ctx, x):
            if not materialize:
                ctx.set_materialize_grads(False)
            return x * 2.0, x * 3.0

        @staticmethod
        def backward(ctx, g_a, g_b):
            TwoOutputs.seen.append((g_a, g_b))
            out = None
            for g, k in ((g_a, 2.0), (g_b, 3.0)):
                if g is not None:
                    out = g * k if out is None else out + g * k
            return out

    return TwoOutputs


@pytest.mark.parametrize("materialize", [True, False])
def test_set_materialize_grads_as_torch(torch, materialize):
    Ours, Theirs = _two_outputs(ta, materialize), _two_outputs(torch, materialize)
    x = ta.tensor([1.0, 2.0], dtype=ta.float64, requires_grad=True)
    tx = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    Ours.apply(x)[1].sum().backward()
    Theirs.apply(tx)[1].sum().backward()
    np.testing.assert_array_equal(_host(x.grad), tx.grad.numpy())
    ((g_a, g_b),), ((tg_a, tg_b),) = Ours.seen, Theirs.seen
    np.testing.assert_array_equal(g_b.numpy(), tg_b.numpy())
    if materialize:
        np.testing.assert_array_equal(g_a.numpy(), tg_a.numpy())
        np.testing.assert_array_equal(g_a.numpy(), [0.0, 0.0])
    else:
        assert g_a is None and tg_a is None


def test_set_materialize_grads_is_per_call():
    Lazy, Eager = _two_outputs(ta, False), _two_outputs(ta, True)
    x = ta.tensor([1.0, 2.0], dtype=ta.float64, requires_grad=True)
    Lazy.apply(x)[0].sum().backward()
    Eager.apply(x)[0].sum().backward()
    assert Lazy.seen[0][1] is None
    np.testing.assert_array_equal(Eager.seen[0][1].numpy(), [0.0, 0.0])
    assert Lazy.materialize_grads is True  # the class default is untouched


# ----------------------------------------------------------------------------- op protocol
def _op_classes():
    seen, stack = [], list(ta.Function.__subclasses__())
    while stack:
        cls = stack.pop()
        if cls not in seen:
            seen.append(cls)
            stack.extend(cls.__subclasses__())
    return [c for c in seen if c.__module__.startswith("tinygrad_attn.")]


def test_function_declares_what_the_engine_reads():
    fn = ta.Function
    assert fn.materialize_grads is True
    assert fn.takes_lazy_grads is False
    assert fn.policy is None and fn.saves is None
    with pytest.raises(NotImplementedError):
        fn.recompute(None)


def test_ops_with_a_save_policy_declare_the_whole_of_it():
    with_policy = [c for c in _op_classes() if c.policy is not None]
    # one key per policy; gelu's is shared by gelu and bias_gelu (a gelu of x + bias)
    assert {c.policy for c in with_policy} == set(ta.memory.POLICY_OPS)
    assert sorted(c.__name__ for c in with_policy if c.policy == "gelu") == ["BiasGelu", "Gelu"]
    for cls in with_policy:
        assert set(cls.saves) == {"save", "recompute"}, cls
        assert cls.recompute is not ta.Function.recompute, cls
        assert cls.saved_bytes_formula is not ta.Function.saved_bytes_formula, cls


# ----------------------------------------------------------------------------- returned inputs
def test_an_input_returned_as_is_comes_back_as_a_view_as_torch(torch):
    class PassFirst(ta.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x, y * 2.0

        @staticmethod
        def backward(ctx, gx, gy):
            return gx, gy * 2.0

    class TorchPassFirst(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x, y * 2.0

        @staticmethod
        def backward(ctx, gx, gy):
            return gx, gy * 2.0

    x = ta.tensor(VALUES, dtype=ta.float64, requires_grad=True)
    tx = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True)
    (a, _), (ta_a, _) = PassFirst.apply(x, x), TorchPassFirst.apply(tx, tx)
    assert a is not x and ta_a is not tx
    assert a._base is x and ta_a._base is tx            # a view of the input
    assert x.is_leaf and x.grad_fn is None and tx.is_leaf  # which keeps its own history
    assert a.grad_fn.name == "PassFirstBackward"
    (a * 3.0).sum().backward()
    (ta_a * 3.0).sum().backward()
    np.testing.assert_array_equal(_host(x.grad), tx.grad.numpy())
    # an input that needs no gradient is returned as a view that does, in both
    z, tz = ta.ones(3, dtype=ta.float64), torch.ones(3, dtype=torch.float64)
    (b, _), (tb, _) = PassFirst.apply(z, x), TorchPassFirst.apply(tz, tx)
    assert b.requires_grad == tb.requires_grad is True
    assert not z.requires_grad and not tz.requires_grad
