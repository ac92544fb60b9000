"""ta.backends: torch's backend switches (TF32, cuDNN, MPS), recorded and without effect.

The switches a training script sets for speed on a GPU (`backends.cuda.matmul.allow_tf32 =
True`, `backends.cudnn.benchmark = True`) choose kernels the engine does not have: its GPU
path is CuPy's and its CPU path NumPy's, neither with TF32 or cuDNN autotuning. They are
plain attributes here, so a script sets and reads them back, and results stay as the engine
computes them. `set_float32_matmul_precision` and `compile` are of the same kind.
"""

from __future__ import annotations

import sys
import warnings

from . import cpu, cuda, cudnn, mps  # noqa: F401

_PRECISIONS = ("highest", "high", "medium")
_precision = ["highest"]


def get_float32_matmul_precision() -> str:
    return _precision[0]


def set_float32_matmul_precision(precision: str) -> None:
    """Record torch's float32 matmul precision ('highest', 'high', 'medium'). 'high' and
    'medium' let torch use TF32 on a GPU; the engine always computes float32 matmuls in
    float32, so the value is recorded (and mirrored in `cuda.matmul.allow_tf32`, as torch
    does) and changes no result."""
    if precision not in _PRECISIONS:  # torch warns and keeps the setting
        warnings.warn(f"set_float32_matmul_precision: {precision!r} is not one of "
                      f"{_PRECISIONS}; the call has no effect", UserWarning, stacklevel=2)
        return
    _precision[0] = precision
    cuda.matmul.allow_tf32 = precision != "highest"


_said = [False]


def compile(model=None, **options):  # noqa: A001 - torch's name
    """torch.compile: the engine has no compiler, so the model or function comes back
    unchanged (results are the engine's), and stderr says so once per process. With no
    model, a decorator (`@compile(mode=...)`), as torch's."""
    if model is None:
        return lambda fn: compile(fn, **options)
    if not _said[0]:
        _said[0] = True
        print("tinygrad_attn: compile() returns the model unchanged (the engine has no "
              "compiler; results are not affected)", file=sys.stderr)
    return model
