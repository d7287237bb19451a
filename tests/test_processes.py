"""drainpipe.processes: giving freed heap memory back to the system."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
import threading

import pytest

from drainpipe.processes import HeapWatch, resident_bytes

#: a fresh process whose heap holds ~200 MB freed but resident: 400 blocks of 512 KB allocated with glibc's mmap
#: threshold at 1 MB (so they come from the heap, not from mmap), all freed but the last, which pins the heap's top
#: (so free() cannot give the rest back). It prints its resident MB, then whether the call gave some back, and its
#: resident MB after.
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
    released = release_free_memory()
    print(before, released, rss_mb())
    """
)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or sys.platform != "linux", reason="glibc's malloc_trim")
def test_freed_heap_memory_goes_back_to_the_system() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES", "LD_PRELOAD"))}
    out = subprocess.run([sys.executable, "-c", FRAGMENTED], capture_output=True, text=True, check=True, env=env)
    before, released, after = out.stdout.split()
    assert released == "True" and int(before) - int(after) >= 150, out.stdout  # ~200 MB was free but resident


class FakeProcess:
    """A resident set the test sets, and trims that give back what it says is free."""

    def __init__(self) -> None:
        self.rss, self.free, self.trims = 100 << 20, 0, 0
        self.trimmed = threading.Event()

    def resident(self) -> int:
        return self.rss

    def release(self) -> bool:
        self.trims += 1
        self.rss -= self.free
        given, self.free = self.free > 0, 0
        self.trimmed.set()
        return given


def test_the_heap_watch_trims_once_per_step_of_growth_over_the_highest_level_a_trim_left() -> None:
    proc = FakeProcess()
    heap = HeapWatch(32 << 20, resident=proc.resident, release=proc.release)
    proc.rss += 31 << 20
    assert not heap.check() and proc.trims == 0  # less than a step: nothing
    proc.rss, proc.free = proc.rss + (1 << 20), 20 << 20
    assert heap.check() and proc.trims == 1 and heap.trims == 1  # a step: trimmed, 20 MB back
    assert not heap.check() and proc.trims == 1  # (the level it left: 112 MB)
    proc.rss -= 40 << 20  # freed at a heap's top: the level stays where the trim left it
    proc.rss += 71 << 20
    assert not heap.check() and proc.trims == 1  # 143 MB: less than a step over 112
    proc.rss += 1 << 20
    assert not heap.check() and proc.trims == 2 and heap.trims == 1  # a trim that gave nothing back
    proc.rss += 31 << 20
    assert not heap.check() and proc.trims == 2  # its level is the new one (144 MB)
    assert not heap.release() and proc.trims == 3  # before a peak: whatever the growth


def test_the_heap_watch_trims_only_while_told_a_peak_is_under_way() -> None:
    proc, peak = FakeProcess(), [False]
    heap = HeapWatch(32 << 20, lambda: peak[0], resident=proc.resident, release=proc.release)
    proc.rss, proc.free = proc.rss + (64 << 20), 48 << 20
    assert not heap.check() and proc.trims == 0  # grown, but no peak
    peak[0] = True
    assert heap.check() and proc.trims == 1
    assert heap.release() is False and proc.trims == 2  # (release asks no one)


def test_the_heap_watch_thread_checks_until_stopped() -> None:
    proc = FakeProcess()
    heap = HeapWatch(1 << 20, resident=proc.resident, release=proc.release)
    heap.start(0.001)
    proc.free, proc.rss = 4 << 20, proc.rss + (8 << 20)
    assert proc.trimmed.wait(30)
    heap.stop()
    assert heap.trims == 1 and "drainpipe-heap" not in {t.name for t in threading.enumerate()}  # (joined)
    heap.stop()  # idempotent


@pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/statm")
def test_the_resident_set_is_read_from_the_kernel() -> None:
    before = resident_bytes()
    block = bytearray(64 << 20)  # (a page of it written in each: resident whatever the allocator gave)
    block[:: os.sysconf("SC_PAGE_SIZE")] = b"x" * len(range(0, len(block), os.sysconf("SC_PAGE_SIZE")))
    after = resident_bytes()
    assert before is not None and after is not None and after - before >= 48 << 20
    del block
