"""The metric functions and the top-N as mergeable states: aggregate, merge, roll up, finalize, encode.

Contract (``/work/shared/design/PIPELINE.md``, "Functions", "Entities and time buckets"):

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
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Iterable, Mapping, Sequence, TypeVar, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .definitions import FUNCTIONS, Definition, Definitions, MetricDef, TopNDef

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
    "rollup",
    "MetricAccumulator",
    "finalize",
    "finalize_table",
    "to_state_table",
    "from_state_table",
    "to_topn_table",
    "from_topn_table",
    "iso_from_ms",
    "ms_from_iso",
]

GRANULARITY_MS: Mapping[str, int] = MappingProxyType({"minute": 60_000, "hour": 3_600_000, "day": 86_400_000})
GRANULARITIES: tuple[str, ...] = tuple(GRANULARITY_MS)
TOPN_BUCKET_MS = 600_000
PERCENTILES: tuple[int, ...] = (50, 75, 90, 95, 99)
PERCENTILE_LABELS: tuple[str, ...] = tuple(f"p{p}" for p in PERCENTILES)
VALUE_COLUMNS: tuple[str, ...] = ("metric", "entity", "granularity", "time_bucket", "label", "value")
TOPN_COLUMNS: tuple[str, ...] = ("name", "entity", "time_bucket", "rank", "key", "latency_ms")
_ISO_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


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
        ("time_bucket", pa.string()),
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

    ``table`` has unique keys (:attr:`key_columns`); :func:`merge` output is also sorted by them.
    ``sources`` are the identities of the input batches whose events the states contain (may be empty).
    Treat partials as immutable values.
    """

    __slots__ = ("table", "sources")
    definition: ClassVar[Definition]
    key_columns: ClassVar[tuple[str, ...]]

    def __init__(self, table: pa.Table, sources: Iterable[str] = ()) -> None:
        self.table = table
        self.sources = frozenset(sources)

    @property
    def name(self) -> str:
        return self.definition.name

    def __len__(self) -> int:
        """Number of (entity, bucket) state keys."""
        if self.key_columns == ("entity", "bucket") or self.table.num_rows == 0:
            return self.table.num_rows
        return self.table.select(["entity", "bucket"]).group_by(["entity", "bucket"]).aggregate([]).num_rows

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

    def __len__(self) -> int:
        if self.table.num_rows == 0:
            return 0
        return self.table.select(["entity", "bucket"]).group_by(["entity", "bucket"]).aggregate([]).num_rows

    def _with(self: P, table: pa.Table, sources: Iterable[str]) -> P:
        return type(self)(table, sources)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (self.definition, self.table, self.sources))


def _restore(definition: Definition, table: pa.Table, sources: frozenset[str], *granularity: str) -> Partial:
    cls = partial_type(definition)
    return cls(table, *granularity, sources=sources)  # type: ignore[call-arg]


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
    attributes: dict[str, Any] = {"__slots__": (), "__module__": __name__, "__qualname__": name, "definition": definition}
    if isinstance(definition, MetricDef):
        base: type[Partial] = MetricPartial
        keys = ("entity", "bucket", "b") if definition.function == "percentile" else ("entity", "bucket")
        attributes["key_columns"] = keys
    elif isinstance(definition, TopNDef):
        base = TopNPartial
    else:
        raise TypeError(f"not a metric or topn definition: {definition!r}")
    return type(name, (base,), attributes)


# --------------------------------------------------------------------------------------------- batch view

_FIELDS = ("ts", "service", "instance", "endpoint", "latency_ms", "status")


def _dense_limit(rows: int) -> int:
    return max(1 << 16, 4 * rows)


def _factorize(keys: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Map non-negative int64 codes below ``size`` to dense ids: (id per element, code per id).

    Dense (a lookup table of ``size``) when that is small, else pyarrow hashing. Ids follow the code order
    in the dense case and first appearance otherwise; callers must not depend on either.
    """
    if size <= _dense_limit(len(keys)):
        seen = np.zeros(size, dtype=bool)
        seen[keys] = True
        uniques = np.flatnonzero(seen)
        lookup = np.empty(size, dtype=np.int64)
        lookup[uniques] = np.arange(len(uniques), dtype=np.int64)
        return lookup[keys], uniques
    encoded = pc.dictionary_encode(pa.array(keys, pa.int64()))
    return encoded.indices.to_numpy().astype(np.int64), encoded.dictionary.to_numpy()


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
        return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column

    def numpy(self, name: str) -> np.ndarray:
        """A numeric/bool column as numpy (float64 for numbers, bool for status)."""

        def compute() -> np.ndarray:
            column = self.arrow(name)
            if pa.types.is_boolean(column.type):
                return column.to_numpy(zero_copy_only=False).astype(bool)
            return column.to_numpy(zero_copy_only=False).astype(np.float64 if name != "ts" else np.int64)

        return self._cached(("numpy", name), compute)

    def encoded(self, name: str) -> tuple[np.ndarray, pa.Array]:
        """A string column dictionary-encoded: (code per row, distinct values); nulls count as ""."""

        def compute() -> tuple[np.ndarray, pa.Array]:
            column = self.arrow(name)
            if pa.types.is_dictionary(column.type):
                column = column.cast(column.type.value_type)
            if column.null_count:
                column = pc.fill_null(column, "")
            encoded = pc.dictionary_encode(column)
            return encoded.indices.to_numpy().astype(np.int64), encoded.dictionary

        return self._cached(("encoded", name), compute)

    def entities(self, scope: str) -> tuple[np.ndarray, pa.Array, np.ndarray | None]:
        """(entity code per row, entity names, counted-row mask or None) for a scope."""
        return self._cached(("entities", scope), lambda: self._entities(scope))

    def _entities(self, scope: str) -> tuple[np.ndarray, pa.Array, np.ndarray | None]:
        services, service_names = self.encoded("service")
        if scope == "service":
            return services, service_names, None
        subs, sub_names = self.encoded(scope)
        empty = pc.index(sub_names, "").as_py()
        counted = subs != empty if empty >= 0 else None
        width = max(len(sub_names), 1)
        pairs = services * width + subs
        ids, uniques = _factorize(pairs if counted is None else pairs[counted], max(len(service_names), 1) * width)
        codes = np.zeros(self.rows, dtype=np.int64)
        if counted is None:
            codes = ids
        else:
            codes[counted] = ids
        names = pc.binary_join_element_wise(
            service_names.take(pa.array(uniques // width)), sub_names.take(pa.array(uniques % width)), "/"
        )
        return codes, names, counted

    def groups(self, scope: str, width_ms: int) -> _Groups:
        return self._cached(("groups", scope, width_ms), lambda: self._groups(scope, width_ms))

    def _groups(self, scope: str, width_ms: int) -> _Groups:
        codes, names, counted = self.entities(scope)
        slots = self.numpy("ts") // width_ms
        if counted is not None:
            codes, slots = codes[counted], slots[counted]
        first = int(slots.min()) if len(slots) else 0
        span = int(slots.max()) - first + 1 if len(slots) else 1
        ids, uniques = _factorize(codes * span + (slots - first), max(len(names), 1) * span)
        if counted is None:
            gid = ids
        else:
            gid = np.full(self.rows, -1, dtype=np.int64)
            gid[counted] = ids
        entity = names.take(pa.array(uniques // span))
        bucket = (uniques % span + first) * width_ms
        return _Groups(gid, entity, bucket.astype(np.int64), counted)

    def selection(self, scope: str, where: str | None, filter_mask: Callable[[], np.ndarray] | None) -> np.ndarray | None:
        """Rows a metric counts: the scope's counted rows and its filter (None = every row)."""

        def compute() -> np.ndarray | None:
            counted = self.groups(scope, GRANULARITY_MS["minute"]).counted
            if filter_mask is None:
                return counted
            mask = filter_mask()
            return mask if counted is None else mask & counted

        return self._cached(("selection", scope, where), compute)

    def selected(self, metric: MetricDef, column: str) -> np.ndarray:
        """A per-row array restricted to the rows ``metric`` counts (``gid``, a numpy column or ``bins:P``)."""

        def compute() -> np.ndarray:
            rows = self.selection(metric.scope, metric.where, None if metric.filter is None else self._filter(metric))
            if column == "gid":
                values = self.groups(metric.scope, GRANULARITY_MS["minute"]).gid
            elif column.startswith("bins:"):
                values = self.bins(float(column[5:]))[0]
            else:
                values = self.numpy(column)
            return values if rows is None else values[rows]

        return self._cached(("selected", metric.scope, metric.where, column), compute)

    def _filter(self, metric: MetricDef) -> Callable[[], np.ndarray]:
        condition = metric.filter
        assert condition is not None
        return lambda: condition.mask(self.batch)

    def bins(self, precision: float) -> tuple[np.ndarray, np.ndarray]:
        """Histogram bins floor(latency / precision): (dense bin id per row, bin value per id)."""

        def compute() -> tuple[np.ndarray, np.ndarray]:
            raw = np.floor(self.numpy("latency_ms") / precision)
            raw = np.minimum(raw, 2.0**53).astype(np.int64)  # latencies beyond 2^53 bins share the last bin
            low = int(raw.min()) if len(raw) else 0
            span = int(raw.max()) - low + 1 if len(raw) else 1
            ids, uniques = _factorize(raw - low, span)
            return ids, uniques + low

        return self._cached(("bins", precision), compute)


# --------------------------------------------------------------------------------------------- aggregation

StateArrays = dict[str, np.ndarray]
_Aggregator = Callable[[_BatchView, MetricDef, np.ndarray, np.ndarray, int], StateArrays]


def _agg_count(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    return {"n": n}


def _agg_sum(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    assert metric.field is not None
    return {"v": np.bincount(g, weights=view.selected(metric, metric.field), minlength=size)}


def _agg_avg(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    return {**_agg_sum(view, metric, g, n, size), "n": n}


def _agg_extreme(ufunc: np.ufunc, start: float) -> _Aggregator:
    def aggregate(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
        assert metric.field is not None
        values = np.full(size, start)
        ufunc.at(values, g, view.selected(metric, metric.field))
        return {"v": values}

    return aggregate


def _agg_sla(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    return {"ok": np.bincount(g[view.selected(metric, "status")], minlength=size), "n": n}


def _agg_apdex(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    latency = view.selected(metric, "latency_ms")
    success = view.selected(metric, "status")
    t = metric.threshold_ms
    assert t is not None
    satisfied = success & (latency <= t)
    tolerating = success & (latency > t) & (latency <= 4 * t)
    return {
        "ok": np.bincount(g[satisfied], minlength=size),
        "tol": np.bincount(g[tolerating], minlength=size),
        "n": n,
    }


_AGGREGATORS: Mapping[str, _Aggregator] = MappingProxyType(
    {
        "count": _agg_count,
        "cpm": _agg_count,
        "sum": _agg_sum,
        "avg": _agg_avg,
        "min": _agg_extreme(np.minimum, np.inf),
        "max": _agg_extreme(np.maximum, -np.inf),
        "sla": _agg_sla,
        "apdex": _agg_apdex,
    }
)


def _state_table(entity: pa.Array, bucket: np.ndarray, states: StateArrays, layout: Sequence[StateColumn], **extra: np.ndarray) -> pa.Table:
    columns: dict[str, Any] = {"entity": entity, "bucket": pa.array(bucket, pa.int64())}
    columns.update({k: pa.array(v, pa.int64()) for k, v in extra.items()})
    columns.update({c.name: pa.array(states[c.name], c.type) for c in layout})
    return pa.table(columns)


def _aggregate_metric(view: _BatchView, metric: MetricDef) -> pa.Table:
    groups = view.groups(metric.scope, GRANULARITY_MS["minute"])
    g = view.selected(metric, "gid")
    layout = STATE_COLUMNS[metric.function]
    if metric.function == "percentile":
        return _aggregate_histogram(view, metric, groups, g)
    n = np.bincount(g, minlength=groups.size)
    states = _AGGREGATORS[metric.function](view, metric, g, n, groups.size)
    if n.all():
        return _state_table(groups.entity, groups.bucket, states, layout)
    present = np.flatnonzero(n)
    return _state_table(
        groups.entity.take(pa.array(present)), groups.bucket[present], {k: v[present] for k, v in states.items()}, layout
    )


def _aggregate_histogram(view: _BatchView, metric: MetricDef, groups: _Groups, g: np.ndarray) -> pa.Table:
    assert metric.precision_ms is not None
    bins = view.selected(metric, f"bins:{float(metric.precision_ms)!r}")
    bin_values = view.bins(float(metric.precision_ms))[1]
    width = max(len(bin_values), 1)
    ids, uniques = _factorize(g * width + bins, max(groups.size, 1) * width)
    counts = np.bincount(ids, minlength=len(uniques))
    group = uniques // width
    return _state_table(
        groups.entity.take(pa.array(group)),
        groups.bucket[group],
        {"n": counts},
        STATE_COLUMNS["percentile"],
        b=bin_values[uniques % width],
    )


def _topn_candidates(g: np.ndarray, latency: np.ndarray, size: int, n: int) -> np.ndarray:
    """Indices of a superset of each group's top ``n`` rows by latency (ties at the boundary included).

    One int64 sort on (group, latency) keys: latency is reduced to its IEEE bit pattern (monotonic for
    non-negative floats), shifted right to make room for the group id, so the keys are non-strictly
    monotonic in latency; every row at or above its group's n-th key is a candidate.
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


def _keep_top(table: pa.Table, n: int) -> pa.Table:
    """Sort top-N rows by (entity, bucket, latency desc, key asc) and keep the first ``n`` per group."""
    if table.num_rows == 0:
        return table
    table = table.take(pc.sort_indices(table, sort_keys=_TOPN_ORDER))
    return table.filter(pa.array(_run_positions(table) < n))


def _run_positions(table: pa.Table) -> np.ndarray:
    """For a table sorted by (entity, bucket): each row's position within its (entity, bucket) run."""
    starts = _run_starts(table)
    change = np.zeros(table.num_rows, dtype=np.int64)
    change[starts] = 1
    run = np.cumsum(change) - 1
    return np.arange(table.num_rows) - starts[run]


def _run_starts(table: pa.Table) -> np.ndarray:
    """Row indices where a new (entity, bucket) run starts in a table sorted by those columns."""
    rows = table.num_rows
    if rows == 0:
        return np.zeros(0, dtype=np.int64)
    entity = pc.dictionary_encode(table.column("entity")).combine_chunks().indices.to_numpy()
    bucket = table.column("bucket").to_numpy()
    change = np.ones(rows, dtype=bool)
    change[1:] = (entity[1:] != entity[:-1]) | (bucket[1:] != bucket[:-1])
    return np.flatnonzero(change)


def _aggregate_topn(view: _BatchView, topn: TopNDef) -> pa.Table:
    groups = view.groups(topn.scope, TOPN_BUCKET_MS)
    keys = view.arrow(topn.key)
    if pa.types.is_dictionary(keys.type):
        keys = keys.cast(keys.type.value_type)
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

    Metric partials are minute states; top-N partials are per 10-minute bucket. A partial is returned for
    every definition even when the batch contributes nothing to it (an empty table), so that ``source``
    (the identity of this batch, recorded by stores to make ingestion idempotent) reaches every definition.
    """
    view = _BatchView(batch)
    sources = () if source is None else (source,)
    partials: list[Partial] = []
    for metric in definitions.metrics:
        partials.append(partial_type(metric)(_aggregate_metric(view, metric), "minute", sources))  # type: ignore[call-arg]
    for topn in definitions.topns:
        partials.append(partial_type(topn)(_aggregate_topn(view, topn), sources))
    return partials


# --------------------------------------------------------------------------------------------- merge


def _merge_states(table: pa.Table, metric: MetricDef, key_columns: Sequence[str]) -> pa.Table:
    layout = STATE_COLUMNS[metric.function]
    keys = list(key_columns)
    merged = table.group_by(keys, use_threads=False).aggregate([(c.name, c.merge) for c in layout])
    merged = merged.select(keys + [f"{c.name}_{c.merge}" for c in layout]).rename_columns(keys + [c.name for c in layout])
    return merged.sort_by([(k, "ascending") for k in keys])


def merge(partials: Iterable[P]) -> P:
    """Merge partials of one exact type (and granularity) into one sorted partial with unique keys.

    Associative and commutative (exactly so for integer states and min/max; float sums up to the last
    ulp); ``sources`` are united. Raises ``ValueError`` for an empty input, mixed types or granularities.
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
    table = pa.concat_tables([p.table for p in parts]) if len(parts) > 1 else first.table
    sources = frozenset().union(*(p.sources for p in parts))
    definition = first.definition
    if isinstance(definition, MetricDef):
        table = _merge_states(table, definition, first.key_columns)
    else:
        table = _keep_top(table.cast(_TOPN_STATE_SCHEMA), definition.n)
    return first._with(table, sources)


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
    return merge([type(partial)(table, granularity, partial.sources)])  # type: ignore[call-arg]


class MetricAccumulator:
    """Merges the partials of one definition (and granularity) keyed by (entity, bucket).

    ``add`` buffers partials and merges them in amortised batches; ``drain`` returns everything added since
    the last drain as one merged partial (or None) and empties the accumulator; ``len`` is the number of
    distinct state keys held. Works for top-N partials too. Not thread-safe (a queue handler is never called
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
        self._compact()
        merged, self._merged = self._merged, None
        return merged

    def __len__(self) -> int:
        self._compact()
        return 0 if self._merged is None else len(self._merged)


# --------------------------------------------------------------------------------------------- finalize


def iso_from_ms(ms: np.ndarray | pa.Array) -> pa.Array:
    """Epoch milliseconds (whole seconds) -> ISO-8601 UTC strings ``YYYY-MM-DDTHH:MM:SSZ``."""
    seconds = np.asarray(ms, dtype=np.int64) // 1000
    return pc.strftime(pa.array(seconds, pa.timestamp("s")), format=_ISO_FORMAT)


def ms_from_iso(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """ISO-8601 UTC strings ``YYYY-MM-DDTHH:MM:SSZ`` -> epoch milliseconds."""
    parsed = pc.strptime(values, format=_ISO_FORMAT, unit="s")
    return parsed.cast(pa.int64()).to_numpy(zero_copy_only=False) * 1000


def _apdex_values(ok: np.ndarray, tol: np.ndarray, n: np.ndarray) -> np.ndarray:
    """(ok + tol / 2) / n rounded half-up to 4 decimals, computed exactly in integers."""
    scaled = ((2 * ok + tol) * 10_000 + n) // (2 * n)
    return scaled / 10_000.0


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


def _percentile_rows(table: pa.Table, precision: float) -> tuple[np.ndarray, np.ndarray]:
    """Row index of each (entity, bucket) run's first row, and its values, shape (runs, 5)."""
    starts = _run_starts(table)
    counts = table.column("n").to_numpy()
    bins = table.column("b").to_numpy()
    cumulative = np.cumsum(counts)
    before = np.concatenate(([0], cumulative))[starts]
    ends = np.concatenate((starts[1:], [table.num_rows]))
    totals = cumulative[ends - 1] - before
    ranks = (np.array(PERCENTILES)[None, :] * totals[:, None] + 99) // 100  # ceil(p / 100 * count), exactly
    rows = np.searchsorted(cumulative, before[:, None] + ranks, side="left")
    return starts, bins[rows].astype(np.float64) * float(precision)


def _metric_value_table(partial: MetricPartial) -> pa.Table:
    definition = partial.definition
    table = partial.table.sort_by([(k, "ascending") for k in partial.key_columns])
    if definition.function == "percentile":
        assert definition.precision_ms is not None
        starts, values = _percentile_rows(table, definition.precision_ms)
        repeat = len(PERCENTILES)
        index = pa.array(np.repeat(starts, repeat))
        entity = table.column("entity").take(index)
        bucket = table.column("bucket").to_numpy()[np.repeat(starts, repeat)]
        labels = pa.array(np.tile(np.array(PERCENTILE_LABELS, dtype=object), len(starts)), pa.string())
        value = values.reshape(-1)
    else:
        entity = table.column("entity")
        bucket = table.column("bucket").to_numpy()
        labels = pa.array([""] * table.num_rows, pa.string())
        value = _values(definition.function, table, GRANULARITY_MS[partial.granularity] // 60_000)
    rows = len(bucket)
    return pa.table(
        {
            "metric": pa.array([definition.name] * rows, pa.string()),
            "entity": entity,
            "granularity": pa.array([partial.granularity] * rows, pa.string()),
            "time_bucket": iso_from_ms(bucket),
            "label": labels,
            "value": pa.array(value, pa.float64()),
        }
    )


def _topn_value_table(partial: TopNPartial) -> pa.Table:
    table = _keep_top(partial.table, partial.definition.n)
    rows = table.num_rows
    return pa.table(
        {
            "name": pa.array([partial.definition.name] * rows, pa.string()),
            "entity": table.column("entity"),
            "time_bucket": iso_from_ms(table.column("bucket").to_numpy()),
            "rank": pa.array(_run_positions(table) + 1, pa.int32()),
            "key": table.column("key"),
            "latency_ms": table.column("latency_ms"),
        }
    )


def finalize_table(partial: Partial) -> pa.Table:
    """Value rows of a partial as a pyarrow table (columns :data:`VALUE_COLUMNS`, or :data:`TOPN_COLUMNS`
    for a top-N), ordered by entity, time bucket and label (rank).

    cpm divides by the minutes in the bucket (1, 60, 1440); avg is sum / count; sla is
    100 * successes / count; apdex is (satisfied + tolerating / 2) / count rounded half-up to 4 decimals;
    percentile gives rows p50 p75 p90 p95 p99 with value precision * (bin of the r-th smallest event),
    r = ceil(p / 100 * count); count and min/max/sum are the state itself.
    """
    if isinstance(partial, MetricPartial):
        return _metric_value_table(partial)
    if isinstance(partial, TopNPartial):
        return _topn_value_table(partial)
    raise TypeError(f"not a partial: {partial!r}")


def finalize(partial: Partial) -> list[tuple[Any, ...]]:
    """:func:`finalize_table` as a list of row tuples."""
    table = finalize_table(partial)
    return list(zip(*(table.column(c).to_pylist() for c in table.column_names)))


# --------------------------------------------------------------------------------------------- storage form


def to_state_table(partial: MetricPartial) -> pa.Table:
    """States in the fixed stored columns of :data:`STATE_TABLE_SCHEMA` (unused state columns are null)."""
    table = partial.table
    rows = table.num_rows
    columns: dict[str, Any] = {
        "entity": table.column("entity"),
        "time_bucket": iso_from_ms(table.column("bucket").to_numpy()),
        "b": table.column("b") if "b" in table.column_names else pa.array(np.full(rows, -1, dtype=np.int64)),
    }
    for field in STATE_TABLE_SCHEMA.names[3:]:
        columns[field] = table.column(field) if field in table.column_names else pa.nulls(rows, STATE_TABLE_SCHEMA.field(field).type)
    return pa.table(columns, schema=STATE_TABLE_SCHEMA)


def from_state_table(
    definition: MetricDef, granularity: str, table: pa.Table, sources: Iterable[str] = ()
) -> MetricPartial:
    """The partial of stored states (columns of :data:`STATE_TABLE_SCHEMA`); inverse of :func:`to_state_table`."""
    cls = partial_type(definition)
    columns: dict[str, Any] = {
        "entity": table.column("entity").cast(pa.string()),
        "bucket": pa.array(ms_from_iso(table.column("time_bucket")), pa.int64()),
    }
    if "b" in cls.key_columns:
        columns["b"] = table.column("b").cast(pa.int64())
    for c in STATE_COLUMNS[definition.function]:
        columns[c.name] = table.column(c.name).cast(c.type)
    return cls(pa.table(columns), granularity, sources)  # type: ignore[call-arg]


def to_topn_table(partial: TopNPartial) -> pa.Table:
    """Top-N states as stored rows (:data:`TOPN_COLUMNS`): the ranked rows are the state."""
    return finalize_table(partial)


def from_topn_table(definition: TopNDef, table: pa.Table, sources: Iterable[str] = ()) -> TopNPartial:
    """The top-N partial of stored rows (columns entity, time_bucket, key, latency_ms at least)."""
    state = pa.table(
        {
            "entity": table.column("entity").cast(pa.string()),
            "bucket": pa.array(ms_from_iso(table.column("time_bucket")), pa.int64()),
            "latency_ms": table.column("latency_ms").cast(pa.float64()),
            "key": table.column("key").cast(pa.string()),
        }
    )
    return partial_type(definition)(_keep_top(state, definition.n), sources)  # type: ignore[return-value]


PartialLike = Union[MetricPartial, TopNPartial]
