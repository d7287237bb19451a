"""The row layouts the Spark job exchanges between Python tasks and the JVM, and their conversions.

Two Arrow schemas (Spark schemas are derived from them, :func:`spark_schema`):

* :data:`STATE_ROWS` - what the aggregation tasks emit: partial states of every definition plus the run's
  bookkeeping, told apart by ``kind``:

  ========== ===================================================================================
  METRIC     ``d`` (index into ``Definitions.all``), ``inline`` (collected by the job's first action: the
             task's states were few) and ``ipc``: up to :data:`PACK_ROWS` of the definition's
             minute states (the partial's own table: ``entity``, ``bucket``, ``b`` for a percentile, the state
             columns :data:`~drainpipe.pipeline.partials.STATE_COLUMNS`) as one Arrow IPC stream
             (:func:`packed_rows`); :func:`unpack_rows` lays them out as rows for a Spark merge: ``entity``,
             ``bucket`` (minute start, epoch ms), ``b`` (percentile bin, else -1) and ``n v ok tol``
  TOPN       ``d``, ``entity``, ``bucket`` (start of the top-N's bucket), ``latency_ms``, ``key``
  REJECT     ``d`` = split index, ``line`` (within the split), ``raw`` (JSON text), ``reason``
  SPLIT      ``d`` = split index, ``info`` = JSON ``{"read", "accepted", "rejected", "reasons", "lines"}``
  TASK       ``d`` = Spark partition id, ``info`` = JSON ``{"stage", "seconds", "events"}``
  ========== ===================================================================================

* :data:`EVENT_ROWS` - parsed events on their way to the per-type stage (``kind`` EVENT for requests, EXIT for a
  CLIENT span's statement, which feeds only the top-Ns keyed on ``db_statement``; the canonical
  :data:`~drainpipe.inputs.EVENT_SCHEMA` columns, ``weight``, null where the batch had none: 1, and ``trace_id``)
  and the same bookkeeping rows.

Metric states travel packed because the JVM then handles a row per blob, not a row per state: converting every
state from Arrow to Spark's rows, caching them column by column and converting them back to Arrow for the
driver took more time than the tasks' aggregation itself (issue 57; ``docs/performance.md``). Only a merge in
Spark (many states) unpacks them into rows.

State rows become partials again with :func:`metric_partial` / :func:`topn_partial`, whose tables are exactly
the layouts :func:`~drainpipe.pipeline.aggregate.aggregate_batch` produces.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from drainpipe.inputs import EVENT_SCHEMA, TRACE_ID, WEIGHT, EventBatch
from drainpipe.pipeline import (
    STATE_COLUMNS,
    Definitions,
    MetricDef,
    MetricPartial,
    Partial,
    TopNDef,
    TopNPartial,
    partial_type,
)

__all__ = [
    "METRIC",
    "TOPN",
    "REJECT",
    "SPLIT",
    "TASK",
    "EVENT",
    "EXIT",
    "STATE_ROWS",
    "EVENT_ROWS",
    "META_COLUMNS",
    "spark_schema",
    "partial_rows",
    "packed_rows",
    "unpack_rows",
    "unpacked_partials",
    "PACK_ROWS",
    "PACK_BATCH_BYTES",
    "PACK_OPTIONS",
    "to_ipc",
    "from_ipc",
    "state_table",
    "meta_rows",
    "info_row",
    "events_rows",
    "metric_partial",
    "topn_partial",
    "empty_like",
    "select_rows",
    "columns_used",
    "topn_only_filter",
    "fill_unused",
]

METRIC, TOPN, REJECT, SPLIT, TASK, EVENT, EXIT = 0, 1, 2, 3, 4, 5, 6

_META = [
    pa.field("line", pa.int64()),
    pa.field("raw", pa.string()),
    pa.field("reason", pa.string()),
    pa.field("info", pa.string()),
]
META_COLUMNS: tuple[str, ...] = ("kind", "d", *(f.name for f in _META))

STATE_ROWS = pa.schema(
    [
        pa.field("kind", pa.int8()),
        pa.field("d", pa.int32()),
        pa.field("entity", pa.string()),
        pa.field("bucket", pa.int64()),
        pa.field("b", pa.int64()),
        pa.field("n", pa.int64()),
        pa.field("v", pa.float64()),
        pa.field("ok", pa.int64()),
        pa.field("tol", pa.int64()),
        pa.field("latency_ms", pa.float64()),
        pa.field("key", pa.string()),
        *_META,
        pa.field("ipc", pa.binary()),
        pa.field("inline", pa.bool_()),
    ]
)

EVENT_ROWS = pa.schema(
    [
        pa.field("kind", pa.int8()),
        pa.field("d", pa.int32()),
        *(pa.field(f.name, f.type) for f in EVENT_SCHEMA),  # nullable here: bookkeeping rows have no event
        pa.field(WEIGHT, pa.int64()),  # a sampled span's adjusted count; null: 1
        pa.field(TRACE_ID, pa.binary()),  # the span's trace id, when kept for exemplars
        *_META,
    ]
)

_DDL = {
    pa.int8(): "tinyint",
    pa.int32(): "int",
    pa.int64(): "bigint",
    pa.float64(): "double",
    pa.string(): "string",
    pa.bool_(): "boolean",
    pa.binary(): "binary",
}


def spark_schema(schema: pa.Schema) -> str:
    """The Spark DDL of one of the schemas above."""
    return ", ".join(f"`{f.name}` {_DDL[f.type]}" for f in schema)


def _constant(value: Any, rows: int, type_: pa.DataType) -> pa.Array:
    return pa.array(np.full(rows, value), type_) if rows else pa.array([], type_)


def _batch(schema: pa.Schema, rows: int, columns: Mapping[str, Any]) -> pa.RecordBatch:
    """A batch of ``schema``: given columns (arrays or scalars to repeat), the others null."""
    arrays = []
    for f in schema:
        value = columns.get(f.name)
        if value is None:
            arrays.append(pa.nulls(rows, f.type))
        elif isinstance(value, (pa.Array, pa.ChunkedArray)):
            arr = value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value
            arrays.append(arr if arr.type == f.type else arr.cast(f.type))
        else:
            arrays.append(_constant(value, rows, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def partial_rows(index: int, partial: TopNPartial) -> pa.RecordBatch:
    """The states of the top-N ``partial`` (definition number ``index``) as TOPN rows of :data:`STATE_ROWS` (a
    metric partial's travel packed: :func:`packed_rows`)."""
    table = partial.table
    columns: dict[str, Any] = {name: table.column(name) for name in table.column_names}
    columns.update(kind=TOPN, d=index)
    return _batch(STATE_ROWS, table.num_rows, columns)


#: metric states per packed METRIC row (a few MB of Arrow: far below a Spark row's 2 GB limit)
PACK_ROWS = 1 << 17
#: a batch of packed rows ends once its blobs pass this many bytes (a binary column's offsets are 32-bit)
PACK_BATCH_BYTES = 1 << 30
#: packed states are LZ4-compressed Arrow IPC where the writer's pyarrow has the codec (its wheels do; a reader needs
#: it too, and nothing else: the stream says how it is compressed): a task's states shrink about 5x for 8 ms a
#: 13 MB, and moving a MB through Spark to the driver costs ~7 ms (Python -> JVM -> the task's result -> the driver
#: -> Python; docs/performance.md)
PACK_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4" if pa.Codec.is_available("lz4") else None)


def packed_rows(index: int, partial: MetricPartial, inline: bool = False) -> Iterator[pa.RecordBatch]:
    """The states of the metric ``partial`` (definition number ``index``) as packed METRIC rows of
    :data:`STATE_ROWS`: its table in slices of :data:`PACK_ROWS`, each an Arrow IPC stream, in batches of at most
    :data:`PACK_BATCH_BYTES` of blobs; ``inline`` marks them for the job's first action."""
    table = partial.table
    sink = pa.BufferOutputStream()  # a batch's blobs one after the other: its data buffer, not copied again
    offsets = [0]
    for start in range(0, table.num_rows, PACK_ROWS):
        piece = table.slice(start, PACK_ROWS)
        with pa.ipc.new_stream(sink, piece.schema, options=PACK_OPTIONS) as writer:
            writer.write_table(piece)
        offsets.append(sink.tell())
        if offsets[-1] >= PACK_BATCH_BYTES and start + PACK_ROWS < table.num_rows:
            yield _packed_batch(index, offsets, sink.getvalue(), inline)
            sink, offsets = pa.BufferOutputStream(), [0]
    if len(offsets) > 1:
        yield _packed_batch(index, offsets, sink.getvalue(), inline)


def _packed_batch(index: int, offsets: list[int], data: pa.Buffer, inline: bool) -> pa.RecordBatch:
    blobs = pa.Array.from_buffers(
        pa.binary(), len(offsets) - 1, [None, pa.py_buffer(np.array(offsets, np.int32)), data]
    )
    return _batch(STATE_ROWS, len(blobs), {"kind": METRIC, "d": index, "ipc": blobs, "inline": inline})


def _unpacked(rows: pa.Table | pa.RecordBatch) -> Iterator[tuple[int, pa.Table]]:
    """``(d, states)`` of each packed METRIC row of ``rows``."""
    for d, blob in zip(rows.column("d").to_pylist(), rows.column("ipc")):
        yield d, from_ipc(blob.as_buffer())


def to_ipc(rows: pa.RecordBatch | pa.Table, compress: bool = False) -> bytes:
    """``rows`` as one Arrow IPC stream, ``compress``-ed as packed states are (:data:`PACK_OPTIONS`)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema, options=PACK_OPTIONS if compress else None) as writer:
        writer.write(rows)
    return sink.getvalue().to_pybytes()


def from_ipc(blob: bytes | pa.Buffer) -> pa.Table:
    """The rows of one Arrow IPC stream (compressed or not)."""
    return pa.ipc.open_stream(pa.py_buffer(blob) if isinstance(blob, bytes) else blob).read_all()


def state_table(table: pa.Table) -> pa.Table:
    """``table`` (STATE_ROWS from IPC, or from Spark's ``toArrow``, which may give large string and binary types)
    as :data:`STATE_ROWS` exactly, so that tables from both concatenate."""
    return table if table.schema.equals(STATE_ROWS) else table.cast(STATE_ROWS)


def unpacked_partials(rows: pa.Table, definitions: Definitions) -> dict[int, list[MetricPartial]]:
    """The metric partials of the packed METRIC rows of ``rows`` (other kinds are skipped), per definition number:
    the states as the tasks' aggregation made them."""
    out: dict[int, list[MetricPartial]] = {}
    for d, table in _unpacked(select_rows(rows, METRIC)):
        definition = definitions.all[d]
        assert isinstance(definition, MetricDef)
        partial = partial_type(definition)(table, "minute")  # type: ignore[call-arg]
        assert isinstance(partial, MetricPartial)
        out.setdefault(d, []).append(partial)
    return out


def unpack_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The packed METRIC rows of ``batches`` laid out as one :data:`STATE_ROWS` row per state (an
    ``mapInArrow`` function, for a merge in Spark); rows of other kinds pass through."""
    for batch in batches:
        metric = pc.equal(batch.column("kind"), METRIC)
        other = batch.filter(pc.invert(metric))
        if other.num_rows:
            yield other
        for d, table in _unpacked(batch.filter(metric)):
            columns: dict[str, Any] = {name: table.column(name) for name in table.column_names}
            columns.update(kind=METRIC, d=d)
            columns.setdefault("b", -1)
            yield _batch(STATE_ROWS, table.num_rows, columns)


def meta_rows(schema: pa.Schema, kind: int, d: Iterable[int], **columns: Iterable[Any]) -> pa.RecordBatch:
    """Bookkeeping rows (REJECT, SPLIT, TASK) in ``schema`` (:data:`STATE_ROWS` or :data:`EVENT_ROWS`)."""
    ds = list(d)
    arrays: dict[str, Any] = {"kind": kind, "d": pa.array(ds, pa.int32())}
    for name, values in columns.items():
        arrays[name] = pa.array(list(values), schema.field(name).type)
    return _batch(schema, len(ds), arrays)


def info_row(schema: pa.Schema, kind: int, d: int, info: Mapping[str, Any]) -> pa.RecordBatch:
    """One SPLIT or TASK row with ``info`` as JSON."""
    return meta_rows(schema, kind, [d], info=[json.dumps(info, sort_keys=True)])


def events_rows(batch: EventBatch) -> pa.RecordBatch:
    """Canonical events (with or without the optional columns) as :data:`EVENT_ROWS`: its requests of kind EVENT,
    its exit rows (a CLIENT span's statement, which feeds only the top-Ns keyed on ``db_statement``) of kind
    EXIT."""
    rows = batch.rows
    names = (*EVENT_SCHEMA.names, WEIGHT, TRACE_ID)
    columns = {name: rows.column(name) for name in names if name in rows.schema.names}
    kind = np.full(rows.num_rows, EVENT, np.int8)
    kind[batch.requests :] = EXIT
    columns["kind"] = pa.array(kind)
    return _batch(EVENT_ROWS, rows.num_rows, columns)


#: what an unused event column is filled with after :func:`columns_used` pruned it (never read by a definition)
_FILL: Mapping[str, Any] = {"instance": "", "endpoint": "", "status": True, "db_statement": None}


def columns_used(definitions: Definitions) -> tuple[str, ...]:
    """The event columns ``aggregate_batch`` reads for ``definitions`` (in :data:`EVENT_SCHEMA` order).

    Always ``ts`` and ``service`` (every entity and bucket), then each definition's scope column, its
    ``field``, the columns its ``where`` filter compares, ``latency_ms`` and ``status`` for the functions that
    classify events by them (apdex, percentile, sla), and a top-N's ``latency_ms`` and ``key``. The per-type
    stage ships only these through the shuffle; :func:`fill_unused` restores the rest with constants.
    """
    used = {"ts", "service"}
    for metric in definitions.metrics:
        if metric.scope != "service":
            used.add(metric.scope)
        if metric.field:
            used.add(metric.field)
        if metric.filter is not None:
            used.update(c.field for c in metric.filter.conditions)
        if metric.function in ("apdex", "percentile"):
            used.add("latency_ms")
        if metric.function in ("apdex", "sla"):
            used.add("status")
    for topn in definitions.topns:
        if topn.scope != "service":
            used.add(topn.scope)
        used.update(("latency_ms", topn.key))
    return tuple(name for name in EVENT_SCHEMA.names if name in used)


def topn_only_filter(definitions: Definitions) -> list[str] | None:
    """For a set of top-N definitions only: the key columns of which one must be set for a row to matter
    (rows without any key are skipped by every top-N); None when a metric needs every row."""
    if definitions.metrics or not definitions.topns:
        return None
    return sorted({t.key for t in definitions.topns})


def fill_unused(batch: pa.RecordBatch | pa.Table) -> pa.Table:
    """An event batch with every :data:`EVENT_SCHEMA` column, and ``weight`` and ``trace_id`` if it had them: columns
    absent (pruned) are filled with constants (``latency_ms`` 0.0, strings ``""``, ``status`` true,
    ``db_statement`` null)."""
    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    columns = []
    for f in EVENT_SCHEMA:
        if f.name in table.column_names:
            columns.append(table.column(f.name))
        else:
            fill = _FILL.get(f.name, 0.0 if f.name == "latency_ms" else "")
            columns.append(
                pa.nulls(table.num_rows, f.type) if fill is None else _constant(fill, table.num_rows, f.type)
            )
    fields = [pa.field(f.name, f.type) for f in EVENT_SCHEMA]
    for name, kind in ((WEIGHT, pa.int64()), (TRACE_ID, pa.binary())):
        if name in table.column_names:
            columns.append(table.column(name))
            fields.append(pa.field(name, kind))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def metric_partial(definition: MetricDef, rows: pa.Table) -> MetricPartial:
    """The minute partial of METRIC rows of one definition (state columns cast to their types)."""
    cls = partial_type(definition)
    columns: dict[str, Any] = {"entity": rows.column("entity"), "bucket": rows.column("bucket").cast(pa.int64())}
    if "b" in cls.key_columns:
        columns["b"] = rows.column("b").cast(pa.int64())
    for c in STATE_COLUMNS[definition.function]:
        columns[c.name] = rows.column(c.name).cast(c.type)
    return cls(pa.table(columns), "minute")  # type: ignore[call-arg,return-value]


def topn_partial(definition: TopNDef, rows: pa.Table) -> TopNPartial:
    """The partial of TOPN rows of one definition (not yet reduced to n per key: merge it)."""
    cls = partial_type(definition)
    table = pa.table({name: rows.column(name) for name in ("entity", "bucket", "latency_ms", "key")})
    return cls(table)  # type: ignore[return-value]


def empty_like(definition: MetricDef | TopNDef) -> Partial:
    """A partial without states."""
    rows = _batch(STATE_ROWS, 0, {})
    table = pa.Table.from_batches([rows])
    if isinstance(definition, MetricDef):
        return metric_partial(definition, table)
    return topn_partial(definition, table)


def select_rows(table: pa.Table, kind: int, d: int | None = None) -> pa.Table:
    """Rows of ``table`` of one kind (and definition / split number)."""
    mask = pc.equal(table.column("kind"), kind)
    if d is not None:
        mask = pc.and_(mask, pc.equal(table.column("d"), d))
    return table.filter(mask)
