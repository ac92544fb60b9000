"""Threads and processes around the compiled kernels: two Python threads at once, fork (bare
and through multiprocessing), and one thread count for OpenBLAS and numba (set_num_threads,
TINYGRAD_ATTN_NUM_THREADS, OpenBLAS's variables set while the backend loads NumPy).

Kernels the compiled module does not have yet get a parallel numba stand-in here, so the
kernel layer's own code (the lock, the per-thread count) is what these tests exercise.
"""

import math
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.backend import kernels, threads

ROOT = pathlib.Path(__file__).resolve().parents[1]
N = 1 << 21  # elements: big enough that the kernels' parallel loops take real time
posix = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

_STAND_INS = {}


def _stand_ins():
    """Parallel numba twins (gelu_forward, adamw_update) for a compiled module without them."""
    if _STAND_INS:
        return _STAND_INS
    numba = pytest.importorskip("numba")

    @numba.njit(parallel=True)
    def gelu_inner(x, out):
        for i in numba.prange(x.size):
            out[i] = 0.5 * x[i] * (1.0 + math.erf(x[i] / math.sqrt(2.0)))

    @numba.njit(parallel=True)
    def adamw_inner(p, g, m, v, lr, b1, b2, eps, wd, step):
        c1, c2 = 1.0 - b1**step, math.sqrt(1.0 - b2**step)
        for i in numba.prange(p.size):
            m[i] = b1 * m[i] + (1.0 - b1) * g[i]
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i]
            p[i] = p[i] * (1.0 - lr * wd) - lr / c1 * m[i] / (math.sqrt(v[i]) / c2 + eps)

    def gelu_forward(x):
        out = np.empty_like(x)
        gelu_inner(x.reshape(-1), out.reshape(-1))
        return out

    def adamw_update(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step):
        flat = (a.reshape(-1) for a in (p, g, m, v))
        adamw_inner(*flat, lr, beta1, beta2, eps, weight_decay, step)

    _STAND_INS.update(gelu_forward=gelu_forward, adamw_update=adamw_update)
    return _STAND_INS


@pytest.fixture
def engine_threads():
    """Restore the engine's thread count (and whether it was set) after the test."""
    saved = dict(threads._state)
    count = ta.get_num_threads()
    yield
    ta.set_num_threads(count)
    threads._state["n"] = saved["n"]


@pytest.fixture
def numba_kernels(monkeypatch, engine_threads):
    """Mode "numba", with a compiled twin for gelu_forward and adamw_update."""
    pytest.importorskip("numba")
    compiled = kernels._load_compiled()
    for name, fn in _stand_ins().items():
        if getattr(compiled, name, None) is None:
            monkeypatch.setattr(compiled, name, fn, raising=False)
    before = kernels.get_kernels()
    kernels.set_kernels("numba")
    yield compiled
    kernels.set_kernels(before)


def _x(seed=0):
    return np.random.default_rng(seed).standard_normal(N, dtype=np.float32)


def _adamw_steps(arrays, steps):
    p, g, m, v = arrays
    for t in range(1, steps + 1):
        kernels.adamw_update(p, g, m, v, 1e-3, 0.9, 0.95, 1e-8, 0.1, t)


def _adamw_arrays(seed):
    rng = np.random.default_rng(seed)
    p, g = (rng.standard_normal(N, dtype=np.float32) for _ in range(2))
    return [p, g, np.zeros_like(p), np.zeros_like(p)]


def _in_threads(*targets):
    errors = []

    def guarded(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported in the main thread
            errors.append(e)

    ts = [threading.Thread(target=guarded, args=(fn,)) for fn in targets]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts), "a kernel thread hung"
    assert errors == []


def test_two_threads_calling_compiled_kernels_agree_with_one(numba_kernels):
    x = _x()
    one = kernels.gelu_forward(x)
    single = _adamw_arrays(1)
    _adamw_steps(single, 5)
    before = kernels.calls["gelu_forward", "numba"], kernels.calls["adamw_update", "numba"]
    gelus = []
    pair = [_adamw_arrays(1), _adamw_arrays(1)]

    def gelu_loop():
        gelus.extend(kernels.gelu_forward(x) for _ in range(20))

    _in_threads(gelu_loop, gelu_loop, lambda: _adamw_steps(pair[0], 5),
                lambda: _adamw_steps(pair[1], 5))
    assert len(gelus) == 40
    for out in gelus:
        np.testing.assert_array_equal(out, one)
    for arrays in pair:
        for got, want in zip(arrays, single):
            np.testing.assert_array_equal(got, want)
    after = kernels.calls["gelu_forward", "numba"], kernels.calls["adamw_update", "numba"]
    assert (after[0] - before[0], after[1] - before[1]) == (40, 10)


def test_a_new_thread_runs_kernels_at_the_engine_count(numba_kernels):
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba's pool has one thread")
    ta.set_num_threads(1)
    assert numba.get_num_threads() == 1
    seen = []

    def run():
        seen.append(numba.get_num_threads())  # numba's default in a new thread: the pool
        kernels.gelu_forward(_x())
        seen.append(numba.get_num_threads())

    _in_threads(run)
    assert seen == [numba.config.NUMBA_NUM_THREADS, 1]


def _wait(pid: int, timeout: float = 120.0) -> int:
    """The exit code of child `pid`; a child still running after `timeout` is killed and
    the test fails (a hang must not block the suite)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child hung for {timeout} s")


def _child_checks(x, want) -> int:
    try:
        got = kernels.gelu_forward(x)
        return 0 if np.array_equal(got, want) else 3
    except BaseException:  # noqa: BLE001 - a child reports through its exit code
        return 4


@posix
def test_fork_after_a_compiled_kernel(numba_kernels):
    x = _x()
    want = kernels.gelu_forward(x)  # the parent's pool is running when it forks
    pid = os.fork()
    if pid == 0:
        os._exit(_child_checks(x, want))
    assert _wait(pid) == 0


@posix
def test_fork_while_another_thread_holds_the_kernel_lock(numba_kernels):
    x = _x()
    want = kernels.gelu_forward(x)
    held, release = threading.Event(), threading.Event()

    def hold():
        with kernels._state["launch"]:
            held.set()
            release.wait(60)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(60)
        pid = os.fork()
        if pid == 0:
            os._exit(_child_checks(x, want))
    finally:
        release.set()
        t.join(60)
    assert _wait(pid) == 0


def _mp_child(x, want):
    sys.exit(_child_checks(x, want))


@posix
def test_multiprocessing_fork_context(numba_kernels):
    import multiprocessing

    x = _x()[:65536]
    want = kernels.gelu_forward(x)
    proc = multiprocessing.get_context("fork").Process(target=_mp_child, args=(x, want))
    proc.start()
    proc.join(120)
    if proc.is_alive():
        proc.kill()
        pytest.fail("the multiprocessing child hung")
    assert proc.exitcode == 0


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "2", None])
def test_set_num_threads_rejects(n, engine_threads):
    before = ta.get_num_threads()
    with pytest.raises(ValueError, match="set_num_threads"):
        ta.set_num_threads(n)
    assert ta.get_num_threads() == before


def test_set_num_threads_sets_openblas(engine_threads):
    if threads.openblas_num_threads() is None:
        pytest.skip("NumPy is not linked to OpenBLAS")
    for n in (1, 2):
        ta.set_num_threads(n)
        assert ta.get_num_threads() == n
        assert threads.openblas_num_threads() == n


def test_set_num_threads_sets_numba(numba_kernels):
    import numba

    for n in (1, numba.config.NUMBA_NUM_THREADS):
        ta.set_num_threads(n)
        assert numba.get_num_threads() == n
    ta.set_num_threads(numba.config.NUMBA_NUM_THREADS + 1)  # more than the pool: the pool
    assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS
    assert ta.get_num_threads() == numba.config.NUMBA_NUM_THREADS + 1


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items()
            if k not in ("OPENBLAS_THREAD_TIMEOUT", threads.ENV, *threads.ENV_VARS)}
    full.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=full, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("numpy_first", [False, True])
def test_env_count_reaches_openblas_at_import(numpy_first):
    out = _run(f"""
        {"import numpy" if numpy_first else ""}
        import tinygrad_attn as ta
        from tinygrad_attn.backend import threads
        print(ta.get_num_threads(), threads.openblas_num_threads())
        """, TINYGRAD_ATTN_NUM_THREADS="1")
    assert out.returncode == 0, out.stderr
    count, blas = out.stdout.split()
    assert count == "1"
    assert blas in ("1", "None")


def test_env_count_invalid_fails_at_import():
    out = _run("import tinygrad_attn", TINYGRAD_ATTN_NUM_THREADS="lots")
    assert out.returncode != 0
    assert "ValueError" in out.stderr and "TINYGRAD_ATTN_NUM_THREADS" in out.stderr


def test_other_libraries_variables_give_the_count():
    out = _run("import tinygrad_attn as ta; print(ta.get_num_threads())",
               OMP_NUM_THREADS="1,1")
    assert out.stdout.split() == ["1"], out.stderr


@pytest.mark.parametrize("user_value", [None, "", "20"])
def test_openblas_thread_timeout_set_only_while_numpy_loads(user_value):
    env = {} if user_value is None else {"OPENBLAS_THREAD_TIMEOUT": user_value}
    out = _run("""
        import os, tinygrad_attn
        print(repr(os.environ.get("OPENBLAS_THREAD_TIMEOUT")))
        """, **env)
    assert out.stdout.split() == [repr(user_value)], out.stderr


@pytest.mark.parametrize("env", [{}, {"OPENBLAS_THREAD_TIMEOUT": ""}])
def test_openblas_workers_sleep_after_a_gemm(env):
    """OpenBLAS's workers spin for about 0.1 s after a GEMM unless OPENBLAS_THREAD_TIMEOUT is
    small: the CPU time the process uses while its main thread sleeps shows which."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: OpenBLAS runs no workers")
    out = _run("""
        import resource, time
        import tinygrad_attn
        import numpy as np
        from tinygrad_attn.backend import threads

        def cpu():
            r = resource.getrusage(resource.RUSAGE_SELF)
            return r.ru_utime + r.ru_stime

        a = np.ones((1024, 1024), np.float32)
        used = []
        for _ in range(3):
            a @ a
            start = cpu()
            time.sleep(0.2)
            used.append(cpu() - start)
        print(threads.openblas_num_threads(), max(used))
        """, **env)
    assert out.returncode == 0, out.stderr
    blas, used = out.stdout.split()
    if blas in ("None", "1"):
        pytest.skip("no OpenBLAS worker threads")
    assert float(used) < 0.02  # seconds of CPU over 0.2 s asleep; spinning workers use ~0.1
