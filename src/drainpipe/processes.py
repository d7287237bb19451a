"""Process plumbing shared by the engine's worker processes and the server's helper processes: how many CPUs this
process may use (:func:`usable_cpus`), how to start them (:func:`mp_context`, :func:`process_pool`), how a child
dies with its parent (:func:`die_with`), and how a process drainpipe owns from start to exit is tuned
(:func:`tune_own_process`, :func:`tune_live_process`, :func:`hide_pandas`), and how it gives freed memory back
(:func:`release_free_memory`, :class:`HeapWatch`).

A leaf module: it imports nothing of drainpipe."""

from __future__ import annotations

import gc
import importlib.abc
import math
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

__all__ = [
    "HeapWatch",
    "die_with",
    "hide_pandas",
    "mp_context",
    "process_pool",
    "release_free_memory",
    "resident_bytes",
    "tune_live_process",
    "tune_own_process",
    "usable_cpus",
]


def tune_own_process() -> None:
    """Tune a process that drainpipe owns from start to exit (the ``drainpipe run`` command on the local engine),
    before it imports numpy or starts anything:

    * :func:`hide_pandas`;
    * one OpenBLAS thread (``OPENBLAS_NUM_THREADS=1`` unless the user set it; inherited by the workers): numpy's
      OpenBLAS starts a thread per core that spins after it starts, though drainpipe calls no BLAS routine, and its
      parallelism is its worker processes. Those threads took 0.11 s of CPU in a 1.3 s CSV run on two cores;
    * no transparent huge pages for it and every process it starts (Linux ``PR_SET_THP_DISABLE``, inherited by its
      workers). With THP at ``always``, each run's page faults went through huge-page allocation and compaction:
      1.1-1.7 s of kernel time on a 5M-event Parquet run against 0.5 s without, 2.9 s of wall time against 2.3 s
      (the reason databases such as Redis and MongoDB advise THP off)."""
    hide_pandas()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        import ctypes

        pr_set_thp_disable = 41
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_thp_disable, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        pass


def tune_live_process(switch_interval_s: float | None = None) -> None:
    """Tune a long-running live process that drainpipe owns (``drainpipe serve``, ``drainpipe consume``) and the
    helper processes it starts: Arrow's buffers come from the system allocator (``ARROW_DEFAULT_MEMORY_POOL=system``
    unless the user set the variable; inherited by the helpers); with ``switch_interval_s``, the interpreter's
    switch interval (``sys.setswitchinterval``, 5 ms by default): how long a thread that wants the GIL waits before
    the thread holding it is made to let it go, for a process whose answers wait for the GIL (``serve``).

    pyarrow's default pool (mimalloc) keeps the pages of freed buffers for reuse. A live process allocates a batch's
    buffers per request and per merge and frees them moments later, and the pool's pages stayed resident: under a
    saturated OTLP load, ``serve``'s process tree held 560 MB of PSS with mimalloc and 401-419 MB with the system
    allocator, at the same spans per CPU second (`docs/performance.md`, "Memory of the live path"). ``drainpipe run``
    keeps the default: a run ends, and its peak is its batches'.

    And :func:`hide_pandas`, as for ``drainpipe run``: pyarrow's first conversion of a Python value imported pandas
    into ``serve`` and ``consume`` (48 MB of PSS a process, each helper too: :mod:`drainpipe.server.channel`'s
    processes hide it themselves)."""
    hide_pandas()
    if switch_interval_s is not None:
        sys.setswitchinterval(switch_interval_s)
    if os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system") != "system":
        return
    if "pyarrow" in sys.modules:  # imported already, its default pool chosen: set it (C++ allocations follow)
        import pyarrow

        pyarrow.set_memory_pool(pyarrow.system_memory_pool())


def release_free_memory() -> bool:
    """Give the pages of the heap memory this process has freed back to the system (glibc's ``malloc_trim(0)``):
    True if some were given back. A no-op returning False where the C library has no ``malloc_trim``. Thread-safe
    (glibc locks each of its heaps in turn); it blocks for about 10 ms per hundred megabytes given back.

    glibc keeps freed memory for the next allocations: it returns only the free top of a heap, and a process that
    allocates and frees large buffers on many threads (a batch's columns, a merge's tables) keeps a few hundred
    megabytes free but resident in its heaps, which its next peak adds to. A page given back costs a page fault
    when it is used again, so this is for before a peak and during one, not for every turn of a loop
    (:class:`HeapWatch`: ``drainpipe consume``, `docs/performance.md`, "`consume`'s peak taken apart"). It acts on
    the whole process: only for processes drainpipe owns."""
    trim = _malloc_trim()
    return False if trim is None else bool(trim(0))


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """This process's resident set size in bytes (Linux ``/proc/self/statm``: a read of a few microseconds), None
    where there is no such file."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


class HeapWatch:
    """Gives the heap's freed memory back (:func:`release_free_memory`) before a peak (:meth:`release`) and, while
    ``when()`` says a peak is under way (always, without ``when``), each time the resident set has grown by ``step``
    bytes over the highest level a trim left (:meth:`check`; :meth:`start` runs it on a thread of its own every
    ``every_s`` seconds until :meth:`stop`).

    Why: a process that reads batches and merges states frees buffers of every size on several threads, and glibc
    keeps them in the heaps they came from, so a peak's resident set holds the free memory besides what is in use.
    Why only during a peak, in steps of growth: a page given back costs a page fault when it is used again, and a
    process that reads batches reuses most of its free memory at once (trimming all along cost ``consume`` a sixth
    of its CPU on messages of 100 events). Why over the highest level, not the last: growth back up to a level a
    trim left is mostly the reuse of what it gave back, and trimming that again pays the faults again; the peak is
    bounded all the same, at that level plus ``step``. Why a thread: ``consume``'s peak is a commit's merge on the
    persist thread, which allocates and frees its tables while the member waits for it; only a watcher beside it
    sees the growth in time. For processes drainpipe owns (the trim acts on the whole process).

    Thread-safety: :meth:`check` and :meth:`release` from any thread (``when`` is called on the thread that checks);
    :meth:`start` once, then :meth:`stop` from one thread. :meth:`release` and :meth:`check` block for the trim
    (about 10 ms per 100 MB given back)."""

    def __init__(self, step: int, when: Callable[[], bool] | None = None, *,
                 resident: Callable[[], int | None] = resident_bytes,
                 release: Callable[[], bool] | None = None) -> None:  # fmt: skip
        self.step = step
        self.trims = 0  # calls that gave memory back
        self._when = when
        self._resident = resident
        self._release = release if release is not None else release_free_memory
        self._lock = threading.Lock()  # guards _base, trims and the trim itself (one at a time)
        self._base = resident() or 0  # the highest resident set a trim left (at first, the start's)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> bool:
        """Give freed memory back if ``when()`` says so and the resident set has grown by :attr:`step` over the
        highest level a trim left (at first, the level at the start); True if some was given back."""
        if self._when is not None and not self._when():
            return False
        with self._lock:  # (read under the lock: a trim just made by release() moved the level)
            now = self._resident()
            if now is None or now - self._base < self.step:
                return False
            return self._release_locked()

    def release(self) -> bool:
        """Give freed memory back now; True if some was."""
        with self._lock:
            return self._release_locked()

    def _release_locked(self) -> bool:
        released = self._release()
        self.trims += released
        self._base = max(self._base, self._resident() or 0)
        return released

    def start(self, every_s: float) -> None:
        """:meth:`check` every ``every_s`` seconds on a daemon thread, until :meth:`stop` (a watch starts once: after
        :meth:`stop`, it does nothing)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, args=(every_s,), name="drainpipe-heap", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread of :meth:`start` and wait for it (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.check()


_trim: list[Any] = []  # glibc's malloc_trim once looked up ([None] where there is none)


def _malloc_trim() -> Any:
    if not _trim:
        try:
            import ctypes

            trim = ctypes.CDLL(None).malloc_trim
            trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
            _trim.append(trim)
        except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS; Windows refuses CDLL(None))
            _trim.append(None)
    return _trim[0]


class _PandasHidden(importlib.abc.MetaPathFinder):
    """``import pandas`` fails in this process (:func:`hide_pandas`)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ImportError(f"{fullname} is hidden in drainpipe's own processes (see hide_pandas)")
        return None


def hide_pandas() -> None:
    """Make pandas unimportable in this process, for the processes that drainpipe owns from start to exit (the
    ``drainpipe run``, ``serve`` and ``consume`` commands, their workers and helpers, and the helper processes an
    embedded server spawns, which run only drainpipe's parsing), never for a program that imports drainpipe.

    pyarrow imports pandas the first time it converts Python values to Arrow (and at every conversion until that
    import succeeds), only to ask whether a value is a pandas object, and so may DuckDB; the local engine never hands
    either one, and the import costs such a process 0.16 s of its start-up and 35 MB. A no-op when pandas is loaded
    already. Thread-safe enough for its callers: called before the engine starts its threads."""
    if "pandas" in sys.modules or any(isinstance(f, _PandasHidden) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _PandasHidden())


def die_with(parent: int) -> None:
    """Ask the kernel to kill this worker when the process that started it dies (SIGKILL, SIGTERM, a crash), so no
    worker outlives a killed ``drainpipe run`` (Linux ``PR_SET_PDEATHSIG``; elsewhere the pool's own pipe check
    remains)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def mp_context() -> Any:
    """How to start worker processes: forked when this process runs no other thread (cheap: the modules are
    loaded; and safe: no lock is held by a thread that would not exist in the child), else spawned."""
    method = "fork" if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method)


def process_pool(workers: int, initializer: Callable[..., None], initargs: tuple[Any, ...]) -> ProcessPoolExecutor:
    """``workers`` processes (:func:`mp_context`), every one started (forked or spawned) before this returns, without
    waiting for their ``initializer``, so that it runs during the caller's setup. ``initializer`` should call
    :func:`die_with` so that no worker outlives this process."""
    context = mp_context()
    if context.get_start_method() == "fork":
        # garbage left in this process would otherwise be collected in the children, where a native object's
        # destructor (a DuckDB connection's, say) finds its library's threads and locks gone: a segfault
        gc.collect()
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=initializer,
        initargs=initargs,
    )
    # the first submit forks every worker; a spawning pool starts one per submit while none is idle. Not waiting for
    # them lets their initializers run while the caller goes on (one that fails breaks the pool: the first result
    # raises BrokenProcessPool)
    for _ in range(workers):
        pool.submit(os.getpid)
    return pool


def usable_cpus(cgroup_root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> int:
    """How many CPUs this process can keep busy: the CPUs it may run on (its affinity: ``taskset``, a cpuset), then
    no more than its cgroup's CPU quota allows (containers: cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us``, rounded up), the tightest limit on the way from its cgroup to the root. At least 1.
    ``os.cpu_count()`` counts the machine's CPUs: on a 64-core host a container allowed two would size for 64."""
    cpus = os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        cpus = min(cpus, len(os.sched_getaffinity(0)) or cpus)
    quota = _cgroup_quota(cgroup_root, proc_cgroup)
    return max(1, min(cpus, math.ceil(quota))) if quota is not None else max(1, cpus)


def _cgroup_quota(root: str, proc_cgroup: str) -> float | None:
    """The tightest CPU quota (CPUs' worth) of this process's cgroups, v2 or v1; None for none (or no cgroups)."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2: one hierarchy, cpu.max = "<quota|max> <period>"
            for directory in _up_from(root, path):
                limits += _v2_limit(os.path.join(directory, "cpu.max"))
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own hierarchy
            for mount in (controllers, "cpu", "cpu,cpuacct"):
                for directory in _up_from(os.path.join(root, mount), path):
                    limits += _v1_limit(directory)
    return min(limits) if limits else None


def _up_from(root: str, path: str) -> list[str]:
    """``root/path`` and each directory above it up to ``root`` (a parent's limit applies to its children); those
    that exist. In a container the process's path is often "/" of a hierarchy mounted at ``root``."""
    parts = [p for p in path.strip("/").split("/") if p]
    candidates = [os.path.join(root, *parts[:k]) for k in range(len(parts), -1, -1)]
    return [c for c in dict.fromkeys(candidates) if os.path.isdir(c)]


def _v2_limit(path: str) -> list[float]:
    try:
        with open(path) as f:
            quota, _, period = f.read().strip().partition(" ")
        return [] if quota == "max" else [int(quota) / int(period or 100_000)]
    except (OSError, ValueError, ZeroDivisionError):
        return []


def _v1_limit(directory: str) -> list[float]:
    try:
        with open(os.path.join(directory, "cpu.cfs_quota_us")) as f:
            quota = int(f.read().strip())
        with open(os.path.join(directory, "cpu.cfs_period_us")) as f:
            period = int(f.read().strip())
        return [quota / period] if quota > 0 and period > 0 else []
    except (OSError, ValueError):
        return []
