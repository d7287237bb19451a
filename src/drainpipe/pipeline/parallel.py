"""Reading, validating and aggregating input files in worker processes (the local engine's second core).

The engine's threads share one GIL, so in one process the pipeline used ~1.2 of 2 cores. For large
uncompressed JSON Lines and Parquet files, :func:`run_file` cuts the file into parts
(:func:`drainpipe.inputs.plan_parts`: whole blocks, the same blocks every engine reads) and hands them to worker
processes. A worker reads its part with :func:`drainpipe.inputs.read_part` (same validation, same fast path, same
reject reasons and line/row numbers), aggregates each block with
:func:`~drainpipe.pipeline.aggregate.aggregate_batch` under the block's source id, merges the partials of its
blocks and sends back only those merged partial states, its counts and its rejects. The parent consumes results in
part order: it writes the rejects to the dead letter, adds the counts, and puts the partials into the engine's
L1/top-N queues (:meth:`~drainpipe.pipeline.engine.LocalEngine.ingest_partials`), so L1 -> L2 -> store run as
before.

Memory stays bounded: at most ``2 * workers`` parts are in flight, a worker holds one raw block and the merged
states of its part, and results are small (states, not events).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from .. import native
from ..inputs import (
    Part,
    ReadStats,
    RejectList,
    Sink,
    format_of,
    read_part,
)
from ..processes import die_with, hide_pandas, process_pool
from .aggregate import aggregate_batch
from .definitions import Definitions
from .partials import MetricAccumulator, Partial, partial_type

__all__ = [
    "PartResult",
    "eligible",
    "PartStream",
    "process_part",
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
    native.disable("threads")  # the pool is the parallelism
    die_with(parent)
    warm_up()


def warm_up() -> None:
    """Do now, while the parent plans the first parts, the one-time work a worker would otherwise do inside its first
    part: pyarrow's first conversion of a Python value (with pandas hidden, :func:`hide_pandas`)."""
    hide_pandas()
    pa.scalar(0, pa.int64())


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
    for batch in read_part(part, Sink(part.path, result.stats, rejects), dictionaries=True):
        for partial in aggregate_batch(batch, definitions):
            accumulators[partial.definition].add(partial)
        result.events += batch.requests
        result.blocks += 1
    result.rejects = rejects.rows
    result.partials = [p for p in (a.drain() for a in accumulators.values()) if p is not None]
    return result


def eligible(path: str) -> bool:
    """Whether a file goes to the workers: one its format cuts into parts (uncompressed JSON Lines, Parquet) of at
    least MIN_PARALLEL_BYTES."""
    fmt, gzipped = format_of(path)
    try:
        size = os.path.getsize(path)
    except OSError:
        return False
    return fmt.splits(gzipped) and size >= MIN_PARALLEL_BYTES


def start_pool(workers: int, definitions: Definitions) -> ProcessPoolExecutor:
    """Worker processes for :func:`process_part`, started now."""
    for d in definitions.all:  # the partial classes exist before a fork
        partial_type(d)
    # pyarrow looks at np.ma when it converts a numpy array, a lazy 20 ms import: once here, before the fork, instead
    # of in every worker
    import numpy.ma  # noqa: F401

    return process_pool(workers, _init_worker, (definitions, os.getpid()))


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
