"""ops/math.py, rounding.py, binary_math.py and logical.py against torch: values, dtypes,
shapes, gradients and errors, one row each.

ROWS is the table a conformance check reads; every case runs on 0-d, empty, broadcast or
non-contiguous inputs (a transposed or sliced view, or an expanded leaf) in each dtype the
op accepts. Inputs are built by tests/rows_vs_torch.py with the same values on both sides.
"""

from __future__ import annotations

import pytest
from rows_vs_torch import Call, T, cases, run_case

import tinygrad_attn as ta

F32, F64, F16, I64, I32, B = "float32", "float64", "float16", "int64", "int32", "bool"


def _unary(domain="real", dtypes=(F32, F64, F16, I64, B), rtol=None):
    """A unary op's rows: each dtype, 0-d, empty, transposed, sliced and expanded inputs."""
    rows = [Call((T((3, 4), d, domain=domain),), rtol=rtol) for d in dtypes]
    rows += [Call((T((), F64, domain=domain),)), Call((T((0, 3), F32, domain=domain),)),
             Call((T((3, 4), F64, "t", domain),)), Call((T((2, 6), F32, "s", domain),)),
             Call((T((3, 4), F64, "e", domain),)), Call((T((2, 3), F64, domain=domain),),
                                                         where="method")]
    return rows


def _binary(da="real", db="real", dtypes=(F32, F64), scalar=True, where="torch"):
    rows = [Call((T((3, 4), d, domain=da), T((3, 4), d, domain=db))) for d in dtypes]
    if scalar:  # torch takes a Python number here
        rows.append(Call((T((2, 3), F32, domain=da), 1.5)))
        rows.append(Call((T((2, 3), I64, domain=da), 2)))
    rows += [
        Call((T((3, 4), F64, "t", da), T((4,), F64, domain=db))),  # broadcast, transposed
        Call((T((2, 6), F32, "s", da), T((2, 1), F32, domain=db))),
        Call((T((), F64, domain=da), T((2, 3), F64, domain=db))),  # 0-d with a matrix
        Call((T((0, 3), F32, domain=da), T((3,), F32, domain=db))),  # empty
        Call((T((2, 3), F32, domain=da), T((2, 3), F64, domain=db))),  # promotion
        Call((T((2, 3), F64, domain=da), T((2, 3), F64, domain=db)), where="method"),
        Call((T((2, 3), F32), T((3, 2), F32)), raises=ta.ShapeError, torch_raises=RuntimeError),
    ]
    return [Call(c.args, c.kwargs, where, c.raises, c.torch_raises) for c in rows]


ROWS = {
    "sin": _unary(), "cos": _unary(), "tan": _unary("unit"),
    "asin": _unary("unit"), "acos": _unary("unit"), "atan": _unary(),
    "sinh": _unary(), "cosh": _unary(), "asinh": _unary(),
    "acosh": _unary("above1", (F32, F64, F16)), "atanh": _unary("unit", (F32, F64, F16, B)),
    "erf": _unary(rtol=None, dtypes=(F32, F64, I64, B)),
    "erfc": _unary(dtypes=(F32, F64, I64)) + [Call((T((3, 4), F32, domain="positive"),))],
    "erfinv": _unary("unit", (F32, F64, B)) + [Call((T((8,), F64, domain="special"),))],
    "log2": _unary("positive"), "log10": _unary("positive"), "log1p": _unary("positive"),
    "exp2": _unary(), "expm1": _unary(), "reciprocal": _unary("nonzero", (F32, F64, F16, I32)),
    "square": _unary(dtypes=(F32, F64, F16, I64)),
    "frac": _unary(dtypes=(F32, F64, F16)) + [Call((T((3,), I64),), raises=RuntimeError)],
    "floor": _unary(dtypes=(F32, F64, F16, I64)), "ceil": _unary(dtypes=(F32, F64, I64)),
    "trunc": _unary(dtypes=(F32, F64, I32)),
    "round": _unary(dtypes=(F32, F64, F16, I64)) + [
        Call((T((3, 4), F64),), {"decimals": 2}), Call((T((3, 4), F32),), {"decimals": 1}),
        Call((T((3, 4), F64),), {"decimals": -1})],
    "sign": _unary(dtypes=(F32, F64, I64, B)) + [Call((T((8,), F32, domain="special"),))],
    "sgn": _unary(dtypes=(F32, F64, I64)),
    "nan_to_num": [Call((T((8,), d, domain="special"),)) for d in (F32, F64, F16)] + [
        Call((T((4, 4), F64, "t", "special"),), {"nan": 1.0, "posinf": 9.0, "neginf": -9.0}),
        Call((T((3,), I64),)), Call((T((), F64),)), Call((T((0,), F32),))],
    "isnan": [Call((T((8,), d, domain="special"),)) for d in (F32, F64, F16, I64, B)],
    "isinf": [Call((T((4, 4), F64, "t", "special"),)), Call((T((3,), I64),))],
    "isfinite": [Call((T((4, 4), F32, "s", "special"),)), Call((T((), B),))],
    "atan2": _binary(dtypes=(F32, F64, I64), scalar=False),
    "hypot": _binary(dtypes=(F32, F64), scalar=False),
    "copysign": _binary("nonzero", "nonzero", dtypes=(F32, F64, I64)),
    "fmod": _binary("real", "nonzero", dtypes=(F32, F64, I64)),
    "remainder": _binary("real", "nonzero", dtypes=(F32, F64, I64), where="method"),
    "logaddexp": _binary(scalar=False),
    "lerp": [
        Call((T((3, 4), F32), T((3, 4), F32), 0.3)),
        Call((T((3, 4), F64, "t"), T((4,), F64), T((3, 1), F64, domain="unit"))),
        Call((T((2, 6), F32, "s"), T((2, 6), F32), T((), F32))),
        Call((T((0, 2), F64), T((2,), F64), 0.5)),
        Call((T((2, 3), F32), T((2, 3), F64), 0.5), raises=RuntimeError),
    ],
    "clamp": [
        Call((T((3, 4), F32), T((3, 4), F32), T((3, 4), F32))),
        Call((T((3, 4), F64, "t"), T((4,), F64), None)),
        Call((T((3, 4), F64), None, T((3, 1), F64))),
        Call((T((2, 6), F32, "s"), T((2, 1), F32), T((), F32))),
        Call((T((3,), I64), T((3,), F32), None)),
        Call((T((0, 3), F32), T((3,), F32), T((3,), F32))),
    ],
    "isclose": [
        Call((T((3, 4), F32), T((3, 4), F32))), Call((T((8,), F64, domain="special"),
                                                       T((8,), F64, domain="special"))),
        Call((T((8,), F64, domain="special"), T((8,), F64, domain="special")),
             {"equal_nan": True}),
        Call((T((3, 4), F64, "t"), T((4,), F64)), {"rtol": 0.5, "atol": 1.0}),
        Call((T((3,), I64), T((3,), I64))),
        Call((T((3,), F32), T((3,), F64)), raises=RuntimeError),
    ],
    "allclose": [Call((T((3, 4), F32), T((3, 4), F32)), {"atol": 10.0}),
                 Call((T((3, 4), F32), T((3, 4), F32))), Call((T((0,), F64), T((0,), F64)))],
}
for _name in ("logical_and", "logical_or", "logical_xor"):
    ROWS[_name] = [Call((T((3, 4), d), T((3, 4), d))) for d in (B, I64, F32)] + [
        Call((T((3, 4), B, "t"), T((4,), B))), Call((T((), I64), T((0, 2), I64)))]
ROWS["logical_not"] = [Call((T((3, 4), d),)) for d in (B, I64, F32)] + [
    Call((T((3, 4), B, "t"),))]
for _name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    ROWS[_name] = [Call((T((3, 4), d), T((3, 4), d))) for d in (B, I64, I32, "uint8")] + [
        Call((T((3, 4), I64, "t"), T((4,), I32))), Call((T((2, 3), I32), 6)),
        Call((T((), I64), T((0, 2), I64))), Call((T((2, 3), B), True)),
        Call((T((3,), F32), T((3,), F32)), raises=RuntimeError)]
for _name in ("bitwise_left_shift", "bitwise_right_shift"):
    ROWS[_name] = [
        Call((T((3, 4), I64), T((3, 4), I64, domain="positive"))),
        Call((T((3, 4), I32, "t"), 2)), Call((T((2, 3), "uint8", domain="positive"), 1)),
        Call((T((3,), F32), 1), raises=RuntimeError)]


@pytest.mark.parametrize("name, case", cases(ROWS))
def test_matches_torch(name, case):
    run_case(name, case)


OPERATORS = {
    "&": lambda a, b: a & b, "|": lambda a, b: a | b, "^": lambda a, b: a ^ b,
    "<<": lambda a, b: a << b, ">>": lambda a, b: a >> b,
}


@pytest.mark.parametrize("op", list(OPERATORS))
@pytest.mark.parametrize("dtype", ["int64", "bool"])
def test_operators_are_bitwise_on_integers_and_logical_on_bool(op, dtype):
    torch = pytest.importorskip("torch")
    if dtype == "bool" and op in ("<<", ">>"):
        pytest.skip("torch has no shifts of bool")
    a, b = [[5, 3, 0, 12], [1, 6, 0, 2]] if dtype == "int64" else [[True, True, False,
                                                                     False], [True, False,
                                                                              True, False]]
    ours = OPERATORS[op](ta.tensor(a), ta.tensor(b))
    theirs = OPERATORS[op](torch.tensor(a), torch.tensor(b))
    assert ours.tolist() == theirs.tolist() and ours.dtype.name == str(theirs.dtype)[6:]
    assert (3 & ta.tensor([6, 1])).tolist() == [2, 1] and (~ta.tensor([5])).tolist() == [-6]
    with pytest.raises(RuntimeError, match="bitwise_and"):
        ta.tensor([1.5]) & ta.tensor([2.5])


def test_erfc_keeps_precision_in_the_tail_and_erfinv_inverts_erf():
    x = ta.tensor([0.0, 1.0, 5.0, 10.0, 26.0, -3.0], dtype=ta.float64)
    expected = [1.0, 0.15729920705028513, 1.5374597944280348e-12, 2.088487583762545e-45,
                5.663192408856143e-296, 1.9999779095030015]
    assert x.erfc().tolist() == pytest.approx(expected, rel=1e-12)
    y = ta.tensor([-0.999999, -0.5, 0.0, 0.3, 0.99999999], dtype=ta.float64)
    assert y.erfinv().erf().tolist() == pytest.approx(y.tolist(), rel=1e-14, abs=1e-16)


def test_math_ops_save_what_their_docstrings_say():
    x = ta.randn(3, 4, requires_grad=True)
    assert [t.shares_storage(x) for t in x.sin().grad_fn.saved_tensors] == [True]
    y = x.tan()
    assert y.grad_fn.saved_tensors[0].shares_storage(y)
    assert x.floor().grad_fn.saved_tensors == () and x.frac().grad_fn.saved_tensors == ()
    (finite,) = x.nan_to_num().grad_fn.saved_tensors
    assert finite.dtype == ta.bool_  # a 1-byte mask, not the input
    assert not ta.isnan(x).requires_grad and x.floor().requires_grad  # as torch
