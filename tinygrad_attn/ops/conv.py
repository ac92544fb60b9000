"""Convolution and pooling, the strided-views way.

A window of a convolution or pool is a strided view of its input: for (N, C, *S) input,
kernel K, stride s and dilation d, the view of shape (N, C, *K, *out) with strides
(sN, sC, *(d * sS), *(s * sS)) reads every window without copying a byte (`_windows`).
Pools reduce that view directly. A convolution needs it as a GEMM operand, and that is
the one copy it makes: the columns (N, C, *K, *out), recorded in the ledger with the reason
'im2col'. Explicit padding is another recorded copy ('window-pad', input-sized) only when
padding is asked for. The backward of a window view is its adjoint: each kernel offset's
slice of the window view of a zeroed gradient buffer accumulates its gradient (`_col2im`);
within one offset the slices never overlap, so each is a plain in-place add.
"""

from __future__ import annotations

import itertools
import math

from .. import backend
from ..autograd import Function
from ..errors import ShapeError
from ._util import Tensor, check_same_device, from_array
from .registry import op


# ----------------------------------------------------------------------------- geometry
def _tuple(value, n: int, name: str, op_name: str) -> tuple:
    out = (int(value),) * n if isinstance(value, int) else tuple(int(v) for v in value)
    if len(out) != n:
        raise ShapeError(f"{op_name}: {name} must be an int or {n} ints, got {value!r}")
    return out


class _Geometry:
    """Kernel, stride, dilation, padding (low, high) per spatial dim and the output sizes
    of a window view over an input of spatial shape `size`."""

    def __init__(self, size, kernel, stride, dilation, pad_lo, pad_hi, out):
        self.size, self.kernel, self.stride, self.dilation = size, kernel, stride, dilation
        self.pad_lo, self.pad_hi, self.out = pad_lo, pad_hi, out

    @property
    def padded(self) -> tuple:
        return tuple(n + lo + hi for n, lo, hi in zip(self.size, self.pad_lo, self.pad_hi))

    @property
    def padded_any(self) -> bool:
        return any(self.pad_lo) or any(self.pad_hi)

    def crop(self) -> tuple:
        return tuple(slice(lo, lo + n) for lo, n in zip(self.pad_lo, self.size))


def _windows(arr, geo: _Geometry):
    """The zero-copy window view (N, C, *kernel, *out) of arr (N, C, *padded)."""
    flat, strides, offset = backend.span_view(arr)
    spatial = strides[2:]
    shape = arr.shape[:2] + tuple(geo.kernel) + tuple(geo.out)
    view_strides = (strides[:2] + tuple(s * d for s, d in zip(spatial, geo.dilation))
                    + tuple(s * st for s, st in zip(spatial, geo.stride)))
    return backend.strided(flat, shape, view_strides, offset)


def _padded(xp, X, geo: _Geometry, value=0):
    """X itself, or a Tensor holding X inside a fresh buffer filled with `value` (recorded as
    'window-pad'; the caller keeps the Tensor while it reads the array, so the ledger counts
    the buffer for as long as it lives)."""
    if not geo.padded_any:
        return X
    buf = xp.full(X.shape[:2] + geo.padded, value, dtype=X.dtype)
    buf[(slice(None), slice(None)) + geo.crop()] = X
    return from_array(buf, "window-pad")


def _array_of(source):
    return source._array() if type(source) is Tensor else source


def _im2col(xp, X, geo: _Geometry) -> Tensor:
    """The columns (N, C, *kernel, *out) of X: one contiguous copy of its window view, as a
    Tensor recorded as 'im2col' (hold it while its array is in use)."""
    padded = _padded(xp, X, geo)
    cols = backend.copy(_windows(_array_of(padded), geo))
    del padded
    return from_array(cols, "im2col")


def _col2im(xp, cols, geo: _Geometry, dtype):
    """The adjoint of _im2col: columns (N, C, *kernel, *out) summed back into (N, C, *size)."""
    buf = xp.zeros(cols.shape[:2] + geo.padded, dtype=dtype)
    view = _windows(buf, geo)
    lead = (slice(None), slice(None))
    for k in itertools.product(*(range(n) for n in geo.kernel)):
        view[lead + k] += cols[lead + k]
    if geo.padded_any:
        return xp.ascontiguousarray(buf[lead + geo.crop()])
    return buf


def _batched(X, n):
    """(array with a batch dim, whether one was added) for (C, *S) or (N, C, *S) input."""
    return (X[None], True) if X.ndim == n + 1 else (X, False)


# ----------------------------------------------------------------------------- convolution
def _conv_checks(op_name, n, x, weight, bias, groups, transposed):
    check_same_device(op_name, x, weight, bias)
    if x.ndim not in (n + 1, n + 2):
        raise ShapeError(f"{op_name}: expected a {n + 1}-D (unbatched) or {n + 2}-D (batched) "
                         f"input, got shape {tuple(x.shape)}")
    if weight.ndim != n + 2:
        raise ShapeError(f"{op_name}: expected a {n + 2}-D weight, got shape "
                         f"{tuple(weight.shape)}")
    for t in (weight, bias):
        if t is not None and t.dtype != x.dtype:
            raise RuntimeError(f"{op_name}: input ({x.dtype.name}) and weight/bias "
                               f"({t.dtype.name}) must have the same dtype")
    # torch's kernels: integer convolutions but no bool, and no integer transposed ones
    if x.dtype is backend.bool_ or (transposed and not x.dtype.is_floating_point):
        raise RuntimeError(f"{op_name}: not implemented for {x.dtype.name} (input of shape "
                           f"{tuple(x.shape)})")
    if groups <= 0:
        raise ShapeError(f"{op_name}: groups must be positive, got {groups}")
    c_in = x.shape[-n - 1]
    shapes = f"input {tuple(x.shape)}, weight {tuple(weight.shape)}, groups={groups}"
    if transposed:
        ok = weight.shape[0] == c_in and c_in % groups == 0
        c_out = weight.shape[1] * groups
    else:
        ok = weight.shape[1] * groups == c_in and weight.shape[0] % groups == 0
        c_out = weight.shape[0]
    if not ok:
        raise ShapeError(f"{op_name}: the channels of {shapes} do not match")
    if bias is not None and tuple(bias.shape) != (c_out,):
        raise ShapeError(f"{op_name}: bias of shape {tuple(bias.shape)} must be ({c_out},) "
                         f"for {shapes}")


def _positive(op_name, **values):
    for name, vals in values.items():
        if any(v <= 0 for v in vals):
            raise ShapeError(f"{op_name}: {name} must be positive, got {vals}")


class Conv(Function):
    """y[n, o] = sum_{c, k} W[o, c, k] * window_k(x)[n, c] + b[o] (per group): the columns
    of x times the weight, one GEMM; gW = g @ cols^T, gx = col2im(W^T @ g), gb = sum(g).

    Saves the input and the weight (no new bytes: both are alive as the layer's input and
    parameter); the columns (kernel-size times the input's bytes) are rebuilt in backward
    when the weight needs a gradient, instead of kept from forward.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, n, stride, padding, dilation, groups):
        op_name = f"conv{n}d"
        _conv_checks(op_name, n, x, weight, bias, groups, transposed=False)
        xp = backend.xp_for(x.device)
        X, ctx.unbatched = _batched(x._array(), n)
        size, kernel = X.shape[2:], weight.shape[2:]
        if padding == "valid":
            padding = (0,) * n
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ShapeError(f"{op_name}: padding='same' is not supported for strided "
                                 f"convolutions (stride={stride})")
            total = [d * (k - 1) for d, k in zip(dilation, kernel)]
            pad_lo, pad_hi = tuple(t // 2 for t in total), tuple(t - t // 2 for t in total)
        else:
            if any(p < 0 for p in padding):
                raise ShapeError(f"{op_name}: negative padding {padding}")
            pad_lo = pad_hi = tuple(padding)
        _positive(op_name, stride=stride, dilation=dilation)
        out = tuple((s + lo + hi - d * (k - 1) - 1) // st + 1 for s, lo, hi, d, k, st
                    in zip(size, pad_lo, pad_hi, dilation, kernel, stride))
        if any(o <= 0 for o in out):
            raise ShapeError(f"{op_name}: kernel {tuple(kernel)} (dilation {dilation}) is "
                             f"larger than the padded input {tuple(x.shape)} (padding "
                             f"{pad_lo}, {pad_hi})")
        ctx.geo = _Geometry(size, kernel, stride, dilation, pad_lo, pad_hi, out)
        ctx.groups = groups
        N, O = X.shape[0], weight.shape[0]
        CK = weight.shape[1] * math.prod(kernel)  # per group: C/G * prod(K)
        cols_t = _im2col(xp, X, ctx.geo)
        cols = cols_t._array().reshape(N, groups, CK, math.prod(out))
        W = weight._array().reshape(groups, O // groups, CK)
        y = xp.matmul(W, cols).reshape((N, O) + out)  # (N, G, O/G, L) -> (N, O, *out)
        del cols, cols_t
        if bias is not None:
            y += bias._array().reshape((O,) + (1,) * n)
        ctx.save_for_backward(x, weight)
        return from_array(y[0] if ctx.unbatched else y)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        geo, groups = ctx.geo, ctx.groups
        G, _ = _batched(g._array(), len(geo.out))
        N, O = G.shape[:2]
        CK, L = weight.shape[1] * math.prod(geo.kernel), math.prod(geo.out)
        G = G.reshape(N, groups, O // groups, L)
        W = weight._array().reshape(groups, O // groups, CK)
        nx, nw, nb = ctx.needs_input_grad[:3]
        gx = gw = gb = None
        if nb:
            gb = from_array(G.sum(axis=(0, 3)).reshape(O))
        if nw:
            X, _ = _batched(x._array(), len(geo.out))
            cols_t = _im2col(xp, X, geo)
            cols = cols_t._array().reshape(N, groups, CK, L)
            gw = from_array(xp.matmul(G, cols.swapaxes(-1, -2)).sum(axis=0)
                            .reshape(weight.shape))
            del cols, cols_t
        if nx:
            gcols = xp.matmul(W.swapaxes(-1, -2), G)  # (N, G, C/G * K, L)
            C = weight.shape[1] * groups
            gcols = gcols.reshape((N, C) + tuple(geo.kernel) + tuple(geo.out))
            gx_arr = _col2im(xp, gcols, geo, G.dtype)
            gx = from_array(gx_arr[0] if ctx.unbatched else gx_arr)
        return gx, gw, gb


def _conv(n, x, weight, bias, stride, padding, dilation, groups):
    op_name = f"conv{n}d"
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ValueError(f"{op_name}: padding must be an int, a tuple, 'same' or 'valid', "
                             f"got {padding!r}")
    else:
        padding = _tuple(padding, n, "padding", op_name)
    return Conv.apply(x, weight, bias, n, _tuple(stride, n, "stride", op_name), padding,
                      _tuple(dilation, n, "dilation", op_name), int(groups))


@op(Conv, functional=True)
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """1-D convolution of (N, C, L) (or (C, L)) input with an (O, C/groups, K) weight."""
    return _conv(1, input, weight, bias, stride, padding, dilation, groups)


@op(Conv, functional=True)
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """2-D convolution of (N, C, H, W) (or (C, H, W)) input with an (O, C/groups, kH, kW)
    weight."""
    return _conv(2, input, weight, bias, stride, padding, dilation, groups)


class ConvTranspose(Function):
    """The adjoint of Conv with respect to its input: y = col2im(W^T @ x) + b (per group),
    W laid out (C_in, C_out/groups, *K); gx = W @ cols(g) (a convolution of g),
    gW = x @ cols(g)^T, gb = sum(g).

    Saves the input and the weight (no new bytes); the columns of g are built in backward.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, n, stride, padding, output_padding, dilation, groups):
        op_name = f"conv_transpose{n}d"
        _conv_checks(op_name, n, x, weight, bias, groups, transposed=True)
        _positive(op_name, stride=stride, dilation=dilation)
        if any(p < 0 for p in padding + output_padding):
            raise ShapeError(f"{op_name}: negative padding {padding} or output_padding "
                             f"{output_padding}")
        if any(op >= s and op >= d for op, s, d in zip(output_padding, stride, dilation)):
            raise ShapeError(f"{op_name}: output_padding {output_padding} must be smaller "
                             f"than either stride {stride} or dilation {dilation}")
        xp = backend.xp_for(x.device)
        X, ctx.unbatched = _batched(x._array(), n)
        size_in, kernel = X.shape[2:], weight.shape[2:]
        size = tuple((i - 1) * s - 2 * p + d * (k - 1) + op + 1 for i, s, p, d, k, op
                     in zip(size_in, stride, padding, dilation, kernel, output_padding))
        if any(s <= 0 for s in size):
            raise ShapeError(f"{op_name}: the output size {size} for input {tuple(x.shape)} "
                             f"and weight {tuple(weight.shape)} is too small")
        # the convolution whose adjoint this is maps (N, C_out, *size) to (N, C_in, *size_in)
        ctx.geo = _Geometry(size, kernel, stride, dilation, padding,
                            tuple(p + op for p, op in zip(padding, output_padding)), size_in)
        ctx.groups = groups
        N, C_in = X.shape[:2]
        C_out = weight.shape[1] * groups
        CK, L_in = weight.shape[1] * math.prod(kernel), math.prod(size_in)
        W = weight._array().reshape(groups, C_in // groups, CK)
        Xg = X.reshape(N, groups, C_in // groups, L_in)
        cols = xp.matmul(W.swapaxes(-1, -2), Xg)  # (N, G, C_out/G * K, L_in)
        cols = cols.reshape((N, C_out) + tuple(kernel) + tuple(size_in))
        y = _col2im(xp, cols, ctx.geo, X.dtype)
        del cols
        if bias is not None:
            y += bias._array().reshape((C_out,) + (1,) * n)
        ctx.save_for_backward(x, weight)
        return from_array(y[0] if ctx.unbatched else y)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        geo, groups = ctx.geo, ctx.groups
        n = len(geo.out)
        G, _ = _batched(g._array(), n)
        N, C_out = G.shape[:2]
        C_in = weight.shape[0]
        nx, nw, nb = ctx.needs_input_grad[:3]
        gx = gw = gb = None
        if nb:
            gb = from_array(G.sum(axis=(0,) + tuple(range(2, G.ndim))))
        if nx or nw:
            CK, L_in = weight.shape[1] * math.prod(geo.kernel), math.prod(geo.out)
            cols_t = _im2col(xp, G, geo)
            cols = cols_t._array().reshape(N, groups, CK, L_in)
            if nw:
                X, _ = _batched(x._array(), n)
                Xg = X.reshape(N, groups, C_in // groups, L_in)
                gw = from_array(xp.matmul(Xg, cols.swapaxes(-1, -2)).sum(axis=0)
                                .reshape(weight.shape))
            if nx:
                W = weight._array().reshape(groups, C_in // groups, CK)
                gx_arr = xp.matmul(W, cols).reshape((N, C_in) + tuple(geo.out))
                gx = from_array(gx_arr[0] if ctx.unbatched else gx_arr)
        return gx, gw, gb


def _conv_transpose(n, x, weight, bias, stride, padding, output_padding, groups, dilation):
    op_name = f"conv_transpose{n}d"
    return ConvTranspose.apply(
        x, weight, bias, n, _tuple(stride, n, "stride", op_name),
        _tuple(padding, n, "padding", op_name),
        _tuple(output_padding, n, "output_padding", op_name),
        _tuple(dilation, n, "dilation", op_name), int(groups))


@op(ConvTranspose, functional=True)
def conv_transpose1d(input, weight, bias=None, stride=1, padding=0,  # noqa: A002
                     output_padding=0, groups=1, dilation=1):
    """The transposed 1-D convolution (the input-gradient of conv1d) with a
    (C_in, C_out/groups, K) weight."""
    return _conv_transpose(1, input, weight, bias, stride, padding, output_padding, groups,
                           dilation)


@op(ConvTranspose, functional=True)
def conv_transpose2d(input, weight, bias=None, stride=1, padding=0,  # noqa: A002
                     output_padding=0, groups=1, dilation=1):
    """The transposed 2-D convolution (the input-gradient of conv2d) with a
    (C_in, C_out/groups, kH, kW) weight."""
    return _conv_transpose(2, input, weight, bias, stride, padding, output_padding, groups,
                           dilation)


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


@op(MaxPool, functional=True)
def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
               ceil_mode=False, return_indices=False):
    return _max_pool(1, input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


@op(MaxPool, functional=True)
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


@op(AvgPool, functional=True)
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
    return xp.moveaxis(xp.matmul(A, xp.moveaxis(X, axis, -2)), -2, axis)


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


@op(AdaptiveAvgPool, functional=True)
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
