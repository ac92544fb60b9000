"""`t.grad = g` is checked at the assignment, as torch checks it: a Tensor (or None) of t's
shape, dtype and device, and not t itself. A wrong .grad used to be accepted and then broadcast
by the optimizer, or fail in backward with a bare NumPy broadcast error."""

from __future__ import annotations

import pytest

import nn
import tinygrad_attn as ta

VALUES = {
    "ones(1)": lambda lib: lib.ones(1),
    "ones(3, 1)": lambda lib: lib.ones(3, 1),
    "float64": lambda lib: lib.ones(3, dtype=lib.float64),
    "int64": lambda lib: lib.ones(3, dtype=lib.int64),
    "list": lambda lib: [1.0, 2.0, 3.0],
    "float": lambda lib: 1.0,
    "None": lambda lib: None,
    "expanded": lambda lib: lib.ones(1).expand(3),
    "requires grad": lambda lib: lib.ones(3, requires_grad=True),
    "right": lambda lib: lib.ones(3),
}


def _assign(lib, name, leaf=True):
    w = lib.zeros(3, requires_grad=True)
    if not leaf:
        w = w * 2
    try:
        w.grad = VALUES[name](lib)
    except Exception as e:  # noqa: BLE001 - the type is compared
        return type(e)
    return None


@pytest.mark.parametrize("leaf", [True, False])
@pytest.mark.parametrize("name", list(VALUES))
def test_grad_assignment_matches_torch(name, leaf):
    torch = pytest.importorskip("torch")
    assert _assign(ta, name, leaf) is _assign(torch, name, leaf)


def test_own_grad_and_messages():
    w = ta.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="its own grad"):
        w.grad = w
    with pytest.raises(RuntimeError, match=r"gradient of size \[1\] to a tensor of size \[3\]"):
        w.grad = ta.ones(1)
    with pytest.raises(TypeError, match="Tensor or None but got grad of type list"):
        w.grad = [1.0]
    w.grad = ta.ones(3)
    del w.grad
    assert w.grad is None


def test_integer_tensor_takes_its_own_dtype():
    i = ta.zeros(3, dtype=ta.int64)
    i.grad = ta.ones(3, dtype=ta.int64)
    with pytest.raises(RuntimeError, match="dtype"):
        i.grad = ta.ones(3)


def test_backward_and_optimizer_still_fill_grad():
    lin = nn.Linear(3, 2)
    opt = nn.optim.SGD(lin.parameters(), lr=0.1)
    lin(ta.ones(4, 3)).sum().backward()
    assert lin.weight.grad.shape == (2, 3)
    lin(ta.ones(4, 3)).sum().backward()  # accumulates into the existing .grad
    before = lin.bias.tolist()
    opt.step()
    assert lin.bias.tolist() == pytest.approx([b - 0.1 * 8 for b in before])
    opt.zero_grad()
    assert lin.weight.grad is None


def test_backward_into_an_assigned_expanded_grad_refuses_as_torch():
    """torch accepts an expanded .grad; accumulating into it would sum three gradients into
    one memory cell ([3, 3, 3] for [1, 2, 3]), so backward raises torch's overlap error."""
    torch = pytest.importorskip("torch")
    for lib in (ta, torch):
        w = lib.zeros(3, requires_grad=True)
        w.grad = lib.zeros(1).expand(3)
        with pytest.raises(RuntimeError, match="more than one element of the written-to"):
            (w * lib.tensor([1.0, 2.0, 3.0])).sum().backward()
    w = ta.zeros(3, requires_grad=True)
    w.grad = ta.zeros(3)  # a dense one still accumulates
    (w * ta.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert w.grad.tolist() == [1.0, 2.0, 3.0]
