"""Bad input gets a clear exception whose message names the op and the shapes involved."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tinygrad_attn as ta


def esc(*parts) -> str:
    """A regex matching the parts in order, anything in between."""
    return "(?s)" + ".*".join(re.escape(str(p)) for p in parts)


def on_fake_cuda(t):
    """A detached copy of t that claims to live on cuda:0 (no GPU needed: the device check
    compares the `device` attribute)."""
    d = t.detach()
    d.device = "cuda:0"
    return d


# ----------------------------------------------------------------------------- shapes
def test_matmul_inner_size_mismatch():
    a, b = ta.randn(2, 3), ta.randn(4, 5)
    with pytest.raises(ta.ShapeError, match=esc("matmul", "(2, 3)", "(4, 5)", "3", "4")):
        a @ b
    with pytest.raises(ta.ShapeError, match=esc("matmul", "(2, 3)", "(4, 5)")):
        ta.matmul(a, b)
    with pytest.raises(ta.ShapeError, match=esc("matmul", "(2, 5, 3)", "(4, 5)")):
        ta.randn(2, 5, 3) @ b


def test_matmul_1d_mismatch_names_the_given_shapes():
    # the message must show the shapes the caller passed, not the internally promoted ones
    with pytest.raises(ta.ShapeError, match=esc("matmul", "(3,)", "(4,)")):
        ta.randn(3) @ ta.randn(4)
    with pytest.raises(ta.ShapeError, match=esc("matmul", "(2, 3)", "(4,)")):
        ta.randn(2, 3) @ ta.randn(4)


def test_matmul_batch_mismatch_names_both_shapes():
    with pytest.raises(ta.ShapeError, match=esc("matmul", "(2, 3, 4)", "(3, 4, 5)")):
        ta.randn(2, 3, 4) @ ta.randn(3, 4, 5)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_broadcast_mismatch(op):
    a, b = ta.randn(2, 3), ta.randn(3, 2)
    fn = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
          "div": lambda: a / b}[op]
    with pytest.raises(ta.ShapeError, match=esc(op, "(2, 3)", "(3, 2)", "broadcast")):
        fn()


def test_broadcast_mismatch_trailing_dim():
    with pytest.raises(ta.ShapeError, match=esc("add", "(2, 3)", "(4,)", "3 vs 4")):
        ta.randn(2, 3) + ta.randn(4)
    with pytest.raises(ta.ShapeError, match=esc("mul", "(4,)", "(2, 3)")):
        ta.randn(4) * ta.randn(2, 3)


@pytest.mark.parametrize(
    "op, call",
    [
        ("sum", lambda t: t.sum(2)),
        ("sum", lambda t: t.sum((0, -3))),
        ("mean", lambda t: t.mean(-3)),
        ("softmax", lambda t: t.softmax(2)),
        ("softmax", lambda t: ta.softmax(t, -3)),
        ("log_softmax", lambda t: t.log_softmax(5)),
        ("transpose", lambda t: t.transpose(0, 2)),
        ("transpose", lambda t: t.transpose(-3, 1)),
        ("max", lambda t: t.max(3)),
        ("unsqueeze", lambda t: t.unsqueeze(4)),
    ],
)
def test_dim_out_of_range(op, call):
    with pytest.raises(IndexError, match=esc(op, "dimension out of range", "2 dims")):
        call(ta.randn(2, 3))


def test_bad_view_shape():
    x = ta.randn(2, 3)
    with pytest.raises(ta.ShapeError, match=esc("view", "(4, 4)", "size 6")):
        x.view(4, 4)
    with pytest.raises(ta.ShapeError, match=esc("view", "only one dimension can be inferred")):
        x.view(-1, -1)
    with pytest.raises(ta.ShapeError, match=esc("view", "(4, 3, 2)", "reshape", "contiguous")):
        ta.randn(2, 3, 4).transpose(0, 2).view(6, 4)


def test_reshape_wrong_numel():
    x = ta.randn(2, 3)
    with pytest.raises(ta.ShapeError, match=esc("reshape", "(7,)", "size 6")):
        x.reshape(7)
    with pytest.raises(ta.ShapeError, match=esc("reshape", "(-1, 4)", "size 6")):
        x.reshape(-1, 4)


def test_expand_non_singleton_dim():
    x = ta.randn(2, 3)
    with pytest.raises(ta.ShapeError, match=esc("expand", "4", "2", "dim 0", "(2, 3)", "(4, 3)")):
        x.expand(4, 3)
    with pytest.raises(ta.ShapeError, match=esc("expand", "(2, 3)", "(5, 2, 5)")):
        x.broadcast_to((5, 2, 5))
    with pytest.raises(ta.ShapeError, match=esc("expand", "(2, 3)", "(3,)")):
        x.expand(3)


def test_cat_mismatched_shapes():
    with pytest.raises(ta.ShapeError, match=esc("cat", "(2, 3)", "(2, 4)")):
        ta.cat([ta.randn(2, 3), ta.randn(2, 4)])
    with pytest.raises(ta.ShapeError, match=esc("cat", "(2, 3)", "(2,)")):
        ta.cat([ta.randn(2, 3), ta.randn(2)], dim=1)
    with pytest.raises(ta.ShapeError, match=esc("stack", "(2, 3)", "(3, 2)")):
        ta.stack([ta.randn(2, 3), ta.randn(3, 2)])
    # along the mismatching dim itself the cat is fine
    assert ta.cat([ta.randn(2, 3), ta.randn(2, 4)], dim=1).shape == (2, 7)


# ----------------------------------------------------------------------------- devices
def test_device_mismatch():
    a = ta.randn(2, 3)
    c = on_fake_cuda(ta.randn(2, 3))
    assert c.device == "cuda:0" and a.device == "cpu"
    with pytest.raises(ta.DeviceMismatchError, match=esc("add", "(2, 3) on cpu", "cuda:0")):
        a + c
    with pytest.raises(ta.DeviceMismatchError, match=esc("mul", "cuda:0", "cpu")):
        c * a
    with pytest.raises(ta.DeviceMismatchError, match=esc("matmul", "(2, 3) on cpu", "(3, 4)",
                                                         "cuda:0")):
        a @ on_fake_cuda(ta.randn(3, 4))
    with pytest.raises(ta.DeviceMismatchError, match=esc("cat", "cpu", "cuda:0")):
        ta.cat([a, c])
    assert issubclass(ta.DeviceMismatchError, RuntimeError)


def test_device_mismatch_of_backward_gradient():
    x = ta.randn(2, requires_grad=True)
    y = x * 2.0
    with pytest.raises(ta.DeviceMismatchError, match=esc("backward", "cuda:0", "cpu")):
        y.backward(on_fake_cuda(ta.ones(2)))


# ----------------------------------------------------------------------------- autograd
def test_backward_on_non_scalar_without_gradient():
    x = ta.randn(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match=esc("backward", "one element", "(2, 3)")):
        (x * 2.0).backward()
    assert x.grad is None


def test_backward_with_wrong_gradient_shape():
    x = ta.randn(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match=esc("backward", "(3,)", "(2, 3)")):
        (x * 2.0).backward(ta.ones(3))


def test_backward_on_tensor_without_grad():
    with pytest.raises(RuntimeError, match=esc("backward", "()", "does not require grad")):
        ta.randn(2, 3).sum().backward()


@pytest.mark.parametrize(
    "make, dtype",
    [
        (lambda: ta.tensor([1, 2], requires_grad=True), "int64"),
        (lambda: ta.zeros(2, 2, dtype=ta.int32, requires_grad=True), "int32"),
        (lambda: ta.tensor([True, False], requires_grad=True), "bool"),
        (lambda: ta.arange(3).requires_grad_(), "int64"),
    ],
)
def test_requires_grad_on_integer_tensors(make, dtype):
    with pytest.raises(RuntimeError, match=esc("requires_grad", "floating point", dtype)):
        make()


def test_backward_twice_without_retain_graph():
    x = ta.randn(3, requires_grad=True)
    y = x.exp().sum()
    y.backward()
    with pytest.raises(RuntimeError, match=esc("Backward", "second time", "retain_graph=True")):
        y.backward()


def test_saved_tensor_modified_in_place():
    x = ta.randn(2, 3, requires_grad=True)
    y = (x * 2.0).softmax(-1)
    y.add_(1.0)
    with pytest.raises(RuntimeError, match=esc("SoftmaxBackward", "in-place", "(2, 3)",
                                               "version 1", "expected version 0")):
        y.sum().backward()


def test_inplace_on_leaf_requiring_grad():
    x = ta.randn(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match=esc("mul_", "leaf", "(2, 3)", "no_grad")):
        x.mul_(2.0)


def test_autograd_grad_unused_input():
    x, z = ta.randn(2, requires_grad=True), ta.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=esc("grad", "input 1", "(3,)", "allow_unused")):
        ta.autograd.grad((x * x).sum(), [x, z])


# ----------------------------------------------------------------------------- values, indices
def test_item_on_multi_element_tensor():
    with pytest.raises(ValueError, match=esc("item()", "one element", "(2, 3)")):
        ta.randn(2, 3).item()
    assert ta.tensor([4.5]).item() == 4.5
    with pytest.raises(RuntimeError, match=esc("bool()", "(2,)", "ambiguous")):
        bool(ta.randn(2))


@pytest.mark.parametrize(
    "index, parts",
    [
        (2, ("index 2", "out of bounds", "dim 0", "size 2", "(2, 3)")),
        (-3, ("index -3", "out of bounds", "dim 0", "size 2")),
        ((0, 3), ("index 3", "out of bounds", "dim 1", "size 3", "(2, 3)")),
        ((0, 0, 0), ("too many indices", "(2, 3)")),
    ],
)
def test_index_out_of_bounds(index, parts):
    x = ta.randn(2, 3)
    with pytest.raises(IndexError, match=esc("getitem", *parts)):
        x[index]


def test_advanced_index_out_of_bounds():
    x = ta.randn(2, 3)
    with pytest.raises(IndexError, match=esc("index", "5", "out of bounds", "(2, 3)")):
        x[ta.tensor([0, 5])]
    with pytest.raises(IndexError, match=esc("index_select", "index 3", "dim 0", "size 2",
                                             "(2, 3)")):
        x.index_select(0, ta.tensor([3]))


def test_narrow_out_of_range():
    # torch's types: a start outside the dim is an IndexError, a length past its end a
    # RuntimeError
    with pytest.raises(RuntimeError, match=esc("narrow", "start 2", "length 3", "size 3",
                                               "(2, 3)")):
        ta.randn(2, 3).narrow(1, 2, 3)
    with pytest.raises(IndexError, match=esc("narrow", "start 4", "size 3", "(2, 3)")):
        ta.randn(2, 3).narrow(1, 4, 0)


def test_negative_slice_step():
    with pytest.raises(ValueError, match=esc("getitem", "step must be positive", "-1")):
        ta.randn(2, 3)[::-1]


# ----------------------------------------------------------------------------- gradcheck
def test_gradcheck_bad_input_dtype():
    x32 = ta.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match=esc("gradcheck", "input 0", "float32", "float64")):
        ta.gradcheck(lambda t: t * 2.0, [x32])
    x64 = ta.randn(3, dtype=ta.float64)
    with pytest.raises(ValueError, match=esc("gradcheck", "no input requires grad")):
        ta.gradcheck(lambda t: t * 2.0, [x64])
    assert ta.gradcheck(lambda t: t * 2.0, [x64.requires_grad_()])


def test_gradcheck_error_is_an_assertion_error_with_report():
    class Twice(ta.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            return g * 3.0

    x = ta.tensor(np.ones(3), dtype=ta.float64, requires_grad=True)
    with pytest.raises(ta.GradcheckError, match=esc("3 of 9 Jacobian entries differ",
                                                     "analytical +3", "numerical +2")):
        ta.gradcheck(Twice.apply, [x])
    assert issubclass(ta.GradcheckError, AssertionError)


def test_custom_backward_with_wrong_gradient_shape():
    class Bad(ta.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.sum()

        @staticmethod
        def backward(ctx, g):
            return g  # should be broadcast back to x's shape

    x = ta.randn(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match=esc("BadBackward", "()", "input 0", "(2, 3)")):
        Bad.apply(x).backward()
