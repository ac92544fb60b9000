"""The backward engine: run the graph that forward recorded, most recent node first.

`_run_backward` is the whole algorithm: count each node's consumers, seed the roots, then
run each node whose consumers have all handed it their gradients, and hand its own on.
The helpers below it are one concern each. Memory is the point of most of them: a node's
saved tensors are freed right after its backward (unless retain_graph), and several
gradients flowing into one slot are summed, the first sum allocating and later ones adding
in place. A slice's gradient travels as a `SliceGrad` (the slice of the gradient plus where
it sits in the base), so any number of slices of one base cost one base-sized buffer.
"""

from __future__ import annotations

import heapq
import threading

from .. import backend
from ..backend.dtypes import quiet_fp_errors, restore_fp_errors
from ..errors import DeviceMismatchError
from ..memory import state as ledger_state
from ..shape import has_internal_overlap, index_geometry, view_strides
from ..tensor import Tensor, _ones_like_array, _zeros_array, from_array
from .graph import (
    AccumulateGrad,
    GradMode,
    Node,
    Recorded,
    ZeroDerivative,
    _notify,
    _relabel,
    _restore,
    gradient_edge,
    recording_state,
    unwrap,
)

# Tracers (autograd.trace) watching a backward run, told what the ledger's observers are not
# told: the gradients a node receives and hands on, slices routed and leaves accumulated.
# Empty unless a trace is open; every call site checks it first, so untraced runs pay one
# truth test per node. A trace hears the backward runs of the thread that opened it.
_tracers: list = []


def _tell_tracers(event: str, *args) -> None:
    me = threading.get_ident()
    for tracer in tuple(_tracers):
        if tracer.thread == me:
            getattr(tracer, event)(*args)


# ----------------------------------------------------------------------------- public API
def backward(tensors, grad_tensors=None, retain_graph: bool | None = None,
             create_graph: bool = False, grad_variables=None, inputs=None) -> None:
    """Compute gradients of `tensors` and accumulate them into the leaves' .grad.

    create_graph=True records the backward itself, so that the gradients (and the .grad
    they accumulate into) can be differentiated again; retain_graph defaults to it.
    `inputs`: accumulate into these tensors' .grad only."""
    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    if grad_variables is not None:  # torch's old name for grad_tensors
        if grad_tensors is not None:
            raise RuntimeError("backward: pass grad_tensors or grad_variables, not both")
        grad_tensors = grad_variables
    if grad_tensors is None:
        grad_tensors = [None] * len(tensors)
    elif isinstance(grad_tensors, Tensor):
        grad_tensors = [grad_tensors]
    if retain_graph is None:
        retain_graph = create_graph
    seeds = [_root_grad(t, g, "backward") for t, g in zip(tensors, grad_tensors)]
    if inputs is not None:
        inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
        if not inputs:
            raise RuntimeError("backward: 'inputs' argument to backward() cannot be empty")
        grads = run_backward(tensors, seeds, retain_graph=retain_graph, capture=inputs,
                             create_graph=create_graph)
        for t, g in zip(inputs, grads):
            if g is not None:
                _accumulate_leaf(t, g, False, create_graph)
                if t._post_acc_hooks and t.grad_fn is None:
                    _run_post_accumulate_hooks(t)
        return
    run_backward(tensors, seeds, retain_graph=retain_graph, create_graph=create_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None,
         create_graph: bool = False, only_inputs: bool = True, allow_unused: bool | None = None,
         is_grads_batched: bool = False, materialize_grads: bool = False):
    """Gradients of `outputs` with respect to `inputs`, returned (not accumulated).

    Torch's arguments: create_graph=True gives gradients with a graph (retain_graph
    defaults to it); allow_unused lets an input the outputs do not depend on get None
    (zeros with materialize_grads); is_grads_batched treats the first dim of each
    grad_output as a batch of vectors, one backward per vector (stacked)."""
    if materialize_grads and allow_unused is False:
        raise ValueError("grad: expected allow_unused to be True or not passed when "
                         "materialize_grads=True")
    allow_unused = materialize_grads if allow_unused is None else allow_unused
    if retain_graph is None:
        retain_graph = create_graph
    single = isinstance(inputs, Tensor)
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    inputs = [inputs] if single else list(inputs)
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs]
    else:
        grad_outputs = list(grad_outputs)
    if len(grad_outputs) != len(outputs):
        raise RuntimeError(f"grad: got {len(grad_outputs)} grad_outputs for {len(outputs)} "
                           "outputs")
    if is_grads_batched:
        return _batched_grad(outputs, inputs, grad_outputs, retain_graph, create_graph,
                             allow_unused, materialize_grads)
    seeds = [_root_grad(t, g, "grad") for t, g in zip(outputs, grad_outputs)]
    result = run_backward(outputs, seeds, retain_graph=retain_graph, capture=inputs,
                          create_graph=create_graph)
    for i, g in enumerate(result):
        if g is None and not allow_unused:
            raise RuntimeError(
                f"grad: input {i} of shape {tuple(inputs[i].shape)} was not used to compute "
                "the outputs; pass allow_unused=True to get None for it"
            )
        if g is None and materialize_grads:
            result[i] = from_array(_zeros_array(inputs[i].shape, inputs[i].dtype,
                                                inputs[i].device))
    return tuple(result)


def _batched_grad(outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused,
                  materialize_grads):
    """is_grads_batched: one backward per vector of the batch, results stacked on dim 0."""
    sizes = {tuple(g.shape)[0] for g in grad_outputs if g is not None}
    if len(sizes) != 1 or any(g is None for g in grad_outputs):
        raise RuntimeError("grad: is_grads_batched=True needs a grad_output for each output, "
                           "all with the same batch size in dim 0")
    (n,) = sizes
    runs = []
    for k in range(n):
        runs.append(grad(outputs, inputs, [g[k] for g in grad_outputs],
                         retain_graph=True if k < n - 1 else retain_graph,
                         create_graph=create_graph, allow_unused=allow_unused,
                         materialize_grads=materialize_grads))
    out = []
    for i in range(len(inputs)):
        col = [r[i] for r in runs]
        if all(c is None for c in col):
            out.append(None)
            continue
        out.append(_stack(col))
    return tuple(out)


def _stack(tensors: list) -> Tensor:
    """The tensors stacked on a new dim 0 (recorded: each is written into one buffer)."""
    first = tensors[0]
    buf = from_array(_zeros_array((len(tensors), *first.shape), first.dtype, first.device))
    for k, t in enumerate(tensors):
        buf[k] = t
    return buf


def _root_grad(t: Tensor, g, op: str) -> Tensor:
    """The gradient a root starts with: the one given, or 1 for a one-element output."""
    if g is None:
        if t.numel() != 1:
            raise RuntimeError(
                f"{op}: grad can be implicitly created only for outputs with one element; got "
                f"an output of shape {tuple(t.shape)}. Pass a gradient of that shape."
            )
        return from_array(_ones_like_array(t))
    if not isinstance(g, Tensor):
        raise TypeError(f"{op}: gradient must be a Tensor, got {type(g).__name__}")
    if g._shape != t._shape and tuple(g.shape) != tuple(t.shape):
        raise RuntimeError(
            f"{op}: gradient of shape {tuple(g.shape)} does not match output of shape "
            f"{tuple(t.shape)}"
        )
    if g.device != t.device:
        raise DeviceMismatchError(f"{op}: gradient on {g.device} but output on {t.device}")
    return g


def run_backward(roots, grad_roots, retain_graph: bool = False, capture=None,
                 create_graph: bool = False):
    """Propagate gradients from `roots` (tensors) seeded with `grad_roots`.

    With `capture` (a list of tensors) gradients are returned for those tensors, in order,
    and no leaf's .grad is touched (this is autograd.grad). Allocations made meanwhile are
    labelled phase "backward". With create_graph, each node's backward is recorded (grad
    mode on, its tensors seen as `Recorded` proxies) and gradients are summed out of place,
    so that every gradient has a graph of its own.
    """
    here = ledger_state.local
    labels = here.labels
    here.labels = {**labels, "phase": "backward"}  # what labelled(phase=...) does, inline
    callbacks = _callbacks.stack
    callbacks.append([])
    try:
        if not create_graph:
            result = _run_backward(roots, grad_roots, retain_graph, capture, False)
        else:
            prev = GradMode.enabled, here.create_graph
            GradMode.enabled = here.create_graph = True
            try:
                result = _run_backward(roots, grad_roots, retain_graph, capture, True)
            finally:
                GradMode.enabled, here.create_graph = prev
        queued = callbacks[-1]
        while queued:  # a callback may queue another: it runs too, in order
            queued.pop(0)()
        return result
    finally:
        callbacks.pop()
        here.labels = labels


class _Callbacks(threading.local):
    """Per thread, one list per backward running in it (a hook may run another backward):
    the callbacks queue_callback added to it."""

    def __init__(self):
        self.stack = []


_callbacks = _Callbacks()


def queue_callback(fn) -> None:
    """Run fn() once the backward now running in this thread has handed every gradient on,
    before backward() returns (torch's Variable._execution_engine.queue_callback): where
    DistributedDataParallel waits for its last all-reduce. Only during a backward."""
    if not _callbacks.stack:
        raise RuntimeError("queue_callback: only a backward in progress (a hook running inside "
                           "it) can queue a callback; none is running in this thread")
    _callbacks.stack[-1].append(fn)


# ----------------------------------------------------------------------------- the loop
def _run_backward(roots, grad_roots, retain_graph, capture, create_graph):
    """Order the graph, seed the roots, run each node once all its consumers have, and hand
    its gradients on to the nodes of its inputs."""
    edges = [_root_edge(t) for t in roots]
    consumers = _count_consumers(edges)
    wanted = _Capture(capture)
    needed = _leading_to(edges, wanted) if wanted.at else None
    pending, held = _seed(edges, grad_roots, create_graph)
    ready = _Ready([node for node, _ in edges if node not in consumers])
    late_free = [] if ledger_state.habits["late_free"] else None
    while ready:
        node = ready.pop()
        if needed is not None and node not in needed:
            continue  # autograd.grad: no input asked for is reached from here (torch's pruning)
        grads, owned = pending.pop(node, None) or _new_slots(node)
        _receive(node, grads, owned, wanted, held)
        if type(node) is AccumulateGrad:
            _finish_leaf(node, grads, owned, wanted, create_graph)
            continue
        if wanted.at:
            wanted.take(node, grads)
        if node._retained:
            _retain_grads(node, grads, owned)
        results = _run_node(node, grads, create_graph)
        if node._saved and not retain_graph:
            _free(node, late_free)
        sharing = _Sharing(grads, owned, results)
        _hand_on(node, results, sharing, pending, consumers, ready, held, create_graph)
    return wanted.grads


class _Held:
    """What the loop keeps referencing after its last use, and until when.

    arrived: the running node's last incoming gradient as it arrived (before it was made a
    tensor or replaced by a hook), until the node hands its gradients on (capture and leaves
    let go of it at once). routed: the last gradient handed on, with the pending slots it
    went into, until the next one is handed on. Letting go at last use would lower some
    peaks by a gradient; the memory figures of README and tests are measured with these.
    """

    __slots__ = ("arrived", "routed")

    def __init__(self):
        self.arrived = self.routed = None


# ----------------------------------------------------------------------------- ordering
def _root_edge(t: Tensor) -> tuple:
    if t.grad_fn is not None:
        return (t.grad_fn, t._output_nr)  # gradient_edge(t), the common case inline
    if not t.requires_grad:
        raise RuntimeError(
            f"backward: tensor of shape {tuple(t.shape)} does not require grad and has no "
            "grad_fn (was it created under no_grad, or from tensors without requires_grad?)"
        )
    return gradient_edge(t)


def _count_consumers(edges: list) -> dict:
    """node -> how many edges lead into it, over the graph reachable from the roots."""
    consumers: dict = {}
    stack = []
    for node, _ in edges:
        if node not in stack:  # each root node once (identity: a Node has no __eq__)
            stack.append(node)
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
            consumers[nxt] = consumers.get(nxt, 0) + 1
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return consumers


def _leading_to(edges: list, wanted: _Capture) -> set:
    """The nodes from which a node autograd.grad captures can be reached (the captured
    ones included): only these run, and only these free their saved tensors. A node
    outside it never hands a gradient to one inside (it would then lead there too)."""
    targets = {node for node, _ in wanted.at}
    needed: set = set()
    done: set = set()
    for root in dict.fromkeys(node for node, _ in edges):
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                if node in targets or any(e is not None and e[0] in needed
                                          for e in node.next_functions):
                    needed.add(node)
                continue
            if node in done:
                continue
            done.add(node)
            stack.append((node, True))
            stack.extend((e[0], False) for e in node.next_functions
                         if e is not None and e[0] not in done)
    return needed


class _Ready(list):
    """Nodes whose consumers have all run, most recently created first (a heap)."""

    def __init__(self, nodes):
        for node in dict.fromkeys(nodes):
            heapq.heappush(self, (-node.seq, node.seq, node))

    def push(self, node: Node) -> None:
        heapq.heappush(self, (-node.seq, node.seq, node))

    def pop(self) -> Node:
        return heapq.heappop(self)[2]


# ----------------------------------------------------------------------------- seeding
def _new_slots(node: Node) -> tuple:
    """A node's pending gradients (one per output) and whether the engine owns each."""
    n = len(node._outputs_meta) or 1
    return [None] * n, [False] * n


def _seed(edges: list, grad_roots: list, create_graph: bool) -> tuple:
    """node -> its pending slots, holding the roots' gradients (which the caller owns); and
    the loop's _Held, whose first `routed` is the last root's slots."""
    pending: dict = {}
    held = _Held()
    for (node, nr), g in zip(edges, grad_roots):
        entry = pending.get(node)
        if entry is None:
            entry = pending[node] = _new_slots(node)
        held.routed = entry
        _accumulate(entry[0], entry[1], nr, g, False, create_graph)
    return pending, held


# ----------------------------------------------------------------------------- capture
class _Capture:
    """autograd.grad's inputs: which (node, output) each one's gradient arrives at, and the
    gradients seen there. Without inputs (plain backward) the leaves accumulate instead."""

    def __init__(self, capture):
        self.grads = None
        self.at: dict = {}
        if capture is None:
            return
        self.grads = [None] * len(capture)
        for i, t in enumerate(capture):
            if t.grad_fn is None and not t.requires_grad:
                raise RuntimeError(
                    f"grad: input {i} of shape {tuple(t.shape)} does not require grad"
                )
            self.at.setdefault(gradient_edge(t), []).append(i)

    def take(self, node: Node, grads: list) -> None:
        if self.at:
            for nr, g in enumerate(grads):
                for i in self.at.get((node, nr), ()):
                    self.grads[i] = g


# ----------------------------------------------------------------------------- running a node
def _receive(node: Node, grads: list, owned: list, wanted: _Capture, held: _Held) -> None:
    """Turn the node's lazy gradients into tensors (a split takes a ReshapeGrad as it is,
    unless something outside the op will look at it), then run its tensors' hooks."""
    g = None
    for i, g in enumerate(grads):
        if type(g) in _LAZY and not (type(g) is ReshapeGrad and _keeps_lazy(node, wanted)):
            grads[i], owned[i] = g.materialize(), True
    if node._pre_hooks:
        _run_hooks(node._pre_hooks, grads, owned)
    if not wanted.at and type(node) is not AccumulateGrad:
        held.arrived = g


def _keeps_lazy(node: Node, wanted: _Capture) -> bool:
    return (node.fn is not None and node.fn.takes_lazy_grads and not node._pre_hooks
            and not node._retained and not wanted.at)


def _run_hooks(hooks_by_output: dict, grads: list, owned: list) -> None:
    """Tensor hooks: each may return a replacement gradient (which the engine never owns)."""
    for nr, hooks in hooks_by_output.items():
        for hook in hooks:
            if grads[nr] is not None:
                new = hook(grads[nr])
                if new is not None:
                    _check_hook_result(hook, grads[nr], new)
                    grads[nr], owned[nr] = new, False


def _check_hook_result(hook, g: Tensor, new) -> None:
    """A hook may replace a gradient only by one the rest of the graph can take unchanged:
    same shape, dtype and device (PyTorch's errors and error types)."""
    name = getattr(hook, "__name__", type(hook).__name__)
    if not isinstance(new, Tensor):
        raise TypeError(
            f"hook '{name}' on a tensor of shape {tuple(g.shape)}: expected a Tensor or None, "
            f"but hook returned '{type(new).__name__}'"
        )
    for what, was, got in (("size", tuple(g.shape), tuple(new.shape)),
                           ("type", g.dtype.name, new.dtype.name),
                           ("type", g.device, new.device)):
        if was != got:
            raise RuntimeError(
                f"hook '{name}' has changed the {what} of value: the gradient of a tensor of "
                f"shape {tuple(g.shape)} was {was}, the hook returned {got}"
            )


def _finish_leaf(node: AccumulateGrad, grads: list, owned: list, wanted: _Capture,
                 create_graph: bool) -> None:
    """A leaf's gradient, after the leaf's hooks: captured for autograd.grad, or added
    into its .grad."""
    var = node.variable
    g = grads[0]
    if g is not None and var._hooks:
        _run_hooks({0: var._hooks}, grads, owned)
        g = grads[0]
    if wanted.at:
        wanted.take(node, grads)
    if wanted.grads is None and g is not None:
        _accumulate_leaf(var, g, owned[0], create_graph)
        if var._post_acc_hooks:
            _run_post_accumulate_hooks(var)


def _run_post_accumulate_hooks(var: Tensor) -> None:
    """Tensor.register_post_accumulate_grad_hook: hook(var) once var.grad holds the sum (what
    DistributedDataParallel starts a bucket's all-reduce from). A hook returns None."""
    for hook in tuple(var._post_acc_hooks):
        if hook(var) is not None:
            raise RuntimeError(
                "Tensor post accumulate grad hooks should return None. (The hook was given "
                f"the tensor of shape {tuple(var.shape)}; it may change its .grad in place.)")


def _accumulate_leaf(var: Tensor, g: Tensor, owned: bool, create_graph: bool = False) -> None:
    if _tracers:
        _tell_tracers("on_leaf", var, g)
    if create_graph:  # as torch: .grad keeps the gradient's graph (a clone, then sums)
        if var.grad is None:
            g = g.clone() if g.dtype == var.dtype else g.to(var.dtype)
            g._storage.category = "gradient"
            var.grad = g
        else:
            var.grad = var.grad + g
        return
    if var._grad is None:
        if not owned or g.dtype is not var.dtype:  # never alias another tensor's memory
            reason = "broadcast-grad" if 0 in g._strides else "grad-clone"
            g = from_array(backend.copy(g._array(), var.dtype), reason)
        g._storage.category = "gradient"
        if g._shape == var._shape and g.device == var.device and g is not var:
            var._grad = g  # what the .grad setter's checks would pass (the dtype is var's)
        else:
            var.grad = g  # its error
    else:
        grad = var.grad  # may be a user's assignment: an expanded one would sum into one cell
        if 0 in grad._strides and has_internal_overlap(grad._shape, grad._strides):
            raise RuntimeError(
                "backward: unsupported operation: more than one element of the written-to "
                f"tensor refers to a single memory location (.grad of shape {grad.shape}, "
                f"strides {grad._strides}). Please clone() the tensor before accumulating "
                "into it."
            )
        _add_inplace(grad, g)


def _retain_grads(node: Node, grads: list, owned: list) -> None:
    """Non-leaf tensors that asked for retain_grad() get their gradient as .grad (called for
    a node that has such tensors)."""
    for nr, ref in node._retained.items():
        t = ref()
        if t is not None and grads[nr] is not None:
            t.grad = grads[nr] if t.grad is None else t.grad + grads[nr]
            owned[nr] = False  # now visible as t.grad


def _run_node(node: Node, grads: list, create_graph: bool) -> tuple:
    """The node's backward, told to any open trace (what it got, what it hands on)."""
    if _tracers:
        _tell_tracers("on_receive", node, grads)
    results = (_node_backward_recorded if create_graph else _node_backward)(node, grads)
    if _tracers:
        _tell_tracers("on_hand_on", node, results)
    return results


def _node_backward(node: Node, grads: list) -> tuple:
    """The node's backward: one gradient (or None) per input edge."""
    missing = _count_is(grads, None)
    if missing == len(grads):
        return (None,) * len(node.next_functions)
    if missing:
        _materialize(node, grads)
    # as in Function.apply: _relabel's work written out, and NumPy's warnings off
    here, mode = ledger_state.local, GradMode
    labels, enabled = here.labels, mode.enabled
    here.labels = {**labels, "op": node.name, "scope": node.scope, "call": id(node)}
    mode.enabled = False
    quiet = quiet_fp_errors()
    try:
        results = node.fn.backward(node, *grads)
    finally:
        restore_fp_errors(quiet)
        here.labels, mode.enabled = labels, enabled
    return _checked_results(node, results)


def _materialize(node: Node, grads: list) -> None:
    """Zeros for the outputs that got no gradient, unless the op takes None."""
    if node.materialize_grads:
        for i, g in enumerate(grads):
            if g is None:
                shape, dtype, device = node._outputs_meta[i]
                grads[i] = from_array(_zeros_array(shape, dtype, device))


def _node_backward_recorded(node: Node, grads: list) -> tuple:
    """The node's backward with create_graph: the same backward, recorded. It sees its
    gradients and saved tensors as Recorded proxies (autograd/graph.py), whose arrays
    record every NumPy call as an engine op (ops/_recorded.py); what it returns is taken
    back out of the proxies, and a lazy gradient (a slice's, a view's) is written into its
    buffer by recorded ops."""
    if _count_is(grads, None) == len(grads):
        return (None,) * len(node.next_functions)
    _materialize(node, grads)
    seen = [None if g is None else Recorded(g) for g in grads]
    prev = _relabel(op=node.name, scope=node.scope, call=id(node), grad_enabled=True)
    recording_state.on = True
    quiet = quiet_fp_errors()
    try:
        results = node.fn.backward(node, *seen)
    finally:
        restore_fp_errors(quiet)
        recording_state.on = False
        _restore(prev)
    if not isinstance(results, tuple):
        results = (results,)
    results = tuple(_recorded_result(r) for r in results)
    if any(type(r) is Tensor and not r.requires_grad for r in results):
        results = _linked_to_sources(node, results)
    return _checked_results(node, results)


def _linked_to_sources(node: Node, results: tuple) -> tuple:
    """A gradient that came out constant (relu's g * mask, a piecewise-linear op) still
    depends, with derivative zero, on the input it is for: as in torch, it gets a graph to
    that input, so that differentiating it gives zeros rather than "does not require grad"
    (the Hessian of a ReLU network is zero, not an error). The input is stood for by an
    alias of the gradient itself (same shape and dtype) whose history is the input's."""
    out = list(results)
    for i, (r, edge) in enumerate(zip(results, node.next_functions)):
        if type(r) is Tensor and not r.requires_grad and edge is not None:
            if isinstance(edge[0], AccumulateGrad):
                source = edge[0].variable
            else:
                source = r.detach()
                source.requires_grad, source.grad_fn, source._output_nr = True, *edge
            out[i] = ZeroDerivative.apply(r, source)
    return tuple(out)


def _recorded_result(g):
    """A gradient a recorded backward returned, as a tensor with its graph."""
    g = unwrap(g)
    if type(g) is SliceGrad:
        buf = from_array(_zeros_array(g.base_shape, g.grad.dtype, g.grad.device))
        buf[g.index] = unwrap(g.grad)  # recorded: the slice's gradient flows back through it
        return buf
    if type(g) is ReshapeGrad:
        return unwrap(g.grad).reshape(g.shape)
    return g


def _checked_results(node: Node, results) -> tuple:
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
        shape = g._shape if type(g) is Tensor else g.shape
        if shape != expected and tuple(shape) != tuple(expected):
            raise RuntimeError(
                f"{node.name}: backward returned a gradient of shape {tuple(g.shape)} for input "
                f"{i} of shape {tuple(expected)}"
            )
    return results


# ----------------------------------------------------------------------------- freeing
def _free(node: Node, late_free: list | None) -> None:
    """Drop the node's saved tensors now that its backward ran (called unless retain_graph,
    for a node that saved some)."""
    if late_free is not None:  # the emulated habit: keep saved tensors to the end
        late_free.append(node._saved)
    node.release()


# ----------------------------------------------------------------------------- handing on
class _Sharing:
    """Who else holds the memory of a node's gradients, for deciding which returned ones the
    engine may later add into in place: only a dense buffer that nothing else holds, so
    not (a view of) an incoming gradient someone else may hold, nor one returned for two
    inputs at once. An incoming gradient the engine owned passes that on to a view of it
    (the gradient of a transpose is a transpose of the gradient)."""

    __slots__ = ("shared_in", "returned")

    def __init__(self, grads: list, owned: list, results: tuple):
        shared_in, returned = [], []  # plain loops: a node's few gradients
        for g, own in zip(grads, owned):
            if g is not None and not own:
                shared_in.append(g._storage)
        for g in results:
            if g is not None:
                returned.append((g.grad if type(g) in _LAZY else g)._storage)
        self.shared_in, self.returned = shared_in, returned

    def may_own(self, t: Tensor) -> bool:
        st = t._storage
        return st not in self.shared_in and self.returned.count(st) == 1 and _dense(t)


def _hand_on(node: Node, results: tuple, sharing: _Sharing, pending: dict, consumers: dict,
             ready: _Ready, held: _Held, create_graph: bool) -> None:
    """Add each returned gradient into the pending slot of the node it is for; a node whose
    consumers have all run is ready."""
    held.arrived = None
    for edge, g in zip(node.next_functions, results):
        if edge is None:
            continue
        nxt, nr = edge
        if g is not None:
            lazy = type(g) in _LAZY
            base = g.grad if lazy else g  # a lazy gradient's piece
            entry = pending.get(nxt)
            if entry is None:
                entry = pending[nxt] = _new_slots(nxt)
            held.routed = (base, entry)
            slots, owned = entry
            # whether the engine may own it matters only to the slot's first gradient
            is_owned = slots[nr] is None and not create_graph and sharing.may_own(base)
            how = _accumulate(slots, owned, nr, g, is_owned, create_graph)
            if _tracers and lazy:
                _tell_tracers("on_lazy", nxt, nr, g, how)
            if how != "first":
                _notify("on_accumulate", nxt, nr, how, base.nbytes)
        consumers[nxt] -= 1
        if consumers[nxt] == 0:
            ready.push(nxt)


def _dense(t: Tensor) -> bool:
    """No element is reached twice (no stride-0 broadcast dim): safe to add into in place."""
    strides = t._strides
    return 0 not in strides or all(st != 0 or n == 1 for n, st in zip(t._shape, strides))


def _count_is(items, x) -> int:
    """How many of items are x itself (identity, not equality)."""
    n = 0
    for item in items:
        if item is x:
            n += 1
    return n


# ----------------------------------------------------------------------------- accumulation
def _accumulate(pending: list, owned: list, nr: int, g, is_owned: bool,
                create_graph: bool = False) -> str:
    """Add one more gradient into pending[nr]; says 'first', 'in-place' or 'new-buffer'.

    `owned[nr]` says whether the engine alone holds the pending buffer, so it may add into
    it in place; a pending gradient that is shared (passed through an add, say) is summed
    out of place once, and that new buffer is then owned.
    """
    cur = pending[nr]
    if cur is None:
        pending[nr], owned[nr] = g, is_owned and not create_graph
        return "first"
    if create_graph:  # a recorded sum: the gradient's graph goes through both terms
        if tuple(g.shape) != tuple(cur.shape):
            g = g.reshape(cur.shape)
        pending[nr], owned[nr] = cur + g, False
        return "new-buffer"
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


# ----------------------------------------------------------------------------- lazy gradients
class SliceGrad:
    """The gradient of a slice, not yet written into a base-sized buffer.

    `index` is the basic index (ints, slices, None, ...) that took the slice from a tensor
    of `base_shape`. Several SliceGrads of one base are written into one buffer.
    """

    __slots__ = ("base_shape", "index", "grad", "op", "scope")

    def __init__(self, base_shape, index: tuple, grad: Tensor):
        self.base_shape, self.index, self.grad = base_shape, index, grad
        # the backward that made it, for the ledger when the buffer is allocated later
        labels = ledger_state.local.labels  # this thread's
        self.op, self.scope = labels["op"], labels["scope"]

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
        with ledger_state.labelled(op=self.op, scope=self.scope):
            buffer = from_array(_zeros_array(self.base_shape, g.dtype, g.device), "slice-grad")
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
        labels = ledger_state.local.labels  # this thread's
        self.op, self.scope = labels["op"], labels["scope"]

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
        with ledger_state.labelled(op=self.op, scope=self.scope):
            arr = backend.copy(self.grad._array()).reshape(self.shape)
            return from_array(arr, "reshape-copy")


_LAZY = (SliceGrad, ReshapeGrad)
