"""Gradcheck rows (float64, finite differences) for the normalization, convolution and
pooling ops, on contiguous, transposed and sliced inputs, and on the GPU (or the fake
CuPy). tests/test_registry.py counts these rows with the ones of test_gradcheck_ops."""

from __future__ import annotations

import pytest
from test_gradcheck_ops import DEVICE, _t, check

import tinygrad_attn as ta
import tinygrad_attn.functional as F

VIEWS = ["contiguous", "transposed", "sliced"]


def _running(values):
    return _t(values, dtype=ta.float64)


# each row: (function of the inputs, the inputs' (shape, domain)); the first input takes
# the view under test
ROWS = {
    "rms_norm": (lambda x: F.rms_norm(x, (5,)), [(3, 4, 5)]),
    "rms_norm_weight": (lambda x, w: F.rms_norm(x, (4, 5), w, eps=1e-3), [(3, 4, 5), (4, 5)]),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), [(3, 4, 5), (4,), (4,)]),
    "group_norm_plain": (lambda x: F.group_norm(x, 1), [(3, 4, 2, 3)]),
    "batch_norm_train": (lambda x, w, b: F.batch_norm(
        x, _running([0.0] * 4), _running([1.0] * 4), w, b, True, 0.1), [(3, 4, 5), (4,), (4,)]),
    "batch_norm_train_2d": (lambda x: F.batch_norm(x, None, None, training=True),
                            [(3, 4)]),
    "batch_norm_eval": (lambda x, w, b: F.batch_norm(
        x, _running([0.5, -1.0, 0.0, 2.0]), _running([1.5, 0.5, 1.0, 2.0]), w, b, False),
        [(3, 4, 2, 2), (4,), (4,)]),
    "normalize": (lambda x: F.normalize(x), [(3, 4, 5)]),
    "normalize_p1": (lambda x: F.normalize(x, 1.0, dim=-1), [(3, 4)]),
    "conv1d": (lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1, dilation=2),
               [(2, 4, 7), (3, 4, 2), (3,)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, padding=1), [(2, 4, 4, 3), (3, 4, 2, 2), (3,)]),
    "conv2d_strided_groups": (lambda x, w: F.conv2d(x, w, stride=(2, 1), dilation=(1, 2),
                                                    groups=2), [(2, 4, 5, 5), (4, 2, 2, 2)]),
    "conv_transpose1d": (lambda x, w: F.conv_transpose1d(x, w, stride=2, output_padding=1),
                         [(2, 4, 3), (4, 3, 2)]),
    "conv_transpose2d": (lambda x, w, b: F.conv_transpose2d(
        x, w, b, stride=2, padding=1, output_padding=(1, 0), groups=2, dilation=(1, 2)),
        [(2, 4, 3, 3), (4, 1, 3, 2), (2,)]),
    "max_pool1d": (lambda x: F.max_pool1d(x, 3, 2, padding=1, ceil_mode=True), [(2, 3, 6)]),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), [(2, 3, 4, 4)]),
    "max_pool2d_overlapping": (lambda x: F.max_pool2d(x, 3, 2, 1, dilation=(1, 2)),
                               [(2, 3, 5, 6)]),
    "avg_pool1d": (lambda x: F.avg_pool1d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                   [(2, 3, 6)]),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, (3, 2), 2, (1, 0), ceil_mode=True),
                   [(2, 3, 5, 4)]),
    "adaptive_avg_pool1d": (lambda x: F.adaptive_avg_pool1d(x, 4), [(2, 3, 7)]),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, (3, 2)), [(2, 3, 5, 5)]),
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


def _gradient_of(fn):
    """The inputs' gradient of sum(fn(*xs) ** 2 / 2), recorded (create_graph=True):
    gradcheck of it checks fn's second derivative (the d1 row), and the d2 row's
    gradgradcheck checks its third."""
    def gradient(*xs):
        with ta.enable_grad():  # gradcheck's finite differences run under no_grad
            y = fn(*xs)
            return ta.autograd.grad(((y * y) / 2).sum(), xs, create_graph=True)

    return gradient


GRADIENT_ROWS = {  # the window ops' recorded backward (gather, pad, scatter), small shapes
    "conv2d": (lambda x, w: F.conv2d(x, w, stride=2, padding=1), [(1, 2, 3, 3), (2, 2, 2, 2)]),
    "conv_transpose1d": (lambda x, w: F.conv_transpose1d(x, w, stride=2, padding=1),
                         [(1, 2, 3), (2, 1, 3)]),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2, 1, 1), [(1, 2, 3, 3)]),
    "avg_pool1d": (lambda x: F.avg_pool1d(x, 3, 2, 1, count_include_pad=False), [(1, 2, 5)]),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, (2, 1)), [(1, 2, 3, 3)]),
}


@pytest.mark.parametrize("op", list(GRADIENT_ROWS))
def test_gradcheck_of_a_window_ops_gradient(op):
    fn, shapes = GRADIENT_ROWS[op]
    check(_gradient_of(fn), _specs(shapes, "sliced"))


TESTS_OF: dict = {}
COVERED = set(ROWS) | set(TESTS_OF)
