"""Normalization ops beside layer_norm: rms_norm, group_norm, batch_norm, normalize.

rms_norm, group_norm and batch_norm are fused nodes that save the input x and one or two
statistics per row / group / channel, and rebuild xhat = (x - mean) * rstd in backward.
Saving x costs no new buffer (it is the producer's output, alive while this node holds
it), where saving xhat would allocate one of x's size; the price is one subtraction and
one multiplication in backward.

float16 is computed in float32, as torch's CPU kernels do (its statistics overflow at 65504
and lose the mean's low bits), and rounded to float16 once, in the results; group_norm and
batch_norm then keep their per-group or per-channel mean and rstd in float32 (a few values
each), so backward's xhat is not shifted by a float16-rounded mean.

A recorded backward (create_graph=True) recomputes the statistics from the recorded x with
the forward's text instead of reading the saved ones: their values are the same, and their
derivative with respect to x, which the second derivative needs, flows.
"""

from __future__ import annotations

from .. import backend
from .. import shape as shp
from ..autograd import Function
from ..autograd.graph import recording
from ..errors import ShapeError
from ._math_util import wide
from ._util import check_same_device, from_array
from .elementwise import Clamp, Div
from .registry import op
from .stats import VectorNorm


def _float_input(op_name: str, x) -> None:
    if not x.dtype.is_floating_point:
        raise NotImplementedError(f'"{op_name}" not implemented for {x.dtype.name} (input of '
                                  f"shape {tuple(x.shape)}); use a floating point tensor")


def _same_dtype(op_name: str, x, *others) -> None:
    for t in others:
        if t is not None and t.dtype != x.dtype:
            raise RuntimeError(f"{op_name}: expected all tensors of dtype {x.dtype.name}, got "
                               f"{t.dtype.name} (shape {tuple(t.shape)})")


def _param_shape(op_name, name, p, shape):
    if p is not None and tuple(p.shape) != tuple(shape):
        raise ShapeError(f"{op_name}: {name} of shape {tuple(p.shape)} must have shape "
                         f"{tuple(shape)}")


class RMSNorm(Function):
    """y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps) over the normalized dims;
    gx = rstd * (gh - xhat * mean(gh * xhat)) with gh = g * weight, xhat = x * rstd;
    gw = sum(g * xhat) over the leading dims.

    Saves the input x, rstd (one value per row) and the weight: x is alive anyway (in a
    transformer it is the residual stream), so only the rows' rstd is new; xhat is
    rebuilt in backward (one multiplication) instead of kept as an x-sized buffer.
    The arithmetic is backend.kernels.rms_norm_forward / rms_norm_backward on the
    (rows, normalized size) view of x.
    """

    @staticmethod
    def forward(ctx, x, weight, normalized_shape, eps):
        check_same_device("rms_norm", x, weight)
        _float_input("rms_norm", x)  # a weight of another dtype is cast: y has x's dtype
        n = len(normalized_shape)
        if n == 0 or tuple(x.shape[x.ndim - n:]) != tuple(normalized_shape) or n > x.ndim:
            raise ShapeError(f"rms_norm: input of shape {tuple(x.shape)} does not end with "
                             f"the normalized shape {tuple(normalized_shape)}")
        _param_shape("rms_norm", "weight", weight, normalized_shape)
        X = x._array()
        if eps is None:
            eps = float(backend.xp_for(x.device).finfo(X.dtype).eps)
        ctx.axes = tuple(range(x.ndim - n, x.ndim))
        lead = tuple(x.shape[: x.ndim - n])
        ctx.rows = (shp.numel(lead), shp.numel(normalized_shape))  # the kernels' 2-D view
        ctx.eps = eps
        y, rstd = backend.kernels.rms_norm_forward(X.reshape(ctx.rows),
                                                   _flat_as(weight, X.dtype), eps)
        ctx.save_for_backward(x, from_array(rstd.reshape(lead + (1,) * n)), weight)
        return from_array(y.reshape(x.shape))

    @staticmethod
    def backward(ctx, g):
        x, rstd_t, weight = ctx.saved_tensors
        G = g._array()
        X = x._array().reshape(ctx.rows)
        if recording():  # rstd from the recorded x, by the forward kernel's text
            rstd = backend.kernels.rms_norm_forward(X, None, ctx.eps)[1]
        else:
            rstd = rstd_t._array().reshape(ctx.rows[0], 1)
        gx, gw = backend.kernels.rms_norm_backward(
            G.reshape(ctx.rows), X, rstd, _flat_as(weight, G.dtype), ctx.needs_input_grad[:2])
        return (None if gx is None else from_array(gx.reshape(G.shape)),
                None if gw is None else
                from_array(gw.astype(weight.dtype.np, copy=False).reshape(weight.shape)))


def _flat_as(p, dtype):
    """A weight's array as the kernels take it: 1-D, cast to the input's dtype (a weight of
    another dtype is cast, as torch does; None stays None)."""
    return None if p is None else p._array().astype(dtype, copy=False).reshape(-1)


@op(RMSNorm, ta=True, functional=True)
def rms_norm(input, normalized_shape, weight=None, eps=None):  # noqa: A002 - torch's name
    """RMS normalization over the last len(normalized_shape) dims (eps None: the dtype's
    machine epsilon, as torch)."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    return RMSNorm.apply(input, weight, tuple(normalized_shape), eps)


def _channel_view(arr, ndim):
    """A (C,) parameter shaped (1, C, 1, ...) to broadcast against (N, C, *)."""
    return arr.reshape((1, -1) + (1,) * (ndim - 2))


def _centred_var(xp, X, axes):
    """(mean, X - mean, var) over `axes`, kept: forward's statistics, which a recorded
    backward recomputes from the recorded x by this same text."""
    mean = xp.mean(X, axis=axes, keepdims=True)
    centred = X - mean
    return mean, centred, xp.mean(xp.square(centred), axis=axes, keepdims=True)


def _recorded_xhat(xp, X, axes, eps):
    """(xhat, rstd) of a recorded backward, from the recorded x (training statistics)."""
    _, xhat, var = _centred_var(xp, X, axes)
    rstd = 1.0 / xp.sqrt(var + eps)
    return xhat * rstd, rstd


def _affine(xp, xhat, weight, bias, dtype):
    """xhat * weight + bias per channel (dim 1), written into xhat's buffer, in `dtype`."""
    if weight is not None:
        xhat *= _channel_view(wide(weight._array()), xhat.ndim)
    if bias is not None:
        xhat += _channel_view(wide(bias._array()), xhat.ndim)
    return xhat.astype(dtype, copy=False)


def _affine_grads(ctx, xp, G, xhat, axes, dtype):
    gw = gb = None
    if ctx.needs_input_grad[1]:
        gw = from_array(xp.sum(G * xhat, axis=axes).astype(dtype, copy=False))
    if ctx.needs_input_grad[2]:
        gb = from_array(xp.sum(G, axis=axes).astype(dtype, copy=False))
    return gw, gb


class GroupNorm(Function):
    """Per sample, the C channels in num_groups groups: xhat = (x - mean) * rstd over each
    group's channels and positions, y = xhat * weight + bias per channel;
    gx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)) over each group, gh = g * weight;
    gw = sum(g * xhat), gb = sum(g) over the batch and positions.

    Saves the input x, mean and rstd (N * num_groups values each) and the weight; xhat is
    rebuilt in backward rather than kept as an x-sized buffer.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, num_groups, eps):
        check_same_device("group_norm", x, weight, bias)
        _float_input("group_norm", x)
        _same_dtype("group_norm", x, weight, bias)
        if x.ndim < 2 or num_groups <= 0 or x.shape[1] % num_groups:
            raise ShapeError(f"group_norm: expected an input (N, C, *) with C divisible by "
                             f"num_groups={num_groups}, got shape {tuple(x.shape)}")
        C = x.shape[1]
        _param_shape("group_norm", "weight", weight, (C,))
        _param_shape("group_norm", "bias", bias, (C,))
        xp = backend.xp_for(x.device)
        N = x.shape[0]
        # the group size from the shape, not numel / N: an empty batch keeps it (and NumPy
        # its silence: a mean over a size-0 axis warns)
        ctx.groups = (N, num_groups, shp.numel(x.shape[1:]) // num_groups)
        grouped = wide(x._array()).reshape(ctx.groups)  # (N, G, C/G * positions)
        mean, xhat, var = _centred_var(xp, grouped, 2)
        rstd = 1.0 / xp.sqrt(var + eps)
        xhat *= rstd
        ctx.eps = eps
        ctx.save_for_backward(x, from_array(mean), from_array(rstd), weight)
        return from_array(_affine(xp, xhat.reshape(x.shape), weight, bias, x.dtype.np))

    @staticmethod
    def backward(ctx, g):
        x, mean_t, rstd_t, weight = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        G = wide(g._array())
        if recording():
            xhat, rstd = _recorded_xhat(xp, wide(x._array()).reshape(ctx.groups), 2, ctx.eps)
        else:
            rstd = rstd_t._array()
            xhat = (wide(x._array()).reshape(ctx.groups) - mean_t._array()) * rstd
        xhat = xhat.reshape(G.shape)
        axes = (0,) + tuple(range(2, G.ndim))
        dtype = g.dtype.np
        gw, gb = _affine_grads(ctx, xp, G, xhat, axes, dtype)
        gx = None
        if ctx.needs_input_grad[0]:
            gh = G * _channel_view(wide(weight._array()), G.ndim) if weight is not None \
                else G.copy()
            gh = gh.reshape(ctx.groups)
            xhat = xhat.reshape(gh.shape)
            m2 = xp.mean(gh * xhat, axis=2, keepdims=True)
            gh -= xp.mean(gh, axis=2, keepdims=True)
            xhat *= m2
            gh -= xhat
            gh *= rstd
            gx = from_array(gh.reshape(G.shape).astype(dtype, copy=False))
        return gx, gw, gb


@op(GroupNorm, ta=True, functional=True)
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):  # noqa: A002
    return GroupNorm.apply(input, weight, bias, int(num_groups), eps)


class BatchNorm(Function):
    """Per channel (dim 1) over the batch and positions: xhat = (x - mean) * rstd,
    y = xhat * weight + bias. Training: batch statistics, and the running statistics (if
    given) move by momentum toward the batch mean and the unbiased batch variance;
    gx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), gh = g * weight. Evaluation:
    the running statistics are constants, gx = gh * rstd. gw = sum(g * xhat), gb = sum(g).

    Saves the input x, mean and rstd (one value per channel each) and the weight; xhat is
    rebuilt in backward rather than kept as an x-sized buffer.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
        check_same_device("batch_norm", x, weight, bias, running_mean, running_var)
        _float_input("batch_norm", x)
        _same_dtype("batch_norm", x, weight, bias)
        if x.ndim < 2:
            raise ShapeError(f"batch_norm: expected an input (N, C, *), got shape "
                             f"{tuple(x.shape)}")
        C = x.shape[1]
        for name, p in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                        ("running_var", running_var)):
            _param_shape("batch_norm", name, p, (C,))
        xp = backend.xp_for(x.device)
        X = wide(x._array())
        axes = (0,) + tuple(range(2, x.ndim))
        count = x.numel() // C if C else 0
        if training:
            if count <= 1:
                raise ValueError(f"batch_norm: expected more than 1 value per channel when "
                                 f"training, got input of shape {tuple(x.shape)}")
            mean, xhat, var = _centred_var(xp, X, axes)
            with backend.on_device(x.device):
                _update_running(running_mean, mean, momentum)
                _update_running(running_var, var * (count / (count - 1)), momentum)
        else:
            if running_mean is None or running_var is None:
                raise ValueError("batch_norm: running_mean and running_var must be given "
                                 "when training=False")
            mean = _channel_view(running_mean._array(), x.ndim).astype(X.dtype)
            var = _channel_view(running_var._array(), x.ndim).astype(X.dtype)
            xhat = X - mean
        rstd = 1.0 / xp.sqrt(var + eps)
        xhat *= rstd
        ctx.training, ctx.eps = training, eps
        ctx.save_for_backward(x, from_array(mean), from_array(rstd), weight)
        return from_array(_affine(xp, xhat, weight, bias, x.dtype.np))

    @staticmethod
    def backward(ctx, g):
        x, mean_t, rstd_t, weight = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        G = wide(g._array())
        axes = (0,) + tuple(range(2, G.ndim))
        if recording() and ctx.training:  # (evaluation's statistics are constants)
            xhat, rstd = _recorded_xhat(xp, wide(x._array()), axes, ctx.eps)
        else:
            rstd = rstd_t._array()
            xhat = (wide(x._array()) - mean_t._array()) * rstd
        dtype = g.dtype.np
        gw, gb = _affine_grads(ctx, xp, G, xhat, axes, dtype)
        gx = None
        if ctx.needs_input_grad[0]:
            gh = G * _channel_view(wide(weight._array()), G.ndim) if weight is not None \
                else G.copy()
            if ctx.training:
                m2 = xp.mean(gh * xhat, axis=axes, keepdims=True)
                gh -= xp.mean(gh, axis=axes, keepdims=True)
                xhat *= m2
                gh -= xhat
            gh *= rstd
            gx = from_array(gh.astype(dtype, copy=False))
        return gx, gw, gb, None, None


def _update_running(stat, batch_value, momentum) -> None:
    """stat <- (1 - momentum) * stat + momentum * batch_value, in place (a new version)."""
    if stat is None:
        return
    arr = stat._array()
    arr *= 1.0 - momentum
    arr += (batch_value.reshape(-1) * momentum).astype(arr.dtype)
    stat._storage.version += 1


@op(BatchNorm, functional=True)
def batch_norm(input, running_mean, running_var, weight=None, bias=None,  # noqa: A002
               training=False, momentum=0.1, eps=1e-5):
    """Batch normalization over dim 1; in training the running statistics (when given)
    are updated in place with torch's unbiased variance."""
    return BatchNorm.apply(input, weight, bias, running_mean, running_var, bool(training),
                           float(momentum), eps)


@op(VectorNorm, Clamp, Div, functional=True)
def normalize(input, p=2.0, dim=1, eps=1e-12):  # noqa: A002 - torch's name
    """x / max(||x||_p over dim, eps), composed as torch composes it: vector_norm,
    clamp(min=eps) and a division. It costs no x-sized saved buffer: the norm and the
    division save x (one storage, the input), the row-sized norm and the clamped norm."""
    if input.dtype is backend.float16:
        # in float32, as torch's kernels compute half: the division's gradient for the
        # norm, -g x / norm^2, overflows float16 for a norm above 256
        wide_input = input.float()
        return (wide_input / wide_input.norm(p, dim, keepdim=True).clamp(min=eps)).half()
    denom = input.norm(p, dim, keepdim=True).clamp(min=eps)
    return input / denom
