"""Reading, validating and aggregating input files in worker processes (the local engine's second core).

The engine's threads share one GIL, so in one process the pipeline used ~1.2 of 2 cores. For large
uncompressed JSON Lines and Parquet files, :func:`run_file` cuts the file into tasks of whole raw blocks (the
blocks :func:`~drainpipe.pipeline.events.read_file_indexed` reads: ``batch_rows`` lines, or ``iter_batches``
batches) and hands them to worker processes. A worker reads its blocks with the reader's own code (same
validation, same fast path, same reject reasons and line/row numbers), aggregates each block with
:func:`~drainpipe.pipeline.functions.aggregate_batch` under the same source identity the in-process path gives
it (``<file id>:<batch rows>:<block index>``), merges the partials of its blocks and sends back only those
merged partial states, its counts and its rejects. The parent consumes results in task order: it writes the
rejects to the dead letter, adds the counts, and puts the partials into the engine's L1/top-N queues
(:meth:`~drainpipe.pipeline.engine.LocalEngine.ingest_partials`), so L1 -> L2 -> store run as before.

Memory stays bounded: at most ``2 * workers`` tasks are in flight, a worker holds one raw block and the merged
states of its task, and results are small (states, not events).

Tasks:

* JSON Lines: ``blocks`` consecutive blocks of ``batch_rows`` lines as a byte range; the parent finds the range
  ends by counting newlines over a memory map (numpy, no per-line Python).
* Parquet: a range of consecutive ``iter_batches`` batches. ``iter_batches`` batches run across row groups, so
  a worker reads from the row group holding its first row and re-cuts the stream at the same row offsets;
  tasks start at the first batch boundary of a row group, so a worker decodes at most one batch it does not
  use, except when a row group is cut into several tasks (large row groups, few of them).
"""
from __future__ import annotations

import hashlib
import mmap
import multiprocessing
import os
import threading
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import events as _events
from .definitions import Definitions
from .events import DeadLetter, InputError, ReadStats, detect_format
from .functions import MetricAccumulator, Partial, aggregate_batch, partial_type

__all__ = ["Task", "TaskResult", "PENDING_SOURCE", "eligible", "start_pool", "plan_tasks", "process_task", "run_file"]

#: files smaller than this stay in process (starting workers costs more than they save)
MIN_PARALLEL_BYTES = 8 << 20
#: JSON Lines: blocks per task
JSONL_TASK_BLOCKS = 4
#: Parquet: most blocks per task (a row group with more is cut into near-equal tasks)
PARQUET_TASK_BLOCKS = 16


@dataclass(frozen=True)
class Task:
    """Blocks ``first .. first + blocks - 1`` of one file; JSON Lines also give the byte range and first line."""

    path: str
    fmt: str
    source: str  # the file identity: block j's source is f"{source}:{batch_rows}:{j}" (PENDING_SOURCE: set later)
    batch_rows: int
    first: int
    blocks: int
    start: int = 0  # jsonl: byte offset of the first line
    end: int = 0  # jsonl: byte offset after the last line
    lineno: int = 0  # jsonl: lines before the first one


@dataclass
class TaskResult:
    stats: ReadStats
    rejects: list[tuple[int, Any, str]] = field(default_factory=list)  # (line or row, raw, reason), in order
    partials: list[Partial] = field(default_factory=list)  # merged over the task's blocks
    events: int = 0
    blocks: int = 0  # blocks with accepted rows


class _Collect:
    """Duck-typed DeadLetter: keeps the rejects for the parent, which writes them in order."""

    def __init__(self, rows: list[tuple[int, Any, str]]) -> None:
        self.rows = rows

    def write(self, source: str, line: int, raw: Any, reason: str) -> None:
        self.rows.append((line, raw, reason))


# ------------------------------------------------------------------------------------------------ workers

_definitions: Definitions | None = None


def _init_worker(definitions: Definitions) -> None:
    global _definitions
    _definitions = definitions
    # the pool is the parallelism: pyarrow's JSON reader on one thread per process wastes less CPU
    _events._ARROW_JSON_READ = _events._ARROW_JSON_READ_SERIAL


def process_task(task: Task, definitions: Definitions | None = None) -> TaskResult:
    """Read, validate and aggregate one task's blocks (in a worker process, or anywhere: it is pure)."""
    definitions = definitions or _definitions
    assert definitions is not None, "worker not initialised"
    result = TaskResult(ReadStats())
    sink = _events._Sink(task.path, result.stats, _Collect(result.rejects))
    accumulators = {d: MetricAccumulator(d) for d in definitions.all}
    try:
        blocks = _parquet_blocks(task, sink) if task.fmt == "parquet" else _jsonl_blocks(task, sink)
        for index, batch in blocks:
            for partial in aggregate_batch(batch, definitions, source=f"{task.source}:{task.batch_rows}:{index}"):
                accumulators[partial.definition].add(partial)
            result.events += batch.num_rows
            result.blocks += 1
    except (OSError, EOFError, pa.ArrowException) as e:
        raise InputError(f"cannot read {task.path!r}: {e}") from e
    result.partials = [p for p in (a.drain() for a in accumulators.values()) if p is not None]
    return result


def _jsonl_blocks(task: Task, sink: Any) -> Iterator[tuple[int, pa.RecordBatch]]:
    with open(task.path, "rb") as f:
        f.seek(task.start)
        data = f.read(task.end - task.start)
    newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    reader = _events._JsonlBlocks()
    lineno, begin = task.lineno, 0
    for k in range(task.blocks):
        last = (k + 1) * task.batch_rows - 1
        stop = int(newlines[last]) + 1 if last < len(newlines) else len(data)
        block = data[begin:stop]
        if not block:
            break
        ends = newlines[k * task.batch_rows:last + 1] - begin
        lines = _Lines(block, len(ends) + (block[-1] != 10))
        batch = reader.read(lines, lineno, sink, block, ends)
        lineno += len(lines)
        begin = stop
        if batch is not None:
            yield task.first + k, batch


class _Lines:
    """The lines of a block (cut after each ``\n``, as iterating a binary file does), split only when a line
    is asked for: the columnar fast path needs just the count."""

    def __init__(self, data: bytes, count: int) -> None:
        self.data, self.count = data, count
        self._lines: list[bytes] | None = None

    def __len__(self) -> int:
        return self.count

    def _split(self) -> list[bytes]:
        if self._lines is None:
            parts = self.data.split(b"\n")
            last = parts.pop()
            self._lines = [p + b"\n" for p in parts] + ([last] if last else [])
            assert len(self._lines) == self.count
        return self._lines

    def __getitem__(self, i: int) -> bytes:
        return self._split()[i]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._split())


def _parquet_blocks(task: Task, sink: Any) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Blocks ``first ..`` of ``iter_batches(batch_size=batch_rows)`` over the whole file, same rows."""
    pf = pq.ParquetFile(task.path)
    size = task.batch_rows
    begin = task.first * size
    starts = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)])
    group = int(np.searchsorted(starts, begin, side="right")) - 1
    skip = begin - int(starts[group])
    stream = pf.iter_batches(batch_size=size, row_groups=list(range(group, pf.num_row_groups)),
                             columns=_events.parquet_columns(pf))
    pending: list[pa.RecordBatch] = []
    held = 0
    index, offset, stop = task.first, begin, task.first + task.blocks

    def take(rows: int) -> pa.RecordBatch:
        nonlocal pending, held
        held -= rows
        if len(pending) == 1 and pending[0].num_rows == rows:
            return pending.pop()
        table = pa.Table.from_batches(pending)
        rest = table.slice(rows)
        pending = rest.to_batches() if rest.num_rows else []
        return table.slice(0, rows).combine_chunks().to_batches()[0]

    def validated(batch: pa.RecordBatch) -> pa.RecordBatch | None:
        nonlocal offset
        canonical = _events._parquet_batch(batch, offset, sink)
        offset += batch.num_rows
        return canonical

    for raw in stream:
        if skip:
            if raw.num_rows <= skip:
                skip -= raw.num_rows
                continue
            raw, skip = raw.slice(skip), 0
        pending.append(raw)
        held += raw.num_rows
        while held >= size and index < stop:
            canonical = validated(take(size))
            if canonical is not None:
                yield index, canonical
            index += 1
        if index >= stop:
            return
    if held and index < stop:  # the file's last, short block
        canonical = validated(take(held))
        if canonical is not None:
            yield index, canonical


# ------------------------------------------------------------------------------------------------ planning


def eligible(path: str) -> bool:
    """Whether a file goes to the workers: uncompressed JSON Lines or Parquet of at least MIN_PARALLEL_BYTES."""
    fmt, gzipped = detect_format(path)
    try:
        size = os.path.getsize(path)
    except OSError:
        return False
    return fmt in ("jsonl", "parquet") and not gzipped and size >= MIN_PARALLEL_BYTES


def plan_tasks(path: str, source: str, batch_rows: int, workers: int = 2, hasher: Any = None) -> Iterator[Task]:
    """The tasks of one file, in file order (lazily for JSON Lines: the scan keeps ahead of the workers).

    ``hasher`` (JSON Lines only): a hashlib object the scan feeds every byte of the file, in order, by the end
    of the iteration (the fingerprint without a second pass over the file)."""
    fmt, gzipped = detect_format(path)
    if gzipped or fmt not in ("jsonl", "parquet"):
        raise ValueError(f"{path!r}: only uncompressed JSON Lines and Parquet are read in worker processes")
    if fmt == "parquet":
        return iter(_parquet_tasks(path, source, batch_rows, workers))
    return _jsonl_tasks(path, source, batch_rows, workers, hasher)


def _parquet_tasks(path: str, source: str, batch_rows: int, workers: int) -> list[Task]:
    try:
        md = pq.ParquetFile(path).metadata
    except (OSError, pa.ArrowException) as e:
        raise InputError(f"cannot read {path!r}: {e}") from e
    sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
    total = sum(sizes)
    blocks = -(-total // batch_rows)
    # per row group: the blocks that start in it
    ranges: list[tuple[int, int]] = []
    start = 0
    for rows in sizes:
        first, stop = -(-start // batch_rows), min(blocks, -(-(start + rows) // batch_rows))
        if stop > first:
            ranges.append((first, stop))
        start += rows
    cap = PARQUET_TASK_BLOCKS
    tasks = []
    for first, stop in ranges:
        pieces = -(-(stop - first) // cap)
        bounds = np.linspace(first, stop, pieces + 1).round().astype(int)
        for a, b in zip(bounds[:-1], bounds[1:]):
            tasks.append(Task(path, "parquet", source, batch_rows, int(a), int(b - a)))
    return tasks


def _jsonl_tasks(path: str, source: str, batch_rows: int, workers: int, hasher: Any = None) -> Iterator[Task]:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        # at most JSONL_TASK_BLOCKS blocks per task, fewer when that leaves under three tasks per worker
        sample = f.read(1 << 20)
        estimate = size * max(1, sample.count(b"\n")) / max(1, len(sample)) / batch_rows
        lines_per_task = batch_rows * max(1, min(JSONL_TASK_BLOCKS, int(estimate // (3 * max(1, workers)))))
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            buf = np.frombuffer(mm, dtype=np.uint8)
            window = buf[:0]
            try:
                pos = len(_events._BOM) if bytes(buf[:3]) == _events._BOM else 0
                if hasher is not None:
                    hasher.update(buf[:pos])
                first, lineno = 0, 0
                step = 8 << 20
                while pos < size:
                    need, scan, end = lines_per_task, pos, size
                    while scan < size:
                        window = buf[scan:scan + step]
                        count = int(np.count_nonzero(window == 10))
                        if count >= need:
                            end = scan + int(np.flatnonzero(window == 10)[need - 1]) + 1
                            need = 0
                        else:
                            need -= count
                        if not need:
                            break
                        scan += len(window)
                    if hasher is not None:
                        hasher.update(buf[pos:end])
                    if hasattr(mm, "madvise"):  # scanned (and hashed) pages leave this process's RSS
                        page = pos - pos % mmap.PAGESIZE
                        mm.madvise(mmap.MADV_DONTNEED, page, end - page)
                    lines = lines_per_task - need + (1 if need and buf[size - 1] != 10 else 0)
                    blocks = -(-lines // batch_rows)
                    yield Task(path, "jsonl", source, batch_rows, first, blocks, pos, end, lineno)
                    first += blocks
                    lineno += lines
                    pos = end
            finally:
                del buf, window  # no view of the map may outlive it


# ------------------------------------------------------------------------------------------------ the pool


def start_pool(workers: int, definitions: Definitions) -> ProcessPoolExecutor:
    """Worker processes, started now. Forked when this process runs no other thread (cheap: the modules are
    loaded), else spawned."""
    method = "fork" if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods() else "spawn"
    for d in definitions.all:   # the partial classes exist before the fork
        partial_type(d)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method),
                               initializer=_init_worker, initargs=(definitions,))
    # start every worker now, before the caller starts threads (fork) and so that start-up overlaps setup
    for f in [pool.submit(os.getpid) for _ in range(workers)]:
        f.result()
    return pool


#: the file identity in the sources workers give their partials; the parent puts in the real one
PENDING_SOURCE = "*"


def run_file(pool: ProcessPoolExecutor, workers: int, path: str, batch_rows: int,
             identify: Callable[[str | None], tuple[str, bool]], ingest: Callable[[list[Partial], int, int], Any],
             stats: ReadStats, dead_letter: DeadLetter | None,
             progress: Callable[[], Any] | None = None) -> tuple[str, bool]:
    """Process one file on the pool; returns the file's identity and whether it was processed.

    The workers start at once; meanwhile the rest of the file is planned and ``identify(digest)`` gives the
    file identity and whether to go on (a content fingerprint; ``digest``: the SHA-256 hex digest of the file
    the JSON Lines planner computed in its pass, None for Parquet). If not, the workers' results are dropped, nothing is
    counted and the caller reads the file itself. Else the results are consumed in task order: counts and
    rejects, then ``ingest(partials, events, batches)`` with the sources renamed to the identity."""
    hasher = hashlib.sha256() if detect_format(path)[0] == "jsonl" else None
    planned = plan_tasks(path, PENDING_SOURCE, batch_rows, workers, hasher)
    window: deque[Future[TaskResult]] = deque()
    try:
        for task in planned:
            window.append(pool.submit(process_task, task))
            if len(window) >= 2 * workers:
                break
        tasks = iter(list(planned))  # the rest of the plan: the scan reaches the end of the file (and hashes it)
        identity, proceed = identify(hasher.hexdigest() if hasher is not None else None)
        if not proceed:
            return identity, False
        for task in tasks:
            window.append(pool.submit(process_task, task))
            if len(window) > 2 * workers:
                _consume(window.popleft().result(), identity, path, ingest, stats, dead_letter, progress)
        while window:
            _consume(window.popleft().result(), identity, path, ingest, stats, dead_letter, progress)
    finally:
        for f in window:
            f.cancel()
        for f in window:
            if not f.cancelled():
                f.exception()   # wait: a running task must not outlive the file's turn
    return identity, True


def _consume(result: TaskResult, identity: str, path: str, ingest: Callable[[list[Partial], int, int], Any],
             stats: ReadStats, dead_letter: DeadLetter | None, progress: Callable[[], Any] | None) -> None:
    stats.merge(result.stats)
    if dead_letter is not None:
        for line, raw, reason in result.rejects:
            dead_letter.write(path, line, raw, reason)
    if result.partials:
        cut = len(PENDING_SOURCE)
        ingest([p._with(p.table, [identity + s[cut:] for s in p.sources]) for p in result.partials],
               result.events, result.blocks)
    if progress is not None:
        progress()
