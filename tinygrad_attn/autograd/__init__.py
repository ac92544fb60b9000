"""Reverse-mode autodiff: the graph forward records, and the engine that runs it backward.

An op is a `Function` subclass with `forward(ctx, ...)` and `backward(ctx, *grads)` side by
side (PyTorch's autograd.Function); `graph` holds what forward records (grad mode, nodes,
saved tensors with their version checks, `Function.apply`), `engine` what backward does
with it (ordering, accumulation, freeing, `backward` and `grad`), `trace` a record of one
backward run, step by step.
"""

from .engine import (  # noqa: F401
    ReshapeGrad,
    SliceGrad,
    backward,
    grad,
    queue_callback,
    run_backward,
)
from .graph import (  # noqa: F401
    AccumulateGrad,
    Function,
    GradMode,
    Node,
    _HookHandle,
    check_inplace,
    enable_grad,
    gradient_edge,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from .trace import Trace, trace  # noqa: F401


def __getattr__(name: str):
    # ta.autograd.functional (jacobian, hessian, vjp, jvp, hvp, vhp) sits above the op layer
    # (it builds tensors with the ops); bound on first use so that autograd never imports it
    if name == "functional":
        import importlib

        module = importlib.import_module(f"{__name__}.functional")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
