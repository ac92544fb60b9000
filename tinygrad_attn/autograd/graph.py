"""The backward graph: what forward records for the engine to run later.

`Function.apply` runs an op's forward without recording, then, if any input needs a
gradient, makes `ctx` the graph node of the outputs: `ctx.fn` is the op,
`ctx.next_functions` the edges to the nodes that produced the inputs, and
`ctx.saved_tensors` what forward chose to keep, each checked against its version counter
when read. Leaves that require grad get an `AccumulateGrad` node, as in PyTorch.

Grad mode and the ledger's labels are per thread, as in PyTorch: `no_grad` / `enable_grad`
/ `set_grad_enabled` change the calling thread's mode only, a new thread starts with grad
enabled, and `_relabel` / `_restore` set this thread's labels (op, call, scope) and mode
while an op runs (the engine's other labels go through the ledger's own
`memory.state.labelled`). A child made by fork keeps the mode of the thread that forked.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
import weakref

from ..backend.dtypes import quiet_fp_errors, restore_fp_errors
from ..memory import state as ledger_state
from ..tensor import Tensor, _make

_seq = itertools.count()
_backward_names: dict = {}  # Function class -> its nodes' name ("AddBackward")


# ----------------------------------------------------------------------------- grad mode
class _GradMode(threading.local):
    """Whether ops record a graph, per thread: `GradMode.enabled`. The class attribute is
    what a thread sees until it sets its own, so every new thread starts with grad enabled
    (as in PyTorch) whatever the thread that made it had."""

    enabled = True


GradMode = _GradMode()


class _Recording(threading.local):
    """Whether this thread is inside a backward run with create_graph=True (`on`), where an
    op's backward sees its gradients and saved tensors as `Recorded` proxies."""

    on = False


recording_state = _Recording()


def recording() -> bool:
    """True inside a backward that records a graph for the next derivative
    (create_graph=True). A backward with a compiled-kernel fast path takes its formula
    (written in the NumPy API) instead when this is true."""
    return recording_state.on


class _GradModeContext:
    _target = True
    _takes_no_arguments = False  # no_grad, enable_grad: also a bare decorator (@no_grad)

    def __new__(cls, *args):
        if cls._takes_no_arguments and args:
            if len(args) == 1 and callable(args[0]):
                return cls()(args[0])
            raise TypeError(f"{cls.__name__}() takes no arguments")
        return super().__new__(cls)

    def __enter__(self):
        self._prev = GradMode.enabled
        GradMode.enabled = self._target

    def __exit__(self, *exc):
        GradMode.enabled = self._prev

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_GradModeContext):
    """Context manager / decorator: ops run without recording a graph (nothing is saved)."""

    _target = False
    _takes_no_arguments = True


class enable_grad(_GradModeContext):
    """Context manager / decorator: turn recording back on inside a no_grad region."""

    _target = True
    _takes_no_arguments = True


class set_grad_enabled(_GradModeContext):
    def __init__(self, mode: bool):
        self._target = bool(mode)

    def __call__(self, fn):  # pragma: no cover - used as a context manager
        raise TypeError("set_grad_enabled is a context manager, not a decorator")


class _InferenceMode(threading.local):
    enabled = False


_inference = _InferenceMode()


class inference_mode(_GradModeContext):
    """Context manager / decorator (`@inference_mode`, `@inference_mode()`): torch's inference
    mode, which here is no_grad (the engine has no inference tensors, so nothing else
    changes); `inference_mode(False)` leaves grad mode as it is."""

    def __new__(cls, mode=True):
        if callable(mode):  # bare @inference_mode
            return cls()(mode)
        return super().__new__(cls)

    def __init__(self, mode: bool = True):
        self.mode = bool(mode)

    def __enter__(self):
        self._prev = GradMode.enabled, _inference.enabled
        if self.mode:
            GradMode.enabled, _inference.enabled = False, True

    def __exit__(self, *exc):
        GradMode.enabled, _inference.enabled = self._prev

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with inference_mode(self.mode):
                return fn(*args, **kwargs)

        return wrapper


def is_inference_mode_enabled() -> bool:
    return _inference.enabled


def is_grad_enabled() -> bool:
    return GradMode.enabled


def _relabel(grad_enabled: bool | None = None, **labels) -> tuple:
    """Set this thread's ledger labels (any of op, call, scope, phase: allocations carry them)
    and, if given, its grad mode; returns what `_restore` needs to put both back.
    The recorded backward calls the pair in a try/finally rather than a with-statement (its
    extra frames cost a tenth of a small op's overhead); Function.apply and the engine's
    plain node run write the same steps out in place. The labels are swapped, not edited
    (memory/state.py): the previous dict is put back as it was."""
    here, mode = ledger_state.local, GradMode
    prev = here.labels, mode.enabled
    here.labels = {**prev[0], **labels}
    if grad_enabled is not None:
        mode.enabled = grad_enabled
    return prev


def _restore(prev: tuple) -> None:
    ledger_state.local.labels, GradMode.enabled = prev


def _notify(event: str, *args) -> None:
    """Tell the observers (the memory ledger) that define `event`, one event at a time."""
    if not ledger_state.observers:
        return
    with ledger_state.observer_lock:
        for obs in tuple(ledger_state.observers):
            if hasattr(obs, event):
                getattr(obs, event)(*args)


# ----------------------------------------------------------------------------- nodes
class Node:
    """A node of the backward graph; for Function ops it is also the `ctx` forward saw."""

    # defaults shared by all nodes (a node is made for every op call; keep __init__ short)
    next_functions: tuple = ()
    needs_input_grad: tuple = ()
    _saved: list | None = ()
    _released = False
    seq = -1
    _pre_hooks: dict | None = None
    _outputs_meta: tuple = ()
    input_shapes: tuple = ()
    scope = ""  # the module scope the node was created in; its backward runs under it
    _retained: dict | None = None  # output_nr -> weakref of a tensor that retains its grad
    _materialize_grads: bool | None = None  # set_materialize_grads; None: the op's default
    _dirty: tuple = ()  # mark_dirty's tensors, until apply has wired them
    _non_differentiable: tuple = ()  # mark_non_differentiable's tensors, likewise

    def __init__(self, fn=None):
        self.fn = fn

    @property
    def name(self) -> str:
        fn = self.fn
        if fn is None:
            return type(self).__name__
        name = _backward_names.get(fn)  # made once per op: the engine labels every node run
        if name is None:
            name = _backward_names[fn] = f"{fn.__name__}Backward"
        return name

    def __repr__(self) -> str:
        return f"<{self.name}>"

    # -- what forward declares -----------------------------------------------------------
    def save_for_backward(self, *tensors) -> None:
        """Keep tensors for backward. Recorded with their storage's version counter.

        An output of an op under the "recompute" save policy (see ta.memory.save_policy)
        is kept as a recipe instead: the producing node, rebuilt from its own saved
        tensors when this node's backward reads it.
        """
        saved = []
        policies = ledger_state.policies
        for t in tensors:
            if t is None:
                saved.append(None)
                continue
            producer = t.grad_fn
            if (producer is not None and producer is not self and producer._saved
                    and producer.fn.policy is not None  # the usual op has none: no lookup
                    and policies.get(producer.fn.policy) == "recompute"
                    and t._output_nr == 0 and t._base is None):
                saved.append(_Recipe(producer, t))
                continue
            saved.append((t, t._storage.version))
        self._saved = saved

    def mark_dirty(self, *tensors) -> None:
        """Forward wrote these inputs in place and returns them (PyTorch's ctx.mark_dirty).

        Call it right after the write: the version counter each shares with its views moves
        on here, so a tensor saved before this call (an operand that may alias the written
        one) is checked against the values before the write, and one saved after it against
        the written values. apply then makes this node the returned tensor's grad_fn (its
        history now runs through the write) and marks views taken earlier as stale. While
        recording, a leaf that requires grad and a view are refused (after the version moved,
        as the memory did; the built-in in-place ops check before writing).
        """
        for t in tensors:
            t._storage.version += 1
        recording = any(self.needs_input_grad)
        for t in tensors:
            check_inplace(self.fn.__name__, t, recording)
        self._dirty = self._dirty + tensors

    def mark_non_differentiable(self, *outputs) -> None:
        """These outputs get no gradient (requires_grad False, no grad_fn); backward still
        receives one per output for them: zeros, or None without materialized grads."""
        self._non_differentiable = self._non_differentiable + outputs

    def set_materialize_grads(self, value: bool) -> None:
        """False: backward receives None (not zeros) for outputs that got no gradient."""
        self._materialize_grads = bool(value)

    @property
    def materialize_grads(self) -> bool:
        own = self._materialize_grads
        return self.fn.materialize_grads if own is None else own

    # -- what backward reads -------------------------------------------------------------
    @property
    def saved_tensors(self) -> tuple:
        if self._saved is None:
            raise RuntimeError(
                f"{self.name}: trying to backward through the graph a second time (or to read "
                "saved tensors after they were freed). Pass retain_graph=True to the first "
                "backward() if you need to run backward twice."
            )
        out = []
        for i, item in enumerate(self._saved):
            if item is None:
                out.append(None)
                continue
            if type(item) is _Recipe:
                out.append(item.rebuild(self.name, i))
                continue
            t, version = item
            if t._storage.version != version:
                raise RuntimeError(
                    f"{self.name}: one of the tensors needed for gradient computation has been "
                    f"modified by an in-place operation: saved tensor {i} of shape "
                    f"{tuple(t.shape)} is at version {t._storage.version}; expected version "
                    f"{version}. Use an out-of-place op (or clone() before the in-place one)."
                )
            out.append(t)
        if recording_state.on:
            return self._recorded_saved(out)
        return tuple(out)

    def _recorded_saved(self, tensors: list) -> tuple:
        """The saved tensors as a recorded backward sees them: proxies whose arrays record
        ops, and each saved output (kept detached, against a reference cycle) rejoined to
        this node, so that the next derivative flows through it."""
        outputs = getattr(self, "_saved_output_nrs", None) or {}
        out = []
        for i, t in enumerate(tensors):
            if t is None:
                out.append(None)
                continue
            item = self._saved[i]
            nr = outputs.get(i)
            if type(item) is _Recipe:
                t = _rejoined(t, item.producer, 0)
            elif nr is not None:
                t = _rejoined(t, self, nr)
            out.append(Recorded(t))
        return tuple(out)

    def saved_tensor_list(self) -> list:
        """The saved tensors as they are (no version check): for inspection and the ledger.
        Recipes hold no tensor of their own and are not listed."""
        if not self._saved:
            return []
        return [s[0] for s in self._saved if s is not None and type(s) is not _Recipe]

    def saved_bytes(self) -> int:
        """Bytes this node keeps alive, each storage counted once."""
        seen = {}
        for t in self.saved_tensor_list():
            seen[t._storage.id] = t._storage.nbytes
        return sum(seen.values())

    def release(self) -> None:
        """Free the saved tensors after this node's backward. A node that saved nothing has
        nothing to free and nothing a second backward could miss, so it stays runnable (as
        in PyTorch, where `(x + 1).sum()` may be run backward twice)."""
        if not self._saved:
            return
        _notify("on_release", self)
        self._saved = None
        self._released = True

    def register_prehook(self, output_nr: int, fn) -> _HookHandle:
        if self._pre_hooks is None:
            self._pre_hooks = {}
        hooks = self._pre_hooks.setdefault(output_nr, [])
        hooks.append(fn)
        return _HookHandle(hooks, fn)


def check_inplace(op: str, t: Tensor, recording: bool) -> None:
    """Refuse, while recording, to write into a leaf that requires grad (the value its
    gradient is for would be gone) or into a view (its base's history cannot be rewritten).
    With grad mode on, recording or not, refuse a view taken under no_grad of a tensor that
    requires grad (PyTorch's rule): the write would change that tensor behind its graph's
    back, and whether it should be recorded is ambiguous."""
    if GradMode.enabled and t._no_grad_view:
        raise RuntimeError(
            f"{op}: a view (shape {tuple(t.shape)}) was created in no_grad mode from a tensor "
            "that requires grad and is being modified in place with grad mode enabled; this "
            "is ambiguous and not allowed. Do the in-place op under ta.no_grad() as well, or "
            "take the view with grad mode on (or clone() it to write into a copy)"
        )
    if not recording:
        return
    if t.requires_grad and t.grad_fn is None:
        raise RuntimeError(
            f"{op}: a leaf tensor that requires grad (shape {tuple(t.shape)}) is being used "
            "in an in-place operation; do it under ta.no_grad() or on a copy"
        )
    base = t._base
    if base is not None and base.requires_grad and base.grad_fn is None:
        raise RuntimeError(
            f"{op}: a view (shape {tuple(t.shape)}) of a leaf tensor that requires grad is "
            "being used in an in-place operation; do it under ta.no_grad() or on a copy"
        )
    if base is not None:
        raise RuntimeError(
            f"{op}: in-place modification of a view (shape {tuple(t.shape)}) while recording "
            "gradients is not supported; write into the base tensor (base[index] = value) or "
            "use an out-of-place op"
        )


class _Recipe:
    """A saved output to rebuild in backward from the node that produced it."""

    __slots__ = ("producer", "storage", "version", "shape")

    def __init__(self, producer: Node, t: Tensor):
        self.producer = producer
        self.storage = weakref.ref(t._storage)  # only to notice in-place changes
        self.version = t._storage.version
        self.shape = t.shape

    def rebuild(self, consumer: str, index: int) -> Tensor:
        st = self.storage()
        if st is not None and st.version != self.version:
            raise RuntimeError(
                f"{consumer}: saved tensor {index} of shape {tuple(self.shape)} (kept as a "
                f"recipe of {self.producer.name}) was modified by an in-place operation"
            )
        if self.producer._saved is None:
            raise RuntimeError(
                f"{consumer}: saved tensor {index} is rebuilt from {self.producer.name}, whose "
                "saved tensors were already freed; use retain_graph=True"
            )
        with no_grad():
            if not ledger_state.op_observers:
                return self.producer.fn.recompute(self.producer)
            t0 = time.perf_counter()
            out = self.producer.fn.recompute(self.producer)
            phase = ledger_state.local.labels["phase"]
            _op_heard(self.producer.fn, self.producer, None, out, self.producer.scope, phase,
                      True, time.perf_counter() - t0)
            return out


class AccumulateGrad(Node):
    """The node of a leaf tensor: adds the incoming gradient into `variable.grad`."""

    def __init__(self, variable: Tensor):
        self.fn = None  # Node.__init__(None), written out
        self.variable = variable
        self.seq = next(_seq)

    @property
    def name(self) -> str:
        return "AccumulateGrad"


class _HookHandle:
    def __init__(self, hooks: list, fn):
        self._hooks, self._fn = hooks, fn

    def remove(self) -> None:
        if self._fn in self._hooks:
            self._hooks.remove(self._fn)


def _accumulator(t: Tensor) -> AccumulateGrad:
    acc = t._acc() if t._acc is not None else None
    if acc is None:
        acc = AccumulateGrad(t)
        t._acc = weakref.ref(acc)
    return acc


def gradient_edge(t: Tensor):
    """(node, output_nr) that receives the gradient of `t`."""
    if t.grad_fn is not None:
        return (t.grad_fn, t._output_nr)
    return (_accumulator(t), 0)


# ----------------------------------------------------------------------------- Function
class Function:
    """Base class of every differentiable op, and the public custom-op API.

    Subclasses define `forward(ctx, *args)` (returns a Tensor or a tuple of Tensors) and
    `backward(ctx, *grad_outputs)` (returns one gradient or None per forward argument).
    In forward, `ctx.save_for_backward(...)` keeps tensors, `ctx.needs_input_grad` says
    which inputs need a gradient, `ctx.mark_dirty(...)` declares inputs written in place,
    `ctx.mark_non_differentiable(...)` outputs without a gradient, and
    `ctx.set_materialize_grads(False)` asks for None instead of zeros; any other attribute
    may be stored on ctx. The class attributes below are everything the engine and the
    memory ledger read from an op.
    """

    materialize_grads: bool = True
    """Pass zeros (not None) to backward for outputs that got no gradient."""

    takes_lazy_grads: bool = False
    """backward accepts a ReshapeGrad as it comes, to write it into place without a copy."""

    policy: str | None = None
    """This op's key in the save-policy table (ta.memory.save_policy); None: always saves."""

    saves: dict | None = None
    """What forward keeps under each save policy ("save", "recompute"), in words."""

    container: bool = False
    """forward runs other ops as the work itself (checkpoint): op observers hear those ops,
    not this one."""

    @staticmethod
    def flops(ctx, args, out) -> int:
        """The floating-point operations of one forward call, counted as torch's
        FlopCounterMode counts them: 2 per multiply-add of the matmul family (matmul,
        linear, attention, convolution), 0 for every other op (docs/memory-planner.md).
        `args` are forward's arguments (None for a save policy's recompute), `out` its
        output."""
        return 0

    @staticmethod
    def forward(ctx, *args):  # pragma: no cover - abstract
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grads):  # pragma: no cover - abstract
        raise NotImplementedError

    @staticmethod
    def recompute(ctx):  # pragma: no cover - abstract
        """The output of the call behind ctx, rebuilt from its saved tensors (ops with a
        `policy`: a later node keeps this recipe instead of the output under "recompute")."""
        raise NotImplementedError

    @staticmethod
    def saved_bytes_formula(shape, itemsize, policy):  # pragma: no cover - abstract
        """Bytes forward saves for an input of `shape` under `policy` (ops with a `policy`)."""
        raise NotImplementedError

    @classmethod
    def apply(cls, *args, **kwargs):
        if recording_state.on:  # called from a recorded backward: proxies in, proxies out
            return _apply_recorded(cls, args, kwargs)
        ctx = Node(cls)
        record = _connect_inputs(ctx, args)
        # _relabel's work, written out (this runs for every op call): the labels swapped for
        # a new dict naming this op and call, grad mode off, and NumPy's floating-point
        # warnings off, as torch is silent on log(0) = -inf, asin(2) = nan and 1/0 = inf:
        # one place for every op's forward (and backward, in the engine), not a wrapper per
        # function or a guard per kernel
        here, mode = ledger_state.local, GradMode
        labels, enabled = here.labels, mode.enabled
        here.labels = {**labels, "op": cls.__name__, "call": id(ctx)}
        mode.enabled = False
        quiet = quiet_fp_errors()
        watch = _watch_op(here, cls) if ledger_state.op_observers else None
        try:
            out = cls.forward(ctx, *args, **kwargs)
        finally:
            restore_fp_errors(quiet)
            here.labels, mode.enabled = labels, enabled
            if watch is not None:
                here.op_depth = watch[0]
        if record:
            ctx.seq = next(_seq)
            ctx.scope = labels["scope"]
            if ctx._saved:
                _unlink_saved_outputs(ctx, out)
                _notify("on_save", ctx)
            out = _connect_outputs(ctx, out, args)
        elif type(out) is not Tensor or out._base is not None:  # a view, or several outputs
            _mark_no_grad_views(out, args)
        if ctx._dirty:
            _take_dirty(ctx, out)
        if ctx._non_differentiable:
            del ctx._non_differentiable
        if watch is not None and watch[0] == 0 and not cls.container:  # the call's seconds,
            # the graph's bookkeeping (saving, connecting) included
            _op_heard(cls, ctx, args, out, labels["scope"], labels["phase"],
                      here.recomputing > 0, time.perf_counter() - watch[1])
        return out


def _watch_op(here, cls) -> tuple:
    """(this thread's op depth before the call, the clock) for an op observers hear; the
    ops a call runs inside its forward are its own work (a container's are not)."""
    depth = here.op_depth
    if not cls.container:
        here.op_depth = depth + 1
    return depth, time.perf_counter()


def _op_heard(cls, ctx, args, out, scope: str, phase: str, recompute: bool,
              seconds: float) -> None:
    """Tell the op observers of one op call (ledger_state.op_observers)."""
    record = {"op": cls.__name__, "scope": scope, "phase": phase, "recompute": recompute,
              "flops": int(cls.flops(ctx, args, out)), "seconds": seconds}
    with ledger_state.observer_lock:
        for obs in tuple(ledger_state.op_observers):
            obs.on_op(record)


class recomputing:
    """Marks forward work re-run in backward (a checkpoint's rerun) for the op observers:
    the ops inside are heard with "recompute" True, at depth 0."""

    def __enter__(self):
        here = ledger_state.local
        self.prev = here.op_depth
        here.recomputing += 1
        here.op_depth = 0
        return self

    def __exit__(self, *exc) -> None:
        here = ledger_state.local
        here.recomputing -= 1
        here.op_depth = self.prev


def _connect_inputs(ctx: Node, args: tuple) -> bool:
    """Set ctx.needs_input_grad; if any input needs a gradient, also the edges to the nodes
    that produced them. Returns whether this call is recorded."""
    if not GradMode.enabled:
        ctx.needs_input_grad = (False,) * len(args)
        return False
    needs = ()  # tuples grown in plain loops: an op's few arguments, no comprehension calls
    for a in args:
        needs += (type(a) is Tensor and a.requires_grad,)
    ctx.needs_input_grad = needs
    if True not in needs:
        return False
    edges = shapes = ()
    for a, need in zip(args, needs):
        if need:
            if a._base is not None or a.grad_fn is None:
                edges += (_input_edge(a, ctx.fn),)
            else:
                edges += ((a.grad_fn, a._output_nr),)  # _input_edge's common case, inline
            shapes += (a._shape,)
        else:
            edges += (None,)
            shapes += (None,)
    ctx.next_functions, ctx.input_shapes = edges, shapes
    return True


def _connect_outputs(ctx: Node, out, args: tuple):
    """Make ctx the grad_fn of each floating-point output not marked non-differentiable.

    An input that forward returns as it is, without mark_dirty, comes back as a new view of
    it (as in PyTorch): the input keeps its own history (a leaf stays a leaf). Returns the
    outputs, with those views in place."""
    if type(out) is Tensor and not ctx._non_differentiable:  # the common case, kept short
        if _returned_input(ctx, out, args):
            out = _make(out._storage, out._shape, out._strides, out._offset, out._data, out)
        if out.dtype.is_floating_point:
            out.requires_grad, out.grad_fn, out._output_nr = True, ctx, 0
        ctx._outputs_meta = ((out._shape, out.dtype, out.device),)
        return out
    outs = [out] if type(out) is Tensor else list(out)
    skip, replaced = ctx._non_differentiable, False
    for i, o in enumerate(outs):
        if _returned_input(ctx, o, args):
            o = outs[i] = _make(o._storage, o._shape, o._strides, o._offset, o._data, o)
            replaced = True
        if o.dtype.is_floating_point and not any(o is s for s in skip):
            o.requires_grad, o.grad_fn, o._output_nr = True, ctx, i
    ctx._outputs_meta = tuple([(o._shape, o.dtype, o.device) for o in outs])
    if not replaced:
        return out
    return outs[0] if type(out) is Tensor else tuple(outs)


def _returned_input(ctx: Node, o: Tensor, args: tuple) -> bool:
    for a in args:
        if a is o:
            return not any(o is t for t in ctx._dirty)
    return False


def _mark_no_grad_views(out, args: tuple) -> None:
    """Mark the views an unrecorded call made of an input that requires grad while grad mode
    was off, or of an input so marked (a view of such a view): writing into one in place
    with grad mode on is refused (check_inplace), as in PyTorch."""
    outs = (out,) if type(out) is Tensor else out if type(out) in (tuple, list) else ()
    grad_off = not GradMode.enabled
    for o in outs:
        if type(o) is not Tensor or o._base is None or any(o is a for a in args):
            continue  # not a view, or an input given back (an in-place op's)
        for a in args:
            if (type(a) is Tensor and a._storage is o._storage
                    and ((grad_off and a.requires_grad) or a._no_grad_view)):
                o._no_grad_view = True
                break


def _take_dirty(ctx: Node, out) -> None:
    """Tensors forward wrote in place must come back as outputs; those whose history now
    runs through ctx make the views taken before the write stale. A view made under no_grad
    is refused here too (a custom op's mark_dirty; the built-in ones check before writing)."""
    outs = (out,) if type(out) is Tensor else out
    for t in ctx._dirty:
        check_inplace(ctx.fn.__name__, t, False)
        if not any(t is o for o in outs):
            raise RuntimeError(
                f"{ctx.fn.__name__}: a tensor marked dirty (shape {tuple(t.shape)}) was not "
                "returned by forward; an op that modifies inputs in place must return them"
            )
        if t.grad_fn is ctx:
            t._storage.history_version = t._storage.version
    del ctx._dirty


def _unlink_saved_outputs(ctx: Node, out) -> None:
    """A saved output is kept as a detached alias: output -> node -> output would be a
    reference cycle, freed only by the cyclic garbage collector instead of at once."""
    outs = (out,) if type(out) is Tensor else out
    saved = ctx._saved
    for i, item in enumerate(saved):
        if type(item) is tuple:
            for nr, o in enumerate(outs):
                if item[0] is o:
                    saved[i] = (o.detach(), item[1])
                    if ctx.__dict__.get("_saved_output_nrs") is None:
                        ctx._saved_output_nrs = {}
                    ctx._saved_output_nrs[i] = nr  # for a recorded backward (_rejoined)
                    break


def _input_edge(t: Tensor, fn) -> tuple:
    if t._base is not None and t._storage.history_version > t._view_version:
        raise RuntimeError(
            f"{fn.__name__}: input of shape {tuple(t.shape)} is a view whose base was modified "
            "in place (with autograd recording) after the view was taken, so the view's "
            "recorded history is stale; take the view again after the in-place op."
        )
    if t.grad_fn is not None:
        return (t.grad_fn, t._output_nr)
    return (_accumulator(t), 0)


# ----------------------------------------------------------------------------- recorded backward
def _apply_recorded(cls, args: tuple, kwargs: dict):
    """An op applied inside a recorded backward: it runs (and records) on the tensors behind
    the proxies, and hands proxies back, so that the backward's later steps keep recording."""
    recording_state.on = False
    try:
        out = cls.apply(*unwrap(args), **unwrap(kwargs))
    finally:
        recording_state.on = True
    return wrap(out)


class ZeroDerivative(Function):
    """y = value (a view of it);  gvalue = g, g for each source = 0. Saves nothing (the
    sources' shapes only). The engine puts a gradient that a recorded backward computed
    without a graph (a constant in the sources) under this node, so that it still depends
    on them, with derivative zero, as torch's gradients do."""

    @staticmethod
    def forward(ctx, value, *sources):
        ctx.sources = [(s.shape, s.dtype, s.device) for s in sources]
        return value  # apply hands it back as a new view

    @staticmethod
    def backward(ctx, g):
        from ..tensor import _zeros_array, from_array  # noqa: PLC0415 - at call time

        return (g, *(from_array(_zeros_array(shape, dtype, device))
                     for shape, dtype, device in ctx.sources))


def _rejoined(t: Tensor, node: Node, nr: int) -> Tensor:
    """A new alias of saved output `t` whose history is output `nr` of `node`."""
    alias = _make(t._storage, t._shape, t._strides, t._offset, t._data)
    if t.dtype.is_floating_point:
        alias.requires_grad, alias.grad_fn, alias._output_nr = True, node, nr
    return alias


def wrap(x):
    """Tensors (also inside tuples, lists and named tuples) as Recorded proxies."""
    if type(x) is Tensor:
        return Recorded(x)
    if type(x) in (tuple, list):
        return type(x)(wrap(v) for v in x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(wrap(v) for v in x))
    return x


def unwrap(x):
    """The tensors behind Recorded proxies (also inside tuples, lists, dicts)."""
    if type(x) is Recorded:
        return x.t
    if type(x) in (tuple, list):
        return type(x)(unwrap(v) for v in x)
    if type(x) is dict:
        return {k: unwrap(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(unwrap(v) for v in x))
    return x


recorded_array = None
"""ops/_recorded.py's RecordedArray(tensor): the array a Recorded proxy's `_array()` gives
(set when the op layer is imported; the ops it records are above this layer)."""


class TensorHolder:
    """What a proxy of a recorded backward answers from the tensor it holds as `t`."""

    __slots__ = ()

    def __len__(self) -> int:
        return len(self.t)

    def __float__(self):
        return float(self.t)

    def __int__(self):
        return int(self.t)

    def __bool__(self):
        return bool(self.t)


class Recorded(TensorHolder):
    """A tensor as a recorded backward (create_graph=True) sees it: the gradients it gets,
    its saved tensors, and what the ops it calls return.

    The backward's text is the first-order one. Where that text takes `g._array()` and does
    NumPy arithmetic, the array is a RecordedArray whose every NumPy call records the
    matching engine op; where it calls tensor methods or applies ops, those run on the
    tensor behind the proxy (recorded, since grad mode is on) and hand proxies back;
    `from_array` of a RecordedArray gives a proxy. The engine takes the tensors back out of
    whatever the backward returns.
    """

    __slots__ = ("t",)

    def __init__(self, t: Tensor):
        self.t = t

    def _array(self):
        if not self.t.dtype.is_floating_point:  # an index or a mask: no derivative flows
            return self.t._array()
        return recorded_array(self.t)

    def _as_recorded(self):
        return self

    # in NumPy arithmetic (an array of the backward times a saved tensor that the text did
    # not turn into an array first) a proxy is its recorded array
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return self._array().__array_ufunc__(ufunc, method, *inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return self._array().__array_function__(func, types, args, kwargs)

    def __getattr__(self, name):
        attr = getattr(self.t, name)
        if callable(attr) and hasattr(attr, "__self__"):  # a bound method of the tensor
            return _WrappedMethod(attr)
        return wrap(attr)

    def __repr__(self) -> str:
        return f"Recorded({self.t!r})"

    def __iter__(self):
        return (Recorded(v) for v in self.t)

    def __index__(self):
        return self.t.__index__()

    def __setitem__(self, index, value):
        self.t[unwrap(index)] = unwrap(value)

    def __format__(self, spec):
        return format(self.t, spec)


class _WrappedMethod:
    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        recording_state.on = False  # the method's own body sees plain tensors
        try:
            out = self.fn(*unwrap(args), **unwrap(kwargs))
        finally:
            recording_state.on = True
        return wrap(out)


def _recorded_operator(name: str):
    def method(self, *args):
        return _WrappedMethod(getattr(self.t, name))(*args)

    method.__name__ = name
    return method


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__",
              "__rmod__", "__pow__", "__rpow__", "__matmul__", "__rmatmul__", "__neg__",
              "__pos__", "__abs__", "__invert__", "__and__", "__rand__", "__or__", "__ror__",
              "__xor__", "__rxor__", "__lt__", "__le__", "__gt__", "__ge__", "__eq__",
              "__ne__", "__getitem__"):
    # no in-place operators: `g += x` on a proxy rebinds g to g + x (an incoming gradient may
    # be shared, and a recorded backward never writes into one)
    setattr(Recorded, _name, _recorded_operator(_name))
Recorded.__hash__ = object.__hash__
del _name
