"""Reductions over dims (with keepdim), and matmul/softmax, the ops attention is made of."""

from __future__ import annotations

from .. import backend, return_types
from .. import shape as shp
from ..autograd import Function
from ..autograd.graph import recording
from ..errors import ShapeError
from ..memory import state as ledger_state
from ._math_util import wide as _wide
from ._recorded import backward_xp, put_along_axis
from ._util import Tensor, check_same_device, from_array, unbroadcast
from .elementwise import Maximum, Minimum, maximum, minimum
from .registry import op


def _axes(x: Tensor, dim, op: str, empty_is_all: bool = True):
    """dim as a tuple of axes. None, and an empty tuple or list, mean every dim (torch's
    reductions read `dim=()` as "all", not as "none"; any/all pass empty_is_all=False)."""
    if dim is None or (empty_is_all and isinstance(dim, (tuple, list)) and len(dim) == 0):
        return tuple(range(x.ndim))
    if isinstance(dim, (tuple, list)):
        axes = shp.normalize_dims(dim, x.ndim, op)
    else:
        axes = (shp.normalize_dim(dim, x.ndim, op),)
    return axes if x.ndim else ()  # a 0-d tensor takes dim 0 or -1 and reduces nothing


def _dim(x: Tensor, dim, op: str):
    """One checked dim for an array call; None for a 0-d tensor (which takes 0 or -1)."""
    d = shp.normalize_dim(dim, x.ndim, op)
    return d if x.ndim else None


def _require_float(op: str, x: Tensor, what: str) -> None:
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"{op}: {what} a floating point tensor, got {x.dtype.name} (shape "
                           f"{tuple(x.shape)}); cast it first, e.g. x.float()")


def _keep_shape(shape, axes):
    """The shape with each reduced axis kept as size 1."""
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def _expand_back(g: Tensor, shape, axes, keepdim) -> Tensor:
    """A zero-copy view of g broadcast back over the reduced axes (the inverse of sum)."""
    if not keepdim:
        g = g.reshape(_keep_shape(shape, axes))
    return g.expand(shape)


class Sum(Function):
    """y = sum(x, dims);  gx = g broadcast back (a stride-0 view, no copy). Saves nothing.
    float16 is summed in float32 and rounded once."""

    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False):
        axes = _axes(x, dim, "sum")
        ctx.shape, ctx.axes, ctx.keepdim = x.shape, axes, keepdim
        xp = backend.xp_for(x.device)
        dtype = backend.accumulating(x.dtype).np
        X = x._array()
        if X.dtype == "float16":
            return from_array(xp.sum(X, axis=axes, keepdims=keepdim, dtype="float32")
                              .astype(dtype))
        return from_array(xp.sum(X, axis=axes, keepdims=keepdim, dtype=dtype))

    @staticmethod
    def backward(ctx, g):
        return _expand_back(g, ctx.shape, ctx.axes, ctx.keepdim)


class Mean(Function):
    """y = mean(x, dims);  gx = g / n broadcast back. Saves nothing. (NumPy's mean of
    float16 already sums in float32.)"""

    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False):
        _require_float("mean", x, "could not infer the output dtype; expected")
        axes = _axes(x, dim, "mean")
        ctx.shape, ctx.axes, ctx.keepdim = x.shape, axes, keepdim
        ctx.count = shp.numel(tuple(x.shape[a] for a in axes))
        xp = backend.xp_for(x.device)
        return from_array(xp.mean(x._array(), axis=axes, keepdims=keepdim))

    @staticmethod
    def backward(ctx, g):
        scaled = from_array(g._array() / ctx.count)
        return _expand_back(scaled, ctx.shape, ctx.axes, ctx.keepdim)


class Var(Function):
    """y = sum((x - mean)^2) / max(0, n - correction);  gx = g * 2 (x - mean) / (n - correction),
    with torch's edge rules (_var_grad). Saves the input (backward recomputes the mean:
    one reduction, no extra saved tensor). float16 is computed in float32.
    """

    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, correction=1):
        _require_float("var", x, "std and var expect")
        V = _var_forward(ctx, x, dim, keepdim, correction, "var")
        ctx.save_for_backward(x)
        return from_array(V.astype(x.dtype.np, copy=False))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return from_array(_var_grad(ctx, x, _keep(ctx, g._array())))


class Std(Function):
    """y = sqrt(var(x));  gx = var's gradient of g / (2 y), taken as 0 where y = 0 (a
    constant input: torch's 0, not 0 * inf = nan). Saves the input and the output, as
    sqrt(var(x)) would. float16 is computed in float32 (its variance overflows at 65504).
    """

    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, correction=1):
        _require_float("std", x, "std and var expect")
        V = _var_forward(ctx, x, dim, keepdim, correction, "std")
        y = from_array(backend.xp_for(x.device).sqrt(V).astype(x.dtype.np, copy=False))
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        xp = backward_xp(x.device)
        Y, G = _keep(ctx, _wide(y._array())), _keep(ctx, _wide(g._array()))
        with backend.errstate(all="ignore"):
            g_var = xp.where(Y == 0, 0, G / (2 * Y))
        return from_array(_var_grad(ctx, x, g_var))


def _var_forward(ctx, x, dim, keepdim, correction, op):
    """var's array, in float32 for float16 input; sets what _var_grad reads on ctx."""
    axes = _axes(x, dim, op)
    ctx.shape, ctx.axes, ctx.keepdim = x.shape, axes, keepdim
    ctx.dof = shp.numel(tuple(x.shape[a] for a in axes)) - correction
    # torch's backward has two forms: with no dim (or a 0-d input) a dof <= 0 gives inf,
    # nan where x == mean; with a dim it is 2 / dof as it falls (inf at 0, < 0 beyond)
    ctx.whole = dim is None or x.ndim == 0
    xp = backend.xp_for(x.device)
    with backend.errstate(all="ignore"):
        return xp.asarray(xp.var(_wide(x._array()), axis=axes, keepdims=keepdim,
                                 ddof=correction))


def _keep(ctx, G):
    """G with the reduced dims present as size 1 (a view)."""
    return G if ctx.keepdim else G.reshape(_keep_shape(ctx.shape, ctx.axes))


def _var_grad(ctx, x, G):
    """torch's var_backward: 2 / dof * G * (x - mean); with no dim and dof <= 0, G * inf
    (nan where x == mean). Returned in x's dtype."""
    xp = backward_xp(x.device)
    X = x._array()
    W = _wide(X)
    mean = xp.mean(W, axis=ctx.axes, keepdims=True) if W.size else xp.zeros_like(W)
    with backend.errstate(all="ignore"):
        if ctx.whole and ctx.dof <= 0:
            out = G * xp.where(W == mean, xp.nan, xp.inf).astype(W.dtype, copy=False)
        else:
            scale = 2.0 / ctx.dof if ctx.dof != 0 else float("inf")
            out = G * ((W - mean) * W.dtype.type(scale))
    return out.astype(X.dtype, copy=False)


class MaxDim(Function):
    """(values, indices) = max(x, dim);  gx = g scattered to the argmax positions.

    Saves the indices (int64) only: where the gradient goes is all backward needs.
    """

    materialize_grads = False

    @staticmethod
    def forward(ctx, x, dim, keepdim=False, pick="max"):
        d = shp.normalize_dim(dim, x.ndim, pick)
        if x.shape and x.shape[d] == 0:
            raise IndexError(f"{pick}: cannot reduce dim {d} of shape {tuple(x.shape)}: it is "
                             "empty (specify a non-zero-size dim)")
        xp = backend.xp_for(x.device)
        X = x._array()
        if x.ndim == 0:  # dim 0 of a 0-d tensor: the value itself, at index 0
            X = X.reshape(1)
        idx = (xp.argmax if pick == "max" else xp.argmin)(X, axis=d, keepdims=True)
        values = xp.take_along_axis(X, idx, axis=d)
        if not keepdim or x.ndim == 0:
            values, idx_out = values.squeeze(d), idx.squeeze(d)
        else:
            idx_out = idx
        indices = from_array(idx_out.astype(xp.int64))
        ctx.shape, ctx.dim = (x.shape or (1,)), d
        ctx.zero_dim = x.ndim == 0
        ctx.save_for_backward(from_array(idx))
        return from_array(values), indices

    @staticmethod
    def backward(ctx, g, _g_indices):
        (idx,) = ctx.saved_tensors
        xp = backward_xp(g.device)
        G = g._array()
        if G.ndim != len(ctx.shape):
            G = xp.expand_dims(G, ctx.dim)
        out = put_along_axis(xp.zeros(ctx.shape, dtype=G.dtype), idx._array(), G, ctx.dim)
        return from_array(out.reshape(()) if ctx.zero_dim else out)


class MaxAll(Function):
    """y = max(x) over all elements;  gx = g / k at each of the k maximal positions.

    Saves the input and the output (the positions equal to the max get the gradient).
    """

    @staticmethod
    def forward(ctx, x, pick="max"):
        if x.numel() == 0:
            raise ShapeError(f"{pick}: cannot reduce an empty tensor of shape {x.shape}")
        xp = backend.xp_for(x.device)
        y = from_array((xp.max if pick == "max" else xp.min)(x._array()))
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        hit = x._array() == y._array()
        G = g._array()
        # ties share the gradient evenly, as torch; the count is cast so G keeps its dtype
        return from_array(hit * (G / G.dtype.type(hit.sum())))


class LogSumExp(Function):
    """y = log(sum(exp(x), dim)) computed stably;  gx = g * exp(x - y).

    Saves the input and the output: exp(x - y) is the softmax, recomputed in backward
    instead of being kept.
    """

    @staticmethod
    def forward(ctx, x, dim, keepdim=False):
        if (not keepdim and x.ndim and isinstance(dim, (tuple, list)) and len(dim) == 0):
            # torch reduces every dim here but then fails to write its 0-d result into the
            # kept-dims output (RuntimeError); keepdim=True and a 0-d input work there
            raise RuntimeError(f"logsumexp: dim={dim!r} with keepdim=False is refused for an "
                               f"input of shape {tuple(x.shape)}, as torch's; pass the dims")
        axes = _axes(x, dim, "logsumexp")
        xp = backend.xp_for(x.device)
        out_dtype = backend.floating(x.dtype).np
        X = _wide(x._array().astype(out_dtype, copy=False))
        if X.size == 0:  # an empty sum: log(0) = -inf, and no max to shift by
            m = xp.zeros(_keep_shape(X.shape, axes), dtype=X.dtype)
        else:
            m = xp.max(X, axis=axes, keepdims=True)
            m = xp.where(xp.isfinite(m), m, 0)
        out = (xp.log(xp.sum(xp.exp(X - m), axis=axes, keepdims=True)) + m).astype(
            out_dtype, copy=False)
        ctx.shape, ctx.axes, ctx.keepdim = x.shape, axes, keepdim
        y_keep = from_array(out)
        ctx.save_for_backward(x, y_keep)
        if keepdim:
            return y_keep
        # the output without the reduced dims is a view of the one (saved) storage
        return y_keep.view(tuple(s for i, s in enumerate(x.shape) if i not in axes))

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        if recording() and not ctx.keepdim:
            # the saved y is the kept-dims base of the output view, not the output: its
            # value with a graph comes from logsumexp again on the recorded x
            y = x.logsumexp(ctx.axes, keepdim=True)
        xp = backward_xp(x.device)
        G = g._array() if ctx.keepdim else g._array().reshape(_keep_shape(ctx.shape, ctx.axes))
        gx = G * xp.exp(_wide(x._array()) - _wide(y._array()))
        return from_array(gx.astype(G.dtype, copy=False))


# ----------------------------------------------------------------------------- matmul
class Matmul(Function):
    """y = a @ b (batch dims broadcast);  ga = g @ b^T, gb = a^T @ g (summed to each shape).

    Saves a and b as given: strided (transposed, permuted, sliced) operands are kept as the
    views they are, so a saved `k.transpose(-2, -1)` pins k's storage and nothing more.
    """

    @staticmethod
    def flops(ctx, args, out) -> int:
        """2 * prod(broadcast batch dims) * M * K * N: out holds batch * M * N."""
        return 2 * shp.numel(out.shape) * ctx.shapes[0][-1]

    @staticmethod
    def forward(ctx, a, b):
        check_same_device("matmul", a, b)
        if a.ndim < 2 or b.ndim < 2:  # 1-D operands are promoted by matmul() below
            raise ShapeError(f"matmul: operands must be at least 1-D, got {a.shape} and {b.shape}")
        if a.shape[-1] != b.shape[-2]:
            raise ShapeError(
                f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied "
                f"(inner sizes {a.shape[-1]} and {b.shape[-2]} differ)"
            )
        try:
            shp.broadcast_shapes(a.shape[:-2], b.shape[:-2], op="matmul")
        except ShapeError:
            raise ShapeError(
                f"matmul: batch dims of shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be "
                f"broadcast together ({tuple(a.shape[:-2])} vs {tuple(b.shape[:-2])})"
            ) from None
        ctx.shapes = (a.shape, b.shape)
        # a 2-D b stored column-major is a transposed weight (x @ w.mT)
        ctx.b_transposed = b.ndim == 2 and b._strides[0] == 1 and b.shape[0] > 1
        na, nb = ctx.needs_input_grad
        ctx.save_for_backward(a if nb else None, b if na else None)
        xp = backend.xp_for(a.device)
        A, B = a._array(), b._array()
        if B.ndim == 2 and A.ndim > 2 and _rows_mergeable(a):
            # (..., M, K) @ (K, N) is one GEMM over all rows, not a loop over the batch
            out = backend.matmul(xp, A.reshape(shp.numel(A.shape[:-1]), A.shape[-1]), B)
            return from_array(out.reshape(A.shape[:-1] + (B.shape[-1],)))
        return from_array(backend.matmul(xp, A, B))

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        G = g._array()
        na, nb = ctx.needs_input_grad
        ga = gb = None
        if na:
            Bt = xp.swapaxes(b._array(), -1, -2)
            if Bt.ndim == 2 and G.ndim > 2 and _rows_mergeable(g):
                # (..., M, N) @ (N, K) is one GEMM over all rows, as in forward
                G2 = G.reshape(shp.numel(G.shape[:-1]), G.shape[-1])
                ga = from_array(backend.matmul(xp, G2, Bt).reshape(G.shape[:-1] + (Bt.shape[-1],)))
            else:
                ga = unbroadcast(from_array(backend.matmul(xp, G, Bt)), ctx.shapes[0])
        if nb:
            A = a._array()
            if A.ndim >= 2 and len(ctx.shapes[1]) == 2 and _rows_mergeable(a):
                # gb = sum over the batch of a_i^T g_i = (all rows of a)^T (all rows of g):
                # one GEMM, and no (batch, K, N) intermediate to sum afterwards
                A2 = A.reshape(shp.numel(A.shape[:-1]), A.shape[-1])  # -1: ambiguous if empty
                G2 = G.reshape(shp.numel(G.shape[:-1]), G.shape[-1])
                if ctx.b_transposed:
                    # b is a transposed weight (x @ w.mT): compute gb in w's own layout,
                    # so the transpose's backward hands w a contiguous gradient
                    gb = from_array(backend.matmul(xp, G2.T, A2).T)
                else:
                    gb = from_array(backend.matmul(xp, A2.T, G2))
            else:
                gb = unbroadcast(from_array(backend.matmul(xp, xp.swapaxes(A, -1, -2), G)),
                                 ctx.shapes[1])
        return ga, gb


def _rows_mergeable(t: Tensor) -> bool:
    """True if all leading dims of t merge into one without a copy (a view reshape)."""
    merged = (shp.numel(t.shape[:-1]), t.shape[-1])
    return shp.view_strides(t.shape, t._strides, merged) is not None


@op(Matmul, method=True, ta=True, functional=True)
def matmul(x: Tensor, other: Tensor) -> Tensor:
    a, b = x, other
    if type(a) is not Tensor or type(b) is not Tensor:
        raise TypeError(
            f"matmul: both operands must be Tensors, got {type(a).__name__} and "
            f"{type(b).__name__}"
        )
    if a.dtype is not b.dtype:
        raise RuntimeError(f"matmul: expected both operands to have the same dtype, got "
                           f"{a.dtype.name} {tuple(a.shape)} and {b.dtype.name} "
                           f"{tuple(b.shape)}; cast one, e.g. b.to(a.dtype)")
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(
            f"matmul: both arguments need at least 1 dim, got shapes {a.shape} and {b.shape}"
        )
    inner_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if a.shape[-1] != inner_b:
        raise ShapeError(
            f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied "
            f"(inner sizes {a.shape[-1]} and {inner_b} differ)"
        )
    squeeze = []
    if a.ndim == 1:
        a = a.unsqueeze(0)
        squeeze.append(-2)
    if b.ndim == 1:
        b = b.unsqueeze(-1)
        squeeze.append(-1)
    out = Matmul.apply(a, b)
    for d in sorted(squeeze):
        out = out.squeeze(d)
    return out


# ----------------------------------------------------------------------------- softmax
def _on_last_dim(kernel, xp, d, *arrays, **kwargs):
    """kernel(*arrays) over dim d: the kernels normalize the last dim, so another dim is
    moved last as a view (no copy) and the result moved back. d None: a 0-d tensor."""
    if d is None:
        return kernel(*(a if a is None else a.reshape(1) for a in arrays), **kwargs).reshape(())
    if d == arrays[0].ndim - 1:
        return kernel(*arrays, **kwargs)
    out = kernel(*(a if a is None else xp.moveaxis(a, d, -1) for a in arrays), **kwargs)
    return xp.moveaxis(out, -1, d)


class Softmax(Function):
    """y = exp(x - max) / sum(exp(x - max));  gx = y * (g - sum(g * y, dim)).

    Saves only the output y (policy "save", the default): the backward formula needs y and
    nothing else, and the next op (att @ v) keeps that same y anyway, so it costs nothing
    extra. Policy "recompute" saves the input x instead and rebuilds y in backward; then a
    later node that needs y keeps a recipe, not y.
    """

    policy = "softmax"
    saves = {"save": "output", "recompute": "input"}

    @staticmethod
    def saved_bytes_formula(shape, itemsize, policy):
        return shp.numel(shape) * itemsize  # one tensor of the input's size either way

    @staticmethod
    def forward(ctx, x, dim):
        d = _dim(x, dim, "softmax")
        ctx.dim = d
        ctx.saves_input = ledger_state.policies["softmax"] == "recompute"
        y = from_array(_softmax(x, d))
        ctx.save_for_backward(x if ctx.saves_input else y)
        return y

    @staticmethod
    def recompute(ctx):
        """The output, from what this node saved (rebuilt if it saved the input)."""
        (saved,) = ctx.saved_tensors
        if ctx.saves_input:
            return from_array(_softmax(saved, ctx.dim))
        return saved

    @staticmethod
    def backward(ctx, g):
        y = Softmax.recompute(ctx)
        xp = backend.xp_for(y.device)
        return from_array(_on_last_dim(backend.kernels.softmax_backward, xp, ctx.dim,
                                       y._array(), g._array()))


def _softmax(x: Tensor, d):
    xp = backend.xp_for(x.device)
    return _on_last_dim(backend.kernels.softmax_forward, xp, d, x._array())


class LogSoftmax(Function):
    """y = x - logsumexp(x);  gx = g - exp(y) * sum(g, dim). Saves only the output."""

    @staticmethod
    def forward(ctx, x, dim):
        d = _dim(x, dim, "log_softmax")
        xp = backend.xp_for(x.device)
        y = from_array(_on_last_dim(backend.kernels.log_softmax_forward, xp, d, x._array()))
        ctx.dim = d
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        xp = backend.xp_for(y.device)
        return from_array(_on_last_dim(backend.kernels.log_softmax_backward, xp, ctx.dim,
                                       y._array(), g._array()))


class MaskedSoftmax(Function):
    """y = softmax(mask(x * scale)), mask: -inf where a bool mask is True, + a float mask;
    gx = scale * y * (g - sum(g * y, dim));  gmask = y * (g - sum(g * y)) summed to its shape.

    Saves only the output y: the backward formula needs nothing else (not x, not the mask),
    and att @ v keeps that y anyway. One (T x T) array where the composition
    softmax((x * scale).masked_fill(mask, -inf)) makes three in forward and three in
    backward. A row with every entry masked is nan, as torch's composition; with a bool
    mask its gradient is zero, as masked_fill's backward makes it there.
    """

    @staticmethod
    def forward(ctx, x, mask, scale, dim):
        d = _dim(x, dim, "masked_softmax")
        xp = backend.xp_for(x.device)
        # a broadcast view of the mask at x's shape: stride 0 along its broadcast dims
        M = None if mask is None else xp.broadcast_to(mask._array(), x.shape)
        ctx.dim, ctx.scale = d, scale
        ctx.bool_mask = mask is not None and mask.dtype is backend.bool_
        ctx.mask_shape = None if mask is None else mask.shape
        y = from_array(_on_last_dim(backend.kernels.masked_softmax_forward, xp, d,
                                    x._array(), M, scale=scale))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        xp = backend.xp_for(y.device)
        Y, G = y._array(), g._array()
        nx, nmask = ctx.needs_input_grad[:2]
        if not nmask:
            return from_array(_on_last_dim(backend.kernels.masked_softmax_backward, xp,
                                           ctx.dim, Y, G, scale=ctx.scale,
                                           bool_mask=ctx.bool_mask)), None
        gz = from_array(_on_last_dim(backend.kernels.softmax_backward, xp, ctx.dim, Y, G))
        gx = from_array(gz._array() * Y.dtype.type(ctx.scale)) if nx else None
        return gx, unbroadcast(gz, ctx.mask_shape)


# ----------------------------------------------------------------------------- entry points
def _as_dtype(x, dtype):
    """torch's dtype= of a reduction: the input is cast to it first."""
    return x if dtype is None else x.to(dtype)


@op(Sum, method=True, ta=True)
def sum(x, dim=None, keepdim=False, *, dtype=None):  # noqa: A001
    return Sum.apply(_as_dtype(x, dtype), dim=dim, keepdim=keepdim)


@op(Mean, method=True, ta=True)
def mean(x, dim=None, keepdim=False, *, dtype=None):
    return Mean.apply(_as_dtype(x, dtype), dim=dim, keepdim=keepdim)


def _max_min(x, dim, keepdim, other, pick: str):
    """max(x), max(x, dim) (values, indices) as a named tuple, max(x, other) = maximum."""
    if isinstance(dim, Tensor) or other is not None:  # torch.max(a, b): the elementwise form
        b = dim if other is None else other
        return (maximum if pick == "max" else minimum)(x, b)
    if dim is None:
        return MaxAll.apply(x, pick=pick)
    kind = return_types.max if pick == "max" else return_types.min
    return kind(*MaxDim.apply(x, dim, keepdim=keepdim, pick=pick))


@op(MaxAll, MaxDim, Maximum, Minimum, method=True, ta=True)
def max(x, dim=None, keepdim=False, *, other=None):  # noqa: A001
    return _max_min(x, dim, keepdim, other, "max")


@op(MaxAll, MaxDim, Maximum, Minimum, method=True, ta=True)
def min(x, dim=None, keepdim=False, *, other=None):  # noqa: A001
    return _max_min(x, dim, keepdim, other, "min")


def _arg(x, dim, keepdim, fn):
    xp = backend.xp_for(x.device)
    if dim is None:
        return from_array(xp.asarray(getattr(xp, fn)(x._array())).astype(xp.int64))
    d = _dim(x, dim, fn)
    out = xp.asarray(getattr(xp, fn)(x._array(), axis=d, keepdims=keepdim and x.ndim > 0))
    return from_array(out.astype(xp.int64))


@op(method=True, ta=True)
def argmax(x, dim=None, keepdim=False):
    return _arg(x, dim, keepdim, "argmax")


@op(method=True, ta=True)
def argmin(x, dim=None, keepdim=False):
    return _arg(x, dim, keepdim, "argmin")


@op(LogSumExp, method=True, ta=True, functional=True)
def logsumexp(x, dim, keepdim=False):
    return LogSumExp.apply(x, dim, keepdim=keepdim)


@op(Softmax, method=True, ta=True, functional=True)
def softmax(x, dim):
    _require_floating("softmax", x)
    return Softmax.apply(x, dim)


@op(LogSoftmax, method=True, ta=True, functional=True)
def log_softmax(x, dim):
    _require_floating("log_softmax", x)
    return LogSoftmax.apply(x, dim)


@op(MaskedSoftmax, functional=True)
def masked_softmax(x, mask=None, *, scale=1.0, dim=-1):
    """softmax((x * scale).masked_fill(mask, -inf), dim) for a bool mask (True = masked
    out), softmax(x * scale + mask, dim) for a float (additive) mask of x's dtype, in one
    op: the mask broadcasts to x's shape and is read where it lies, never expanded. The
    attention idiom: masked_softmax(q @ k.mT, causal_mask, scale=1 / sqrt(head_size))."""
    _require_floating("masked_softmax", x)
    check_same_device("masked_softmax", x, mask)
    if mask is not None:
        if type(mask) is not Tensor:
            raise TypeError(f"masked_softmax: mask must be a Tensor or None, got "
                            f"{type(mask).__name__}")
        if mask.dtype is not backend.bool_ and mask.dtype is not x.dtype:
            raise RuntimeError(f"masked_softmax: expected a bool mask or one of x's dtype "
                               f"{x.dtype.name}, got {mask.dtype.name}")
        try:
            fits = shp.broadcast_shapes(x.shape, mask.shape, op="masked_softmax") == x.shape
        except ShapeError:
            fits = False
        if not fits:
            raise ShapeError(f"masked_softmax: mask of shape {tuple(mask.shape)} does not "
                             f"broadcast to the input's shape {tuple(x.shape)}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"masked_softmax: scale must be a number, got {type(scale).__name__}")
    return MaskedSoftmax.apply(x, mask, float(scale), dim)


def _require_floating(op: str, x) -> None:
    """torch refuses integer input here rather than promote it; so do we, naming the op."""
    if type(x) is Tensor and not x.dtype.is_floating_point:
        raise RuntimeError(f"{op}: expected a floating-point tensor, got {x.dtype.name} of "
                           f"shape {tuple(x.shape)}; convert it with .float() first")
