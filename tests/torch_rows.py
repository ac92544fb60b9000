"""Conformance rows against torch: one case = one call run the same way in both libraries.

A test file holds `ROWS = {op_name: [Case, ...]}`; `check_case(case, torch)` builds each input
in both libraries (same values, dtype and layout), runs `case.fn(lib, *tensors)` with `lib`
the module (`ta` or `torch`), and compares every output's shape, dtype and values, and, for
float64 inputs, the gradients of a fixed weighted sum of the float outputs. A case with
`raises` expects torch to raise that type and the engine to raise it too (or ShapeError,
the engine's ValueError for shapes, where torch raises RuntimeError: see SHAPE_ERROR).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import tinygrad_attn as ta

# The engine's one deliberate difference in error types: shape mismatches raise ShapeError
# (a ValueError) where torch raises RuntimeError.
SHAPE_ERROR = {RuntimeError: (RuntimeError, ta.ShapeError)}
LAYOUTS = ("contiguous", "transposed", "sliced")

# Deliberate differences of the ops these tables cover, for the repository's one list:
DIFFERENCES = {
    "errors": "shape mismatches raise ShapeError (a ValueError) where torch raises "
              "RuntimeError",
    "take_along_dim": "indices out of range raise RuntimeError; torch's CPU kernel reads "
                      "past the end unchecked",
    "sort/argsort/topk": "always stable, and topk(sorted=False) returns sorted values "
                         "(both valid under torch's contract)",
    "scatter": "reduce= (the deprecated form) is not supported: use scatter_reduce",
    "scatter_reduce": "the gradient of src is for src's leading index-shaped block, as "
                      "torch's forward reads it (torch's backward requires src.shape == "
                      "index.shape)",
    "vector_norm": "ord=0 gives a zero gradient where torch gives none",
    "norm": "matrix norms (p='nuc', ...) are not implemented; 'fro' is the 2-norm",
    "rms_norm": "normalized_shape may also be an int (torch's functional form wants a list)",
    "conv/ConvNd": "padding_mode other than 'zeros' is not implemented",
}


@dataclass
class Case:
    fn: Callable  # fn(lib, *tensors): lib is tinygrad_attn or torch
    inputs: tuple  # NumPy arrays (their dtype is the tensors' dtype)
    layout: str = "contiguous"  # of the first input: "transposed" / "sliced" make a view
    grad: bool = True  # compare gradients when an input is float64
    raises: type | None = None
    kwargs: dict = field(default_factory=dict)


def _build(lib, arr, layout, requires_grad):
    """(leaf, tensor the op sees) holding `arr`'s values in `layout`."""
    if layout == "transposed" and arr.ndim >= 2:
        base = np.ascontiguousarray(np.swapaxes(arr, 0, 1))
        leaf = _leaf(lib, base, requires_grad)
        return leaf, leaf.transpose(0, 1)
    if layout == "sliced" and arr.ndim >= 1:
        wide = np.zeros(arr.shape[:-1] + (2 * arr.shape[-1],), dtype=arr.dtype)
        wide[..., ::2] = arr
        leaf = _leaf(lib, wide, requires_grad)
        return leaf, leaf[..., ::2]
    leaf = _leaf(lib, np.ascontiguousarray(arr), requires_grad)
    return leaf, leaf


def _leaf(lib, arr, requires_grad):
    if lib is ta:
        return ta.tensor(arr.copy(), requires_grad=requires_grad)
    import torch

    return torch.tensor(arr.copy(), requires_grad=requires_grad)


def _outputs(out):
    if isinstance(out, (tuple, list)):
        return [o for item in out for o in _outputs(item)]
    return [out]


def _host(t):
    return np.asarray(t.detach().cpu().numpy() if hasattr(t, "cpu") else t)


def _dtype_name(t) -> str:
    return getattr(t.dtype, "name", None) or str(t.dtype).removeprefix("torch.")


def _run(lib, case, grad):
    leaves, args = [], []
    for i, arr in enumerate(case.inputs):
        if not isinstance(arr, np.ndarray):
            args.append(arr)
            leaves.append(None)
            continue
        layout = case.layout if i == 0 else "contiguous"
        leaf, t = _build(lib, arr, layout, grad and arr.dtype == np.float64)
        leaves.append(leaf)
        args.append(t)
    outs = _outputs(case.fn(lib, *args, **case.kwargs))
    grads = None
    if grad:
        total = None
        for k, o in enumerate(outs):
            if not o.dtype.is_floating_point or not o.requires_grad:
                continue
            w = np.random.default_rng(k).standard_normal(tuple(o.shape))
            term = (o * _leaf(lib, w, False)).sum()
            total = term if total is None else total + term
        if total is not None:
            total.backward()
        grads = [None if lf is None or not lf.requires_grad or lf.grad is None
                 else _host(lf.grad) for lf in leaves]
    return outs, grads


def check_case(case: Case, torch) -> None:
    wants_grad = case.grad and any(isinstance(a, np.ndarray) and a.dtype == np.float64
                                   for a in case.inputs)
    if case.raises is not None:
        try:
            _run(torch, case, False)
        except case.raises:
            pass
        else:
            raise AssertionError(f"torch did not raise {case.raises.__name__}")
        expected = SHAPE_ERROR.get(case.raises, case.raises)
        try:
            _run(ta, case, False)
        except expected:
            return
        raise AssertionError(f"the engine did not raise {case.raises.__name__}")
    theirs, their_grads = _run(torch, case, wants_grad)
    ours, our_grads = _run(ta, case, wants_grad)
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    for k, (a, b) in enumerate(zip(ours, theirs)):
        assert tuple(a.shape) == tuple(b.shape), (k, a.shape, b.shape)
        assert _dtype_name(a) == _dtype_name(b), (k, a.dtype, b.dtype)
        np.testing.assert_allclose(_host(a), _host(b), rtol=1e-5, atol=1e-6, equal_nan=True,
                                   err_msg=f"output {k}")
    if wants_grad:
        for i, (a, b) in enumerate(zip(our_grads, their_grads)):
            if b is None:
                assert a is None or not np.any(a), f"input {i}: torch has no gradient"
                continue
            assert a is not None, f"input {i}: no gradient where torch has one"
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=f"grad of input {i}")


def case_ids(rows: dict) -> tuple[list, list]:
    """(params, ids) for pytest.mark.parametrize over every case of a ROWS table."""
    params, ids = [], []
    for name, cases in rows.items():
        for k, c in enumerate(cases):
            params.append((name, k))
            ids.append(f"{name}-{k}-{c.layout}")
    return params, ids


def arr(data, dtype=np.float64):
    return np.asarray(data, dtype=dtype)


def randn(*shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)
