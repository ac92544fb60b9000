"""Gradcheck rows (float64, finite differences) for the fused transformer nodes: a residual
add with the layer_norm after it (add_layer_norm) and a Linear with its bias (linear), on
contiguous, transposed and sliced inputs, and on the GPU (or the fake CuPy). conftest.py
runs each also as a gradgradcheck row ([d2]); tests/test_registry.py counts them."""

from __future__ import annotations

import pytest
from test_gradcheck_ops import DEVICE, check

import tinygrad_attn.functional as F

VIEWS = ["contiguous", "transposed", "sliced"]

# each row: (function of the inputs, the inputs' shapes); the first input takes the view
ROWS = {
    "add_layer_norm": (lambda x, r, w, b: F.add_layer_norm(x, r, 5, w, b),
                       [(3, 4, 5), (3, 4, 5), (5,), (5,)]),
    # only the normalized output used: the sum gets no gradient (None, not zeros)
    "add_layer_norm_normed_only": (lambda x, r, w: F.add_layer_norm(x, r, (5,), w)[1],
                                   [(3, 4, 5), (3, 4, 5), (5,)]),
    # only the sum used: add's gradient, the norm's parameters get none
    "add_layer_norm_sum_only": (lambda x, r, w: F.add_layer_norm(x, r, 5, w)[0] * 2,
                                [(3, 4, 5), (3, 4, 5), (5,)]),
    # a (T, C) table added to (B, T, C): the kernels' repeating rows; its gradient summed
    "add_layer_norm_broadcast_table": (lambda x, r, b: F.add_layer_norm(x, r, 5, None, b),
                                       [(3, 4, 5), (4, 5), (5,)]),
    "add_layer_norm_broadcast_middle": (lambda x, r: F.add_layer_norm(x, r, (4, 5)),
                                        [(3, 4, 5), (3, 1, 5)]),
    "linear": (lambda x, w, b: F.linear(x, w, b), [(3, 4, 5), (2, 5), (2,)]),
    "linear_2d": (lambda x, w, b: F.linear(x, w, b), [(4, 5), (3, 5), (3,)]),
    "linear_no_bias": (lambda x, w: F.linear(x, w), [(4, 5), (3, 5)]),
    "linear_1d_input": (lambda w, x, b: F.linear(x, w, b), [(3, 5), (5,), (3,)]),
    # the weight strided: a transposed (in, out) leaf seen as (out, in)
    "linear_weight_first": (lambda w, x, b: F.linear(x, w, b), [(3, 5), (2, 4, 5), (3,)]),
}


def _specs(shapes, view):
    return [(shape, view if i == 0 else "contiguous", "real") for i, shape in enumerate(shapes)]


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("op", list(ROWS))
def test_gradcheck(op, view):
    fn, shapes = ROWS[op]
    check(fn, _specs(shapes, view))


@pytest.mark.parametrize("op", list(ROWS))
def test_gradcheck_on_device(gpu_device, op, monkeypatch):
    monkeypatch.setitem(DEVICE, "name", gpu_device)
    fn, shapes = ROWS[op]
    check(fn, _specs(shapes, "transposed"))


TESTS_OF: dict = {}
COVERED = set(ROWS) | set(TESTS_OF)
