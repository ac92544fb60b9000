"""Compiled AdamW over a whole parameter group in one parallel pass."""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from ._common import JIT, PAR

# AdamW over many parameters in one parallel pass. Each parallel launch of numba's
# workqueue pool costs tens of microseconds whatever its size, more than a bias's whole
# update, so a group's parameters go to one kernel as a table of addresses and sizes, cut
# into chunks of equal length that the threads share out. (A tuple of arrays would compile
# once per group length, and slowly; a typed List costs more to build than the update.)
_ADAMW_CHUNK = 16384  # elements: a chunk's four float32 streams stay within L2


@intrinsic
def _pointer_to(typingctx, address, like):
    """The integer `address` as a pointer to elements of `like`'s dtype."""
    ptr = types.CPointer(like.dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))

    return ptr(types.int64, like), codegen


@njit(**JIT)
def _adamw_row(table, j, p, g, m, v):
    """Row j of the table: the four arrays' data addresses, then their size; False (and
    the row unwritten) if their sizes differ."""
    if g.size != p.size or m.size != p.size or v.size != p.size:
        return False
    table[j, 0] = p.ctypes.data
    table[j, 1] = g.ctypes.data
    table[j, 2] = m.ctypes.data
    table[j, 3] = v.ctypes.data
    table[j, 4] = p.size
    return True


@njit(inline="always")
def _adamw_span(p, g, m, v, lo, hi, decay, b1, c1, b2, c2, inv_bc2, eps, neg_step):
    # The reference's operations one by one, each rounded to the arrays' dtype, in its
    # order: the same arithmetic, so the same bits. No fastmath: it would let LLVM fuse
    # multiply-adds and reorder. Unsigned indices: numba then skips its negative-index
    # wraparound, which otherwise keeps LLVM from vectorizing the loop.
    for i in range(np.uint64(lo), np.uint64(hi)):
        gi = g[i]
        mi = m[i] * b1 + gi * c1
        vi = v[i] * b2 + (gi * gi) * c2
        s = math.sqrt(vi) * inv_bc2 + eps
        m[i] = mi
        v[i] = vi
        p[i] = p[i] * decay + (mi / s) * neg_step


@njit(**PAR)
def _adamw_table(table, like, chunk, decay, b1, c1, b2, c2, inv_bc2, eps, neg_step):
    n = table.shape[0]
    first = np.zeros(n + 1, np.int64)  # first[j]: the first chunk of parameter j
    for j in range(n):
        first[j + 1] = first[j] + (table[j, 4] + chunk - 1) // chunk
    for c in prange(first[n]):
        j = np.searchsorted(first, c, side="right") - 1
        size = table[j, 4]
        lo = (c - first[j]) * chunk
        hi = min(lo + chunk, size)
        p = numba.carray(_pointer_to(table[j, 0], like), size)
        g = numba.carray(_pointer_to(table[j, 1], like), size)
        m = numba.carray(_pointer_to(table[j, 2], like), size)
        v = numba.carray(_pointer_to(table[j, 3], like), size)
        _adamw_span(p, g, m, v, lo, hi, decay, b1, c1, b2, c2, inv_bc2, eps, neg_step)


def _adamw_constants(dtype, lr, beta1, beta2, eps, weight_decay, step):
    """The reference's scalars, computed in Python floats exactly as it does, then rounded
    to the arrays' dtype as NumPy rounds a Python float meeting an array (NEP 50)."""
    step_size = lr / (1 - beta1**step)
    inv_bc2 = 1.0 / math.sqrt(1 - beta2**step)
    decay = 1 - lr * weight_decay
    c = dtype.type
    return (c(decay), c(beta1), c(1 - beta1), c(beta2), c(1 - beta2), c(inv_bc2), c(eps),
            c(-step_size))


def adamw_update_many(params, grads, exp_avgs, exp_avg_sqs, lr, beta1, beta2, eps,
                      weight_decay, step):
    """adamw_update on each (p, g, m, v) of the lists, all in one parallel pass.

    The arrays must be C-contiguous and of one float dtype (kernels/__init__.py sees to
    it), of one size per quadruple, and no written array (p, m, v) may overlap another
    operand: the chunks run at once."""
    if not params:
        return None
    dtype = params[0].dtype
    table = np.empty((len(params), 5), np.int64)
    for j, quad in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
        if not _adamw_row(table, j, *quad):
            return NotImplemented
    k = _adamw_constants(dtype, lr, beta1, beta2, eps, weight_decay, step)
    _adamw_table(table, np.empty(0, dtype), _ADAMW_CHUNK, *k)
    return None


def adamw_update(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step):
    """One AdamW step in place, one parallel pass (see reference.adamw_update)."""
    return adamw_update_many((p,), (g,), (m,), (v,), lr, beta1, beta2, eps, weight_decay,
                             step)
