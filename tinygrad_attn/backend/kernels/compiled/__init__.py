"""The compiled kernels: numba, the only package in the project that imports it.

Each public function here has the name and signature of a kernel in `reference.py` and must
agree with it: to float32 tolerance where the arithmetic differs (a polynomial exp instead
of the C library's), bit for bit where it is the same. A function may return NotImplemented
for operands it does not take (the reference then runs); `kernels/__init__.py` has already
checked that the float operands are NumPy float32/float64 arrays of one dtype, C-contiguous.

How the kernels are written, and why (docs/kernels.md has the measurements):

- One pass each way: a kernel reads its inputs once and writes its outputs once, with no
  array-sized temporaries beyond the outputs the op returns. Rows (softmax, norms, loss) are
  spread over the threads with `prange`; elementwise kernels over blocks of elements.
- float32 math written out, not called: `math.exp` and `math.erf` compile to calls into the
  C library, one element at a time, which LLVM cannot vectorize (PyPI's llvmlite has no
  vector math library). `exp32` below is a short polynomial LLVM turns into SIMD code.
  float64 kernels use `math.exp`/`math.erf` (exact to rounding; float64 is for checks).
- `cache=True`: each kernel compiles once per dtype on first use (a fraction of a second)
  and loads from numba's on-disk cache after that (milliseconds).
- The threading layer is "workqueue" (unless NUMBA_THREADING_LAYER says otherwise), chosen
  before any kernel runs: numba's own pool, no OpenMP runtime to fight OpenBLAS's, and a
  pool that starts again in a forked child. It aborts the process when two threads launch
  parallel kernels at once, GIL or no GIL, so `kernels/__init__.py` calls the kernels here
  under one lock.
- fork: numba's compiler lock, held by a thread that is compiling, would be held forever in
  a child forked meanwhile. `fork_locks` names the locks a fork must find free, and
  `refuse_compiles` makes the child raise CompileRefused instead of waiting on one
  (kernels/__init__.py decides, at each fork, without waiting).
"""

from ._common import (  # noqa: F401
    CompileRefused,
    NotCached,
    cache_only,
    fork_locks,
    refuse_compiles,
    set_num_threads,
)
from .activations import (  # noqa: F401
    bias_gelu_backward,
    bias_gelu_forward,
    dropout_backward,
    dropout_forward,
    gelu_backward,
    gelu_forward,
    gelu_tanh_backward,
    gelu_tanh_forward,
)
from .attention import (  # noqa: F401
    attention_block_dscores,
    attention_block_forward,
    attention_block_probs,
)
from .norms import (  # noqa: F401
    add_layer_norm_backward,
    add_layer_norm_forward,
    cross_entropy_backward,
    cross_entropy_forward,
    layer_norm_backward,
    layer_norm_forward,
    rms_norm_backward,
    rms_norm_forward,
)
from .optim import adamw_update, adamw_update_many  # noqa: F401
from .softmax import (  # noqa: F401
    causal_softmax_block,
    causal_softmax_block_backward,
    log_softmax_backward,
    log_softmax_forward,
    masked_softmax_backward,
    masked_softmax_forward,
    softmax_backward,
    softmax_forward,
)
