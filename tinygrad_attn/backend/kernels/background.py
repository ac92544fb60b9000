"""Compiling in the background: how "auto" mode gets its compiled kernels without making a
step wait for numba.

numba compiles a kernel on its first call for each set of argument types, seconds per
kernel, and a training run's first step met them all at once. In "auto" the chooser
(kernels/__init__.py) runs a compiled kernel only once its *key* (kernel name and the
argument types numba compiles for) is ready, and hands every other call here:

    first_call     a key's first call looks in numba's on-disk cache without compiling: a
                   hit loads the kernel in milliseconds and runs it (every process after the
                   first takes the compiled path from its first call, the same path in every
                   run); a miss runs the reference and queues the key's types, never its
                   arrays (_spec: each array replaced by its _ArraySpec).
    the thread     one daemon thread takes the queue in order. For each key it hands the
                   call, as JSON (_encode/_decode), to a worker process (_WORKER), which
                   compiles the kernel by calling it on tiny stand-in arrays of the same
                   numba types (_stand_in) and so fills the cache; then the thread makes the
                   same stand-in call here, holding the launch lock, which loads it.
    the worker     `python -c _WORKER`, started on first use, stopped after WORKER_IDLE_S
                   with nothing queued. numba's compiler is Python: in a thread of this
                   process it would hold the GIL for most of every second and slow the steps
                   beside it several times over; in the worker it holds none of this
                   process's locks and allocates none of its memory. Where it cannot run (no
                   interpreter to start, a crash, a hang) the thread compiles here instead,
                   and a call that finds the launch lock taken for that runs the reference
                   rather than wait (compiling_here).

OpenBLAS spares the compiler a CPU only while it compiles. `wait_compiled()` waits for the
queue to empty; `compiler_paused()` holds the compiler back, here and in the thread, while
a raw memory profile traces every thread's allocations. At exit the queue is dropped and the
worker stopped; a fork takes the locks that are free and makes the child refuse what needs
one that is not (the end of this file). docs/kernels.md, "Compiling in the background", has
the design and the measurements.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
import warnings

import numpy as np

from .. import kernels as chooser  # the package: its mode, launch lock and loader (_state)
from .. import threads

_bg = {"ready": set(), "missed": set(), "failed": {}, "closed": False, "paused": 0,
       "no_worker": None, "compiling_here": False, "spared": False}
WORKER_IDLE_S = 10.0  # the worker process exits after this long with nothing queued
WORKER_TIMEOUT_S = 600.0  # a compile not answered by then: the worker is taken as hung


def _fresh_queue() -> None:
    """The queue, its thread, its worker and its locks, new (at import and in a forked
    child)."""
    _bg.update(queue=collections.deque(), queued=set(), thread=None, busy=False,
               worker=None, cond=threading.Condition(), compiling=threading.Lock())


_fresh_queue()


class _ArraySpec(tuple):
    """An array's signature inside a queued call: (dtype, ndim, C, F, writeable)."""


def _signature(a):
    """What numba types an argument by: for an array its dtype, ndim, layout and whether it
    is read-only; for bool and None the value; for another scalar its type."""
    if type(a) is np.ndarray:
        f = a.flags
        return (a.dtype, a.ndim, f.c_contiguous, f.f_contiguous, f.writeable)
    if a is None or isinstance(a, bool):
        return a
    if isinstance(a, (list, tuple)):
        return (type(a), tuple(_signature(x) for x in a))
    return type(a)


def key(name: str, args: tuple, kwargs: dict) -> tuple:
    """What a kernel is compiled for: its name and its arguments' signatures."""
    return (name, _signature(args), _signature(tuple(sorted(kwargs.items()))))


def is_ready(key) -> bool:
    """Whether "auto" runs the compiled kernel for this key (loaded or compiled here)."""
    return key in _bg["ready"]


def compiling_here() -> bool:
    """Whether the thread holds the launch lock to compile in this process (seconds: the
    worker could not), rather than to load from the cache (milliseconds)."""
    return _bg["compiling_here"]


def _spec(a):
    """The call to queue: each array replaced by its signature (the queue must not keep a
    real array alive), everything else as it is."""
    if type(a) is np.ndarray:
        return _ArraySpec(_signature(a))
    if isinstance(a, list):
        return [_spec(x) for x in a]
    if isinstance(a, tuple):
        return tuple(_spec(x) for x in a)
    if isinstance(a, dict):
        return {k: _spec(v) for k, v in a.items()}
    return a


def _stand_in(spec):
    """A tiny array numba types as the one `spec` describes (numba: dtype, ndim, layout
    "C" if C-contiguous, else "F" if F-contiguous, else "A", and read-only or not). Every
    dim is 2, in every stand-in of a call, so their shapes broadcast together as the real
    ones did whatever the layout (a size-1 dim would make any array contiguous); "A" is a
    stride-0 view of one element, as a broadcast mask is. Integers and bools are 0 (an index
    0 is always in range), floats 1. No RNG is drawn; at most 2**ndim elements."""
    if isinstance(spec, _ArraySpec):
        dtype, ndim, c, f, writeable = spec
        fill = np.zeros if dtype.kind in "biu" else np.ones
        shape = (2,) * ndim
        if not (c or f):
            return np.lib.stride_tricks.as_strided(fill(1, dtype), shape, (0,) * ndim,
                                                   writeable=writeable)
        a = fill(shape, dtype) if c else np.asfortranarray(fill(shape, dtype))
        a.setflags(write=writeable)
        return a
    if isinstance(spec, list):
        return [_stand_in(x) for x in spec]
    if isinstance(spec, tuple):
        return tuple(_stand_in(x) for x in spec)
    if isinstance(spec, dict):
        return {k: _stand_in(v) for k, v in spec.items()}
    return spec


def _encode(spec):
    """A queued call as JSON for the worker process; TypeError for what JSON cannot carry
    (that call compiles in this process)."""
    if isinstance(spec, _ArraySpec):
        dtype, ndim, c, f, writeable = spec
        return {"array": [dtype.str, ndim, c, f, writeable]}
    if isinstance(spec, tuple):
        return {"tuple": [_encode(x) for x in spec]}
    if isinstance(spec, list):
        return {"list": [_encode(x) for x in spec]}
    if isinstance(spec, dict) and all(type(k) is str for k in spec):
        return {"dict": [[k, _encode(v)] for k, v in spec.items()]}
    if isinstance(spec, np.generic) and spec.dtype.kind in "biuf":
        return {"scalar": [spec.dtype.str, spec.item()]}
    if spec is None or type(spec) in (bool, int, float, str):
        return spec
    raise TypeError(f"kernel compiler: cannot send {type(spec).__name__} to the worker")


def _decode(obj):
    """_encode's inverse, in the worker."""
    if not isinstance(obj, dict):
        return obj
    (tag, value), = obj.items()
    if tag == "array":
        dtype, *rest = value
        return _ArraySpec((np.dtype(dtype), *rest))
    if tag == "tuple":
        return tuple(_decode(x) for x in value)
    if tag == "list":
        return [_decode(x) for x in value]
    if tag == "dict":
        return {k: _decode(v) for k, v in value}
    dtype, v = value  # "scalar"
    return np.dtype(dtype).type(v)


def first_call(key, name: str, args: tuple, kwargs: dict):
    """A call in "auto" whose key is not ready. Where numba's on-disk cache has the kernel
    (every process after the first), it loads here, in milliseconds, and runs compiled: a
    warm process takes the compiled path from its first call, the same path every run.
    Otherwise (a cache miss, found once per key; compiler_paused() holding; the compiler's
    lock taken) NotImplemented, the reference runs, and the key is queued."""
    if not _bg["paused"] and key not in _bg["missed"]:
        compiled = chooser._auto_compiled()
        if compiled is None:
            return NotImplemented
        fast = getattr(compiled, name, None)
        if fast is not None:
            try:
                with compiled.cache_only():
                    out = chooser._try_launch(fast, *args, **kwargs)
            except compiled.NotCached:
                _bg["missed"].add(key)
            else:
                if out is not NotImplemented:
                    _bg["ready"].add(key)
                    return out
                if chooser._state["refused"] is not None:  # forked: no load will come
                    _bg["missed"].add(key)
    with _bg["cond"]:
        if key not in _bg["queued"] and key not in _bg["ready"] and not _bg["closed"]:
            _bg["queued"].add(key)
            _bg["queue"].append((key, _spec((args, kwargs))))
            if _bg["thread"] is None:
                _bg["thread"] = threading.Thread(target=_compile_loop, daemon=True,
                                                 name="tinygrad_attn kernel compiler")
                _bg["thread"].start()
            _bg["cond"].notify_all()
    return NotImplemented


def _compile_loop() -> None:
    cond = _bg["cond"]
    while True:
        with cond:
            while not _bg["queue"]:
                if _bg["busy"]:
                    _bg["busy"] = False
                    cond.notify_all()
                if not cond.wait(WORKER_IDLE_S) and not _bg["queue"]:
                    _stop_worker()
            key, spec = _bg["queue"].popleft()
            _bg["busy"] = True
        _compile_one(key, spec)
        with cond:
            _bg["ready"].add(key)
            _bg["queued"].discard(key)


def _compile_one(key, spec) -> None:
    """Make kernel key[0] ready for the queued types: load it here from numba's cache if it
    is there (a warm start: no worker); if not, compile it in the worker process, then make
    the same stand-in call here, holding the launch lock, which loads what the worker
    compiled (or compiles here, where the worker could not). A stand-in call that fails or
    declines is recorded in _bg["failed"]; the key is marked ready anyway, and its first
    real call compiles in the caller's thread. Nothing here while compiler_paused() holds."""
    if key in _bg["ready"]:  # a call in another thread loaded it meanwhile
        return
    if _stand_in_call(key, spec, cache_only=True):
        return
    _spare_a_cpu(True)  # a compile, here or in the worker, takes a core for seconds
    try:
        answer = _compile_in_worker(key[0], spec)
        _bg["compiling_here"] = answer != "ok"  # the stand-in call below compiles
        _stand_in_call(key, spec, cache_only=False)
    finally:
        _bg["compiling_here"] = False
        _spare_a_cpu(False)


def _spare_a_cpu(spare: bool) -> None:
    """OpenBLAS on one thread fewer while a compile runs (threads.spare_one_cpu)."""
    _bg["spared"] = spare
    threads.spare_one_cpu(spare)


def _stand_in_call(key, spec, cache_only: bool) -> bool:
    """Call kernel key[0] on stand-ins here, holding the launch lock (waiting while paused:
    a key queued during a raw profile is looked for in the cache once it ends, and needs no
    worker if it is there); with cache_only, False where it would have had to compile."""
    while True:
        with chooser._state["launch"], _bg["compiling"]:
            if _bg["closed"]:
                return True
            if not _bg["paused"]:
                compiled = chooser._auto_compiled()
                if compiled is None:  # "auto" runs the reference from now on
                    _bg["failed"][key] = chooser._state["auto_off"]
                    return True
                try:
                    fast = getattr(compiled, key[0])
                    threads.sync_compiled()
                    args, kwargs = _stand_in(spec)
                    with compiled.cache_only() if cache_only else contextlib.nullcontext():
                        if fast(*args, **kwargs) is NotImplemented:
                            _bg["failed"][key] = "declined"
                except compiled.NotCached:
                    return False
                except Exception as e:  # noqa: BLE001 - the real call will meet it
                    _bg["failed"][key] = repr(e)
                return True
        with _bg["cond"]:
            _bg["cond"].wait_for(lambda: not _bg["paused"] or _bg["closed"])


# The worker: `python -c _WORKER ROOT`, reading one JSON call per line, answering each.
# Its stdout is the answers only; whatever else writes to fd 1 goes to its stderr.
_WORKER = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
from tinygrad_attn.backend.kernels import _load_compiled, background
compiled = _load_compiled()
for line in sys.stdin:
    msg = json.loads(line)
    try:
        args, kwargs = background._stand_in(background._decode(msg["call"]))
        out = getattr(compiled, msg["name"])(*args, **kwargs)
        result = "declined" if out is NotImplemented else "ok"
    except Exception as e:
        result = "error: " + repr(e)
    answers.write(json.dumps({"result": result}) + "\\n")
    answers.flush()
"""


def _compile_in_worker(name: str, spec) -> str | None:
    """Compile `name` for the queued types in the worker process, started on first use;
    its answer ("ok", "declined", "error: ..."), or None where no worker could do it."""
    try:
        line = json.dumps({"name": name, "call": _encode(spec)}) + "\n"
    except (TypeError, ValueError):
        return None
    worker = _bg["worker"] or _start_worker()
    if worker is None:
        return None
    try:  # raw file descriptors: a buffered pipe's lock, held here, would be held forever
        os.write(worker.stdin.fileno(), line.encode())  # in a child forked meanwhile
        answer, deadline = b"", time.monotonic() + WORKER_TIMEOUT_S
        while not answer.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([worker.stdout], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(worker.stdout.fileno(), 4096)
            if not chunk:
                raise EOFError
            answer += chunk
        return json.loads(answer)["result"]
    except TimeoutError:  # hung: killed, and the thread compiles from now on
        why = f"the worker process did not answer in {WORKER_TIMEOUT_S:g} s"
    except (OSError, EOFError, ValueError, KeyError):  # it died (or was stopped at exit)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(5)
        why = f"the worker process ended (exit code {worker.poll()})"
    with _bg["cond"]:
        if not _bg["closed"]:
            _bg["no_worker"] = why
        _stop_worker()
    return None


def _start_worker():
    if _bg["no_worker"] is not None or _bg["closed"]:
        return None
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    try:
        worker = subprocess.Popen([sys.executable, "-c", _WORKER, root], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, bufsize=0)
    except (OSError, ValueError) as e:
        _bg["no_worker"] = f"could not start the worker process: {e!r}"
        return None
    _bg["worker"] = worker
    return worker


def _stop_worker() -> None:
    """End the worker (it may be compiling: numba writes its cache files whole, by
    rename, so a kill leaves the cache as it was)."""
    worker, _bg["worker"] = _bg["worker"], None
    if worker is not None:
        with contextlib.suppress(OSError):
            worker.stdin.close()
        worker.kill()
        worker.wait()


def wait_compiled(timeout: float | None = None) -> bool:
    """Wait until the background compiler has compiled everything queued ("auto" mode);
    True when the queue is empty, False if `timeout` seconds passed first."""
    with _bg["cond"]:
        return _bg["cond"].wait_for(lambda: not _bg["queue"] and not _bg["busy"], timeout)


@contextlib.contextmanager
def compiler_paused():
    """Inside: no kernel loads or compiles in this process ("auto" calls whose kernel is not
    ready run the reference and queue it; a load or compile in flight here finishes first;
    the worker finishes a compile in flight but is given nothing new). For a raw memory
    profile: tracemalloc traces every thread's allocations, and a kernel's loading or
    compiling allocates megabytes of Python objects."""
    with _bg["compiling"]:
        _bg["paused"] += 1
    try:
        yield
    finally:
        with _bg["cond"]:
            _bg["paused"] -= 1
            _bg["cond"].notify_all()


def _at_exit() -> None:
    """Drop what is queued, stop the worker and let the load in flight end: numba must not
    be compiling in a daemon thread while the interpreter shuts down."""
    with _bg["cond"]:
        _bg["closed"] = True
        _bg["queue"].clear()
        _bg["cond"].notify_all()
    _stop_worker()
    with _bg["compiling"]:
        pass


# ----------------------------------------------------------------------------- fork
# A fork copies only the thread that calls it; a lock another thread holds at that moment
# stays held in the child, forever. Which locks matter: the kernel lock and the compiler's
# queue (ours: made afresh in the child); numba's compiler lock, held while a kernel
# compiles (seconds) or loads from the cache, by the caller's thread ("numba" mode, and
# "auto"'s first calls) or by the compiler thread; numba's threading-layer lock, held while
# its pool starts; and our loading lock, held while numba imports. A fork must not wait for
# them (a compile takes seconds, and a lock is not fair: the compiler thread took it again
# for its next kernel before a waiting fork woke, and a fork waited 75 s), so each is taken
# if it is free at that moment and held over the fork, which makes the child's copy
# consistent; one that another thread holds makes the child refuse what needs it.
_fork: dict = {"held": [], "busy": []}


def _fork_locks() -> list:
    locks = [("loading", chooser._state["loading"])]
    if chooser._state["compiled"] is not None:
        locks += chooser._state["compiled"].fork_locks()
    return [(name, lock) for name, lock in locks if lock is not None]


def _before_fork() -> None:
    held, busy = [], []
    for name, lock in _fork_locks():
        if lock.acquire(blocking=False):
            held.append(lock)
        else:
            busy.append(name)
    _fork["held"], _fork["busy"] = held, busy


def _after_fork_in_parent() -> None:
    for lock in reversed(_fork["held"]):
        lock.release()
    _fork["held"] = []


def _after_fork_in_child() -> None:
    # the locks held over the fork belong to this thread, here as in the parent; the
    # compiler thread does not exist here: fresh locks and queue (compiled kernels stay
    # ready); the parent's worker is the parent's: its pipes are closed here, unused
    state = chooser._state
    for lock in reversed(_fork["held"]):
        lock.release()
    _fork["held"] = []
    state["launch"] = threading.RLock()
    if _bg["spared"]:
        _spare_a_cpu(False)
    worker = _bg["worker"]
    if worker is not None:
        worker.stdin.close()
        worker.stdout.close()
    _fresh_queue()
    busy = _fork["busy"]
    if "loading" in busy or "threading layer" in busy:
        # numba half imported, or its pool half started: no compiled kernel can run here
        what = "importing numba" if "loading" in busy else "starting numba's thread pool"
        state["forked_off"] = (f"this process was forked while another thread was {what}, "
                               "so the compiled kernels cannot run in it")
        state["mode"] = "numpy"
        _bg["closed"] = True
        warnings.warn(f"tinygrad_attn: {state['forked_off']}; the NumPy reference kernels "
                      "run instead", RuntimeWarning, stacklevel=1)
    elif "compiler" in busy:
        # the kernels compiled before the fork run; one that would compile or load refuses
        state["refused"] = ("this process was forked while another thread was compiling a "
                            "kernel, so kernels not compiled before the fork cannot be "
                            "compiled in it")
        state["compiled"].refuse_compiles(state["refused"])
        _bg["closed"] = True  # nothing queued here could be loaded


atexit.register(_at_exit)
os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


