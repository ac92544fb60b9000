"""Pooling, the strided-views way: max, average and adaptive average pools over 1-d and 2-d
inputs. Max and average pools reduce the window view of their input (ops/_window.py)
without copying it; padding, where asked for, is a recorded copy. conv.py's docstring tells
the window story.
"""

from __future__ import annotations

import itertools
import math

from .. import backend
from ..autograd import Function
from ..autograd.graph import recording
from ..errors import ShapeError
from ._recorded import constant
from ._util import from_array
from ._window import (
    _array_of,
    _batched,
    _col2im,
    _Geometry,
    _padded,
    _plain,
    _positive,
    _tuple,
    _windows,
)
from .registry import op


# ----------------------------------------------------------------------------- pooling
def _pool_geometry(op_name, x, n, kernel, stride, padding, dilation, ceil_mode):
    if x.ndim not in (n + 1, n + 2):
        raise ShapeError(f"{op_name}: expected a {n + 1}-D (unbatched) or {n + 2}-D (batched) "
                         f"input, got shape {tuple(x.shape)}")
    _positive(op_name, kernel_size=kernel, stride=stride, dilation=dilation)
    if any(p < 0 or p > k // 2 for p, k in zip(padding, kernel)):
        raise ShapeError(f"{op_name}: padding {padding} must be at most half of the kernel "
                         f"size {kernel}")
    size = tuple(x.shape[-n:])
    out = []
    for s, k, st, p, d in zip(size, kernel, stride, padding, dilation):
        span = s + 2 * p - d * (k - 1) - 1
        o = (span + (st - 1 if ceil_mode else 0)) // st + 1
        if ceil_mode and (o - 1) * st >= s + p:  # the last window must start inside
            o -= 1
        out.append(o)
    if any(o <= 0 for o in out):
        raise ShapeError(f"{op_name}: input of shape {tuple(x.shape)} gives the output size "
                         f"{tuple(out)}, which is too small (kernel {kernel}, padding {padding})")
    reach = [(o - 1) * st + d * (k - 1) + 1 for o, st, d, k in zip(out, stride, dilation, kernel)]
    pad_hi = tuple(max(r - s - p, 0) for r, s, p in zip(reach, size, padding))
    return _Geometry(size, kernel, stride, dilation, tuple(padding), pad_hi, tuple(out))


def _pool_args(op_name, n, kernel_size, stride, padding, dilation=1):
    kernel = _tuple(kernel_size, n, "kernel_size", op_name)
    stride = kernel if stride is None or stride == [] or stride == () else \
        _tuple(stride, n, "stride", op_name)
    return kernel, stride, _tuple(padding, n, "padding", op_name), \
        _tuple(dilation, n, "dilation", op_name)


class MaxPool(Function):
    """y = the maximum of each window (NaN wins, the first maximum of equal ones);
    gx = g routed to where each maximum was read (summed where windows overlap).

    Saves the position of each maximum inside its window, as the smallest integer type that
    holds prod(kernel) (one byte per output element for kernels up to 16x16), not torch's
    int64 input indices; those are built only when return_indices asks for them.
    """

    @staticmethod
    def forward(ctx, x, n, kernel, stride, padding, dilation, ceil_mode, return_indices):
        op_name = f"max_pool{n}d"
        # torch's 1-d kernel is floating only; its 2-d one takes integers too
        if x.dtype is backend.bool_ or (n == 1 and not x.dtype.is_floating_point):
            raise RuntimeError(f"{op_name}: not implemented for {x.dtype.name} (shape "
                               f"{tuple(x.shape)})")
        geo = _pool_geometry(op_name, x, n, kernel, stride, padding, dilation, ceil_mode)
        xp = backend.xp_for(x.device)
        X, ctx.unbatched = _batched(x._array(), n)
        low = -math.inf if x.dtype.is_floating_point else xp.iinfo(X.dtype).min
        padded = _padded(xp, X, geo, low)
        view = _windows(_array_of(padded), geo)
        lead = (slice(None), slice(None))
        offsets = list(itertools.product(*(range(k) for k in kernel)))
        arg_dtype = xp.uint8 if len(offsets) <= 256 else xp.int64
        best = backend.copy(view[lead + offsets[0]])
        arg = xp.zeros(best.shape, dtype=arg_dtype)
        for j, k in enumerate(offsets[1:], 1):
            v = view[lead + k]
            take = (v > best) | (v != v)
            best = xp.where(take, v, best)
            arg[take] = j
        ctx.geo, ctx.in_shape = geo, X.shape
        ctx.save_for_backward(from_array(arg))
        y = from_array(best[0] if ctx.unbatched else best)
        if not return_indices:
            return y
        index = _input_indices(xp, arg, geo, offsets)
        return y, from_array(index[0] if ctx.unbatched else index)

    @staticmethod
    def backward(ctx, g, _g_indices=None):
        (arg_t,) = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        G, _ = _batched(g._array(), len(ctx.geo.out))
        arg = arg_t._array()
        geo = ctx.geo
        if recording():  # create_graph: the routed gradients as columns, scattered back
            kernel, arg = geo.kernel, _plain(arg_t)
            routed = [xp.where(constant(arg == j), G, 0) for j in range(math.prod(kernel))]
            cols = xp.stack(routed, axis=2).reshape(G.shape[:2] + kernel + geo.out)
            gx = _col2im(xp, cols, geo, G.dtype)
            return from_array(gx[0] if ctx.unbatched else gx)
        buf = xp.zeros(ctx.in_shape[:2] + geo.padded, dtype=G.dtype)
        view = _windows(buf, geo)
        lead = (slice(None), slice(None))
        for j, k in enumerate(itertools.product(*(range(n) for n in geo.kernel))):
            view[lead + k] += xp.where(arg == j, G, 0)
        gx = xp.ascontiguousarray(buf[lead + geo.crop()]) if geo.padded_any else buf
        return from_array(gx[0] if ctx.unbatched else gx)


def _input_indices(xp, arg, geo, offsets):
    """torch's indices: each maximum's flat position in its (unpadded) input plane."""
    n = len(geo.out)
    kernel_pos = xp.asarray(offsets, dtype=xp.int64)  # (prod(K), n)
    index = xp.zeros(arg.shape, dtype=xp.int64)
    for i in range(n):
        shape = [1] * (n + 2)
        shape[2 + i] = geo.out[i]
        start = (xp.arange(geo.out[i], dtype=xp.int64) * geo.stride[i]
                 - geo.pad_lo[i]).reshape(shape)
        pos = start + kernel_pos[:, i][arg.astype(xp.int64)] * geo.dilation[i]
        index = index * geo.size[i] + pos
    return index


def _max_pool(n, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    op_name = f"max_pool{n}d"
    kernel, stride, padding, dilation = _pool_args(op_name, n, kernel_size, stride, padding,
                                                   dilation)
    return MaxPool.apply(x, n, kernel, stride, padding, dilation, bool(ceil_mode),
                         bool(return_indices))


@op(MaxPool, ta=True, functional=True)
def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
               ceil_mode=False, return_indices=False):
    return _max_pool(1, input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


@op(MaxPool, ta=True, functional=True)
def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
               ceil_mode=False, return_indices=False):
    return _max_pool(2, input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


def _avg_divisor(xp, geo, count_include_pad, dtype):
    """The divisor of each output position (N and C broadcast): torch's window sizes, the
    padding counted or not, the ceil-mode overhang never counted."""
    div = None
    for i, (o, s, k, st, p) in enumerate(zip(geo.out, geo.size, geo.kernel, geo.stride,
                                             geo.pad_lo)):
        counts = []
        for j in range(o):
            start = j * st - p
            end = min(start + k, s + p)
            if not count_include_pad:
                start, end = max(start, 0), min(end, s)
            counts.append(end - start)
        shape = [1] * (len(geo.out) + 2)
        shape[2 + i] = o
        d = xp.asarray(counts, dtype=dtype).reshape(shape)
        div = d if div is None else div * d
    return div


def _divisor(xp, geo, divisor, dtype):
    count_include_pad, override = divisor
    if override is not None:
        return xp.asarray(override, dtype=dtype)
    return _avg_divisor(xp, geo, count_include_pad, dtype)


class AvgPool(Function):
    """y = the sum of each window / its divisor (torch's count_include_pad and ceil_mode
    rules, or divisor_override); gx = g / divisor spread over each window. Saves nothing
    (the divisors are rebuilt from the sizes)."""

    @staticmethod
    def forward(ctx, x, n, kernel, stride, padding, ceil_mode, count_include_pad,
                divisor_override):
        op_name = f"avg_pool{n}d"
        if not (x.dtype.is_floating_point or x.dtype is backend.int64):  # torch's kernels
            raise RuntimeError(f"{op_name}: not implemented for {x.dtype.name} (shape "
                               f"{tuple(x.shape)})")
        geo = _pool_geometry(op_name, x, n, kernel, stride, padding, (1,) * n, ceil_mode)
        if divisor_override is not None and divisor_override == 0:
            raise RuntimeError(f"{op_name}: divisor must be not zero")
        xp = backend.xp_for(x.device)
        X, ctx.unbatched = _batched(x._array(), n)
        padded = _padded(xp, X, geo)
        view = _windows(_array_of(padded), geo)
        total = view.sum(axis=tuple(range(2, 2 + n)))
        ctx.divisor = (count_include_pad, divisor_override)
        div = _divisor(xp, geo, ctx.divisor, total.dtype)
        if x.dtype.is_floating_point:
            total /= div
        else:  # integer division truncating toward zero, as torch's integer kernel
            total = xp.sign(total) * (xp.abs(total) // div)
        ctx.geo, ctx.in_shape = geo, X.shape
        return from_array(total[0] if ctx.unbatched else total)

    @staticmethod
    def backward(ctx, g):
        xp = backend.xp_for(g.device)
        G, _ = _batched(g._array(), len(ctx.geo.out))
        geo = ctx.geo
        if recording():  # create_graph: the shares as columns, scattered back
            share = G / constant(_divisor(xp, geo, ctx.divisor, G.dtype))
            n = len(geo.out)
            cols = xp.broadcast_to(share.reshape(share.shape[:2] + (1,) * n + geo.out),
                                   share.shape[:2] + geo.kernel + geo.out)
            gx = _col2im(xp, cols, geo, G.dtype)
            return from_array(gx[0] if ctx.unbatched else gx)
        share = G / _divisor(xp, geo, ctx.divisor, G.dtype)
        buf = xp.zeros(ctx.in_shape[:2] + geo.padded, dtype=G.dtype)
        view = _windows(buf, geo)
        lead = (slice(None), slice(None))
        for k in itertools.product(*(range(n) for n in geo.kernel)):
            view[lead + k] += share
        gx = xp.ascontiguousarray(buf[lead + geo.crop()]) if geo.padded_any else buf
        return from_array(gx[0] if ctx.unbatched else gx)


def _avg_pool(n, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
              divisor_override):
    kernel, stride, padding, _ = _pool_args(f"avg_pool{n}d", n, kernel_size, stride, padding)
    return AvgPool.apply(x, n, kernel, stride, padding, bool(ceil_mode),
                         bool(count_include_pad), divisor_override)


@op(AvgPool, ta=True, functional=True)
def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,  # noqa: A002
               count_include_pad=True):
    return _avg_pool(1, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     None)


@op(AvgPool, functional=True)
def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,  # noqa: A002
               count_include_pad=True, divisor_override=None):
    return _avg_pool(2, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


def _averaging_matrix(xp, size, out, dtype):
    """(out, size): row i averages input positions floor(i*size/out) .. ceil((i+1)*size/out)."""
    rows = []
    for i in range(out):
        start, end = (i * size) // out, -((-(i + 1) * size) // out)
        rows.append([1.0 / (end - start) if start <= j < end else 0.0 for j in range(size)])
    return xp.asarray(rows, dtype=dtype)


def _along(xp, X, A, axis):
    """X with its `axis` contracted against A's columns (the axis becomes A.shape[0] long)."""
    moved = xp.moveaxis(X, axis, -2)
    if recording():  # the operator: a device array's defers to the recorded one
        return xp.moveaxis(constant(A) @ moved, -2, axis)
    return xp.moveaxis(backend.matmul(xp, A, moved), -2, axis)


class AdaptiveAvgPool(Function):
    """y = the mean of each of torch's adaptive windows, one averaging matrix A_i per spatial
    dim (y = A_h x A_w^T in 2-D); gx = A_h^T g A_w. Saves nothing (the matrices are
    rebuilt from the sizes)."""

    @staticmethod
    def forward(ctx, x, n, output_size):
        op_name = f"adaptive_avg_pool{n}d"
        if not x.dtype.is_floating_point:
            raise NotImplementedError(f'"{op_name}" not implemented for {x.dtype.name} '
                                      f"(input of shape {tuple(x.shape)})")
        if x.ndim not in (n + 1, n + 2) or any(s == 0 for s in x.shape[-n:]):
            raise ShapeError(f"{op_name}: expected a {n + 1}-D or {n + 2}-D input with "
                             f"non-zero spatial sizes, got shape {tuple(x.shape)}")
        size = tuple(x.shape[-n:])
        out = tuple(s if o is None else int(o) for s, o in zip(size, output_size))
        if any(o < 0 for o in out):
            raise ShapeError(f"{op_name}: negative output size {out}")
        xp = backend.xp_for(x.device)
        Y = x._array()
        for i in range(n):
            Y = _along(xp, Y, _averaging_matrix(xp, size[i], out[i], Y.dtype), Y.ndim - n + i)
        ctx.size, ctx.out = size, out
        return from_array(Y)

    @staticmethod
    def backward(ctx, g):
        xp = backend.xp_for(g.device)
        G = g._array()
        n = len(ctx.size)
        for i in range(n):
            A = _averaging_matrix(xp, ctx.size[i], ctx.out[i], G.dtype)
            G = _along(xp, G, A.T, G.ndim - n + i)
        return from_array(G)


@op(AdaptiveAvgPool, ta=True, functional=True)
def adaptive_avg_pool1d(input, output_size):  # noqa: A002
    return AdaptiveAvgPool.apply(input, 1, _tuple_or_none(output_size, 1))


@op(AdaptiveAvgPool, functional=True)
def adaptive_avg_pool2d(input, output_size):  # noqa: A002
    return AdaptiveAvgPool.apply(input, 2, _tuple_or_none(output_size, 2))


def _tuple_or_none(value, n):
    if value is None or isinstance(value, int):
        return (value,) * n
    out = tuple(value)
    if len(out) != n:
        raise ShapeError(f"adaptive_avg_pool{n}d: output_size must be an int or {n} values, "
                         f"got {value!r}")
    return out
