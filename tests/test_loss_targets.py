"""Bad class targets and integer dropout, against torch 2.13's exception types.

A class index outside [0, C) that is not the ignore_index is torch's IndexError ("Target
5000 is out of bounds."), on every path that reads class indices (the fused
cross_entropy, the composed one with weights or smoothing or extra dims, nll_loss); the
message names the value and the class count. A float target of another shape than the
input is torch's RuntimeError (ValueError when the batch sizes differ). Dropout of an
integer or bool tensor with 0 < p < 1 is torch's RuntimeError; p = 0, p = 1 and eval mode
keep the dtype.
"""

from __future__ import annotations

import numpy as np
import pytest
from rows_vs_torch import Case, check_case

import nn
import tinygrad_attn as ta

X = np.random.default_rng(0).standard_normal((4, 10))


def F(lib):
    return lib.functional if lib is ta else lib.nn.functional


CLASS_PATHS = {
    "fused": lambda lib, x, t: F(lib).cross_entropy(x, t),
    "fused-none": lambda lib, x, t: F(lib).cross_entropy(x, t, reduction="none"),
    "weight": lambda lib, x, t: F(lib).cross_entropy(x, t, weight=x[0].detach() * 0 + 1),
    "smoothing": lambda lib, x, t: F(lib).cross_entropy(x, t, label_smoothing=0.1),
    "3d": lambda lib, x, t: F(lib).cross_entropy(x.reshape(2, 10, 2), t.reshape(2, 2)),
    "nll": lambda lib, x, t: F(lib).nll_loss(x, t),
    "nll-3d": lambda lib, x, t: F(lib).nll_loss(x.reshape(2, 10, 2), t.reshape(2, 2)),
}


@pytest.mark.parametrize("bad", [5000, -7, 10, -1])
@pytest.mark.parametrize("path", list(CLASS_PATHS))
def test_a_class_index_out_of_range_is_an_index_error_naming_it(mode, path, bad):
    torch = pytest.importorskip("torch")
    t = np.array([1, bad, 2, 3])
    check_case(Case(CLASS_PATHS[path], (X, t), raises=IndexError), torch)
    with pytest.raises(IndexError, match=f"Target {bad} is out of bounds for 10 classes"):
        CLASS_PATHS[path](ta, ta.tensor(X), ta.tensor(t))


def test_the_ignore_index_is_not_out_of_range(mode):
    torch = pytest.importorskip("torch")
    t = np.array([1, 5000, 2, 3])
    check_case(Case(lambda lib, x, t: F(lib).cross_entropy(x, t, ignore_index=5000),
                    (X, t)), torch)


@pytest.mark.parametrize("shape,error", [((4, 9), RuntimeError), ((4,), RuntimeError),
                                         ((3, 10), ValueError), ((4, 10, 1), RuntimeError)])
def test_a_probability_target_of_another_shape_raises_as_torch(shape, error):
    torch = pytest.importorskip("torch")
    t = np.random.default_rng(1).random(shape)
    check_case(Case(lambda lib, x, t: F(lib).cross_entropy(x, t), (X, t), raises=error),
               torch)
    with pytest.raises(error, match="cross_entropy"):
        ta.functional.cross_entropy(ta.tensor(X), ta.tensor(t))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.bool_])
def test_dropout_of_an_integer_tensor_raises_as_torch(dtype):
    torch = pytest.importorskip("torch")
    x = np.ones((3, 4), dtype)
    check_case(Case(lambda lib, x: F(lib).dropout(x, 0.3), (x,), raises=RuntimeError), torch)
    with pytest.raises(RuntimeError, match="dropout"):
        nn.Dropout(0.3)(ta.tensor(x))
    for kw in ({"p": 0.0}, {"p": 1.0}, {"p": 0.3, "training": False}):
        check_case(Case(lambda lib, x, kw=kw: F(lib).dropout(x, **kw), (x,)), torch)
