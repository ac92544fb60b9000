"""The kernel layer: which implementation of a fused kernel runs, chosen per call.

Two modules hold kernels of the same names and signatures:

    reference  NumPy (and CuPy through the same array expressions): short, commented, the
               formula visible. The one a reader studies, and the one that always works.
    compiled/  numba: the same kernels compiled, fused into one pass each way and run over
               all cores. The only package in the project that imports numba, and only when a
               kernel first needs it (`pip install 'tinygrad_attn[fast]'` installs it).

The autograd Functions do not know which one runs: they call `backend.kernels.NAME(...)`
and this module picks. The choice, per call:

    mode "numpy"  the reference, always.
    mode "numba"  the compiled kernel wherever its operands allow it (NumPy arrays, float32
                  or float64, C-contiguous; a kernel may decline other cases), at any size;
                  numba must be installed. The test suite runs its rows this way.
    mode "auto"   (the default) as "numba" when numba is installed, the first operand has
                  at least AUTO_MIN_SIZE elements (below that, calling into compiled code
                  costs more than it saves) and the kernel is compiled for the call's
                  argument types; until it is, the reference runs and a background thread
                  compiles it (see "Compiling in the background" below).

The mode comes from the environment variable TINYGRAD_ATTN_KERNELS (auto, numba, numpy) at
import, and from `set_kernels(mode)` at run time. `calls` counts, per (kernel, path), the
calls made, so a test can check which path ran. docs/kernels.md has the design and the
measurements.

Compiled kernels run one at a time, under a lock: numba's "workqueue" threading layer
aborts the process when two Python threads launch parallel kernels at once, and a kernel
holding the GIL does not prevent that. Each thread's first compiled call also gives numba
the engine's thread count, which numba keeps per thread (threads.py).

Compiling in the background ("auto" only). numba compiles a kernel on its first call for
each set of argument types, seconds per kernel, and a training run's first step met them
all at once. In "auto" the first call of each key (kernel and argument types) looks in
numba's on-disk cache, without compiling: a hit loads the kernel in milliseconds and runs
it, so every process after the first takes the compiled path from its first call, the
same path in every run. A miss runs the reference and queues the key's types (never its
arrays). One daemon thread takes the queue: it hands each entry to a worker process, which
compiles the kernel by calling it on tiny stand-in arrays of the same numba types and so
fills the cache; then the thread makes the same stand-in call here, holding the launch
lock, which loads it. numba's compiler is Python: in a thread of this process it would
hold the GIL for most of every second and slow the steps running beside it several times
over; in the worker it holds none of this process's locks and allocates none of its
memory. Where the worker cannot run (no interpreter to start, a crash, a hang) the thread
compiles here instead; a call in "auto" that finds the launch lock taken for that runs the
reference rather than wait (a load from the cache, short, is waited for). OpenBLAS spares
the compiler a CPU only while it compiles. `wait_compiled()` waits for the queue to empty;
`compiler_paused()` holds the compiler back, here and in the thread, while a raw memory
profile traces every thread's allocations. "numba" mode compiles in the calling thread, as
before.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import importlib
import importlib.util
import json
import os
import select
import subprocess
import sys
import threading
import time
import warnings

import numpy as np

from .. import threads
from . import reference

MODES = ("auto", "numba", "numpy")
ENV = "TINYGRAD_ATTN_KERNELS"
AUTO_MIN_SIZE = 16384  # elements of the first operand; below it "auto" runs the reference
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

calls: collections.Counter = collections.Counter()  # (kernel name, "numba" | "numpy") -> n

_state = {"mode": "auto", "compiled": None, "auto_off": None, "forked_off": None,
          "refused": None}
_state["launch"] = threading.RLock()  # one compiled kernel at a time (see the docstring)
_state["loading"] = threading.RLock()  # held while the compiled package (numba) imports


def _check_mode(mode, where: str) -> str:
    if mode not in MODES:
        raise ValueError(f"{where}: kernels must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def numba_available() -> bool:
    """Whether numba can be imported (without importing it)."""
    return importlib.util.find_spec("numba") is not None


def _load_compiled():
    """The compiled package, imported on first use (this is when numba is imported), under
    the loading lock, so that a fork can tell whether a thread is importing it."""
    if _state["compiled"] is None:
        with _state["loading"]:
            if _state["compiled"] is None:
                module = importlib.import_module(".compiled", __name__)
                threads.apply_to_compiled(module)  # its pool follows the engine's count
                _state["compiled"] = module
    return _state["compiled"]


def _auto_compiled():
    """_load_compiled for "auto": None where the compiled package cannot load (numba is
    installed but does not import, say it does not support this NumPy). "auto" then runs the
    reference from here on, after one warning; "numba" mode raises the error instead."""
    if _state["auto_off"] is None:
        try:
            return _load_compiled()
        except Exception as e:  # noqa: BLE001 - any import failure: the reference runs
            _state["auto_off"] = f"{type(e).__name__}: {e}"
            warnings.warn(f"tinygrad_attn: the compiled kernels could not load "
                          f"({_state['auto_off']}); kernels 'auto' runs the NumPy "
                          "reference kernels", RuntimeWarning, stacklevel=2)
    return None


def set_kernels(mode: str) -> None:
    """Choose the kernels: "auto" (default), "numba" or "numpy" (the reference).

    "numba" without numba installed raises ImportError and leaves the mode as it was."""
    _check_mode(mode, "set_kernels")
    if mode != "numpy" and _state["forked_off"] is not None:
        raise RuntimeError(f"set_kernels({mode!r}): {_state['forked_off']}; only 'numpy' "
                           "runs in this process")
    if mode == "numba" and not numba_available():
        raise ImportError("set_kernels: 'numba' needs numba; install the fast extra: "
                          "pip install 'tinygrad_attn[fast]'")
    _state["mode"] = mode


def get_kernels() -> str:
    """The mode set: "auto", "numba" or "numpy"."""
    return _state["mode"]


def _from_env() -> None:
    mode = os.environ.get(ENV, "auto").strip().lower() or "auto"
    _check_mode(mode, f"environment variable {ENV}")
    if mode == "numba" and not numba_available():
        raise ImportError(f"{ENV}=numba needs numba; install the fast extra: "
                          "pip install 'tinygrad_attn[fast]'")
    _state["mode"] = mode


_from_env()


def _compilable(operands) -> bool:
    """NumPy float32/float64 arrays of one dtype, C-contiguous (None operands skipped)."""
    dtype = None
    for a in operands:
        if a is None:
            continue
        if type(a) is not np.ndarray or not a.flags.c_contiguous:
            return False
        if dtype is None:
            if a.dtype not in FLOAT_DTYPES:
                return False
            dtype = a.dtype
        elif a.dtype != dtype:
            return False
    return dtype is not None


def _use_compiled(operands) -> bool:
    mode = _state["mode"]
    if mode == "numpy" or not _compilable(operands):
        return False
    if mode == "auto":
        if (operands[0] is None or operands[0].size < AUTO_MIN_SIZE
                or not numba_available() or _state["auto_off"] is not None):
            return False
    return True


def _launch(fast, *args, **kwargs):
    """Run a compiled kernel: under the one lock (the workqueue layer aborts on two threads
    launching at once) and on this thread's share of the engine's thread count."""
    with _state["launch"]:
        threads.sync_compiled()
        try:
            return fast(*args, **kwargs)
        except _state["compiled"].CompileRefused:  # a child forked mid-compile (below)
            return _refused()


def _try_launch(fast, *args, **kwargs):
    """_launch for "auto": NotImplemented (the reference runs) instead of waiting while the
    background compiler holds the lock to compile in this process (seconds); another
    kernel's launch, or the compiler's loading from the cache, is short, and waited for
    (so that which path a call takes does not depend on the timing of a load)."""
    lock = _state["launch"]
    if not lock.acquire(blocking=False):
        while True:
            if _bg["compiling_here"]:
                return NotImplemented
            if lock.acquire(timeout=0.002):
                break
    try:
        threads.sync_compiled()
        return fast(*args, **kwargs)
    except _state["compiled"].CompileRefused:
        return _refused()
    finally:
        lock.release()


def _compiled_call(name: str, args: tuple, kwargs: dict):
    """The compiled `name` on the arguments, or NotImplemented where the reference runs: it
    declined, it does not exist, or ("auto") it is not compiled for these types yet."""
    auto = _state["mode"] == "auto"
    if auto:
        key = (name, _signature(args), _signature(tuple(sorted(kwargs.items()))))
        if key not in _bg["ready"]:
            return _first_call(key, name, args, kwargs)
    fast = getattr(_load_compiled(), name, None)
    if fast is None:
        return NotImplemented
    return (_try_launch if auto else _launch)(fast, *args, **kwargs)


# ------------------------------------------------------------------- background compiling
# "auto" runs a compiled kernel only once it is ready for the call's argument types: loaded
# from numba's cache by the first call, or compiled in the worker process for one daemon
# thread, which then loads it (docs/kernels.md, "Compiling in the background").
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


def _first_call(key, name: str, args: tuple, kwargs: dict):
    """A call in "auto" whose key is not ready. Where numba's on-disk cache has the kernel
    (every process after the first), it loads here, in milliseconds, and runs compiled: a
    warm process takes the compiled path from its first call, the same path every run.
    Otherwise (a cache miss, found once per key; compiler_paused() holding; the compiler's
    lock taken) NotImplemented, the reference runs, and the key is queued."""
    if not _bg["paused"] and key not in _bg["missed"]:
        compiled = _auto_compiled()
        if compiled is None:
            return NotImplemented
        fast = getattr(compiled, name, None)
        if fast is not None:
            try:
                with compiled.cache_only():
                    out = _try_launch(fast, *args, **kwargs)
            except compiled.NotCached:
                _bg["missed"].add(key)
            else:
                if out is not NotImplemented:
                    _bg["ready"].add(key)
                    return out
                if _state["refused"] is not None:  # a forked child: no load will come
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
        with _state["launch"], _bg["compiling"]:
            if _bg["closed"]:
                return True
            if not _bg["paused"]:
                compiled = _auto_compiled()
                if compiled is None:  # "auto" runs the reference from now on
                    _bg["failed"][key] = _state["auto_off"]
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


# The worker: `python -c WORKER ROOT`, reading one JSON call per line, answering each.
# Its stdout is the answers only; whatever else writes to fd 1 goes to its stderr.
_WORKER = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
from tinygrad_attn.backend import kernels
compiled = kernels._load_compiled()
for line in sys.stdin:
    msg = json.loads(line)
    try:
        args, kwargs = kernels._stand_in(kernels._decode(msg["call"]))
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
    locks = [("loading", _state["loading"])]
    if _state["compiled"] is not None:
        locks += _state["compiled"].fork_locks()
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
    for lock in reversed(_fork["held"]):
        lock.release()
    _fork["held"] = []
    _state["launch"] = threading.RLock()
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
        _state["forked_off"] = (f"this process was forked while another thread was {what}, "
                                "so the compiled kernels cannot run in it")
        _state["mode"] = "numpy"
        _bg["closed"] = True
        warnings.warn(f"tinygrad_attn: {_state['forked_off']}; the NumPy reference kernels "
                      "run instead", RuntimeWarning, stacklevel=1)
    elif "compiler" in busy:
        # the kernels compiled before the fork run; one that would compile or load refuses
        _state["refused"] = ("this process was forked while another thread was compiling a "
                             "kernel, so kernels not compiled before the fork cannot be "
                             "compiled in it")
        _state["compiled"].refuse_compiles(_state["refused"])
        _bg["closed"] = True  # nothing queued here could be loaded


def _refused():
    """A kernel refused to compile (a child forked mid-compile): said once, the reference
    runs."""
    if _state["refused"]:
        warnings.warn(f"tinygrad_attn: {_state['refused']}; those run the NumPy reference "
                      "kernels", RuntimeWarning, stacklevel=3)
        _state["refused"] = ""  # warned; still refusing
    return NotImplemented


atexit.register(_at_exit)
os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


def _kernel(name: str, n_float: int):
    """The public function for kernel `name`: its first `n_float` positional operands are
    the float arrays the choice looks at; a compiled kernel that returns NotImplemented
    declines the call and the reference runs."""
    ref = getattr(reference, name)

    def call(*args, **kwargs):
        if _use_compiled(args[:n_float]):
            out = _compiled_call(name, args, kwargs)
            if out is not NotImplemented:
                calls[name, "numba"] += 1
                return out
        calls[name, "numpy"] += 1
        return ref(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = ref.__doc__
    call.__wrapped__ = ref
    return call


# Kernels with one implementation (no compiled twin): called straight.
scatter_add = reference.scatter_add
index_add = reference.index_add
masked_fill = reference.masked_fill
erf = reference.erf
gelu_cdf = reference.gelu_cdf

# ----------------------------------------------------------------------------- activations
gelu_forward = _kernel("gelu_forward", 1)
gelu_backward = _kernel("gelu_backward", 2)
gelu_tanh_forward = _kernel("gelu_tanh_forward", 1)
gelu_tanh_backward = _kernel("gelu_tanh_backward", 2)
bias_gelu_forward = _kernel("bias_gelu_forward", 2)
bias_gelu_backward = _kernel("bias_gelu_backward", 3)
dropout_forward = _kernel("dropout_forward", 1)  # u is float32 whatever x is: checked there
dropout_backward = _kernel("dropout_backward", 1)  # keep is bool: checked there

# ----------------------------------------------------------------------------- softmax
softmax_forward = _kernel("softmax_forward", 1)
softmax_backward = _kernel("softmax_backward", 2)
log_softmax_forward = _kernel("log_softmax_forward", 1)
log_softmax_backward = _kernel("log_softmax_backward", 2)
masked_softmax_forward = _kernel("masked_softmax_forward", 1)  # the mask: checked inside
masked_softmax_backward = _kernel("masked_softmax_backward", 2)

# ----------------------------------------------------------------------------- attention
# (the blocked attention's tiles: keep and add, the mask, are checked inside)
attention_block_forward = _kernel("attention_block_forward", 4)
attention_block_probs = _kernel("attention_block_probs", 2)
attention_block_dscores = _kernel("attention_block_dscores", 3)

# ----------------------------------------------------------------------------- norms, loss
layer_norm_forward = _kernel("layer_norm_forward", 3)
layer_norm_backward = _kernel("layer_norm_backward", 4)
rms_norm_forward = _kernel("rms_norm_forward", 2)
rms_norm_backward = _kernel("rms_norm_backward", 4)
cross_entropy_forward = _kernel("cross_entropy_forward", 1)
cross_entropy_backward = _kernel("cross_entropy_backward", 2)

# ------------------------------------------------------------------------- optimizer, reductions
adamw_update = _kernel("adamw_update", 4)


def adamw_update_many(params, grads, exp_avgs, exp_avg_sqs, lr, beta1, beta2, eps,
                      weight_decay, step) -> None:
    """adamw_update on each (p, g, m, v) of four equal-length lists of arrays.

    The compiled kernel updates all the quadruples it takes (C-contiguous, one float dtype)
    in one parallel pass: one launch of the thread pool for a whole parameter group instead
    of one per parameter (a launch costs more than a bias's update). In "auto" mode the
    group's total size, not each array's, is held against AUTO_MIN_SIZE, and a group whose
    argument types are not compiled yet runs the reference while they compile. Quadruples
    it does not take run through the reference, one by one. The caller guarantees that no written
    array (p, m, v) shares memory with another operand."""
    quads = list(zip(params, grads, exp_avgs, exp_avg_sqs))
    args = (lr, beta1, beta2, eps, weight_decay, step)
    rest = quads
    mode = _state["mode"]
    if mode != "numpy" and numba_available() and (mode != "auto"
                                                  or _state["auto_off"] is None):
        fast = [q for q in quads if _compilable(q)]
        dtypes = {q[0].dtype for q in fast}
        if mode == "auto" and sum(q[0].size for q in fast) < AUTO_MIN_SIZE:
            fast = []
        for dtype in dtypes if fast else ():
            same = [q for q in fast if q[0].dtype == dtype]
            if _compiled_call("adamw_update_many", (*zip(*same), *args), {}) \
                    is NotImplemented:
                continue
            calls["adamw_update_many", "numba"] += 1
            done = {id(q) for q in same}
            rest = [q for q in rest if id(q) not in done]
    if rest:
        calls["adamw_update_many", "numpy"] += 1
        reference.adamw_update_many(*zip(*rest), *args)

