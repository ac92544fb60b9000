"""Conformance rows against torch: one case = one call run the same way in both libraries.

A test file holds `ROWS = {op_name: [Case, ...]}`; `check_case(case, torch)` builds each input
in both libraries (same values, dtype and layout), runs `case.fn(lib, *tensors)` with `lib`
the module (`ta` or `torch`), and compares every output's shape, dtype and values, and, for
float64 inputs (every floating input with `all_grads`), the gradients of a fixed weighted
sum of the float outputs, gradient dtypes included. A case with `raises` expects torch to
raise that type and the engine to raise it too (ShapeError is a RuntimeError, as torch's).

The same module holds the second form of a row, `Call` (test_ops_math.py, test_activations.py,
test_losses.py): the op called by name on both sides (`ta.<name>` / `torch.<name>`, the
functional modules with where="F", or a method with where="method"), on inputs given as `T`
specs (shape, dtype, layout, value domain), compared the same way by `run_case`.

DIFFERENCES below is the repository's one list of deliberate differences from torch
(docs/differences.md says the same in prose; test_conformance.py checks they agree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

import tinygrad_attn as ta

LAYOUTS = ("contiguous", "transposed", "sliced", "expanded")

# Every deliberate difference from torch 2.13, with its reason (the one list; a row that
# would show one of these is left out of a table and its key named here instead):
DIFFERENCES = {
    "dtypes": "no bfloat16, complex or uint16/32/64 dtypes: NumPy has no bfloat16, and the "
              "engine's ops are real-valued",
    "float16": "float16 reductions and row ops accumulate in float32 and round once, as "
               "torch's CPU kernels; results may differ from torch's in the last bit (closer "
               "to the float32 result where torch's half kernel rounds an intermediate)",
    "errors": "shape errors are ShapeError, a subclass of both ValueError and RuntimeError "
              "(torch: RuntimeError); device mixes are DeviceMismatchError (a RuntimeError)",
    "int_overflow": "a bool tensor with an int in [2**63, 2**64) computes in int64, "
                    "wrapped (torch refuses to promote to uint64); every other int operand "
                    "wraps or is refused as torch's",
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
    "masked_softmax": "with a bool mask, a row made nan by a nan input gets a zero gradient "
                      "(the composition: nan at its unmasked entries); a float mask must "
                      "have x's dtype",
    "load_state_dict": "Module.load_state_dict also takes NumPy/CuPy arrays as values (torch "
                       "wants tensors)",
    "pad": "circular padding raises where torch reads unwritten memory (a dim cropped to "
           "nothing, then padded) or wraps more than once on an unbatched input",
    "var/std": "with dim=() the gradient is that of dim=[0, 1, ...]; torch's backward counts "
               "n = 1 there (inf), against its own forward",
    "views": "a view past 2**63 - 1 bytes (zeros(0).view(0, 2**62)) raises ShapeError, as "
             "NumPy cannot hold it; a negative size is refused even beside a 0",
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
        computed_in = [_tolerance(_dtype_name(b)) for b in theirs
                       if _dtype_name(b).startswith(("float", "bfloat"))]
        for i, (a, b) in enumerate(zip(our_grads, their_grads)):
            if b is None:
                assert a is None or not np.any(a), f"input {i}: torch has no gradient"
                continue
            assert a is not None, f"input {i}: no gradient where torch has one"
            assert a.dtype == b.dtype, f"grad of input {i}: {a.dtype} where torch has {b.dtype}"
            # a float64 input's gradient through a float32 computation (float32 ** a 0-d
            # float64 exponent) carries float32 rounding: hold it to the looser tolerance
            rtol, atol = (max(t) for t in zip(_tolerance(str(b.dtype)), *computed_in))
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


# The second row form, `Call`: the op called by its name on both sides (ta.<name> and
# torch.<name>, the functional modules, or a method), on inputs given as `T` specs whose
# values come from a named domain; run by `run_case(name, call)`.


@dataclass(frozen=True)
class Call:
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


def build(torch, case: Call, seed: int):
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


def run_case(name: str, case: Call, seed: int = 0):
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
