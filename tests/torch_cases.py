"""Conformance rows against torch: one table `ROWS = {op_name: [Case, ...]}` per test file,
run by `run_case`. A Case calls the op by the same name on both sides (`ta.<name>` and
`torch.<name>`, or the functional / method spelling given), on inputs built from `T` specs
with the same values and the same memory layout, and compares values, dtype, shape and the
gradients of every floating input; or, for an error row, the exception type.

Not a test module: test_ops_math.py, test_activations.py and test_losses.py import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

import tinygrad_attn as ta

SPECIAL = np.array([0.0, -0.0, 1.5, -2.5, np.nan, np.inf, -np.inf, 1e-30])


@dataclass(frozen=True)
class T:
    """A tensor input: shape, dtype name, layout ("c" contiguous, "t" a transposed view of
    a leaf of the swapped shape, "s" every other column of a leaf twice as wide, "e" a
    leaf with size-1 dims expanded to `shape`) and value domain."""

    shape: tuple
    dtype: str = "float32"
    layout: str = "c"
    domain: str = "real"
    grad: bool = True


@dataclass(frozen=True)
class Case:
    args: tuple
    kwargs: dict = field(default_factory=dict)
    where: str = "torch"  # "torch": ta.<op> / torch.<op>; "F": the functional modules;
    #                       "method": args[0].<op>(...)
    raises: type | None = None  # the exception type ta must raise (its message names the op)
    torch_raises: type | None = None  # torch's, where it differs (written down here)
    rtol: float | None = None
    name: str | None = None  # the op's name when the row key is not it

    def __repr__(self):
        args = ",".join(f"{a.shape}{a.dtype[0]}{a.dtype[-2:]}{a.layout}" if isinstance(a, T)
                        else repr(a) for a in self.args)
        return f"{self.where}({args}{',' if self.kwargs else ''}{self.kwargs or ''})"


def _values(spec: T, shape, rng):
    n = int(np.prod(shape))
    if spec.dtype == "bool":
        return rng.random(shape) < 0.5
    if spec.dtype.startswith(("int", "uint")):
        if spec.domain in ("nonzero", "above1"):
            return rng.integers(1, 6, size=shape) * (1 if spec.dtype == "uint8" else
                                                     rng.choice([-1, 1], size=shape))
        lo = 0 if spec.dtype == "uint8" or spec.domain == "positive" else -5
        return rng.integers(lo, 6, size=shape)
    d = spec.domain
    if d == "special":
        return np.resize(SPECIAL, n).reshape(shape)
    if d == "unit":
        return rng.uniform(-0.9, 0.9, shape)
    if d == "positive":
        return rng.uniform(0.3, 3.0, shape)
    if d == "above1":
        return rng.uniform(1.2, 4.0, shape)
    if d == "prob":
        return rng.uniform(0.05, 0.95, shape)
    if d == "nonzero":
        a = rng.standard_normal(shape)
        return np.where(a >= 0, a + 0.3, a - 0.3)
    assert d == "real", d
    return rng.standard_normal(shape) * 2


def _base_shape(spec: T):
    s = tuple(spec.shape)
    if spec.layout == "t":
        return (s[1], s[0]) + s[2:]
    if spec.layout == "s":
        return s[:-1] + (2 * s[-1],)
    if spec.layout == "e":
        return tuple(1 if i % 2 else n for i, n in enumerate(s))
    return s


def _view(lib, leaf, spec: T):
    if spec.layout == "t":
        return leaf.transpose(0, 1)
    if spec.layout == "s":
        return leaf[..., ::2]
    if spec.layout == "e":
        return leaf.expand(*spec.shape)
    return leaf


def build(torch, case: Case, seed: int):
    """(ta args, torch args, [(ta leaf, torch leaf)] of the inputs whose grads are checked)."""
    rng = np.random.default_rng(seed)
    ta_args, torch_args, leaves = [], [], []
    for a in case.args:
        if not isinstance(a, T):
            ta_args.append(a)
            torch_args.append(a)
            continue
        base = _values(a, _base_shape(a), rng).astype(a.dtype)
        floating = a.dtype.startswith("float")
        need = a.grad and floating and case.raises is None
        tl = ta.tensor(base, dtype=a.dtype, requires_grad=need)
        pl = torch.tensor(base, requires_grad=need)
        ta_args.append(_view(ta, tl, a))
        torch_args.append(_view(torch, pl, a))
        if need:
            leaves.append((tl, pl))
    return ta_args, torch_args, leaves


def _call(side, lib, name, case, args):
    if case.where == "method":
        return getattr(args[0], name)(*args[1:], **case.kwargs)
    if case.where == "F":
        mod = lib.nn.functional if side == "torch" else ta.functional
        return getattr(mod, name)(*args, **case.kwargs)
    return getattr(lib, name)(*args, **case.kwargs)


def _tol(dtype_name, rtol):
    if rtol is not None:
        return rtol, rtol
    return {"float16": (1e-2, 1e-3), "float32": (2e-5, 1e-6)}.get(dtype_name, (1e-10, 1e-12))


def _compare(ours, theirs, rtol):
    if isinstance(theirs, bool):
        assert ours is theirs or (type(ours) is bool and ours == theirs), (ours, theirs)
        return
    theirs_np = theirs.detach().numpy()
    assert ours.dtype.name == str(theirs.dtype).removeprefix("torch."), (ours.dtype, theirs.dtype)
    assert tuple(ours.shape) == tuple(theirs.shape), (ours.shape, theirs.shape)
    r, a = _tol(ours.dtype.name, rtol)
    np.testing.assert_allclose(ours.detach().numpy(), theirs_np, rtol=r, atol=a,
                               equal_nan=True)


def run_case(name: str, case: Case, seed: int = 0):
    torch = pytest.importorskip("torch")
    op_name = case.name or name
    ta_args, torch_args, leaves = build(torch, case, seed)
    if case.raises is not None:
        with pytest.raises(case.torch_raises or case.raises):
            _call("torch", torch, op_name, case, torch_args)
        with pytest.raises(case.raises, match=op_name.split("_")[0]):
            _call("ta", ta, op_name, case, ta_args)
        return
    ours = _call("ta", ta, op_name, case, ta_args)
    theirs = _call("torch", torch, op_name, case, torch_args)
    _compare(ours, theirs, case.rtol)
    if leaves and not isinstance(theirs, bool) and theirs.requires_grad:
        assert ours.requires_grad
        upstream = np.random.default_rng(seed + 1).standard_normal(tuple(theirs.shape))
        ours.backward(ta.tensor(upstream.astype(ours.dtype.name)))
        theirs.backward(torch.tensor(upstream.astype(ours.dtype.name)))
        for tl, pl in leaves:
            if pl.grad is None or pl.grad._is_zerotensor():  # torch's lazy zero gradient
                assert tl.grad is None or not np.any(tl.grad.numpy())
                continue
            _compare(tl.grad, pl.grad, case.rtol)


def cases(rows: dict):
    """pytest parameters (op name, case) for every row of a table."""
    return [pytest.param(name, c, id=f"{name}-{i}") for name, cs in rows.items()
            for i, c in enumerate(cs)]
