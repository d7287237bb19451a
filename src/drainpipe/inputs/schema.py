"""The canonical event batch: :data:`EVENT_SCHEMA` and the ranges its values must lie in.

The batch is a :class:`pyarrow.RecordBatch` with

================ ========= ==========================================================
``ts``           int64     epoch milliseconds, UTC, in [:data:`TS_MIN`, :data:`TS_MAX`]
``service``      string    non-null, non-empty
``instance``     string    non-null (``""`` when absent)
``endpoint``     string    non-null (``""`` when absent)
``latency_ms``   float64   in [0, :data:`LATENCY_MAX_MS`]
``status``       bool      non-null (``true`` when absent)
``db_statement`` string    nullable (an empty string counts as absent)
================ ========= ==========================================================

and after them, only in batches whose events carry them, the optional columns (:data:`OPTIONAL_FIELDS`, in this
order; :func:`batch_schema`):

================ ========= ==========================================================
``weight``       int64     in [1, :data:`WEIGHT_MAX`]: how many requests the event stands for (a sampled span's
                           adjusted count, :mod:`~drainpipe.inputs.sampling`); a batch without it weighs 1 per row
``trace_id``     binary    nullable: the 16-byte id of the trace the request belongs to (spans), for exemplars
================ ========= ==========================================================

A leaf module (pyarrow only): every reader, the validation rules, the engines and the stores speak this schema."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

__all__ = [
    "EVENT_SCHEMA",
    "OPTIONAL_FIELDS",
    "WEIGHT",
    "TRACE_ID",
    "batch_schema",
    "FIELDS",
    "TS_MIN",
    "TS_MAX",
    "LATENCY_MAX_MS",
    "WEIGHT_MAX",
]

EVENT_SCHEMA = pa.schema(
    [
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("service", pa.string(), nullable=False),
        pa.field("instance", pa.string(), nullable=False),
        pa.field("endpoint", pa.string(), nullable=False),
        pa.field("latency_ms", pa.float64(), nullable=False),
        pa.field("status", pa.bool_(), nullable=False),
        pa.field("db_statement", pa.string(), nullable=True),
    ]
)
FIELDS: tuple[str, ...] = tuple(EVENT_SCHEMA.names)
WEIGHT = "weight"
TRACE_ID = "trace_id"
#: the columns a batch may have after the seven, in this order
OPTIONAL_FIELDS: tuple[pa.Field, ...] = (
    pa.field(WEIGHT, pa.int64(), nullable=False),
    pa.field(TRACE_ID, pa.binary(), nullable=True),
)


def batch_schema(optional: Iterable[str] = ()) -> pa.Schema:
    """:data:`EVENT_SCHEMA` and the optional columns named (in :data:`OPTIONAL_FIELDS`' order)."""
    names = set(optional)
    unknown = names - {f.name for f in OPTIONAL_FIELDS}
    if unknown:
        raise ValueError(f"not an optional event column: {sorted(unknown)[0]!r}")
    return pa.schema([*EVENT_SCHEMA, *(f for f in OPTIONAL_FIELDS if f.name in names)])


#: Smallest / largest accepted ``ts``: 0001-01-01T00:00:00.000Z and 9999-12-31T23:59:59.999Z, so every
#: accepted timestamp converts to a Python ``datetime`` and an ISO-8601 bucket name.
TS_MIN = -62_135_596_800_000
TS_MAX = 253_402_300_799_999
#: Largest accepted ``latency_ms`` (1e12 ms, about 31.7 years): larger values are rejected as out of range, so
#: every sum, average and percentile bucket of accepted events is finite (two latencies of 1e308 would average
#: to infinity, which no JSON can carry).
LATENCY_MAX_MS = 1e12
#: Largest weight (2^32: a span sampled with a probability of one in four billion). A sampling threshold that means
#: more is counted as 1 and reported, so that no sum of weights can overflow an int64 count.
WEIGHT_MAX = 1 << 32
