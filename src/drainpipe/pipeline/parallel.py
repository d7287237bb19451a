"""Reading, validating and aggregating input files in worker processes (the local engine's second core).

The engine's threads share one GIL, so in one process the pipeline used ~1.2 of 2 cores. For large
uncompressed JSON Lines and Parquet files, :func:`run_file` cuts the file into parts
(:func:`drainpipe.inputs.plan_parts`: whole blocks, the same blocks every engine reads) and hands them to worker
processes. A worker reads its part with :func:`drainpipe.inputs.read_part` (same validation, same fast path, same
reject reasons and line/row numbers), aggregates each block with
:func:`~drainpipe.pipeline.functions.aggregate_batch` under the block's source id, merges the partials of its
blocks and sends back only those merged partial states, its counts and its rejects. The parent consumes results in
part order: it writes the rejects to the dead letter, adds the counts, and puts the partials into the engine's
L1/top-N queues (:meth:`~drainpipe.pipeline.engine.LocalEngine.ingest_partials`), so L1 -> L2 -> store run as
before.

Memory stays bounded: at most ``2 * workers`` parts are in flight, a worker holds one raw block and the merged
states of its part, and results are small (states, not events).
"""

from __future__ import annotations

import gc
import importlib.abc
import multiprocessing
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..inputs import (
    Part,
    ReadStats,
    RejectList,
    Sink,
    detect_format,
    read_part,
    use_serial_json_reader,
)
from .definitions import Definitions
from .functions import MetricAccumulator, Partial, aggregate_batch, partial_type

__all__ = [
    "PartResult",
    "die_with",
    "eligible",
    "hide_pandas",
    "tune_own_process",
    "mp_context",
    "PartStream",
    "process_part",
    "process_pool",
    "start_pool",
]

#: files smaller than this stay in process (starting workers costs more than they save)
MIN_PARALLEL_BYTES = 8 << 20


@dataclass
class PartResult:
    stats: ReadStats
    rejects: list[tuple[int, Any, str]] = field(default_factory=list)  # (line or row, raw, reason), in order
    partials: list[Partial] = field(default_factory=list)  # merged over the part's blocks
    events: int = 0
    blocks: int = 0  # blocks with accepted rows
    names: frozenset[str] = frozenset()  # the definitions the part was aggregated for


# ------------------------------------------------------------------------------------------------ workers

_definitions: Definitions | None = None


def _init_worker(definitions: Definitions, parent: int) -> None:
    global _definitions
    _definitions = definitions
    use_serial_json_reader()  # the pool is the parallelism
    die_with(parent)
    warm_up()


def warm_up() -> None:
    """Do now, while the parent plans the first parts, the one-time work a worker would otherwise do inside its first
    part: pyarrow's first conversion of a Python value (with pandas hidden, :func:`hide_pandas`)."""
    hide_pandas()
    pa.scalar(0, pa.int64())


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


def process_part(part: Part, names: frozenset[str] | None = None, definitions: Definitions | None = None) -> PartResult:
    """Read, validate and aggregate one part's blocks for the definitions ``names`` (default all), in a worker
    process or anywhere (it is pure)."""
    definitions = definitions or _definitions
    assert definitions is not None, "worker not initialised"
    if names is not None and names != frozenset(definitions.names):
        definitions = definitions.select(names)
    result = PartResult(ReadStats(), names=frozenset(definitions.names))
    rejects = RejectList()
    accumulators = {d: MetricAccumulator(d) for d in definitions.all}
    for _, batch in read_part(part, Sink(part.path, result.stats, rejects), dictionaries=True):
        for partial in aggregate_batch(batch, definitions):
            accumulators[partial.definition].add(partial)
        result.events += batch.num_rows
        result.blocks += 1
    result.rejects = rejects.rows
    result.partials = [p for p in (a.drain() for a in accumulators.values()) if p is not None]
    return result


def eligible(path: str) -> bool:
    """Whether a file goes to the workers: uncompressed JSON Lines or Parquet of at least MIN_PARALLEL_BYTES."""
    fmt, gzipped = detect_format(path)
    try:
        size = os.path.getsize(path)
    except OSError:
        return False
    return fmt in ("jsonl", "parquet") and not gzipped and size >= MIN_PARALLEL_BYTES


def start_pool(workers: int, definitions: Definitions) -> ProcessPoolExecutor:
    """Worker processes for :func:`process_part`, started now."""
    for d in definitions.all:  # the partial classes exist before a fork
        partial_type(d)
    return process_pool(workers, _init_worker, (definitions, os.getpid()))


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


class PartStream:
    """Parts processed on a pool (each for the definitions ``names_of(part start)``), yielded in part order with
    their results by iterating once.

    The first window is submitted at construction, so the workers start while the caller does other things (a run
    into a new store opens it meanwhile). At most ``2 * workers + 1`` parts are in flight; the plan is consumed
    lazily, so the JSON Lines scan stays just ahead of the workers. A part's read error is raised when its turn
    comes. :meth:`close` (called when the iteration ends, however it ends) cancels what has not started and waits
    for what has: no task outlives the stream. Not thread-safe: one consumer."""

    def __init__(
        self, pool: ProcessPoolExecutor, workers: int, parts: Iterable[Part], names_of: Callable[[int], frozenset[str]]
    ) -> None:
        self._pool, self._depth, self._names_of = pool, 2 * workers + 1, names_of
        self._parts = iter(parts)
        self._window: deque[tuple[Part, Future[PartResult]]] = deque()
        self._fill()

    def _fill(self) -> None:
        while len(self._window) < self._depth:
            part = next(self._parts, None)
            if part is None:
                return
            self._window.append((part, self._pool.submit(process_part, part, self._names_of(part.start_offset))))

    def __iter__(self) -> Iterator[tuple[Part, PartResult]]:
        try:
            while self._window:
                part, future = self._window[0]
                result = future.result()
                self._window.popleft()
                yield part, result
                self._fill()
        finally:
            self.close()

    def close(self) -> None:
        """Cancel the parts not started and wait for the running ones (their results are dropped)."""
        window, self._window = self._window, deque()
        for _, f in window:
            f.cancel()
        for _, f in window:
            if not f.cancelled():
                f.exception()  # wait: a running task must not outlive the file's turn
