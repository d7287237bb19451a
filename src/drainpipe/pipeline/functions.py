"""The metric functions and the top-N as mergeable states: aggregate, merge, roll up, finalize, encode.

Contract (``docs/pipeline.md``, "Functions", "Entities and time buckets"):

* :func:`aggregate_batch` turns one event batch (pyarrow ``RecordBatch``/``Table`` with the reader's columns
  ``ts service instance endpoint latency_ms status db_statement``) into one partial per definition:
  the states of that batch per (entity, minute bucket) for a metric, per (entity, 10-minute bucket) for a
  top-N. Entities: ``service``; ``service/instance``; ``service/endpoint``; rows with an empty (or null)
  instance/endpoint do not count for that scope. It is columnar (numpy ``bincount`` over dense group ids,
  pyarrow hashing for wide key spaces); there is no per-event Python code.
* A partial is an instance of a class of its own per definition (:func:`partial_type`), since the queues
  dispatch by exact type. It holds a pyarrow table of states with unique keys and the set of ``sources``
  (input-batch identities) it contains. Partials pickle (by definition, not by class reference).
* :func:`merge` combines partials of one type; it is associative, commutative and exact for every integer
  state (counts, successes, apdex counts, percentile histograms) and for min/max. Float sums (``sum``,
  ``avg``) are float64 additions, whose result may differ in the last ulp with the order of additions; the
  merge itself is deterministic for a given order. :class:`MetricAccumulator` merges partials incrementally.
* :func:`rollup` turns minute states into hour/day states by merging (values are never averaged).
* :func:`split_partial` cuts a partial into smaller ones that merge back to it; each piece names its share of
  the sources (``"s ~i/k"``), which idempotent stores rely on (see :mod:`drainpipe.pipeline.store`).
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
top-N          up to n rows (latency_ms, key) per (entity, bucket), ordered latency desc, key asc
============== ================================================================================

Everything here is plain data and pure functions; the only module state is the memo of
:func:`partial_type` (guarded by a lock), which must return the same class for equal definitions.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..inputs.records import request_rows
from .buckets import GRANULARITIES, GRANULARITY_MS, PERCENTILE_LABELS, PERCENTILES, TOPN_BUCKET_MS
from .definitions import FUNCTIONS, Definition, Definitions, MetricDef, TopNDef
from .times import BUCKET_TIME, iso_from_ms, ms_from_bucket

__all__ = [
    "GRANULARITY_MS",
    "GRANULARITIES",
    "TOPN_BUCKET_MS",
    "PERCENTILES",
    "PERCENTILE_LABELS",
    "VALUE_COLUMNS",
    "TOPN_COLUMNS",
    "STATE_COLUMNS",
    "STATE_TABLE_SCHEMA",
    "StateColumn",
    "Partial",
    "MetricPartial",
    "TopNPartial",
    "partial_type",
    "aggregate_batch",
    "merge",
    "normalize",
    "rollup",
    "MetricAccumulator",
    "finalize",
    "finalize_table",
    "split_partial",
    "piece_of",
    "source_root",
    "PIECE_MARK",
    "to_state_table",
    "from_state_table",
    "to_topn_table",
    "from_topn_table",
]

VALUE_COLUMNS: tuple[str, ...] = ("metric", "entity", "granularity", "time_bucket", "label", "value")
TOPN_COLUMNS: tuple[str, ...] = ("name", "entity", "time_bucket", "rank", "key", "latency_ms")


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

#: stored form of metric states (see :func:`to_state_table`); ``b`` is -1 except for percentile bins
STATE_TABLE_SCHEMA = pa.schema(
    [
        ("entity", pa.string()),
        ("time_bucket", BUCKET_TIME),
        ("b", pa.int64()),
        ("n", pa.int64()),
        ("v", pa.float64()),
        ("ok", pa.int64()),
        ("tol", pa.int64()),
    ]
)
_TOPN_STATE_SCHEMA = pa.schema(
    [("entity", pa.string()), ("bucket", pa.int64()), ("latency_ms", pa.float64()), ("key", pa.string())]
)
_TOPN_ORDER = [("entity", "ascending"), ("bucket", "ascending"), ("latency_ms", "descending"), ("key", "ascending")]

# --------------------------------------------------------------------------------------------- partials

P = TypeVar("P", bound="Partial")


class Partial:
    """Base of the per-definition partial classes: a table of states plus the sources it contains.

    ``table`` has unique :attr:`key_columns` (``bucket`` = bucket start in epoch ms), except top-N tables,
    which hold up to n rows per (entity, bucket), sorted best first. Row order carries no meaning otherwise.
    ``sources`` are the identities of the input batches whose events the states contain (may be empty).
    Treat partials as immutable values.
    """

    __slots__ = ("table", "sources")
    definition: ClassVar[Definition]
    key_columns: ClassVar[tuple[str, ...]]
    one_row_per_key: ClassVar[bool] = True

    def __init__(self, table: pa.Table, sources: Iterable[str] = ()) -> None:
        self.table = table
        self.sources = frozenset(sources)

    @property
    def name(self) -> str:
        return self.definition.name

    def __len__(self) -> int:
        """Number of (entity, bucket) state keys."""
        if self.one_row_per_key or self.table.num_rows == 0:
            return self.table.num_rows
        return _table_groups(self.table, ("entity", "bucket"))[1]

    def _with(self: P, table: pa.Table, sources: Iterable[str]) -> P:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} keys={len(self)} sources={len(self.sources)}>"


class MetricPartial(Partial):
    """States of one metric at one granularity, keyed by (entity, bucket) (and ``b`` for percentile)."""

    __slots__ = ("granularity",)
    definition: ClassVar[MetricDef]

    def __init__(self, table: pa.Table, granularity: str = "minute", sources: Iterable[str] = ()) -> None:
        if granularity not in GRANULARITY_MS:
            raise ValueError(f"unknown granularity {granularity!r} (expected one of {', '.join(GRANULARITIES)})")
        super().__init__(table, sources)
        self.granularity = granularity

    def _with(self: P, table: pa.Table, sources: Iterable[str]) -> P:
        return type(self)(table, self.granularity, sources)  # type: ignore[call-arg,attr-defined]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (self.definition, self.table, self.sources, self.granularity))


class TopNPartial(Partial):
    """Top-N states: per (entity, 10-minute bucket) up to n rows (latency_ms, key), best first."""

    __slots__ = ()
    definition: ClassVar[TopNDef]
    key_columns = ("entity", "bucket")
    one_row_per_key = False

    def _with(self: P, table: pa.Table, sources: Iterable[str]) -> P:
        return type(self)(table, sources)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (self.definition, self.table, self.sources))


def _restore(definition: Definition, table: pa.Table, sources: frozenset[str], *granularity: str) -> Partial:
    cls = partial_type(definition)
    return cls(table, *granularity, sources=sources)  # type: ignore[misc]


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


# --------------------------------------------------------------------------------------------- grouping

_FIELDS = ("ts", "service", "instance", "endpoint", "latency_ms", "status")
_BUCKET_UNIT_MS = 60_000  # every bucket (minute, hour, day, 10 minutes) is a whole number of minutes
_MAX_KEY_SPACE = 1 << 62


def _dense_limit(rows: int) -> int:
    return max(1 << 16, 4 * rows)


def _factorize(keys: np.ndarray, size: int) -> tuple[np.ndarray, int]:
    """Map non-negative int64 codes below ``size`` to dense ids: (id per element, number of ids).

    A lookup table of ``size`` entries when that is small, else a sort: ids follow the keys' order either way.
    Callers must not depend on that order.
    """
    if size <= _dense_limit(len(keys)):
        seen = np.zeros(size, dtype=bool)
        seen[keys] = True
        uniques = np.flatnonzero(seen)
        lookup = np.empty(size, dtype=np.int64)
        lookup[uniques] = np.arange(len(uniques), dtype=np.int64)
        return lookup[keys], len(uniques)
    # a wide key space (entity x minute x percentile bin): sorting beat pyarrow's hash table 1.2-2x here (22-51 vs
    # 36-60 ns a key, most on the sorted runs that merging sorted partials gives)
    order = np.argsort(keys)
    ordered = keys[order]
    starts = np.empty(len(keys), dtype=bool)
    starts[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    ids = np.empty(len(keys), dtype=np.int64)
    ids[order] = np.cumsum(starts) - 1
    return ids, int(np.count_nonzero(starts))


def _compact(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Integer values -> (code per element in [0, size), size) with size <= max(len, dense limit)."""
    if len(values) == 0:
        return np.zeros(0, dtype=np.int64), 1
    low, high = int(values.min()), int(values.max())
    codes = np.subtract(values, low, dtype=np.int64)
    if high - low < _dense_limit(len(values)):
        return codes, high - low + 1
    return _factorize(codes, high - low + 1)


def _group_ids(codes: Sequence[tuple[np.ndarray, int]]) -> tuple[np.ndarray, int]:
    """Dense group ids of the rows' code tuples (each code in [0, size)): (id per row, number of groups)."""
    ids, size = codes[0][0], codes[0][1]
    for column, width in codes[1:]:
        if size * width >= _MAX_KEY_SPACE:  # keep the combined code within int64
            ids, size = _factorize(ids, size)
        ids = np.multiply(ids, width, dtype=np.int64)  # a new array: the caller's codes are never modified
        ids += column
        size *= width
    return _factorize(ids, size)


def _first_rows(ids: np.ndarray, size: int) -> np.ndarray:
    """A representative row index per group id."""
    rows = np.empty(size, dtype=np.int64)
    rows[ids] = np.arange(len(ids), dtype=np.int64)
    return rows


def _string_codes(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, int]:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    encoded = pc.dictionary_encode(column)
    return encoded.indices.to_numpy(zero_copy_only=False), max(len(encoded.dictionary), 1)


def _key_codes(table: pa.Table, column: str) -> tuple[np.ndarray, int]:
    if column == "entity":
        return _string_codes(table.column(column))
    values = table.column(column).to_numpy()
    return _compact(values // _BUCKET_UNIT_MS if column == "bucket" else values)


def _table_groups(table: pa.Table, key_columns: Sequence[str]) -> tuple[np.ndarray, int]:
    """Dense group ids of a state table's rows by ``key_columns``."""
    return _group_ids([_key_codes(table, c) for c in key_columns])


def _reduce(ids: np.ndarray, size: int, values: np.ndarray, column: StateColumn) -> np.ndarray:
    """Combine per-row state values into per-group values with the column's merge operation."""
    if column.merge == "sum":
        if pa.types.is_integer(column.type):
            out = np.zeros(size, dtype=np.int64)
            np.add.at(out, ids, values.astype(np.int64))
            return out
        return np.bincount(ids, weights=values, minlength=size)
    ufunc, start = (np.minimum, np.inf) if column.merge == "min" else (np.maximum, -np.inf)
    out = np.full(size, start)
    ufunc.at(out, ids, values)
    return out


# --------------------------------------------------------------------------------------------- batch view


@dataclass(frozen=True)
class _Groups:
    """The (entity, time bucket) groups of one scope and bucket width within a batch."""

    gid: np.ndarray  # per row: group id, -1 when the row does not count for the scope
    entity: pa.Array  # per group
    bucket: np.ndarray  # per group: bucket start, epoch ms
    counted: np.ndarray | None  # per row: counts for the scope (None = every row)

    @property
    def size(self) -> int:
        return len(self.bucket)


class _BatchView:
    """Columns of one batch as numpy arrays, and their derived groupings, computed once and cached."""

    def __init__(self, batch: pa.RecordBatch | pa.Table) -> None:
        missing = [f for f in _FIELDS if f not in batch.schema.names]
        if missing:
            raise ValueError(f"event batch lacks column(s): {', '.join(missing)}")
        self.batch = batch
        self.rows = batch.num_rows
        self._cache: dict[Any, Any] = {}

    def _cached(self, key: Any, compute: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def arrow(self, name: str) -> pa.Array:
        column = self.batch.column(name)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        return column

    def numpy(self, name: str) -> np.ndarray:
        """A numeric/bool column as numpy (int64 for ts, bool for status, float64 otherwise)."""

        def compute() -> np.ndarray:
            column = self.arrow(name).to_numpy(zero_copy_only=False)
            if name == "status":
                return column.astype(bool, copy=False)
            return column.astype(np.int64 if name == "ts" else np.float64, copy=False)

        return self._cached(("numpy", name), compute)

    def encoded(self, name: str) -> tuple[np.ndarray, pa.Array]:
        """A string column dictionary-encoded: (code per row, distinct values); nulls count as ""."""

        def compute() -> tuple[np.ndarray, pa.Array]:
            column = self.batch.column(name)
            if isinstance(column, pa.ChunkedArray):
                column = column.combine_chunks()
            if pa.types.is_dictionary(column.type) and not column.null_count:
                # the reader's codes, as they are: only the dictionary (small; its values may repeat) is encoded
                values = pc.dictionary_encode(column.dictionary)
                return values.indices.to_numpy()[column.indices.to_numpy()], values.dictionary
            column = self.arrow(name)
            if column.null_count:
                column = pc.fill_null(column, "")
            encoded = pc.dictionary_encode(column)
            return encoded.indices.to_numpy(), encoded.dictionary

        return self._cached(("encoded", name), compute)

    def groups(self, scope: str, width_ms: int) -> _Groups:
        return self._cached(("groups", scope, width_ms), lambda: self._groups(scope, width_ms))

    def _groups(self, scope: str, width_ms: int) -> _Groups:
        services, service_names = self.encoded("service")
        slots = self.numpy("ts") // width_ms
        columns = [services]
        names = [service_names]
        counted = None
        if scope != "service":
            subs, sub_names = self.encoded(scope)
            empty = pc.index(sub_names, "").as_py()
            counted = subs != empty if empty >= 0 else None
            columns.append(subs)
            names.append(sub_names)
        if counted is not None:
            columns, slots = [c[counted] for c in columns], slots[counted]
        codes = [(c, max(len(n), 1)) for c, n in zip(columns, names)]
        ids, size = _group_ids([*codes, _compact(slots)])
        first = _first_rows(ids, size)
        parts = [n.take(pa.array(c[first])) for c, n in zip(columns, names)]
        entity = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, "/")
        if counted is None:
            gid = ids
        else:
            gid = np.full(self.rows, -1, dtype=np.int64)
            gid[counted] = ids
        return _Groups(gid, entity, slots[first] * width_ms, counted)

    def selected(self, metric: MetricDef, column: str) -> np.ndarray:
        """A per-row array restricted to the rows ``metric`` counts.

        ``column``: ``gid`` (minute group id), an event column, ``bin:P`` / ``b:P`` (histogram bin code / bin
        of precision P).
        """

        def compute() -> np.ndarray:
            rows = self.selection(metric)
            if column == "gid":
                values = self.groups(metric.scope, GRANULARITY_MS["minute"]).gid
            elif column.startswith(("bin:", "b:")):
                kind, precision = column.split(":")
                codes, _, b = self.bins(float(precision))
                values = codes if kind == "bin" else b
            else:
                values = self.numpy(column)
            return values if rows is None else values[rows]

        return self._cached(("selected", metric.scope, metric.where, column), compute)

    def counts(self, metric: MetricDef) -> np.ndarray:
        """Per minute group of the metric's scope: the number of rows the metric counts."""
        size = self.groups(metric.scope, GRANULARITY_MS["minute"]).size
        return self._cached(
            ("counts", metric.scope, metric.where), lambda: np.bincount(self.selected(metric, "gid"), minlength=size)
        )

    def selection(self, metric: MetricDef) -> np.ndarray | None:
        """Rows a metric counts: the scope's counted rows that pass its filter (None = every row)."""

        def compute() -> np.ndarray | None:
            counted = self.groups(metric.scope, GRANULARITY_MS["minute"]).counted
            if metric.filter is None:
                return counted
            mask = metric.filter.mask(self.batch)
            return mask if counted is None else mask & counted

        return self._cached(("selection", metric.scope, metric.where), compute)

    def bins(self, precision: float) -> tuple[np.ndarray, int, np.ndarray]:
        """Histogram bins b = floor(latency / precision): (bin code per row, code count, b per row)."""

        def compute() -> tuple[np.ndarray, int, np.ndarray]:
            b = np.floor(self.numpy("latency_ms") / precision)
            b = np.minimum(b, 2.0**53).astype(np.int64)  # latencies beyond 2^53 bins share the last bin
            codes, size = _compact(b)
            return codes, size, b

        return self._cached(("bins", precision), compute)


# --------------------------------------------------------------------------------------------- aggregation

StateArrays = dict[str, np.ndarray]
_Aggregator = Callable[[_BatchView, MetricDef, np.ndarray, np.ndarray, int], StateArrays]


def _categories(g: np.ndarray, category: np.ndarray, categories: int, size: int) -> np.ndarray:
    """Per group, the number of rows of each category: shape (size, categories), one bincount."""
    return np.bincount(g * categories + category, minlength=size * categories).reshape(size, categories)


def _agg_count(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    return {"n": n}


def _agg_sum(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    assert metric.field is not None
    return {"v": np.bincount(g, weights=view.selected(metric, metric.field), minlength=size)}


def _agg_avg(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    return {**_agg_sum(view, metric, g, n, size), "n": n}


def _agg_extreme(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    assert metric.field is not None
    (column,) = STATE_COLUMNS[metric.function]
    return {"v": _reduce(g, size, view.selected(metric, metric.field).astype(np.float64), column)}


def _agg_sla(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    return {"ok": _categories(g, view.selected(metric, "status"), 2, size)[:, 1], "n": n}


def _agg_apdex(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    latency = view.selected(metric, "latency_ms")
    t = metric.threshold_ms
    assert t is not None
    # 0 = frustrated (or failed), 1 = satisfied (latency <= t), 2 = tolerating (t < latency <= 4t)
    category = (latency <= t).astype(np.int64)
    category[(latency > t) & (latency <= 4 * t)] = 2
    category[~view.selected(metric, "status")] = 0
    counts = _categories(g, category, 3, size)
    return {"ok": counts[:, 1], "tol": counts[:, 2], "n": n}


_AGGREGATORS: Mapping[str, _Aggregator] = MappingProxyType(
    {
        "count": _agg_count,
        "cpm": _agg_count,
        "sum": _agg_sum,
        "avg": _agg_avg,
        "min": _agg_extreme,
        "max": _agg_extreme,
        "sla": _agg_sla,
        "apdex": _agg_apdex,
    }
)


def _state_table(
    entity: pa.Array, bucket: np.ndarray, states: StateArrays, layout: Sequence[StateColumn], **extra: np.ndarray
) -> pa.Table:
    columns: dict[str, Any] = {"entity": entity, "bucket": pa.array(bucket, pa.int64())}
    columns.update({k: pa.array(v, pa.int64()) for k, v in extra.items()})
    columns.update({c.name: pa.array(states[c.name], c.type) for c in layout})
    return pa.table(columns)


def _aggregate_metric(view: _BatchView, metric: MetricDef) -> pa.Table:
    groups = view.groups(metric.scope, GRANULARITY_MS["minute"])
    g = view.selected(metric, "gid")
    if metric.function == "percentile":
        return _aggregate_histogram(view, metric, groups, g)
    layout = STATE_COLUMNS[metric.function]
    n = view.counts(metric)
    states = _AGGREGATORS[metric.function](view, metric, g, n, groups.size)
    if n.all():
        return _state_table(groups.entity, groups.bucket, states, layout)
    present = np.flatnonzero(n)
    return _state_table(
        groups.entity.take(pa.array(present)),
        groups.bucket[present],
        {k: v[present] for k, v in states.items()},
        layout,
    )


def _aggregate_histogram(view: _BatchView, metric: MetricDef, groups: _Groups, g: np.ndarray) -> pa.Table:
    assert metric.precision_ms is not None
    precision = float(metric.precision_ms)
    bin_codes = view.selected(metric, f"bin:{precision!r}")
    ids, size = _group_ids([(g, max(groups.size, 1)), (bin_codes, view.bins(precision)[1])])
    first = _first_rows(ids, size)
    group = g[first]
    return _state_table(
        groups.entity.take(pa.array(group)),
        groups.bucket[group],
        {"n": np.bincount(ids, minlength=size)},
        STATE_COLUMNS["percentile"],
        b=view.selected(metric, f"b:{precision!r}")[first],
    )


def _topn_candidates(g: np.ndarray, latency: np.ndarray, size: int, n: int) -> np.ndarray:
    """Indices of a superset of each group's top ``n`` rows by latency (ties at the boundary included).

    One int64 sort on (group, latency) keys: latency is reduced to its IEEE bit pattern (monotonic for
    non-negative floats), shifted right to make room for the group id, so the keys are non-strictly
    monotonic in latency; every row at or above its group's n-th largest key is a candidate.
    """
    sizes = np.bincount(g, minlength=size)
    if len(g) == 0 or sizes.max() <= n:
        return np.arange(len(g))
    shift = max(1, int(size).bit_length())
    keys = (g.astype(np.int64) << (63 - shift)) | (np.abs(latency).view(np.int64) >> shift)
    ordered = np.sort(keys)
    ends = np.cumsum(sizes)
    threshold = np.full(size, np.iinfo(np.int64).min, dtype=np.int64)
    large = sizes > n
    threshold[large] = ordered[ends[large] - n]
    return np.flatnonzero(keys >= threshold[g])


def _run_starts(table: pa.Table) -> np.ndarray:
    """Row indices where a new (entity, bucket) run starts in a table sorted by those columns."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    entity = _string_codes(table.column("entity"))[0]
    bucket = table.column("bucket").to_numpy()
    change = np.ones(table.num_rows, dtype=bool)
    change[1:] = (entity[1:] != entity[:-1]) | (bucket[1:] != bucket[:-1])
    return np.flatnonzero(change)


def _run_positions(table: pa.Table) -> np.ndarray:
    """For a table sorted by (entity, bucket): each row's position within its (entity, bucket) run."""
    starts = _run_starts(table)
    run = np.zeros(table.num_rows, dtype=np.int64)
    run[starts[1:]] = 1
    return np.arange(table.num_rows) - starts[np.cumsum(run)]


def _keep_top(table: pa.Table, n: int) -> pa.Table:
    """Sort top-N rows by (entity, bucket, latency desc, key asc) and keep the first ``n`` per group."""
    if table.num_rows == 0:
        return table
    table = table.take(pc.sort_indices(table, sort_keys=_TOPN_ORDER))
    return table.filter(pa.array(_run_positions(table) < n))


def _aggregate_topn(view: _BatchView, topn: TopNDef) -> pa.Table:
    groups = view.groups(topn.scope, TOPN_BUCKET_MS)
    keys = view.arrow(topn.key)
    has_key = pc.fill_null(pc.not_equal(keys, ""), False).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(has_key & (groups.gid >= 0))
    g = groups.gid[rows]
    latency = view.numpy("latency_ms")[rows]
    pick = _topn_candidates(g, latency, groups.size, topn.n)
    rows, g = rows[pick], g[pick]
    table = pa.table(
        {
            "entity": groups.entity.take(pa.array(g, pa.int64())),
            "bucket": pa.array(groups.bucket[g], pa.int64()),
            "latency_ms": pa.array(latency[pick], pa.float64()),
            "key": keys.take(pa.array(rows, pa.int64())),
        },
        schema=_TOPN_STATE_SCHEMA,
    )
    return _keep_top(table, topn.n)


def aggregate_batch(
    batch: pa.RecordBatch | pa.Table, definitions: Definitions, *, source: str | None = None
) -> list[Partial]:
    """One partial per definition (metrics first, then top-Ns, in definition order) for one event batch.

    Metric partials hold minute states, top-N partials 10-minute ones. A partial is returned for every
    definition even when the batch contributes nothing to it (an empty table), so that ``source`` (the
    identity of this batch, which stores record to make ingestion idempotent) reaches every definition.
    """
    requests = request_rows(batch)
    every = _BatchView(batch)
    # exit rows (a CLIENT span's statement) feed only the top-Ns keyed on db_statement
    view = every if requests == batch.num_rows else _BatchView(batch.slice(0, requests))
    sources = () if source is None else (source,)
    partials: list[Partial] = []
    for metric in definitions.metrics:
        partials.append(partial_type(metric)(_aggregate_metric(view, metric), "minute", sources))  # type: ignore[call-arg]
    for topn in definitions.topns:
        partials.append(
            partial_type(topn)(_aggregate_topn(every if topn.key == "db_statement" else view, topn), sources)
        )
    return partials


# --------------------------------------------------------------------------------------------- merge


def _merge_states(table: pa.Table, metric: MetricDef, key_columns: Sequence[str]) -> pa.Table:
    """Combine rows with equal keys by each state column's merge operation (row order is not kept)."""
    ids, size = _table_groups(table, key_columns)
    first = pa.array(_first_rows(ids, size))
    columns: dict[str, Any] = {k: table.column(k).take(first) for k in key_columns}
    for c in STATE_COLUMNS[metric.function]:
        columns[c.name] = pa.array(_reduce(ids, size, table.column(c.name).to_numpy(), c), c.type)
    return pa.table(columns)


def fold_entities(partial: P, fold: np.ndarray, into: str) -> P:
    """``partial`` with the entity of every row where ``fold`` is true renamed to ``into``, and rows that now share
    a key merged (the cardinality guard's overflow)."""
    table = partial.table
    index = table.schema.get_field_index("entity")
    entity = pc.if_else(pa.array(fold), pa.scalar(into), table.column("entity"))
    return normalize(partial._with(table.set_column(index, table.schema.field(index), entity), partial.sources))


def merge(partials: Iterable[P]) -> P:
    """Merge partials of one exact type (and granularity) into one partial with unique keys.

    Associative and commutative (exactly so for integer states and min/max; float sums up to the last
    ulp); ``sources`` are united. Row order is unspecified except for top-N (sorted, best first). One partial
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
    return normalize(first._with(table, frozenset().union(*(p.sources for p in parts))))


def normalize(partial: P) -> P:
    """``partial`` with the rows of equal keys combined (a top-N's sorted and cut to n per key): the form every
    partial has. For tables that were built from rows that may repeat a key (re-bucketed, renamed, gathered)."""
    table = partial.table.combine_chunks()
    definition = partial.definition
    if isinstance(definition, MetricDef):
        table = _merge_states(table, definition, partial.key_columns)
    else:
        table = _keep_top(table.cast(_TOPN_STATE_SCHEMA), definition.n)
    return partial._with(table, partial.sources)


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
    return normalize(type(partial)(table, granularity, partial.sources))


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

PIECE_MARK = " ~"  # reserved in source identities: "<source> ~<i>/<k>" is piece i of k of <source>
_PIECE_RE = re.compile(r" ~(\d+)/(\d+)\Z")


def piece_of(source: str) -> tuple[str, int, int] | None:
    """``(parent, i, k)`` if ``source`` names piece i of k of ``parent``, else None."""
    match = _PIECE_RE.search(source)
    if match is None:
        return None
    return source[: match.start()], int(match.group(1)), int(match.group(2))


def source_root(source: str) -> str:
    """The input-batch identity a (possibly nested) piece belongs to."""
    while (piece := piece_of(source)) is not None:
        source = piece[0]
    return source


def split_partial(partial: P, max_rows: int) -> list[P]:
    """Cut a partial into pieces of at most ``max_rows`` state rows that merge back to it.

    Each piece carries distinct sources: source ``s`` of piece i (1-based) of k becomes ``"s ~i/k"``, and
    stores count ``s`` as applied once all of its pieces are. The cut is deterministic, so re-aggregating the
    same batch yields the same pieces. This is the only correct way to cut a partial: two pieces carrying
    the same sources would be taken for one piece delivered twice.
    """
    if max_rows < 1:
        raise ValueError("max_rows must be >= 1")
    table = partial.table
    count = -(-table.num_rows // max_rows)
    if count <= 1:
        return [partial]
    return [
        partial._with(table.slice(i * max_rows, max_rows), (f"{s}{PIECE_MARK}{i + 1}/{count}" for s in partial.sources))
        for i in range(count)
    ]


# --------------------------------------------------------------------------------------------- finalize


def _apdex_values(ok: np.ndarray, tol: np.ndarray, n: np.ndarray) -> np.ndarray:
    """(ok + tol / 2) / n rounded half-up to 4 decimals, computed exactly in integers."""
    return ((2 * ok + tol) * 10_000 + n) // (2 * n) / 10_000.0


def _values(function: str, table: pa.Table, minutes: int) -> np.ndarray:
    def col(name: str) -> np.ndarray:
        return table.column(name).to_numpy()

    if function == "count":
        return col("n").astype(np.float64)
    if function == "cpm":
        return col("n") / float(minutes)
    if function in ("sum", "min", "max"):
        return col("v").astype(np.float64)
    if function == "avg":
        return col("v") / col("n")
    if function == "sla":
        return (100 * col("ok")) / col("n")
    if function == "apdex":
        return _apdex_values(col("ok"), col("tol"), col("n"))
    raise ValueError(f"no single-value finalizer for {function!r}")


def _percentiles(table: pa.Table, precision: float) -> tuple[np.ndarray, np.ndarray]:
    """Per (entity, bucket): a representative row and the values of :data:`PERCENTILES` (shape (groups, 5)).

    Rows are ordered by (group, b); the r-th smallest event (r = ceil(p * count / 100), in integers) is in
    the first row whose running count within the group reaches r.
    """
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64), np.zeros((0, len(PERCENTILES)))
    ids, size = _table_groups(table, ("entity", "bucket"))
    b = table.column("b").to_numpy()
    bin_codes, bin_count = _compact(b)
    order = np.argsort(ids * bin_count + bin_codes)
    ids, b, counts = ids[order], b[order], table.column("n").to_numpy()[order]
    change = np.ones(len(ids), dtype=bool)
    change[1:] = ids[1:] != ids[:-1]
    starts = np.flatnonzero(change)
    cumulative = np.cumsum(counts)
    before = np.concatenate(([0], cumulative))[starts]
    ends = np.concatenate((starts[1:], [len(ids)]))
    totals = cumulative[ends - 1] - before
    ranks = (np.array(PERCENTILES, dtype=np.int64)[None, :] * totals[:, None] + 99) // 100
    rows = np.searchsorted(cumulative, before[:, None] + ranks, side="left")
    return order[starts], b[rows].astype(np.float64) * float(precision)


def _bucket_column(ms: np.ndarray, stored: bool) -> pa.Array:
    return pa.array(np.asarray(ms, dtype=np.int64), BUCKET_TIME) if stored else iso_from_ms(ms)


def _metric_value_table(partial: MetricPartial, stored: bool) -> pa.Table:
    definition = partial.definition
    table = partial.table
    if definition.function == "percentile":
        assert definition.precision_ms is not None
        first, values = _percentiles(table, definition.precision_ms)
        index = np.repeat(first, len(PERCENTILES))
        entity = table.column("entity").take(pa.array(index))
        bucket = table.column("bucket").to_numpy()[index]
        labels = pa.array(np.tile(np.array(PERCENTILE_LABELS, dtype=object), len(first)), pa.string())
        value = values.reshape(-1)
    else:
        entity = table.column("entity")
        bucket = table.column("bucket").to_numpy()
        labels = pa.repeat(pa.scalar("", pa.string()), table.num_rows)
        value = _values(definition.function, table, GRANULARITY_MS[partial.granularity] // 60_000)
    rows = len(bucket)
    return pa.table(
        {
            "metric": pa.repeat(pa.scalar(definition.name, pa.string()), rows),
            "entity": entity,
            "granularity": pa.repeat(pa.scalar(partial.granularity, pa.string()), rows),
            "time_bucket": _bucket_column(bucket, stored),
            "label": labels,
            "value": pa.array(value, pa.float64()),
        }
    )


def _topn_value_table(partial: TopNPartial, stored: bool) -> pa.Table:
    table = _keep_top(partial.table, partial.definition.n)
    rows = table.num_rows
    return pa.table(
        {
            "name": pa.repeat(pa.scalar(partial.definition.name, pa.string()), rows),
            "entity": table.column("entity"),
            "time_bucket": _bucket_column(table.column("bucket").to_numpy(), stored),
            "rank": pa.array(_run_positions(table) + 1, pa.int32()),
            "key": table.column("key"),
            "latency_ms": table.column("latency_ms"),
        }
    )


def finalize_table(partial: Partial, *, stored: bool = False) -> pa.Table:
    """Value rows of a partial as a pyarrow table: columns :data:`VALUE_COLUMNS`, or for a top-N
    :data:`TOPN_COLUMNS` (ranked 1..n per entity and bucket). Row order is unspecified. ``time_bucket`` is ISO-8601
    text, or with ``stored`` a :data:`BUCKET_TIME` timestamp (the stores' column type).

    count and sum/min/max are the state; cpm = count / minutes in the bucket (1, 60, 1440); avg = sum /
    count; sla = 100 * successes / count; apdex = (satisfied + tolerating / 2) / count rounded half-up to 4
    decimals; percentile gives rows p50 p75 p90 p95 p99 with value precision * (bin of the r-th smallest
    event), r = ceil(p / 100 * count). Values are float64.
    """
    if isinstance(partial, MetricPartial):
        return _metric_value_table(partial, stored)
    if isinstance(partial, TopNPartial):
        return _topn_value_table(partial, stored)
    raise TypeError(f"not a partial: {partial!r}")


def finalize(partial: Partial) -> list[tuple[Any, ...]]:
    """:func:`finalize_table` as a sorted list of row tuples (for small outputs and tests)."""
    table = finalize_table(partial)
    return sorted(zip(*(table.column(c).to_pylist() for c in table.column_names)))


# --------------------------------------------------------------------------------------------- storage form


def to_state_table(partial: MetricPartial) -> pa.Table:
    """States in the fixed stored columns of :data:`STATE_TABLE_SCHEMA` (unused state columns are null)."""
    table = partial.table
    rows = table.num_rows
    columns: dict[str, Any] = {
        "entity": table.column("entity"),
        "time_bucket": _bucket_column(table.column("bucket").to_numpy(), stored=True),
        "b": table.column("b") if "b" in table.column_names else pa.array(np.full(rows, -1, dtype=np.int64)),
    }
    for field in STATE_TABLE_SCHEMA.names[3:]:
        columns[field] = (
            table.column(field) if field in table.column_names else pa.nulls(rows, STATE_TABLE_SCHEMA.field(field).type)
        )
    return pa.table(columns, schema=STATE_TABLE_SCHEMA)


def from_state_table(
    definition: MetricDef, granularity: str, table: pa.Table, sources: Iterable[str] = ()
) -> MetricPartial:
    """The partial of stored states (columns of :data:`STATE_TABLE_SCHEMA`); inverse of :func:`to_state_table`."""
    cls = partial_type(definition)
    columns: dict[str, Any] = {
        "entity": table.column("entity").cast(pa.string()),
        "bucket": pa.array(ms_from_bucket(table.column("time_bucket")), pa.int64()),
    }
    if "b" in cls.key_columns:
        columns["b"] = table.column("b").cast(pa.int64())
    for c in STATE_COLUMNS[definition.function]:
        columns[c.name] = table.column(c.name).cast(c.type)
    return cls(pa.table(columns), granularity, sources)  # type: ignore[call-arg,return-value]


def to_topn_table(partial: TopNPartial) -> pa.Table:
    """Top-N states as stored rows (:data:`TOPN_COLUMNS`): the ranked rows are the state."""
    return finalize_table(partial, stored=True)


def from_topn_table(definition: TopNDef, table: pa.Table, sources: Iterable[str] = ()) -> TopNPartial:
    """The top-N partial of stored rows (columns entity, time_bucket, key, latency_ms at least)."""
    state = pa.table(
        {
            "entity": table.column("entity").cast(pa.string()),
            "bucket": pa.array(ms_from_bucket(table.column("time_bucket")), pa.int64()),
            "latency_ms": table.column("latency_ms").cast(pa.float64()),
            "key": table.column("key").cast(pa.string()),
        }
    )
    return partial_type(definition)(_keep_top(state, definition.n), sources)  # type: ignore[return-value]
