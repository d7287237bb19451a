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

import hashlib
import multiprocessing
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..inputs import (
    PENDING,
    DeadLetter,
    Part,
    ReadStats,
    RejectList,
    Sink,
    detect_format,
    plan_parts,
    read_part,
    use_serial_json_reader,
)
from .definitions import Definitions
from .functions import MetricAccumulator, Partial, aggregate_batch, partial_type

__all__ = ["PartResult", "eligible", "start_pool", "process_part", "run_file"]

#: files smaller than this stay in process (starting workers costs more than they save)
MIN_PARALLEL_BYTES = 8 << 20


@dataclass
class PartResult:
    stats: ReadStats
    rejects: list[tuple[int, Any, str]] = field(default_factory=list)  # (line or row, raw, reason), in order
    partials: list[Partial] = field(default_factory=list)  # merged over the part's blocks
    events: int = 0
    blocks: int = 0  # blocks with accepted rows


# ------------------------------------------------------------------------------------------------ workers

_definitions: Definitions | None = None


def _init_worker(definitions: Definitions) -> None:
    global _definitions
    _definitions = definitions
    use_serial_json_reader()  # the pool is the parallelism


def process_part(part: Part, definitions: Definitions | None = None) -> PartResult:
    """Read, validate and aggregate one part's blocks (in a worker process, or anywhere: it is pure)."""
    definitions = definitions or _definitions
    assert definitions is not None, "worker not initialised"
    result = PartResult(ReadStats())
    rejects = RejectList()
    accumulators = {d: MetricAccumulator(d) for d in definitions.all}
    for index, batch in read_part(part, Sink(part.path, result.stats, rejects)):
        for partial in aggregate_batch(batch, definitions, source=part.source(index)):
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


# ------------------------------------------------------------------------------------------------ the pool


def start_pool(workers: int, definitions: Definitions) -> ProcessPoolExecutor:
    """Worker processes, started now. Forked when this process runs no other thread (cheap: the modules are
    loaded), else spawned."""
    method = "fork" if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods() else "spawn"
    for d in definitions.all:  # the partial classes exist before the fork
        partial_type(d)
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context(method),
        initializer=_init_worker,
        initargs=(definitions,),
    )
    # start every worker now, before the caller starts threads (fork) and so that start-up overlaps setup
    for f in [pool.submit(os.getpid) for _ in range(workers)]:
        f.result()
    return pool


def run_file(
    pool: ProcessPoolExecutor,
    workers: int,
    path: str,
    batch_rows: int,
    identify: Callable[[str | None], tuple[str, bool]],
    ingest: Callable[[list[Partial], int, int], Any],
    stats: ReadStats,
    dead_letter: DeadLetter | None,
    progress: Callable[[], Any] | None = None,
) -> tuple[str, bool]:
    """Process one file on the pool; returns the file's identity and whether it was processed.

    The workers start at once; meanwhile the rest of the file is planned and ``identify(digest)`` gives the
    file identity and whether to go on (a content fingerprint; ``digest``: the SHA-256 hex digest of the file
    the JSON Lines planner computed in its pass, None for Parquet). If not, the workers' results are dropped, nothing is
    counted and the caller reads the file itself. Else the results are consumed in task order: counts and
    rejects, then ``ingest(partials, events, batches)`` with the sources renamed to the identity."""
    hasher = hashlib.sha256() if detect_format(path)[0] == "jsonl" else None
    planned = plan_parts(path, batch_rows, workers=workers, hasher=hasher)
    window: deque[Future[PartResult]] = deque()
    try:
        for part in planned:
            window.append(pool.submit(process_part, part))
            if len(window) >= 2 * workers:
                break
        rest = iter(list(planned))  # the rest of the plan: the scan reaches the end of the file (and hashes it)
        identity, proceed = identify(hasher.hexdigest() if hasher is not None else None)
        if not proceed:
            return identity, False
        for part in rest:
            window.append(pool.submit(process_part, part))
            if len(window) > 2 * workers:
                _consume(window.popleft().result(), identity, path, ingest, stats, dead_letter, progress)
        while window:
            _consume(window.popleft().result(), identity, path, ingest, stats, dead_letter, progress)
    finally:
        for f in window:
            f.cancel()
        for f in window:
            if not f.cancelled():
                f.exception()  # wait: a running task must not outlive the file's turn
    return identity, True


def _consume(
    result: PartResult,
    identity: str,
    path: str,
    ingest: Callable[[list[Partial], int, int], Any],
    stats: ReadStats,
    dead_letter: DeadLetter | None,
    progress: Callable[[], Any] | None,
) -> None:
    stats.merge(result.stats)
    if dead_letter is not None:
        for line, raw, reason in result.rejects:
            dead_letter.write(path, line, raw, reason)
    if result.partials:
        cut = len(PENDING)
        ingest(
            [p._with(p.table, [identity + s[cut:] for s in p.sources]) for p in result.partials],
            result.events,
            result.blocks,
        )
    if progress is not None:
        progress()
