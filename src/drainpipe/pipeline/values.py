"""States -> value rows (:func:`finalize`, :func:`finalize_table`): ``(metric, entity, granularity, time_bucket,
label, value)`` for a metric, ``(name, entity, time_bucket, rank, key, latency_ms)`` for a top-N."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from .buckets import GRANULARITY_MS, PERCENTILE_LABELS, PERCENTILES
from .grouping import compact_codes, table_groups
from .partials import MetricPartial, Partial, TopNPartial, keep_top, run_positions
from .times import BUCKET_TIME, iso_from_ms

__all__ = ["APDEX_INT64_N", "VALUE_COLUMNS", "TOPN_COLUMNS", "finalize", "finalize_table", "bucket_column"]

VALUE_COLUMNS: tuple[str, ...] = ("metric", "entity", "granularity", "time_bucket", "label", "value")
TOPN_COLUMNS: tuple[str, ...] = ("name", "entity", "time_bucket", "rank", "key", "latency_ms")


# --------------------------------------------------------------------------------------------- finalize


#: the largest count for which ``(2 * ok + tol) * 10_000 + n`` stays within int64 (sampled spans' weights, up to
#: 2**32 each, reach it from about 107,000 spans in one key)
APDEX_INT64_N = ((1 << 63) - 1) // 20_001


def _apdex_values(ok: np.ndarray, tol: np.ndarray, n: np.ndarray) -> np.ndarray:
    """(ok + tol / 2) / n rounded half-up to 4 decimals, computed exactly in integers (in Python's unbounded ones
    where a count is past :data:`APDEX_INT64_N`: numpy's int64 wrapped silently)."""
    if len(n) and int(n.max()) > APDEX_INT64_N:
        exact = [((2 * a + t) * 10_000 + m) // (2 * m) for a, t, m in zip(ok.tolist(), tol.tolist(), n.tolist())]
        return np.array(exact, dtype=np.float64) / 10_000.0
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
        ok = col("ok")
        if len(ok) and int(ok.max()) > ((1 << 63) - 1) // 100:  # 100 * ok past int64: exact in Python's integers
            return (100 * ok.astype(object)).astype(np.float64) / col("n")
        return (100 * ok) / col("n")
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
    ids, size = table_groups(table, ("entity", "bucket"))
    b = table.column("b").to_numpy()
    bin_codes, bin_count = compact_codes(b)
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


def bucket_column(ms: np.ndarray, stored: bool) -> pa.Array:
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
            "time_bucket": bucket_column(bucket, stored),
            "label": labels,
            "value": pa.array(value, pa.float64()),
        }
    )


def _topn_value_table(partial: TopNPartial, stored: bool) -> pa.Table:
    table = keep_top(partial.table, partial.definition)
    rows = table.num_rows
    return pa.table(
        {
            "name": pa.repeat(pa.scalar(partial.definition.name, pa.string()), rows),
            "entity": table.column("entity"),
            "time_bucket": bucket_column(table.column("bucket").to_numpy(), stored),
            "rank": pa.array(run_positions(table) + 1, pa.int32()),
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
