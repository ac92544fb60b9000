"""ta.checkpoint holds its tensor arguments only through save_for_backward: the ledger sees
them as saved, and they are freed when the checkpoint node is released after its backward."""

from __future__ import annotations

import gc
import weakref

import numpy as np

import tinygrad_attn as ta


def _host(t):
    return t.detach().numpy()


def test_checkpoint_input_is_freed_when_its_node_is_released():
    w = ta.randn(4, 4, dtype=ta.float64, requires_grad=True)
    x = ta.randn(3, 4, dtype=ta.float64, requires_grad=True)

    def block(t):
        return (t @ w).tanh()

    h = x * 2.0  # the block's input: an intermediate nothing but the checkpoint keeps
    y = ta.checkpoint(block, h)
    node = y.grad_fn
    (kept,) = node.saved_tensor_list()  # the ledger sees it as saved for backward
    assert kept.untyped_storage() is h.untyped_storage()
    storage = weakref.ref(h.untyped_storage())
    del h, kept
    assert storage() is not None
    gc.disable()
    try:
        y.sum().backward()
        assert storage() is None  # released with the node's saved tensors, at once
    finally:
        gc.enable()
    assert y.grad_fn is node and node._saved is None  # the node itself is still alive
    # the gradients are the plain call's
    gw, gx = w.grad, x.grad
    w.grad = x.grad = None
    block(x * 2.0).sum().backward()
    np.testing.assert_array_equal(_host(gw), _host(w.grad))
    np.testing.assert_array_equal(_host(gx), _host(x.grad))


def test_checkpoint_keeps_non_tensor_arguments():
    x = ta.randn(3, 4, dtype=ta.float64, requires_grad=True)

    def block(t, scale, shift):
        return (t * scale + shift).tanh()

    y = ta.checkpoint(block, x, 0.5, 2.0)
    y.sum().backward()
    expected = 0.5 * (1.0 - np.tanh(_host(x) * 0.5 + 2.0) ** 2)
    np.testing.assert_allclose(_host(x.grad), expected, rtol=1e-12)
