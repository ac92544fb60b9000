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
                  argument types; until it is, the reference runs and the background
                  compiler (background.py) compiles it.

The mode comes from the environment variable TINYGRAD_ATTN_KERNELS (auto, numba, numpy) at
import, and from `set_kernels(mode)` at run time. `calls` counts, per (kernel, path), the
calls made, so a test can check which path ran. docs/kernels.md has the design and the
measurements.

Compiled kernels run one at a time, under a lock: numba's "workqueue" threading layer
aborts the process when two Python threads launch parallel kernels at once, and a kernel
holding the GIL does not prevent that. Each thread's first compiled call also gives numba
the engine's thread count, which numba keeps per thread (threads.py).

A kernel in "auto" that is not compiled yet for the call's argument types runs the
reference while background.py compiles it, in a worker process, and loads it here;
`wait_compiled()` and `compiler_paused()` come from there. "numba" mode compiles in the
calling thread.
"""

from __future__ import annotations

import collections
import importlib
import importlib.util
import os
import threading
import warnings

import numpy as np

from .. import threads
from . import background, reference
from .background import compiler_paused, wait_compiled  # noqa: F401 - public here

MODES = ("auto", "numba", "numpy")
ENV = "TINYGRAD_ATTN_KERNELS"
AUTO_MIN_SIZE = 16384  # elements of the first operand; below it "auto" runs the reference
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

calls: collections.Counter = collections.Counter()  # (kernel name, "numba" | "numpy") -> n

# mode; the compiled package once loaded; why "auto" or a forked child runs the reference
# (auto_off, forked_off, refused: background.py's fork handling sets the last two)
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
        except _state["compiled"].CompileRefused:  # forked mid-compile (background.py)
            return _refused()


def _try_launch(fast, *args, **kwargs):
    """_launch for "auto": NotImplemented (the reference runs) instead of waiting while the
    background compiler holds the lock to compile in this process (seconds); another
    kernel's launch, or the compiler's loading from the cache, is short, and waited for
    (so that which path a call takes does not depend on the timing of a load)."""
    lock = _state["launch"]
    if not lock.acquire(blocking=False):
        while True:
            if background.compiling_here():
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
        key = background.key(name, args, kwargs)
        if not background.is_ready(key):
            return background.first_call(key, name, args, kwargs)
    fast = getattr(_load_compiled(), name, None)
    if fast is None:
        return NotImplemented
    return (_try_launch if auto else _launch)(fast, *args, **kwargs)


def _refused():
    """A kernel refused to compile (a child forked mid-compile, background.py): said once,
    the reference runs."""
    if _state["refused"]:
        warnings.warn(f"tinygrad_attn: {_state['refused']}; those run the NumPy reference "
                      "kernels", RuntimeWarning, stacklevel=3)
        _state["refused"] = ""  # warned; still refusing
    return NotImplemented


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
causal_softmax_block = _kernel("causal_softmax_block", 2)  # writes P's block in place
causal_softmax_block_backward = _kernel("causal_softmax_block_backward", 2)

# ----------------------------------------------------------------------------- attention
# (the blocked attention's tiles: keep and add, the mask, are checked inside)
attention_block_forward = _kernel("attention_block_forward", 4)
attention_block_probs = _kernel("attention_block_probs", 2)
attention_block_dscores = _kernel("attention_block_dscores", 3)

# ----------------------------------------------------------------------------- norms, loss
layer_norm_forward = _kernel("layer_norm_forward", 3)
layer_norm_backward = _kernel("layer_norm_backward", 4)
add_layer_norm_forward = _kernel("add_layer_norm_forward", 4)
add_layer_norm_backward = _kernel("add_layer_norm_backward", 5)  # gs may be None
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

