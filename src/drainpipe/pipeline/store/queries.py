"""The store's read side: value rows and top-N rows, filtered and ordered, with ``time_bucket`` as ISO-8601 text.

The columns are timestamps (:mod:`.schema`); the API speaks ISO-8601 text (``2026-11-21T10:05:00Z``): rows are
converted on the way out, bounds (ISO-8601 text, datetime or epoch ms) on the way in.

Functions over a :class:`~.backend.Backend`, called inside the store's session; blocking; a bad granularity is
:class:`~drainpipe.errors.StoreError` before any query, database errors propagate.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ...errors import StoreError
from ..buckets import GRANULARITIES
from ..times import instant, iso_from_ms, ms_from_bucket
from ..values import TOPN_COLUMNS, VALUE_COLUMNS
from .backend import Backend

__all__ = ["like_prefix", "values", "topn"]


def values(
    backend: Backend,
    metric: str | None = None,
    entity: str | None = None,
    granularity: str | None = None,
    start: Any = None,
    end: Any = None,
    entity_prefix: str | None = None,
) -> list[tuple[str, str, str, str, str, float]]:
    """Value rows ``(metric, entity, granularity, time_bucket, label, value)`` ordered by those columns (see
    :meth:`~.protocol.Store.query`)."""
    if granularity is not None and granularity not in GRANULARITIES:
        raise StoreError(f"unknown granularity {granularity!r} (expected one of {', '.join(GRANULARITIES)})")
    where, params = _filters(
        [("metric = ?", metric), ("entity = ?", entity), ("granularity = ?", granularity),
         ("entity LIKE ? ESCAPE '\\'", None if entity_prefix is None else like_prefix(entity_prefix))],
        start, end,
    )  # fmt: skip
    sql = f"SELECT {', '.join(VALUE_COLUMNS)} FROM metric_values{where} ORDER BY {', '.join(VALUE_COLUMNS[:5])}"
    return _rows(backend.fetch_arrow(sql, params))


def topn(
    backend: Backend, name: str, entity: str | None = None, start: Any = None, end: Any = None,
    entity_prefix: str | None = None,
) -> list[tuple[str, str, str, int, str, float]]:  # fmt: skip
    """Top-N rows ``(name, entity, time_bucket, rank, key, latency_ms)`` ordered by those columns (see
    :meth:`~.protocol.Store.query_topn`)."""
    where, params = _filters(
        [("name = ?", name), ("entity = ?", entity),
         ("entity LIKE ? ESCAPE '\\'", None if entity_prefix is None else like_prefix(entity_prefix))],
        start, end,
    )  # fmt: skip
    sql = f"SELECT {', '.join(TOPN_COLUMNS)} FROM topn_values{where} ORDER BY name, entity, time_bucket, rank"
    return _rows(backend.fetch_arrow(sql, params))


def like_prefix(prefix: str) -> str:
    """A LIKE pattern (with ``ESCAPE '\\'``) matching the strings that start with ``prefix``."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    """Stored rows as tuples, with time_bucket as ISO-8601 text (the API's form, whatever the column type)."""
    if table.num_rows == 0:
        return []
    i = table.column_names.index("time_bucket")
    table = table.set_column(i, "time_bucket", iso_from_ms(ms_from_bucket(table.column(i))))
    return list(zip(*(column.to_pylist() for column in table.columns)))


def _filters(equal: list[tuple[str, Any]], start: Any, end: Any) -> tuple[str, list[Any]]:
    clauses = [(sql, value) for sql, value in equal if value is not None]
    if start is not None:
        clauses.append(("time_bucket >= ?", instant(start)))
    if end is not None:
        clauses.append(("time_bucket <= ?", instant(end)))
    if not clauses:
        return "", []
    return " WHERE " + " AND ".join(sql for sql, _ in clauses), [value for _, value in clauses]
