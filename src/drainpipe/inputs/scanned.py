"""What the C scanners of request events give (``_columns.h``), as Arrow: per event field, ``(null count, validity
bitmap or None, value buffers...)`` in the event schema's order, then the optional trace id; :func:`raw_batch` makes
them a batch of :data:`RAW_SCHEMA`, the fields as read, before validation (:func:`~.validation.validate_columns`)."""

from __future__ import annotations

import pyarrow as pa

from .schema import EVENT_SCHEMA, TRACE_ID

__all__ = ["RAW_SCHEMA", "raw_batch"]

#: the seven fields and the optional trace id (as text: validation decodes it), all nullable (nulls are checked)
RAW_SCHEMA = pa.schema([*(pa.field(f.name, f.type) for f in EVENT_SCHEMA), pa.field(TRACE_ID, pa.string())])


def raw_batch(rows: int, columns: tuple) -> pa.RecordBatch:
    """The ``rows`` rows of a scanner's columns as a batch of :data:`RAW_SCHEMA` (zero-copy over their buffers)."""
    arrays = [
        pa.Array.from_buffers(f.type, rows, [None if b is None else pa.py_buffer(b) for b in buffers], null_count=nulls)
        for f, (nulls, *buffers) in zip(RAW_SCHEMA, columns, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=RAW_SCHEMA)
