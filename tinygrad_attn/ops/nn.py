"""The fused ops a transformer is made of: layer_norm, add_layer_norm (a residual add and
the norm after it), linear (a GEMM with its bias), cross_entropy, dropout.

Each is one graph node with its own backward, so it saves what that backward needs and
nothing else (a chain of elementwise ops would keep every intermediate alive).
"""

from __future__ import annotations

import math

from .. import backend
from .. import shape as shp
from ..autograd import Function
from ..autograd.graph import Recorded, _rejoined, recording, unwrap
from ..creation import default_generator, zeros_like
from ..errors import ShapeError
from ._util import Tensor, check_same_device, from_array, unbroadcast
from .indexing import IndexSelect, check_index_tensor
from .losses import COMPOSED_CLASSES, check_class_targets, cross_entropy_composed
from .reduce import _rows_mergeable
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
        _check_norm_arguments("layer_norm", x, weight, bias, normalized_shape)
        n = len(normalized_shape)
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


def _check_norm_arguments(op, x, weight, bias, normalized_shape):
    """layer_norm's checks (add_layer_norm's too): one device, weight and bias of x's dtype
    (torch does not promote) and of the normalized shape, which x must end with."""
    check_same_device(op, x, weight, bias)
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and p.dtype is not x.dtype:
            raise RuntimeError(f"{op}: expected a {name} of the input's dtype "
                               f"{x.dtype.name}, got {p.dtype.name}")
    n = len(normalized_shape)
    if tuple(x.shape[x.ndim - n:]) != tuple(normalized_shape):
        raise ShapeError(
            f"{op}: input of shape {tuple(x.shape)} does not end with the "
            f"normalized shape {tuple(normalized_shape)}"
        )
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != tuple(normalized_shape):
            raise ShapeError(
                f"{op}: {name} of shape {tuple(p.shape)} must have the normalized "
                f"shape {tuple(normalized_shape)}"
            )


def _flat(p):
    """A parameter's array as the kernels take it: 1-D (None stays None)."""
    return None if p is None else p._array().reshape(-1)


@op(LayerNorm, ta=True, functional=True)
def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    return LayerNorm.apply(x, weight, bias, tuple(normalized_shape), eps=eps)


class AddLayerNorm(Function):
    """(y, s) with s = x + residual and y = layer_norm(s): a residual add and the norm after
    it as one node (the residual may broadcast to x's shape; s has x's shape).

    gx = gs + layer_norm's gx of gy (one buffer, for both inputs; the residual's summed
    down to its shape), gw, gb as layer_norm's.
    Saves s (its own second output: the residual stream, alive anyway), rstd (one value
    per row) and the weight: what add (nothing) and layer_norm (its input and rstd) save
    apart, to the byte. y is output 0, so the "layer_norm" policy treats it as layer_norm's
    output: under "recompute" a later node that needs y keeps a recipe, and y is rebuilt
    from s by layer_norm's forward kernel. The arithmetic is
    backend.kernels.add_layer_norm_forward / add_layer_norm_backward on (rows, n) views: one
    pass each way, reading x and the residual once. A recorded backward recomputes rstd
    from the recorded s, as layer_norm's does.
    """

    policy = "layer_norm"
    saves = {"save": "s = x + residual + rstd",
             "recompute": "s + rstd (the normalized output rebuilt for later nodes)"}
    materialize_grads = False  # the last norm's s (ln_f's input) often gets no gradient

    @staticmethod
    def saved_bytes_formula(shape, itemsize, policy, n_normalized=1):
        return LayerNorm.saved_bytes_formula(shape, itemsize, policy, n_normalized)

    @staticmethod
    def forward(ctx, x, residual, weight, bias, normalized_shape, eps=1e-5):
        for name, t in (("input", x), ("residual", residual)):
            if type(t) is not Tensor:
                raise TypeError(f"add_layer_norm: {name} must be a Tensor, got "
                                f"{type(t).__name__}")
        check_same_device("add_layer_norm", x, residual)
        if residual.dtype is not x.dtype or not x.dtype.is_floating_point:
            raise RuntimeError(f"add_layer_norm: expected floating input and residual of one "
                               f"dtype, got {x.dtype.name} and {residual.dtype.name}")
        _check_norm_arguments("add_layer_norm", x, weight, bias, normalized_shape)
        if (residual.ndim > x.ndim or shp.broadcast_shapes(
                x.shape, residual.shape, op="add_layer_norm") != tuple(x.shape)):
            raise ShapeError(f"add_layer_norm: a residual of shape {tuple(residual.shape)} "
                             f"does not broadcast to the input's shape {tuple(x.shape)}")
        n = len(normalized_shape)
        lead = tuple(x.shape[: x.ndim - n])
        ctx.rows = (math.prod(lead), math.prod(normalized_shape))
        ctx.eps, ctx.residual_shape = eps, tuple(residual.shape)
        xp = backend.xp_for(x.device)
        X = x._array().reshape(ctx.rows)  # a copy only for a strided x (not kept)
        s, y, rstd = backend.kernels.add_layer_norm_forward(
            X, _residual_rows(xp, residual, x.shape, ctx.rows, n), _flat(weight), _flat(bias),
            eps)
        s = from_array(s.reshape(x.shape))
        ctx.save_for_backward(s, from_array(rstd.reshape(lead + (1,) * n)), weight, bias)
        return from_array(y.reshape(x.shape)), s

    @staticmethod
    def recompute(ctx):
        s, _, weight, bias = ctx.saved_tensors
        S = s._array()
        y, _ = backend.kernels.layer_norm_forward(S.reshape(ctx.rows), _flat(weight),
                                                  _flat(bias), ctx.eps)
        return from_array(y.reshape(S.shape))

    @staticmethod
    def backward(ctx, gy, gs):
        s, rstd_t, weight, bias = ctx.saved_tensors
        nx, nr, nw, nb = ctx.needs_input_grad[:4]
        if gy is None:  # only s was used: add's backward, gs to both inputs
            gx, gw, gb = gs, None, None
        else:
            S = s._array().reshape(ctx.rows)
            if recording():  # rstd from the recorded s, by the forward kernel's text
                rstd = backend.kernels.layer_norm_forward(S, None, None, ctx.eps)[1]
            else:
                rstd = rstd_t._array().reshape(ctx.rows[0], 1)
            GS = None if gs is None or not (nx or nr) else gs._array().reshape(ctx.rows)
            GX, GW, GB = backend.kernels.add_layer_norm_backward(
                gy._array().reshape(ctx.rows), S, rstd, _flat(weight), GS, (nx or nr, nw, nb))
            gx = None if GX is None else from_array(GX.reshape(s.shape))
            gw = None if GW is None else from_array(GW.reshape(weight.shape))
            gb = None if GB is None else from_array(GB.reshape(bias.shape))
        if gx is None:
            return None, None, gw, gb
        return (gx if nx else None, unbroadcast(gx, ctx.residual_shape) if nr else None,
                gw, gb)


def _residual_rows(xp, residual, shape, rows, n_normalized):
    """The residual as the kernels take it: (rows, n) when it has x's shape, (k, n) when it
    is a table that repeats down the rows (its shape, less leading 1s, a suffix of x's: a
    (T, C) position embedding added to (B, T, C)); otherwise broadcast to x's shape (a
    copy)."""
    dims = tuple(residual.shape)
    while dims and dims[0] == 1:
        dims = dims[1:]
    R = residual._array()
    if rows[1] and len(dims) >= n_normalized and dims == tuple(shape[len(shape) - len(dims):]):
        return R.reshape(math.prod(dims) // rows[1], rows[1])
    return xp.broadcast_to(R, shape).reshape(rows)


@op(AddLayerNorm, functional=True)
def add_layer_norm(x, residual, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(s, layer_norm(s)) with s = x + residual, in one node each way: a transformer's
    residual add and the norm after it (s is the new residual stream)."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    if type(x) is Tensor and type(residual) is Tensor and (
            residual.dtype is not x.dtype or residual.ndim > x.ndim or any(
                r not in (1, n) for r, n in zip(residual.shape[::-1], x.shape[::-1]))):
        # mixed dtypes (the add promotes), a residual that grows x or does not broadcast
        # (the add says so): the add and the norm apart, as torch's
        s = x + residual
        return s, layer_norm(s, normalized_shape, weight, bias, eps)
    y, s = AddLayerNorm.apply(x, residual, weight, bias, tuple(normalized_shape), eps=eps)
    return s, y


class Linear(Function):
    """y = x @ weight^T + bias;  gx = g @ weight, gweight = g^T x, gbias = sum of g over the
    rows (x's leading dims merged into one row dim).

    One node for a Linear layer: one GEMM writes the output and the bias is added into it
    in place inside the node (the output is new: no second node, no version bump), and
    backward gives all three gradients (the bias's one reduction over g's rows).
    Saves x and the weight, each only where the other's gradient needs it, as matmul
    does (not the output): x as given, so a strided x pins its storage and nothing more,
    and an x under a "recompute" policy (layer_norm's or gelu's output) is kept as a recipe.
    """

    @staticmethod
    def flops(ctx, args, out) -> int:
        """2 * rows * in * out, the GEMM only (torch counts addmm's bias add as 0)."""
        return 2 * math.prod(out.shape) * args[0].shape[-1]

    @staticmethod
    def forward(ctx, x, weight, bias=None):
        for name, t in (("input", x), ("weight", weight)):
            if type(t) is not Tensor:
                raise TypeError(f"linear: {name} must be a Tensor, got {type(t).__name__}")
        check_same_device("linear", x, weight, bias)
        if any(t is not None and t.dtype is not x.dtype for t in (weight, bias)):
            names = ", ".join(t.dtype.name for t in (x, weight, bias) if t is not None)
            raise RuntimeError(f"linear: expected input, weight and bias of one dtype, got "
                               f"{names}; cast them, e.g. weight.to(x.dtype)")
        if x.ndim == 0 or weight.ndim != 2 or x.shape[-1] != weight.shape[1]:
            raise ShapeError(f"linear: an input of shape {tuple(x.shape)} and a weight of "
                             f"shape {tuple(weight.shape)} cannot be multiplied (expected "
                             f"a weight (out_features, {x.shape[-1] if x.ndim else '?'}))")
        if bias is not None and tuple(bias.shape) != (weight.shape[0],):
            raise ShapeError(f"linear: expected a bias of shape ({weight.shape[0]},), got "
                             f"{tuple(bias.shape)}")
        nx, nw = ctx.needs_input_grad[:2]
        ctx.save_for_backward(x if nw else None, weight if nx else None)
        xp = backend.xp_for(x.device)
        X, Wt = x._array(), weight._array().T
        if _rows_mergeable(x):  # every row of x in one GEMM
            y = backend.matmul(xp, X.reshape(math.prod(x.shape[:-1]), x.shape[-1]), Wt)
            y = y.reshape(tuple(x.shape[:-1]) + (weight.shape[0],))
        else:
            y = backend.matmul(xp, X, Wt)
        if bias is not None:
            y += bias._array()  # into the new output: one buffer, as the layer's result
        return from_array(y)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        nx, nw, nb = ctx.needs_input_grad[:3]
        xp = backend.xp_for(g.device)
        G = g._array()
        rows, N = math.prod(G.shape[:-1]), G.shape[-1]
        G2 = G.reshape(rows, N)  # all rows as one: a copy only for a strided g
        gx = gw = gb = None
        if nx:
            W = weight._array()
            if G.ndim > 2 and not _rows_mergeable(g):  # a batched GEMM, no copy of g
                gx = backend.matmul(xp, G, W)
            else:
                gx = backend.matmul(xp, G2, W).reshape(tuple(G.shape[:-1]) + (W.shape[1],))
            gx = from_array(gx)
        if nw:
            X = x._array()
            gw = from_array(backend.matmul(xp, G2.T, X.reshape(rows, X.shape[-1])))
        if nb:
            gb = from_array(G2.sum(axis=0))
        return gx, gw, gb


@op(Linear, functional=True)
def linear(x, weight, bias=None):
    """x @ weight^T + bias, weight laid out (out_features, in_features) as in PyTorch.

    With a bias of shape (out_features,) one Linear node (the bias added into the GEMM's
    output, its gradient one reduction in the node's backward); without one, a matmul of
    x with weight.mT, a strided view, so no transposed copy of the weight is made. Any
    other bias (a scalar, a broadcast shape) is added after the matmul, as torch's."""
    if (type(x) is Tensor and type(weight) is Tensor and type(bias) is Tensor
            and bias.ndim == 1 and weight.ndim == 2 and x.ndim >= 1):
        return Linear.apply(x, weight, bias)
    y = x @ weight.mT
    if bias is None:
        return y
    return y.add_(bias) if x.ndim > 1 else y + bias  # a 1-D x gives a squeezed view


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

