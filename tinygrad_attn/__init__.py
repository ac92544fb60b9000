"""tinygrad_attn: a small reverse-mode autodiff engine on NumPy (CPU) and CuPy (GPU).

Strided zero-copy views, batched matmul and softmax, and a memory ledger that explains
where the bytes of a training step go. See README.md and docs/design.md.
"""

from . import tensor as _tensor_module  # noqa: F401,I001 - first: binds the op layer
from . import autograd, backend, checkpoint, cuda, functional, linalg, memory, ops  # noqa: F401
from . import viz  # noqa: F401 - ta.viz.draw(loss): the graph as SVG / DOT
from .autograd import Function, enable_grad, is_grad_enabled, no_grad, set_grad_enabled
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
from .gradcheck import GradcheckError, gradcheck  # noqa: F401
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

__version__ = "0.1.0"

__all__ = [
    "Tensor", "Storage", "Function", "no_grad", "enable_grad", "set_grad_enabled",
    "is_grad_enabled", "tensor", "zeros", "ones", "empty", "full", "arange", "randn", "rand",
    "randint", "zeros_like", "ones_like", "manual_seed", "gradcheck", "from_dlpack",
    "set_num_threads", "get_num_threads",
]
