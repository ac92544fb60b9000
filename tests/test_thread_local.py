"""Per-thread engine state: grad mode, the ledger's labels and module calls, the switch
overrides; exact byte counters under threads; fork while other threads train.

Each test runs its threads (and forks) in a fresh interpreter with a timeout, so that a
hang fails the test instead of stopping the suite, and a fork starts from a known process.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
posix = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

KERNELS = [pytest.param("auto", id="default"), pytest.param("numba", id="numba")]

# A tiny GPT and its optimizer, seeded; train(job, steps) returns its losses and parameters.
_MODEL = """
import json, os, sys, threading, time
import numpy as np
import tinygrad_attn as ta
import nn

def make(seed, n_embd=32):
    ta.manual_seed(seed)
    cfg = nn.GPTConfig(vocab_size=17, block_size=8, n_layer=1, n_head=2, n_embd=n_embd)
    model = nn.GPT(cfg)
    opt = nn.optim.AdamW(model.parameters(), lr=1e-2)
    idx = ta.tensor(np.random.default_rng(seed).integers(0, 17, (4, 8)))
    return model, opt, idx

def train(job, steps):
    model, opt, idx = job
    losses = []
    for _ in range(steps):
        _, loss = model(idx, idx)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    with ta.no_grad():
        return losses, [p.detach().numpy().copy() for p in model.parameters()]

def in_threads(*targets):
    errors = []
    def guarded(fn):
        try:
            fn()
        except BaseException as e:
            errors.append(repr(e))
    ts = [threading.Thread(target=guarded, args=(fn,)) for fn in targets]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts), "a thread hung"
    return errors
"""


def _run(code: str, kernels: str = "auto", fork: bool = False, timeout: float = 240) -> dict:
    """Run `code` (after _MODEL, and _FORK's helpers with fork=True) in a fresh interpreter;
    it prints one JSON line last."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TINYGRAD_ATTN_KERNELS=kernels)
    if kernels == "numba":
        pytest.importorskip("numba")
    src = _MODEL + (_FORK if fork else "") + textwrap.dedent(code)
    try:
        out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                             env=env, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the subprocess hung for {timeout} s")
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- grad mode
@pytest.mark.parametrize("kernels", KERNELS)
def test_two_threads_train_two_models_exactly_as_serially(kernels):
    res = _run("""
        serial = [train(make(seed), 3) for seed in (1, 2)]
        jobs, threaded = [make(1), make(2)], [None, None]
        def run(i):
            threaded[i] = train(jobs[i], 3)
        errors = in_threads(lambda: run(0), lambda: run(1))
        same = [s[0] == t[0] and all(np.array_equal(a, b) for a, b in zip(s[1], t[1]))
                for s, t in zip(serial, threaded)] if not errors else []
        print(json.dumps({"errors": errors, "same": same, "grad": ta.is_grad_enabled(),
                          "losses": [s[0] for s in serial]}))
        """, kernels)
    assert res["errors"] == []
    assert res["same"] == [True, True]  # losses and every parameter, bit for bit
    assert res["grad"] is True  # the main thread's mode is intact after the threads end
    assert all(ls[-1] < ls[0] for ls in res["losses"])  # they did train


def test_no_grad_held_open_in_one_thread_while_another_records():
    res = _run("""
        entered, recorded = threading.Event(), threading.Event()
        seen = {}
        def quiet():
            with ta.no_grad():
                entered.set()
                recorded.wait(60)
                x = ta.ones(3, requires_grad=True)
                seen["quiet"] = [ta.is_grad_enabled(), (x * 2).requires_grad]
            seen["quiet_after"] = ta.is_grad_enabled()
        def loud():
            entered.wait(60)
            x = ta.ones(3, requires_grad=True)
            y = (x * x).sum()
            y.backward()
            seen["loud"] = [ta.is_grad_enabled(), y.requires_grad, x.grad.tolist()]
            recorded.set()
        errors = in_threads(quiet, loud)
        with ta.no_grad():  # a thread started under no_grad starts with grad enabled
            errors += in_threads(lambda: seen.update(child=ta.is_grad_enabled()))
            seen["main_inside"] = ta.is_grad_enabled()
        seen["main"] = ta.is_grad_enabled()
        print(json.dumps({"errors": errors, **seen}))
        """)
    assert res["errors"] == []
    assert res["quiet"] == [False, False] and res["quiet_after"] is True
    assert res["loud"] == [True, True, [2.0, 2.0, 2.0]]
    assert res["child"] is True and res["main_inside"] is False and res["main"] is True


# ----------------------------------------------------------------------------- labels
def test_labels_scopes_and_switch_overrides_are_per_thread():
    res = _run("""
        from tinygrad_attn.memory import state
        inside, release = threading.Barrier(2), threading.Event()
        seen = {}
        def scoped():
            with ta.memory.scope("a.b"), ta.memory.phase("optimizer"), \\
                    ta.memory.save_policies(gelu="recompute"), ta.memory.emulate(late_free=True):
                inside.wait(60)
                st = ta.zeros(2).untyped_storage()
                seen["scoped"] = [st.scope, st.phase, ta.memory.save_policy("gelu"),
                                  state.habits["late_free"]]
                release.wait(60)
        def plain():
            inside.wait(60)
            st = ta.zeros(2).untyped_storage()
            seen["plain"] = [st.scope, st.phase, ta.memory.save_policy("gelu"),
                             state.habits["late_free"]]
            release.set()
        errors = in_threads(scoped, plain)
        ta.memory.save_policy("gelu", "recompute")  # outside any block: for the process
        errors += in_threads(lambda: seen.update(policy=ta.memory.save_policy("gelu")))
        ta.memory.save_policy("gelu", "save")
        seen["main"] = [ta.memory.current_scope(), ta.memory.current_phase(),
                        ta.memory.save_policy("gelu"), state.habits["late_free"]]
        print(json.dumps({"errors": errors, **seen}))
        """)
    assert res["errors"] == []
    assert res["scoped"] == ["a.b", "optimizer", "recompute", True]
    assert res["plain"] == ["", "other", "save", False]
    assert res["policy"] == "recompute"
    assert res["main"] == ["", "other", "save", False]


def test_module_scopes_of_two_threads_do_not_mix():
    res = _run("""
        from tinygrad_attn.memory import state
        jobs = [make(4), make(5)]
        names = {}
        class Watch:  # the scope of every allocation, by the thread that made it
            def on_alloc(self, st):
                names.setdefault(threading.get_ident(), set()).add(st.scope)
            def on_free(self, st):
                pass
        go = threading.Barrier(2)
        def run(i):
            go.wait(60)
            for _ in range(3):
                jobs[i][0](jobs[i][2])
        state.observers.append(Watch())
        errors = in_threads(lambda: run(0), lambda: run(1))
        state.observers.pop()
        allowed = {name for name, _ in jobs[0][0].named_modules()}
        print(json.dumps({"errors": errors, "allowed": sorted(allowed),
                          "names": [sorted(n) for n in names.values()]}))
        """)
    assert res["errors"] == [] and len(res["names"]) == 2
    for names in res["names"]:  # each thread's allocations under its own model's names only
        assert "transformer.h.0.attn" in names and "transformer.h.0.mlp.c_fc" in names
        assert set(names) <= set(res["allowed"]), set(names) - set(res["allowed"])


# ----------------------------------------------------------------------------- counters
def test_byte_counters_exact_after_threads_allocate_and_free():
    res = _run("""
        import gc
        gc.collect()
        base = ta.memory.live_bytes()
        go = threading.Barrier(5)
        def churn(seed):
            rng = np.random.default_rng(seed)
            go.wait(60)
            keep = []
            for i in range(3000):
                keep.append(ta.zeros(int(rng.integers(1, 64))))
                if len(keep) > 8:
                    keep.pop(int(rng.integers(0, len(keep))))
        def observe():  # an open profile hears every thread's allocations meanwhile
            go.wait(60)
            for _ in range(20):
                with ta.memory.profile() as prof:
                    time.sleep(0.005)
                prof.summary()
        errors = in_threads(*[lambda s=s: churn(s) for s in range(4)], observe)
        gc.collect()
        print(json.dumps({"errors": errors, "drift": ta.memory.live_bytes() - base,
                          "peak_ok": ta.memory.max_live_bytes() >= base}))
        """)
    assert res["errors"] == []
    assert res["drift"] == 0
    assert res["peak_ok"]


def test_profile_opens_while_other_threads_build_tuples():
    # Opening a profile learns which storages are already alive. Learning it from the
    # collector's list of every object also handed out tuples other threads were still
    # building from generators, whose next growth then failed with a SystemError.
    res = _run("""
        stop = threading.Event()
        def build():
            while not stop.is_set():
                tuple(ta.zeros(2) for _ in range(200))
        def observe():
            try:
                for _ in range(300):
                    with ta.memory.profile():
                        pass
            finally:
                stop.set()
        errors = in_threads(build, build, build, observe)
        print(json.dumps({"errors": errors}))
        """)
    assert res["errors"] == []


# ----------------------------------------------------------------------------- fork
_FORK = """
def child_checks(want_grad):
    # the child computes: a recorded step (matmul, softmax, a compiled-path kernel), and its
    # grad mode is the forking thread's
    try:
        if ta.is_grad_enabled() != want_grad:
            return 5
        w = ta.tensor(W, requires_grad=True)
        with ta.enable_grad():
            loss = (ta.tensor(X) @ w).softmax(-1).mul(ta.tensor(X[:, :64])).sum()
            loss.backward()
        if not np.allclose(w.grad.numpy(), GRAD, rtol=1e-4, atol=1e-5):  # either path
            return 3
        got = kernels.gelu_forward(X.reshape(-1))
        return 0 if np.allclose(got, GELU, rtol=1e-4, atol=1e-6) else 6
    except BaseException:
        return 4

def wait(pid, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.005)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hung"

from tinygrad_attn.backend import kernels, threads
rng = np.random.default_rng(0)
X, W = rng.standard_normal((128, 128), np.float32), rng.standard_normal((128, 64), np.float32)
w0 = ta.tensor(W, requires_grad=True)
(ta.tensor(X) @ w0).softmax(-1).mul(ta.tensor(X[:, :64])).sum().backward()
GRAD = w0.grad.numpy()
GELU = kernels.gelu_forward(X.reshape(-1))
"""


@posix
@pytest.mark.parametrize("kernels", KERNELS)
def test_fork_while_another_thread_trains(kernels):
    res = _run("""
        # OpenBLAS on two threads: its at-fork handler stops its pool, which waited forever
        # on a worker that another thread's threaded GEMM gave work meanwhile, until every
        # GEMM went through the backend's fork gate
        ta.set_num_threads(2)
        job, stop, errors = make(6, n_embd=64), threading.Event(), []
        def loop():
            try:
                while not stop.is_set():
                    train(job, 1)
            except BaseException as e:
                errors.append(repr(e))
        t = threading.Thread(target=loop)
        t.start()
        time.sleep(0.2)
        codes, slowest = [], 0.0
        for i in range(20):
            grad_on = i % 2 == 0  # half the forks from inside no_grad
            start = time.monotonic()
            with ta.set_grad_enabled(grad_on):
                pid = os.fork()
                if pid == 0:
                    os._exit(child_checks(grad_on))
            slowest = max(slowest, time.monotonic() - start)
            codes.append(wait(pid))
        stop.set()
        t.join(120)
        print(json.dumps({"codes": codes, "slowest": slowest, "errors": errors,
                          "alive": t.is_alive(), "grad": ta.is_grad_enabled()}))
        """, kernels, fork=True)
    assert res["codes"] == [0] * 20
    assert res["slowest"] < 5.0  # seconds in fork(), with the parent otherwise idle
    assert res["errors"] == [] and not res["alive"] and res["grad"] is True


@posix
def test_fork_while_another_thread_holds_the_byte_counters():
    # A thread inside a Storage's counter update when another thread forks: the child's
    # first allocation must not wait forever on a lock whose holder it does not have.
    res = _run("""
        from tinygrad_attn.memory import state
        held, go = threading.Event(), threading.Event()
        def hold():
            with state.lock:
                held.set()
                go.wait(0.5)  # the fork waits for the counters, then goes on
        t = threading.Thread(target=hold)
        t.start()
        held.wait(10)
        pid = os.fork()
        if pid == 0:
            os._exit(0 if ta.zeros(3).sum().item() == 0 else 3)
        code = wait(pid, 30)
        go.set()
        t.join(10)
        print(json.dumps({"code": code}))
        """, fork=True)
    assert res["code"] == 0


@posix
def test_fork_does_not_wait_for_the_background_compiler():
    """The background compiler holds its lock for a whole compile in this process (seconds);
    a fork used to wait for it, compile after compile."""
    res = _run("""
        held, release = threading.Event(), threading.Event()
        def compiling():
            with kernels.background._bg["compiling"]:
                held.set()
                release.wait(60)
        t = threading.Thread(target=compiling)
        t.start()
        held.wait(60)
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os._exit(child_checks(True))
        took = time.monotonic() - start
        code = wait(pid)
        release.set()
        t.join(60)
        print(json.dumps({"took": took, "code": code}))
        """, fork=True)
    assert res["took"] < 2.0 and res["code"] == 0


@posix
def test_fork_while_numba_compiles_in_another_thread():
    """numba's compiler lock held by another thread at the fork: the child runs what was
    compiled before and refuses to compile (a warning; the reference runs), never hangs."""
    res = _run("""
        import warnings
        from numba.core.compiler_lock import global_compiler_lock
        from tinygrad_attn.backend.kernels import reference
        SOFT = kernels.softmax_forward(X)  # compiled (or loaded) before the fork
        X64 = X.astype(np.float64)
        LOGSOFT = reference.log_softmax_forward(X64)
        held, release = threading.Event(), threading.Event()
        def compiling():
            with global_compiler_lock:
                held.set()
                release.wait(60)
        t = threading.Thread(target=compiling)
        t.start()
        held.wait(60)
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                before = dict(kernels.calls)
                ok = np.allclose(kernels.softmax_forward(X), SOFT, rtol=1e-5, atol=1e-7)
                fresh = kernels.log_softmax_forward(X64)  # not compiled here: would compile
                ok = ok and np.allclose(fresh, LOGSOFT, rtol=1e-12, atol=1e-12)
            ran = {k: n - before.get(k, 0) for k, n in kernels.calls.items()}
            said = any("compiling a kernel" in str(w.message) for w in caught)
            paths = (ran.get(("softmax_forward", "numba")),
                     ran.get(("log_softmax_forward", "numpy")))
            os._exit(0 if ok and said and paths == (1, 1) else 7)
        took = time.monotonic() - start
        code = wait(pid)
        release.set()
        t.join(60)
        print(json.dumps({"took": took, "code": code}))
        """, "numba", fork=True)
    assert res["took"] < 2.0 and res["code"] == 0


@posix
def test_fork_while_another_thread_runs_threaded_gemms():
    """OpenBLAS's at-fork handler joins its pool; a GEMM another thread started at that
    moment left the parent waiting in fork() forever (two of three runs of 100 forks here,
    before the gate). The gate holds GEMMs back for the fork's few microseconds."""
    res = _run("""
        ta.set_num_threads(2)
        stop = threading.Event()
        def loop():
            a = ta.randn(384, 384)
            while not stop.is_set():
                (a @ a).sum().item()
        t = threading.Thread(target=loop)
        t.start()
        time.sleep(0.2)
        codes, slowest = [], 0.0
        for i in range(60):
            start = time.monotonic()
            pid = os.fork()
            if pid == 0:
                y = ta.ones(64, 64) @ ta.ones(64, 64)  # a threaded GEMM in the child
                os._exit(0 if (y == 64).all().item() else 1)
            slowest = max(slowest, time.monotonic() - start)
            codes.append(wait(pid))
        stop.set()
        t.join(60)
        print(json.dumps({"codes": codes, "slowest": slowest, "alive": t.is_alive()}))
        """, fork=True, timeout=120)
    assert res["codes"] == [0] * 60
    assert res["slowest"] < 5.0 and not res["alive"]


def test_every_gemm_of_the_ops_goes_through_the_fork_gate():
    """An op that called xp.matmul itself would reopen the parent's fork hang above."""
    gate = ROOT / "tinygrad_attn" / "backend" / "threads.py"
    ops = [p for p in sorted((ROOT / "tinygrad_attn").rglob("*.py")) if p != gate]
    direct = [f"{p.relative_to(ROOT)}:{i}" for p in ops
              for i, line in enumerate(p.read_text().splitlines(), 1)
              if "xp.matmul(" in line or "np.matmul(" in line or ".dot(" in line]
    assert direct == [], direct
