"""drainpipe.processes: giving freed heap memory back to the system."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

#: a fresh process whose heap holds ~200 MB freed but resident: 400 blocks of 512 KB allocated after glibc's
#: dynamic mmap threshold was raised (so they come from the heap, not from mmap), all freed but the last, which
#: pins the heap's top (so free() cannot give the rest back). It prints its resident MB before and after the call.
FRAGMENTED = textwrap.dedent(
    """
    from drainpipe.processes import release_free_memory

    def rss_mb():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20

    big = bytearray(2 << 20)
    del big
    blocks = [bytes(bytearray(512 << 10)) for _ in range(400)]
    keep = blocks[-1]
    del blocks
    before = rss_mb()
    released = release_free_memory()
    print(before, rss_mb(), released)
    """
)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or sys.platform != "linux", reason="glibc's malloc_trim")
def test_freed_heap_memory_goes_back_to_the_system() -> None:
    out = subprocess.run([sys.executable, "-c", FRAGMENTED], capture_output=True, text=True, check=True).stdout
    before, after, released = out.split()
    assert released == "True"
    assert int(before) - int(after) >= 150, out  # ~200 MB was free but resident
