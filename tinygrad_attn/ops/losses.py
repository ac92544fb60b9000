"""Loss functions as torch.nn.functional names them, each with reduction 'none', 'mean'
or 'sum'.

The pointwise losses save their two inputs (tensors the caller holds anyway) rather than
their difference, which would be a new input-sized buffer kept until backward. nll_loss
saves only the target and the weight: its gradient is -weight[target] at the target
positions, whatever the input's values were.
"""

from __future__ import annotations

import warnings

from .. import backend
from .. import shape as shp
from ..autograd import Function
from ..autograd.graph import recording, unwrap
from ..errors import ShapeError
from ._math_util import _require_float
from ._recorded import constant
from ._util import Tensor, check_same_device, from_array, unbroadcast
from .elementwise import Mul
from .nonlinear import _sigmoid_array
from .reduce import LogSoftmax, Sum, log_softmax
from .registry import op

_REDUCTIONS = ("none", "mean", "sum")


def _check_reduction(name: str, reduction: str, extra: tuple = ()) -> None:
    if reduction not in _REDUCTIONS + extra:
        raise ValueError(f"{name}: {reduction!r} is not a valid value for reduction; "
                         f"expected one of {list(_REDUCTIONS + extra)}")


def _total(L):
    """The sum of L's elements in L's dtype, a float16 L summed in float32 (as torch's
    kernels accumulate half) and rounded once."""
    return L.sum(dtype="float32" if L.dtype == "float16" else L.dtype)


def _reduce(xp, L, reduction: str):
    if reduction == "none":
        return L
    if reduction == "sum":
        return xp.asarray(_total(L), dtype=L.dtype)
    if L.size == 0:  # torch's mean of nothing is nan
        return xp.asarray(float("nan"), dtype=L.dtype)
    return xp.asarray(_total(L) / L.size, dtype=L.dtype)


def _upstream(ctx, g):
    """The incoming gradient spread back over the unreduced loss's elements."""
    G = g._array()
    return G / ctx.count if ctx.reduction == "mean" else G




def _pair(name: str, x, t, broadcast: bool = True, compute=None):
    """Arrays of input and target after the checks torch makes, cast to `compute` (the
    dtype the loss is computed in: backend.promote(x, t) unless given), and their xp."""
    device = check_same_device(name, x, t)
    for label, v in (("input", x), ("target", t)):
        if type(v) is not Tensor:
            raise TypeError(f"{name}: {label} must be a Tensor, got {type(v).__name__}")
    compute = backend.promote(x, t) if compute is None else compute
    if not compute.is_floating_point:
        _require_float(name, x, t)
    if x.shape != t.shape:
        if not broadcast:
            raise ValueError(f"{name}: target of shape {tuple(t.shape)} must have the input's "
                             f"shape {tuple(x.shape)}")
        shape = shp.broadcast_shapes(x.shape, t.shape, op=name)
        warnings.warn(f"{name}: target of shape {tuple(t.shape)} differs from the input's "
                      f"shape {tuple(x.shape)}; both are broadcast to {shape}, which is "
                      "likely not what you meant", UserWarning, stacklevel=4)
    X = x._array().astype(compute.np, copy=False)
    return X, t._array().astype(compute.np, copy=False), backend.xp_for(device)


def _no_bool(name: str, *tensors) -> None:
    for v in tensors:
        if v.dtype is backend.bool_:
            raise RuntimeError(f"{name}: subtraction with a bool tensor (shape "
                               f"{tuple(v.shape)}) is not supported")


def _grads(x, t, gx, gt):
    """The two input gradients in their inputs' dtypes (the loss ran in the promoted one)."""
    return (None if gx is None else unbroadcast(from_array(gx.astype(x.dtype.np, copy=False)),
                                                x.shape),
            None if gt is None else unbroadcast(from_array(gt.astype(t.dtype.np, copy=False)),
                                                t.shape))


class _Pointwise(Function):
    """Shared by the pointwise regression losses: loss(x - t) and its derivative d,
    computed in the promotion of the two dtypes (an integer or bool operand beside a float one
    promotes, as torch's); the result has that dtype, or `out_dtype`'s.

    gx = g d(x - t), gt = -g d(x - t). Saves x and t.
    """

    name = "mse_loss"

    @staticmethod
    def out_dtype(x, t, compute):
        return compute

    @classmethod
    def forward(cls, ctx, x, t, reduction="mean", param=1.0):
        _check_reduction(cls.name, reduction)
        # torch broadcasts the two first, so a 0-d target counts as a dimensioned one
        X, T, xp = _pair(cls.name, x, t, compute=backend.promote(x.dtype, t.dtype))
        cls.check(param)
        if cls.name == "l1_loss":
            _no_bool(cls.name, x, t)
        out = cls.out_dtype(x, t, backend.dtype_of(X))
        ctx.reduction, ctx.param = reduction, param
        ctx.save_for_backward(x, t)
        L = cls.loss(xp, X - T, param)
        ctx.count = L.size
        return from_array(_reduce(xp, L, reduction).astype(out.np, copy=False))

    @classmethod
    def backward(cls, ctx, g):
        x, t = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        compute = backend.promote(x.dtype, t.dtype).np
        X, T = x._array().astype(compute, copy=False), t._array().astype(compute, copy=False)
        d = cls.derivative(xp, X - T, ctx.param) * _upstream(ctx, g).astype(compute, copy=False)
        nx, nt = ctx.needs_input_grad
        return _grads(x, t, d if nx else None, -d if nt else None)

    @staticmethod
    def check(param):
        pass


class MseLoss(_Pointwise):
    """loss = (x - t)^2;  gx = 2 (x - t) g, gt = -gx. Saves x and t."""

    name = "mse_loss"

    @staticmethod
    def loss(xp, d, param):
        return d * d

    @staticmethod
    def derivative(xp, d, param):
        return 2 * d


class L1Loss(_Pointwise):
    """loss = |x - t|;  gx = sign(x - t) g, gt = -gx. Saves x and t."""

    name = "l1_loss"

    @staticmethod
    def loss(xp, d, param):
        return xp.abs(d)

    @staticmethod
    def derivative(xp, d, param):
        return xp.sign(d)


class SmoothL1Loss(_Pointwise):
    """loss = 0.5 d^2 / beta where |d| < beta, else |d| - beta / 2 (d = x - t);
    gx = g d / beta or g sign(d), gt = -gx. Saves x and t."""

    name = "smooth_l1_loss"

    @staticmethod
    def check(beta):
        if beta < 0:
            raise RuntimeError(f"smooth_l1_loss: beta must be non-negative, got {beta}")

    @staticmethod
    def loss(xp, d, beta):
        a = xp.abs(d)
        if beta == 0:
            return a
        return xp.where(a < beta, 0.5 * d * d / beta, a - 0.5 * beta).astype(d.dtype, copy=False)

    @staticmethod
    def derivative(xp, d, beta):
        if beta == 0:
            return xp.sign(d)
        return xp.where(constant(xp.abs(d) < beta), d / beta, constant(xp.sign(d))).astype(
            d.dtype, copy=False)


class HuberLoss(_Pointwise):
    """loss = 0.5 d^2 where |d| <= delta, else delta (|d| - delta / 2) (d = x - t);
    gx = g d or g delta sign(d), gt = -gx. Saves x and t."""

    name = "huber_loss"

    @staticmethod
    def out_dtype(x, t, compute):
        """The input's dtype, as torch's (which writes the promoted loss into a tensor
        like the input, and so rejects an integer input)."""
        _require_float("huber_loss", x)
        return x.dtype

    @staticmethod
    def check(delta):
        if delta <= 0:
            raise RuntimeError(f"huber_loss: delta must be positive, got {delta}")

    @staticmethod
    def loss(xp, d, delta):
        a = xp.abs(d)
        return xp.where(a <= delta, 0.5 * d * d, delta * (a - 0.5 * delta)).astype(
            d.dtype, copy=False)

    @staticmethod
    def derivative(xp, d, delta):
        return xp.where(constant(xp.abs(d) <= delta), d, constant(delta * xp.sign(d))).astype(
            d.dtype, copy=False)


class KlDiv(Function):
    """loss = t (log t - x) (0 where t = 0), or exp(t) (t - x) with log_target;
    gx = -t g (or -exp(t) g), gt = (log t + 1 - x) g (or exp(t) (t - x + 1) g).
    Saves x and t."""

    @staticmethod
    def forward(ctx, x, t, reduction="mean", log_target=False):
        _check_reduction("kl_div", reduction, ("batchmean",))
        _require_float("kl_div", x, t)
        X, T, xp = _pair("kl_div", x, t)
        ctx.log_target = log_target
        ctx.save_for_backward(x, t)
        if log_target:
            L = xp.exp(T) * (T - X)
        else:
            L = xp.where(T > 0, T * xp.log(xp.where(T > 0, T, 1)), 0) - T * X
        if reduction == "batchmean":
            ctx.reduction = "mean"
            ctx.count = x.shape[0] if x.ndim else 1
            return from_array(xp.asarray(_total(L) / ctx.count, dtype=L.dtype))
        ctx.reduction, ctx.count = reduction, L.size
        return from_array(_reduce(xp, L, reduction))

    @staticmethod
    def backward(ctx, g):
        x, t = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        compute = backend.promote(x, t).np
        X, T = x._array().astype(compute, copy=False), t._array().astype(compute, copy=False)
        G = _upstream(ctx, g)
        nx, nt = ctx.needs_input_grad
        gx = gt = None
        if ctx.log_target:
            e = xp.exp(T)
            gx = -e * G if nx else None
            gt = e * (T - X + 1) * G if nt else None
        else:
            gx = -T * G if nx else None
            gt = (xp.log(T) + 1 - X) * G if nt else None
        full = shp.broadcast_shapes(x.shape, t.shape)
        return _grads(x, t, None if gx is None else xp.broadcast_to(gx, full).copy(), gt)


class BinaryCrossEntropy(Function):
    """loss = -w (t log x + (1 - t) log(1 - x)), each log clamped at -100 (as torch);
    gx = g w (x - t) / max(x (1 - x), 1e-12), gt = g w (log(1 - x) - log x).
    Saves x, t and the weight."""

    @staticmethod
    def forward(ctx, x, t, weight=None, reduction="mean"):
        _check_reduction("binary_cross_entropy", reduction)
        _require_float("binary_cross_entropy", x, t)
        if x.dtype is not t.dtype:  # torch does not promote here
            raise RuntimeError(f"binary_cross_entropy: found dtype {t.dtype.name} for the "
                               f"target of shape {tuple(t.shape)} but expected the input's "
                               f"{x.dtype.name}")
        X, T, xp = _pair("binary_cross_entropy", x, t, broadcast=False)
        if X.size and bool(((X < 0) | (X > 1)).any()):
            raise RuntimeError("binary_cross_entropy: all elements of input should be between "
                               "0 and 1")
        W = _weight("binary_cross_entropy", weight, x)
        log_x = xp.maximum(xp.log(X), -100)
        log_1mx = xp.maximum(xp.log1p(-X), -100)
        L = -(T * log_x + (1 - T) * log_1mx)
        if W is not None:
            L = L * W.astype(X.dtype, copy=False)
        ctx.reduction, ctx.count = reduction, L.size
        ctx.save_for_backward(x, t, weight)
        return from_array(_reduce(xp, L.astype(X.dtype, copy=False), reduction))

    @staticmethod
    def backward(ctx, g):
        x, t, weight = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        X, T = x._array(), t._array()
        G = _upstream(ctx, g)
        if weight is not None:
            G = G * weight._array()
        nx, nt = ctx.needs_input_grad[:2]
        gx = G * (X - T) / xp.maximum(X * (1 - X), 1e-12) if nx else None
        gt = None
        if nt:
            gt = G * (xp.maximum(xp.log1p(-X), -100) - xp.maximum(xp.log(X), -100))
        return (None if gx is None else from_array(gx.astype(X.dtype, copy=False)),
                None if gt is None else from_array(gt.astype(X.dtype, copy=False)), None)


class BinaryCrossEntropyWithLogits(Function):
    """loss = w ((1 - t) x + l softplus(-x)), l = 1 + (pos_weight - 1) t;
    gx = g w (l sigmoid(x) - pos_weight t), gt = g w ((pos_weight - 1) softplus(-x) - x).
    Saves x, t, the weight and pos_weight."""

    @staticmethod
    def forward(ctx, x, t, weight=None, pos_weight=None, reduction="mean"):
        name = "binary_cross_entropy_with_logits"
        _check_reduction(name, reduction)
        check_same_device(name, x, t, weight, pos_weight)
        # torch computes (1 - t) x + ... into a tensor like the target: the loss has the
        # target's dtype (an integer or bool target raises), computed in the promoted one
        _require_float(name, x, t)
        X, T, xp = _pair(name, x, t, broadcast=False)
        compute = X.dtype
        W = _weight(name, weight, x)
        P = _weight(name, pos_weight, x, label="pos_weight")
        W = None if W is None else W.astype(compute, copy=False)
        P = None if P is None else P.astype(compute, copy=False)
        soft = xp.maximum(-X, 0) + xp.log1p(xp.exp(-xp.abs(X)))  # softplus(-x), stably
        lw = 1 if P is None else 1 + (P - 1) * T
        L = (1 - T) * X + lw * soft
        if W is not None:
            L = L * W
        ctx.reduction, ctx.count = reduction, L.size
        ctx.save_for_backward(x, t, weight, pos_weight)
        return from_array(_reduce(xp, L, reduction).astype(t.dtype.np, copy=False))

    @staticmethod
    def backward(ctx, g):
        x, t, weight, pos_weight = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        compute = backend.promote(x, t).np
        X, T = x._array().astype(compute, copy=False), t._array().astype(compute, copy=False)
        G = _upstream(ctx, g).astype(compute, copy=False)
        if weight is not None:
            G = G * weight._array().astype(compute, copy=False)
        P = None if pos_weight is None else pos_weight._array().astype(compute, copy=False)
        nx, nt = ctx.needs_input_grad[:2]
        gx = gt = None
        if nx:
            s = _sigmoid(xp, X)
            gx = G * (s - T) if P is None else G * ((1 + (P - 1) * T) * s - P * T)
        if nt:
            gt = -X if P is None else (P - 1) * _softplus_neg(xp, X) - X
            gt = G * gt
        return _grads(x, t, gx, gt) + (None, None)


def _sigmoid(xp, X):
    """sigmoid(X) by _sigmoid_array; in a recorded backward by the engine's sigmoid on the
    recorded X (the same values; that function's out= buffers have no recorded meaning, and
    the engine's derivative s (1 - s) holds at 0 too, where exp(-|x|)'s would be 0)."""
    if not recording():
        return _sigmoid_array(xp, X)
    return from_array(X).sigmoid()._array()


def _softplus_neg(xp, X):
    """softplus(-X) = max(-X, 0) + log1p(exp(-|X|)), stably. A recorded backward spells
    max(-X, 0) as (|X| - X) / 2 (the same values): the sum is then -X / 2 + h(|X|) with
    h'(0) = 0, so its derivative at 0 is -1/2 whichever one-sided derivative abs takes
    there (max(-X, 0)'s tie and abs's branch need not agree)."""
    if not recording():
        return xp.maximum(-X, 0) + xp.log1p(xp.exp(-xp.abs(X)))
    a = xp.abs(X)
    return (a - X) / 2 + xp.log1p(xp.exp(-a))


def _weight(name, weight, x, label="weight"):
    if weight is None:
        return None
    if type(weight) is not Tensor:
        raise TypeError(f"{name}: {label} must be a Tensor, got {type(weight).__name__}")
    if shp.broadcast_shapes(weight.shape, x.shape, op=name) != x.shape:
        raise ShapeError(f"{name}: {label} of shape {tuple(weight.shape)} does not broadcast "
                         f"to the input's shape {tuple(x.shape)}")
    return weight._array()


class NllLoss(Function):
    """loss_i = -w[t_i] x[i, t_i] (0 where t_i = ignore_index); mean: sum / sum of w[t_i];
    gx[i, t_i] = -w[t_i] g (over the sum of weights for mean), 0 elsewhere.

    Saves the target and the weight: the gradient does not depend on the input's values.
    """

    @staticmethod
    def forward(ctx, x, target, weight=None, ignore_index=-100, reduction="mean"):
        _check_reduction("nll_loss", reduction)
        check_same_device("nll_loss", x, target, weight)
        _require_float("nll_loss", x)
        if target.dtype.is_floating_point or target.dtype.name == "bool":
            raise RuntimeError(f"nll_loss: expected an integer target, got "
                               f"{target.dtype.name} of shape {tuple(target.shape)}")
        expected = x.shape[:1] + x.shape[2:] if x.ndim > 1 else ()
        if x.ndim < 1 or target.shape != expected:
            raise ShapeError(f"nll_loss: expected input (N, C, ...) and target (N, ...), or "
                             f"input (C,) and a 0-d target; got {tuple(x.shape)} and "
                             f"{tuple(target.shape)}")
        C = x.shape[1] if x.ndim > 1 else x.shape[0]
        if weight is not None and weight.dtype is not x.dtype:  # torch does not promote
            raise RuntimeError(f"nll_loss: expected a weight of the input's dtype "
                               f"{x.dtype.name}, got {weight.dtype.name}")
        if weight is not None and tuple(weight.shape) != (C,):
            raise ShapeError(f"nll_loss: weight of shape {tuple(weight.shape)} must be ({C},) "
                             f"for input of shape {tuple(x.shape)}")
        xp = backend.xp_for(x.device)
        X, Tg = x._array(), target._array()
        if x.ndim == 1:  # one sample: class dim first
            X, Tg = X[None], Tg[None]
        valid = Tg != ignore_index
        safe = xp.where(valid, Tg, 0)
        check_class_targets("nll_loss", xp, safe, C)
        picked = xp.take_along_axis(X, safe[:, None], axis=1)[:, 0]
        w = valid.astype(X.dtype) if weight is None else (
            weight._array()[safe] * valid).astype(X.dtype, copy=False)
        L = -picked * w
        ctx.reduction, ctx.ignore_index, ctx.unbatched = reduction, ignore_index, x.ndim == 1
        ctx.count = xp.asarray(_total(w), dtype=X.dtype)
        ctx.save_for_backward(target, weight)
        if reduction == "none":
            return from_array(L[0] if ctx.unbatched else L)
        total = _total(L)
        return from_array(xp.asarray(total if reduction == "sum" else total / _total(w),
                                     dtype=X.dtype))

    @staticmethod
    def backward(ctx, g):
        target, weight = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        Tg = unwrap(target)._array()  # class indices: no derivative (plain when recording)
        if ctx.unbatched:
            Tg = Tg[None]
        C = ctx.input_shapes[0][1] if not ctx.unbatched else ctx.input_shapes[0][0]
        valid = Tg != ctx.ignore_index
        safe = xp.where(valid, Tg, 0)
        G = g._array()
        if ctx.unbatched and ctx.reduction == "none":
            G = G[None]
        w = valid.astype(G.dtype) if weight is None else weight._array()[safe] * valid
        scale = -(w * G) if ctx.reduction == "none" else -w * (
            G / ctx.count if ctx.reduction == "mean" else G)
        classes = xp.arange(C).reshape((1, C) + (1,) * (Tg.ndim - 1))
        grad = (classes == safe[:, None]) * scale[:, None]
        grad = grad.astype(G.dtype, copy=False)
        return from_array(grad[0] if ctx.unbatched else grad), None, None


def check_class_targets(name: str, xp, safe, C: int) -> None:
    """IndexError naming the first class index outside [0, C), as torch's "Target 5000 is
    out of bounds."; `safe` holds the targets with ignore_index rows already set to 0."""
    if not safe.size:
        return
    bad = (safe < 0) | (safe >= C)
    if bool(bad.any()):
        value = int(safe.reshape(-1)[int(xp.argmax(bad.reshape(-1)))])
        raise IndexError(f"{name}: Target {value} is out of bounds for {C} classes (target "
                         f"of shape {tuple(safe.shape)}; valid: 0 to {C - 1} or the "
                         f"ignore_index)")


# ----------------------------------------------------------------------------- entry points
@op(MseLoss, functional=True)
def mse_loss(input, target, reduction="mean"):  # noqa: A002
    return MseLoss.apply(input, target, reduction=reduction)


@op(L1Loss, functional=True)
def l1_loss(input, target, reduction="mean"):  # noqa: A002
    return L1Loss.apply(input, target, reduction=reduction)


@op(SmoothL1Loss, functional=True)
def smooth_l1_loss(input, target, reduction="mean", beta=1.0):  # noqa: A002
    return SmoothL1Loss.apply(input, target, reduction=reduction, param=beta)


@op(HuberLoss, functional=True)
def huber_loss(input, target, reduction="mean", delta=1.0):  # noqa: A002
    return HuberLoss.apply(input, target, reduction=reduction, param=delta)


@op(KlDiv, functional=True)
def kl_div(input, target, reduction="mean", log_target=False):  # noqa: A002
    return KlDiv.apply(input, target, reduction=reduction, log_target=log_target)


@op(BinaryCrossEntropy, functional=True)
def binary_cross_entropy(input, target, weight=None, reduction="mean"):  # noqa: A002
    return BinaryCrossEntropy.apply(input, target, weight, reduction=reduction)


@op(BinaryCrossEntropyWithLogits, functional=True)
def binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean",  # noqa: A002
                                     pos_weight=None):
    return BinaryCrossEntropyWithLogits.apply(input, target, weight, pos_weight,
                                              reduction=reduction)


@op(NllLoss, functional=True)
def nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean"):  # noqa: A002
    return NllLoss.apply(input, target, weight, ignore_index=ignore_index, reduction=reduction)


def cross_entropy_composed(x, target, weight=None, ignore_index=-100, reduction="mean",
                           label_smoothing=0.0):
    """cross_entropy for what the fused CrossEntropy node does not take (class weights,
    label smoothing, probability targets, (N, C, d1, ...) or (C,) inputs), composed as torch
    composes it: log_softmax (which saves its output) and nll_loss (target and weight), and
    for smoothing or soft targets a product with that same saved log-probability."""
    name = "cross_entropy"
    _check_reduction(name, reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"{name}: label_smoothing must be between 0.0 and 1.0, got "
                         f"{label_smoothing}")
    if x.ndim == 0:
        raise ShapeError(f"{name}: input must have at least one dimension, got shape ()")
    class_dim = 0 if x.ndim == 1 else 1
    C = x.shape[class_dim]
    logp = log_softmax(x, class_dim)
    w_view = None
    if weight is not None:
        if tuple(weight.shape) != (C,):
            raise ShapeError(f"{name}: weight of shape {tuple(weight.shape)} must be ({C},) "
                             f"for input of shape {tuple(x.shape)}")
        w_view = weight.view((C,) + (1,) * (x.ndim - class_dim - 1))
    if target.dtype.is_floating_point:  # class probabilities
        if target.shape != x.shape:
            # torch reads a target of another shape as class indices: a batch size that
            # differs is its ValueError, anything else its RuntimeError on the target
            batch = x.ndim > 1 and target.ndim >= 1 and target.shape[0] != x.shape[0]
            raise (ValueError if batch else RuntimeError)(
                f"{name}: a float (probability) target must have the input's shape "
                f"{tuple(x.shape)}, got {target.dtype.name} of shape {tuple(target.shape)}; "
                f"class indices must be an integer tensor")
        if label_smoothing > 0:
            target = target * (1 - label_smoothing) + label_smoothing / C
        prod = logp * (target if w_view is None else target * w_view)
        if reduction == "none":
            return -prod.sum(dim=class_dim)
        total = -prod.sum()
        return total if reduction == "sum" else total / (x.numel() // C if C else 0)
    nll = nll_loss(logp, target, weight, ignore_index, reduction)
    if label_smoothing == 0:
        return nll
    ignored = target == ignore_index
    smooth = -(logp if w_view is None else logp * w_view).sum(dim=class_dim)
    smooth = smooth.masked_fill(ignored, 0.0)
    if reduction == "mean":
        xp = backend.xp_for(x.device)
        kept = ~ignored._array()
        if weight is None:
            denominator = kept.sum()
        else:
            denominator = (weight._array()[xp.where(kept, target._array(), 0)] * kept).sum()
        smooth = smooth.sum() / float(denominator)
    elif reduction == "sum":
        smooth = smooth.sum()
    return nll * (1 - label_smoothing) + smooth * (label_smoothing / C)


COMPOSED_CLASSES = (LogSoftmax, NllLoss, Mul, Sum)
