"""Convolution, the strided-views way (pooling.py reduces the same window views).

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

import math

from .. import backend
from ..autograd import Function
from ..errors import ShapeError
from ._util import check_same_device, from_array
from ._window import _batched, _col2im, _Geometry, _im2col, _positive, _tuple
from .registry import op


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




class Conv(Function):
    """y[n, o] = sum_{c, k} W[o, c, k] * window_k(x)[n, c] + b[o] (per group): the columns
    of x times the weight, one GEMM; gW = g @ cols^T, gx = col2im(W^T @ g), gb = sum(g).

    Saves the input and the weight (no new bytes: both are alive as the layer's input and
    parameter); the columns (kernel-size times the input's bytes) are rebuilt in backward
    when the weight needs a gradient, instead of kept from forward.
    """

    @staticmethod
    def flops(ctx, args, out) -> int:
        """2 * batch * prod(output spatial) * prod(weight.shape) (torch's conv count)."""
        x, weight, n = args[0], args[1], args[3]
        batch = 1 if ctx.unbatched else x.shape[0]
        return 2 * batch * math.prod(out.shape[-n:]) * math.prod(weight.shape)

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
        y = backend.matmul(xp, W, cols).reshape((N, O) + out)  # (N, G, O/G, L) -> (N, O, *out)
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
            gw = from_array(backend.matmul(xp, G, cols.swapaxes(-1, -2)).sum(axis=0)
                            .reshape(weight.shape))
            del cols, cols_t
        if nx:
            gcols = backend.matmul(xp, W.swapaxes(-1, -2), G)  # (N, G, C/G * K, L)
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


@op(Conv, ta=True, functional=True)
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """1-D convolution of (N, C, L) (or (C, L)) input with an (O, C/groups, K) weight."""
    return _conv(1, input, weight, bias, stride, padding, dilation, groups)


@op(Conv, ta=True, functional=True)
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
    def flops(ctx, args, out) -> int:
        """2 * batch * prod(input spatial) * prod(weight.shape) (torch's transposed rule)."""
        x, weight, n = args[0], args[1], args[3]
        batch = 1 if ctx.unbatched else x.shape[0]
        return 2 * batch * math.prod(x.shape[-n:]) * math.prod(weight.shape)

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
        cols = backend.matmul(xp, W.swapaxes(-1, -2), Xg)  # (N, G, C_out/G * K, L_in)
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
                gw = from_array(backend.matmul(xp, Xg, cols.swapaxes(-1, -2)).sum(axis=0)
                                .reshape(weight.shape))
            if nx:
                W = weight._array().reshape(groups, C_in // groups, CK)
                gx_arr = backend.matmul(xp, W, cols).reshape((N, C_in) + tuple(geo.out))
                gx = from_array(gx_arr[0] if ctx.unbatched else gx_arr)
        return gx, gw, gb


def _conv_transpose(n, x, weight, bias, stride, padding, output_padding, groups, dilation):
    op_name = f"conv_transpose{n}d"
    return ConvTranspose.apply(
        x, weight, bias, n, _tuple(stride, n, "stride", op_name),
        _tuple(padding, n, "padding", op_name),
        _tuple(output_padding, n, "output_padding", op_name),
        _tuple(dilation, n, "dilation", op_name), int(groups))


@op(ConvTranspose, ta=True, functional=True)
def conv_transpose1d(input, weight, bias=None, stride=1, padding=0,  # noqa: A002
                     output_padding=0, groups=1, dilation=1):
    """The transposed 1-D convolution (the input-gradient of conv1d) with a
    (C_in, C_out/groups, K) weight."""
    return _conv_transpose(1, input, weight, bias, stride, padding, output_padding, groups,
                           dilation)


@op(ConvTranspose, ta=True, functional=True)
def conv_transpose2d(input, weight, bias=None, stride=1, padding=0,  # noqa: A002
                     output_padding=0, groups=1, dilation=1):
    """The transposed 2-D convolution (the input-gradient of conv2d) with a
    (C_in, C_out/groups, kH, kW) weight."""
    return _conv_transpose(2, input, weight, bias, stride, padding, output_padding, groups,
                           dilation)
