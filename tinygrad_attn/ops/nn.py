"""The fused ops a transformer is made of: layer_norm, cross_entropy, dropout.

Each is one graph node with its own backward, so it saves what that backward needs and
nothing else (a chain of elementwise ops would keep every intermediate alive).
"""

from __future__ import annotations

import math

from .. import backend
from ..autograd import Function
from ..autograd.graph import Recorded, _rejoined, recording, unwrap
from ..creation import default_generator, zeros_like
from ..errors import ShapeError
from ._util import Tensor, check_same_device, from_array
from .indexing import IndexSelect, check_index_tensor
from .losses import COMPOSED_CLASSES, check_class_targets, cross_entropy_composed
from .registry import op


class LayerNorm(Function):
    """y = (x - mean) * rstd * weight + bias over the last len(normalized_shape) dims.

    gx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)) with gh = g * weight;
    gw = sum(g * xhat), gb = sum(g) over the leading dims.
    Saves the input x (a contiguous copy of it when x is strided), rstd (one value per
    row) and the weight, as rms_norm does: x is alive anyway (in a transformer it is the
    residual stream, the producer's output), so only rstd is new; backward rebuilds
    xhat = (x - mean) * rstd, the row's mean recomputed as the forward computed it,
    instead of keeping an x-sized xhat (which the forward would also have to write: a
    third more memory traffic).
    Policy "recompute": a later node that needs y (the next Linear) keeps a recipe, and y
    is rebuilt in backward by the forward kernel from x, so y itself is not kept.
    The arithmetic is backend.kernels.layer_norm_forward / layer_norm_backward on the
    (rows, normalized size) view of x. A recorded backward (create_graph=True) recomputes
    rstd from the recorded x instead of reading the saved one, so that its derivative
    with respect to x flows into the second derivative.
    """

    policy = "layer_norm"
    saves = {"save": "x + rstd", "recompute": "x + rstd (output rebuilt for later nodes)"}

    @staticmethod
    def saved_bytes_formula(shape, itemsize, policy, n_normalized=1):
        rows = math.prod(shape[: len(shape) - n_normalized])
        return math.prod(shape) * itemsize + rows * itemsize  # x, rstd

    @staticmethod
    def forward(ctx, x, weight, bias, normalized_shape, eps=1e-5):
        check_same_device("layer_norm", x, weight, bias)
        for name, p in (("weight", weight), ("bias", bias)):
            if p is not None and p.dtype is not x.dtype:  # torch does not promote
                raise RuntimeError(f"layer_norm: expected a {name} of the input's dtype "
                                   f"{x.dtype.name}, got {p.dtype.name}")
        n = len(normalized_shape)
        if tuple(x.shape[x.ndim - n:]) != tuple(normalized_shape):
            raise ShapeError(
                f"layer_norm: input of shape {tuple(x.shape)} does not end with the "
                f"normalized shape {tuple(normalized_shape)}"
            )
        for name, p in (("weight", weight), ("bias", bias)):
            if p is not None and tuple(p.shape) != tuple(normalized_shape):
                raise ShapeError(
                    f"layer_norm: {name} of shape {tuple(p.shape)} must have the normalized "
                    f"shape {tuple(normalized_shape)}"
                )
        lead = tuple(x.shape[: x.ndim - n])
        ctx.rows = (math.prod(lead), math.prod(normalized_shape))  # the kernels' 2-D view
        ctx.eps = eps
        # a strided x is copied to contiguous rows once, and that copy is kept, not x, so
        # backward (and recompute) read rows without copying x again
        ctx.copied = not x.is_contiguous()
        if not ctx.copied:
            X, kept = x._array().reshape(ctx.rows), x
        else:
            X = backend.xp_for(x.device).ascontiguousarray(x._array()).reshape(ctx.rows)
            kept = from_array(X.reshape(x.shape))
        y, rstd = backend.kernels.layer_norm_forward(X, _flat(weight), _flat(bias), eps)
        ctx.axes = tuple(range(x.ndim - n, x.ndim))
        ctx.save_for_backward(kept, from_array(rstd.reshape(lead + (1,) * n)), weight, bias)
        return from_array(y.reshape(x.shape))

    @staticmethod
    def recompute(ctx):
        x, _, weight, bias = ctx.saved_tensors
        X = x._array()
        y, _ = backend.kernels.layer_norm_forward(X.reshape(ctx.rows), _flat(weight),
                                                  _flat(bias), ctx.eps)
        return from_array(y.reshape(X.shape))

    @staticmethod
    def backward(ctx, g):
        x, rstd_t, weight, bias = ctx.saved_tensors
        G = g._array()
        if recording() and ctx.copied and ctx.next_functions[0] is not None:
            # the saved contiguous copy of a strided x has no history: it takes x's (same
            # values, same shape), so that the second derivative reaches x
            x = Recorded(_rejoined(x.t, *ctx.next_functions[0]))
        X = x._array().reshape(ctx.rows)
        if recording():  # rstd from the recorded x, by the forward kernel's text
            rstd = backend.kernels.layer_norm_forward(X, None, None, ctx.eps)[1]
        else:
            rstd = rstd_t._array().reshape(ctx.rows[0], 1)
        gx, gw, gb = backend.kernels.layer_norm_backward(
            G.reshape(ctx.rows), X, rstd, _flat(weight), ctx.needs_input_grad[:3])
        return (None if gx is None else from_array(gx.reshape(G.shape)),
                None if gw is None else from_array(gw.reshape(weight.shape)),
                None if gb is None else from_array(gb.reshape(bias.shape)))


def _flat(p):
    """A parameter's array as the kernels take it: 1-D (None stays None)."""
    return None if p is None else p._array().reshape(-1)


@op(LayerNorm, ta=True, functional=True)
def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    return LayerNorm.apply(x, weight, bias, tuple(normalized_shape), eps=eps)


class CrossEntropy(Function):
    """loss = mean over rows of (logsumexp(logits) - logits[target]), computed stably.

    Rows whose target is ignore_index are left out of the sum and of the count; with every
    row left out the mean is 0/0 = nan, as in PyTorch (sum gives 0, none zeros), and the
    gradient is zero.
    g_logits = (softmax(logits) - onehot(target)) * g / count, built in one buffer.
    Saves the logits and the per-row logsumexp (N values): the softmax is recomputed in
    backward, so no log-softmax copy and no one-hot matrix is ever kept.
    The rows' arithmetic is backend.kernels.cross_entropy_forward / cross_entropy_backward;
    the target's range check and the reduction stay here. A recorded backward
    (create_graph=True) recomputes lse from the recorded logits, so that its derivative
    flows into the second derivative.
    """

    @staticmethod
    def forward(ctx, logits, target, ignore_index=-100, reduction="mean"):
        check_same_device("cross_entropy", logits, target)
        if logits.ndim != 2 or target.ndim != 1 or target.shape[0] != logits.shape[0]:
            raise ShapeError(
                f"cross_entropy: expected logits (N, C) and target (N,), got "
                f"{tuple(logits.shape)} and {tuple(target.shape)}"
            )
        if target.dtype.is_floating_point or target.dtype.name == "bool":
            raise TypeError(f"cross_entropy: target must be integer, got {target.dtype.name}")
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"cross_entropy: unknown reduction {reduction!r}")
        xp = backend.xp_for(logits.device)
        X, T = logits._array(), target._array()
        valid = T != ignore_index
        safe_t = xp.where(valid, T, 0)
        C = logits.shape[1]
        check_class_targets("cross_entropy", xp, safe_t, C)
        losses, lse = backend.kernels.cross_entropy_forward(X, T, ignore_index)
        count = int(valid.sum())
        ctx.reduction, ctx.count = reduction, max(count, 1)
        ctx.save_for_backward(logits, from_array(lse), target)
        ctx.ignore_index = ignore_index
        # float16 logits: the kernel's losses and lse are float32 (torch accumulates half
        # in float32), rounded to float16 only in the result; lse is kept in float32
        if reduction == "none":
            return from_array(losses.astype(X.dtype, copy=False))
        total = losses.sum()
        if reduction == "sum":
            return from_array(xp.asarray(total, dtype=X.dtype))
        if count == 0:  # the mean of no rows; its gradient stays zero (backward's count is 1)
            return from_array(xp.full((), math.nan, dtype=X.dtype))
        return from_array(xp.asarray(total / count, dtype=X.dtype))

    @staticmethod
    def backward(ctx, g):
        logits, lse_t, target = ctx.saved_tensors
        G = g._array()
        scale = G / ctx.count if ctx.reduction == "mean" else G  # "none": one per row
        X, T = logits._array(), unwrap(target)._array()  # class indices: no derivative
        if recording():  # lse from the recorded logits, by the forward kernel's text
            lse = backend.kernels.cross_entropy_forward(X, T, ctx.ignore_index)[1]
        else:
            lse = lse_t._array()
        return from_array(backend.kernels.cross_entropy_backward(
            X, lse, T, ctx.ignore_index, scale)), None


@op(CrossEntropy, *COMPOSED_CLASSES, functional=True)
def cross_entropy(logits, target, weight=None, ignore_index=-100, reduction="mean",
                  label_smoothing=0.0):
    """The fused node for (N, C) logits and class-index targets; otherwise (weights, label
    smoothing, probability targets, other ranks) log_softmax and nll_loss, as torch."""
    if (weight is None and label_smoothing == 0.0 and type(target) is Tensor
            and not target.dtype.is_floating_point and logits.ndim == 2):
        return CrossEntropy.apply(logits, target, ignore_index=ignore_index, reduction=reduction)
    return cross_entropy_composed(logits, target, weight, ignore_index, reduction,
                                  label_smoothing)


class Dropout(Function):
    """y = x * mask / (1 - p) with mask ~ Bernoulli(1 - p);  gx = g * mask / (1 - p).

    Saves the mask as bool (1 byte per element), the least that determines the gradient.
    """

    @staticmethod
    def forward(ctx, x, p, generator=None):
        gen = generator or default_generator
        u = gen.uniform(x.shape, backend.float32, x.device)
        y, keep = backend.kernels.dropout_forward(x._array(), u, p)  # keep = u >= p
        ctx.scale = 1.0 / (1.0 - p)
        mask = from_array(keep)
        ctx.save_for_backward(mask)
        return from_array(y)

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return from_array(backend.kernels.dropout_backward(g._array(), mask._array(),
                                                           ctx.scale))


@op(Dropout, functional=True)
def dropout(x, p=0.5, training=True, generator=None):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    floating = x.dtype.is_floating_point
    if p == 1.0:  # every entry dropped: zeros of x's dtype (torch's, for integers too)
        return x * 0.0 if floating else zeros_like(x)
    if not floating:  # x * mask / (1 - p) is float: torch will not cast it back, nor do we
        raise RuntimeError(f"dropout: result type Float can't be cast to the input's dtype "
                           f"{x.dtype.name} (shape {tuple(x.shape)}); dropout with 0 < p < 1 "
                           f"needs a floating point tensor, e.g. x.float()")
    return Dropout.apply(x, p, generator=generator)


@op(IndexSelect, functional=True)
def embedding(index: Tensor, weight: Tensor) -> Tensor:
    """weight rows picked by index (any shape): (*index.shape, embedding_dim).

    The backward is index_select's: a sort-and-sum scatter-add into the weight's shape.
    """
    if weight.ndim != 2:
        raise ShapeError(f"embedding: weight must be 2-D, got shape {tuple(weight.shape)}")
    check_index_tensor("embedding", index)  # before reshape: a non-tensor index is refused
    flat = index.reshape(-1)
    rows = IndexSelect.apply(weight, 0, flat, op="embedding")  # its checks name embedding
    return rows.view(tuple(index.shape) + (weight.shape[1],))

