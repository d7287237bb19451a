"""Process plumbing shared by the engine's worker processes and the server's helper processes: how to start them
(:func:`mp_context`, :func:`process_pool`), how a child dies with its parent (:func:`die_with`), and how a process
drainpipe owns from start to exit is tuned (:func:`tune_own_process`, :func:`hide_pandas`).

A leaf module: it imports nothing of drainpipe."""

from __future__ import annotations

import gc
import importlib.abc
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

__all__ = ["die_with", "hide_pandas", "mp_context", "process_pool", "tune_own_process"]


def tune_own_process() -> None:
    """Tune a process that drainpipe owns from start to exit (the ``drainpipe run`` command on the local engine),
    before it starts anything: :func:`hide_pandas`, and no transparent huge pages for it and every process it starts
    (Linux ``PR_SET_THP_DISABLE``, inherited by its workers). With THP at ``always``, each run's page faults went
    through huge-page allocation and compaction: 1.1-1.7 s of kernel time on a 5M-event Parquet run against 0.5 s
    without, 2.9 s of wall time against 2.3 s (the reason databases such as Redis and MongoDB advise THP off)."""
    hide_pandas()
    try:
        import ctypes

        pr_set_thp_disable = 41
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_thp_disable, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        pass


class _PandasHidden(importlib.abc.MetaPathFinder):
    """``import pandas`` fails in this process (:func:`hide_pandas`)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ImportError(f"{fullname} is hidden in drainpipe's local engine processes (see hide_pandas)")
        return None


def hide_pandas() -> None:
    """Make pandas unimportable in this process, for the local engine's processes that drainpipe owns from start to
    exit (the ``drainpipe run`` command and its workers), never for a program that imports drainpipe.

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
