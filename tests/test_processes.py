"""drainpipe.processes: giving freed heap memory back to the system."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

#: a fresh process whose heap holds ~200 MB freed but resident: 400 blocks of 512 KB allocated with glibc's mmap
#: threshold at 1 MB (so they come from the heap, not from mmap), all freed but the last, which pins the heap's top
#: (so free() cannot give the rest back). It prints its resident MB, then after a call whose threshold is more than
#: is free (nothing given back), then after a call with the default threshold.
FRAGMENTED = textwrap.dedent(
    """
    import ctypes, os
    from drainpipe.processes import release_free_memory

    ctypes.CDLL(None).mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD (fixed: whatever the environment set)

    def rss_mb():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20

    blocks = [bytes(bytearray(512 << 10)) for _ in range(400)]
    keep = blocks[-1]
    del blocks
    before = rss_mb()
    held = release_free_memory(1 << 40)
    after_held = rss_mb()
    released = release_free_memory()
    print(before, held, after_held, released, rss_mb())
    """
)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or sys.platform != "linux", reason="glibc's malloc_trim")
def test_freed_heap_memory_goes_back_to_the_system_when_enough_is_free() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES", "LD_PRELOAD"))}
    out = subprocess.run([sys.executable, "-c", FRAGMENTED], capture_output=True, text=True, check=True, env=env)
    before, held, after_held, released, after = out.stdout.split()
    assert held == "False" and int(before) - int(after_held) < 50, out.stdout  # less free than asked: kept
    assert released == "True" and int(before) - int(after) >= 150, out.stdout  # ~200 MB was free but resident
