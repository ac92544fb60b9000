"""Array backends: NumPy on "cpu", CuPy on "cuda[:N]".

This package is the only place in the project that imports numpy or cupy. Everything above
it asks for the array namespace of a device (`xp_for`) and for the few operations whose
spelling differs between the two libraries (strided views, scatter-add, erf, RNG, DLPack).

    dtypes       DType, the dtype table, to_dtype, dtype_of, torch's promotion (promote,
                 promote_types, result_type, floating, accumulating), the default dtype,
                 errstate
    devices      canonical_device, xp_for, on_device, synchronize, CUDA availability, and
                 the array-module install hook the fake-CuPy tests use
    layout       flat buffers, strided views, copies, host/device transfer, asarray, DLPack
    kernels      the fused kernels the ops call (`kernels.NAME`): the NumPy reference and
                 the compiled (numba) twins, chosen per call; set_kernels, get_kernels
    threads      one thread count for OpenBLAS and the compiled kernels (set_num_threads)
    random       Generator, one seeded stream per device
    host_memory  what the allocators hold: glibc's malloc and CuPy's pool

The names below are the backend's API (`backend.xp_for(...)`, `backend.float32`).
"""

from __future__ import annotations  # noqa: I001 - threads first: see its line

from . import threads  # noqa: F401 - first: it loads NumPy, with OpenBLAS's variables set
from . import devices, kernels  # noqa: F401
from .devices import (  # noqa: F401
    _install_array_module,
    canonical_device,
    cuda_device_count,
    cuda_is_available,
    device_of,
    is_array,
    on_device,
    synchronize,
    xp_for,
)
from .dtypes import (  # noqa: F401 - _dtype_by_name: pickled DTypes made before the split
    DTYPES,
    DType,
    _dtype_by_name,
    accumulating,
    bool_,
    category,
    dtype_of,
    errstate,
    float16,
    float32,
    float64,
    floating,
    get_default_dtype,
    int8,
    int16,
    int32,
    int64,
    promote,
    promote_types,
    result_type,
    set_default_dtype,
    to_dtype,
    uint8,
)
from .host_memory import (  # noqa: F401
    available_bytes,
    keep_freed_host_memory,
    keeps_freed_host_memory,
    pool_tracker,
    release_host_memory,
    reserved_bytes,
)
from .kernels import (  # noqa: F401
    adamw_update,
    compiler_paused,
    erf,
    gelu_backward,
    gelu_cdf,
    gelu_forward,
    get_kernels,
    index_add,
    masked_fill,
    scatter_add,
    set_kernels,
)
from .layout import (  # noqa: F401
    asarray,
    ascontiguous,
    copy,
    data_ptr,
    ensure_array,
    flat_buffer,
    from_dlpack,
    span_view,
    strided,
    to_device,
    to_host,
)
from .random import Generator  # noqa: F401
from .threads import get_num_threads, matmul, set_num_threads  # noqa: F401

# `cp` (the GPU array library) and `ndarray_types` are rebound by _install_array_module, so
# they are not copied here, where the copy would go stale: `backend.cp` reads the live one.
_LIVE_IN_DEVICES = ("cp", "ndarray_types")


def __getattr__(name: str):
    if name in _LIVE_IN_DEVICES:
        return getattr(devices, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
