"""In-place writes and memory overlap, as torch 2.13 decides them.

A target with internal overlap (a stride-0 dim of size > 1) is refused by every in-place
write but fill_/zero_ (masked_fill_ and an advanced-index setitem only warn); an operand
that partly overlaps the target is refused; the same memory in the same order is fine.
Each row runs the same program in both libraries and compares the outcome.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.shape import (
    has_internal_overlap,
    is_non_overlapping_and_dense,
    overlap_status,
)


def _expanded(lib):
    return lib.zeros(1).expand(3)


def _ar(lib, n=5):
    return lib.arange(float(n))


WRITES = {
    # internal overlap of the target
    "add_": lambda lib: _expanded(lib).add_(1),
    "sub_": lambda lib: _expanded(lib).sub_(1, alpha=2),
    "mul_": lambda lib: _expanded(lib).mul_(2),
    "div_": lambda lib: _expanded(lib).div_(2),
    "clamp_": lambda lib: _expanded(lib).clamp_(0, 1),
    "copy_": lambda lib: _expanded(lib).copy_(lib.arange(3.0)),
    "copy_ 0-d": lambda lib: _expanded(lib).copy_(lib.tensor(1.0)),
    "2-d expand": lambda lib: lib.zeros(3, 1).expand(3, 4).add_(1),
    "int expand": lambda lib: lib.zeros(1, dtype=lib.int64).expand(3).add_(1),
    "setitem [:]": lambda lib: _expanded(lib).__setitem__(slice(None), 1.0),
    "setitem [:] tensor": lambda lib: _expanded(lib).__setitem__(slice(None), lib.ones(3)),
    "setitem [0]": lambda lib: _expanded(lib).__setitem__(0, 1.0),
    "setitem advanced": lambda lib: _expanded(lib).__setitem__(lib.tensor([0, 1]), 1.0),
    "fill_": lambda lib: _expanded(lib).fill_(1),
    "zero_": lambda lib: _expanded(lib).zero_(),
    "masked_fill_": lambda lib: _expanded(lib).masked_fill_(lib.tensor([True, False, True]),
                                                          1.0),
    "size-1 stride-0": lambda lib: lib.zeros(1).as_strided((1,), (0,)).add_(1),
    # too hard for torch's check: it runs (the values written depend on the kernel's order)
    "as_strided window": lambda lib: [lib.zeros(4).as_strided((3, 2), (1, 1)).add_(1)] and None,
    # partial overlap between an operand and the target
    "copy_ shifted": lambda lib: (lambda x: x[1:].copy_(x[:-1]))(_ar(lib)),
    "add_ shifted": lambda lib: (lambda x: x[1:].add_(x[:-1]))(_ar(lib)),
    "mul_ shifted": lambda lib: (lambda x: x[:-1].mul_(x[1:]))(_ar(lib)),
    "sub_ shifted": lambda lib: (lambda x: x[:-1].sub_(x[1:], alpha=2))(_ar(lib)),
    "clamp_ shifted": lambda lib: (lambda x: x[1:].clamp_(x[:-1]))(_ar(lib)),
    "add_ self": lambda lib: (lambda x: x.add_(x))(_ar(lib)),
    "copy_ self": lambda lib: (lambda x: x.copy_(x))(_ar(lib)),
    "copy_ transposed": lambda lib: (lambda x: x.copy_(x.transpose(0, 1)))(
        _ar(lib, 4).view(2, 2)),
    "copy_ strided": lambda lib: (lambda x: x[::2].copy_(x[1::2]))(_ar(lib, 6)),
    "copy_ strided over": lambda lib: (lambda x: x[0:4:2].copy_(x[2:6:2]))(_ar(lib, 6)),
    "copy_ disjoint": lambda lib: (lambda x: x[:2].copy_(x[3:]))(_ar(lib)),
    "copy_ expanded src": lambda lib: (lambda x: x.copy_(x[:1].expand(5)))(_ar(lib)),
    "add_ own element": lambda lib: (lambda x: x.add_(x[0]))(_ar(lib)),
    "add_ other element": lambda lib: (lambda x: x[1:].add_(x[0]))(_ar(lib)),
    "add_ own row": lambda lib: (lambda x: x.add_(x[:1]))(_ar(lib)),
    "setitem shifted": lambda lib: (lambda x: x.__setitem__(slice(1, None), x[:-1]))(_ar(lib)),
    "setitem same": lambda lib: (lambda x: x.__setitem__(slice(None), x))(_ar(lib)),
    "setitem advanced shifted": lambda lib: (
        lambda x: x.__setitem__(lib.tensor([1, 2]), x[:2]))(_ar(lib)),
    "setitem advanced same": lambda lib: (
        lambda x: x.__setitem__(lib.tensor([0, 1, 2, 3, 4]), x))(_ar(lib)),
    "setitem mask shifted": lambda lib: (lambda x: x.__setitem__(
        lib.tensor([False, True, True, False, False]), x[:2]))(_ar(lib)),
    "masked_fill_ value": lambda lib: (lambda x: x.masked_fill_(x > 2, x[0]))(_ar(lib)),
}


def _outcome(lib, fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = fn(lib)
        except Exception as e:  # noqa: BLE001 - the type is what is compared
            return type(e), str(e)
    return None, None if out is None else np.asarray(out.tolist())


@pytest.mark.parametrize("name", list(WRITES))
def test_overlap_matches_torch(name):
    torch = pytest.importorskip("torch")
    want_err, want = _outcome(torch, WRITES[name])
    got_err, got = _outcome(ta, WRITES[name])
    if want_err is not None:
        assert got_err is not None and issubclass(got_err, want_err), (name, got_err, got)
        assert "unsupported operation" in got
    else:
        assert got_err is None, (name, got)
        if want is not None:
            np.testing.assert_array_equal(got, want)


def test_messages_name_the_op_and_shape():
    with pytest.raises(RuntimeError, match=r"add_: unsupported operation: more than one .*"
                       r"clone\(\).*shape \(3,\)"):
        ta.zeros(1).expand(3).add_(1)
    x = ta.arange(5.0)
    with pytest.raises(RuntimeError, match=r"copy_: unsupported operation: some elements"):
        x[1:].copy_(x[:-1])


def test_warnings_where_torch_only_warns():
    with pytest.warns(UserWarning, match="masked_fill_"):
        ta.zeros(1).expand(3).masked_fill_(ta.tensor([True, False, True]), 1.0)
    with pytest.warns(UserWarning, match="index_put_"):
        ta.zeros(1).expand(3)[ta.tensor([0])] = 1.0


def test_rejected_write_leaves_the_target_untouched():
    base = ta.zeros(1)
    with pytest.raises(RuntimeError):
        base.expand(3).add_(1)
    assert base.tolist() == [0.0] and base._version == 0


def test_geometry_helpers():
    assert has_internal_overlap((3,), (0,))
    assert not has_internal_overlap((1,), (0,))
    assert not has_internal_overlap((0, 3), (0, 0))
    assert not has_internal_overlap((3, 2), (1, 1))  # too hard for torch: allowed
    assert is_non_overlapping_and_dense((2, 3), (1, 2))
    assert not is_non_overlapping_and_dense((2, 3), (6, 2))
    assert is_non_overlapping_and_dense((2, 1), (1, 7))
    assert overlap_status(((4,), (1,), 0), ((4,), (1,), 0)) == "full"
    assert overlap_status(((2, 2), (2, 1), 0), ((2, 2), (1, 2), 0)) == "partial"
    assert overlap_status(((4,), (1,), 1), ((4,), (1,), 0)) == "partial"
    assert overlap_status(((2,), (1,), 0), ((2,), (1,), 2)) == "no"
    assert overlap_status(((2,), (2,), 0), ((2,), (2,), 1)) == "no"  # not dense: too hard
