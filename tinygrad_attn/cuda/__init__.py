"""ta.cuda: whether a GPU is usable through CuPy, and torch.cuda's everyday calls.

Without a GPU these behave as torch's do there: `is_available()` is False, `device_count()`
0, `manual_seed`/`manual_seed_all`/`empty_cache` do nothing, `is_bf16_supported()` is False,
and the calls that need a device (`current_device`, `get_device_name`, `set_device`) raise
torch's AssertionError. `synchronize` is a no-op without a GPU (torch raises there), so
timing code runs on both.
"""

from .. import backend
from .. import creation as _creation
from ..memory import state as _ledger
from . import amp  # noqa: F401 - ta.cuda.amp.autocast / GradScaler


def is_available() -> bool:
    return backend.cuda_is_available()


def device_count() -> int:
    return backend.cuda_device_count()


def is_initialized() -> bool:
    return is_available()


def _need_gpu(op: str) -> None:
    if not is_available():
        raise AssertionError(f"cuda.{op}: CUDA is not available (no GPU through CuPy)")


def synchronize(device=None) -> None:
    """Wait for the GPU's queued kernels to finish (a no-op without one), as
    torch.cuda.synchronize: time GPU work between two synchronize() calls."""
    backend.synchronize(device)


def current_device() -> int:
    _need_gpu("current_device")
    return int(backend.canonical_device("cuda").split(":")[1])


def set_device(device) -> None:
    _need_gpu("set_device")
    index = device if isinstance(device, int) else int(
        backend.canonical_device(device).split(":")[1])
    backend.cp.cuda.Device(index).use()


def get_device_name(device=None) -> str:
    _need_gpu("get_device_name")
    index = current_device() if device is None else (
        device if isinstance(device, int) else int(backend.canonical_device(device)[5:]))
    name = backend.cp.cuda.runtime.getDeviceProperties(index)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def manual_seed(seed: int) -> None:
    """torch seeds the current GPU's generator. The engine's GPU streams are drawn from its
    one default generator's seed, so with a GPU this reseeds that generator (every device,
    as ta.manual_seed); without one it does nothing, as torch."""
    if is_available():
        _creation.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """Every GPU's generator: as manual_seed (the engine's GPUs share one seed)."""
    manual_seed(seed)


def empty_cache() -> None:
    """Give the GPU memory pool's free blocks back to the device (a no-op without a GPU)."""
    if is_available():
        backend.cp.get_default_memory_pool().free_all_blocks()


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """False: the engine has no bfloat16 on any device."""
    return False


def _gpu(device) -> str | None:
    """The canonical "cuda:N" for a torch.cuda device argument, None without a GPU."""
    if not is_available():
        return None
    if device is None:
        return backend.canonical_device("cuda")
    return backend.canonical_device(f"cuda:{device}" if isinstance(device, int) else device)


def memory_allocated(device=None) -> int:
    """Bytes held by live tensors on the GPU, from the engine's ledger (0 without a GPU, as
    torch). The ledger counts tensors' storages, as torch counts its allocator's blocks, so
    the two differ by the allocator's rounding."""
    gpu = _gpu(device)
    return 0 if gpu is None else _ledger.live_bytes.get(gpu, 0)


def max_memory_allocated(device=None) -> int:
    """The high-water mark of memory_allocated since the start or reset_peak_memory_stats."""
    gpu = _gpu(device)
    return 0 if gpu is None else _ledger.peak_bytes.get(gpu, 0)


def reset_peak_memory_stats(device=None) -> None:
    gpu = _gpu(device)
    if gpu is not None:
        with _ledger.lock:
            _ledger.peak_bytes[gpu] = _ledger.live_bytes.get(gpu, 0)


def memory_reserved(device=None) -> int:
    """Bytes CuPy's memory pool holds from the GPU (0 without a GPU)."""
    gpu = _gpu(device)
    return 0 if gpu is None else int(backend.reserved_bytes(gpu) or 0)
