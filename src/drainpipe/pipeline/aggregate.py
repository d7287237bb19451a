"""Event batch -> one partial per definition (:func:`aggregate_batch`): columnar, numpy ``bincount`` over dense
group ids (:mod:`.grouping`); no per-event Python code. Exit rows (a CLIENT span's statement) feed only the top-Ns
keyed on ``db_statement``.

A batch with a ``weight`` column (sampled spans) counts each row as that many requests: in counts, sums, the
ok/tolerating counts of sla and apdex, and the histogram bins of percentiles (so the percentiles are weighted); min,
max and the top-Ns are of the rows themselves. Weighted counts are bincounts with float64 weights, exact for sums
of integers below 2^53.

Group ids and states take a pass over the rows each in the C kernel (``drainpipe.native.groupstates``); where it is
not built (a Spark executor unlike the build) or is off, the numpy path below gives the same bits, slower."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import native
from ..inputs import WEIGHT, EventBatch
from . import strings
from .buckets import GRANULARITY_MS
from .definitions import Definitions, MetricDef, TopNDef
from .grouping import arrow_column, compact_codes, first_rows, group_ids, numpy_column, reduce_groups, unpack_bits
from .partials import STATE_COLUMNS, TOPN_STATE_SCHEMA, Partial, StateColumn, keep_top, partial_type

__all__ = ["RequestColumns", "aggregate_batch", "request_columns"]

_FIELDS = ("ts", "service", "instance", "endpoint", "latency_ms", "status")

# --------------------------------------------------------------------------------------------- batch view


class RequestColumns(Protocol):
    """A batch's request rows as the aggregation read them, each column computed once: what an observer of
    :func:`aggregate_batch` reads instead of computing it again (``serve``'s RED metrics: the string columns'
    codes were half of their cost). Read on the aggregating thread, during the call."""

    rows: int

    def encoded(self, name: str) -> tuple[np.ndarray, pa.Array, int]:
        """A string column's code per row, its distinct values, and the code of "" (nulls count as "") or -1."""
        ...

    def numpy(self, name: str) -> np.ndarray:
        """A numeric or bool column: int64 for ``ts``, bool for ``status``, float64 otherwise."""
        ...


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
            column = numpy_column(self.arrow(name))
            if name == "status":
                return column.astype(bool, copy=False)
            return column.astype(np.int64 if name == "ts" else np.float64, copy=False)

        return self._cached(("numpy", name), compute)

    def encoded(self, name: str) -> tuple[np.ndarray, pa.Array, int]:
        """A string column dictionary-encoded: (code per row, distinct values, the code of "" or -1); nulls count as
        "" (:func:`.strings.string_values`, which keeps the GIL)."""

        def compute() -> tuple[np.ndarray, pa.Array, int]:
            codes, values = strings.string_values(self.batch.column(name))
            empty = np.flatnonzero(~_has_value(values))  # (the values are distinct and never null: one at most)
            return codes, values, int(empty[0]) if len(empty) else -1

        return self._cached(("encoded", name), compute)

    def groups(self, scope: str, width_ms: int) -> _Groups:
        return self._cached(("groups", scope, width_ms), lambda: self._groups(scope, width_ms))

    def _groups(self, scope: str, width_ms: int) -> _Groups:
        services, service_names, _ = self.encoded("service")
        codes, names, empty = [services], [service_names], -1
        if scope != "service":
            subs, sub_names, empty = self.encoded(scope)  # (rows without a value count for no group of the scope)
            codes.append(subs)
            names.append(sub_names)
        kernel = native.groupstates is not None
        gid, first = (self._kernel_ids if kernel else self._numpy_ids)(codes, names, empty, width_ms)
        entity = strings.join_strings(names, [c[first] for c in codes], "/")
        bucket = np.floor_divide(self.numpy("ts")[first], width_ms) * width_ms
        return _Groups(gid, entity, bucket, gid >= 0 if empty >= 0 else None)

    def _kernel_ids(
        self, codes: list[np.ndarray], names: list[pa.Array], empty: int, width_ms: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Dense ids of the rows' (codes..., time slot) keys (-1: a row whose sub code is ``empty``) in key order, and
        a row of each group: one pass of the C kernel."""
        kernel = native.groupstates
        assert kernel is not None
        subs = codes[1].astype(np.int32, copy=False) if len(codes) > 1 else None
        gid, first = kernel.groups(codes[0].astype(np.int32, copy=False), subs, empty, self.numpy("ts"), width_ms)
        return np.frombuffer(gid, np.int64), np.frombuffer(first, np.int64)

    def _numpy_ids(
        self, codes: list[np.ndarray], names: list[pa.Array], empty: int, width_ms: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_kernel_ids` in numpy (where the kernel is not built or is off): the same ids."""
        slots = self.numpy("ts") // width_ms
        rows = np.flatnonzero(codes[1] != empty) if len(codes) > 1 and empty >= 0 else None
        if rows is not None:
            codes, slots = [c[rows] for c in codes], slots[rows]
        ids, size = group_ids([*((c, max(len(n), 1)) for c, n in zip(codes, names)), compact_codes(slots)])
        first = first_rows(ids, size)
        if rows is None:
            return ids, first
        gid = np.full(self.rows, -1, dtype=np.int64)
        gid[rows] = ids
        return gid, rows[first]

    def filter_mask(self, metric: MetricDef) -> np.ndarray | None:
        """The rows passing the metric's ``where`` filter (None: no filter)."""
        where = metric.filter
        return None if where is None else self._cached(("filter", metric.where), lambda: where.mask(self.batch))

    def metric_gid(self, metric: MetricDef) -> np.ndarray:
        """Per row, its minute group id of the metric's scope, -1 where the metric does not count it (its filter
        folded in): what the C kernel takes."""

        def compute() -> np.ndarray:
            gid = self.groups(metric.scope, GRANULARITY_MS["minute"]).gid
            mask = self.filter_mask(metric)
            return gid if mask is None else (gid + 1) * mask - 1  # (np.where takes ~100 us and lets the GIL go)

        return self._cached(("metric gid", metric.scope, metric.where), compute)

    def selected(self, metric: MetricDef, column: str) -> np.ndarray:
        """A per-row array restricted to the rows ``metric`` counts.

        ``column``: ``gid`` (minute group id), an event column, ``bin:P`` / ``b:P`` (histogram bin code / bin
        of precision P).
        """

        def compute() -> np.ndarray:
            rows = self.selection(metric)
            if column == "gid":
                values = self.groups(metric.scope, GRANULARITY_MS["minute"]).gid
            elif column == WEIGHT:
                weights = self.weights()
                assert weights is not None  # (asked for only when the batch has weights)
                values = weights
            elif column.startswith(("bin:", "b:")):
                kind, precision = column.split(":")
                codes, _, b = self.bins(float(precision))
                values = codes if kind == "bin" else b
            else:
                values = self.numpy(column)
            return values if rows is None else values[rows]

        return self._cached(("selected", metric.scope, metric.where, column), compute)

    def counts(self, metric: MetricDef) -> np.ndarray:
        """Per minute group of the metric's scope: the number of requests the metric counts (weighted)."""
        size = self.groups(metric.scope, GRANULARITY_MS["minute"]).size
        return self._cached(
            ("counts", metric.scope, metric.where),
            lambda: _count(self.selected(metric, "gid"), self.row_weights(metric), size),
        )

    def weights(self) -> np.ndarray | None:
        """Each row's weight as float64 (null: 1), or None when the batch has none (every row weighs 1)."""

        def compute() -> np.ndarray | None:
            if WEIGHT not in self.batch.schema.names:
                return None
            column = self.arrow(WEIGHT)
            if column.null_count == len(column):
                return None
            return pc.fill_null(column, 1).to_numpy(zero_copy_only=False).astype(np.float64)

        return self._cached("weights", compute)

    def row_weights(self, metric: MetricDef) -> np.ndarray | None:
        """The weights of the rows ``metric`` counts, or None when every row weighs 1."""
        return None if self.weights() is None else self.selected(metric, WEIGHT)

    def selection(self, metric: MetricDef) -> np.ndarray | None:
        """Rows a metric counts: the scope's counted rows that pass its filter (None = every row)."""

        def compute() -> np.ndarray | None:
            counted = self.groups(metric.scope, GRANULARITY_MS["minute"]).counted
            mask = self.filter_mask(metric)
            if mask is None:
                return counted
            return mask if counted is None else mask & counted

        return self._cached(("selection", metric.scope, metric.where), compute)

    def bins(self, precision: float) -> tuple[np.ndarray, int, np.ndarray]:
        """Histogram bins b = floor(latency / precision): (bin code per row, code count, b per row)."""

        def compute() -> tuple[np.ndarray, int, np.ndarray]:
            b = np.floor(self.numpy("latency_ms") / precision)
            b = np.minimum(b, 2.0**53).astype(np.int64)  # latencies beyond 2^53 bins share the last bin
            codes, size = compact_codes(b)
            return codes, size, b

        return self._cached(("bins", precision), compute)


# --------------------------------------------------------------------------------------------- aggregation

StateArrays = dict[str, np.ndarray]
_Aggregator = Callable[[_BatchView, MetricDef, np.ndarray, np.ndarray, int], StateArrays]


def _count(ids: np.ndarray, weights: np.ndarray | None, size: int) -> np.ndarray:
    """Per id in [0, size): how many requests (rows, or the sum of their weights), as int64."""
    if weights is None:
        return np.bincount(ids, minlength=size)
    return np.bincount(ids, weights=weights, minlength=size).astype(np.int64)


def _categories(g: np.ndarray, category: np.ndarray, categories: int, size: int, w: np.ndarray | None) -> np.ndarray:
    """Per group, the number of requests of each category: shape (size, categories), one bincount."""
    return _count(g * categories + category, w, size * categories).reshape(size, categories)


def _agg_count(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    return {"n": n}


def _agg_sum(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    assert metric.field is not None
    values, w = view.selected(metric, metric.field), view.row_weights(metric)
    return {"v": np.bincount(g, weights=values if w is None else values * w, minlength=size)}


def _agg_avg(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    return {**_agg_sum(view, metric, g, n, size), "n": n}


def _agg_extreme(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    assert metric.field is not None
    (column,) = STATE_COLUMNS[metric.function]
    return {
        "v": reduce_groups(g, size, view.selected(metric, metric.field).astype(np.float64), column.merge, column.type)
    }


def _agg_sla(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    return {"ok": _categories(g, view.selected(metric, "status"), 2, size, view.row_weights(metric))[:, 1], "n": n}


def _agg_apdex(view: _BatchView, metric: MetricDef, g: np.ndarray, n: np.ndarray, size: int) -> StateArrays:
    latency = view.selected(metric, "latency_ms")
    t = metric.threshold_ms
    assert t is not None
    # 0 = frustrated (or failed), 1 = satisfied (latency <= t), 2 = tolerating (t < latency <= 4t)
    category = (latency <= t).astype(np.int64)
    category[(latency > t) & (latency <= 4 * t)] = 2
    category[~view.selected(metric, "status")] = 0
    counts = _categories(g, category, 3, size, view.row_weights(metric))
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
    columns: dict[str, Any] = {"entity": entity, "bucket": arrow_column(bucket, pa.int64())}
    columns.update({k: arrow_column(v, pa.int64()) for k, v in extra.items()})
    columns.update({c.name: arrow_column(states[c.name], c.type) for c in layout})
    return pa.table(columns)


#: per function the C kernel computes (the others take the numpy path), the name of its code in the kernel and the
#: names of the arrays it returns after ``n``
_KERNEL_FUNCTIONS: Mapping[str, tuple[str, tuple[str, ...]]] = MappingProxyType(
    {
        "count": ("COUNT", ()),
        "cpm": ("COUNT", ()),
        "sum": ("SUM", ("v",)),
        "avg": ("SUM", ("v",)),
        "min": ("MIN", ("v",)),
        "max": ("MAX", ("v",)),
        "sla": ("SLA", ("ok",)),
        "apdex": ("APDEX", ("ok", "tol")),
    }
)


def _kernel_states(view: _BatchView, metric: MetricDef, groups: _Groups) -> tuple[np.ndarray, StateArrays]:
    """``(n, states)`` of a metric (not a percentile) in one pass of the C kernel: the numpy aggregators' values."""
    kernel = native.groupstates
    assert kernel is not None
    code, names = _KERNEL_FUNCTIONS[metric.function]
    field = "latency_ms" if metric.function == "apdex" else metric.field
    values = None if field is None else view.numpy(field).astype(np.float64, copy=False)
    status = view.numpy("status") if metric.function in ("sla", "apdex") else None
    threshold = float(metric.threshold_ms) if metric.threshold_ms is not None else 0.0
    out = kernel.states(getattr(kernel, code), view.metric_gid(metric), groups.size, values, status, view.weights(),
                        threshold)  # fmt: skip
    n = np.frombuffer(out[0], np.int64)
    return n, {"n": n, **{name: np.frombuffer(a, np.float64 if name == "v" else np.int64)
                          for name, a in zip(names, out[1:])}}  # fmt: skip


def _aggregate_metric(view: _BatchView, metric: MetricDef) -> pa.Table:
    groups = view.groups(metric.scope, GRANULARITY_MS["minute"])
    layout = STATE_COLUMNS[metric.function]
    if groups.size == 0:  # no row counts for the scope (say, no event names an instance): no pass over the rows
        empty = np.zeros(0, np.int64)
        extra = {"b": empty} if metric.function == "percentile" else {}
        return _state_table(groups.entity, empty, {c.name: empty for c in layout}, layout, **extra)
    if native.groupstates is not None:
        if metric.function == "percentile":
            table = _kernel_histogram(view, metric, groups)
            if table is not None:
                return table
        elif metric.function in _KERNEL_FUNCTIONS:
            n, states = _kernel_states(view, metric, groups)
            return _present_states(groups, n, states, layout)
    g = view.selected(metric, "gid")
    if metric.function == "percentile":
        return _aggregate_histogram(view, metric, groups, g)
    n = view.counts(metric)
    states = _AGGREGATORS[metric.function](view, metric, g, n, groups.size)
    return _present_states(groups, n, states, layout)


def _present_states(groups: _Groups, n: np.ndarray, states: StateArrays, layout: Sequence[StateColumn]) -> pa.Table:
    """The state table of the groups with requests (``n``) among ``groups``."""
    if n.all():
        return _state_table(groups.entity, groups.bucket, states, layout)
    present = np.flatnonzero(n)
    return _state_table(
        strings.take_strings(groups.entity, present),
        groups.bucket[present],
        {k: v[present] for k, v in states.items()},
        layout,
    )


def _kernel_histogram(view: _BatchView, metric: MetricDef, groups: _Groups) -> pa.Table | None:
    """A percentile metric's state table by the C kernel, or None where the kernel declines (a NaN latency, bins
    spanning more than its dense table's limit)."""
    assert metric.precision_ms is not None
    kernel = native.groupstates
    assert kernel is not None
    out = kernel.histogram(view.metric_gid(metric), groups.size, view.numpy("latency_ms"), view.weights(),
                            float(metric.precision_ms))  # fmt: skip
    if out is None:
        return None
    group, b, n = (np.frombuffer(a, np.int64) for a in out)
    return _state_table(strings.take_strings(groups.entity, group), groups.bucket[group], {"n": n},
                        STATE_COLUMNS["percentile"], b=b)  # fmt: skip


def _aggregate_histogram(view: _BatchView, metric: MetricDef, groups: _Groups, g: np.ndarray) -> pa.Table:
    assert metric.precision_ms is not None
    precision = float(metric.precision_ms)
    bin_codes = view.selected(metric, f"bin:{precision!r}")
    ids, size = group_ids([(g, max(groups.size, 1)), (bin_codes, view.bins(precision)[1])])
    first = first_rows(ids, size)
    group = g[first]
    return _state_table(
        strings.take_strings(groups.entity, group),
        groups.bucket[group],
        {"n": _count(ids, view.row_weights(metric), size)},
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


def _aggregate_topn(view: _BatchView, topn: TopNDef) -> pa.Table:
    if topn.key not in view.batch.schema.names:  # an optional column (trace_id) this batch does not have
        return TOPN_STATE_SCHEMA.empty_table()
    keys = view.arrow(topn.key)
    if pa.types.is_null(keys.type) or keys.null_count == len(keys):  # no row has a key (or a table built so)
        return TOPN_STATE_SCHEMA.empty_table()
    groups = view.groups(topn.scope, topn.bucket_ms)
    rows = np.flatnonzero(_has_value(keys) & (groups.gid >= 0))
    g = groups.gid[rows]
    latency = view.numpy("latency_ms")[rows]
    if topn.latency_buckets_ms:  # n per latency bucket: candidates per (group, latency bucket)
        width = len(topn.latency_buckets_ms) + 1
        pick = _topn_candidates(g * width + topn.latency_classes(latency), latency, groups.size * width, topn.n)
    else:
        pick = _topn_candidates(g, latency, groups.size, topn.n)
    rows, g = rows[pick], g[pick]
    picked = strings.take_strings(keys, rows) if keys.type == pa.string() else keys.take(pa.array(rows, pa.int64()))
    table = pa.table(
        {
            "entity": strings.take_strings(groups.entity, g),
            "bucket": arrow_column(groups.bucket[g], pa.int64()),
            "latency_ms": arrow_column(latency[pick], pa.float64()),
            "key": _hex_strings(picked) if pa.types.is_binary(picked.type) else picked,
        },
        schema=TOPN_STATE_SCHEMA,
    )
    return keep_top(table, topn)


def _has_value(values: pa.Array) -> np.ndarray:
    """Per row: whether it holds a non-empty string or binary (from the buffers: pyarrow's compute lets the GIL
    go)."""
    if not (pa.types.is_string(values.type) or pa.types.is_binary(values.type)):
        present = pc.binary_length(values) if pa.types.is_binary(values.type) else pc.utf8_length(values)
        return pc.fill_null(pc.greater(present, 0), False).to_numpy(zero_copy_only=False)
    validity, offsets, _ = values.buffers()
    ends = np.frombuffer(offsets, np.int32, len(values) + 1, values.offset * 4)
    has = ends[1:] > ends[:-1]
    if values.null_count:
        has &= unpack_bits(validity, values.offset, len(values))
    return has


_HEX_DIGITS = np.frombuffer(b"".join(b"%02x" % i for i in range(256)), np.uint8).reshape(256, 2)


def _hex_strings(values: pa.Array) -> pa.Array:
    """Binary values (trace ids) as lowercase hex strings; nulls stay null. One numpy lookup when every value has
    the same length, as trace ids do."""
    lengths = pc.binary_length(values).to_numpy(zero_copy_only=False)
    if values.null_count or len(values) == 0 or (lengths != lengths[0]).any():
        return pa.array([None if v is None else v.hex() for v in values.to_pylist()], pa.string())
    width = int(lengths[0])
    start = values.offset
    offsets = np.frombuffer(values.buffers()[1], np.int32)[start : start + len(values) + 1]
    data = np.frombuffer(values.buffers()[2], np.uint8)[offsets[0] : offsets[-1]]
    text = _HEX_DIGITS[data].reshape(-1)  # two digits a byte
    out_offsets = np.arange(len(values) + 1, dtype=np.int32) * (2 * width)
    return pa.StringArray.from_buffers(len(values), pa.py_buffer(out_offsets), pa.py_buffer(text.tobytes()))


def request_columns(batch: EventBatch) -> RequestColumns:
    """The request rows of ``batch`` as :func:`aggregate_batch` reads them, for a reader outside an aggregation."""
    return _BatchView(batch.request_rows())


def aggregate_batch(
    batch: EventBatch | pa.RecordBatch | pa.Table,
    definitions: Definitions,
    observe: Callable[[RequestColumns], None] | None = None,
) -> list[Partial]:
    """One partial per definition (metrics first, then top-Ns, in definition order) for one event batch (a plain
    batch or table is requests only). ``observe``, if given, is called with the request rows' columns once the
    partials are made (its errors are the caller's).

    Metric partials hold minute states, top-N partials those of their bucket width (10 minutes by default). A
    partial is returned for every definition even when the batch contributes nothing to it (an empty table), so
    that callers may pair the result with ``definitions`` position by position.
    """
    if isinstance(batch, EventBatch):
        batch, requests = batch.rows, batch.requests
    else:
        requests = batch.num_rows
    every = _BatchView(batch)
    # exit rows (a CLIENT span's statement) feed only the top-Ns keyed on db_statement
    view = every if requests == batch.num_rows else _BatchView(batch.slice(0, requests))
    partials: list[Partial] = []
    for metric in definitions.metrics:
        partials.append(partial_type(metric)(_aggregate_metric(view, metric), "minute"))  # type: ignore[call-arg]
    for topn in definitions.topns:
        partials.append(partial_type(topn)(_aggregate_topn(every if topn.key == "db_statement" else view, topn)))
    if observe is not None:
        observe(view)
    return partials
