"""backend.matmul's stacked path (backend/threads.py): a stacked GEMM of small matrices split
over the engine's threads gives xp.matmul's result bit for bit (values, dtype, shape and
strides), on a grid of shapes, dtypes and layouts; many Python threads may call it at
once; a fork while GEMMs run in the pool's threads leaves parent and child working.

The split path is forced here (no size floor, no backoff), so that every eligible product
takes it whatever the machine's load; `_stacked["splits"]` counts the products it took.
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.backend import threads

ROOT = pathlib.Path(__file__).resolve().parents[1]
posix = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@pytest.fixture
def forced(monkeypatch):
    """Two engine threads, and the split taken for every eligible product."""
    count, was_set = ta.get_num_threads(), threads._state["n"]
    ta.set_num_threads(2)
    monkeypatch.setattr(threads, "SPLIT_MIN_MNK", 0)
    monkeypatch.setattr(threads, "BACKOFF_MAX", 0)
    monkeypatch.setitem(threads._stacked, "on", True)
    monkeypatch.setitem(threads._stacked, "skip", 0)
    yield
    ta.set_num_threads(count)
    threads._state["n"] = was_set


def _random(shape, dtype, rng):
    if np.dtype(dtype).kind in "iub":
        return rng.integers(-3, 4, shape).astype(dtype)
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _same(got, want):
    assert type(got) is type(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.strides == want.strides  # the same layout: later views and copies agree
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(got, want, equal_nan=True)


def _split_count():
    return threads._stacked["splits"]


# (a's shape, b's shape): stacked, broadcast batch axes, a 2-D operand beside a stacked one
SHAPES = [((6, 5, 7), (6, 7, 4)), ((3, 4, 8, 8), (3, 4, 8, 8)), ((2, 3, 5, 6), (6, 2)),
          ((4, 3), (5, 3, 2)), ((1, 4, 5, 3), (3, 1, 3, 6)), ((3, 1, 2, 4), (1, 5, 4, 3)),
          ((2, 7, 1, 5), (5, 6)), ((9, 1, 6), (9, 6, 1)), ((2, 3, 1, 1), (2, 3, 1, 1)),
          ((1, 1, 4, 4), (1, 1, 4, 4)), ((5, 64, 32), (5, 32, 64))]
DTYPES = ["float32", "float64", "complex64", "complex128", "float16", "int64", "int32"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_equal_to_numpy_contiguous(forced, shapes, dtype):
    rng = np.random.default_rng(0)
    a, b = (_random(s, dtype, rng) for s in shapes)
    before = _split_count()
    _same(threads.matmul(np, a, b), np.matmul(a, b))
    blas = np.dtype(dtype).char in "fdFD"
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    assert (_split_count() > before) == (blas and max(batch) > 1)


def _layouts(a, b):
    """Views of a and b: the core axes transposed, strided rows (as the attention's heads are
    in qkv), a reversed or a permuted batch, and broadcast (zero-stride) batch axes."""
    def wide(x):  # x's values in every other column of a buffer twice as wide
        buf = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
        buf[..., ::2] = x
        return buf[..., ::2]

    def tr(x):  # x's values, stored transposed
        return np.ascontiguousarray(x.swapaxes(-1, -2)).swapaxes(-1, -2)

    yield "contiguous", a, b
    yield "a transposed", tr(a), b
    yield "b transposed", a, tr(b)
    yield "both transposed", tr(a), tr(b)
    yield "strided rows", wide(a), wide(b)
    yield "strided, transposed b", wide(a), tr(wide(b))
    yield "reversed batch", a[::-1].copy()[::-1], b
    yield "permuted batch", np.ascontiguousarray(a.swapaxes(0, 1)).swapaxes(0, 1), b
    yield "broadcast a", np.broadcast_to(a[:1], a.shape), b
    yield "sliced", a[:, 1:], b[:, 1:]


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64"])
def test_equal_to_numpy_on_views(forced, dtype):
    rng = np.random.default_rng(1)
    base_a, base_b = _random((4, 3, 16, 8), dtype, rng), _random((4, 3, 8, 12), dtype, rng)
    took = []
    for name, a, b in _layouts(base_a, base_b):
        before = _split_count()
        want = np.matmul(a, b)
        got = threads.matmul(np, a, b)
        _same(got, want)
        took.append(name) if _split_count() > before else None
    # a permuted or reversed batch makes NumPy's result follow the operands: left to NumPy
    assert "permuted batch" not in took and "reversed batch" not in took
    assert {"contiguous", "b transposed", "strided rows", "broadcast a"} <= set(took)


def test_attention_shapes_on_strided_views_of_qkv(forced):
    """The views attention's six products at the small GPT's shape, as its heads are views
    of one (B, T, 3C) buffer."""
    B, nh, T, hs = 8, 4, 64, 32
    rng = np.random.default_rng(2)
    qkv = rng.standard_normal((B, T, 3 * nh * hs), dtype=np.float32)
    q, k, v = (qkv[..., i * nh * hs:(i + 1) * nh * hs].reshape(B, T, nh, hs).transpose(0, 2, 1, 3)
               for i in range(3))
    att = rng.standard_normal((B, nh, T, T), dtype=np.float32)
    g = rng.standard_normal((B, nh, T, hs), dtype=np.float32)
    before = _split_count()
    for a, b in [(q, k.swapaxes(-1, -2)), (att, v), (g, v.swapaxes(-1, -2)),
                 (att.swapaxes(-1, -2), g), (att, k), (att.swapaxes(-1, -2), q)]:
        _same(threads.matmul(np, a, b), np.matmul(a, b))
    assert _split_count() - before == 6


@pytest.mark.parametrize("shapes", [((0, 3, 4), (0, 4, 5)), ((2, 0, 3, 4), (2, 0, 4, 5)),
                                    ((3, 0, 4), (3, 4, 5)), ((3, 4, 0), (3, 0, 5)),
                                    ((3, 4, 5), (3, 5, 0))], ids=str)
def test_empty_products_are_numpys(forced, shapes):
    a, b = (np.ones(s, np.float32) for s in shapes)
    _same(threads.matmul(np, a, b), np.matmul(a, b))


@pytest.mark.parametrize("shapes", [((3, 4, 5), (3, 6, 2)), ((3, 4, 5), (2, 5, 2)),
                                    ((3, 4, 5), (5,)), ((5,), (3, 5, 4))], ids=str)
def test_errors_and_vectors_are_numpys(forced, shapes):
    a, b = (np.ones(s, np.float32) for s in shapes)
    try:
        want = np.matmul(a, b)
    except ValueError as e:
        with pytest.raises(ValueError) as got:
            threads.matmul(np, a, b)
        assert str(got.value) == str(e)
    else:
        _same(threads.matmul(np, a, b), want)


def test_mixed_dtypes_and_subclasses_are_left_to_numpy(forced):
    a = np.ones((4, 3, 3), np.float32)
    before = _split_count()
    _same(threads.matmul(np, a, a.astype(np.float64)), np.matmul(a, a.astype(np.float64)))
    m = np.ones((3, 3)).view(np.ma.MaskedArray)
    assert type(threads.matmul(np, m[None].repeat(2, 0), m[None].repeat(2, 0))) is type(
        np.matmul(m[None].repeat(2, 0), m[None].repeat(2, 0)))
    assert _split_count() == before


def test_big_matrices_are_left_to_openblas(forced):
    """A matrix past SPLIT_MAX_MNK is one OpenBLAS threads itself: not split."""
    side = 1 + round(threads.SPLIT_MAX_MNK ** (1 / 3))
    a = np.ones((2, side, side), np.float32)
    before = _split_count()
    _same(threads.matmul(np, a, a), np.matmul(a, a))
    assert _split_count() == before


def test_a_thread_count_of_one_does_not_split(forced):
    ta.set_num_threads(1)
    a = np.ones((4, 8, 8), np.float32)
    before = _split_count()
    _same(threads.matmul(np, a, a), np.matmul(a, a))
    assert _split_count() == before


def test_many_threads_at_once_get_numpys_results(forced):
    rng = np.random.default_rng(3)
    pairs = [(rng.standard_normal((8, 4, 32, 16), dtype=np.float32),
              rng.standard_normal((8, 4, 16, 32), dtype=np.float32)) for _ in range(4)]
    wants = [np.matmul(a, b) for a, b in pairs]
    errors, before = [], _split_count()

    def work(i):
        try:
            for r in range(30):
                a, b = pairs[(i + r) % 4]
                np.testing.assert_array_equal(threads.matmul(np, a, b), wants[(i + r) % 4])
        except BaseException as e:  # noqa: BLE001 - reported in the main thread
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts), "a GEMM thread hung"
    assert errors == []
    assert _split_count() > before  # some took the pool; the others ran alone meanwhile


def test_an_error_in_a_chunk_is_raised_in_the_caller():
    def fails(a, b, out):
        raise MemoryError("no room")

    job = threads._Job(fails, [(None, None, None)] * 3)
    job.run()
    job.finish()
    assert isinstance(job.error, MemoryError) and job.left == 0


def test_backoff_after_lost_splits_and_back_on_after_a_won_one(monkeypatch):
    monkeypatch.setattr(threads, "BACKOFF_MAX", 8)
    for key in ("skip", "backoff"):
        monkeypatch.setitem(threads._stacked, key, 0)
    skips = []
    for _ in range(5):
        threads._judge(elapsed=1.0, alone=1.0)  # as slow as running the chunks alone
        skips.append(threads._stacked["skip"])
    assert skips == [1, 2, 4, 8, 8]
    threads._judge(elapsed=0.5, alone=1.0)
    assert threads._stacked["backoff"] == 0


def _run(code, timeout=180):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                             text=True, env=env, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the subprocess hung for {timeout} s")
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


_FORCED = """
    import json, os, threading, time
    import numpy as np
    import tinygrad_attn as ta
    from tinygrad_attn.backend import threads
    ta.set_num_threads(2)
    threads.SPLIT_MIN_MNK, threads.BACKOFF_MAX = 0, 0
    rng = np.random.default_rng(0)
    A = rng.standard_normal((16, 4, 64, 32), dtype=np.float32)
    B = rng.standard_normal((16, 4, 32, 64), dtype=np.float32)
    WANT = np.matmul(A, B)

    def wait(pid, timeout=60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.005)
        os.kill(pid, 9)
        return "hung"
"""


@posix
def test_fork_while_gemms_run_in_the_pools_threads():
    """Forks beside a thread whose stacked GEMMs run in the pool: the gate waits for each
    split to end, the child starts a pool of its own, and its split GEMMs agree."""
    res = _run(_FORCED + """
    stop = threading.Event()
    def loop():
        while not stop.is_set():
            assert np.array_equal(threads.matmul(np, A, B), WANT)
    t = threading.Thread(target=loop)
    t.start()
    time.sleep(0.2)
    codes, slowest = [], 0.0
    for i in range(40):
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            splits = threads._stacked["splits"]
            ok = all(np.array_equal(threads.matmul(np, A, B), WANT) for _ in range(3))
            ok = ok and threads._stacked["splits"] == splits + 3
            os._exit(0 if ok else 1)
        slowest = max(slowest, time.monotonic() - start)
        codes.append(wait(pid))
    stop.set()
    t.join(60)
    print(json.dumps({"codes": codes, "slowest": slowest, "alive": t.is_alive(),
                      "splits": threads._stacked["splits"]}))
    """)
    assert res["codes"] == [0] * 40
    assert res["slowest"] < 5.0 and not res["alive"] and res["splits"] > 0


@posix
def test_the_pools_idle_threads_do_not_hold_openblas_at_one_thread_in_a_child():
    """A child forked while other threads ran keeps OpenBLAS on one thread; the pool's
    workers, idle whenever the gate lets a fork through, are not such threads."""
    res = _run(_FORCED + """
    assert np.array_equal(threads.matmul(np, A, B), WANT)  # the pool is started
    workers = len(threads._pool["workers"])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, json.dumps([threads.forked_blas(), len(threads._pool["workers"]),
                                bool(np.array_equal(threads.matmul(np, A, B), WANT)),
                                len(threads._pool["workers"])]).encode())
        os._exit(0)
    code = wait(pid)
    print(json.dumps({"code": code, "child": json.loads(os.read(r, 1000)),
                      "workers": workers}))
    """)
    assert res["code"] == 0 and res["workers"] == 1
    assert res["child"] == [False, 0, True, 1]  # a fresh pool, started at its first split
