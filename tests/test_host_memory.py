"""The CPU backend keeps freed host memory for reuse, and the ledger reports it as reserved."""

import platform
import resource
import subprocess
import sys
import textwrap

import pytest

import tinygrad_attn as ta

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the host cache is glibc malloc's (mallopt/mallinfo2)")

N = 16 * 2**20 // 4  # 16 MiB of float32: far above glibc's default mmap threshold


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@glibc
def test_on_by_default_and_reserved_covers_live():
    assert ta.memory.keep_freed_host_memory(True) is True
    x = ta.ones(N)
    assert ta.memory.reserved_bytes() >= ta.memory.live_bytes() >= x.nbytes


@glibc
def test_freed_buffer_is_reused_without_page_faults():
    ta.memory.keep_freed_host_memory(True)
    x = ta.ones(N)  # the first time, the pages are faulted in
    del x
    held = ta.memory.reserved_bytes()
    f0 = _faults()
    y = ta.ones(N)  # same size again: served from the kept heap, already mapped
    faults = _faults() - f0
    assert faults < N * 4 // 4096 // 100, faults  # under 1% of its 4096 pages
    assert ta.memory.reserved_bytes() <= held + 2**20
    assert float(y.sum().item()) == N


@glibc
def test_turning_it_off_gives_memory_back():
    # a fresh process, so that the heap holds nothing but this buffer's 64 MiB
    script = textwrap.dedent("""
        import tinygrad_attn as ta
        start = ta.memory.reserved_bytes()
        x = ta.ones(16 * 2**20)
        grown = ta.memory.reserved_bytes() - start
        del x
        kept = ta.memory.reserved_bytes() - start
        assert ta.memory.keep_freed_host_memory(False)
        print(grown, kept, ta.memory.reserved_bytes() - start)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout.split()
    grown, kept, after = (int(v) for v in out)
    assert grown >= 60 * 2**20  # reserved grows with a live allocation
    assert kept >= 60 * 2**20  # freed, but kept for the next step
    assert after < 2**20  # given back


@glibc
def test_profile_reports_reserved_beside_live():
    with ta.memory.profile() as prof:
        x = ta.ones(N)
        y = x * 2
        del y
    s = prof.summary()
    assert s["keeps_freed_host_memory"] is True
    assert s["reserved_end_bytes"] >= s["end_bytes"]
    assert s["reserved_start_bytes"] > 0
    assert "reserved" in prof.report()
    del x


def test_available_bytes_reads_the_systems_memavailable():
    """What the examples compare an impossible size with: on Linux, /proc/meminfo's value."""
    got = ta.memory.available_bytes()
    assert got is not None and got > 0
    try:
        with open("/proc/meminfo") as f:
            line = next(x for x in f if x.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return  # elsewhere the physical memory stands in, checked above to be positive
    expected = int(line.split()[1]) * 1024
    assert abs(got - expected) < 2**28  # the two reads are moments apart
    assert ta.memory.available_bytes("cuda") is None  # not read on a GPU yet
