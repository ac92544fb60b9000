"""The recurrent cells: rnn_tanh_cell, rnn_relu_cell, lstm_cell and gru_cell, one node each.

A cell is one time step of a recurrent layer: the two gate projections (x @ w_ih^T and
h @ w_hh^T, each one GEMM through backend.matmul) and the gate nonlinearities in one op,
so its backward keeps the few (B, H) arrays the derivative needs, not every intermediate
of a chain of elementwise ops. nn.RNN, nn.LSTM and nn.GRU run one cell per time step,
layer and direction; what a step keeps is in each class's docstring and, measured, in
docs/recurrent.md.

Shapes and names are torch's: input (B, I), hidden states (B, H), w_ih (G*H, I),
w_hh (G*H, H), b_ih and b_hh (G*H,) or None, with G gates stacked in torch's order
(1 for the plain cells; LSTM: i, f, g, o; GRU: r, z, n). The hidden size is
w_hh.shape[1], as torch reads it.

One extension of torch's signatures: w_ih may be None, and then the input is the input
projection x @ w_ih^T already, (B, G*H). A layer computes it for all T steps at once (one
GEMM over T * B rows, whose matmul node keeps the input sequence, and one GEMM for w_ih's
gradient in backward), and each step's cell adds only h @ w_hh^T.
"""

from __future__ import annotations

from .. import backend
from ..autograd import Function
from ..autograd.graph import recording, wrap
from ..errors import ShapeError
from ._util import Tensor, check_same_device, from_array, zeros_array
from .nonlinear import _sigmoid_array
from .registry import op


# ----------------------------------------------------------------------------- checks
def _check(op_name: str, gates: int, x, hx: tuple, w_ih, w_hh, b_ih, b_hh) -> None:
    """torch's checks of a cell's operands, in its order and with its exception types."""
    named = [("input", x), *((f"hx[{k}]", h) for k, h in enumerate(hx)),
             ("w_ih", w_ih), ("w_hh", w_hh)]
    for name, t in named + [("b_ih", b_ih), ("b_hh", b_hh)]:
        if type(t) is not Tensor and (t is not None or name in ("input", "w_hh")
                                      or name.startswith("hx")):
            raise TypeError(f"{op_name}(): argument '{name}' must be Tensor, not "
                            f"{type(t).__name__}")
    named = [(name, t) for name, t in named if t is not None]  # w_ih may be None
    operands = [t for _, t in named] + [b for b in (b_ih, b_hh) if b is not None]
    check_same_device(op_name, *operands)
    dtypes = {t.dtype for t in operands}
    if len(dtypes) > 1 or not x.dtype.is_floating_point:
        listed = ", ".join(f"{n} {t.dtype.name}" for n, t in named)
        raise RuntimeError(f"{op_name}: expected floating point operands of one dtype, got "
                           f"{listed}; cast them, e.g. input.to(w_ih.dtype)")
    shapes = (f"input {tuple(x.shape)}, hidden {[tuple(h.shape) for h in hx]}, "
              f"w_ih {None if w_ih is None else tuple(w_ih.shape)}, w_hh {tuple(w_hh.shape)}")
    for t in (x, *hx):
        if t.ndim < 2:  # torch reads size(1) of it: an IndexError
            raise IndexError(f"{op_name}: expected 2-D input and hidden states (batch, size), "
                             f"got {shapes}; one example is a batch of 1")
    if (x.ndim != 2 or any(h.ndim != 2 for h in hx) or w_hh.ndim != 2
            or (w_ih is not None and w_ih.ndim != 2)):
        raise ShapeError(f"{op_name}: expected 2-D input, hidden states and weights, got "
                         f"{shapes}")
    hidden = w_hh.shape[1]
    for name, w in (("weight_ih", w_ih), ("weight_hh", w_hh)):
        if w is not None and w.shape[0] != gates * hidden:
            raise ShapeError(f"{op_name}: {name} first dim must be {gates} * hidden_size = "
                             f"{gates * hidden}, but got {w.shape[0]} ({shapes})")
    width = gates * hidden if w_ih is None else w_ih.shape[1]
    if x.shape[1] != width:
        what = " (with w_ih=None the input is the input projection)" if w_ih is None else ""
        raise ShapeError(f"{op_name}: input has inconsistent input_size: got {x.shape[1]} "
                         f"expected {width}{what} ({shapes})")
    for k, h in enumerate(hx):
        if h.shape[0] != x.shape[0]:
            raise ShapeError(f"{op_name}: Input batch size {x.shape[0]} doesn't match "
                             f"hidden{k} batch size {h.shape[0]} ({shapes})")
        if h.shape[1] != hidden:
            raise ShapeError(f"{op_name}: hidden{k} has inconsistent hidden_size: got "
                             f"{h.shape[1]}, expected {hidden} ({shapes})")
    for name, b in (("b_ih", b_ih), ("b_hh", b_hh)):
        if b is not None and tuple(b.shape) != (gates * hidden,):
            raise ShapeError(f"{op_name}: {name} of shape {tuple(b.shape)} must be "
                             f"({gates * hidden},), one value per gate and unit ({shapes})")


# ----------------------------------------------------------------------------- shared math
def _project(xp, inp: Tensor, w: Tensor, b):
    """inp @ w^T (+ b): a fresh (B, G*H) array. w.T is a strided view that the GEMM reads
    as a transposed operand; nothing is copied."""
    out = backend.matmul(xp, inp._array(), w._array().T)
    if b is not None:
        out += b._array()
    return out


def _input_projection(xp, x: Tensor, w_ih, b_ih):
    """x @ w_ih^T (+ b_ih), or x itself (+ b_ih) when w_ih is None (x is the projection):
    an array to read, not to write (it may be x's own)."""
    if w_ih is not None:
        return _project(xp, x, w_ih, b_ih)
    return x._array() if b_ih is None else x._array() + b_ih._array()


def _gates(xp, x: Tensor, h: Tensor, w_ih, w_hh: Tensor, b_ih, b_hh):
    """x @ w_ih^T + b_ih + h @ w_hh^T + b_hh: a fresh (B, G*H) array."""
    out = _project(xp, h, w_hh, b_hh)
    out += _input_projection(xp, x, w_ih, b_ih)
    return out


def _sigmoid_(xp, a):
    """a = sigmoid(a) in place (a is a slice of the gate buffer)."""
    a[...] = _sigmoid_array(xp, a)


def _projection_grads(xp, needs: tuple, d_ih, d_hh, x, h, w_ih, w_hh):
    """The gradients of the two projections x @ w_ih^T + b_ih and h @ w_hh^T + b_hh, given
    the gradient of each (d_ih, d_hh: (B, G*H) arrays, the same array for the cells that
    add the two): (gx, gh, gw_ih, gw_hh, gb_ih, gb_hh), None where not needed. needs is
    ctx.needs_input_grad over (x, h, w_ih, w_hh, b_ih, b_hh)."""
    nx, nh, nw_ih, nw_hh, nb_ih, nb_hh = needs
    gx = None
    if nx:  # without w_ih, x is the projection and its gradient is d_ih itself
        gx = d_ih if w_ih is None else backend.matmul(xp, d_ih, w_ih._array())
    gh = backend.matmul(xp, d_hh, w_hh._array()) if nh else None
    gw_ih = backend.matmul(xp, d_ih.T, x._array()) if nw_ih else None
    gw_hh = backend.matmul(xp, d_hh.T, h._array()) if nw_hh else None
    gb_ih = d_ih.sum(axis=0) if nb_ih else None
    gb_hh = None
    if nb_hh:  # its own array: two leaves must never share one gradient buffer
        gb_hh = gb_ih.copy() if (nb_ih and d_hh is d_ih) else d_hh.sum(axis=0)
    return gx, gh, gw_ih, gw_hh, gb_ih, gb_hh


def _save_projection_inputs(ctx, needs: tuple, x, h, w_ih, w_hh, *more) -> None:
    """Save what the projections' gradients read, and only that: x for gw_ih, h for gw_hh,
    w_ih for gx, w_hh for gh; `more` (the cell's own arrays) after them."""
    nx, nh, nw_ih, nw_hh = needs[:4]
    ctx.save_for_backward(x if nw_ih else None, h if nw_hh else None,
                          w_ih if nx else None, w_hh if nh else None, *more)


def _tensors(*arrays):
    return tuple(None if a is None else from_array(a) for a in arrays)


def _grad_or_zeros(ctx, g, nr: int):
    """g, or the zeros the engine materializes for output nr's missing gradient. The LSTM
    and GRU cells take their missing gradients as None (materialize_grads off), so that
    the buffer they keep, a hidden output, costs no zeros in a first-order backward."""
    if g is not None:
        return g
    shape, dtype, device = ctx._outputs_meta[nr]
    zeros = from_array(zeros_array(shape, dtype, device))
    return wrap(zeros) if recording() else zeros


# ----------------------------------------------------------------------------- Elman cells
class _RnnCell(Function):
    """h' = act(x @ w_ih^T + b_ih + h @ w_hh^T + b_hh), act tanh or relu;
    d = g * act'(h') (tanh: 1 - h'^2, relu: h' > 0); gx = d @ w_ih, gh = d @ w_hh,
    gw_ih = d^T @ x, gw_hh = d^T @ h, gb_ih = gb_hh = sum_B d.

    Saves its output h' (both derivatives are functions of it), and for the weight
    gradients x and h, for the input gradients w_ih and w_hh (each only if the gradient it
    serves is needed). Per time step, in bytes per element of batch x hidden (itemsize s):
    h' (s) and h (s), 2s nominal; in a layer h is the previous step's h', one storage, so
    a step adds s * B * H. x is kept only when the cell projects it (w_ih given); a layer
    passes the projection instead (w_ih=None), whose matmul keeps the input sequence once.
    """

    activation = "tanh"

    @classmethod
    def forward(cls, ctx, x, h, w_ih, w_hh, b_ih=None, b_hh=None):
        xp = backend.xp_for(x.device)
        pre = _gates(xp, x, h, w_ih, w_hh, b_ih, b_hh)
        if cls.activation == "tanh":
            xp.tanh(pre, out=pre)
        else:
            xp.maximum(pre, 0, out=pre)
        y = from_array(pre)
        _save_projection_inputs(ctx, ctx.needs_input_grad, x, h, w_ih, w_hh, y)
        return y

    @classmethod
    def backward(cls, ctx, g):
        x, h, w_ih, w_hh, y = ctx.saved_tensors
        xp = backend.xp_for(g.device)
        Y = y._array()
        d = g._array() * (1 - Y * Y) if cls.activation == "tanh" else g._array() * (Y > 0)
        return _tensors(*_projection_grads(xp, ctx.needs_input_grad, d, d, x, h, w_ih,
                                           w_hh))


class RnnTanhCell(_RnnCell):
    """h' = tanh(x @ w_ih^T + b_ih + h @ w_hh^T + b_hh);  d = g * (1 - h'^2).

    Saves h' and the projections' inputs as _RnnCell says: s * B * H new bytes a step.
    """

    activation = "tanh"


class RnnReluCell(_RnnCell):
    """h' = relu(x @ w_ih^T + b_ih + h @ w_hh^T + b_hh);  d = g * (h' > 0).

    Saves h' (its sign is the mask) and the projections' inputs as _RnnCell says.
    """

    activation = "relu"


def _one_state(op_name: str, hx):
    if type(hx) is not Tensor:
        raise TypeError(f"{op_name}(): argument 'hx' must be Tensor, not {type(hx).__name__}")
    return hx


@op(RnnTanhCell, ta=True)
def rnn_tanh_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):  # noqa: A002 - torch's name
    """One step of an Elman RNN with tanh: (B, I), (B, H) -> (B, H); with w_ih=None the
    input is the input projection, (B, H)."""
    _check("rnn_tanh_cell", 1, input, (_one_state("rnn_tanh_cell", hx),), w_ih, w_hh, b_ih,
           b_hh)
    return RnnTanhCell.apply(input, hx, w_ih, w_hh, b_ih, b_hh)


@op(RnnReluCell, ta=True)
def rnn_relu_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):  # noqa: A002 - torch's name
    """One step of an Elman RNN with relu: (B, I), (B, H) -> (B, H); with w_ih=None the
    input is the input projection, (B, H)."""
    _check("rnn_relu_cell", 1, input, (_one_state("rnn_relu_cell", hx),), w_ih, w_hh, b_ih,
           b_hh)
    return RnnReluCell.apply(input, hx, w_ih, w_hh, b_ih, b_hh)


# ----------------------------------------------------------------------------- LSTM
class LstmCell(Function):
    """[i, f, g, o] = [sig, sig, tanh, sig](x @ w_ih^T + b_ih + h @ w_hh^T + b_hh);
    c' = f * c + i * g;  h' = o * tanh(c').

    Backward, with t = tanh(c'): dc = g_c' + g_h' * o * (1 - t^2); the gate gradients are
    di = dc * g * i(1 - i), df = dc * c * f(1 - f), dg = dc * i * (1 - g^2),
    do = g_h' * t * o(1 - o); gc = dc * f; then gx, gh, gw_ih, gw_hh and the biases from
    d = [di, df, dg, do] as for any projection (gx = d @ w_ih, gw_ih = d^T @ x, ...).
    Saves the four activated gates in one (B, 4H) buffer, c (df reads it), its own output
    c' (t is recomputed from it: c' is the next step's c, so the next step saves the same
    storage again and the two cost one), and for the projections' gradients x and h (the
    weight gradients) and w_ih and w_hh (the input gradients), each only if needed.
    The gates buffer is also a third output, hidden (lstm_cell returns (h', c')) and not
    differentiable: a recorded backward (create_graph=True) reads it as that output, so
    the next derivative flows through the gates back into this node (its gradient g_a
    adds g_a * [i(1 - i), f(1 - f), 1 - g^2, o(1 - o)] to d).
    Per time step, in bytes per element of batch x hidden (itemsize s, 4 for float32):
    gates 4s, c' s, c s, h s: 7s nominal; in a layer c is the previous step's c', so a
    step adds 6s * B * H (24 bytes per element in float32), and the first step's c once
    more (unless it is h's storage too, as the zeros of a layer's hx=None). x is kept
    only when the cell projects it (w_ih given); a layer passes the projection instead
    (w_ih=None), whose matmul keeps the input sequence once.
    """

    @staticmethod
    def forward(ctx, x, h, c, w_ih, w_hh, b_ih=None, b_hh=None):
        xp = backend.xp_for(x.device)
        gates = _gates(xp, x, h, w_ih, w_hh, b_ih, b_hh)
        H = c.shape[1]
        _sigmoid_(xp, gates[:, : 2 * H])  # i, f
        xp.tanh(gates[:, 2 * H: 3 * H], out=gates[:, 2 * H: 3 * H])  # g
        _sigmoid_(xp, gates[:, 3 * H:])  # o
        i, f, g, o = (gates[:, k * H: (k + 1) * H] for k in range(4))
        c_new = f * c._array()
        c_new += i * g
        h_new = xp.tanh(c_new)
        h_new *= o
        hy, cy, gates_t = from_array(h_new), from_array(c_new), from_array(gates)
        needs = ctx.needs_input_grad
        proj_needs = (needs[0], needs[1], needs[3], needs[4])
        _save_projection_inputs(ctx, proj_needs, x, h, w_ih, w_hh, gates_t, c, cy)
        ctx.mark_non_differentiable(gates_t)
        return hy, cy, gates_t

    materialize_grads = False  # the gates output gets no zeros (_grad_or_zeros)

    @staticmethod
    def backward(ctx, g_h, g_c, g_gates=None):
        x, h, w_ih, w_hh, gates, c, cy = ctx.saved_tensors
        g_h, g_c = _grad_or_zeros(ctx, g_h, 0), _grad_or_zeros(ctx, g_c, 1)
        xp = backend.xp_for(g_h.device)
        G = gates._array()
        H = G.shape[1] // 4
        i, f, g, o = (G[:, k * H: (k + 1) * H] for k in range(4))
        t = xp.tanh(cy._array())
        Gh = g_h._array()
        dc = Gh * o * (1 - t * t)
        dc += g_c._array()
        if recording() or g_gates is not None:  # the next derivative: out of place
            d = xp.concatenate([dc * g * i * (1 - i), dc * c._array() * f * (1 - f),
                                dc * i * (1 - g * g), Gh * t * o * (1 - o)], axis=1)
            if g_gates is not None:  # through the gates the recorded backward read
                slopes = xp.concatenate([i * (1 - i), f * (1 - f), 1 - g * g, o * (1 - o)],
                                        axis=1)
                d = d + g_gates._array() * slopes
        else:
            d = xp.empty_like(G)
            d[:, :H] = dc * g * i * (1 - i)
            d[:, H: 2 * H] = dc * c._array() * f * (1 - f)
            d[:, 2 * H: 3 * H] = dc * i * (1 - g * g)
            d[:, 3 * H:] = Gh * t * o * (1 - o)
        needs = ctx.needs_input_grad
        gc = dc * f if needs[2] else None
        gx, gh, gw_ih, gw_hh, gb_ih, gb_hh = _projection_grads(
            xp, needs[:2] + needs[3:], d, d, x, h, w_ih, w_hh)
        return _tensors(gx, gh, gc, gw_ih, gw_hh, gb_ih, gb_hh)


@op(LstmCell, ta=True)
def lstm_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):  # noqa: A002 - torch's name
    """One LSTM step: input (B, I), hx = (h, c) each (B, H) -> (h', c'); with w_ih=None
    the input is the input projection, (B, 4H)."""
    if not isinstance(hx, (tuple, list)):
        raise TypeError(f"lstm_cell(): argument 'hx' must be a tuple of Tensors (h, c), not "
                        f"{type(hx).__name__}")
    if len(hx) != 2:
        raise RuntimeError(f"lstm_cell expects two hidden states (h, c), got {len(hx)}")
    h, c = hx
    _check("lstm_cell", 4, input, (h, c), w_ih, w_hh, b_ih, b_hh)
    hy, cy, _gates = LstmCell.apply(input, h, c, w_ih, w_hh, b_ih, b_hh)
    return hy, cy


# ----------------------------------------------------------------------------- GRU
class GruCell(Function):
    """[r, z] = sig(x @ w_ih^T + b_ih + h @ w_hh^T + b_hh) on the first 2H columns;
    hn = h @ w_hn^T + b_hn;  n = tanh(x @ w_in^T + b_in + r * hn);  h' = (1 - z) * n + z * h.

    Backward: dn = g * (1 - z) * (1 - n^2), dz = g * (h - n) * z(1 - z),
    dr = dn * hn * r(1 - r); the input projection's gradient is [dr, dz, dn], the hidden
    projection's [dr, dz, dn * r] (r scales hn only), and gh adds g * z.
    Saves r, z, n and hn in one (B, 4H) buffer (hn is what dr reads; it cannot be
    recovered from n without the input projection), h (dz reads it, and gw_hh), x for
    gw_ih, and w_ih and w_hh for the input gradients (each only if needed). Per time step,
    in bytes per element of batch x hidden (itemsize s): the buffer 4s and h s, 5s * B * H
    (20 bytes per element in float32); x only when the cell projects it (w_ih given).
    The buffer is also a second output, hidden (gru_cell returns h') and not
    differentiable: a recorded backward (create_graph=True) reads it as that output, so
    the next derivative flows through r, z, n and hn back into this node.
    """

    @staticmethod
    def forward(ctx, x, h, w_ih, w_hh, b_ih=None, b_hh=None):
        xp = backend.xp_for(x.device)
        gi = _input_projection(xp, x, w_ih, b_ih)  # read only: it may be x's own array
        gh = _project(xp, h, w_hh, b_hh)
        H = h.shape[1]
        buf = xp.empty((x.shape[0], 4 * H), dtype=gh.dtype)
        rz = gh[:, : 2 * H]
        rz += gi[:, : 2 * H]
        buf[:, : 2 * H] = _sigmoid_array(xp, rz)
        r, z = buf[:, :H], buf[:, H: 2 * H]
        buf[:, 3 * H:] = gh[:, 2 * H:]  # hn
        n = buf[:, 2 * H: 3 * H]
        xp.multiply(r, gh[:, 2 * H:], out=n)
        n += gi[:, 2 * H:]
        xp.tanh(n, out=n)
        H_arr = h._array()
        h_new = H_arr - n
        h_new *= z
        h_new += n
        buf_t = from_array(buf)
        ctx.save_for_backward(x if ctx.needs_input_grad[2] else None, h,
                              w_ih if ctx.needs_input_grad[0] else None,
                              w_hh if ctx.needs_input_grad[1] else None, buf_t)
        ctx.mark_non_differentiable(buf_t)
        return from_array(h_new), buf_t

    materialize_grads = False  # the buffer output gets no zeros (_grad_or_zeros)

    @staticmethod
    def backward(ctx, g, g_buf=None):
        x, h, w_ih, w_hh, buf = ctx.saved_tensors
        g = _grad_or_zeros(ctx, g, 0)
        xp = backend.xp_for(g.device)
        B = buf._array()
        H = B.shape[1] // 4
        r, z, n, hn = (B[:, k * H: (k + 1) * H] for k in range(4))
        G, Hp = g._array(), h._array()
        if recording() or g_buf is not None:  # the next derivative: out of place
            d_ih, d_hh = _gru_pre_grads(xp, G, Hp, r, z, n, hn, g_buf)
        else:
            d_ih = xp.empty((B.shape[0], 3 * H), dtype=B.dtype)
            dn = d_ih[:, 2 * H:]
            xp.multiply(G * (1 - z), 1 - n * n, out=dn)
            d_ih[:, H: 2 * H] = G * (Hp - n) * z * (1 - z)
            d_ih[:, :H] = dn * hn * r * (1 - r)
            d_hh = d_ih.copy()
            d_hh[:, 2 * H:] *= r
        needs = ctx.needs_input_grad
        gx, gh, gw_ih, gw_hh, gb_ih, gb_hh = _projection_grads(xp, needs, d_ih, d_hh, x, h,
                                                               w_ih, w_hh)
        if needs[1]:
            gh += G * z
        return _tensors(gx, gh, gw_ih, gw_hh, gb_ih, gb_hh)


def _gru_pre_grads(xp, G, Hp, r, z, n, hn, g_buf):
    """GruCell's (d_ih, d_hh) out of place, the gradient of its buffer output [r, z, n, hn]
    (g_buf, or None) included: the text of a recorded backward."""
    H = r.shape[1]
    if g_buf is None:
        dn = G * (1 - z) * (1 - n * n)
        dz = G * (Hp - n) * z * (1 - z)
        dr = dn * hn * r * (1 - r)
        return xp.concatenate([dr, dz, dn], axis=1), xp.concatenate([dr, dz, dn * r], axis=1)
    gr, gz, gn, ghn = (g_buf._array()[:, k * H: (k + 1) * H] for k in range(4))
    dn = (G * (1 - z) + gn) * (1 - n * n)
    dz = (G * (Hp - n) + gz) * z * (1 - z)
    dr = (dn * hn + gr) * r * (1 - r)
    return xp.concatenate([dr, dz, dn], axis=1), xp.concatenate([dr, dz, dn * r + ghn], axis=1)


@op(GruCell, ta=True)
def gru_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):  # noqa: A002 - torch's name
    """One GRU step: input (B, I), hx (B, H) -> h' (B, H); with w_ih=None the input is the
    input projection, (B, 3H)."""
    _check("gru_cell", 3, input, (_one_state("gru_cell", hx),), w_ih, w_hh, b_ih, b_hh)
    h_new, _buf = GruCell.apply(input, hx, w_ih, w_hh, b_ih, b_hh)
    return h_new
