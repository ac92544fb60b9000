"""torch's own spellings of the engine's ops, against torch 2.13: the function forms
(`torch.sum(x, 1, True)`, `torch.pow(2, x)`, `torch.clip`), the named tuples
(`x.max(dim=1).values`), the varargs and keyword forms of the methods (`x.flip(0, 1)`,
`x.permute(dims=(1, 0))`), `var(dim, unbiased)`, and the small Tensor methods a training
script reaches for (`f"{loss:.4f}"`, `.t()`, `.type()`, `new_zeros`, ...).

ROWS is read by tests/test_registry.py with the other conformance tables; the tests below
it check what a row cannot (types, strings, Python values).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from rows_vs_torch import Case, arr, case_ids, check_case

import tinygrad_attn as ta
from tinygrad_attn.ops.inplace import RESULT_METHODS
from tinygrad_attn.ops.registry import REGISTRY

B, I32, I64 = np.bool_, np.int32, np.int64
F32, F64 = np.float32, np.float64


def r(*shape, dtype=F64, seed=0, lo=None):
    rng = np.random.default_rng(seed)
    if dtype == B:
        return np.asarray(rng.random(shape) < 0.5)
    if np.dtype(dtype).kind in "iu":
        return np.asarray(rng.integers(-4 if lo is None else lo, 5, size=shape), dtype=dtype)
    if lo is not None:
        return np.asarray(rng.uniform(lo, lo + 2, size=shape), dtype=dtype)
    return np.asarray(rng.standard_normal(shape), dtype=dtype)


def _as_tensor(fn):
    """A row of a function that returns a Python value: compared as a tensor of it."""
    return lambda lib, *xs: lib.tensor(fn(lib, *xs))


def _conv_weight(lib, x, w):
    return lib.conv1d(x, w, None, 1, 1)


X, Y = r(3, 4), r(4, seed=1)
LAYOUTS = ("contiguous", "transposed", "sliced")

ROWS = {
    # ------------------------------------------------------------------ reductions
    "sum": [Case(lambda lib, x: lib.sum(x, 1, True), (X,), lay) for lay in LAYOUTS] + [
        Case(lambda lib, x: lib.sum(x, dim=(0, 1)), (X,)),
        Case(lambda lib, x: lib.sum(x, dtype=lib.float64), (r(3, 4, dtype=F32),),
             all_grads=True),
        Case(lambda lib, x: x.sum(0, dtype=lib.float32), (r(2, 3, dtype=I64),)),
        Case(lambda lib, x: lib.sum(x, 0), (r(0, 3),))],
    "mean": [Case(lambda lib, x: lib.mean(x, 0, True), (X,), "transposed"),
             Case(lambda lib, x: lib.mean(x, dtype=lib.float64), (r(3, 4, dtype=F32),),
                  all_grads=True),
             Case(lambda lib, x: lib.mean(x), (r(2, 3, dtype=I64),), raises=RuntimeError)],
    # x.var(1, True) is unbiased=True, not keepdim (torch's overload)
    "var": [Case(lambda lib, x: x.var(1, True), (X,), lay) for lay in LAYOUTS] + [
        Case(lambda lib, x: x.var(1, False, True), (X,)),
        Case(lambda lib, x: x.var(False), (X,)),
        Case(lambda lib, x: lib.var(x, 0, unbiased=False, keepdim=True), (X,)),
        Case(lambda lib, x: lib.var(x, dim=1, correction=2), (X,)),
        Case(lambda lib, x: lib.var(x, 1, True, True), (X,), "sliced"),
        Case(lambda lib, x: lib.var(x, 1), (r(3, 0),))],
    "std": [Case(lambda lib, x: x.std(0, False), (X,), lay) for lay in LAYOUTS] + [
        Case(lambda lib, x: lib.std(x, unbiased=False), (X,)),
        Case(lambda lib, x: lib.std(x, (0, 1), True, keepdim=True), (X,)),
        Case(lambda lib, x: x.std(True), (X,)),
        Case(lambda lib, x: lib.std(x, 0, correction=0), (r(0, 3),))],
    "max": [Case(lambda lib, x: lib.max(x, 1), (X,), lay) for lay in LAYOUTS] + [
        Case(lambda lib, x: lib.max(x, dim=0, keepdim=True), (X,)),
        Case(lambda lib, x: lib.max(x), (X,)),
        Case(lambda lib, x, y: lib.max(x, y), (X, Y)),  # two tensors: maximum
        Case(lambda lib, x, y: x.max(y), (r(2, 3, dtype=I64), r(3, dtype=I64, seed=1))),
        Case(lambda lib, x: lib.max(x, 0), (r(0, 3),), raises=IndexError),
        Case(lambda lib, x: lib.max(x, 1), (r(2, 0),), raises=IndexError),
        Case(lambda lib, x: lib.max(x, 0), (r(3, 0),))],
    "min": [Case(lambda lib, x: lib.min(x, 1), (X,), lay) for lay in LAYOUTS] + [
        Case(lambda lib, x: x.min(dim=-1, keepdim=True), (X,)),
        Case(lambda lib, x, y: lib.min(x, y), (X, Y)),
        Case(lambda lib, x: lib.min(x, 0), (r(3, 0),))],
    "argmax": [Case(lambda lib, x: lib.argmax(x, 1, True), (X,), "transposed"),
               Case(lambda lib, x: lib.argmax(x), (X,)),
               Case(lambda lib, x: lib.argmax(x, dim=0), (r(3, 0),))],
    "argmin": [Case(lambda lib, x: lib.argmin(x, 0), (X,), "sliced"),
               Case(lambda lib, x: lib.argmin(x, 0), (r(3, 0),))],
    "aminmax": [Case(lambda lib, x: lib.aminmax(x), (X,), lay) for lay in LAYOUTS] + [
        Case(lambda lib, x: lib.aminmax(x, dim=1), (X,), "transposed"),
        Case(lambda lib, x: x.aminmax(dim=0, keepdim=True), (X,)),
        Case(lambda lib, x: lib.aminmax(x, dim=1), (arr([[1.0, 3.0, 1.0], [2.0, 2.0, 0.0]]),)),
        Case(lambda lib, x: lib.aminmax(x, dim=-1), (r(2, 3, dtype=I64),)),
        Case(lambda lib, x: lib.aminmax(x), (r(),)),
        Case(lambda lib, x: lib.aminmax(x, dim=0), (r(3, 0),))],
    # a slice of NaN only is left out with a dim: torch's index there is its kernel's choice
    "nanmedian": [Case(lambda lib, x: lib.nanmedian(x),
                       (arr([[1.0, np.nan, 3.0], [2.0, 5.0, 4.0]]),)),
                  Case(lambda lib, x: x.nanmedian(1), (arr([[1.0, np.nan, 3.0, 2.0],
                                                            [4.0, 1.0, np.nan, np.nan]]),)),
                  Case(lambda lib, x: lib.nanmedian(x, 0, keepdim=True), (X,), "transposed"),
                  Case(lambda lib, x: lib.nanmedian(x, -1), (r(3, 5, dtype=I64),)),
                  Case(lambda lib, x: x.nanmedian(), (arr([np.nan, np.nan]),), grad=False),
                  Case(lambda lib, x: lib.nanmedian(x, 0), (r(3, 0),)),
                  Case(lambda lib, x: lib.nanmedian(x, 1), (r(3, 0),), raises=IndexError)],
    # ------------------------------------------------------------------ arithmetic
    "add": [Case(lambda lib, x, y: lib.add(x, y, alpha=2), (X, Y), lay) for lay in LAYOUTS] + [
        Case(lambda lib, x: lib.add(x, 3, alpha=2), (X,)),
        Case(lambda lib, x, y: x.add(y, alpha=0.5), (X, Y)),
        Case(lambda lib, x, y: lib.add(x, y, alpha=3), (r(2, 3, dtype=I64), r(3, dtype=I64))),
        Case(lambda lib, x, y: lib.add(x, y), (r(0, 4), Y))],
    "sub": [Case(lambda lib, x, y: lib.sub(x, y, alpha=2), (X, Y), "transposed"),
            Case(lambda lib, x, y: lib.subtract(x, y), (X, Y)),
            Case(lambda lib, x, y: x.subtract(y, alpha=-1.5), (X, Y)),
            Case(lambda lib, x, y: lib.sub(x, y), (r(0, 4), Y))],
    "mul": [Case(lambda lib, x, y: lib.mul(x, y), (X, Y), "sliced"),
            Case(lambda lib, x: lib.multiply(x, 2), (X,)),
            Case(lambda lib, x, y: x.multiply(y), (r(0, 4), Y))],
    "div": [Case(lambda lib, x, y: lib.div(x, y), (X, r(4, lo=0.5)), "transposed"),
            Case(lambda lib, x, y: lib.divide(x, y, rounding_mode="floor"),
                 (X, r(4, lo=0.5)), grad=False),
            Case(lambda lib, x, y: lib.true_divide(x, y), (r(2, 3, dtype=I64), r(3, lo=1))),
            Case(lambda lib, x, y: x.divide(y), (r(0, 4), r(4, lo=0.5)))],
    "pow": [Case(lambda lib, x: lib.pow(x, 2), (X,), "transposed"),
            Case(lambda lib, x: lib.pow(2, x), (X,)),  # a Python base
            Case(lambda lib, x, y: lib.pow(x, y), (r(3, 4, lo=0.5), r(4, seed=1))),
            Case(lambda lib, x: lib.pow(x, 3), (r(0, 2),))],
    "remainder": [Case(lambda lib, x: lib.remainder(x, 1.5), (X,)),
                  Case(lambda lib, x: lib.remainder(5, x), (r(2, 3, lo=1, dtype=I64),)),
                  Case(lambda lib, x: lib.remainder(x, 2), (r(0, 2),))],
    "floor_divide": [Case(lambda lib, x: lib.floor_divide(x, 2), (r(2, 3, dtype=I64),)),
                     Case(lambda lib, x, y: lib.floor_divide(x, y), (X, r(4, lo=0.5)),
                          grad=False),
                     Case(lambda lib, x: lib.floor_divide(x, 2), (r(0, 2),), grad=False)],
    "neg": [Case(lambda lib, x: lib.neg(x), (X,), "transposed"),
            Case(lambda lib, x: lib.negative(x), (r(2, 3, dtype=I32),)),
            Case(lambda lib, x: x.negative(), (r(0, 2),))],
    "abs": [Case(lambda lib, x: lib.absolute(x), (X,), "sliced"),
            Case(lambda lib, x: x.absolute(), (r(0, 2),))],
    "rsqrt": [Case(lambda lib, x: lib.rsqrt(x), (r(3, 4, lo=0.5),), "transposed"),
              Case(lambda lib, x: lib.rsqrt(x), (r(0, 2, lo=0.5),))],
    "bitwise_not": [Case(lambda lib, x: lib.bitwise_not(x), (r(2, 3, dtype=I64),)),
                    Case(lambda lib, x: lib.bitwise_not(x), (r(0, 3, dtype=B),))],
    "clamp": [Case(lambda lib, x: lib.clip(x, -0.5, 0.5), (X,), "transposed"),
              Case(lambda lib, x: lib.clip(x, min=0.0), (r(0, 2),))],
    "acos": [Case(lambda lib, x: lib.arccos(x), (r(3, 4, lo=-0.9) / 2,))],
    "asin": [Case(lambda lib, x: lib.arcsin(x), (r(3, 4, lo=-0.9) / 2,))],
    "atan": [Case(lambda lib, x: lib.arctan(x), (X,))],
    "asinh": [Case(lambda lib, x: lib.arcsinh(x), (X,))],
    "acosh": [Case(lambda lib, x: lib.arccosh(x), (r(3, 4, lo=1.5),))],
    "atanh": [Case(lambda lib, x: lib.arctanh(x), (r(3, 4, lo=-0.9) / 2,))],
    "atan2": [Case(lambda lib, x, y: lib.arctan2(x, y), (X, Y))],
    "trunc": [Case(lambda lib, x: lib.fix(x), (X,), grad=False)],
    # ------------------------------------------------------------------ comparisons
    "eq": [Case(lambda lib, x, y: lib.eq(x, y), (r(3, 4, dtype=I64), r(4, dtype=I64)), lay)
           for lay in LAYOUTS] + [
        Case(lambda lib, x: x.eq(0.5), (X,)),
        Case(lambda lib, x, y: lib.eq(x, y), (r(0, 3), r(3))),
        Case(lambda lib, x, y: lib.eq(x, y), (r(2, 3), r(4)), raises=RuntimeError)],
    "ne": [Case(lambda lib, x, y: lib.ne(x, y), (r(3, 4, dtype=I64), r(4, dtype=I64))),
           Case(lambda lib, x, y: lib.not_equal(x, y), (X, Y)),
           Case(lambda lib, x, y: x.not_equal(y), (r(0, 3), r(3)))],
    "lt": [Case(lambda lib, x, y: lib.lt(x, y), (X, Y), "transposed"),
           Case(lambda lib, x: lib.less(x, 0), (r(2, 3, dtype=I32),)),
           Case(lambda lib, x, y: x.less(y), (r(0, 3), r(3)))],
    "le": [Case(lambda lib, x, y: lib.le(x, y), (X, Y)),
           Case(lambda lib, x, y: lib.less_equal(x, y), (r(2, 3, dtype=B), r(3, dtype=I64))),
           Case(lambda lib, x, y: x.less_equal(y), (r(0, 3), r(3)))],
    "gt": [Case(lambda lib, x, y: lib.gt(x, y), (X, Y), "sliced"),
           Case(lambda lib, x: lib.greater(x, 0.25), (X,)),
           Case(lambda lib, x, y: x.greater(y), (r(0, 3), r(3)))],
    "ge": [Case(lambda lib, x, y: lib.ge(x, y), (X, Y)),
           Case(lambda lib, x, y: lib.greater_equal(x, y), (X, r(3, 4, seed=2))),
           Case(lambda lib, x, y: x.greater_equal(y), (r(0, 3), r(3)))],
    # ------------------------------------------------------------------ questions
    "is_tensor": [Case(_as_tensor(lambda lib, x: [lib.is_tensor(x), lib.is_tensor([1.0]),
                                                  lib.is_tensor(3)]), (X,)),
                  Case(_as_tensor(lambda lib, x: lib.is_tensor(x)), (r(0, 3),))],
    "numel": [Case(_as_tensor(lambda lib, x: [lib.numel(x), x.numel()]), (X,), lay)
              for lay in ("contiguous", "expanded")] + [
        Case(_as_tensor(lambda lib, x: [lib.numel(x), x.numel()]), (r(),)),
        Case(_as_tensor(lambda lib, x: lib.numel(x)), (r(0, 3),)),
        Case(lambda lib, x: lib.numel([1, 2]), (X,), raises=TypeError)],
    "is_floating_point": [
        Case(_as_tensor(lambda lib, x, y: [lib.is_floating_point(x), y.is_floating_point()]),
             (r(2, dtype=F32), r(2, dtype=I64))),
        Case(_as_tensor(lambda lib, x: lib.is_floating_point(x)), (r(0, 3),))],
    "is_complex": [
        Case(_as_tensor(lambda lib, x, y: [lib.is_complex(x), y.is_complex()]),
             (X, r(2, dtype=B))),
        Case(_as_tensor(lambda lib, x: lib.is_complex(x)), (r(0, 3),))],
    "is_nonzero": [
        Case(_as_tensor(lambda lib, x, y: [lib.is_nonzero(x), y.is_nonzero()]),
             (arr([0.0]), arr([[3]], I64))),
        Case(_as_tensor(lambda lib, x: lib.is_nonzero(x)), (arr(True, B),)),
        Case(lambda lib, x: lib.is_nonzero(x), (r(2),), raises=RuntimeError),
        Case(lambda lib, x: lib.is_nonzero(x), (r(0, 3),), raises=RuntimeError)],
    # ------------------------------------------------------------------ matrices
    "mm": [Case(lambda lib, a, b: lib.mm(a, b), (X, r(4, 2, seed=1)), lay)
           for lay in LAYOUTS] + [
        Case(lambda lib, a, b: a.mm(b), (r(2, 3, dtype=F32), r(3, 2, dtype=F32)),
             all_grads=True),
        Case(lambda lib, a, b: lib.mm(a, b), (r(0, 3), r(3, 2))),
        Case(lambda lib, a, b: lib.mm(a, b), (r(2, 3, 4), r(4, 2)), raises=RuntimeError),
        Case(lambda lib, a, b: lib.mm(a, b), (r(4), r(4, 2)), raises=RuntimeError),
        Case(lambda lib, a, b: lib.mm(a, b), (X, r(3, 2)), raises=RuntimeError)],
    "bmm": [Case(lambda lib, a, b: lib.bmm(a, b), (r(2, 3, 4), r(2, 4, 2, seed=1)), lay)
            for lay in LAYOUTS] + [
        Case(lambda lib, a, b: a.bmm(b), (r(2, 0, 3), r(2, 3, 1))),
        Case(lambda lib, a, b: lib.bmm(a, b), (r(2, 3, 4), r(3, 4, 2)), raises=RuntimeError),
        Case(lambda lib, a, b: lib.bmm(a, b), (r(3, 4), r(4, 2)), raises=RuntimeError)],
    "t": [Case(lambda lib, x: lib.t(x), (X,), lay) for lay in LAYOUTS] + [
        Case(lambda lib, x: x.t(), (r(4),)), Case(lambda lib, x: x.t(), (r(),)),
        Case(lambda lib, x: x.t(), (r(0, 3),)),
        Case(lambda lib, x: x.t(), (r(2, 3, 4),), raises=RuntimeError)],
    "dot": [Case(lambda lib, a, b: lib.dot(a, b), (r(4), r(4, seed=1)), "sliced"),
            Case(lambda lib, a, b: a.dot(b), (r(0), r(0))),
            Case(lambda lib, a, b: lib.dot(a, b), (r(3), r(4)), raises=RuntimeError),
            Case(lambda lib, a, b: lib.dot(a, b), (X, r(4)), raises=RuntimeError)],
    "mv": [Case(lambda lib, a, v: lib.mv(a, v), (X, r(4, seed=1)), lay) for lay in LAYOUTS] + [
        Case(lambda lib, a, v: a.mv(v), (r(0, 3), r(3))),
        Case(lambda lib, a, v: lib.mv(a, v), (X, r(3)), raises=RuntimeError)],
    "outer": [Case(lambda lib, a, b: lib.outer(a, b), (r(3), r(4, seed=1)), "sliced"),
              Case(lambda lib, a, b: a.outer(b), (r(0), r(2))),
              Case(lambda lib, a, b: lib.outer(a, b), (r(3, dtype=I64), r(2)))],
    "addmm": [Case(lambda lib, c, a, b: lib.addmm(c, a, b), (r(3, 2), X, r(4, 2, seed=1)), lay)
              for lay in LAYOUTS] + [
        Case(lambda lib, c, a, b: lib.addmm(c, a, b, beta=0.5, alpha=2), (r(2), X, r(4, 2))),
        Case(lambda lib, c, a, b: c.addmm(a, b, beta=0), (arr([np.nan, 1.0]), X, r(4, 2))),
        Case(lambda lib, c, a, b: lib.addmm(c, a, b), (r(0, 2), r(0, 3), r(3, 2)))],
    "baddbmm": [Case(lambda lib, c, a, b: lib.baddbmm(c, a, b, alpha=0.5),
                     (r(2, 3, 2), r(2, 3, 4), r(2, 4, 2, seed=1)), "transposed"),
                Case(lambda lib, c, a, b: c.baddbmm(a, b, beta=2), (r(1), r(2, 0, 4), r(2, 4, 1)))],
    "addcmul": [Case(lambda lib, x, a, b: lib.addcmul(x, a, b, value=0.5), (X, r(4), r(3, 1)),
                     lay) for lay in LAYOUTS] + [
        Case(lambda lib, x, a, b: x.addcmul(a, b), (r(0, 2), r(2), r(2))),
        Case(lambda lib, x, a, b: lib.addcmul(x, a, b, value=2),
             (r(2, dtype=I64), r(2, dtype=I64), r(2, dtype=I64)))],
    "addcdiv": [Case(lambda lib, x, a, b: lib.addcdiv(x, a, b, value=-0.5),
                     (X, r(4), r(3, 1, lo=0.5)), lay) for lay in LAYOUTS] + [
        Case(lambda lib, x, a, b: x.addcdiv(a, b), (r(0, 2), r(2), r(2, lo=0.5))),
        Case(lambda lib, x, a, b: lib.addcdiv(x, a, b), (r(2), r(2, dtype=I64),
                                                         r(2, dtype=I64, lo=1)),
             raises=RuntimeError)],
    "nansum": [Case(lambda lib, x: lib.nansum(x), (arr([[1.0, np.nan], [2.0, 3.0]]),)),
               Case(lambda lib, x: x.nansum(1, keepdim=True), (arr([[1.0, np.nan], [2.0, 3.0]]),),
                    "transposed"),
               Case(lambda lib, x: lib.nansum(x, 0), (r(2, 3, dtype=I64),)),
               Case(lambda lib, x: lib.nansum(x, 0, dtype=lib.float64), (r(2, 3, dtype=F32),)),
               Case(lambda lib, x: lib.nansum(x, 1), (r(2, 0),))],
    "nanmean": [Case(lambda lib, x: lib.nanmean(x), (arr([[1.0, np.nan], [2.0, 3.0]]),)),
                Case(lambda lib, x: x.nanmean(0), (arr([[np.nan, np.nan], [2.0, 3.0]]),)),
                Case(lambda lib, x: lib.nanmean(x, 1), (X,), "sliced"),
                Case(lambda lib, x: lib.nanmean(x, 0), (r(0, 2),)),
                Case(lambda lib, x: lib.nanmean(x), (r(2, dtype=I64),), raises=RuntimeError)],
    # ------------------------------------------------------------------ views and shapes
    "ravel": [Case(lambda lib, x: lib.ravel(x), (X,), lay) for lay in LAYOUTS] + [
        Case(lambda lib, x: x.ravel(), (r(0, 3),)), Case(lambda lib, x: x.ravel(), (r(),))],
    "select": [Case(lambda lib, x: lib.select(x, 1, -1), (X,), lay) for lay in LAYOUTS] + [
        Case(lambda lib, x: x.select(0, 1), (r(3, 0),)),
        Case(lambda lib, x: x.select(1, 4), (X,), raises=IndexError)],
    "fliplr": [Case(lambda lib, x: lib.fliplr(x), (X,), "transposed"),
               Case(lambda lib, x: x.fliplr(), (r(0, 3),)),
               Case(lambda lib, x: x.fliplr(), (r(3),), raises=RuntimeError)],
    "flipud": [Case(lambda lib, x: lib.flipud(x), (X,), "sliced"),
               Case(lambda lib, x: x.flipud(), (r(0, 3),)),
               Case(lambda lib, x: x.flipud(), (r(),), raises=RuntimeError)],
    # ------------------------------------------------------------------ views and shapes
    "reshape": [Case(lambda lib, x: lib.reshape(x, (4, 3)), (X,), "transposed"),
                Case(lambda lib, x: x.reshape(shape=(2, 6)), (X,)),
                Case(lambda lib, x: lib.reshape(x, (-1,)), (r(0, 3),))],
    "view": [Case(lambda lib, x: x.view(size=(2, 6)), (X,)),
             Case(lambda lib, x: x.view(-1, 2), (r(0, 4),))],
    "permute": [Case(lambda lib, x: lib.permute(x, (1, 0)), (X,), "sliced"),
                Case(lambda lib, x: x.permute(dims=(2, 0, 1)), (r(2, 3, 4),)),
                Case(lambda lib, x: lib.permute(x, (1, 0)), (r(0, 3),))],
    "transpose": [Case(lambda lib, x: lib.transpose(x, 0, 1), (X,), "transposed"),
                  Case(lambda lib, x: lib.transpose(x, 0, 1), (r(0, 3),))],
    "squeeze": [Case(lambda lib, x: lib.squeeze(x, (0, 2)), (r(1, 3, 1),)),
                Case(lambda lib, x: x.squeeze(0, 2), (r(1, 3, 1),)),  # varargs
                Case(lambda lib, x: x.squeeze(dim=(0, 1)), (r(1, 1, 3),)),
                Case(lambda lib, x: x.squeeze(), (r(1, 3, 1),)),
                Case(lambda lib, x: lib.squeeze(x), (r(0, 1),))],
    "unsqueeze": [Case(lambda lib, x: lib.unsqueeze(x, 1), (X,), "sliced"),
                  Case(lambda lib, x: lib.unsqueeze(x, -1), (r(0, 3),))],
    "flatten": [Case(lambda lib, x: lib.flatten(x, 1), (r(2, 3, 4),)),
                Case(lambda lib, x: lib.flatten(x), (r(0, 3),))],
    "unflatten": [Case(lambda lib, x: lib.unflatten(x, 1, (2, 2)), (X,)),
                  Case(lambda lib, x: lib.unflatten(x, 1, (2, 2)), (r(0, 4),))],
    "narrow": [Case(lambda lib, x: lib.narrow(x, 1, 1, 2), (X,), "transposed"),
               Case(lambda lib, x: lib.narrow(x, 1, 0, 2), (r(0, 4),))],
    "split": [Case(lambda lib, x: lib.split(x, 2, 1), (X,)),
              Case(lambda lib, x: lib.split(x, [1, 3], dim=1), (X,), "sliced"),
              Case(lambda lib, x: lib.split(x, 2, 1), (r(0, 4),))],
    "chunk": [Case(lambda lib, x: lib.chunk(x, 2, 0), (r(4, 3),)),
              Case(lambda lib, x: lib.chunk(x, 2, 1), (r(0, 4),))],
    "unbind": [Case(lambda lib, x: lib.unbind(x, 1), (X,), "transposed"),
               Case(lambda lib, x: lib.unbind(x, 1), (r(0, 2),))],
    "as_strided": [Case(lambda lib, x: lib.as_strided(x, (2, 2), (1, 2)), (r(6),))],
    "clone": [Case(lambda lib, x: lib.clone(x), (X,), "transposed"),
              Case(lambda lib, x: lib.clone(x), (r(0, 2),))],
    "expand": [Case(lambda lib, x: lib.broadcast_to(x, (2, 3, 4)), (X,)),
               Case(lambda lib, x: x.expand(size=(2, 3, 4)), (X,), "sliced"),
               Case(lambda lib, x: lib.broadcast_to(x, (2, 0, 3)), (r(0, 3),))],
    "flip": [Case(lambda lib, x: x.flip(0, 1), (X,), lay) for lay in LAYOUTS] + [
        Case(lambda lib, x: x.flip(dims=(0,)), (X,)), Case(lambda lib, x: x.flip(1), (X,)),
        Case(lambda lib, x: x.flip(0, 1), (r(0, 3),))],
    "tile": [Case(lambda lib, x: x.tile(2, 2), (X,), "transposed"),
             Case(lambda lib, x: x.tile(2), (X,)), Case(lambda lib, x: x.tile(dims=(2, 1)), (X,)),
             Case(lambda lib, x: x.tile(3, 1, 2), (X,)),
             Case(lambda lib, x: x.tile(2, 1), (r(0, 3),))],
    "repeat": [Case(lambda lib, x: x.repeat(2, 1, 3), (X,), "sliced"),
               Case(lambda lib, x: x.repeat((1, 2)), (r(0, 3),))],
    "to": [Case(lambda lib, x: x.to("cpu", non_blocking=True), (X,), "transposed"),
           Case(lambda lib, x: x.to(lib.float32, copy=True), (X,)),
           Case(lambda lib, x: x.to(x, True, True) * 2, (X,)),
           Case(lambda lib, x: x.to("cpu", lib.float64, False, True), (r(0, 2, dtype=F32),)),
           Case(lambda lib, x: x.to("cpu", shiny=True), (X,), raises=TypeError)],
    # ------------------------------------------------------------------ nn functions as torch.*
    "conv1d": [Case(lambda lib, x, w: lib.conv1d(x, w, None, 1, 1), (r(2, 3, 5), r(4, 3, 3)))],
    "conv2d": [Case(lambda lib, x, w: lib.conv2d(x, w, padding=1),
                    (r(1, 2, 4, 4), r(3, 2, 3, 3)))],
    "conv_transpose1d": [Case(lambda lib, x, w: lib.conv_transpose1d(x, w, stride=2),
                              (r(1, 2, 4), r(2, 3, 3)))],
    "conv_transpose2d": [Case(lambda lib, x, w: lib.conv_transpose2d(x, w),
                              (r(1, 2, 3, 3), r(2, 1, 2, 2)))],
    "layer_norm": [Case(lambda lib, x, w, b: lib.layer_norm(x, (4,), w, b, 1e-5),
                        (X, r(4, seed=1), r(4, seed=2)), "transposed")],
    "rms_norm": [Case(lambda lib, x, w: lib.rms_norm(x, [4], w), (X, r(4, seed=1)))],
    "group_norm": [Case(lambda lib, x: lib.group_norm(x, 2), (r(2, 4, 3),))],
    "max_pool1d": [Case(lambda lib, x: lib.max_pool1d(x, 2), (r(2, 3, 6),))],
    "max_pool2d": [Case(lambda lib, x: lib.max_pool2d(x, 2, 1), (r(1, 2, 4, 4),))],
    "avg_pool1d": [Case(lambda lib, x: lib.avg_pool1d(x, 3, 2, 1), (r(2, 3, 7),))],
    "adaptive_avg_pool1d": [Case(lambda lib, x: lib.adaptive_avg_pool1d(x, 2), (r(2, 3, 5),))],
}



def _ip(x, name, *args, **kwargs):
    """x.<name>_(*args) on a non-leaf copy of x (the gradient reaches x through it)."""
    y = x * 1
    out = getattr(y, f"{name}_")(*args, **kwargs)
    assert out is y
    return y


def _in_place(name, *args, **kwargs):  # the row's tensors first, then args
    return lambda lib, x, *tensors: _ip(x, name, *tensors, *args, **kwargs)


UNIT = r(3, 4, lo=0.1) * 0.4  # in (0.04, 0.84): every unary op's domain but acosh's
_UNARY_INPLACE = [m[:-1] for m in RESULT_METHODS
                  if m[:-1] in ("abs", "absolute", "acos", "arccos", "arcsin", "arcsinh",
                                "arctan", "arctanh", "asin", "asinh", "atan", "atanh",
                                "ceil", "cos", "cosh", "erf", "erfc", "erfinv", "exp", "exp2",
                                "expm1", "fix", "floor", "frac", "log", "log10", "log1p",
                                "log2", "nan_to_num", "neg", "negative", "reciprocal", "relu",
                                "round", "rsqrt", "sgn", "sigmoid", "sign", "sin", "sinh",
                                "sqrt", "square", "tan", "tanh", "trunc")]
# torch has no derivative for the in-place inverse hyperbolic functions: values only
_NO_TORCH_GRAD = {"arcsinh", "arctanh", "asinh", "atanh"}
ROWS["inplace"] = [Case(_in_place(n), (UNIT,), "transposed", grad=n not in _NO_TORCH_GRAD)
                   for n in _UNARY_INPLACE] + [
    Case(_in_place("acosh"), (r(3, 4, lo=1.5),), grad=False),
    Case(_in_place("pow", 2), (X,), "sliced"), Case(_in_place("pow"), (X, r(4, lo=1))),
    Case(_in_place("remainder", 1.5), (X,)), Case(_in_place("fmod"), (X, r(4, lo=0.5))),
    Case(_in_place("atan2"), (X, Y)), Case(_in_place("arctan2"), (X, Y)),
    Case(_in_place("hypot"), (X, Y)), Case(_in_place("copysign"), (X, Y)),
    Case(_in_place("lerp"), (X, Y, r(3, 1, seed=2))),
    Case(_in_place("floor_divide", 2), (X,), grad=False),
    Case(_in_place("true_divide"), (X, r(4, lo=0.5))), Case(_in_place("divide", 2), (X,)),
    Case(_in_place("multiply"), (X, Y)), Case(_in_place("subtract", alpha=2), (X, Y)),
    Case(_in_place("clip", -0.5, 0.5), (X,)), Case(_in_place("nan_to_num", 0.0, 1.0),
                                                   (arr([np.nan, np.inf, 2.0]),)),
    Case(_in_place("tril"), (X,)), Case(_in_place("triu", 1), (X,), "transposed"),
    Case(_in_place("cumsum", 1), (X,)), Case(_in_place("cumprod", 0), (X,)),
    Case(_in_place("addcmul", value=0.5), (X, Y, r(3, 1))),
    Case(_in_place("addcdiv"), (X, Y, r(3, 1, lo=0.5))),
    Case(_in_place("addmm", beta=0.5), (r(3, 2), X, r(4, 2))),
    Case(_in_place("baddbmm"), (r(2, 3, 2), r(2, 3, 4), r(2, 4, 2))),
    Case(lambda lib, x, i, v: _ip(x, "index_add", 0, i, v), (X, arr([2, 0], I64), r(2, 4))),
    Case(lambda lib, x, i, v: _ip(x, "scatter", 1, i, v), (X, arr([[0], [2], [1]], I64),
                                                         r(3, 1))),
    Case(lambda lib, x, i: _ip(x, "scatter", 1, i, 1.0), (X, arr([[0], [2], [1]], I64))),
    Case(lambda lib, x, i, v: _ip(x, "scatter_add", 0, i, v), (X, arr([[1, 0, 2, 2]], I64),
                                                             r(1, 4))),
    Case(lambda lib, x, i: _ip(x, "index_fill", 1, i, -1.0), (X, arr([0, 3], I64))),
    Case(lambda lib, x, i, v: _ip(x, "index_copy", 0, i, v), (X, arr([1], I64), r(1, 4))),
    Case(_in_place("masked_scatter"), (X, arr([[True, False, True, False]] * 3, B), r(12))),
    Case(_in_place("sigmoid"), (r(0, 3),)),
    # a comparison written in: no gradient (torch's is zeros)
    Case(_in_place("eq", 0.5), (arr([0.5, 1.0]),), grad=False),
    Case(_in_place("lt"), (X, Y), grad=False),
    Case(_in_place("logical_not"), (arr([0.0, 2.0]),), grad=False),
    Case(_in_place("bitwise_and", 6), (r(2, 3, dtype=I64),)),
    Case(_in_place("exp"), (r(2, 3, dtype=I64),), raises=RuntimeError),
    Case(_in_place("pow"), (r(4), X), raises=RuntimeError),  # the result does not fit
]

PARAMS, IDS = case_ids(ROWS)


@pytest.mark.parametrize("name, k", PARAMS, ids=IDS)
def test_matches_torch(name, k):
    torch = pytest.importorskip("torch")
    check_case(ROWS[name][k], torch)


# ----------------------------------------------------------------------------- named tuples
NAMED = {  # op: (call, torch's field names)
    "max": (lambda lib, x: lib.max(x, 1), ("values", "indices")),
    "min": (lambda lib, x: x.min(dim=0, keepdim=True), ("values", "indices")),
    "sort": (lambda lib, x: lib.sort(x, descending=True), ("values", "indices")),
    "topk": (lambda lib, x: x.topk(2, dim=0), ("values", "indices")),
    "kthvalue": (lambda lib, x: lib.kthvalue(x, 2, 1), ("values", "indices")),
    "median": (lambda lib, x: x.median(1), ("values", "indices")),
    "mode": (lambda lib, x: lib.mode(x.round(), 0), ("values", "indices")),
    "cummax": (lambda lib, x: lib.cummax(x, 1), ("values", "indices")),
    "cummin": (lambda lib, x: x.cummin(0), ("values", "indices")),
    "aminmax": (lambda lib, x: lib.aminmax(x, dim=1), ("min", "max")),
    "nanmedian": (lambda lib, x: x.nanmedian(0), ("values", "indices")),
}


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_tuples_are_torchs(name):
    torch = pytest.importorskip("torch")
    call, fields = NAMED[name]
    x = r(3, 4, seed=3)
    ours, theirs = call(ta, ta.tensor(x)), call(torch, torch.tensor(x))
    assert type(ours).__name__ == type(theirs).__name__ == name
    assert type(ours) is getattr(ta.return_types, name)
    assert isinstance(ours, tuple) and len(ours) == len(theirs) == 2
    for k, field in enumerate(fields):  # by name, by index and unpacked: the same tensors
        a, b = getattr(ours, field), getattr(theirs, field)
        assert a is ours[k] and tuple(a.shape) == tuple(b.shape)
        np.testing.assert_allclose(a.numpy(), b.numpy())
    first, second = ours
    assert first is ours[0] and second is ours[1]
    assert repr(ours).startswith(f"tinygrad_attn.return_types.{name}(\n{fields[0]}=tensor(")


def test_plain_tuples_where_torch_returns_them():
    torch = pytest.importorskip("torch")
    x = r(3, 4)
    for call in (lambda lib, t: lib.var_mean(t, 1), lambda lib, t: lib.std_mean(t),
                 lambda lib, t: t.split(2, 1), lambda lib, t: t.chunk(2)):
        ours, theirs = call(ta, ta.tensor(x)), call(torch, torch.tensor(x))
        assert type(ours) is type(theirs) is tuple


def test_the_gradient_flows_through_values():
    x = ta.tensor([[1.0, 5.0, 2.0], [4.0, 0.0, 3.0]], requires_grad=True)
    x.max(dim=1).values.sum().backward()
    assert x.grad.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    x.grad = None
    lo, hi = ta.aminmax(x, dim=0)
    (hi - lo).sum().backward()
    assert x.grad.tolist() == [[-1.0, 1.0, -1.0], [1.0, -1.0, 1.0]]


def test_named_tuples_pickle_and_compare_as_tuples():
    out = ta.tensor([[3.0, 1.0], [0.0, 2.0]]).sort(1)
    back = pickle.loads(pickle.dumps(out))
    assert type(back) is ta.return_types.sort
    assert back.values.tolist() == [[1.0, 3.0], [0.0, 2.0]]
    assert back.indices.tolist() == [[1, 0], [0, 1]]
    assert out[:1] == (out.values,)  # slicing gives a plain tuple, as torch's


# ----------------------------------------------------------------------------- methods
def test_format_of_a_0d_tensor_formats_the_number():
    torch = pytest.importorskip("torch")
    for value in (1.23456, 7):
        ours, theirs = ta.tensor(value), torch.tensor(value)
        for spec in (".4f", "", "8.2e", "d" if isinstance(value, int) else ".1%"):
            assert f"{ours:{spec}}" == f"{theirs:{spec}}", spec
    loss = ta.tensor([0.5, 0.25], requires_grad=True).sum()
    assert f"step 3: loss {loss:.4f}" == "step 3: loss 0.7500"
    for shape in ((2,), (1,)):  # only 0-d takes a spec, as torch's
        with pytest.raises(TypeError):
            format(ta.ones(*shape), ".4f")
        with pytest.raises(TypeError):
            format(torch.ones(*shape), ".4f")
    assert f"{ta.ones(2)}" == repr(ta.ones(2))


def test_type_strings_and_type_conversion():
    torch = pytest.importorskip("torch")
    for dtype in ("float32", "float64", "float16", "int64", "int32", "int16", "int8",
                  "uint8", "bool"):
        ours, theirs = ta.zeros(2, dtype=dtype), torch.zeros(2, dtype=getattr(torch, dtype))
        assert ours.type() == theirs.type()
    x = ta.tensor([1.5, -2.5])
    assert x.type(ta.int64).tolist() == [1, -2] and x.type(ta.int64).dtype is ta.int64
    assert x.type("torch.DoubleTensor").dtype is ta.float64
    assert x.type(x.type()) .dtype is ta.float32
    with pytest.raises(ValueError, match="type"):
        x.type("torch.ComplexFloatTensor")
    assert x.byte().dtype is ta.uint8 and x.char().dtype is ta.int8
    assert x.short().dtype is ta.int16


def test_new_factories_take_self_dtype_and_device():
    torch = pytest.importorskip("torch")
    for lib in (ta, torch):
        x = lib.ones(2, 3, dtype=lib.float64)
        assert tuple(x.new_zeros(2, 3).shape) == tuple(x.new_zeros((2, 3)).shape) == (2, 3)
        assert x.new_zeros(2).dtype == lib.float64
        assert x.new_ones(2, dtype=lib.int32).dtype == lib.int32
        assert x.new_ones(3).tolist() == [1.0, 1.0, 1.0]
        assert x.new_full((2,), 7).tolist() == [7.0, 7.0]
        assert x.new_full((2,), 7).dtype == lib.float64
        assert tuple(x.new_empty(4, 0).shape) == (4, 0) and x.new_empty(1).dtype == lib.float64
        y = x.new_tensor([1, 2])
        assert y.dtype == lib.float64 and y.tolist() == [1.0, 2.0] and y.is_leaf
        assert x.new_zeros(2, requires_grad=True).requires_grad
        assert x.new_zeros(()).shape == ()
        with pytest.raises(RuntimeError):
            x.new_zeros(-1)


def test_small_methods_match_torch():
    torch = pytest.importorskip("torch")
    for lib in (ta, torch):
        x = lib.zeros(2, 3, 4)
        assert (x.nelement(), x.ndimension(), x.dim(), x.element_size()) == (24, 3, 3, 4)
        assert x.is_complex() is False and x.is_cpu and x.get_device() == -1
        assert lib.numel(x) == 24 and lib.is_tensor(x) and not lib.is_tensor(x.tolist())
        assert tuple(x.size()) == (2, 3, 4) and x.size(-1) == 4 and x.size(dim=1) == 3
        assert x[0].t().shape == (4, 3) and tuple(x[0, 0].T.shape) == (4,)
        y = (x * 2).sum(0)
        assert not y.retains_grad
    w = ta.ones(2, requires_grad=True)
    h = w * 3
    h.retain_grad()
    assert h.retains_grad and not w.retains_grad


def test_to_returns_self_unless_it_must_copy_as_torch():
    torch = pytest.importorskip("torch")
    for lib in (ta, torch):
        x = lib.ones(2, 3)
        assert x.to("cpu", non_blocking=True) is x and x.to(x.dtype) is x
        assert x.to(x, False, False) is x
        for y in (x.to(lib.float32, copy=True), x.to("cpu", lib.float32, False, True)):
            assert y is not x
            y.add_(1)  # a copy: x keeps its values
            assert x.tolist() == [[1.0] * 3] * 2 and y.tolist() == [[2.0] * 3] * 2


# ----------------------------------------------------------------------------- varargs
# Every Tensor method torch takes as `*dims` / `*sizes` (one sequence or separate ints) and
# the keyword torch names it by, in both libraries.
VARARGS = {
    "view": ((6, 4), {"size": (6, 4)}),
    "reshape": ((4, 6), {"shape": (4, 6)}),
    "permute": ((2, 0, 1), {"dims": (2, 0, 1)}),
    "flip": ((0, 2), {"dims": (0, 2)}),
    "tile": ((2, 1, 1), {"dims": (2, 1, 1)}),
    "repeat": ((1, 2, 1), None),
    "expand": ((2, 2, 3, 4), {"size": (2, 2, 3, 4)}),
    "new_zeros": ((2, 5), None), "new_ones": ((2, 5), None), "new_empty": ((2, 5), None),
}


@pytest.mark.parametrize("method", sorted(VARARGS))
def test_every_varargs_form_torch_takes(method):
    torch = pytest.importorskip("torch")
    sizes, keyword = VARARGS[method]
    x = r(2, 3, 4)
    forms = [lambda t: getattr(t, method)(*sizes), lambda t: getattr(t, method)(sizes),
             lambda t: getattr(t, method)(list(sizes))]
    if keyword is not None:
        forms.append(lambda t: getattr(t, method)(**keyword))
    for form in forms:
        ours, theirs = form(ta.tensor(x)), form(torch.tensor(x))
        assert tuple(ours.shape) == tuple(theirs.shape)
        if not method.startswith("new_"):  # new_empty's values are unwritten in torch
            np.testing.assert_allclose(ours.numpy(), theirs.numpy())


def test_varargs_methods_are_all_covered():
    """torch's methods documented as `name(*sizes)` that the engine has are all in VARARGS
    (flip, tile and the new_* factories take varargs too, undocumented, and are there)."""
    torch = pytest.importorskip("torch")
    star = set()
    for name in dir(torch.Tensor):
        doc = getattr(getattr(torch.Tensor, name, None), "__doc__", None) or ""
        head = doc.strip().split("\n", 1)[0]
        if head.startswith(f"{name}(*") and not head.startswith(f"{name}(*,"):
            star.add(name)
    assert {"view", "permute", "repeat", "reshape", "expand"} <= star  # the walk finds them
    have = {n for n in star if hasattr(ta.Tensor, n)} - {"to"}  # to(*args): its own rows
    assert have <= set(VARARGS), sorted(have - set(VARARGS))


def test_bad_keywords_name_the_method():
    x = ta.zeros(2, 3)
    with pytest.raises(TypeError, match="permute"):
        x.permute(1, 0, dims=(1, 0))
    with pytest.raises(TypeError, match="flip"):
        x.flip(axis=0)


def test_registered_function_forms_keep_their_names():
    """A few names a scan of training scripts finds, each the registered function."""
    for name in ("sum", "mean", "max", "min", "argmax", "reshape", "transpose", "squeeze",
                 "unsqueeze", "split", "chunk", "bmm", "mm", "clone", "numel", "std", "var",
                 "eq", "pow", "flatten", "div", "floor_divide", "remainder", "clip", "t"):
        assert getattr(ta, name) is REGISTRY[name if name != "clip" else "clamp"].fn, name
