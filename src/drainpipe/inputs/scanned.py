"""What the C scanners of request events give (``_columns.h``), as Arrow: per event field, ``(null count, validity
bitmap or None, value buffers...)`` in the event schema's order, then the optional trace id; :func:`raw_batch` makes
them a batch of :data:`SCANNED_SCHEMA`, the fields as read, before validation (:func:`~.validation.validate_columns`).

:data:`RAW_SCHEMA` is the same with plain strings: what the other paths (pyarrow's readers) give."""

from __future__ import annotations

import pyarrow as pa

from .schema import EVENT_SCHEMA, TRACE_ID

__all__ = ["RAW_SCHEMA", "SCANNED_SCHEMA", "ENCODED", "raw_batch"]

#: the seven fields and the optional trace id (as text: validation decodes it), all nullable (nulls are checked)
RAW_SCHEMA = pa.schema([*(pa.field(f.name, f.type) for f in EVENT_SCHEMA), pa.field(TRACE_ID, pa.string())])
#: the fields the scanners give dictionary-encoded (what aggregation groups by)
ENCODED = frozenset({"service", "instance", "endpoint"})
_DICTIONARY = pa.dictionary(pa.int32(), pa.string())
#: :data:`RAW_SCHEMA` as the C scanners give it: :data:`ENCODED` dictionary-encoded
SCANNED_SCHEMA = pa.schema([f.with_type(_DICTIONARY) if f.name in ENCODED else f for f in RAW_SCHEMA])


def raw_batch(rows: int, columns: tuple) -> pa.RecordBatch:
    """The ``rows`` rows of a scanner's columns as a batch of :data:`SCANNED_SCHEMA` (zero-copy over their
    buffers)."""
    arrays = []
    for f, (nulls, validity, *buffers) in zip(SCANNED_SCHEMA, columns, strict=True):
        valid = None if validity is None else pa.py_buffer(validity)
        if f.name in ENCODED:
            indices, offsets, data = buffers
            values = pa.StringArray.from_buffers(len(offsets) // 4 - 1, pa.py_buffer(offsets), pa.py_buffer(data))
            arrays.append(pa.DictionaryArray.from_buffers(f.type, rows, [valid, pa.py_buffer(indices)], values,
                                                          null_count=nulls))  # fmt: skip
        else:
            arrays.append(pa.Array.from_buffers(f.type, rows, [valid, *map(pa.py_buffer, buffers)], null_count=nulls))
    return pa.RecordBatch.from_arrays(arrays, schema=SCANNED_SCHEMA)
