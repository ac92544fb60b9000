"""tinygrad_attn: a small reverse-mode autodiff engine on NumPy (CPU) and CuPy (GPU).

Strided zero-copy views, batched matmul and softmax, and a memory ledger that explains
where the bytes of a training step go. See README.md and docs/design.md.
"""

import math as _math  # noqa: I001 - below, the tensor module must be imported first

from . import tensor as _tensor_module  # noqa: F401,I001 - first: binds the op layer
from . import autograd, backend, checkpoint, cuda, functional, linalg, memory, ops  # noqa: F401
from . import viz  # noqa: F401 - ta.viz.draw(loss): the graph as SVG / DOT
from . import accelerator, amp, backends, creation, distributed  # noqa: F401 - torch's names
from .accelerator import device  # noqa: F401
from .amp import GradScaler, autocast, is_autocast_enabled  # noqa: F401
from .autograd import (  # noqa: F401
    Function, enable_grad, inference_mode, is_grad_enabled, is_inference_mode_enabled, no_grad,
    set_grad_enabled,
)
from .backend.dtypes import bfloat16  # noqa: F401 - a name only: tensors of it are refused
from .backend.dtypes import finfo, iinfo  # noqa: F401
from .backends import (  # noqa: F401
    compile, get_float32_matmul_precision, set_float32_matmul_precision,
)
from .backend import (  # noqa: F401
    DType, bool_, float16, float32, float64, get_default_dtype, get_num_threads, int8, int16,
    int32, int64, promote_types, set_default_dtype, set_num_threads, uint8,
)
from .creation import (  # noqa: F401
    arange, empty, empty_like, eye, from_dlpack, from_numpy, full, full_like, linspace,
    get_rng_state, manual_seed, ones, ones_like, rand, rand_like, randint, randn, randn_like,
    set_rng_state, tensor, zeros, zeros_like,
)
from .errors import DeviceMismatchError, OutOfMemoryError, ShapeError  # noqa: F401
from .gradcheck import GradcheckError, gradcheck, gradgradcheck  # noqa: F401
from .storage import Storage  # noqa: F401
from .backend import Generator  # noqa: F401
from .tensor import Tensor  # noqa: F401

bool = bool_  # noqa: A001 - ta.bool, as torch.bool
float = float32  # noqa: A001 - ta.float, as torch.float
double = float64
long = int64
short = int16
half = float16

globals().update(ops.names("ta"))  # ta.exp, ta.softmax, ta.checkpoint, ...: each op says
dtype = DType  # isinstance(x, ta.dtype), as torch.dtype
e, pi, inf, nan = _math.e, _math.pi, _math.inf, _math.nan  # as torch.e, torch.pi, ...
newaxis = None  # x[:, ta.newaxis], as torch.newaxis

# Names bound on first use (PEP 562), so that modules other parts of the project add appear
# here without an edit, and so that `nn` (the top-level package of modules, layers and
# optimizers, which sits above the engine) is reachable as ta.nn without the engine importing
# it: the one upward reference, a namespace only (docs/design.md, "The torch-shaped
# namespace"). name -> (module, attribute or None for the module itself).
_LAZY = {
    "nn": ("nn", None),
    "optim": ("nn", "optim"),
    "utils": ("tinygrad_attn.utils", None),
    "func": ("tinygrad_attn.func", None),
    "random": ("tinygrad_attn.random", None),
    "return_types": ("tinygrad_attn.return_types", None),
    "serialization": ("tinygrad_attn.serialization", None),
    "save": ("tinygrad_attn.serialization", "save"),
    "load": ("tinygrad_attn.serialization", "load"),
    "seed": ("tinygrad_attn.random", "seed"),
    "initial_seed": ("tinygrad_attn.random", "initial_seed"),
    "default_generator": ("tinygrad_attn.creation", "default_generator"),
}


def __getattr__(name: str):
    import importlib

    where = _LAZY.get(name)
    if where is not None:
        module_name, attr = where
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:  # a module that exists and fails: its own error
                raise
            module = None
        value = module if attr is None else getattr(module, attr, None)
        if value is None:
            raise AttributeError(f"module 'tinygrad_attn' has no attribute {name!r}: "
                                 f"{module_name}{'.' + attr if attr else ''} does not exist "
                                 "yet (docs/torch-coverage.md lists what exists)")
        globals()[name] = value
        return value
    made = getattr(creation, name, None)  # a factory added to creation.py (ta.randperm)
    if callable(made) and getattr(made, "__module__", None) == creation.__name__ \
            and not name.startswith("_"):
        globals()[name] = made
        return made
    raise AttributeError(
        f"module 'tinygrad_attn' has no attribute {name!r}: the engine does not provide "
        f"torch.{name} (docs/torch-coverage.md lists what exists and what does not; "
        "docs/differences.md the deliberate differences)")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "Tensor", "Storage", "Function", "no_grad", "enable_grad", "set_grad_enabled",
    "is_grad_enabled", "tensor", "zeros", "ones", "empty", "full", "arange", "randn", "rand",
    "randint", "zeros_like", "ones_like", "manual_seed", "gradcheck", "gradgradcheck",
    "from_dlpack", "set_num_threads", "get_num_threads", "device", "inference_mode", "autocast",
    "bfloat16", "compile",
]
