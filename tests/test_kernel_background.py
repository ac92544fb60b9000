"""Compiling in the background (backend/kernels/background.py, docs/kernels.md): in "auto"
mode a kernel runs compiled only once the background compiler has made it ready for the
call's argument types (compiled in the worker process, loaded here), and the reference runs
until then; "numba" mode still compiles in the caller's thread. The stand-ins, their JSON
form, the ready keys, the lock the compiler holds, the pause a raw profile takes, a worker
that is missing or dies, wait_compiled, a forked child, and what must not move (RNG,
ledger)."""

import contextlib
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import tracemalloc
import warnings

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.backend import kernels
from tinygrad_attn.backend.kernels import background

ROOT = pathlib.Path(__file__).resolve().parents[1]
posix = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _x(dtype=np.float32, rows=64):
    """Rows of logits, above AUTO_MIN_SIZE."""
    n = -(-kernels.AUTO_MIN_SIZE // rows)
    return np.random.default_rng(0).standard_normal((rows, n)).astype(dtype)


@contextlib.contextmanager
def _cache_always_misses():
    raise kernels._load_compiled().NotCached("this test's cold cache")
    yield


@pytest.fixture
def auto_warm(monkeypatch):
    """"auto" mode with no kernel ready yet, numba's cache as it is (warm: the suite's
    kernels are compiled and cached by now)."""
    pytest.importorskip("numba")
    kernels.wait_compiled(300)
    before = kernels.get_kernels()
    kernels.set_kernels("auto")
    monkeypatch.setitem(background._bg, "ready", set())
    monkeypatch.setitem(background._bg, "missed", set())
    monkeypatch.setitem(background._bg, "failed", {})
    yield
    assert kernels.wait_compiled(300)
    kernels.set_kernels(before)


@pytest.fixture
def auto(auto_warm, monkeypatch):
    """auto_warm with numba's cache taken as cold: each key's first call runs the reference
    and queues it, and the background compiler compiles it in the worker (the kernels numba
    already compiled in this process become ready again at once when the stand-in call is
    made here)."""
    monkeypatch.setattr(kernels._load_compiled(), "cache_only", _cache_always_misses)


def _counts(name):
    return kernels.calls[name, "numpy"], kernels.calls[name, "numba"]


# ----------------------------------------------------------------------------- signatures
def test_signature_tells_apart_what_numba_types_apart():
    sig = background._signature
    a = np.zeros((4, 6), np.float32)
    ro = a.copy()
    ro.setflags(write=False)
    distinct = [a, a.astype(np.float64), a[None], a.T, a[:, ::2], ro, True, False, None, 1,
                1.0, "none", (a,), [a], (a, a)]
    assert len({sig(v) for v in distinct}) == len(distinct)
    assert sig(np.ones((9, 3), np.float32)) == sig(a)  # the shape is not part of it
    assert sig((True, False)) != sig((True, True))  # bools are values (a wrapper branches)


@pytest.mark.parametrize("make", [
    lambda: np.zeros((4, 6), np.float32), lambda: np.zeros((4, 6), np.float32).T,
    lambda: np.zeros((4, 6))[:, ::2], lambda: np.zeros(5, np.int64)[::2],
    lambda: np.broadcast_to(np.zeros((1, 6), bool), (3, 4, 6)),
    lambda: np.zeros((), np.float64), lambda: np.zeros((1, 5)),
    lambda: np.zeros((3, 4), np.float32)[None].copy(order="F")])
def test_stand_in_has_the_signature_and_is_tiny(make):
    real = make()
    for writeable in (True, False):
        if not writeable:
            real = real.view()
            real.setflags(write=False)
        stand = background._stand_in(background._spec(real))
        # same numba type: dtype, ndim, layout C / F / A, read-only; C and F both mean C
        flags = (real.dtype, real.ndim, real.flags.c_contiguous,
                 real.flags.f_contiguous and not real.flags.c_contiguous, real.flags.writeable)
        assert (stand.dtype, stand.ndim, stand.flags.c_contiguous,
                stand.flags.f_contiguous and not stand.flags.c_contiguous,
                stand.flags.writeable) == flags
        assert stand.size <= 2 ** real.ndim and not np.shares_memory(stand, real)
        if real.dtype.kind in "biu":
            assert not stand.any()  # index 0: in range whatever the shapes


def test_spec_keeps_no_array_and_maps_lists():
    a = np.zeros(3)
    spec = background._spec(([a, a], (a, 0.5), None, "none"))
    flat = [spec[0][0], spec[0][1], spec[1][0]]
    assert all(isinstance(s, background._ArraySpec) for s in flat)
    assert spec[1][1] == 0.5 and spec[2] is None and spec[3] == "none"
    assert isinstance(spec[0], list) and isinstance(spec[1], tuple)


# ----------------------------------------------------------------------------- auto mode
def test_first_call_runs_the_reference_then_the_compiled_kernel(auto):
    x = _x()
    before = _counts("softmax_forward")
    y = kernels.softmax_forward(x)
    np.testing.assert_array_equal(y, kernels.reference.softmax_forward(x))
    assert _counts("softmax_forward") == (before[0] + 1, before[1])
    assert kernels.wait_compiled(300)
    np.testing.assert_allclose(kernels.softmax_forward(x), y, rtol=1e-6, atol=1e-9)
    assert _counts("softmax_forward") == (before[0] + 1, before[1] + 1)
    assert background._bg["failed"] == {}


def test_the_ready_key_tells_dtypes_apart(auto):
    kernels.softmax_forward(_x())
    assert kernels.wait_compiled(300)
    before = _counts("softmax_forward")
    kernels.softmax_forward(_x())
    kernels.softmax_forward(_x(np.float64))  # float32 is ready, float64 is not
    assert _counts("softmax_forward") == (before[0] + 1, before[1] + 1)
    assert kernels.wait_compiled(300)
    kernels.softmax_forward(_x(np.float64))
    assert _counts("softmax_forward") == (before[0] + 1, before[1] + 2)


def test_adamw_update_many_compiles_in_the_background(auto):
    rng = np.random.default_rng(1)
    shapes = [(kernels.AUTO_MIN_SIZE,), (7, 3)]
    quads = [[rng.standard_normal(s).astype(np.float32) for _ in range(4)] for s in shapes]
    for q in quads:
        q[3] = np.abs(q[3])
    want = [[a.copy() for a in q] for q in quads]
    hyper = (1e-3, 0.9, 0.95, 1e-8, 0.1, 3)
    kernels.reference.adamw_update_many(*zip(*want), *hyper)
    before = _counts("adamw_update_many")
    kernels.adamw_update_many(*zip(*quads), *hyper)  # not ready: the reference, queued
    assert _counts("adamw_update_many") == (before[0] + 1, before[1])
    for got, ref in zip(quads, want):
        for g, r in zip(got, ref):
            np.testing.assert_array_equal(g, r)
    assert kernels.wait_compiled(300)
    kernels.adamw_update_many(*zip(*quads), *hyper)
    assert _counts("adamw_update_many") == (before[0] + 1, before[1] + 1)
    assert background._bg["failed"] == {}


def test_auto_runs_the_reference_while_the_compiler_compiles_here(auto, monkeypatch):
    x = _x()
    kernels.softmax_forward(x)
    assert kernels.wait_compiled(300)  # softmax float32 is ready
    _stop_the_worker()
    monkeypatch.setitem(background._bg, "no_worker", "none: the compiler compiles here")
    entered, release = threading.Event(), threading.Event()
    stand_in = background._stand_in

    def slow_stand_in(spec):  # in the compiler thread, under the launch lock
        if background._bg["compiling_here"]:
            entered.set()
            release.wait(60)
        return stand_in(spec)

    monkeypatch.setattr(background, "_stand_in", slow_stand_in)
    kernels.gelu_forward(x)  # queues gelu: the compiler takes the lock and waits
    try:
        assert entered.wait(60)
        assert not kernels.wait_compiled(0.05)
        before = _counts("softmax_forward")
        np.testing.assert_array_equal(kernels.softmax_forward(x),
                                      kernels.reference.softmax_forward(x))
        assert _counts("softmax_forward") == (before[0] + 1, before[1])
    finally:
        release.set()
    assert kernels.wait_compiled(300)
    kernels.softmax_forward(x)
    assert _counts("softmax_forward")[1] == before[1] + 1


def test_a_call_waits_for_the_compilers_load_from_the_cache(auto_warm, monkeypatch):
    """Loading is short, and which path a call takes must not depend on its timing."""
    x = _x()
    kernels.softmax_forward(x)  # ready (loaded or compiled) in this process
    entered, release = threading.Event(), threading.Event()
    stand_in = background._stand_in

    def slow_stand_in(spec):  # the compiler's load, under the launch lock
        entered.set()
        release.wait(60)
        return stand_in(spec)

    monkeypatch.setattr(background, "_stand_in", slow_stand_in)
    with kernels.compiler_paused():
        kernels.gelu_forward(x)  # queued; the compiler loads it once the pause ends
    try:
        assert entered.wait(60)
        threading.Timer(0.3, release.set).start()
        before = _counts("softmax_forward")
        kernels.softmax_forward(x)  # waits for the load instead of running the reference
        assert release.is_set()
        assert _counts("softmax_forward") == (before[0], before[1] + 1)
    finally:
        release.set()
    assert kernels.wait_compiled(300)


def test_a_stand_in_that_fails_leaves_the_call_to_its_thread(auto, monkeypatch):
    compiled = kernels._load_compiled()
    real = compiled.softmax_forward

    def picky(x):  # declines the stand-in's shape; a real softmax on the real one
        return NotImplemented if x.shape[0] == 2 else real(x) + 1

    picky.__module__ = compiled.__name__  # counts as the package's: compiled in background
    monkeypatch.setattr(compiled, "softmax_forward", picky)
    x = _x()
    kernels.softmax_forward(x)
    assert kernels.wait_compiled(300)
    assert list(background._bg["failed"].values()) == ["declined"]
    np.testing.assert_allclose(kernels.softmax_forward(x),
                               kernels.reference.softmax_forward(x) + 1, rtol=1e-6)


def test_stand_ins_move_neither_the_rng_nor_the_ledger(auto):
    x, u = _x(), np.full(_x().shape, 0.5, np.float32)
    ta.manual_seed(3)
    state = ta.get_rng_state()
    live, peak = ta.memory.live_bytes(), ta.memory.max_live_bytes()
    kernels.dropout_forward(x, u, 0.1)
    kernels.layer_norm_forward(x, None, None, 1e-5)
    assert kernels.wait_compiled(300)
    assert background._bg["failed"] == {}
    assert ta.get_rng_state() == state
    assert (ta.memory.live_bytes(), ta.memory.max_live_bytes()) == (live, peak)


def test_compiler_paused_holds_the_loading_back(auto):
    x = _x()
    before = _counts("softmax_forward")
    with kernels.compiler_paused():
        kernels.softmax_forward(x)  # queued; the worker may compile, nothing loads here
        assert not kernels.wait_compiled(1.0)
        kernels.softmax_forward(x)
        assert _counts("softmax_forward") == (before[0] + 2, before[1])
    assert kernels.wait_compiled(300)
    kernels.softmax_forward(x)
    assert _counts("softmax_forward") == (before[0] + 2, before[1] + 1)


def test_a_raw_memory_profile_pauses_the_compiler(auto):
    assert background._bg["paused"] == 0
    with ta.memory.profile(raw=True):
        assert background._bg["paused"] == 1 and tracemalloc.is_tracing()
        kernels.softmax_forward(_x())  # the reference, queued
        assert not kernels.wait_compiled(0.5)
    assert background._bg["paused"] == 0
    with ta.memory.profile():  # not raw: nothing traced, nothing paused
        assert background._bg["paused"] == 0
    assert kernels.wait_compiled(300)


def test_a_cached_kernel_runs_compiled_from_its_first_call(auto_warm):
    x = _x()
    kernels.softmax_forward(x)  # whatever an earlier test left: compiled and cached now
    assert kernels.wait_compiled(300)
    background._bg["ready"].clear()
    before = _counts("softmax_forward")
    got = kernels.softmax_forward(x)
    assert _counts("softmax_forward") == (before[0], before[1] + 1)
    assert not background._bg["queue"] and not background._bg["missed"]
    np.testing.assert_allclose(got, kernels.reference.softmax_forward(x), rtol=1e-6,
                               atol=1e-9)


def test_under_a_pause_a_cached_kernel_waits_then_runs_compiled(auto_warm):
    x = _x()
    kernels.softmax_forward(x)
    assert kernels.wait_compiled(300)
    background._bg["ready"].clear()
    before = _counts("softmax_forward")
    with kernels.compiler_paused():  # a raw profile: nothing loads, the reference runs
        kernels.softmax_forward(x)
        assert _counts("softmax_forward") == (before[0] + 1, before[1])
    kernels.softmax_forward(x)  # the first call after it: loaded here, whatever the
    assert _counts("softmax_forward") == (before[0] + 1, before[1] + 1)  # thread has done


def test_a_cache_miss_is_looked_for_once_per_key(auto_warm, monkeypatch):
    compiled = kernels._load_compiled()
    looked = []

    @contextlib.contextmanager
    def counting_miss():
        looked.append(threading.current_thread().name)
        raise compiled.NotCached("cold")
        yield

    monkeypatch.setattr(compiled, "cache_only", counting_miss)
    x = _x()
    before = _counts("softmax_forward")
    for _ in range(3):  # the first looks, misses and queues; the others only run the
        kernels.softmax_forward(x)  # reference (unless the compiler is done already)
    assert kernels.wait_compiled(300)
    kernels.softmax_forward(x)
    assert sorted(looked) == sorted([threading.current_thread().name,
                                     "tinygrad_attn kernel compiler"])
    assert _counts("softmax_forward")[1] > before[1]


def test_a_worker_that_hangs_is_killed_and_the_thread_compiles(auto, monkeypatch):
    _stop_the_worker()
    monkeypatch.setitem(background._bg, "no_worker", None)
    monkeypatch.setattr(background, "_WORKER", "import time; time.sleep(120)")
    monkeypatch.setattr(background, "WORKER_TIMEOUT_S", 0.5)
    x = _x()
    kernels.softmax_forward(x)
    assert kernels.wait_compiled(300)
    assert background._bg["no_worker"] == "the worker process did not answer in 0.5 s"
    assert background._bg["worker"] is None
    before = _counts("softmax_forward")
    kernels.softmax_forward(x)
    assert _counts("softmax_forward") == (before[0], before[1] + 1)


def test_a_numba_that_does_not_import_leaves_auto_on_the_reference(auto_warm, monkeypatch):
    """numba installed but broken (say it does not support this NumPy): "auto" warns once
    and runs the reference from then on; "numba" mode raises the error."""
    def broken():
        raise ImportError("numba needs an older NumPy")

    monkeypatch.setattr(kernels, "_load_compiled", broken)
    monkeypatch.setitem(kernels._state, "auto_off", None)
    x = _x()
    before = _counts("softmax_forward")
    with pytest.warns(RuntimeWarning, match="could not load .*older NumPy"):
        got = kernels.softmax_forward(x)
    np.testing.assert_array_equal(got, kernels.reference.softmax_forward(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernels.softmax_forward(x)
        kernels.gelu_forward(x)
    assert _counts("softmax_forward") == (before[0] + 2, before[1])
    assert not background._bg["queue"]
    kernels.set_kernels("numba")
    with pytest.raises(ImportError, match="older NumPy"):
        kernels.softmax_forward(x)


def test_encode_round_trips_a_queued_call():
    ro = np.ones((3, 4), np.float32)
    ro.setflags(write=False)
    call = ((ro, np.ones(5, np.int64).T, (np.zeros((2, 3), bool).T, [1.5, None]), True, 3,
             "tanh", np.float32(0.5)), {"eps": 1e-5})
    spec = background._spec(call)
    wire = background._encode(spec)
    import json

    back = background._decode(json.loads(json.dumps(wire)))
    assert back == spec
    assert type(back[0][6]) is np.float32 and type(back[0][2]) is tuple
    assert isinstance(back[0][0], background._ArraySpec)
    with pytest.raises(TypeError, match="kernel compiler"):
        background._encode(object())


def _stop_the_worker():
    with background._bg["cond"]:
        background._stop_worker()


def test_without_a_worker_the_thread_compiles(auto, monkeypatch):
    _stop_the_worker()
    monkeypatch.setitem(background._bg, "no_worker", "none, for this test")
    x = _x()
    before = _counts("softmax_forward")
    kernels.softmax_forward(x)
    assert kernels.wait_compiled(300) and background._bg["worker"] is None
    kernels.softmax_forward(x)
    assert _counts("softmax_forward") == (before[0] + 1, before[1] + 1)
    assert background._bg["failed"] == {}


def test_a_worker_that_dies_leaves_the_compiling_to_the_thread(auto, monkeypatch):
    _stop_the_worker()
    monkeypatch.setitem(background._bg, "no_worker", None)
    monkeypatch.setattr(background, "_WORKER", "import sys; sys.exit(3)")
    x = _x()
    kernels.softmax_forward(x)
    assert kernels.wait_compiled(300)
    assert background._bg["no_worker"] == "the worker process ended (exit code 3)"
    before = _counts("softmax_forward")
    kernels.softmax_forward(x)
    assert _counts("softmax_forward") == (before[0], before[1] + 1)
    assert background._bg["failed"] == {}


def test_numba_mode_stays_synchronous(numba_mode, monkeypatch):
    monkeypatch.setitem(background._bg, "ready", set())
    x = _x()
    x.setflags(write=False)  # a read-only float32: a type of its own for numba
    before = _counts("softmax_forward")
    kernels.softmax_forward(x)
    assert _counts("softmax_forward") == (before[0], before[1] + 1)
    assert not background._bg["queue"]


def test_threads_calling_kernels_while_the_compiler_runs(auto):
    xs = {np.float32: _x(), np.float64: _x(np.float64)}
    errors = []

    def hammer(dtype):
        try:
            for _ in range(40):
                got = kernels.gelu_forward(xs[dtype])
                np.testing.assert_allclose(got, kernels.reference.gelu_forward(xs[dtype]),
                                           rtol=1e-5, atol=1e-7)
                kernels.softmax_forward(xs[dtype])
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread
            errors.append(e)

    workers = [threading.Thread(target=hammer, args=(d,)) for d in (np.float32, np.float64)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(300)
    assert errors == [] and not any(t.is_alive() for t in workers)
    assert kernels.wait_compiled(300)
    before = _counts("gelu_forward")
    kernels.gelu_forward(xs[np.float64])
    assert _counts("gelu_forward") == (before[0], before[1] + 1)


def test_wait_compiled_with_nothing_queued(auto):
    assert kernels.wait_compiled(0)
    assert kernels.wait_compiled()


# ----------------------------------------------------------------------------- fork
def _child_runs_kernels(x) -> int:
    try:
        before = _counts("softmax_forward")
        kernels.softmax_forward(x)
        if not kernels.wait_compiled(120):
            return 2
        kernels.softmax_forward(x)
        after = _counts("softmax_forward")
        return 0 if after[1] > before[1] else 3
    except BaseException:  # noqa: BLE001 - a child reports through its exit code
        return 4


@posix
def test_fork_while_compiling(auto):
    x = _x()
    kernels.softmax_forward(x)  # queued: the compiler thread is busy when the parent forks
    kernels.softmax_forward(_x(np.float64))
    pid = os.fork()
    if pid == 0:
        os._exit(_child_runs_kernels(x))
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert kernels.wait_compiled(300)


def _mp_child(x):
    sys.exit(_child_runs_kernels(x))


@posix
def test_multiprocessing_fork_child_waits(auto):
    import multiprocessing

    x = _x()
    kernels.softmax_forward(x)
    proc = multiprocessing.get_context("fork").Process(target=_mp_child, args=(x,))
    proc.start()
    proc.join(300)
    if proc.is_alive():
        proc.kill()
        pytest.fail("the multiprocessing child hung")
    assert proc.exitcode == 0


# ----------------------------------------------------------------------------- cold cache
def test_cold_cache_in_a_fresh_process(tmp_path):
    """With an empty numba cache: the first call returns the reference's result and the
    compiled kernel takes over once compiled; the process exits cleanly while compiling."""
    pytest.importorskip("numba")
    code = textwrap.dedent("""
        import numpy as np
        from tinygrad_attn.backend import kernels
        from tinygrad_attn.backend.kernels import background
        x = np.linspace(-3, 3, 64 * 1024, dtype=np.float32).reshape(64, 1024)
        y = kernels.softmax_forward(x)
        assert np.array_equal(y, kernels.reference.softmax_forward(x))
        assert dict(kernels.calls) == {("softmax_forward", "numpy"): 1}, kernels.calls
        assert kernels.wait_compiled(300) and background._bg["failed"] == {}
        np.testing.assert_allclose(kernels.softmax_forward(x), y, rtol=1e-6, atol=1e-9)
        assert kernels.calls["softmax_forward", "numba"] == 1
        rows = kernels._load_compiled().softmax._softmax_rows  # compiled by the worker,
        assert sum(rows.stats.cache_hits.values()) == 1  # loaded here from the cache
        kernels.softmax_forward(x.astype(np.float64))  # compiling when the interpreter exits
        print("ok")
        """)
    env = {k: v for k, v in os.environ.items() if k != kernels.ENV}
    env.update(PYTHONPATH=str(ROOT), NUMBA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert (out.returncode, out.stdout.split()) == (0, ["ok"]), out.stderr
    # the next process finds the kernel in the cache: compiled from its first call, the
    # same path in every run, with no compiler thread and no worker
    warm = textwrap.dedent("""
        import numpy as np
        from tinygrad_attn.backend import kernels
        from tinygrad_attn.backend.kernels import background
        x = np.linspace(-3, 3, 64 * 1024, dtype=np.float32).reshape(64, 1024)
        y = kernels.softmax_forward(x)
        assert dict(kernels.calls) == {("softmax_forward", "numba"): 1}, kernels.calls
        assert background._bg["thread"] is None and background._bg["worker"] is None
        np.testing.assert_allclose(y, kernels.reference.softmax_forward(x), rtol=1e-6,
                                   atol=1e-9)
        print("ok")
        """)
    out = subprocess.run([sys.executable, "-c", warm], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert (out.returncode, out.stdout.split()) == (0, ["ok"]), out.stderr


def test_openblas_spares_a_cpu_only_while_compiling(auto, monkeypatch):
    from tinygrad_attn.backend import threads

    if threads.openblas_num_threads() is None:
        pytest.skip("NumPy's BLAS is not OpenBLAS")
    count = ta.get_num_threads()
    saved_n = threads._state["n"]
    ta.set_num_threads(3)
    try:
        seen = []
        stand_in = background._stand_in

        def spy(spec):  # in the compiler thread
            seen.append((background._bg["spared"], threads.openblas_num_threads()))
            return stand_in(spec)

        monkeypatch.setattr(background, "_stand_in", spy)
        kernels.softmax_forward(_x())
        assert kernels.wait_compiled(300)
        # the compiler's look in the cache spares nothing; its load after the worker's
        # compile runs with OpenBLAS on one thread fewer
        assert (False, 3) in seen and (True, 2) in seen
        assert set(seen) <= {(False, 3), (True, 2)}
        assert threads.openblas_num_threads() == 3
    finally:
        ta.set_num_threads(count)
        threads._state["n"] = saved_n
