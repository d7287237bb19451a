"""The stores' encoding of states: metric states in the fixed columns of :data:`STATE_TABLE_SCHEMA`, top-N states
as their ranked rows; decoded back into partials, which stores merge with the one merge implementation."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from .definitions import MetricDef, TopNDef
from .partials import STATE_COLUMNS, MetricPartial, TopNPartial, keep_top, partial_type
from .times import BUCKET_TIME, ms_from_bucket
from .values import bucket_column, finalize_table

__all__ = ["STATE_TABLE_SCHEMA", "to_state_table", "from_state_table", "to_topn_table", "from_topn_table", "with_key"]

#: stored form of metric states (see :func:`to_state_table`); ``b`` is -1 except for percentile bins (which a
#: PostgreSQL store packs a key's to one row: :mod:`~drainpipe.pipeline.store.database_merge`)
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

# --------------------------------------------------------------------------------------------- storage form


def to_state_table(partial: MetricPartial) -> pa.Table:
    """States in the fixed stored columns of :data:`STATE_TABLE_SCHEMA` (unused state columns are null)."""
    table = partial.table
    rows = table.num_rows
    columns: dict[str, Any] = {
        "entity": table.column("entity"),
        "time_bucket": bucket_column(table.column("bucket").to_numpy(), stored=True),
        "b": table.column("b") if "b" in table.column_names else pa.array(np.full(rows, -1, dtype=np.int64)),
    }
    for field in STATE_TABLE_SCHEMA.names[3:]:
        columns[field] = (
            table.column(field) if field in table.column_names else pa.nulls(rows, STATE_TABLE_SCHEMA.field(field).type)
        )
    return pa.table(columns, schema=STATE_TABLE_SCHEMA)


def with_key(table: pa.Table, name: str, granularity: str) -> pa.Table:
    """Stored rows of one definition with their key's constant columns added: ``name`` and ``metric`` (the
    definition's name, as the top-N and metric tables call it) and ``granularity`` (those already there are kept)."""
    rows = table.num_rows
    for column, value in (("name", name), ("metric", name), ("granularity", granularity)):
        if column not in table.column_names:
            table = table.append_column(column, pa.repeat(pa.scalar(value, pa.string()), rows))
    return table


def from_state_table(definition: MetricDef, granularity: str, table: pa.Table) -> MetricPartial:
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
    return cls(pa.table(columns), granularity)  # type: ignore[call-arg,return-value]


def to_topn_table(partial: TopNPartial) -> pa.Table:
    """Top-N states as stored rows (:data:`TOPN_COLUMNS`): the ranked rows are the state."""
    return finalize_table(partial, stored=True)


def from_topn_table(definition: TopNDef, table: pa.Table) -> TopNPartial:
    """The top-N partial of stored rows (columns entity, time_bucket, key, latency_ms at least)."""
    state = pa.table(
        {
            "entity": table.column("entity").cast(pa.string()),
            "bucket": pa.array(ms_from_bucket(table.column("time_bucket")), pa.int64()),
            "latency_ms": table.column("latency_ms").cast(pa.float64()),
            "key": table.column("key").cast(pa.string()),
        }
    )
    return partial_type(definition)(keep_top(state, definition))  # type: ignore[return-value]
