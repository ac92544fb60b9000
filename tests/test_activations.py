"""ops/activations.py and nn/activations.py against torch.nn.functional and torch.nn.

ROWS is the table a conformance check reads (see tests/rows_vs_torch.py): values, dtypes,
shapes and gradients on 0-d, empty, transposed, sliced and expanded float inputs, keyword
arguments, and the errors torch raises.
"""

from __future__ import annotations

import numpy as np
import pytest
from rows_vs_torch import Call, T, cases, run_case

import nn
import tinygrad_attn as ta

F32, F64, F16 = "float32", "float64", "float16"


def _rows(domain="real", kwargs=(), dtypes=(F32, F64), errors=True, rtol=None):
    rows = [Call((T((3, 4), d, domain=domain),), where="F") for d in dtypes]
    rows += [Call((T((), F64, domain=domain),), where="F"),
             Call((T((0, 3), F32, domain=domain),), where="F"),
             Call((T((3, 4), F64, "t", domain),), where="F"),
             Call((T((2, 6), F32, "s", domain),), where="F"),
             Call((T((3, 4), F64, "e", domain),), where="F")]
    rows += [Call((T((3, 4), F64, domain=domain),), dict(kw), where="F") for kw in kwargs]
    if errors:
        rows.append(Call((T((3,), "int64"),), where="F", raises=RuntimeError))
    if rtol is not None:
        rows = [Call(c.args, c.kwargs, c.where, c.raises, rtol=rtol) if not c.raises else c
                for c in rows]
    return rows


ROWS = {
    "leaky_relu": _rows("nonzero", [{"negative_slope": 0.2}, {"negative_slope": -0.5}]),
    "elu": _rows("nonzero", [{"alpha": 0.5}, {"alpha": 2.0}], (F32, F64, F16)),
    "selu": _rows("nonzero"),
    "celu": _rows("nonzero", [{"alpha": 0.5}, {"alpha": 3.0}]),
    "softplus": _rows("real", [{"beta": 2.0}, {"beta": 0.5, "threshold": 1.0}]) + [
        Call((T((3,), F64, domain="special"),), where="F")],
    # torch's softsign is x / (1 + |x|): integers promote to the default dtype, bool raises
    "softsign": _rows("real", dtypes=(F32, F64, F16), errors=False) + [
        Call((T((3, 4), d),), where="F") for d in ("int64", "int8", "uint8")] + [
        Call((T((3,), "bool"),), where="F", raises=RuntimeError)],
    "mish": _rows("real"),
    "hardswish": _rows("real", dtypes=(F32, F64, F16)),
    # torch scales by 1/6 rounded to float32 even in float64: a 3e-8 relative difference
    "hardsigmoid": _rows("real", rtol=1e-7),
    "hardtanh": _rows("real", [{"min_val": -0.5, "max_val": 2.0}], errors=False) + [
        Call((T((3, 4), "int64"),), {"min_val": -2, "max_val": 3}, where="F"),
        Call((T((3, 4), "int8"),), where="F"),
        Call((T((3,), "bool"),), where="F", raises=RuntimeError),
        Call((T((3,), F32),), {"min_val": 2.0, "max_val": 1.0}, where="F", raises=ValueError)],
    "relu6": _rows("real", [], (F32, F64, F16, "int64"), errors=False) + [
        Call((T((3,), "bool"),), where="F", raises=RuntimeError)],
    "logsigmoid": _rows("real") + [Call((T((8,), F64, domain="special"),), where="F")],
    "softmin": [Call((T((3, 4), d),), {"dim": dim}, where="F") for d in (F32, F64)
                for dim in (0, 1, -1)] + [
        Call((T((3, 4), F64, "t"),), {"dim": 1}, where="F"),
        Call((T((0, 3), F32),), {"dim": 1}, where="F")],
    "glu": [Call((T((3, 4), d),), where="F") for d in (F32, F64)] + [
        Call((T((4, 6), F64, "t"),), {"dim": 0}, where="F"),
        Call((T((2, 8), F32, "s"),), {"dim": -1}, where="F"),
        Call((T((0, 4), F32),), where="F"),
        Call((T((3, 5), F32),), where="F", raises=RuntimeError),
        Call((T((), F32),), where="F", raises=RuntimeError)],
}


@pytest.mark.parametrize("name, case", cases(ROWS))
def test_matches_torch(name, case):
    run_case(name, case)


MODULES = [
    ("LeakyReLU", (0.2,)), ("ELU", (0.5,)), ("SELU", ()), ("CELU", (0.7,)),
    ("Softplus", (2.0, 3.0)), ("Softsign", ()), ("Mish", ()), ("Hardswish", ()),
    ("Hardsigmoid", ()), ("Hardtanh", (-0.5, 0.5)), ("ReLU6", ()), ("LogSigmoid", ()),
    ("Softmin", (1,)), ("GLU", (1,)), ("Sigmoid", ()), ("Tanh", ()), ("SiLU", ()),
    ("Softmax", (0,)), ("LogSoftmax", (1,)), ("ReLU", ()), ("GELU", ("tanh",)),
]


@pytest.mark.parametrize("name, args", MODULES, ids=[m[0] for m in MODULES])
def test_nn_modules_match_torch(name, args):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((3, 4)) * 3
    ours = getattr(nn, name)(*args)(ta.tensor(x))
    theirs = getattr(torch.nn, name)(*args)(torch.tensor(x))
    rtol = 1e-7 if name == "Hardsigmoid" else 1e-10  # torch's float32 1/6, as above
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=rtol, atol=1e-12)
    assert ours.dtype == ta.float64


def test_activations_save_their_output_where_it_suffices():
    x = ta.randn(3, 4, requires_grad=True)
    F = ta.functional
    for fn in (lambda x: F.elu(x), lambda x: F.leaky_relu(x, 0.1), F.hardsigmoid, F.relu6,
               lambda x: F.celu(x, 2.0)):
        y = fn(x)
        (saved,) = y.grad_fn.saved_tensors
        assert saved.shares_storage(y) and not saved.shares_storage(x)
    y = F.leaky_relu(x, -0.2)  # a negative slope: the output's sign no longer tells
    assert y.grad_fn.saved_tensors[0].shares_storage(x)
    assert F.relu6(x).grad_fn.name == F.hardtanh(x).grad_fn.name  # one node, as torch
