"""Conformance rows against torch: one case = one call run the same way in both libraries.

A test file holds `ROWS = {op_name: [Case, ...]}`; `check_case(case, torch)` builds each input
in both libraries (same values, dtype and layout), runs `case.fn(lib, *tensors)` with `lib`
the module (`ta` or `torch`), and compares every output's shape, dtype and values, and, for
float64 inputs (every floating input with `all_grads`), the gradients of a fixed weighted
sum of the float outputs, gradient dtypes included. A case with `raises` expects torch to
raise that type and the engine to raise it too (ShapeError is a RuntimeError, as torch's).

DIFFERENCES below is the repository's one list of deliberate differences from torch
(docs/differences.md says the same in prose; test_conformance.py checks they agree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import tinygrad_attn as ta

LAYOUTS = ("contiguous", "transposed", "sliced", "expanded")

# Every deliberate difference from torch 2.13, with its reason (the one list; a row that
# would show one of these is left out of a table and its key named here instead):
DIFFERENCES = {
    "dtypes": "no bfloat16, complex or uint16/32/64 dtypes: NumPy has no bfloat16, and the "
              "engine's ops are real-valued",
    "float16": "float16 ops compute in float16 on NumPy (torch's CPU kernels widen to "
               "float32 inside an op), so float16 results may differ in the last bit",
    "errors": "shape errors are ShapeError, a subclass of both ValueError and RuntimeError "
              "(torch: RuntimeError); device mixes are DeviceMismatchError (a RuntimeError)",
    "int_overflow": "a Python int outside an integer tensor's range wraps as NumPy "
                    "arithmetic does; torch raises for some ops",
    "dropout": "dropout draws its mask from the engine's own generator: only p=0 and "
               "eval mode give torch's values",
    "checkpoint": "checkpoint's use_reentrant, context_fn and determinism_check arguments "
                  "are not taken",
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
    "getitem/setitem": "float lists and repeated ... are IndexErrors; a value that does not "
                       "broadcast raises ShapeError",
    "tensor": "a value outside an explicit dtype's range raises; None or str in the data is "
              "a TypeError",
    "device": "an unknown device string is a ValueError, an int device a TypeError",
    "integer_input": "random floats and softmax on integers raise RuntimeError (torch: "
                     "NotImplementedError, its subclass)",
}


@dataclass
class Case:
    fn: Callable  # fn(lib, *tensors): lib is tinygrad_attn or torch
    inputs: tuple  # NumPy arrays (their dtype is the tensors' dtype)
    layout: str = "contiguous"  # of the first input: "transposed" / "sliced" make a view
    grad: bool = True  # compare gradients when an input is float64
    raises: type | None = None
    all_grads: bool = False  # gradients of float16/float32 inputs too (dtype checks)
    kwargs: dict = field(default_factory=dict)


def _build(lib, arr, layout, requires_grad):
    """(leaf, tensor the op sees) holding `arr`'s values in `layout`."""
    if layout == "transposed" and arr.ndim >= 2:
        base = np.ascontiguousarray(np.swapaxes(arr, 0, 1))
        leaf = _leaf(lib, base, requires_grad)
        return leaf, leaf.transpose(0, 1)
    if layout == "expanded" and arr.ndim >= 1:
        # a stride-0 view: the leaf holds the first entry of the last dim, broadcast
        leaf = _leaf(lib, np.array(arr[..., :1], order="C"), requires_grad)
        return leaf, leaf.expand(*arr.shape)
    if layout == "sliced" and arr.ndim >= 1:
        wide = np.zeros(arr.shape[:-1] + (2 * arr.shape[-1],), dtype=arr.dtype)
        wide[..., ::2] = arr
        leaf = _leaf(lib, wide, requires_grad)
        return leaf, leaf[..., ::2]
    leaf = _leaf(lib, np.array(arr, order="C"), requires_grad)  # keeps a 0-d array 0-d
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
        floating = arr.dtype.kind == "f"
        wants = floating and (arr.dtype == np.float64 or case.all_grads)
        leaf, t = _build(lib, arr, layout, grad and wants)
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


def _tolerance(dtype_name: str) -> tuple[float, float]:
    return {"float16": (2e-3, 2e-3), "float32": (1e-5, 1e-6)}.get(dtype_name, (1e-5, 1e-7))


def check_case(case: Case, torch) -> None:
    wants_grad = case.grad and any(
        isinstance(a, np.ndarray) and (a.dtype == np.float64 or
                                       (case.all_grads and a.dtype.kind == "f"))
        for a in case.inputs)
    if case.raises is not None:
        try:
            _run(torch, case, False)
        except case.raises:
            pass
        else:
            raise AssertionError(f"torch did not raise {case.raises.__name__}")
        try:
            _run(ta, case, False)
        except case.raises:
            return
        raise AssertionError(f"the engine did not raise {case.raises.__name__}")
    theirs, their_grads = _run(torch, case, wants_grad)
    ours, our_grads = _run(ta, case, wants_grad)
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    for k, (a, b) in enumerate(zip(ours, theirs)):
        assert tuple(a.shape) == tuple(b.shape), (k, a.shape, b.shape)
        assert _dtype_name(a) == _dtype_name(b), (k, a.dtype, b.dtype)
        rtol, atol = _tolerance(_dtype_name(b))
        np.testing.assert_allclose(_host(a), _host(b), rtol=rtol, atol=max(atol, 1e-6),
                                   equal_nan=True, err_msg=f"output {k}")
    if wants_grad:
        for i, (a, b) in enumerate(zip(our_grads, their_grads)):
            if b is None:
                assert a is None or not np.any(a), f"input {i}: torch has no gradient"
                continue
            assert a is not None, f"input {i}: no gradient where torch has one"
            assert a.dtype == b.dtype, f"grad of input {i}: {a.dtype} where torch has {b.dtype}"
            rtol, atol = _tolerance(str(b.dtype))
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, equal_nan=True,
                                       err_msg=f"grad of input {i}")


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
