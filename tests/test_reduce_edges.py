"""Reductions at their edge points, against torch 2.13: var/std/var_mean/std_mean on a
constant input, with correction >= n, over one element and over none (forward and
gradient, torch's two backward forms: with and without a dim), and `dim=()` / `dim=[]`
meaning every dim for each reduction that takes a dim (any/all: none, as torch's;
logsumexp and prod raise as torch's do)."""

from __future__ import annotations

import numpy as np
import pytest
from rows_vs_torch import Case, arr, check_case

import tinygrad_attn as ta

# both libraries warn about a dof <= 0; the values are what is checked
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")

CONST = arr([[1.0, 1, 1], [1, 2, 4]])  # a constant row beside a varying one


def _fn(name, **kw):
    def fn(lib, x):
        if name in ("var_mean", "std_mean"):
            return getattr(lib, name)(x, **kw)
        return getattr(x, name)(**kw)
    return fn


EDGES = []
for _name in ("var", "std", "var_mean", "std_mean"):
    EDGES += [
        Case(_fn(_name), (arr([1.0, 1, 1]),)),  # constant: std's gradient is 0, not nan
        Case(_fn(_name), (arr([2.0]),)),  # n == 1 == correction: nan
        Case(_fn(_name, correction=0), (arr([2.0]),)),
        Case(_fn(_name, correction=3), (arr([1.0, 2, 3]),)),  # correction == n
        Case(_fn(_name, correction=5), (arr([1.0, 2, 3]),)),  # correction > n
        Case(_fn(_name, correction=4), (arr([1.0, 1, 1]),)),
        Case(_fn(_name, dim=1), (CONST,)),
        Case(_fn(_name, dim=1, correction=3), (CONST,)),  # the dim form: 2 / dof = inf
        Case(_fn(_name, dim=1, correction=5), (CONST,)),  # 2 / dof < 0
        Case(_fn(_name, dim=[0, 1], correction=6), (CONST,)),
        Case(_fn(_name, correction=6), (CONST,)),  # no dim: inf, nan where x == mean
        Case(_fn(_name, dim=1, keepdim=True), (CONST,), layout="transposed"),
        Case(_fn(_name), (arr(3.0),)),  # 0-d
        Case(_fn(_name, correction=0), (arr(3.0),)),
        Case(_fn(_name, correction=2), (arr(3.0),)),
        Case(_fn(_name, dim=0), (arr(3.0),)),
        Case(_fn(_name), (np.zeros((0,)),)),  # zero-size
        Case(_fn(_name, dim=0), (np.zeros((0, 3)),)),
        Case(_fn(_name, dim=1), (np.zeros((2, 0)),)),
    ]


@pytest.mark.parametrize("k", range(len(EDGES)))
def test_var_std_edges_match_torch(k):
    torch = pytest.importorskip("torch")
    check_case(EDGES[k], torch)


def _empty_dim(name, dim, **kw):
    def fn(lib, x):
        if name == "vector_norm":
            return lib.linalg.vector_norm(x, dim=dim, **kw)
        if name == "norm":
            return x.norm(dim=dim, **kw)
        if name in ("var_mean", "std_mean"):
            return getattr(lib, name)(x, dim, **kw)
        return getattr(x, name)(dim, **kw)
    return fn


REDUCTIONS = ["sum", "mean", "amax", "amin", "var", "std", "var_mean", "std_mean",
              "count_nonzero", "any", "all", "norm", "vector_norm"]


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [(), []], ids=["tuple", "list"])
@pytest.mark.parametrize("name", REDUCTIONS)
def test_an_empty_dim_list_means_every_dim(name, dim, keepdim):
    torch = pytest.importorskip("torch")
    kw = {} if name == "count_nonzero" else {"keepdim": keepdim}
    if name == "count_nonzero" and keepdim:
        pytest.skip("count_nonzero takes no keepdim")
    x = np.random.default_rng(0).standard_normal((2, 3))
    # var/std's gradient over dim=() is that of dim=[0, 1]: torch's backward there counts
    # n = 1 (inf), against its own forward (DIFFERENCES["var/std"])
    grad = "var" not in name and "std" not in name
    check_case(Case(_empty_dim(name, dim, **kw), (x,), grad=grad), torch)
    check_case(Case(_empty_dim(name, dim, **kw), (arr(1.5),), grad=grad), torch)  # 0-d
    if not grad:
        check_case(Case(_empty_dim(name, [0, 1], **kw), (x,)), torch)
        ours = ta.tensor(x, requires_grad=True)
        out = _empty_dim(name, dim, **kw)(ta, ours)
        (out[0] if isinstance(out, tuple) else out).sum().backward()
        theirs = torch.tensor(x, requires_grad=True)
        out = _empty_dim(name, [0, 1], **kw)(torch, theirs)
        (out[0] if isinstance(out, tuple) else out).sum().backward()
        np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("dim", [(), []], ids=["tuple", "list"])
def test_logsumexp_and_prod_with_an_empty_dim_raise_as_torch(dim):
    torch = pytest.importorskip("torch")
    x = np.ones((2, 3))
    check_case(Case(lambda lib, x: x.logsumexp(dim), (x,), raises=RuntimeError), torch)
    check_case(Case(lambda lib, x: x.logsumexp(dim, keepdim=True), (x,)), torch)
    check_case(Case(lambda lib, x: x.logsumexp(dim), (arr(2.0),)), torch)
    check_case(Case(lambda lib, x: x.prod(dim), (x,), raises=TypeError), torch)
    with pytest.raises(RuntimeError, match="logsumexp"):
        ta.ones(2, 3).logsumexp(dim)
