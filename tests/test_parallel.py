"""A batch split over the engine's threads (backend/parallel.py): the batched GEMMs and the
blocked attention give the same values split and whole, every part runs once, errors reach
the caller, OpenBLAS gets its count back, and a split never nests or outlives a fork."""

import os
import threading

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.backend import parallel, threads

needs_openblas = pytest.mark.skipif(threads.openblas_num_threads() is None,
                                    reason="NumPy's BLAS is not OpenBLAS")
posix = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@pytest.fixture
def two_threads():
    """The engine on 2 threads (restored after), so a split makes 2 parts."""
    saved_n, count = threads._state["n"], ta.get_num_threads()
    ta.set_num_threads(2)
    yield
    ta.set_num_threads(count)
    threads._state["n"] = saved_n


@pytest.fixture
def always_split(monkeypatch, two_threads):
    """Split any batch, however small the work."""
    monkeypatch.setattr(parallel, "MIN_MACS", 0)


@pytest.fixture
def never_split(monkeypatch):
    monkeypatch.setattr(parallel, "MIN_MACS", 1 << 62)


def _record_parts(n):
    seen, lock = [], threading.Lock()

    def work(lo, hi):
        with lock:
            seen.append((lo, hi, threading.get_ident()))

    parallel.split(n, work)
    return seen


@needs_openblas
@pytest.mark.parametrize("n", [2, 3, 7, 32])
def test_split_covers_the_batch_once_in_parts_on_two_threads(two_threads, n):
    seen = _record_parts(n)
    assert sorted((lo, hi) for lo, hi, _ in seen) == [(0, n // 2), (n // 2, n)]
    assert len({t for *_, t in seen}) == 2
    assert seen[0][2] == threading.get_ident() or seen[1][2] == threading.get_ident()


def test_split_on_one_thread_runs_whole(two_threads):
    ta.set_num_threads(1)
    assert [(lo, hi) for lo, hi, _ in _record_parts(8)] == [(0, 8)]


def test_split_of_one_item_runs_whole(two_threads):
    assert [(lo, hi) for lo, hi, _ in _record_parts(1)] == [(0, 1)]


@needs_openblas
def test_openblas_is_single_threaded_inside_a_split_and_restored(two_threads):
    inside = []
    parallel.split(4, lambda lo, hi: inside.append(threads.openblas_num_threads()))
    assert inside == [1, 1]
    assert threads.openblas_num_threads() == 2


@needs_openblas
def test_an_error_in_a_helper_part_reaches_the_caller(two_threads):
    def work(lo, hi):
        if lo > 0:
            raise ValueError(f"part {lo}:{hi}")

    with pytest.raises(ValueError, match="part 2:4"):
        parallel.split(4, work)
    assert threads.openblas_num_threads() == 2
    assert sorted((lo, hi) for lo, hi, _ in _record_parts(4)) == [(0, 2), (2, 4)]  # unlocked


@needs_openblas
def test_a_split_inside_a_split_runs_whole(two_threads):
    inner = []

    def work(lo, hi):
        parallel.split(6, lambda a, b: inner.append((a, b)))

    parallel.split(4, work)
    assert inner == [(0, 6), (0, 6)]


def test_work_on_another_array_module_runs_whole(two_threads):
    calls = []
    parallel.split(8, lambda lo, hi: calls.append((lo, hi)), xp=object())
    assert calls == [(0, 8)]


@needs_openblas
@posix
def test_a_child_forked_during_a_split_can_split(two_threads):
    started, release = threading.Event(), threading.Event()

    def hold():
        parallel.split(2, lambda lo, hi: (started.set(), release.wait(60)) if lo == 0 else None)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert started.wait(60)
        pid = os.fork()
        if pid == 0:
            ok = (threads.openblas_num_threads() == 2
                  and sorted((lo, hi) for lo, hi, _ in _record_parts(4)) == [(0, 2), (2, 4)])
            os._exit(0 if ok else 1)
    finally:
        release.set()
        t.join(60)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# ----------------------------------------------------------------------------- matmul
SHAPES = [  # (a, b): batch dims equal, broadcast by size 1, broadcast by fewer dims
    ((4, 3, 5, 6), (4, 3, 6, 2)),
    ((4, 3, 5, 6), (1, 3, 6, 2)),
    ((1, 3, 5, 6), (4, 3, 6, 2)),
    ((3, 5, 6), (4, 3, 6, 2)),
    ((4, 3, 5, 6), (6, 2)),
    ((5, 5, 6), (5, 6, 7)),
    ((2, 0, 6), (2, 6, 3)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sa,sb", SHAPES)
def test_matmul_split_equals_numpy(always_split, sa, sb, dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(sa).astype(dtype)
    b = rng.standard_normal(sb).astype(dtype)
    got = parallel.matmul(np, a, b)
    want = np.matmul(a, b)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == np.float32 else 1e-13,
                               atol=1e-6 if dtype == np.float32 else 1e-13)


def test_matmul_split_takes_strided_operands(always_split):
    rng = np.random.default_rng(1)
    qkv = rng.standard_normal((4, 16, 3 * 8)).astype(np.float32)
    q = qkv[:, :, :8].reshape(4, 16, 2, 4).transpose(0, 2, 1, 3)
    k = qkv[:, :, 8:16].reshape(4, 16, 2, 4).transpose(0, 2, 1, 3)
    got = parallel.matmul(np, q, k.swapaxes(-1, -2))
    np.testing.assert_allclose(got, np.matmul(q, k.swapaxes(-1, -2)), rtol=1e-6, atol=1e-6)


def test_matmul_leaves_ints_and_mixed_dtypes_to_numpy(always_split, monkeypatch):
    monkeypatch.setattr(parallel, "split", lambda *a, **k: pytest.fail("split was called"))
    a = np.arange(24).reshape(2, 3, 4)
    assert np.array_equal(parallel.matmul(np, a, a.swapaxes(-1, -2)),
                          np.matmul(a, a.swapaxes(-1, -2)))
    f32, f64 = a.astype(np.float32), a.astype(np.float64)
    assert parallel.matmul(np, f32, f64.swapaxes(-1, -2)).dtype == np.float64


def test_matmul_below_the_threshold_is_not_split(two_threads, monkeypatch):
    monkeypatch.setattr(parallel, "split", lambda *a, **k: pytest.fail("split was called"))
    a = np.ones((2, 4, 4), np.float32)
    assert np.array_equal(parallel.matmul(np, a, a), np.full((2, 4, 4), 4, np.float32))


def _grads(fn, *arrays):
    ts = [ta.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*ts)
    out.backward(ta.tensor(np.linspace(-1, 1, out.numel()).reshape(out.shape)
                           .astype(arrays[0].dtype)))
    return out.detach().numpy(), [t.grad.numpy() for t in ts]


def _same(fn, *arrays, monkeypatch, tol):
    monkeypatch.setattr(parallel, "MIN_MACS", 0)
    split_out, split_grads = _grads(fn, *arrays)
    monkeypatch.setattr(parallel, "MIN_MACS", 1 << 62)
    out, grads = _grads(fn, *arrays)
    np.testing.assert_allclose(split_out, out, rtol=tol, atol=tol)
    for g1, g2 in zip(split_grads, grads):
        np.testing.assert_allclose(g1, g2, rtol=tol, atol=tol)


@pytest.mark.parametrize("sa,sb", [((4, 2, 5, 3), (4, 2, 3, 6)), ((4, 2, 5, 3), (1, 2, 3, 6)),
                                   ((2, 5, 3), (3, 6))])
def test_matmul_op_forward_and_backward_same_split_or_whole(two_threads, monkeypatch, sa, sb):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    _same(lambda x, y: x @ y, a, b, monkeypatch=monkeypatch, tol=1e-13)


@pytest.mark.parametrize("causal,mask", [(True, None), (False, "bool"), (False, "float")])
def test_blocked_attention_same_split_or_whole(two_threads, monkeypatch, causal, mask):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((3, 2, 10, 4)) for _ in range(3))
    m = None
    if mask == "bool":
        m = ta.tensor(rng.random((10, 10)) > 0.3)
    elif mask == "float":
        m = ta.tensor(rng.standard_normal((2, 10, 10)))

    def attn(q, k, v):
        return ta.functional.scaled_dot_product_attention(q, k, v, m, is_causal=causal,
                                                          block_size=4)

    _same(attn, q, k, v, monkeypatch=monkeypatch, tol=1e-12)


def test_blocked_attention_split_matches_the_composition(always_split):
    rng = np.random.default_rng(4)
    q, k, v = (ta.tensor(rng.standard_normal((4, 3, 9, 5))) for _ in range(3))
    got = ta.functional.scaled_dot_product_attention(q, k, v, is_causal=True, block_size=4)
    s = q.numpy() @ k.numpy().swapaxes(-1, -2) / np.sqrt(5)
    s = np.where(np.tril(np.ones((9, 9), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v.numpy()
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
