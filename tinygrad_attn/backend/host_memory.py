"""What the allocators hold: glibc's malloc on the host (mallopt, malloc_trim, mallinfo2) and
CuPy's memory pool on a GPU (reserved_bytes, pool_tracker).

Importing this module keeps freed host memory in the process (see below) unless
TINYGRAD_ATTN_KEEP_HOST_MEMORY=0 is set.
"""

from __future__ import annotations

import os

from . import devices
from .devices import canonical_device, on_device

# ----------------------------------------------------------------------------- host allocator
# A training step frees and re-allocates the same large buffers every step. glibc's malloc
# serves blocks above its mmap threshold with fresh mmap()s and unmaps them on free, and
# trims the top of the heap, so each step page-faults its activations in again (measured
# here: about 22,000 minor faults and 0.3-0.6 s of system time per shakespeare-char step at
# batch 8). keep_freed_host_memory() makes malloc keep freed memory in the process (no
# mmap for big blocks, no trimming): its size-binned free lists then act as a buffer
# cache, and a step reuses the pages of the one before. This is process-wide, like CuPy's
# memory pool is per device; reserved_bytes() reports what the process holds.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_GLIBC_DEFAULTS = {_M_TRIM_THRESHOLD: 128 * 1024, _M_MMAP_MAX: 65536}
_host = {"libc": None, "keep": False}


def _libc():
    if _host["libc"] is None:
        import ctypes
        import ctypes.util
        import platform

        lib = False
        if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                lib.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
                lib.malloc_trim.argtypes = (ctypes.c_size_t,)
                if hasattr(lib, "mallinfo2"):

                    class Mallinfo2(ctypes.Structure):
                        _fields_ = [(name, ctypes.c_size_t) for name in (
                            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                            "fsmblks", "uordblks", "fordblks", "keepcost")]

                    lib.mallinfo2.restype = Mallinfo2
            except (OSError, AttributeError):
                lib = False
        _host["libc"] = lib
    return _host["libc"]


def keep_freed_host_memory(keep: bool = True) -> bool:
    """Keep (True) or return (False) freed host memory; False where malloc is not glibc's.

    Turning it off gives the cached memory back to the system (malloc_trim) and restores
    glibc's default thresholds, but not their dynamic adjustment, which any mallopt call
    switches off for the process: glibc's untouched behaviour needs
    TINYGRAD_ATTN_KEEP_HOST_MEMORY=0 in the environment before the engine is imported."""
    lib = _libc()
    if not lib:
        return False
    if keep:
        ok = lib.mallopt(_M_MMAP_MAX, 0) == 1 and lib.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    else:
        ok = all(lib.mallopt(k, v) == 1 for k, v in _GLIBC_DEFAULTS.items())
        lib.malloc_trim(0)
    _host["keep"] = bool(keep and ok)
    return ok


def keeps_freed_host_memory() -> bool:
    return _host["keep"]


def release_host_memory() -> None:
    """Give free cached host memory back to the system now (malloc_trim)."""
    lib = _libc()
    if lib:
        lib.malloc_trim(0)


def pool_tracker(device: str):
    """A CuPy memory hook (use it as a context manager) that counts the bytes CuPy's pool
    hands out on `device` and takes back, every array included (temporaries inside ops
    too): `.live` (net since entering, can go negative when older arrays die) and `.peak`."""
    index = int(canonical_device(device)[5:])

    class _PoolTracker(devices.cp.cuda.MemoryHook):
        name = "tinygrad_attn.memory"

        def __init__(self):
            self.live = 0
            self.peak = 0

        def malloc_postprocess(self, **kw):
            if kw.get("device_id", index) == index:
                self.live += kw["mem_size"]
                if self.live > self.peak:
                    self.peak = self.live

        def free_postprocess(self, **kw):
            if kw.get("device_id", index) == index:
                self.live -= kw["mem_size"]

    return _PoolTracker()


def reserved_bytes(device: str = "cpu"):
    """Bytes the allocator holds from the system for `device` (live + cached), or None.

    cpu: the whole process's malloc heap (glibc's mallinfo2: arena + mmapped), so it also
    counts Python objects and other libraries' memory. cuda:N: CuPy's default memory pool."""
    if device != "cpu":
        if devices.cp is None:
            return None
        with on_device(device):
            return int(devices.cp.get_default_memory_pool().total_bytes())
    lib = _libc()
    if not lib or not hasattr(lib, "mallinfo2"):  # glibc before 2.33
        return None
    info = lib.mallinfo2()
    return int(info.arena + info.hblkhd)


def available_bytes(device: str = "cpu"):
    """Bytes `device` could still give this process, or None where that cannot be read.

    cpu: the kernel's MemAvailable (what can be had without swapping), else the physical
    memory. A GPU's is not read yet (None): no GPU has run this code. For refusing an
    impossible size in one line before allocating it."""
    if device != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


# on by default (TINYGRAD_ATTN_KEEP_HOST_MEMORY=0 leaves malloc as it was)
if os.environ.get("TINYGRAD_ATTN_KEEP_HOST_MEMORY", "1") != "0":
    keep_freed_host_memory(True)
