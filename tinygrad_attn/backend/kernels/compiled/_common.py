"""What every compiled kernel module shares: numba's set-up (the threading layer, the pool's
thread count, loading from the cache without compiling), the jit option sets, and the
float32 math LLVM can vectorize (exp32)."""

from __future__ import annotations

import contextlib
import math
import os
import threading

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types  # noqa: F401 - prange: the kernels below
from numba.core import event
from numba.extending import intrinsic, overload

if not os.environ.get("NUMBA_THREADING_LAYER"):  # the user's choice, where made, wins
    numba.config.THREADING_LAYER = "workqueue"

JIT = {"cache": True}  # serial kernels
PAR = {"cache": True, "parallel": True}  # kernels spread over the threads

F32 = np.float32


def set_num_threads(n: int) -> int:
    """Use n threads (at most the pool's size, NUMBA_NUM_THREADS); returns the count set."""
    n = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(n)
    return n


class NotCached(Exception):
    """Raised under cache_only() where a kernel would have had to compile."""


_local = threading.local()


class _CompileGuard(event.Listener):
    # numba announces "numba:compile" only after it looked in its on-disk cache and missed
    def on_start(self, ev):
        if getattr(_local, "cache_only", False):
            raise NotCached(ev.data["dispatcher"].py_func.__name__)

    def on_end(self, ev):
        pass


event.register("numba:compile", _CompileGuard())


class CompileRefused(RuntimeError):
    """Raised, in a child forked while another thread was compiling, where numba would have
    to compile or load a kernel (see refuse_compiles)."""


_refused = {"why": None}


class _CompilerLockGuard(event.Listener):
    # numba announces "numba:compiler_lock" before it takes its compiler lock
    def on_start(self, ev):
        why = _refused["why"]
        if why is not None:
            raise CompileRefused(why)

    def on_end(self, ev):
        pass


event.register("numba:compiler_lock", _CompilerLockGuard())


def fork_locks() -> list:
    """(name, lock) for numba's locks that a forked child finds as they were at the fork:
    the compiler's (held while a kernel compiles or loads from the cache) and the threading
    layer's (held while its pool starts). A lock held then by another thread stays held in
    the child, where that thread does not exist: whoever takes it there waits forever."""
    from numba.core.compiler_lock import global_compiler_lock
    from numba.np.ufunc import parallel

    return [("compiler", getattr(global_compiler_lock, "_lock", None)),
            ("threading layer", getattr(parallel, "_backend_init_thread_lock", None))]


def refuse_compiles(why: str) -> None:
    """From now on, in this process, a kernel that would compile or load raises
    CompileRefused (before numba takes its compiler lock) instead; the kernels compiled
    already run as before. For a child forked while another thread held that lock."""
    _refused["why"] = why


@contextlib.contextmanager
def cache_only():
    """Inside, in this thread: a kernel not compiled in this process yet loads from numba's
    on-disk cache (milliseconds), or raises NotCached instead of compiling (seconds)."""
    _local.cache_only = True
    try:
        yield
    finally:
        _local.cache_only = False


# ----------------------------------------------------------------------------- math
@intrinsic
def _int32_bits_as_float32(typingctx, i):
    """The float32 whose bit pattern is the int32 i (a register move, no memory)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@njit(inline="always")
def exp32_clamped(xc):
    """exp of a float32 xc in [-87, 88], the core of exp32 below (no checks: a caller that
    knows its range, such as exp of a value <= 0, skips those it does not need)."""
    k = np.floor(xc * F32(1.4426950408889634) + F32(0.5))
    r = xc - k * F32(0.693359375) + k * F32(2.12194440e-4)
    p = F32(1.9875691500e-4)
    p = p * r + F32(1.3981999507e-3)
    p = p * r + F32(8.3334519073e-3)
    p = p * r + F32(4.1665795894e-2)
    p = p * r + F32(1.6666665459e-1)
    p = p * r + F32(5.0000001201e-1)
    p = p * r * r + r + F32(1.0)
    return p * _int32_bits_as_float32((np.int32(k) + np.int32(127)) << np.int32(23))


@njit(inline="always")
def exp32(x):
    """exp of a float32, to within 1 ulp or so of the C library's, in a form LLVM vectorizes.

    exp(x) = 2^k * exp(r) with k = round(x / ln 2), r = x - k ln 2 (ln 2 split in two so r is
    exact), exp(r) by Cephes' degree-6 polynomial on |r| <= ln 2 / 2, and 2^k built in the
    exponent bits. Below -87.3 the result is 0 (float32's denormals are not produced), above
    88.7 it is inf, and nan stays nan."""
    y = exp32_clamped(min(max(x, F32(-87.0)), F32(88.0)))
    if x < F32(-87.3):
        y = F32(0.0)
    if x > F32(88.7):
        y = F32(np.inf)
    if x != x:
        y = x
    return y


def vexp(x):
    """exp in the argument's precision: exp32 for float32, the C library's for float64."""
    raise NotImplementedError  # only called from compiled code, through the overload below


@overload(vexp, inline="always")
def _vexp(x):
    if x == types.float32:
        return lambda x: exp32(x)
    return lambda x: math.exp(x)


def in_dtype_of(a, v):
    """v in the float dtype of array a (compiled code only)."""
    raise NotImplementedError


@overload(in_dtype_of, inline="always")
def _in_dtype_of_ov(a, v):
    if a.dtype == types.float32:
        return lambda a, v: np.float32(v)
    return lambda a, v: np.float64(v)
