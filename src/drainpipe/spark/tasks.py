"""The Python side of the Spark job: the functions ``mapInArrow`` runs in the executors.

Every function here is a factory returning ``fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]``
(what :meth:`pyspark.sql.DataFrame.mapInArrow` calls once per partition), except :func:`split_reader`, which
returns an :data:`EventReader` for :func:`read_states` and :func:`read_events`. They hold nothing but plain data
(definitions, the split plan, sizes), so they pickle to the executors; all the work is the shared pipeline code:

* :func:`read_states` (``per_type="map"``): read the task's events with an :data:`EventReader`, partially
  aggregate every definition over the whole partition (:func:`~drainpipe.pipeline.aggregate.aggregate_batch` per
  event batch, :class:`MetricAccumulator` across batches) and emit the states as
  :data:`~drainpipe.spark.rows.STATE_ROWS`, with the reader's rejects and counts and the task's own timing;
  :func:`read_events` (``per_type="placed"``/``"hash"``): read only, emitting the events
  (:data:`~drainpipe.spark.rows.EVENT_ROWS`) for the per-type stage. The readers: :func:`split_reader` (a file
  job's splits, :func:`~drainpipe.spark.splits.read_split`; :func:`scan_states` and :func:`scan_events`) and
  :func:`drainpipe.spark.kafka.message_reader` (a micro-batch's messages).
* :func:`aggregate_events`: the per-type stage: aggregate whatever events the (placed) partition holds, pass
  bookkeeping rows through.
* :func:`merge_topn`: the top-N merge across tasks with :func:`~drainpipe.pipeline.partials.merge`.
* :func:`sample_types`: type weights for the per-type placement, from the head of every split.

Timing: each task emits one TASK row with the seconds between its first input batch being requested and its
last output being produced (Python work plus waiting for input), the CPU seconds of its Python worker over the
same span (what the task did, whatever else the machine runs), the events it aggregated and the stage name;
that is how the task-time spread (max / median) is measured without a SparkListener. It also names the C
extensions the task's Python ran (``native``) and why any is missing there (``missing``): the driver logs once
which tier the executors ran. Aggregating tasks add, per
metric scope, the most distinct entities one bucket of theirs holds (``entities``): summed over the tasks, a
bound that spares the driver the cardinality guard's Spark stage when nothing can exceed ``max_entities``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from drainpipe import native
from drainpipe.inputs import EventBatch
from drainpipe.pipeline import (
    Definitions,
    MetricAccumulator,
    MetricPartial,
    TopNDef,
    TopNPartial,
    aggregate_batch,
    normalize,
)

from .rows import (
    EVENT,
    EVENT_ROWS,
    EXIT,
    META_COLUMNS,
    REJECT,
    SPLIT,
    STATE_ROWS,
    TASK,
    TOPN,
    events_rows,
    fill_unused,
    info_row,
    meta_rows,
    packed_rows,
    partial_rows,
    select_rows,
    to_ipc,
    topn_partial,
)
from .splits import Split, SplitResult, read_split

__all__ = [
    "ArrowMapFn",
    "EventReader",
    "read_states",
    "read_events",
    "split_reader",
    "scan_states",
    "scan_events",
    "aggregate_events",
    "merge_topn",
    "sample_types",
    "SAMPLE_SCHEMA",
]

ArrowMapFn = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def _splits(batches: Iterator[pa.RecordBatch], groups: Sequence[Sequence[Split]]) -> Iterator[Split]:
    """The splits of the groups named by the ``id`` column of the input (``spark.range``: id i = the i-th group)."""
    for batch in batches:
        for i in batch.column("id").to_pylist():
            yield from groups[i]


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else -1


def _bookkeeping(schema: pa.Schema, split: Split, result: SplitResult) -> Iterator[pa.RecordBatch]:
    """REJECT rows and the SPLIT row of one split."""
    if result.rejects:
        lines, raws, reasons = zip(*result.rejects)
        yield meta_rows(schema, REJECT, [split.index] * len(lines), line=lines, raw=raws, reason=reasons)
    stats = result.stats
    yield info_row(
        schema,
        SPLIT,
        split.index,
        {
            "read": stats.read,
            "accepted": stats.accepted,
            "rejected": stats.rejected,
            "reasons": dict(stats.reasons),
            "warnings": dict(stats.warnings),
            "end": result.end,
            "nbytes": split.nbytes,
        },
    )


class _Aggregator:
    """Partial states of every definition over one task's events (the local engine's L1, in a task)."""

    def __init__(self, definitions: Definitions, inline_rows: int = 0) -> None:
        self.definitions = definitions
        self.inline_rows = inline_rows
        self.accumulators = [MetricAccumulator(d) for d in definitions.all]
        self.events = 0
        self.entities: dict[str, int] = {}
        self.state_rows = 0  # metric state rows emitted (the driver sums them: a bound on the merged states)
        self.inline = False  # whether they were marked for the job's first action (at most inline_rows of them)

    def add(self, batch: EventBatch | pa.RecordBatch | pa.Table) -> None:
        if batch.num_rows:
            self.events += batch.num_rows
            for accumulator, partial in zip(self.accumulators, aggregate_batch(batch, self.definitions)):
                accumulator.add(partial)

    def report(self) -> dict[str, Any]:
        return {"events": self.events, "entities": self.entities, "rows": self.state_rows, "inline": self.inline}

    def rows(self) -> Iterator[pa.RecordBatch]:
        """The task's states, its metric states marked ``inline`` when they are at most ``inline_rows`` (the job's
        first action collects those: the driver then holds at most ``inline_rows`` a task); afterwards
        :attr:`entities` holds, per metric scope, the most distinct entities of one bucket among them (the driver
        sums these over tasks: a bound that tells it whether the cardinality guard can have anything to fold)."""
        keys: dict[str, list[pa.Table]] = {}
        drained = [(i, a.drain()) for i, a in enumerate(self.accumulators)]
        states = [(i, p) for i, p in drained if p is not None and p.table.num_rows]
        self.state_rows = sum(p.table.num_rows for _, p in states if isinstance(p, MetricPartial))
        self.inline = 0 < self.state_rows <= self.inline_rows
        for index, merged in states:
            if isinstance(merged, MetricPartial):
                keys.setdefault(merged.definition.scope, []).append(merged.table.select(["bucket", "entity"]))
                yield from packed_rows(index, merged, inline=self.inline)
            else:
                assert isinstance(merged, TopNPartial)
                yield partial_rows(index, merged)
        for scope, tables in keys.items():
            per_bucket = pa.concat_tables(tables).group_by("bucket").aggregate([("entity", "count_distinct")])
            self.entities[scope] = int(pc.max(per_bucket.column("entity_count_distinct")).as_py())


def _timed(
    stage: str, schema: pa.Schema, body: Callable[[], Iterator[pa.RecordBatch]], report: Callable[[], dict[str, Any]]
) -> Iterator[pa.RecordBatch]:
    """``body``'s rows, then the TASK row: stage, seconds, cpu_s and what ``report`` adds (``events``, and the
    aggregating tasks' ``entities``)."""
    start, cpu = time.perf_counter(), time.process_time()
    yield from body()
    info = {"stage": stage, "seconds": time.perf_counter() - start, "cpu_s": time.process_time() - cpu,
            "native": native_tiers(), "missing": native.missing}  # fmt: skip
    yield info_row(schema, TASK, _partition_id(), {**info, **report()})


def native_tiers() -> str:
    """The C extensions in use in this task's Python (comma-separated; "" for none): what the driver reports as
    the tier the executors ran."""
    return ",".join(t.name for t in native.tiers() if t.native and t.enabled and t.name != "fastpath")


#: what a task reads its events with: given the task's input batches and the schema of its bookkeeping rows
#: (STATE_ROWS or EVENT_ROWS), it yields event batches and, in that schema, REJECT and SPLIT rows
EventReader = Callable[[Iterator[pa.RecordBatch], pa.Schema], Iterator[EventBatch | pa.RecordBatch]]


def read_states(definitions: Definitions, read: EventReader, stage: str, inline_rows: int = 0) -> ArrowMapFn:
    """Read the task's events with ``read`` and partially aggregate every definition over them in the task
    (``per_type="map"``): STATE_ROWS, with ``read``'s bookkeeping rows and the task's TASK row; its metric states
    marked ``inline`` when they are at most ``inline_rows``."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        aggregator = _Aggregator(definitions, inline_rows)

        def body() -> Iterator[pa.RecordBatch]:
            for item in read(batches, STATE_ROWS):
                if isinstance(item, pa.RecordBatch):
                    yield item
                else:
                    aggregator.add(item)
            yield from aggregator.rows()

        yield from _timed(stage, STATE_ROWS, body, aggregator.report)

    return run


def read_events(read: EventReader, stage: str) -> ArrowMapFn:
    """Read the task's events with ``read`` and emit them as EVENT_ROWS for the per-type stage
    (``per_type="placed"``/``"hash"``), with ``read``'s bookkeeping rows and the task's TASK row."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        count = [0]

        def body() -> Iterator[pa.RecordBatch]:
            for item in read(batches, EVENT_ROWS):
                if isinstance(item, pa.RecordBatch):
                    yield item
                else:
                    count[0] += item.num_rows
                    yield events_rows(item)

        yield from _timed(stage, EVENT_ROWS, body, lambda: {"events": count[0]})

    return run


def split_reader(
    groups: Sequence[Sequence[Split]], accumulators: tuple[Any, Any] | None = None, *, dictionaries: bool = False
) -> EventReader:
    """The :data:`EventReader` of a file job: the splits of the groups the task's ``spark.range`` ids name, each
    read and validated (:func:`~drainpipe.spark.splits.read_split`, ``dictionaries`` passed on), then its rejects
    and SPLIT row."""

    def read(batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> Iterator[EventBatch | pa.RecordBatch]:
        for split in _splits(batches, groups):
            reader, result = read_split(split, dictionaries=dictionaries)
            yield from reader
            yield from _bookkeeping(schema, split, result)
            _count(accumulators, result.stats.read, split.nbytes)

    return read


def scan_states(
    definitions: Definitions,
    groups: Sequence[Sequence[Split]],
    accumulators: tuple[Any, Any] | None = None,
    inline_rows: int = 0,
) -> ArrowMapFn:
    """Read, validate and partially aggregate the splits of the partition's group (``per_type="map"``)."""
    # string columns stay dictionary-encoded where the reader gives them so: the aggregation takes their codes as
    # they are instead of hashing every string again (a quarter of a Parquet task's time)
    reader = split_reader(groups, accumulators, dictionaries=True)
    return read_states(definitions, reader, "scan+aggregate", inline_rows)


def scan_events(groups: Sequence[Sequence[Split]], accumulators: tuple[Any, Any] | None = None) -> ArrowMapFn:
    """Read and validate the splits of the partition's group, emitting the events (``per_type="placed"``/``"hash"``)."""
    return read_events(split_reader(groups, accumulators), "scan")


def _count(accumulators: tuple[Any, Any] | None, events: int, nbytes: int) -> None:
    if accumulators is not None:
        accumulators[0].add(events)
        accumulators[1].add(nbytes)


def _as_meta(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Bookkeeping rows of an EVENT_ROWS batch re-laid as STATE_ROWS."""
    columns = [
        batch.column(name) if name in META_COLUMNS else pa.nulls(batch.num_rows, f.type)
        for name, f in zip(STATE_ROWS.names, STATE_ROWS)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=STATE_ROWS)


def aggregate_events(definitions: Definitions, stage: str = "per-type", inline_rows: int = 0) -> ArrowMapFn:
    """The per-type stage: aggregate the events of the partition (any layout holding the event columns the
    definitions use, :func:`~drainpipe.spark.rows.columns_used`; with a ``kind`` column, EXIT rows feed only the
    top-Ns keyed on ``db_statement`` and other non-EVENT rows are bookkeeping that passes through)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        aggregator = _Aggregator(definitions, inline_rows)

        def body() -> Iterator[pa.RecordBatch]:
            for batch in batches:
                if "kind" not in batch.schema.names:
                    aggregator.add(fill_unused(batch))
                    continue
                kind = np.asarray(batch.column("kind").to_numpy(zero_copy_only=False))
                is_event = (kind == EVENT) | (kind == EXIT)
                if not is_event.all():
                    yield _as_meta(batch.filter(pa.array(~is_event)))
                    batch, kind = batch.filter(pa.array(is_event)), kind[is_event]
                exits = kind == EXIT
                if exits.any():  # requests first, then the exit rows, as an EventBatch holds them
                    batch = batch.take(pa.array(np.concatenate([np.flatnonzero(~exits), np.flatnonzero(exits)])))
                events = fill_unused(batch).combine_chunks()
                rows = events.to_batches()[0] if events.num_rows else None
                if rows is not None:
                    aggregator.add(EventBatch(rows, int((~exits).sum())))
            yield from aggregator.rows()

        yield from _timed(stage, STATE_ROWS, body, aggregator.report)

    return run


def merge_topn(definitions: Definitions) -> ArrowMapFn:
    """Merge the TOPN rows of the partition per definition with the shared :func:`merge`."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        received = [b for b in batches if b.num_rows]
        if not received:
            return
        table = pa.Table.from_batches(received)
        for index, definition in enumerate(definitions.all):
            if isinstance(definition, TopNDef):
                rows = select_rows(table, TOPN, index)
                if rows.num_rows:
                    yield partial_rows(index, normalize(topn_partial(definition, rows)))

    return run


def pack_ipc(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A partition's rows as Arrow IPC stream blobs, one ``(part, ipc)`` row per input batch, so the driver can fetch
    partitions one at a time (``toLocalIterator``) and rebuild them as Arrow without Python rows."""
    part = _partition_id()
    for batch in batches:
        if batch.num_rows:
            yield pa.RecordBatch.from_pydict(
                {"part": pa.array([part], pa.int32()), "ipc": pa.array([to_ipc(batch)], pa.binary())}
            )


def sample_types(groups: Sequence[Sequence[Split]], type_key: str, sample_rows: int) -> ArrowMapFn:
    """Type weights from the head of each split: ``(type, weight)`` rows, the split's weight shared out in
    proportion to the types among its first ``sample_rows`` accepted events (validated like everything else)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for split in _splits(batches, groups):
            reader, _ = read_split(split)
            first = next(iter(reader), None)
            if first is None or first.num_rows == 0:
                continue
            head = first.rows.slice(0, sample_rows)
            counts = pc.value_counts(head.column(type_key).drop_null())
            values = counts.field("values")
            shares = counts.field("counts").to_numpy() / head.num_rows * split.weight
            yield pa.RecordBatch.from_arrays(
                [values.cast(pa.string()), pa.array(shares, pa.float64())], schema=SAMPLE_SCHEMA
            )

    return run


SAMPLE_SCHEMA = pa.schema([("type", pa.string()), ("weight", pa.float64())])
