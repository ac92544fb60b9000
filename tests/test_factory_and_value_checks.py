"""Sizes and stored values checked at the call, against torch 2.13.

A factory given a negative size raises RuntimeError naming it (it was a ValueError), and one
whose shape no array can address raises before allocating; `expand()` with no sizes is a
TypeError; a Python number stored by `masked_fill` or `where` must fit the result's dtype
(it raised NumPy's OverflowError, or wrapped 300 to 44 in int8 silently).
"""

from __future__ import annotations

import numpy as np
import pytest
from rows_vs_torch import DIFFERENCES, Case, check_case

import tinygrad_attn as ta

I8 = np.zeros(3, dtype=np.int8)
U8 = np.zeros(3, dtype=np.uint8)
MASK = np.array([True, False, True])


def _factory(name, *args):
    return lambda lib, x: getattr(lib, name)(*args)


def _where(a, b):
    def fn(lib, x, m):
        args = [x if v is None else v for v in (a, b)]
        return lib.where(m, *args)
    return fn


CHECKS = {
    # a negative size: torch's RuntimeError, for every factory
    "zeros(-1)": Case(_factory("zeros", -1), (I8,), raises=RuntimeError),
    "ones(2, -3)": Case(_factory("ones", 2, -3), (I8,), raises=RuntimeError),
    "empty(-2)": Case(_factory("empty", -2), (I8,), raises=RuntimeError),
    "full((-1,), 2.0)": Case(_factory("full", (-1,), 2.0), (I8,), raises=RuntimeError),
    "randn(2, -1)": Case(_factory("randn", 2, -1), (I8,), raises=RuntimeError),
    "rand([-4])": Case(_factory("rand", [-4]), (I8,), raises=RuntimeError),
    # more bytes than an address space holds: torch's RuntimeError too
    "zeros(2**40, 2**40)": Case(_factory("zeros", 2**40, 2**40), (I8,), raises=RuntimeError),
    "zeros(0, 3)": Case(_factory("zeros", 0, 3), (I8,)),
    "expand()": Case(lambda lib, x: x.expand(), (np.ones(2),), raises=TypeError),
    "expand(()) 0-d": Case(lambda lib, x: x.expand(()), (np.array(2.0),)),
    # stored values must fit the dtype they are stored in
    "masked_fill int8 300": Case(lambda lib, x, m: x.masked_fill(m, 300), (I8, MASK),
                                 raises=RuntimeError),
    "masked_fill int8 -129": Case(lambda lib, x, m: x.masked_fill(m, -129), (I8, MASK),
                                  raises=RuntimeError),
    "masked_fill int8 1.5": Case(lambda lib, x, m: x.masked_fill(m, 1.5), (I8, MASK)),
    "masked_fill uint8 -1": Case(lambda lib, x, m: x.masked_fill(m, -1), (U8, MASK)),
    "masked_fill float -inf": Case(lambda lib, x, m: x.masked_fill(m, float("-inf")),
                                   (np.arange(3.0), MASK)),
    "where int8 300 right": Case(_where(None, 300), (I8, MASK), raises=RuntimeError),
    "where int8 300 left": Case(_where(300, None), (I8, MASK), raises=RuntimeError),
    "where int8 -129": Case(_where(None, -129), (I8, MASK), raises=RuntimeError),
    "where int8 1.5 promotes": Case(_where(None, 1.5), (I8, MASK)),
    "where uint8 -1": Case(_where(None, -1), (U8, MASK)),
    "where int64 2**40": Case(_where(None, 2**40), (np.zeros(3, dtype=np.int64), MASK)),
}


@pytest.mark.parametrize("name", list(CHECKS))
def test_matches_torch(name):
    torch = pytest.importorskip("torch")
    check_case(CHECKS[name], torch)


def test_messages_name_the_op_and_the_size():
    with pytest.raises(RuntimeError, match=r"zeros: .*negative dimension: \[2, -1\]"):
        ta.zeros(2, -1)
    with pytest.raises(ta.ShapeError, match=r"ones: size \(1099511627776, 1099511627776\)"):
        ta.ones(2**40, 2**40)
    with pytest.raises(RuntimeError, match="masked_fill: value 300 cannot be converted to "
                                           "type int8"):
        ta.zeros(3, dtype=ta.int8).masked_fill(ta.tensor([True, False, True]), 300)


def test_an_empty_shape_past_the_address_space_is_a_listed_difference():
    # torch makes zeros(0, 2**62) (no bytes); NumPy cannot hold the shape, so it is refused
    assert "views" in DIFFERENCES
    with pytest.raises(ta.ShapeError, match="zeros: size"):
        ta.zeros(0, 2**62)
