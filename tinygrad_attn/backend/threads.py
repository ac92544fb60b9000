"""One thread count for the engine: OpenBLAS's pool (the GEMMs) and numba's (the kernels).

The two pools take turns in a training step (a GEMM, then a kernel, then a GEMM), so they
are given the same count and never run at once; neither is sized to the machine twice over.
The count is, first found: `set_num_threads(n)`; the environment's TINYGRAD_ATTN_NUM_THREADS,
OMP_NUM_THREADS, OPENBLAS_NUM_THREADS or NUMBA_NUM_THREADS; the CPUs this process may use.
OpenBLAS is reached through its own C function (NumPy's wheels carry it under the symbol
prefix scipy_openblas); numba's pool is set when the compiled kernels load, and on each
later call. docs/kernels.md says what each setting does, and what was measured.
"""

from __future__ import annotations

import ctypes
import os

ENV_VARS = ("TINYGRAD_ATTN_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
            "NUMBA_NUM_THREADS")

_state = {"n": None, "compiled": None}


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _from_env() -> int | None:
    for name in ENV_VARS:
        value = os.environ.get(name, "").strip()
        if value:
            try:
                n = int(value.split(",")[0])
            except ValueError:
                continue
            if n >= 1:
                return n
    return None


def _openblas():
    """(get, set) of the loaded OpenBLAS's thread count, or None (another BLAS)."""
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({ln.split()[-1] for ln in f if "openblas" in ln.lower()})
    except OSError:
        return None
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
                return get, put
    return None


def get_num_threads() -> int:
    """The engine's thread count (see the module's docstring for where it comes from)."""
    if _state["n"] is None:
        return _from_env() or _cpus()
    return _state["n"]


def set_num_threads(n: int) -> None:
    """Run the GEMMs (OpenBLAS) and the compiled kernels (numba) on n threads each."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"set_num_threads: expected a positive int, got {n!r}")
    _state["n"] = n
    blas = _openblas()
    if blas is not None:
        blas[1](ctypes.c_int(n))
    if _state["compiled"] is not None:
        _state["compiled"].set_num_threads(n)


def openblas_num_threads() -> int | None:
    """OpenBLAS's own thread count now (None where NumPy uses another BLAS)."""
    blas = _openblas()
    return None if blas is None else int(blas[0]())


def apply_to_compiled(module) -> None:
    """Called once when the compiled kernels load: their pool gets the engine's count."""
    _state["compiled"] = module
    module.set_num_threads(get_num_threads())
