"""One thread count for the engine: OpenBLAS's pool (the GEMMs) and numba's (the kernels).

The two pools take turns in a training step (a GEMM, then a kernel, then a GEMM), so they
are given the same count and never run at once; neither is sized to the machine twice over.
The count is, first found: `set_num_threads(n)`; the environment's TINYGRAD_ATTN_NUM_THREADS,
OMP_NUM_THREADS, OPENBLAS_NUM_THREADS or NUMBA_NUM_THREADS; the CPUs this process may use.

This module is imported before anything else in the project loads NumPy, because OpenBLAS
reads its environment once, when NumPy loads it. If NumPy is not loaded yet, it loads it
here with two variables set for that moment (and restored after; non-empty ones the user
set win):

    OPENBLAS_THREAD_TIMEOUT=4       OpenBLAS's workers go to sleep as soon as a GEMM ends,
                                    instead of spinning for about 0.1 s (2^28 cycles) on the
                                    cores the next compiled kernel wants.
    OPENBLAS_NUM_THREADS=n          from TINYGRAD_ATTN_NUM_THREADS, so the pool is made at n.

With NumPy loaded first, the timeout cannot be changed any more (OpenBLAS has no call for
it); the count still can: TINYGRAD_ATTN_NUM_THREADS is applied to the loaded OpenBLAS here,
through its own C function (NumPy's wheels carry it under the symbol prefix scipy_openblas).
numba's count is per Python thread: it is set when the compiled kernels load, by
`set_num_threads`, and, in any other thread, before that thread's first compiled kernel
(`sync_compiled`). docs/kernels.md says what each setting does, and what was measured.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import threading
import time

ENV = "TINYGRAD_ATTN_NUM_THREADS"
ENV_VARS = (ENV, "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")
OPENBLAS_THREAD_TIMEOUT = "4"  # the smallest OpenBLAS takes: 2^4 cycles of spinning

_state = {"n": None, "env": None, "compiled": None, "openblas": None, "forked_blas": False}
_local = threading.local()  # .n: the count numba was last given in this thread


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _own_env() -> int | None:
    """TINYGRAD_ATTN_NUM_THREADS, checked: the project's own variable must be valid."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"environment variable {ENV}: expected a positive int, got {value!r}")
    return n


def _from_env() -> int | None:
    n = _own_env()
    if n is not None:
        return n
    for name in ENV_VARS[1:]:  # other libraries' variables: used where they parse
        value = os.environ.get(name, "").strip()
        try:
            n = int(value.split(",")[0])
        except ValueError:
            continue
        if n >= 1:
            return n
    return None


def _load_numpy() -> None:
    """Import NumPy (and so OpenBLAS) with this module's variables set for the moment."""
    if "numpy" in sys.modules:
        return
    n = _own_env()
    wanted = {"OPENBLAS_THREAD_TIMEOUT": OPENBLAS_THREAD_TIMEOUT}
    if n is not None:
        wanted["OPENBLAS_NUM_THREADS"] = str(n)
    saved = {k: os.environ.get(k) for k in wanted}
    for k, value in wanted.items():
        if not (saved[k] or "").strip():  # unset or empty: OpenBLAS would use its default
            os.environ[k] = value
    try:
        import numpy  # noqa: F401 - the load OpenBLAS reads its environment at
    finally:
        for k, value in saved.items():
            if value is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = value


def _openblas():
    """(get, set) of the loaded OpenBLAS's thread count, or False (another BLAS)."""
    if _state["openblas"] is None:
        _state["openblas"] = _find_openblas()
    return _state["openblas"]


def _find_openblas():
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({ln.split()[-1] for ln in f if "openblas" in ln.lower()})
    except OSError:
        return False
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""),
                               ("openblas", ""), ("openblas", "64_")):
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                get.restype = ctypes.c_int
                return get, put
    return False


def get_num_threads() -> int:
    """The engine's thread count (see the module's docstring for where it comes from)."""
    return _state["n"] or _state["env"]


def set_num_threads(n: int) -> None:
    """Run the GEMMs (OpenBLAS) and the compiled kernels (numba) on n threads each."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"set_num_threads: expected a positive int, got {n!r}")
    _state["n"] = n
    blas = _openblas()
    if blas and not _state["forked_blas"]:
        blas[1](ctypes.c_int(n))
    if _state["compiled"] is not None:
        _state["compiled"].set_num_threads(n)
        _local.n = n


def openblas_num_threads() -> int | None:
    """OpenBLAS's own thread count now (None where NumPy uses another BLAS)."""
    blas = _openblas()
    return int(blas[0]()) if blas else None


def spare_one_cpu(spare: bool) -> None:
    """OpenBLAS on one thread fewer than the engine's count (spare=True), or on the count
    again. The background compiler (kernels/__init__.py) runs on a core of its own while it
    works; OpenBLAS's threads meeting at the end of every GEMM would otherwise wait on the
    one that shares that core."""
    blas = _openblas()
    if blas and not _state["forked_blas"]:
        n = get_num_threads()
        blas[1](ctypes.c_int(max(1, n - 1) if spare else n))


def apply_to_compiled(module) -> None:
    """Called once when the compiled kernels load: their pool gets the engine's count."""
    _state["compiled"] = module
    sync_compiled()


def sync_compiled() -> None:
    """Give numba the engine's count in this thread, if not given yet: numba keeps its count
    per Python thread, and a new thread starts at the whole pool whatever was set."""
    n = _state["n"] or _state["env"]
    if getattr(_local, "n", None) != n:
        _state["compiled"].set_num_threads(n)
        _local.n = n


# fork. OpenBLAS's threaded GEMM driver holds a lock of its own for the whole of a GEMM, and
# its at-fork handler, which stops its pool, leaves that lock as it was: a child forked
# while another thread was inside a GEMM (NumPy lets go of the GIL there) waits on it at its
# first threaded GEMM, forever. The one-thread driver never takes it, so a child forked while
# other threads ran keeps OpenBLAS on one thread (as a data-loading worker would anyway);
# the engine's count still drives numba's pool. A child of a single-threaded process is
# left alone: nothing can have held the lock.
#
# The parent has a race of its own: OpenBLAS's at-fork handler joins its pool's threads, and
# a GEMM that another thread starts at that moment hands one of them a job the join then
# waits on forever. So every GEMM of the engine goes through `matmul` below, a gate: GEMMs
# pass it freely side by side, and a fork closes it, waits for the GEMMs inside to finish
# (each does, in bounded time), forks, and opens it again. A GEMM that arrives meanwhile
# waits for the fork, which takes microseconds.
_fork = {"others": 0}
_gate_lock = threading.Lock()
_gate = {"lock": _gate_lock, "cond": threading.Condition(_gate_lock), "inside": 0,
         "forking": False}


def matmul(xp, a, b):
    """xp.matmul(a, b), through the fork gate when xp runs on OpenBLAS (NumPy)."""
    if xp is not _numpy_module():
        return xp.matmul(a, b)
    gate = _gate
    lock = gate["lock"]  # the condition's own lock: taken plainly, it costs less
    with lock:
        while gate["forking"]:
            gate["cond"].wait()
        gate["inside"] += 1
    try:
        plan = _stacked_plan(xp, a, b) if _stacked["on"] else None
        return xp.matmul(a, b) if plan is None else _stacked_matmul(xp, a, b, plan)
    finally:
        with lock:
            gate["inside"] -= 1
            if gate["forking"] and not gate["inside"]:
                gate["cond"].notify_all()


# Stacked small GEMMs. NumPy hands a stacked matmul, such as the attention's (B, nh, T, hs)
# @ (B, nh, hs, T), to BLAS one matrix at a time, and OpenBLAS runs a matrix that small on
# one thread: the other cores wait. So the batch is cut into chunks along its first axis
# that is not 1, and the engine's threads (a pool started at the first such GEMM) take
# chunks until none is left, each calling xp.matmul on its chunk into its part of the
# result: every matrix gets the BLAS call xp.matmul would make for it, bit for bit the same
# (tests/test_threads_matmul.py). The calling thread takes chunks too, so a worker the OS
# runs late finds the work done rather than being waited for. Only matrices OpenBLAS keeps
# on one thread (at most SPLIT_MAX_MNK multiply-adds) are split; bigger ones it threads.
# On a machine busier than its cores, splitting loses badly (3 to 6 times slower was seen):
# each thread, woken late by the OS, waits for the GIL the other just took back. So a split
# that took longer than WON_BELOW of its chunks' time run one after another (estimated from
# the fastest chunk) turns splitting off for the next calls (1, 2, 4, ... up to
# BACKOFF_MAX of them), and one that won turns it on again.
SPLIT_MAX_MNK = 1 << 18  # m * n * k of one matrix: about where OpenBLAS starts threading one
SPLIT_MIN_MNK = 1 << 20  # the whole product at least: below, the split's own Python (tens of
#                          microseconds) is a large part of the work
CHUNKS_PER_THREAD = 2
WON_BELOW = 0.75
BACKOFF_MAX = 256
_BLAS_TYPES = frozenset("fdFD")  # NumPy calls BLAS for these; its own loops for the rest
_stacked = {"on": True, "skip": 0, "backoff": 0, "splits": 0, "lost": 0}
_pool = {"lock": threading.Lock(), "workers": [], "job": None}


def _stacked_plan(xp, a, b):
    """(result shape, axis to split along) when a @ b is split over threads, else None."""
    if type(a) is not xp.ndarray or type(b) is not xp.ndarray:
        return None
    a_shape, b_shape = a.shape, b.shape
    if len(a_shape) < 2 or len(b_shape) < 2 or (len(a_shape) < 3 and len(b_shape) < 3):
        return None  # a vector, or a plain 2-D GEMM: xp.matmul as it is
    m, k = a_shape[-2:]
    n = b_shape[-1]
    mnk = m * n * k
    if b_shape[-2] != k or not 0 < mnk <= SPLIT_MAX_MNK:
        return None  # xp.matmul raises the error, threads the matrix, or has nothing to do
    dtype = a.dtype
    if dtype != b.dtype or dtype.char not in _BLAS_TYPES or get_num_threads() < 2:
        return None
    if _stacked["skip"]:
        _stacked["skip"] -= 1  # a recent split lost (see above)
        return None
    batch = a_shape[:-2]
    if batch != b_shape[:-2]:
        try:
            batch = xp.broadcast_shapes(batch, b_shape[:-2])
        except ValueError:
            return None
    if math.prod(batch) * mnk < SPLIT_MIN_MNK or max(batch) < 2:
        return None
    if not (_c_ordered(a, batch) and _c_ordered(b, batch)):
        return None  # xp.matmul lays such a result out after its operands: left to it
    return batch + (m, n), next(i for i, d in enumerate(batch) if d > 1)


def _c_ordered(x, batch):
    """Whether x's batch axes (those not 1 in the result) have non-increasing strides: then
    xp.matmul's result is row-major, as the stacked path's is."""
    last = None
    offset = len(batch) - (x.ndim - 2)
    for i, s in enumerate(x.strides[:-2]):
        if batch[i + offset] == 1 or x.shape[i] == 1:
            continue
        if s < 0 or (last is not None and s > last):
            return False
        if s:
            last = s
    return True


def _stacked_matmul(xp, a, b, plan):
    if not _pool["lock"].acquire(blocking=False):
        return xp.matmul(a, b)  # another thread's GEMM has the pool: this one runs alone
    try:
        return _split(xp, a, b, *plan)
    finally:
        _pool["lock"].release()


def _split(xp, a, b, out_shape, axis):
    out = xp.empty(out_shape, a.dtype)
    length = out_shape[axis]
    threads = get_num_threads()
    chunks = min(length, threads * CHUNKS_PER_THREAD)
    bounds = [length * i // chunks for i in range(chunks + 1)]
    parts = []
    for i0, i1 in zip(bounds[:-1], bounds[1:]):
        parts.append((_part(a, out_shape, axis, i0, i1), _part(b, out_shape, axis, i0, i1),
                      out[(slice(None),) * axis + (slice(i0, i1),)]))
    job = _Job(xp.matmul, parts[::-1])  # taken from the end: the first chunk first
    workers = _workers(min(threads - 1, chunks - 1))
    _pool["job"] = job
    start = time.perf_counter()
    for w in workers:
        if w.wake.locked():  # asleep, or about to be: wake it (only this thread releases)
            w.wake.release()
    try:
        job.run()
    finally:
        job.finish()
    _judge(time.perf_counter() - start, job.fastest * chunks)
    if job.error is not None:
        raise job.error
    return out


def _judge(elapsed, alone):
    """Back off from splitting after a split that did not pay (see above)."""
    _stacked["splits"] += 1
    if elapsed < WON_BELOW * alone:
        _stacked["backoff"] = 0
        return
    _stacked["lost"] += 1
    _stacked["backoff"] = min(BACKOFF_MAX, 2 * _stacked["backoff"] or 1)
    _stacked["skip"] = _stacked["backoff"]


def _part(x, out_shape, axis, i0, i1):
    """x's operand for the result's batch rows i0:i1 along axis (x whole where broadcast)."""
    ax = axis - (len(out_shape) - x.ndim)
    if ax < 0 or x.shape[ax] == 1:
        return x
    return x[(slice(None),) * ax + (slice(i0, i1),)]


class _Job:
    """One stacked GEMM's chunks; the calling thread and the workers take them in turn."""

    __slots__ = ("fn", "todo", "left", "lock", "done", "error", "fastest")

    def __init__(self, fn, todo):
        self.fn, self.todo, self.left = fn, todo, len(todo)
        self.lock, self.done, self.error = threading.Lock(), threading.Lock(), None
        self.fastest = float("inf")  # seconds: the quickest chunk's matmul
        self.done.acquire()  # released by the thread that ends the last chunk

    def run(self):
        """Take chunks until none is left."""
        todo, fn = self.todo, self.fn
        while True:
            try:
                a, b, out = todo.pop()  # one thread gets each chunk (list.pop is atomic)
            except IndexError:
                return
            try:
                start = time.perf_counter()
                fn(a, b, out=out)
                self.fastest = min(self.fastest, time.perf_counter() - start)
            except BaseException as e:  # noqa: BLE001 - raised again by the calling thread
                self.error = e
            self._ended(1)

    def _ended(self, n):
        with self.lock:
            self.left -= n
            if not self.left:
                self.done.release()

    def finish(self):
        """Called by the calling thread: drop the chunks nobody took (there are some only
        when run() was interrupted), then wait for those the workers are running."""
        dropped = 0
        while True:
            try:
                self.todo.pop()
            except IndexError:
                break
            dropped += 1
        if dropped:
            self._ended(dropped)
        self.done.acquire()


class _Worker:
    def __init__(self, index):
        self.wake = threading.Lock()
        self.wake.acquire()
        self.thread = threading.Thread(target=self._loop, name=f"tinygrad_attn-gemm-{index}",
                                       daemon=True)
        self.thread.start()

    def _loop(self):
        while True:
            self.wake.acquire()
            job = _pool["job"]
            if job is not None:
                job.run()


def _workers(n):
    workers = _pool["workers"]
    while len(workers) < n:
        workers.append(_Worker(len(workers)))
    return workers[:n]


def _numpy_module():
    return sys.modules["numpy"]


def _before_fork() -> None:
    # the GEMM pool's workers do not count: they are idle whenever the gate is closed
    _fork["others"] = threading.active_count() - 1 - len(_pool["workers"])
    gate = _gate
    with gate["cond"]:
        gate["forking"] = True
        while gate["inside"]:
            gate["cond"].wait()


def _after_fork_in_parent() -> None:
    gate = _gate
    with gate["cond"]:
        gate["forking"] = False
        gate["cond"].notify_all()


def _after_fork_in_child() -> None:
    # the other threads are gone, and with them any GEMM inside or waiting at the gate
    lock = threading.Lock()
    _gate.update(lock=lock, cond=threading.Condition(lock), inside=0, forking=False)
    _pool.update(lock=threading.Lock(), workers=[], job=None)  # its threads stayed behind
    if _fork["others"] and _openblas():
        _state["forked_blas"] = True
        _openblas()[1](ctypes.c_int(1))


def forked_blas() -> bool:
    """Whether OpenBLAS is held at one thread in this process (a child forked while other
    threads ran: see the note above _before_fork)."""
    return _state["forked_blas"]


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
_state["env"] = _from_env() or _cpus()  # read once, at import, as the other libraries do
_load_numpy()
if _own_env() is not None and _openblas():  # NumPy was loaded before the project
    _openblas()[1](ctypes.c_int(_own_env()))
