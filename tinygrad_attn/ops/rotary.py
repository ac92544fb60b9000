"""Rotary position embeddings (RoPE) as one op that saves nothing but its tables.

Each pair of channels (i, i + D/2) of a query or key row at position t is rotated by the
angle t * theta_i (the "rotate-half" layout of GPT-NeoX and Llama):

    out[..., :h] = x1 * cos - x2 * sin        x1 = x[..., :h], x2 = x[..., h:], h = D / 2
    out[..., h:] = x2 * cos + x1 * sin        cos, sin: (T, h) tables, broadcast over (B, nh)

A rotation is orthogonal, so backward is the inverse rotation of the gradient, which reads
only the tables: nothing of x is kept.
"""

from __future__ import annotations

from .. import backend
from .. import shape as shp
from ..autograd import Function
from ..autograd.graph import recording
from ..errors import ShapeError
from ._util import Tensor, check_same_device, from_array
from .registry import op


def _rotate(xp, X, C, S, sign: float):
    """[x1 c - sign x2 s, x2 c + sign x1 s] into one new array (sign -1: the inverse).

    The halves x1, x2 are views of X; the result is written half by half into one buffer,
    with one half-sized temporary for the cross term. A recorded backward (create_graph)
    computes the same products out of place.
    """
    h = X.shape[-1] // 2
    x1, x2 = X[..., :h], X[..., h:]
    if recording():  # create_graph: the same products, the halves joined by a recorded cat
        o1 = x1 * C - x2 * S if sign > 0 else x1 * C + x2 * S
        o2 = x2 * C + x1 * S if sign > 0 else x2 * C - x1 * S
        return xp.concatenate([o1, o2], axis=-1)
    out = xp.empty(X.shape, dtype=X.dtype)
    o1, o2 = out[..., :h], out[..., h:]
    xp.multiply(x1, C, out=o1)
    cross = x2 * S
    if sign > 0:
        o1 -= cross
    else:
        o1 += cross
    xp.multiply(x2, C, out=o2)
    xp.multiply(x1, S, out=cross)
    if sign > 0:
        o2 += cross
    else:
        o2 -= cross
    return out


class RotaryEmbedding(Function):
    """y = [x1 cos - x2 sin, x2 cos + x1 sin];  gx = [g1 cos + g2 sin, g2 cos - g1 sin].

    Saves only the cos and sin tables (which in a model are buffers that live anyway), not
    x: the inverse rotation needs nothing else. Allocates the output (x's shape) and, while
    it runs, one temporary of half of it.
    """

    @staticmethod
    def forward(ctx, x, cos, sin):
        xp = backend.xp_for(x.device)
        ctx.save_for_backward(cos, sin)
        return from_array(_rotate(xp, x._array(), cos._array(), sin._array(), +1.0))

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        return from_array(_rotate(xp, g._array(), cos._array(), sin._array(), -1.0)), None, None


@op(RotaryEmbedding, functional=True)
def apply_rotary_emb(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (..., T, D) by the angles whose cos and sin are given, (T, D/2) or any
    shape that broadcasts to x's first half (..., T, D/2) without enlarging x.

    The channels are paired rotate-half style (channel i with i + D/2): with full-width
    tables cos_full = cat(cos, cos), this is x * cos_full + rotate_half(x) * sin_full.
    cos and sin are constants: no gradient flows to them, and they must not require one.

    >>> import tinygrad_attn as ta
    >>> x = ta.tensor([[1.0, 0.0]])  # one position, one pair
    >>> ta.functional.apply_rotary_emb(x, ta.tensor([[0.0]]), ta.tensor([[1.0]])).tolist()
    [[0.0, 1.0]]
    """
    check_same_device("apply_rotary_emb", x, cos, sin)
    if x.ndim < 1 or x.shape[-1] % 2:
        raise ShapeError(f"apply_rotary_emb: x of shape {tuple(x.shape)} needs an even last "
                         "dim (its channels are rotated in pairs)")
    if not x.dtype.is_floating_point or cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise TypeError(f"apply_rotary_emb: x, cos and sin must share one floating dtype; "
                        f"got {x.dtype}, {cos.dtype}, {sin.dtype}")
    half = tuple(x.shape[:-1]) + (x.shape[-1] // 2,)
    for name, t in (("cos", cos), ("sin", sin)):
        try:
            ok = shp.broadcast_shapes(t.shape, half) == half
        except ShapeError:
            ok = False
        if not ok:
            raise ShapeError(f"apply_rotary_emb: {name} of shape {tuple(t.shape)} does not "
                             f"broadcast to x's half {half} (x is {tuple(x.shape)})")
        if t.requires_grad:
            raise ValueError(f"apply_rotary_emb: {name} requires grad, but the tables are "
                             "constants (backward keeps only them, not x); detach them")
    return RotaryEmbedding.apply(x, cos, sin)
