"""The per-call fast paths give what the general paths give.

Each fast path (benchmarks/overhead.py measures what they save) skips work the general
path does only where that work cannot change the result: these tests run both on the
cases where the fast path applies and where it must step aside."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn import backend
from tinygrad_attn import shape as shp
from tinygrad_attn.backend import dtypes
from tinygrad_attn.errors import ShapeError
from tinygrad_attn.ops import elementwise
from tinygrad_attn.storage import wrap_array
from tinygrad_attn.tensor import _make


def _general_binary(op, a, b, floating=False):
    """_binary_arrays' general path, step by step (the fast path must agree with it)."""
    device = elementwise.check_same_device(op, a, b)
    elementwise.broadcast_shape(op, a, b)
    dtype = backend.promote(a, b)
    if floating:
        dtype = backend.floating(dtype)
    return elementwise._in(a, dtype), elementwise._in(b, dtype), backend.xp_for(device), dtype


CASES = [
    ((4, 4), (4, 4), "float32", "float32"),  # same everything: the fast path
    ((4, 4), (4,), "float32", "float32"),  # broadcast, same dtype: fast path, shape check
    ((), (3,), "float64", "float64"),  # a 0-d and a dimensioned tensor of one dtype
    ((2, 3), (2, 3), "int64", "int64"),  # integers (floating=True casts them)
    ((2, 3), (2, 3), "float32", "float64"),  # dtypes differ: the general path
    ((2, 3), (), "float16", "float64"),  # a 0-d float64 does not widen float16
]


@pytest.mark.parametrize("sa,sb,da,db", CASES)
@pytest.mark.parametrize("floating", [False, True])
def test_binary_arrays_fast_path_matches_the_general_one(sa, sb, da, db, floating):
    a = ta.ones(*sa, dtype=da)
    b = ta.ones(*sb, dtype=db)
    A, B, xp, dtype = elementwise._binary_arrays("add", a, b, floating)
    A2, B2, xp2, dtype2 = _general_binary("add", a, b, floating)
    assert dtype is dtype2 and xp is xp2
    for got, want in ((A, A2), (B, B2)):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    if da == db and dtype.name == da:  # no cast: the tensor's own memory, not a copy
        assert np.shares_memory(A, a._array())


def test_binary_fast_path_keeps_the_broadcast_error():
    a, b = ta.ones(4, 3), ta.ones(4, 2)
    with pytest.raises(ShapeError, match="cannot be broadcast"):
        a + b


def test_promote_matches_torch_rules_on_the_short_path():
    f16, f32, f64, i8, i64 = (backend.float16, backend.float32, backend.float64,
                              backend.int8, backend.int64)
    t = {name: ta.ones(2, dtype=name) for name in ("float16", "float32", "int8")}
    z = {name: ta.tensor(1, dtype=name) for name in ("float64", "int64", "float32")}
    assert backend.promote(t["float32"], t["float32"]) is f32
    assert backend.promote(t["float32"], z["float32"]) is f32
    assert backend.promote(t["float16"], z["float64"]) is f16
    assert backend.promote(t["int8"], z["int64"]) is i8
    assert backend.promote(t["int8"], 0.5) is backend.get_default_dtype()
    assert backend.promote(z["int64"], z["float64"]) is f64
    assert backend.promote(t["int8"], t["float16"]) is f16
    assert backend.promote(z["int64"], 3) is i64


@pytest.mark.parametrize("make", [
    lambda: np.ones((4, 4), np.float32),
    lambda: np.ones((3, 1), np.float64),
    lambda: np.ones((1, 5), np.int64)[:, :],
    lambda: np.ones(5, np.float32)[None],  # a size-1 dim with stride 0, C-contiguous
    lambda: np.ones((0, 3), np.float32),  # empty: contiguous strides, as torch
    lambda: np.ones((), np.float32),
    lambda: np.ones((3, 4), np.float32).T,  # F-ordered: the general path
    lambda: np.ones((3, 4), np.float32)[:, ::2],  # not dense: copied
])
def test_wrap_array_fast_path_matches_the_general_one(make):
    arr = make()
    storage, shape, strides, offset = wrap_array(arr)
    # the general path's answer, written out
    if arr.flags.c_contiguous:
        want = tuple(s // arr.itemsize for s in arr.strides)
    else:
        flat = backend.flat_buffer(arr)
        want = flat[1] if flat is not None else None
    if arr.size == 0:
        want = shp.contiguous_strides(arr.shape)
    assert shape == arr.shape and offset == 0
    if want is not None:
        assert strides == want
    assert storage.dtype is backend.dtype_of(arr)
    assert storage.device == backend.device_of(arr)
    assert storage.buffer.ndim == 1 and storage.nbytes == arr.nbytes
    t = _make(storage, shape, strides, 0)  # a tensor over it reads the same values
    np.testing.assert_array_equal(t._array(), arr)


def test_ops_stay_silent_and_leave_numpy_settings_alone():
    x = ta.tensor([0.0, 1.0, -1.0], requires_grad=True)
    before = np.geterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a NumPy RuntimeWarning would raise here
        y = (x.log() / x).sum()
        y.backward()
    assert np.geterr() == before
    with np.errstate(all="raise"):  # the user's settings: ops override them, then restore
        (x.log() * 2).sum()
        with pytest.raises(FloatingPointError):
            np.log(np.zeros(1))
    assert np.geterr() == before


def test_quiet_fp_errors_nests_and_follows_the_user_settings():
    with np.errstate(divide="raise"):
        outer = dtypes.quiet_fp_errors()
        assert np.geterr()["divide"] == "ignore"
        inner = dtypes.quiet_fp_errors()  # already quiet: nothing to undo
        assert inner is None
        dtypes.restore_fp_errors(inner)
        assert np.geterr()["divide"] == "ignore"
        dtypes.restore_fp_errors(outer)
        assert np.geterr()["divide"] == "raise"
    with np.errstate(over="warn", under="ignore"):  # settings change: quiet follows them
        token = dtypes.quiet_fp_errors()
        assert set(np.geterr().values()) == {"ignore"}
        dtypes.restore_fp_errors(token)
        assert np.geterr()["over"] == "warn"


def test_leaf_grad_taken_without_the_setter_is_what_the_setter_checks():
    a = ta.randn(3, 2, requires_grad=True)
    (a * 2).sum().backward()
    assert a.grad.shape == a.shape and a.grad.dtype is a.dtype
    assert a.grad._storage.category == "gradient"
    np.testing.assert_allclose(a.grad.numpy(), 2.0)
    seed = ta.ones(3, 2)
    ta.autograd.backward([a + 0], [seed])  # a second backward adds in place
    np.testing.assert_allclose(a.grad.numpy(), 3.0)
    assert not a.grad.shares_storage(seed)


def test_backward_names_are_made_once_per_op():
    a = ta.randn(2, requires_grad=True)
    y, z = a.exp(), (a * 3).exp()
    assert y.grad_fn.name == "ExpBackward" and z.grad_fn.name == "ExpBackward"
    assert y.grad_fn.name is z.grad_fn.name
