"""Activation checkpointing: keep a block's inputs, recompute its insides in backward.

    y = ta.checkpoint(block, x)

Forward runs `block` without recording a graph, so none of its intermediates are saved:
the checkpoint node saves only the tensor arguments. Backward restores the RNG state the
forward saw (so dropout draws the same masks), reruns `block` with recording on, and
backpropagates through that fresh graph: into the arguments (returned) and into whatever
parameters `block` used (accumulated into their .grad, as any backward does).

The ledger sees the checkpoint where it sees the call: the node sits in the scope a plain
call of `block` would run in ("transformer.h.3" for a GPT block), and the recompute runs
inside the module calls that were running in forward, so it is named as the forward was.

Under create_graph=True the rerun takes the arguments with their history, so gradients of
gradients flow through the block and into the arguments' producers. A parameter the block
reaches by itself is no input of the checkpoint node: its .grad is accumulated (with a
graph) as in the first-order backward, but the output's dependence on it is invisible to
the graph outside, as in torch's reentrant checkpoint; pass it as an argument when a
derivative through the output matters.
"""

from __future__ import annotations

from .autograd import Function, backward, enable_grad, grad
from .autograd.engine import _accumulate_leaf
from .autograd.graph import AccumulateGrad, recomputing, recording, recording_state, unwrap
from .creation import default_generator
from .memory import scopes as ledger_scopes
from .memory import state as ledger_state
from .ops.registry import op
from .tensor import Tensor


class Checkpoint(Function):
    """Saves only the tensor arguments (and the RNG state); recomputes fn in backward.
    A container: op observers hear the ops fn runs (their FLOPs), in forward and, marked
    as recompute, in the rerun."""

    container = True

    @staticmethod
    def forward(ctx, fn, *args):
        ctx.block = fn
        ctx.rng_state = default_generator.get_state()
        ctx.save_for_backward(*[a for a in args if type(a) is Tensor])
        ctx.positions = [i for i, a in enumerate(args) if type(a) is Tensor]
        # only through save_for_backward: the ledger sees them, and release frees them
        ctx.others = [None if type(a) is Tensor else a for a in args]
        ctx.module_calls = ledger_scopes.running_calls()
        out = fn(*args)
        if type(out) is not Tensor:
            raise TypeError(
                f"checkpoint: the function must return one Tensor, got {type(out).__name__}"
            )
        return out.detach()

    @staticmethod
    def backward(ctx, g):
        if recording():
            return _recorded_backward(ctx, g)
        saved = ctx.saved_tensors
        args = list(ctx.others)
        inputs = []
        for pos, t in zip(ctx.positions, saved):
            leaf = t.detach()
            leaf.requires_grad_(ctx.needs_input_grad[pos + 1] and t.dtype.is_floating_point)
            args[pos] = leaf
            inputs.append(leaf)
        out = _rerun(ctx, args)
        if out.requires_grad:
            backward([out], [g])
        grads = [None] * len(args)
        for pos, leaf in zip(ctx.positions, inputs):
            grads[pos] = leaf.grad
        return (None, *grads)


def _rerun(ctx, args: list):
    """The block again, on `args`, with grad mode on, forward's random state (so dropout
    draws the same masks) and its module scopes."""
    now = default_generator.get_state()
    default_generator.set_state(ctx.rng_state)
    try:
        with enable_grad(), ledger_scopes.resume_calls(ctx.module_calls), recomputing():
            return ctx.block(*args)
    finally:
        default_generator.set_state(now)


def _recorded_backward(ctx, g) -> tuple:
    """Checkpoint's backward under create_graph=True: the rerun takes the saved arguments
    with their history (through one view each, where its gradient is captured), so the
    gradients it returns have a graph into the block's insides and into the arguments'
    producers; the leaves the block reached by itself (its parameters) accumulate theirs
    with a graph, as the first-order backward accumulates them."""
    saved = unwrap(ctx.saved_tensors)
    g = unwrap(g)
    recording_state.on = False  # the rerun and its backward see plain tensors
    try:
        args = list(ctx.others)
        wanted = []
        for pos, t in zip(ctx.positions, saved):
            if ctx.needs_input_grad[pos + 1] and t.dtype.is_floating_point:
                args[pos] = t.view_as(t)
                wanted.append(pos)
            else:
                args[pos] = t.detach()
        out = _rerun(ctx, args)
        grads = [None] * len(args)
        leaves = _leaves_of(out, [args[pos] for pos in wanted]) if out.requires_grad else []
        if out.requires_grad and (wanted or leaves):
            found = grad([out], [args[pos] for pos in wanted] + leaves, [g],
                         create_graph=True, allow_unused=True)
            for pos, r in zip(wanted, found):
                grads[pos] = r
            for leaf, r in zip(leaves, found[len(wanted):]):
                if r is not None:
                    _accumulate_leaf(leaf, r, False, True)
    finally:
        recording_state.on = True
    return (None, *grads)


def _leaves_of(out: Tensor, args: list) -> list:
    """The leaves requiring grad that out's graph reaches other than through `args`."""
    stop = {id(a.grad_fn) for a in args}
    leaves, seen, todo = [], set(), [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen or id(node) in stop:
            continue
        seen.add(id(node))
        if type(node) is AccumulateGrad:
            leaves.append(node.variable)
            continue
        todo.extend(edge[0] for edge in node.next_functions if edge is not None)
    return leaves


@op(Checkpoint, ta=True)
def checkpoint(fn, *args) -> Tensor:
    """fn(*args), saving only args for backward and recomputing fn's insides there.

    Gradients equal the plain call's exactly; the RNG state is restored for the rerun.
    """
    if not callable(fn):
        raise TypeError(f"checkpoint: first argument must be callable, got {type(fn).__name__}")
    with ledger_state.labelled(scope=ledger_scopes.scope_of_call(fn)):
        return Checkpoint.apply(fn, *args)
