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
import os
import sys
import threading

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
_gate = {"cond": threading.Condition(threading.Lock()), "inside": 0, "forking": False}


def matmul(xp, a, b):
    """xp.matmul(a, b), through the fork gate when xp runs on OpenBLAS (NumPy)."""
    if xp is not _numpy_module():
        return xp.matmul(a, b)
    gate = _gate
    cond = gate["cond"]
    with cond:
        while gate["forking"]:
            cond.wait()
        gate["inside"] += 1
    try:
        return xp.matmul(a, b)
    finally:
        with cond:
            gate["inside"] -= 1
            if gate["forking"] and not gate["inside"]:
                cond.notify_all()


def _numpy_module():
    return sys.modules["numpy"]


def _before_fork() -> None:
    _fork["others"] = threading.active_count() - 1
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
    _gate.update(cond=threading.Condition(threading.Lock()), inside=0, forking=False)
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
