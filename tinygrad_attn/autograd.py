"""Reverse-mode autodiff: graph nodes, saved tensors, the backward engine, custom ops.

An op is a `Function` subclass with `forward(ctx, ...)` and `backward(ctx, *grads)` side by
side (PyTorch's autograd.Function). `Function.apply` runs forward without recording, then,
if any input needs a gradient, makes `ctx` the graph node of the outputs: `ctx.fn` is the
op, `ctx.next_functions` the edges to the nodes that produced the inputs, and
`ctx.saved_tensors` what forward chose to keep. Leaves that require grad get an
`AccumulateGrad` node, as in PyTorch.

The engine (`run_backward`) counts each node's consumers, then runs nodes in topological
order, most recently created first. It frees a node's saved tensors right after the node's
backward (unless retain_graph) and drops each gradient once consumed. Several gradients
flowing into one slot are summed; the first sum allocates, later ones add in place. A
slice's gradient travels as a `SliceGrad` (the slice of the gradient plus where it sits in
the base), so any number of slices of one base cost one base-sized buffer in total.
"""

from __future__ import annotations

import heapq
import itertools
import weakref

from . import backend
from .memory import state as ledger_state
from .shape import index_geometry, view_strides
from .tensor import Tensor, _ones_like_array, _zeros_array, from_array

_seq = itertools.count()


# ----------------------------------------------------------------------------- grad mode
class GradMode:
    enabled = True


class _GradModeContext:
    _target = True

    def __enter__(self):
        self._prev = GradMode.enabled
        GradMode.enabled = self._target

    def __exit__(self, *exc):
        GradMode.enabled = self._prev

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_GradModeContext):
    """Context manager / decorator: ops run without recording a graph (nothing is saved)."""

    _target = False


class enable_grad(_GradModeContext):
    """Context manager / decorator: turn recording back on inside a no_grad region."""

    _target = True


class set_grad_enabled(_GradModeContext):
    def __init__(self, mode: bool):
        self._target = bool(mode)

    def __call__(self, fn):  # pragma: no cover - used as a context manager
        raise TypeError("set_grad_enabled is a context manager, not a decorator")


def is_grad_enabled() -> bool:
    return GradMode.enabled


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

    def __init__(self, fn=None):
        self.fn = fn

    @property
    def name(self) -> str:
        return f"{self.fn.__name__}Backward" if self.fn is not None else type(self).__name__

    def __repr__(self) -> str:
        return f"<{self.name}>"

    # -- saving ------------------------------------------------------------------------
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
                    and policies.get(getattr(producer.fn, "policy", None)) == "recompute"
                    and t._output_nr == 0 and t._base is None):
                saved.append(_Recipe(producer, t))
                continue
            saved.append((t, t._storage.version))
        self._saved = saved

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
        if self._saved:
            for obs in ledger_state.observers:
                if hasattr(obs, "on_release"):
                    obs.on_release(self)
        self._saved = None
        self._released = True

    def register_prehook(self, output_nr: int, fn) -> _HookHandle:
        if self._pre_hooks is None:
            self._pre_hooks = {}
        hooks = self._pre_hooks.setdefault(output_nr, [])
        hooks.append(fn)
        return _HookHandle(hooks, fn)


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
        prev = GradMode.enabled
        GradMode.enabled = False
        try:
            return self.producer.fn.recompute(self.producer)
        finally:
            GradMode.enabled = prev


class AccumulateGrad(Node):
    """The node of a leaf tensor: adds the incoming gradient into `variable.grad`."""

    def __init__(self, variable: Tensor):
        super().__init__(None)
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
    `ctx.save_for_backward(...)` keeps tensors; `ctx.needs_input_grad` says which inputs
    need a gradient; any other attribute may be stored on ctx.
    """

    materialize_grads = True  # pass zeros (not None) for outputs that got no gradient

    @staticmethod
    def forward(ctx, *args):  # pragma: no cover - abstract
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grads):  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def apply(cls, *args, **kwargs):
        enabled = GradMode.enabled
        ctx = Node(cls)
        record = False
        if enabled:
            needs = []
            for a in args:
                need = type(a) is Tensor and a.requires_grad
                needs.append(need)
                if need:
                    record = True
            ctx.needs_input_grad = needs = tuple(needs)
            if record:
                edges, shapes = [], []
                for a, need in zip(args, needs):
                    edges.append(_input_edge(a, cls) if need else None)
                    shapes.append(a._shape if need else None)
                ctx.next_functions, ctx.input_shapes = tuple(edges), tuple(shapes)
        else:
            ctx.needs_input_grad = (False,) * len(args)
        current = ledger_state.current
        prev_op, prev_call = current["op"], current["call"]
        current["op"], current["call"] = cls.__name__, id(ctx)
        GradMode.enabled = False
        try:
            out = cls.forward(ctx, *args, **kwargs)
        finally:
            GradMode.enabled = enabled
            current["op"], current["call"] = prev_op, prev_call
        if record:
            ctx.seq = next(_seq)
            ctx.scope = current["scope"]
            if ctx._saved:
                _unlink_saved_outputs(ctx, out)
                for obs in ledger_state.observers:
                    if hasattr(obs, "on_save"):
                        obs.on_save(ctx)
            if type(out) is Tensor:
                if out.dtype.is_floating_point:
                    out.requires_grad = True
                    out.grad_fn = ctx
                    out._output_nr = 0
                ctx._outputs_meta = ((out._shape, out.dtype, out.device),)
            else:
                for i, o in enumerate(out):
                    if o.dtype.is_floating_point:
                        o.requires_grad = True
                        o.grad_fn = ctx
                        o._output_nr = i
                ctx._outputs_meta = tuple((o._shape, o.dtype, o.device) for o in out)
        return out


def _unlink_saved_outputs(ctx: Node, out) -> None:
    """A saved output is kept as a detached alias: output -> node -> output would be a
    reference cycle, freed only by the cyclic garbage collector instead of at once."""
    outs = (out,) if type(out) is Tensor else out
    saved = ctx._saved
    for i, item in enumerate(saved):
        if type(item) is tuple and any(item[0] is o for o in outs):
            saved[i] = (item[0].detach(), item[1])


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


# ----------------------------------------------------------------------------- slice grads
class SliceGrad:
    """The gradient of a slice, not yet written into a base-sized buffer.

    `index` is the basic index (ints, slices, None, ...) that took the slice from a tensor
    of `base_shape`. Several SliceGrads of one base are written into one buffer.
    """

    __slots__ = ("base_shape", "index", "grad", "op", "scope")

    def __init__(self, base_shape, index: tuple, grad: Tensor):
        self.base_shape, self.index, self.grad = base_shape, index, grad
        # the backward that made it, for the ledger when the buffer is allocated later
        self.op, self.scope = ledger_state.current["op"], ledger_state.current["scope"]

    @property
    def shape(self):
        return self.base_shape

    def add_into(self, buffer: Tensor) -> None:
        """buffer[index] += grad, in place (buffer has base_shape, any dense strides)."""
        shape, strides, offset = index_geometry(buffer._shape, buffer._strides,
                                                buffer._offset, self.index)
        view = backend.strided(buffer._storage.buffer, shape, strides, offset)
        view += self.grad._array()
        buffer._storage.version += 1

    def materialize(self) -> Tensor:
        g = self.grad
        current = ledger_state.current
        prev = current["op"], current["scope"]
        current["op"], current["scope"] = self.op, self.scope
        try:
            buffer = from_array(_zeros_array(self.base_shape, g.dtype, g.device), "slice-grad")
        finally:
            current["op"], current["scope"] = prev
        self.add_into(buffer)
        return buffer


class ReshapeGrad:
    """The gradient of a view op whose incoming gradient is laid out so that reshaping it
    back to the input's shape would copy (the transposed gradient of q.view(B, T, nh, hs)).

    It is written straight into whichever buffer receives it (the one buffer of a split,
    say) through a strided view of that buffer, and only copied if it must stand alone.
    """

    __slots__ = ("grad", "shape", "op", "scope")

    def __init__(self, grad: Tensor, shape: tuple):
        self.grad, self.shape = grad, tuple(shape)
        self.op, self.scope = ledger_state.current["op"], ledger_state.current["scope"]

    def view_of(self, flat, shape, strides, offset):
        """An array with the gradient's own shape over (shape, strides, offset), or None."""
        grad_strides = view_strides(shape, strides, self.grad._shape)
        if grad_strides is None:
            return None
        return backend.strided(flat, self.grad._shape, grad_strides, offset)

    def add_into(self, buffer: Tensor) -> None:
        view = self.view_of(buffer._storage.buffer, buffer._shape, buffer._strides,
                            buffer._offset)
        if view is None:
            _add_inplace(buffer, self.materialize())
            return
        view += self.grad._array()
        buffer._storage.version += 1

    def materialize(self) -> Tensor:
        current = ledger_state.current
        prev = current["op"], current["scope"]
        current["op"], current["scope"] = self.op, self.scope
        try:
            arr = backend.copy(self.grad._array()).reshape(self.shape)
            return from_array(arr, "reshape-copy")
        finally:
            current["op"], current["scope"] = prev


_LAZY = (SliceGrad, ReshapeGrad)


def _accumulate(pending: list, owned: list, nr: int, g, is_owned: bool) -> str:
    """Add one more gradient into pending[nr]; says 'first', 'in-place' or 'new-buffer'.

    `owned[nr]` says whether the engine alone holds the pending buffer, so it may add into
    it in place; a pending gradient that is shared (passed through an add, say) is summed
    out of place once, and that new buffer is then owned.
    """
    cur = pending[nr]
    if cur is None:
        pending[nr], owned[nr] = g, is_owned
        return "first"
    if not ledger_state.habits["inplace_grad_accumulation"]:  # the emulated habit
        a = cur.materialize() if type(cur) in _LAZY else cur
        b = g.materialize() if type(g) in _LAZY else g
        pending[nr] = from_array(a._array() + b._array(), "grad-accumulate")
        owned[nr] = True
        return "new-buffer"
    how = "in-place"
    if type(cur) in _LAZY:  # first real accumulation: one buffer of the slot's shape
        cur = pending[nr] = cur.materialize()
        owned[nr] = True
        how = "new-buffer"
    if owned[nr]:
        if type(g) in _LAZY:
            g.add_into(cur)
        else:
            _add_inplace(cur, g)
        return how
    if type(g) in _LAZY:
        buf = g.materialize()
        _add_inplace(buf, cur)
    else:
        buf = from_array(cur._array() + g._array())
    pending[nr], owned[nr] = buf, True
    return "new-buffer"


def _add_inplace(target: Tensor, g: Tensor) -> None:
    arr = target._array()
    src = g._array()
    if src.shape != arr.shape:
        src = src.reshape(arr.shape) if src.size == arr.size else src
    arr += src
    target._storage.version += 1


# ----------------------------------------------------------------------------- engine
def run_backward(roots, grad_roots, retain_graph: bool = False, capture=None):
    """Propagate gradients from `roots` (tensors) seeded with `grad_roots`.

    With `capture` (a list of tensors) gradients are returned for those tensors, in order,
    and no leaf's .grad is touched (this is autograd.grad). Allocations made meanwhile are
    labelled phase "backward".
    """
    current = ledger_state.current
    prev_phase = current["phase"]
    current["phase"] = "backward"
    try:
        return _run_backward(roots, grad_roots, retain_graph, capture)
    finally:
        current["phase"] = prev_phase


def _run_backward(roots, grad_roots, retain_graph, capture):
    edges = []
    for t in roots:
        if t.grad_fn is None and not t.requires_grad:
            raise RuntimeError(
                f"backward: tensor of shape {tuple(t.shape)} does not require grad and has no "
                "grad_fn (was it created under no_grad, or from tensors without requires_grad?)"
            )
        edges.append(gradient_edge(t))

    # consumers of each node, over the part of the graph reachable from the roots
    deps: dict = {}
    stack = list(dict.fromkeys(node for node, _ in edges))  # each root node once
    seen = set(stack)
    while stack:
        node = stack.pop()
        if node._released and not isinstance(node, AccumulateGrad):
            raise RuntimeError(
                f"{node.name}: trying to backward through the graph a second time (its saved "
                "tensors were freed by the first backward). Pass retain_graph=True to the "
                "first backward() if you need to run backward twice."
            )
        for edge in node.next_functions:
            if edge is None:
                continue
            nxt = edge[0]
            deps[nxt] = deps.get(nxt, 0) + 1
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)

    captured = None
    capture_at: dict = {}
    if capture is not None:
        captured = [None] * len(capture)
        for i, t in enumerate(capture):
            if t.grad_fn is None and not t.requires_grad:
                raise RuntimeError(
                    f"grad: input {i} of shape {tuple(t.shape)} does not require grad"
                )
            capture_at.setdefault(gradient_edge(t), []).append(i)

    late_free = [] if ledger_state.habits["late_free"] else None
    slots: dict = {}  # node -> (pending gradients, owned flags), one entry per output
    for (node, nr), g in zip(edges, grad_roots):
        entry = slots.get(node)
        if entry is None:
            entry = slots[node] = _new_slots(node)
        _accumulate(entry[0], entry[1], nr, g, False)

    heap = []
    for node in {n for n, _ in edges}:
        if deps.get(node, 0) == 0:
            heapq.heappush(heap, (-node.seq, node.seq, node))

    while heap:
        _, _, node = heapq.heappop(heap)
        grads, owned = slots.pop(node, None) or _new_slots(node)
        keep_lazy = (getattr(node.fn, "takes_lazy_grads", False) and not node._pre_hooks
                     and not node._retained and not capture_at)
        for i, g in enumerate(grads):
            if type(g) in _LAZY and not (keep_lazy and type(g) is ReshapeGrad):
                grads[i], owned[i] = g.materialize(), True
        if node._pre_hooks:
            _run_hooks(node._pre_hooks, grads, owned)
        if isinstance(node, AccumulateGrad):
            var = node.variable
            g = grads[0]
            if g is not None and var._hooks:
                _run_hooks({0: var._hooks}, grads, owned)
                g = grads[0]
            for i in capture_at.get((node, 0), ()):
                captured[i] = g
            if capture is None and g is not None:
                _accumulate_leaf(var, g, owned[0])
            continue
        if capture_at:
            for nr, g in enumerate(grads):
                for i in capture_at.get((node, nr), ()):
                    captured[i] = g
        if node._retained:
            for nr, ref in node._retained.items():
                t = ref()
                if t is not None and grads[nr] is not None:
                    t.grad = grads[nr] if t.grad is None else t.grad + grads[nr]
                    owned[nr] = False  # now visible as t.grad

        if _count_is(grads, None) == len(grads):
            results = (None,) * len(node.next_functions)
        else:
            results = _call_backward(node, grads)
        if not retain_graph:
            if late_free is not None:  # the emulated habit: keep saved tensors to the end
                late_free.append(node._saved)
            node.release()

        # A returned gradient the engine may later add into in place must be a contiguous
        # buffer that nothing else holds: not (a view of) an incoming gradient that someone
        # else may hold, and not returned for two inputs at once.
        # An incoming gradient the engine owned may pass its ownership on to a view of it
        # (the gradient of a transpose is a transpose of the gradient).
        shared_in = [g._storage for g, own in zip(grads, owned) if g is not None and not own]
        returned = [(g.grad if type(g) in _LAZY else g)._storage
                    for g in results if g is not None]
        for edge, g in zip(node.next_functions, results):
            if edge is None:
                continue
            nxt, nr = edge
            if g is not None:
                base = g.grad if type(g) in _LAZY else g
                st = base._storage
                is_owned = (_count_is(returned, st) == 1 and not _count_is(shared_in, st)
                            and _dense(base))
                entry = slots.get(nxt)
                if entry is None:
                    entry = slots[nxt] = _new_slots(nxt)
                how = _accumulate(entry[0], entry[1], nr, g, is_owned)
                if how != "first":
                    for obs in ledger_state.observers:
                        if hasattr(obs, "on_accumulate"):
                            obs.on_accumulate(nxt, nr, how, base.nbytes)
            deps[nxt] -= 1
            if deps[nxt] == 0:
                heapq.heappush(heap, (-nxt.seq, nxt.seq, nxt))
    return captured


def _dense(t: Tensor) -> bool:
    """No element is reached twice (no stride-0 broadcast dim): safe to add into in place."""
    return all(st != 0 or n == 1 for n, st in zip(t._shape, t._strides))


def _run_hooks(hooks_by_output: dict, grads: list, owned: list) -> None:
    """Tensor hooks: each may return a replacement gradient (which the engine never owns)."""
    for nr, hooks in hooks_by_output.items():
        for hook in hooks:
            if grads[nr] is not None:
                new = hook(grads[nr])
                if new is not None:
                    grads[nr], owned[nr] = new, False


def _new_slots(node) -> tuple:
    n = len(node._outputs_meta) or 1
    return [None] * n, [False] * n


def _count_is(items: list, x) -> int:
    """How many of items are x itself (identity, not equality)."""
    n = 0
    for item in items:
        if item is x:
            n += 1
    return n


def _call_backward(node: Node, grads: list):
    fn = node.fn
    if fn.materialize_grads:
        for i, g in enumerate(grads):
            if g is None:
                shape, dtype, device = node._outputs_meta[i]
                grads[i] = from_array(_zeros_array(shape, dtype, device))
    current = ledger_state.current
    prev = current["op"], current["scope"], current["call"]
    current["op"], current["scope"], current["call"] = node.name, node.scope, id(node)
    prev_mode = GradMode.enabled
    GradMode.enabled = False
    try:
        results = fn.backward(node, *grads)
    finally:
        GradMode.enabled = prev_mode
        current["op"], current["scope"], current["call"] = prev
    if not isinstance(results, tuple):
        results = (results,)
    n_args = len(node.next_functions)
    if len(results) < n_args and all(e is None for e in node.next_functions[len(results):]):
        results = results + (None,) * (n_args - len(results))  # trailing non-tensor args
    if len(results) != n_args:
        raise RuntimeError(
            f"{node.name}: backward returned {len(results)} gradients, expected "
            f"{len(node.next_functions)} (one per forward argument, None for non-tensors)"
        )
    for i, (g, edge) in enumerate(zip(results, node.next_functions)):
        if g is None or edge is None:
            continue
        expected = node.input_shapes[i]
        if tuple(g.shape) != tuple(expected):
            raise RuntimeError(
                f"{node.name}: backward returned a gradient of shape {tuple(g.shape)} for input "
                f"{i} of shape {tuple(expected)}"
            )
    return results


def _accumulate_leaf(var: Tensor, g: Tensor, owned: bool) -> None:
    if var.grad is None:
        if not owned or g.dtype != var.dtype:  # never alias another tensor's memory as .grad
            reason = "broadcast-grad" if 0 in g._strides else "grad-clone"
            g = from_array(backend.copy(g._array(), var.dtype), reason)
        g._storage.category = "gradient"
        var.grad = g
    else:
        _add_inplace(var.grad, g)


# ----------------------------------------------------------------------------- public API
def backward(tensors, grad_tensors=None, retain_graph: bool = False) -> None:
    """Compute gradients of `tensors` and accumulate them into the leaves' .grad."""
    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    if grad_tensors is None:
        grad_tensors = [None] * len(tensors)
    elif isinstance(grad_tensors, Tensor):
        grad_tensors = [grad_tensors]
    seeds = [_seed(t, g, "backward") for t, g in zip(tensors, grad_tensors)]
    run_backward(tensors, seeds, retain_graph=retain_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool = False,
         allow_unused: bool = False):
    """Gradients of `outputs` with respect to `inputs`, returned (not accumulated)."""
    single = isinstance(inputs, Tensor)
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    inputs = [inputs] if single else list(inputs)
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs]
    seeds = [_seed(t, g, "grad") for t, g in zip(outputs, grad_outputs)]
    result = run_backward(outputs, seeds, retain_graph=retain_graph, capture=inputs)
    for i, g in enumerate(result):
        if g is None and not allow_unused:
            raise RuntimeError(
                f"grad: input {i} of shape {tuple(inputs[i].shape)} was not used to compute "
                "the outputs; pass allow_unused=True to get None for it"
            )
    return tuple(result)


def _seed(t: Tensor, g, op: str) -> Tensor:
    if g is None:
        if t.numel() != 1:
            raise RuntimeError(
                f"{op}: grad can be implicitly created only for outputs with one element; got "
                f"an output of shape {tuple(t.shape)}. Pass a gradient of that shape."
            )
        return from_array(_ones_like_array(t))
    if not isinstance(g, Tensor):
        raise TypeError(f"{op}: gradient must be a Tensor, got {type(g).__name__}")
    if tuple(g.shape) != tuple(t.shape):
        raise RuntimeError(
            f"{op}: gradient of shape {tuple(g.shape)} does not match output of shape "
            f"{tuple(t.shape)}"
        )
    if g.device != t.device:
        from .errors import DeviceMismatchError

        raise DeviceMismatchError(
            f"{op}: gradient on {g.device} but output on {t.device}"
        )
    return g
