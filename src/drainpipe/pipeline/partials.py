"""The metric functions and the top-N as mergeable states (partials): their types, merge, roll-up and pieces.

The other steps have a module each: :mod:`.aggregate` (event batch -> partials), :mod:`.values` (states ->
value rows), :mod:`.state_table` (the stores' encoding), with dense grouping in :mod:`.grouping`.

Contract (``docs/pipeline.md``, "Functions", "Entities and time buckets"):

* :func:`aggregate_batch` turns one event batch (pyarrow ``RecordBatch``/``Table`` with the reader's columns
  ``ts service instance endpoint latency_ms status db_statement``) into one partial per definition:
  the states of that batch per (entity, minute bucket) for a metric, per (entity, bucket of its minutes, 10 by
  default) for a top-N. Entities: ``service``; ``service/instance``; ``service/endpoint``; rows with an empty (or null)
  instance/endpoint do not count for that scope. It is columnar (numpy ``bincount`` over dense group ids,
  pyarrow hashing for wide key spaces); there is no per-event Python code.
* A partial is an instance of a class of its own per definition (:func:`partial_type`), since the queues
  dispatch by exact type. It holds a pyarrow table of states with unique keys. Partials pickle (by definition, not
  by class reference).
* :func:`merge` combines partials of one type; it is associative, commutative and exact for every integer
  state (counts, successes, apdex counts, percentile histograms) and for min/max. Float sums (``sum``,
  ``avg``) are float64 additions, whose result may differ in the last ulp with the order of additions; the
  merge itself is deterministic for a given order. :class:`MetricAccumulator` merges partials incrementally.
* :func:`rollup` turns minute states into hour/day states by merging (values are never averaged).
* :func:`split_partial` cuts a partial into smaller ones that merge back to it (the local engine's chunks).
* :func:`finalize` turns states into value rows ``(metric, entity, granularity, time_bucket, label, value)``
  (``time_bucket`` = bucket start, ISO-8601 with ``Z``), or for a top-N into rows
  ``(name, entity, time_bucket, rank, key, latency_ms)``.
* :func:`to_state_table`/:func:`from_state_table` (and the top-N equivalents) encode states in fixed
  columns for stores, which merge stored and new states with :func:`merge` (one merge implementation).

States per function (merge operation in brackets; ``n`` is always the number of counted events):

============== ================================================================================
count, cpm     ``n`` [sum]
sum            ``v`` = sum of field [sum]
avg            ``v`` = sum of field [sum], ``n`` [sum]
min / max      ``v`` [min / max]
sla            ``ok`` = successes [sum], ``n`` [sum]
apdex          ``ok`` = satisfied [sum], ``tol`` = tolerating [sum], ``n`` [sum]; frustrated = n - ok - tol
percentile     one row per histogram bin ``b`` = floor(latency_ms / precision_ms): ``n`` [sum]
top-N          up to n rows (latency_ms, key) per (entity, bucket) (or per latency bucket in that), ordered latency
               desc, key asc
============== ================================================================================

Everything here is plain data and pure functions; the only module state is the memo of
:func:`partial_type` (guarded by a lock), which must return the same class for equal definitions.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import strings
from .buckets import GRANULARITIES, GRANULARITY_MS
from .definitions import FUNCTIONS, Definition, MetricDef, TopNDef
from .grouping import arrow_column, first_rows, reduce_groups, string_codes, table_groups


@dataclass(frozen=True)
class StateColumn:
    """One state column of a partial: its name, arrow type and pyarrow hash-aggregation merge."""

    name: str
    type: pa.DataType
    merge: str  # "sum" | "min" | "max"


_N = StateColumn("n", pa.int64(), "sum")
_OK = StateColumn("ok", pa.int64(), "sum")
_TOL = StateColumn("tol", pa.int64(), "sum")
_V_SUM = StateColumn("v", pa.float64(), "sum")

STATE_COLUMNS: Mapping[str, tuple[StateColumn, ...]] = MappingProxyType(
    {
        "count": (_N,),
        "cpm": (_N,),
        "sum": (_V_SUM,),
        "avg": (_V_SUM, _N),
        "min": (StateColumn("v", pa.float64(), "min"),),
        "max": (StateColumn("v", pa.float64(), "max"),),
        "sla": (_OK, _N),
        "apdex": (_OK, _TOL, _N),
        "percentile": (_N,),
    }
)
assert set(STATE_COLUMNS) == set(FUNCTIONS)

TOPN_STATE_SCHEMA = pa.schema(
    [("entity", pa.string()), ("bucket", pa.int64()), ("latency_ms", pa.float64()), ("key", pa.string())]
)

__all__ = [
    "StateColumn",
    "STATE_COLUMNS",
    "TOPN_STATE_SCHEMA",
    "Partial",
    "MetricPartial",
    "TopNPartial",
    "partial_type",
    "merge",
    "normalize",
    "rollup",
    "fold_entities",
    "MetricAccumulator",
    "split_partial",
    "keep_top",
    "run_positions",
    "run_starts",
]
TOPN_ORDER = [("entity", "ascending"), ("bucket", "ascending"), ("latency_ms", "descending"), ("key", "ascending")]

P = TypeVar("P", bound="Partial")


class Partial:
    """Base of the per-definition partial classes: a table of states.

    ``table`` has unique :attr:`key_columns` (``bucket`` = bucket start in epoch ms), except top-N tables,
    which hold up to n rows per (entity, bucket), sorted best first. Row order carries no meaning otherwise.
    Treat partials as immutable values. (What input the states hold is the store's progress rows' business, not
    the partial's: see :mod:`drainpipe.pipeline.progress`.)
    """

    __slots__ = ("table",)
    definition: ClassVar[Definition]
    key_columns: ClassVar[tuple[str, ...]]
    one_row_per_key: ClassVar[bool] = True

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    @property
    def name(self) -> str:
        return self.definition.name

    def __len__(self) -> int:
        """Number of (entity, bucket) state keys."""
        if self.one_row_per_key or self.table.num_rows == 0:
            return self.table.num_rows
        return table_groups(self.table, ("entity", "bucket"))[1]

    def _with(self: P, table: pa.Table) -> P:
        """A partial of the same type (and granularity) holding ``table``."""
        return type(self)(table)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} keys={len(self)}>"


class MetricPartial(Partial):
    """States of one metric at one granularity, keyed by (entity, bucket) (and ``b`` for percentile)."""

    __slots__ = ("granularity",)
    definition: ClassVar[MetricDef]

    def __init__(self, table: pa.Table, granularity: str = "minute") -> None:
        if granularity not in GRANULARITY_MS:
            raise ValueError(f"unknown granularity {granularity!r} (expected one of {', '.join(GRANULARITIES)})")
        super().__init__(table)
        self.granularity = granularity

    def _with(self: P, table: pa.Table) -> P:
        return type(self)(table, self.granularity)  # type: ignore[call-arg,attr-defined]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (self.definition, self.table, self.granularity))


class TopNPartial(Partial):
    """Top-N states: per (entity, bucket of the definition's minutes) up to n rows (latency_ms, key), best first
    (up to n per latency bucket, when the definition has them)."""

    __slots__ = ()
    definition: ClassVar[TopNDef]
    key_columns = ("entity", "bucket")
    one_row_per_key = False

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (self.definition, self.table))


def _restore(definition: Definition, table: pa.Table, *granularity: str) -> Partial:
    return partial_type(definition)(table, *granularity)


_TYPES: dict[Definition, type[Partial]] = {}
_TYPES_LOCK = threading.Lock()


def partial_type(definition: Definition) -> type[Partial]:
    """The partial class of ``definition``: one distinct class per definition (equal definitions share it).

    Subclass of :class:`MetricPartial` or :class:`TopNPartial`, named after the definition
    (``service_cpm`` -> ``ServiceCpmPartial``), with the definition as class attribute ``definition``.
    """
    cls = _TYPES.get(definition)
    if cls is not None:
        return cls
    with _TYPES_LOCK:
        cls = _TYPES.get(definition)
        if cls is None:
            cls = _make_type(definition)
            _TYPES[definition] = cls
        return cls


def _make_type(definition: Definition) -> type[Partial]:
    name = "".join(part.capitalize() for part in re.split(r"_+", definition.name) if part) + "Partial"
    attributes: dict[str, Any] = {
        "__slots__": (),
        "__module__": __name__,
        "__qualname__": name,
        "definition": definition,
    }
    if isinstance(definition, MetricDef):
        base: type[Partial] = MetricPartial
        keys = ("entity", "bucket", "b") if definition.function == "percentile" else ("entity", "bucket")
        attributes["key_columns"] = keys
        attributes["one_row_per_key"] = len(keys) == 2
    elif isinstance(definition, TopNDef):
        base = TopNPartial
    else:
        raise TypeError(f"not a metric or topn definition: {definition!r}")
    return type(name, (base,), attributes)


def run_starts(table: pa.Table, classes: np.ndarray | None = None) -> np.ndarray:
    """Row indices where a new (entity, bucket) run starts in a table sorted by those columns (and where
    ``classes``, one value a row and constant over runs of it, changes)."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    entity = string_codes(table.column("entity"))[0]
    bucket = table.column("bucket").to_numpy()
    change = np.ones(table.num_rows, dtype=bool)
    change[1:] = (entity[1:] != entity[:-1]) | (bucket[1:] != bucket[:-1])
    if classes is not None:
        change[1:] |= classes[1:] != classes[:-1]
    return np.flatnonzero(change)


def run_positions(table: pa.Table, classes: np.ndarray | None = None) -> np.ndarray:
    """For a table sorted by (entity, bucket): each row's position within its (entity, bucket) run (or its run of
    one class within that, :func:`run_starts`)."""
    starts = run_starts(table, classes)
    run = np.zeros(table.num_rows, dtype=np.int64)
    run[starts[1:]] = 1
    return np.arange(table.num_rows) - starts[np.cumsum(run)]


def keep_top(table: pa.Table, definition: TopNDef) -> pa.Table:
    """Sort top-N rows by (entity, bucket, latency desc, key asc) and keep the first ``n`` per group: an
    (entity, bucket), or with the definition's ``latency_buckets_ms`` an (entity, bucket, latency bucket), whose
    rows are consecutive in that order."""
    if table.num_rows == 0:
        return table
    table = table.take(pc.sort_indices(table, sort_keys=TOPN_ORDER))
    classes = None
    if definition.latency_buckets_ms:
        classes = definition.latency_classes(table.column("latency_ms").to_numpy())
    return table.filter(pa.array(run_positions(table, classes) < definition.n))


# --------------------------------------------------------------------------------------------- merge


def _merge_states(table: pa.Table, metric: MetricDef, key_columns: Sequence[str]) -> pa.Table:
    """Combine rows with equal keys by each state column's merge operation (row order is not kept)."""
    ids, size = table_groups(table, key_columns)
    first = first_rows(ids, size)
    columns: dict[str, Any] = {k: _taken(table.column(k), first) for k in key_columns}
    for c in STATE_COLUMNS[metric.function]:
        merged = reduce_groups(ids, size, table.column(c.name).to_numpy(), c.merge, c.type)
        columns[c.name] = arrow_column(merged, c.type)
    return pa.table(columns)


def _taken(column: pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
    """A key column's values at ``rows``, by the kernels that keep the GIL (:mod:`.strings`) where they apply."""
    if column.type == pa.string():
        return strings.take_strings(column, rows)
    if column.type == pa.int64() and column.null_count == 0:
        return arrow_column(column.to_numpy()[rows], pa.int64())
    return column.take(pa.array(rows))


def fold_entities(partial: P, fold: np.ndarray, into: str) -> P:
    """``partial`` with the entity of every row where ``fold`` is true renamed to ``into``, and rows that now share
    a key merged (the cardinality guard's overflow)."""
    table = partial.table
    index = table.schema.get_field_index("entity")
    entity = pc.if_else(pa.array(fold), pa.scalar(into), table.column("entity"))
    return normalize(partial._with(table.set_column(index, table.schema.field(index), entity)))


def merge(partials: Iterable[P]) -> P:
    """Merge partials of one exact type (and granularity) into one partial with unique keys.

    Associative and commutative (exactly so for integer states and min/max; float sums up to the last
    ulp). Row order is unspecified except for top-N (sorted, best first). One partial
    is returned as it is: a partial has unique keys (see :class:`Partial`; :func:`normalize` makes rows gathered
    from elsewhere into one). Raises ``ValueError`` for an empty input or mixed types or granularities.
    """
    parts = list(partials)
    if not parts:
        raise ValueError("merge needs at least one partial")
    first = parts[0]
    cls = type(first)
    for part in parts[1:]:
        if type(part) is not cls:
            raise ValueError(f"cannot merge {type(part).__name__} into {cls.__name__}")
        if isinstance(first, MetricPartial) and part.granularity != first.granularity:  # type: ignore[attr-defined]
            raise ValueError(f"cannot merge {part.granularity} states into {first.granularity} states")  # type: ignore[attr-defined]
    if len(parts) == 1:  # already unique keys: hashing them again would only cost (a store merges single flushes)
        return first
    table = pa.concat_tables([p.table for p in parts])
    return normalize(first._with(table))


def normalize(partial: P) -> P:
    """``partial`` with the rows of equal keys combined (a top-N's sorted and cut to n per key): the form every
    partial has. For tables that were built from rows that may repeat a key (re-bucketed, renamed, gathered)."""
    table = partial.table.combine_chunks()
    definition = partial.definition
    if isinstance(definition, MetricDef):
        table = _merge_states(table, definition, partial.key_columns)
    else:
        table = keep_top(table.cast(TOPN_STATE_SCHEMA), definition)
    return partial._with(table)


def rollup(partial: MetricPartial, granularity: str) -> MetricPartial:
    """The states of ``partial`` re-bucketed to a coarser (or equal) granularity and merged."""
    if granularity not in GRANULARITY_MS:
        raise ValueError(f"unknown granularity {granularity!r} (expected one of {', '.join(GRANULARITIES)})")
    width = GRANULARITY_MS[granularity]
    if width < GRANULARITY_MS[partial.granularity]:
        raise ValueError(f"cannot roll {partial.granularity} states up to {granularity}")
    table = partial.table
    bucket = table.column("bucket").to_numpy()
    table = table.set_column(table.schema.get_field_index("bucket"), "bucket", pa.array(bucket - bucket % width))
    return normalize(type(partial)(table, granularity))


class MetricAccumulator:
    """Merges the partials of one definition (and granularity) keyed by (entity, bucket).

    ``add`` buffers partials and merges them in amortised batches (when the buffered rows exceed both
    ``compact_rows`` and the merged rows held); ``drain`` returns everything added since the last drain as one
    merged partial (None if nothing was added) and empties the accumulator; ``len`` is the number of distinct
    state keys held. Works for top-N partials too. Not thread-safe (a queue handler is never called
    concurrently with itself).
    """

    def __init__(self, definition: Definition, granularity: str = "minute", compact_rows: int = 65_536) -> None:
        self.partial_type = partial_type(definition)
        self.granularity = granularity
        self._compact_rows = compact_rows
        self._merged: Partial | None = None
        self._pending: list[Partial] = []
        self._pending_rows = 0

    def add(self, partial: Partial) -> None:
        if type(partial) is not self.partial_type:
            raise TypeError(f"{type(partial).__name__} added to the accumulator of {self.partial_type.__name__}")
        if isinstance(partial, MetricPartial) and partial.granularity != self.granularity:
            raise ValueError(f"{partial.granularity} states added to a {self.granularity} accumulator")
        self._pending.append(partial)
        self._pending_rows += partial.table.num_rows
        held = self._merged.table.num_rows if self._merged is not None else 0
        if self._pending_rows > max(self._compact_rows, held):
            self._compact()

    def _compact(self) -> None:
        if self._pending:
            parts = self._pending if self._merged is None else [self._merged, *self._pending]
            self._merged = merge(parts)
            self._pending = []
            self._pending_rows = 0

    def drain(self) -> Partial | None:
        """Everything added since the last drain, merged (None if nothing); the accumulator is left empty."""
        self._compact()
        merged, self._merged = self._merged, None
        return merged

    def __len__(self) -> int:
        self._compact()
        return 0 if self._merged is None else len(self._merged)


# --------------------------------------------------------------------------------------------- pieces


def split_partial(partial: P, max_rows: int) -> list[P]:
    """Cut a partial into pieces of at most ``max_rows`` state rows that merge back to it.

    The cut is deterministic (consecutive slices of the table), so re-aggregating the same batch yields the same
    pieces. The pieces are slices of the one table, not copies.
    """
    if max_rows < 1:
        raise ValueError("max_rows must be >= 1")
    table = partial.table
    count = -(-table.num_rows // max_rows)
    if count <= 1:
        return [partial]
    return [partial._with(table.slice(i * max_rows, max_rows)) for i in range(count)]
