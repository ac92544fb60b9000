"""More reductions: prod, amax/amin, any/all, count_nonzero, var_mean/std_mean, norms.

Each takes `dim` as torch does: None or an empty tuple/list for every dim (any/all: an
empty one reduces nothing), an int, or a tuple of ints; `keepdim` keeps the reduced dims
as size 1.
"""

from __future__ import annotations

import builtins
import math

from .. import backend, return_types
from .. import shape as shp
from ..autograd import Function
from ..autograd.graph import recording
from ._math_util import wide
from ._recorded import backward_xp
from ._util import Tensor, from_array
from .elementwise import Div, div
from .indexing import Where, where
from .logical import isnan, logical_not
from .reduce import Mean, Std, Sum, Var, _axes, _keep_shape, mean
from .reduce import sum as sum_dims
from .registry import op


def _reduce_axes(x: Tensor, dim, op: str, empty_is_all: bool = True):
    """The reduced axes; an empty dim means every dim (any/all: none, as torch's)."""
    if empty_is_all and isinstance(dim, (tuple, list)) and len(dim) == 0:
        dim = None
    if x.ndim == 0 and dim is not None:  # a scalar reduces over "dim 0", as in torch
        for d in (dim if isinstance(dim, (tuple, list)) else (dim,)):
            shp.normalize_dim(d, 0, op)
        return ()
    return _axes(x, dim, op, empty_is_all)


def _grad_keep(g: Tensor, shape, axes, keepdim):
    """g as an array with the reduced dims present as size 1 (a view, no copy)."""
    G = g._array()
    return G if keepdim else G.reshape(_keep_shape(shape, axes))


class Prod(Function):
    """y = prod(x, dims);  gx_k = g * prod_{i != k} x_i (over the reduced dims).

    Zero-safe, as torch's: the product of the others is the exclusive cumprod from the left
    times the one from the right, never y / x. Saves the input. float16 is multiplied in
    float32 and rounded once.
    """

    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, dtype=None):
        if isinstance(dim, (tuple, list)) and len(dim) == 0:
            raise TypeError(f"prod: dim must be an int or None (torch's prod takes no dim "
                            f"list), got {dim!r} for an input of shape {tuple(x.shape)}")
        axes = _reduce_axes(x, dim, "prod")
        out_dtype = backend.accumulating(x.dtype) if dtype is None else backend.to_dtype(dtype)
        ctx.shape, ctx.axes, ctx.keepdim = x.shape, axes, keepdim
        ctx.save_for_backward(x)
        xp = backend.xp_for(x.device)
        if out_dtype is backend.float16:  # NumPy multiplies float16 in float16: 5000 factors
            #                               near 1 drifted by most of the product
            Y = xp.prod(x._array(), axis=axes, keepdims=keepdim, dtype="float32")
            return from_array(Y.astype(out_dtype.np))
        return from_array(xp.prod(x._array(), axis=axes, keepdims=keepdim, dtype=out_dtype.np))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        xp = backward_xp(x.device)
        X = wide(x._array())  # float16: the running products in float32, rounded once
        G = _grad_keep(g, ctx.shape, ctx.axes, ctx.keepdim)
        if X.size == 0:
            return from_array(xp.zeros(X.shape, dtype=x.dtype.np))
        kept = [i for i in range(X.ndim) if i not in ctx.axes]
        perm = kept + list(ctx.axes)
        moved = xp.transpose(X, perm)
        lead = moved.shape[: len(kept)]
        rows = moved.reshape(lead + (shp.numel(moved.shape[len(kept):]),))  # (kept, reduced)
        ones = xp.ones(rows.shape[:-1] + (1,), dtype=X.dtype)
        left = xp.cumprod(xp.concatenate([ones, rows[..., :-1]], axis=-1), axis=-1)
        right = xp.flip(xp.cumprod(xp.flip(xp.concatenate([rows[..., 1:], ones], axis=-1),
                                           -1), axis=-1), -1)
        others = (left * right).reshape(moved.shape)
        inverse = sorted(range(len(perm)), key=perm.__getitem__)
        return from_array((xp.transpose(others, inverse) * G).astype(G.dtype, copy=False))


class AMaxMin(Function):
    """y = amax / amin(x, dims);  gx = g / k at each of the k positions equal to y (ties
    share the gradient evenly, as torch's amax). Saves the mask of those positions (bool:
    a byte per element, less than the input)."""

    @staticmethod
    def forward(ctx, x, dim, keepdim, pick):
        axes = _reduce_axes(x, dim, pick)
        if x.numel() == 0:
            if len(axes) == x.ndim:
                raise RuntimeError(f"{pick}(): expected a reduction dim for an empty tensor "
                                   f"of shape {tuple(x.shape)}")
            if builtins.any(x.shape[a] == 0 for a in axes):
                raise IndexError(f"{pick}(): expected the reduction dims {axes} of shape "
                                 f"{tuple(x.shape)} to have non-zero size")
        xp = backend.xp_for(x.device)
        X = x._array()
        Y = (xp.max if pick == "amax" else xp.min)(X, axis=axes, keepdims=True)
        ctx.shape, ctx.axes, ctx.keepdim = x.shape, axes, keepdim
        if x.dtype.is_floating_point:
            ctx.save_for_backward(from_array(X == Y))
        return from_array(Y if keepdim else Y.reshape(
            tuple(s for i, s in enumerate(x.shape) if i not in axes)))

    @staticmethod
    def backward(ctx, g):
        (hit,) = ctx.saved_tensors
        xp = backward_xp(hit.device)
        H = hit._array()
        G = _grad_keep(g, ctx.shape, ctx.axes, ctx.keepdim)
        count = xp.sum(H, axis=ctx.axes, keepdims=True)
        return from_array(xp.where(H, G / xp.maximum(count, 1), 0).astype(G.dtype, copy=False))


class VectorNorm(Function):
    """y = (sum |x|^p)^(1/p) (p = inf: max |x|, -inf: min |x|, 0: count of non-zeros);
    gx = g sign(x) |x|^(p-1) / y^(p-1), 0 where y = 0 (as torch); inf/-inf: g sign(x) / k
    at the k extremal positions; p = 0: zero. Saves the input and the output.
    float16 is computed in float32 (its sum of squares overflows at 65504) and rounded once.
    """

    @staticmethod
    def forward(ctx, x, ord, dim, keepdim):  # noqa: A002 - torch's name
        if not x.dtype.is_floating_point:
            raise RuntimeError(f"linalg.vector_norm: expected a floating point tensor, got "
                            f"{x.dtype.name} (shape {tuple(x.shape)})")
        axes = _reduce_axes(x, dim, "vector_norm")
        p = float(ord)
        if p < 0 and x.numel() == 0:
            raise IndexError(f"linalg.vector_norm: cannot compute the {ord} norm of an empty "
                             f"tensor of shape {tuple(x.shape)}")
        xp = backend.xp_for(x.device)
        A = xp.abs(wide(x._array()))
        if p == math.inf:
            Y = xp.max(A, axis=axes, keepdims=True) if A.size else xp.zeros(
                _keep_shape(x.shape, axes), dtype=A.dtype)
        elif p == -math.inf:
            Y = xp.min(A, axis=axes, keepdims=True)
        elif p == 0:
            Y = xp.sum(A != 0, axis=axes, keepdims=True).astype(A.dtype)
        elif p == 1:
            Y = xp.sum(A, axis=axes, keepdims=True)
        elif p == 2:
            Y = xp.sqrt(xp.sum(A * A, axis=axes, keepdims=True))
        else:
            Y = xp.sum(A ** p, axis=axes, keepdims=True) ** (1.0 / p)
        ctx.p, ctx.shape, ctx.axes, ctx.keepdim = p, x.shape, axes, keepdim
        y = from_array(Y.astype(x.dtype.np, copy=False))
        ctx.save_for_backward(x, y)
        if keepdim:
            return y
        return y.view(tuple(s for i, s in enumerate(x.shape) if i not in axes))

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        if recording() and not ctx.keepdim:
            # the saved y is the kept-dims base of the output view, not the output: its
            # value with a graph comes from the norm again on the recorded x
            y = VectorNorm.apply(x, ctx.p, ctx.axes, True)
        xp = backward_xp(x.device)
        X, Y, p = wide(x._array()), wide(y._array()), ctx.p
        G = wide(_grad_keep(g, ctx.shape, ctx.axes, ctx.keepdim))
        return from_array(VectorNorm._grad(xp, X, Y, G, p, ctx.axes)
                          .astype(x.dtype.np, copy=False))

    @staticmethod
    def _grad(xp, X, Y, G, p, axes):
        sign = xp.sign(X)
        if p == 0:
            return xp.zeros_like(X)
        if p == 1:
            return sign * G
        if math.isinf(p):
            hit = xp.abs(X) == Y
            count = xp.maximum(xp.sum(hit, axis=axes, keepdims=True), 1)
            return xp.where(hit, sign * G / count, 0)
        safe = xp.where(Y == 0, 1, Y)
        if p == 2:
            return xp.where(Y == 0, 0, X * (G / safe))
        zero = (Y == 0) | (X == 0)  # |x|^(p-1) is inf at 0 for p < 1; torch gives 0 there
        scaled = sign * xp.where(zero, 1, xp.abs(X)) ** (p - 1) * (G / safe ** (p - 1))
        return xp.where(zero, 0, scaled)


# ----------------------------------------------------------------------------- entry points
@op(Prod, method=True, ta=True)
def prod(x, dim=None, keepdim=False, dtype=None):
    return Prod.apply(x, dim, keepdim, dtype)


@op(AMaxMin, method=True, ta=True)
def amax(x, dim=(), keepdim=False):
    return AMaxMin.apply(x, dim, keepdim, "amax")


@op(AMaxMin, method=True, ta=True)
def amin(x, dim=(), keepdim=False):
    return AMaxMin.apply(x, dim, keepdim, "amin")


@op(AMaxMin, method=True, ta=True)
def aminmax(x, *, dim=None, keepdim=False):
    """(min, max) over dim, every element when None: amin and amax, as torch's named tuple."""
    d = () if dim is None else dim
    return return_types.aminmax(AMaxMin.apply(x, d, keepdim, "amin"),
                                AMaxMin.apply(x, d, keepdim, "amax"))


def _any_all(x: Tensor, dim, keepdim, how: str) -> Tensor:
    """A bool tensor (uint8 for a uint8 input, as torch's); never differentiable."""
    axes = _reduce_axes(x, dim, how, empty_is_all=False)  # torch: dim=() reduces nothing
    xp = backend.xp_for(x.device)
    out = getattr(xp, how)(x._array(), axis=axes, keepdims=keepdim)
    out = xp.asarray(out)
    return from_array(out.astype(xp.uint8) if x.dtype is backend.uint8 else out)


@op(method=True, ta=True)
def any(x, dim=None, keepdim=False):  # noqa: A001
    return _any_all(x, dim, keepdim, "any")


@op(method=True, ta=True)
def all(x, dim=None, keepdim=False):  # noqa: A001
    return _any_all(x, dim, keepdim, "all")


@op(method=True, ta=True)
def count_nonzero(x, dim=None):
    """The number of non-zero elements (int64) over `dim`; never differentiable."""
    axes = _reduce_axes(x, dim, "count_nonzero")
    xp = backend.xp_for(x.device)
    return from_array(xp.asarray(xp.sum(x._array() != 0, axis=axes)).astype(xp.int64))


def _correction(op_name: str, dim, unbiased, correction):
    """(dim, correction) from torch's three forms: var(dim, unbiased, keepdim),
    var(unbiased) and var(dim, *, correction=, keepdim=)."""
    if isinstance(dim, bool):  # x.var(False): the (unbiased) form, over every element
        if unbiased is not None:
            raise TypeError(f"{op_name}(): unbiased given twice ({dim!r} and {unbiased!r})")
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        raise TypeError(f"{op_name}(): unbiased and correction cannot both be given")
    if unbiased is not None:
        return dim, int(bool(unbiased))
    return dim, 1 if correction is None else correction


@op(Var, method=True, ta=True)
def var(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """torch's signature: x.var(1, True) is unbiased=True (not keepdim), x.var(False) the
    population variance; correction= is the general form (unbiased=False is correction=0)."""
    dim, correction = _correction("var", dim, unbiased, correction)
    return Var.apply(x, dim=dim, keepdim=keepdim, correction=correction)


@op(Std, method=True, ta=True)
def std(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """torch's signature, as var's."""
    dim, correction = _correction("std", dim, unbiased, correction)
    return Std.apply(x, dim=dim, keepdim=keepdim, correction=correction)


def _nan_as_zero(x):
    return where(isnan(x), 0.0, x) if x.dtype.is_floating_point else x


@op(Where, Sum, method=True, ta=True)
def nansum(input, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    """sum with NaN counted as zero (the gradient is zero there)."""
    return sum_dims(_nan_as_zero(input), dim, keepdim, dtype=dtype)


@op(Where, Sum, Div, method=True, ta=True)
def nanmean(input, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    """The mean of the non-NaN elements (NaN where there is none)."""
    if not (input.dtype.is_floating_point if dtype is None else
            backend.to_dtype(dtype).is_floating_point):
        raise RuntimeError(f"nanmean(): expected input to have floating point dtype but got "
                           f"{input.dtype.name} (shape {tuple(input.shape)})")
    x = input if dtype is None else input.to(dtype)
    count = sum_dims(logical_not(isnan(x)), dim, keepdim)
    return div(sum_dims(_nan_as_zero(x), dim, keepdim), count)


@op(Var, Mean, ta=True)
def var_mean(x, dim=None, *, correction=1, keepdim=False):
    """(var, mean): two existing ops, as torch returns them; Mean saves nothing, so the
    pair keeps exactly what var alone keeps (the input)."""
    return var(x, dim, keepdim=keepdim, correction=correction), mean(x, dim, keepdim)


@op(Std, Mean, ta=True)
def std_mean(x, dim=None, *, correction=1, keepdim=False):
    """(std, mean): two existing ops; saves the input and std, as std does."""
    return std(x, dim, keepdim=keepdim, correction=correction), mean(x, dim, keepdim)


@op(VectorNorm)
def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    """ta.linalg.vector_norm: the ord-norm of x over dim (all dims by default)."""
    if dtype is not None:
        want = backend.to_dtype(dtype)
        # torch computes in `dtype` only as a widening of a floating input
        if not x.dtype.is_floating_point or backend.promote_types(x.dtype, want) is not want:
            raise RuntimeError(f"linalg.vector_norm: the dtype of the input ({x.dtype.name}, "
                               f"shape {tuple(x.shape)}) should be floating and convertible "
                               f"without narrowing to the specified dtype ({want.name})")
        x = x.to(want)
    return VectorNorm.apply(x, ord, dim, keepdim)


@op(VectorNorm, method=True, ta=True)
def norm(x, p="fro", dim=None, keepdim=False, dtype=None):
    """x.norm(p): a vector norm over dim; "fro" is the 2-norm (matrix norms: not here)."""
    if p == "fro":
        p = 2
    elif isinstance(p, str):
        raise ValueError(f"norm: p={p!r} is not supported (vector norms and 'fro' only)")
    if isinstance(dim, int):
        dim = (dim,)
    if dtype is not None:
        x = x.to(dtype)
    return VectorNorm.apply(x, p, dim, keepdim)
