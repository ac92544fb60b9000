"""The reference kernels: the engine's fused and scattered work, written with NumPy.

This is the module a reader studies: each kernel is short, its formula is in its docstring
and its code is NumPy (or CuPy, through the same array expressions). The `compiled` package
beside it (numba) has a kernel of the same name and signature for each one it speeds up,
and must agree with it; `kernels/__init__.py` chooses between the two per call.
On CuPy arrays the kernels call CuPy's own functions (cupyx.scatter_add,
cupyx.scipy.special.erf) or run the same array expressions.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import devices
from ..protocol import ArrayProtocol
from ..threads import matmul  # every GEMM through the fork gate

# What takes NumPy's functions: NumPy arrays, and the recorded arrays of a create_graph
# backward (backend/protocol.py), on which each NumPy call records the engine's op, so that
# a reference kernel's text is also the formula of its second derivative
_HOST = (np.ndarray, ArrayProtocol)


def scatter_add(target, index, values) -> None:
    """target[index] += values, with repeated indices summed (unbuffered)."""
    if isinstance(target, np.ndarray):
        np.add.at(target, index, values)
    else:
        import cupyx

        cupyx.scatter_add(target, index, values)


def index_add(target, dim: int, index, values) -> None:
    """target[(:,)*dim + (index,)] += values, summing rows with repeated indices.

    The backward of an embedding lookup. NumPy's add.at handles repeats but runs an
    element at a time (about 6x slower here on embedding-sized rows); sorting the
    indices and summing each run of equal ones with add.reduceat is exact and fast.
    """
    if not isinstance(target, np.ndarray):
        import cupyx

        cupyx.scatter_add(target, (slice(None),) * dim + (index,), values)
        return
    if index.size == 0:
        return
    rows = np.moveaxis(target, dim, 0)
    vals = np.moveaxis(values, dim, 0)
    order = np.argsort(index, kind="stable")
    sorted_idx = index[order]
    starts = np.flatnonzero(np.r_[True, sorted_idx[1:] != sorted_idx[:-1]])
    rows[sorted_idx[starts]] += np.add.reduceat(vals[order], starts, axis=0)


def masked_fill(x, mask, value):
    """A C-ordered copy of x with `value` (a scalar or 0-d array) where the broadcast
    `mask` is True: one copy plus a masked store (about 40% faster than where(), which
    reads three operands, on an attention-shaped (8, 6, 256, 256) float32 array).
    A recorded x or value takes where(), whose recorded meaning is the same selection."""
    if isinstance(x, ArrayProtocol) or isinstance(value, ArrayProtocol):
        return (np if isinstance(mask, _HOST) else devices.cp).where(mask, value, x)
    xp = np if isinstance(x, _HOST) else devices.cp
    out = xp.array(x, order="C", copy=True)
    xp.copyto(out, value, casting="unsafe", where=mask)
    return out


# ----------------------------------------------------------------------------- float16
# A row kernel's sums (of exps, of squares, of g * y) in float16 overflow at 65504 and
# drop terms below its 11-bit precision: layer_norm of values near 1000 came out all
# zeros. torch's CPU kernels accumulate half in float32 and round once at the end, and so
# do these: a float16 call runs the same kernel on float32 copies of its float16 operands
# (the compiled twins take float32 and float64 only, so float16 always comes here). The
# float32 and float64 paths pass through with one dtype comparison.


def _is_half(a) -> bool:
    return getattr(a, "dtype", None) == np.float16


def _float16_in_float32(*keep_float32: int):
    """Decorate a kernel whose first operand is a float array: when it is float16, every
    float16 operand is widened to float32 and the kernel's array results are rounded back
    to float16, except the results at the positions `keep_float32` (a row logsumexp that
    backward reads: rounded to float16 it would be off by up to 0.25 near 1000)."""

    def wrap(kernel):
        @functools.wraps(kernel)
        def run(*args, **kwargs):
            if not _is_half(args[0]):
                return kernel(*args, **kwargs)
            wide = [a.astype(np.float32) if _is_half(a) else a for a in args]
            out = kernel(*wide, **{k: v.astype(np.float32) if _is_half(v) else v
                                   for k, v in kwargs.items()})
            if not isinstance(out, tuple):
                return out.astype(np.float16)
            return tuple(o if o is None or k in keep_float32 else o.astype(np.float16)
                         for k, o in enumerate(out))

        return run

    return wrap


# ----------------------------------------------------------------------------- softmax
# Each kernel works over the last dim; an op that normalizes another dim hands it a view
# with that dim moved last (no copy). The compiled twins take C-contiguous arrays only.


def _array_module(a):
    return np if isinstance(a, _HOST) else devices.cp


def _softmax_inplace(z) -> None:
    """z = exp(z - max) / sum(exp(z - max)) over the last dim, in place. A row of -inf
    (every entry masked) gives nan, as torch: -inf - -inf is nan."""
    xp = _array_module(z)
    z -= xp.max(z, axis=-1, keepdims=True)
    xp.exp(z, out=z)
    z /= xp.sum(z, axis=-1, keepdims=True)


@_float16_in_float32()
def softmax_forward(x):
    """y = exp(x - max) / sum(exp(x - max)) over the last dim (a new array)."""
    y = x.copy(order="K")  # keeps x's memory order: a moved-axis view comes back in x's layout
    if y.size:
        _softmax_inplace(y)
    return y


@_float16_in_float32()
def softmax_backward(y, g):
    """gx = y * (g - sum(g * y)) over the last dim; one array of y's size."""
    xp = _array_module(y)
    gx = g * y
    dot = xp.sum(gx, axis=-1, keepdims=True)
    xp.subtract(g, dot, out=gx)
    gx *= y
    return gx


@_float16_in_float32()
def log_softmax_forward(x):
    """y = (x - max) - log(sum(exp(x - max))) over the last dim."""
    xp = _array_module(x)
    if x.size == 0:
        return x.copy()
    y = x - xp.max(x, axis=-1, keepdims=True)
    y -= xp.log(xp.sum(xp.exp(y), axis=-1, keepdims=True))
    return y


@_float16_in_float32()
def log_softmax_backward(y, g):
    """gx = g - exp(y) * sum(g) over the last dim."""
    xp = _array_module(y)
    gx = xp.exp(y)
    gx *= xp.sum(g, axis=-1, keepdims=True)
    xp.subtract(g, gx, out=gx)
    return gx


@_float16_in_float32()
def masked_softmax_forward(x, mask, scale):
    """y = softmax(z) over the last dim, z = (x * scale).masked_fill(mask, -inf) for a bool
    mask, x * scale + mask for a float one (of x's dtype), x * scale for None. The mask
    broadcasts to x's shape and is read, never expanded. Fully masked rows are nan."""
    xp = _array_module(x)
    z = x * x.dtype.type(scale)  # the one array made: scaled, masked and normalized in place
    if mask is not None and mask.dtype == bool:
        xp.copyto(z, -np.inf, where=mask)
    elif mask is not None:
        z += mask
    if z.size:
        _softmax_inplace(z)
    return z


@_float16_in_float32()
def masked_softmax_backward(y, g, scale, bool_mask):
    """gx = scale * y * (g - sum(g * y)) over the last dim. With a bool mask, rows whose
    output is nan (every entry masked) get a zero gradient: torch's masked_fill backward
    zeroes the masked entries, and in such a row that is every entry."""
    gx = softmax_backward(y, g)
    if scale != 1:
        gx *= y.dtype.type(scale)
    if bool_mask and y.size:
        gx[_array_module(y).isnan(y[..., 0])] = 0
    return gx


# One block of query rows of a causal attention's (..., T, T) probabilities P
# (ops/attention_views.py): s holds the block's scores (..., bq, i1) against keys [0, i1),
# the block's rows being queries [i0, i1), i0 = i1 - bq; query i keeps keys [0, i].


def causal_softmax_block(s, P, scale) -> None:
    """P[..., i0:i1, :] = softmax(s * scale) over each query's keys [0, i], zeros after
    them (the future, up to T): the block's rows of P written once. s is left as it was."""
    xp = _array_module(s)
    bq, i1 = s.shape[-2:]
    i0 = i1 - bq
    z = s.astype(np.float32) if _is_half(s) else s.copy()  # float16: summed in float32
    z *= z.dtype.type(scale)
    xp.copyto(z, -np.inf, where=xp.triu(xp.ones((bq, i1), dtype=bool), i0 + 1))
    if z.size:
        _softmax_inplace(z)
    P[..., i0:i1, :i1] = z
    P[..., i0:i1, i1:] = 0


def causal_softmax_block_backward(dp, P, scale) -> None:
    """The block's scores' gradient written over dp (..., bq, i1), dp = d(loss)/d(P)'s
    block: dp = scale * p * (dp - rowsum(p * dp)), p = P[..., i0:i1, :i1] (zero in each
    row's future, so those entries become 0)."""
    xp = _array_module(dp)
    bq, i1 = dp.shape[-2:]
    p = P[..., i1 - bq:i1, :i1]
    if _is_half(dp):  # float16: the row sums in float32, the result rounded once
        d, p = dp.astype(np.float32), p.astype(np.float32)
    else:
        d = dp
    d -= xp.sum(d * p, axis=-1, keepdims=True)
    d *= p
    if scale != 1:
        d *= d.dtype.type(scale)
    if d is not dp:
        dp[...] = d


# ----------------------------------------------------------------------------- attention
# The blocked attention's element-wise steps between its GEMMs (ops/attention.py), on one
# tile of scores at a time: s = q_blk k_blk^T of shape (..., bq, bk), written over in place.
# keep (bool, True = may attend) and add (float, added to the scores) are the tile's mask,
# broadcastable to s, or None.


def attention_block_forward(s, m, l, acc, keep, add, scale) -> None:
    """One key block of the online softmax, in place, with z = s * scale + add, -inf where
    not keep; m and l the running row max and row sum of exps (..., bq, 1), acc the running
    weighted sum of values (..., bq, D):

        m' = max(m, rowmax(z)),  p = exp(z - m'),  c = exp(m - m'),
        l' = l c + rowsum(p),    acc' = acc c;     s becomes p, m and l become m' and l'.

    A row that has seen no key yet (m' = -inf) takes 0 for m' in the exps, so its p and c
    are 0, not nan. The caller then adds p @ v_blk to acc."""
    xp = _array_module(s)
    s *= s.dtype.type(scale)
    if add is not None:
        s += add
    if keep is not None:
        xp.copyto(s, -np.inf, where=xp.logical_not(keep))
    m_new = xp.maximum(m, s.max(axis=-1, keepdims=True))
    m_safe = xp.where(xp.isfinite(m_new), m_new, 0)
    s -= m_safe
    xp.exp(s, out=s)
    correction = xp.exp(m - m_safe)
    l *= correction
    l += s.sum(axis=-1, keepdims=True)
    acc *= correction
    m[...] = m_new


def attention_block_probs(s, lse, keep, add, scale) -> None:
    """The tile's probabilities rebuilt in backward from its scores and the forward's row
    logsumexp lse (..., bq, 1), written over s: p = exp(s * scale + add - lse), 0 where
    not keep. The hidden scores become -inf before the exp (whose p is then 0 exactly), not
    0 after it: a hidden score far above the row's lse would overflow to inf there, and on a
    recorded tile (create_graph) the derivative through that inf is nan, not 0. (~keep, not
    logical_not(keep): on a recorded tile xp is NumPy, and keep may be a device array.)"""
    xp = _array_module(s)
    s *= s.dtype.type(scale)
    if add is not None:
        s += add
    if keep is not None:
        xp.copyto(s, -np.inf, where=~keep)
    s -= lse
    xp.exp(s, out=s)


def attention_block_dscores(dp, p, d, scale) -> None:
    """The scores' gradient written over dp = do v_blk^T: ds = (dp - d) * p * scale, with d
    = rowsum(do * out) (..., bq, 1) and p the tile's probabilities."""
    dp -= d
    dp *= p
    if scale != 1:
        dp *= dp.dtype.type(scale)


_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_erf64 = np.frompyfunc(math.erf, 1, 1)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _erfc_tail(abs_z):
    """1 - erf(|z|) by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7, below float32's
    epsilon), computed in place: `abs_z` is consumed; two more buffers of its size."""
    a1, a2, a3, a4, a5 = _AS_A
    t = abs_z * _AS_P
    t += 1
    np.reciprocal(t, out=t)
    y = t * a5
    for a in (a4, a3, a2, a1):
        y += a
        y *= t
    np.square(abs_z, out=abs_z)
    np.negative(abs_z, out=abs_z)
    np.exp(abs_z, out=abs_z)
    y *= abs_z
    return y, t


def _exact(x) -> bool:
    """float64 on NumPy goes through the C library's erf, exact to rounding (for checks)."""
    return x.dtype == np.float64 or not isinstance(x, np.ndarray)


def erf(x):
    """The error function, elementwise.

    float64 on NumPy uses the C library's erf (exact to rounding; slow, meant for checks);
    float32/16 on NumPy uses Abramowitz & Stegun 7.1.26 in place; CuPy its own kernel.
    """
    if isinstance(x, ArrayProtocol):  # a recorded backward: the engine's erf, recorded
        return x.erf()
    if isinstance(x, np.generic):  # a NumPy scalar (arithmetic on a 0-d array gives one)
        x = np.asarray(x)
    if not isinstance(x, np.ndarray):
        import cupyx.scipy.special

        return cupyx.scipy.special.erf(x)
    if x.dtype == np.float64:
        return np.asarray(_erf64(x)).astype(np.float64)
    y, _ = _erfc_tail(np.abs(x))
    np.subtract(1, y, out=y)
    return np.copysign(y, x, out=y)


def gelu_cdf(x):
    """Phi(x) = (1 + erf(x / sqrt 2)) / 2, in as few passes and buffers as NumPy allows.

    Returns (cdf, spare) where `spare` is a free buffer of x's shape (or None)."""
    if _exact(x):
        return 0.5 * (1 + erf(x * _INV_SQRT2)), None
    z = np.abs(x)
    z *= _INV_SQRT2
    h, spare = _erfc_tail(z)  # 1 - erf(|x| / sqrt 2)
    h *= -0.5
    h += 0.5  # erf(|x| / sqrt 2) / 2
    np.copysign(h, x, out=h)
    h += 0.5  # Phi(x) = 1/2 + sign(x) erf(|x| / sqrt 2) / 2
    return h, spare


# Elementwise chains over activation-sized arrays (a (8, 256, 1536) gelu input is 12 MiB)
# run block by block: each of a chain's ~25 NumPy passes then reads and writes a block that
# is still in cache, instead of streaming the whole array from memory 25 times, and the
# scratch buffers are block-sized rather than array-sized.
_BLOCK = 65536


def _gelu_block(x, out, s1, s2, g=None):
    """out = gelu(x) (g None) or g * gelu'(x) on one block; s1, s2 scratch of its size.

    One exp serves both terms: erfc(|x| / sqrt 2) by Abramowitz & Stegun 7.1.26 is a
    polynomial times exp(-x^2 / 2), and phi(x) is exp(-x^2 / 2) / sqrt(2 pi)."""
    a1, a2, a3, a4, a5 = _AS_A
    np.abs(x, out=s1)
    s1 *= _INV_SQRT2  # z = |x| / sqrt 2
    np.multiply(s1, _AS_P, out=s2)
    s2 += 1
    np.reciprocal(s2, out=s2)  # t = 1 / (1 + p z)
    np.multiply(s2, a5, out=out)
    for a in (a4, a3, a2, a1):
        out += a
        out *= s2
    np.square(s1, out=s1)
    np.negative(s1, out=s1)
    np.exp(s1, out=s1)  # exp(-z^2) = exp(-x^2 / 2)
    out *= s1  # erfc(z)
    out *= -0.5
    out += 0.5
    np.copysign(out, x, out=out)
    out += 0.5  # Phi(x) = 1/2 + sign(x) erf(z) / 2
    if g is None:
        out *= x
        return
    s1 *= x
    s1 *= _INV_SQRT_2PI  # x phi(x)
    out += s1
    out *= g


def _blocks(n: int):
    """(lo, hi) of each block of a flat range of n elements."""
    for lo in range(0, n, _BLOCK):
        yield lo, min(lo + _BLOCK, n)


def _dense_alike(*arrays) -> bool:
    """NumPy arrays, all C-contiguous, all of the first one's shape and dtype."""
    x = arrays[0]
    return all(isinstance(a, np.ndarray) and a.dtype == x.dtype and a.shape == x.shape
               and a.flags.c_contiguous for a in arrays)


def _blockable(*arrays) -> bool:
    """What the blocked float kernels take (float64 keeps the exact, whole-array path)."""
    return _dense_alike(*arrays) and arrays[0].dtype in (np.float32, np.float16)


def _blockwise(kernel, x, g=None):
    """kernel(x, out, s1, s2, g) over C-contiguous x (and g) block by block."""
    out = np.empty_like(x)
    xf, of = x.reshape(-1), out.reshape(-1)
    gf = None if g is None else g.reshape(-1)
    s1 = np.empty(min(xf.size, _BLOCK), x.dtype)
    s2 = np.empty_like(s1)
    for lo, hi in _blocks(xf.size):
        m = hi - lo
        kernel(xf[lo:hi], of[lo:hi], s1[:m], s2[:m], None if gf is None else gf[lo:hi])
    return out


def gelu_forward(x):
    """x * Phi(x)."""
    if _blockable(x):
        return _blockwise(_gelu_block, x)
    cdf, _ = gelu_cdf(x)
    cdf *= x
    return cdf


def gelu_backward(x, g):
    """g * (Phi(x) + x * phi(x)), phi the standard normal density."""
    if _blockable(x, g):
        return _blockwise(_gelu_block, x, g)
    cdf, spare = gelu_cdf(x)
    xp = np if isinstance(x, _HOST) else devices.cp
    if spare is None:
        return g * (cdf + x * (_INV_SQRT_2PI * xp.exp(-0.5 * x * x)))
    np.square(x, out=spare)
    spare *= -0.5
    np.exp(spare, out=spare)
    spare *= _INV_SQRT_2PI
    spare *= x
    cdf += spare
    cdf *= g
    return cdf


# The tanh approximation: gelu(x) ~ 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_TANH_K = 0.044715


def _xp(x):
    return np if isinstance(x, (*_HOST, np.generic)) else devices.cp


def gelu_tanh_forward(x):
    """0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)."""
    inner = _SQRT_2_OVER_PI * (x + _TANH_K * x * x * x)
    return 0.5 * x * (1 + _xp(x).tanh(inner))


def gelu_tanh_backward(x, g):
    """g * (0.5 (1 + t) + 0.5 x (1 - t^2) du/dx),  t = tanh(u),
    du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)."""
    t = _xp(x).tanh(_SQRT_2_OVER_PI * (x + _TANH_K * x * x * x))
    d_inner = _SQRT_2_OVER_PI * (1 + 3 * _TANH_K * x * x)
    return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * d_inner)


def _row_blocks(x):
    """x as (rows, n) and the row ranges of blocks of about _BLOCK elements."""
    rows = x.reshape(math.prod(x.shape[:-1]), x.shape[-1]) if x.ndim else x.reshape(1, 1)
    step = max(1, _BLOCK // max(1, rows.shape[1]))
    return rows, [(r, min(r + step, rows.shape[0])) for r in range(0, rows.shape[0], step)]


def bias_gelu_forward(x, bias, approximate="none"):
    """gelu(x + bias), the bias (x.shape[-1],) added along the last dim.

    x + bias is formed a block of rows at a time, so it never exists as a whole array (it
    would be a temporary of x's size); the compiled twin adds it element by element."""
    gelu = gelu_tanh_forward if approximate == "tanh" else gelu_forward
    if not isinstance(x, np.ndarray):  # CuPy: whole arrays
        return gelu(x + bias)
    rows, blocks = _row_blocks(x)
    out = np.empty(rows.shape, x.dtype)
    for lo, hi in blocks:
        out[lo:hi] = gelu(rows[lo:hi] + bias)
    return out.reshape(x.shape)


def bias_gelu_backward(x, bias, g, approximate="none"):
    """(gx, gbias): gx = g * gelu'(x + bias), gbias = gx summed over all dims but the last.
    x + bias is formed a block of rows at a time, as in the forward."""
    grad = gelu_tanh_backward if approximate == "tanh" else gelu_backward
    if not isinstance(x, np.ndarray):
        gx = grad(x + bias, g)
    else:
        rows, blocks = _row_blocks(x)
        g_rows = g.reshape(rows.shape)
        gx = np.empty(rows.shape, x.dtype)
        for lo, hi in blocks:
            gx[lo:hi] = grad(rows[lo:hi] + bias, g_rows[lo:hi])
        gx = gx.reshape(x.shape)
    return gx, gx.sum(axis=tuple(range(gx.ndim - 1)))


def dropout_forward(x, u, p):
    """(y, keep): keep = u >= p (u uniform in [0, 1)), y = x * keep * scale with
    scale = 1 / (1 - p) in x's dtype, multiplied in that order."""
    keep = u >= p
    y = x * keep
    y *= x.dtype.type(1.0 / (1.0 - p))  # in place: no second temporary of x's size
    return y, keep


def dropout_backward(g, keep, scale):
    """g * keep * scale, scale in g's dtype, multiplied in that order."""
    return (g * keep) * g.dtype.type(scale)


# ------------------------------------------------------------------------- optimizer, reductions

def adamw_update(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step) -> None:
    """One AdamW step on arrays, in place (p, m, v), as torch.optim.AdamW computes it:

        p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    On NumPy with C-contiguous operands of one dtype it runs block by block with one
    block-sized scratch buffer (no parameter-sized temporary); otherwise over the whole
    arrays with one parameter-sized scratch array."""
    step_size = lr / (1 - beta1**step)
    inv_bc2 = 1.0 / math.sqrt(1 - beta2**step)
    decay = 1 - lr * weight_decay

    def update(xp, p, g, m, v, s):
        if decay != 1:
            p *= decay
        m *= beta1
        xp.multiply(g, 1 - beta1, out=s)
        m += s
        v *= beta2
        xp.multiply(g, g, out=s)
        s *= 1 - beta2
        v += s
        xp.sqrt(v, out=s)
        s *= inv_bc2
        s += eps
        xp.divide(m, s, out=s)
        s *= -step_size
        p += s

    if not _dense_alike(p, g, m, v):  # CuPy, or strided operands: whole arrays
        xp = np if isinstance(p, _HOST) else devices.cp
        update(xp, p, g, m, v, xp.empty(p.shape, p.dtype))
        return
    pf, gf, mf, vf = (a.reshape(-1) for a in (p, g, m, v))
    s = np.empty(min(pf.size, _BLOCK), p.dtype)
    for lo, hi in _blocks(pf.size):
        update(np, pf[lo:hi], gf[lo:hi], mf[lo:hi], vf[lo:hi], s[:hi - lo])


def adamw_update_many(params, grads, exp_avgs, exp_avg_sqs, lr, beta1, beta2, eps,
                      weight_decay, step) -> None:
    """adamw_update on each (p, g, m, v) of four equal-length lists, one after another
    (torch.optim.AdamW's foreach form; the compiled twin does them all in one pass)."""
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        adamw_update(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step)


# ----------------------------------------------------------------------------- norms, loss
# Row kernels on the 2-D view (rows, n) of an op's operands: the op reshapes its input, so a
# kernel has one row axis and one reduced axis whatever the op's normalized shape.
def _xp(a):
    return np if isinstance(a, _HOST) else devices.cp


@_float16_in_float32()
def layer_norm_forward(x, weight, bias, eps):
    """(y, rstd) of x (rows, n), weight and bias (n,) or None:

        y = (x - mean) * rstd * weight + bias,  rstd = 1 / sqrt(mean((x - mean)^2) + eps),
        rstd of shape (rows, 1). The op saves x and rstd, not xhat: backward rebuilds
        xhat from them (_layer_norm_xhat), so the forward allocates only its output."""
    xp = _xp(x)
    y = x - x.mean(axis=1, keepdims=True)  # the centred x, then the output in place
    var = xp.square(y).mean(axis=1, keepdims=True)
    rstd = 1.0 / xp.sqrt(var + eps)
    y *= rstd
    if weight is not None:
        y *= weight
    if bias is not None:
        y += bias
    return y, rstd


def _layer_norm_xhat(x, rstd):
    """xhat = (x - mean) * rstd, the mean recomputed as the forward computed it."""
    xhat = x - x.mean(axis=1, keepdims=True)
    xhat *= rstd
    return xhat


@_float16_in_float32()
def layer_norm_backward(g, x, rstd, weight, needs):
    """(gx, gw, gb) of g (rows, n) for the saved input x and rstd, each None where `needs`
    (for x, weight, bias) is false:

        xhat = (x - mean) * rstd,
        gx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)),  gh = g * weight,
        gw = sum over rows of g * xhat,  gb = sum over rows of g.

    Two g-sized buffers in all: xhat, and `tmp` (g * xhat, then gh, which becomes gx)."""
    xp = _xp(g)
    nx, nw, nb = needs
    gb = g.sum(axis=0) if nb else None
    if not (nx or nw):
        return None, None, gb
    xhat = _layer_norm_xhat(x, rstd)
    tmp = g * xhat
    gw = tmp.sum(axis=0) if nw else None
    if not nx:
        return None, gw, gb
    # mean(gh * xhat) per row is (g * xhat) . weight / n: from tmp, before it becomes gh
    m2 = (matmul(xp, tmp, weight) if weight is not None else tmp.sum(axis=1))[:, None]
    m2 /= g.shape[1]
    gh = tmp
    if weight is not None:
        xp.multiply(g, weight, out=gh)
    else:
        gh[...] = g
    gh -= gh.mean(axis=1, keepdims=True)
    xhat *= m2
    gh -= xhat
    gh *= rstd
    return gh, gw, gb


def add_layer_norm_forward(x, r, weight, bias, eps):
    """(s, y, rstd) of x (rows, n) and a residual r (rows, n), or a (k, n) r that repeats
    down the rows (rows a multiple of k: a (T, C) table added to every (T, C) block of a
    (B * T, C) x), weight and bias (n,) or None:

        s = x + r (the residual stream, in x's dtype, as an add would give it),
        y, rstd = layer_norm_forward(s, weight, bias, eps).

    The residual add and the norm after it, read once: s is what the layer_norm would
    have taken, so the op saves s and rstd, as layer_norm saves its input and rstd."""
    if r.shape[0] != x.shape[0]:  # the repeating table: add it block by block (a view)
        s = (x.reshape(-1, r.shape[0], x.shape[1]) + r).reshape(x.shape)
    else:
        s = x + r
    y, rstd = layer_norm_forward(s, weight, bias, eps)
    return s, y, rstd


def add_layer_norm_backward(g, s, rstd, weight, gs, needs):
    """(gx, gw, gb) of add_layer_norm for g (rows, n), the gradient of y, and gs, the
    gradient of s (or None when s got none), each None where `needs` (for the inputs,
    weight, bias) is false:

        gx = gs + layer_norm_backward(g, s, rstd, weight)'s gx,

    the one gradient of both x and r (s = x + r), summed into layer_norm's gx buffer."""
    gx, gw, gb = layer_norm_backward(g, s, rstd, weight, needs)
    if gx is not None and gs is not None:
        gx += gs
    return gx, gw, gb


@_float16_in_float32()
def rms_norm_forward(x, weight, eps):
    """(y, rstd) of x (rows, n), weight (n,) or None:

        rstd = 1 / sqrt(mean(x^2) + eps) of shape (rows, 1),  y = x * rstd * weight."""
    xp = _xp(x)
    rstd = xp.square(x).mean(axis=1, keepdims=True)
    rstd += eps
    rstd = 1.0 / xp.sqrt(rstd)
    y = x * rstd
    if weight is not None:
        y *= weight
    return y, rstd


@_float16_in_float32()
def rms_norm_backward(g, x, rstd, weight, needs):
    """(gx, gw) of g (rows, n), each None where `needs` (for x, weight) is false:

        xhat = x * rstd,  gh = g * weight,  gx = rstd * (gh - xhat * mean(gh * xhat)),
        gw = sum over rows of g * xhat."""
    nx, nw = needs
    xhat = x * rstd
    gw = (g * xhat).sum(axis=0) if nw else None
    if not nx:
        return None, gw
    gh = g * weight if weight is not None else g.copy()
    m = (gh * xhat).mean(axis=1, keepdims=True)
    xhat *= m
    gh -= xhat
    gh *= rstd
    return gh, gw


@_float16_in_float32(0, 1)
def cross_entropy_forward(logits, target, ignore_index):
    """(loss, lse) of logits (N, C) and class indices target (N,), already checked to be
    in range where they are not ignore_index:

        lse = log(sum(exp(logits - max))) + max, of shape (N, 1),
        loss = (lse - logits[target]) * (target != ignore_index), of shape (N,).

    The index arithmetic runs in the target's module: recorded logits (create_graph) take
    NumPy's functions, a plain device target its device's."""
    xp = _xp(logits)
    valid = target != ignore_index
    m = logits.max(axis=1, keepdims=True)
    lse = xp.log(xp.exp(logits - m).sum(axis=1, keepdims=True)) + m
    picked = xp.take_along_axis(logits, _xp(target).where(valid, target, 0)[:, None], axis=1)
    return ((lse - picked)[:, 0] * valid).astype(logits.dtype, copy=False), lse


@_float16_in_float32()
def cross_entropy_backward(logits, lse, target, ignore_index, scale):
    """(softmax(logits) - onehot(target)) * scale * (target != ignore_index), with
    softmax = exp(logits - lse); scale is a scalar (0-d) or one value per row (N,).
    The index arithmetic runs in the target's module (as in cross_entropy_forward)."""
    xp, ixp = _xp(logits), _xp(target)
    valid = target != ignore_index
    grad = logits - lse
    xp.exp(grad, out=grad)  # the softmax, in the one buffer the gradient needs
    grad[ixp.arange(logits.shape[0]), ixp.where(valid, target, 0)] -= 1
    grad *= (valid * scale)[:, None] if scale.ndim else valid[:, None] * scale
    return grad
