"""Work over a batch, split across the engine's threads: batched GEMMs and blocked attention.

A stack of small matrix products, (B, heads, T, D) @ (B, heads, D, T), is where OpenBLAS's
own threads do worst: NumPy calls one GEMM per matrix, each too small to share well between
threads, and each call wakes OpenBLAS's sleeping threads again (the engine lets them sleep
at once after a GEMM, see threads.py, so they do not steal the cores from the compiled
kernels that run next). Splitting the batch instead, one contiguous part per thread, each
part's GEMMs run whole on one thread, with OpenBLAS set to one thread meanwhile, measured
faster on every attention GEMM of the GPT (docs/kernels.md, "Batched GEMMs").

`split(n, work)` is the primitive: work(lo, hi) on [0, n) in one part per thread, the
calling thread taking the first. The blocked attention runs its whole loop this way (its
element-wise NumPy steps then run on every core too, not only its GEMMs); `matmul` runs
NumPy's matmul this way for stacks of matrices.

One split at a time: a split started while another runs (in another Python thread, or
inside a part of this one) runs its work on its own thread, unsplit. Only NumPy arrays are
split, and only when NumPy's BLAS is OpenBLAS (whose thread count the engine can set).
"""

from __future__ import annotations

import os
import threading

import numpy as np

from . import threads

MIN_MACS = 1 << 23  # multiply-adds below which a split is not worth starting threads
_state = {"lock": threading.Lock(), "blas": None}  # blas: OpenBLAS's count, while split


def _after_fork_in_child() -> None:
    """A child forked during a split: its lock would never be released (the threads that
    held it are not in the child), and OpenBLAS would stay on one thread."""
    if _state["blas"] is not None:
        threads.set_openblas_threads(_state["blas"])
    _state.update(lock=threading.Lock(), blas=None)


os.register_at_fork(after_in_child=_after_fork_in_child)


def parts(n: int) -> int:
    """How many parts split(n, ...) makes now: the engine's thread count, at most n."""
    return max(1, min(threads.get_num_threads(), n))


def worth(macs: int) -> bool:
    """Whether work of about `macs` multiply-adds is worth a split (a thread start costs
    tens of microseconds; MIN_MACS of GEMM take about 0.1 ms on one core)."""
    return macs >= MIN_MACS


def split(n: int, work, xp=np) -> None:
    """Call work(lo, hi) over [0, n) in parts(n) contiguous parts, one per thread.

    The calling thread runs the first part; OpenBLAS runs on one thread until every part
    is done. An exception in any part is raised here, after all parts have finished. Work
    on another array module than NumPy (xp: CuPy) runs whole, on the calling thread."""
    k = parts(n)
    blas = threads.openblas_num_threads() if xp is np else None
    if k < 2 or blas is None or not _state["lock"].acquire(blocking=False):
        work(0, n)
        return
    errors = []

    def run(lo, hi):
        try:
            work(lo, hi)
        except BaseException as e:  # noqa: BLE001 - raised again by the caller below
            errors.append(e)

    bounds = [(i * n // k, (i + 1) * n // k) for i in range(k)]
    try:
        _state["blas"] = blas
        threads.set_openblas_threads(1)
        helpers = [threading.Thread(target=run, args=b, daemon=True) for b in bounds[1:]]
        for t in helpers:
            t.start()
        run(*bounds[0])
        for t in helpers:
            t.join()
    finally:
        threads.set_openblas_threads(blas)
        _state["blas"] = None
        _state["lock"].release()
    if errors:
        raise errors[0]


def _splittable(a, b) -> bool:
    return (type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == b.dtype
            and a.dtype in (np.float32, np.float64) and max(a.ndim, b.ndim) >= 3)


def matmul(xp, a, b):
    """xp.matmul(a, b); for NumPy stacks of float matrices, the stack split over threads.

    The split is along the result's first batch dim; an operand broadcast along it (of
    fewer dims, or of size 1 there) goes whole to every part."""
    if xp is not np or not _splittable(a, b):
        return xp.matmul(a, b)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    shape = batch + (a.shape[-2], b.shape[-1])
    macs = int(np.prod(shape, dtype=np.int64)) * a.shape[-1]
    if not worth(macs) or parts(batch[0]) < 2:
        return np.matmul(a, b)
    out = np.empty(shape, dtype=a.dtype)

    def piece(x, lo, hi):
        return x[lo:hi] if x.ndim == len(shape) and x.shape[0] != 1 else x

    split(batch[0], lambda lo, hi: np.matmul(piece(a, lo, hi), piece(b, lo, hi),
                                             out=out[lo:hi]))
    return out
