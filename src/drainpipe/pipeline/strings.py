"""String columns grouped and gathered without letting the GIL go: :func:`string_values` (a column's codes and
distinct values), :func:`take_strings` (values by row) and :func:`join_strings` (values of several columns by row,
joined).

Why: the stages after the intake (the aggregation, the L1 and L2 merges, the cardinality guard, serve's RED metrics)
each run on a thread of a process whose other threads want the GIL. pyarrow's ``dictionary_encode`` and ``take``
let it go, and winning it back cost more than their work: an event batch's aggregation took 8.9 ms of its thread's
CPU alone and 17.7 ms beside one busy thread. The C kernel (``native.groupstates``' ``encode`` and ``gather``,
``native/_strings.h``) keeps it. Where the kernel is not built or is off (a Spark executor), pyarrow gives the same
results. A null reads as the empty string in every one of them (the callers' rule).

Thread-safe: pure functions of their arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import native

__all__ = ["join_strings", "string_values", "take_strings"]

Column: TypeAlias = pa.Array | pa.ChunkedArray


def _chunks(column: Column) -> list[tuple[Any, Any, int, int, Any]] | None:
    """The kernel's view of a string column (its chunks' buffers), or None for another type."""
    if column.type != pa.string():
        return None
    out = []
    for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else (column,):
        validity, offsets, data = chunk.buffers()
        out.append((offsets, data, chunk.offset, len(chunk), validity if chunk.null_count else None))
    return out


def _strings(rows: int, offsets: bytearray, data: bytearray) -> pa.Array:
    return pa.Array.from_buffers(pa.string(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def string_values(column: Column) -> tuple[np.ndarray, pa.Array]:
    """``(codes, values)``: per row the int32 code of its value, and the distinct values (a string array, nulls read
    as ""), numbered in the order they first occur, as ``pc.dictionary_encode`` numbers them. A dictionary column's
    values are encoded again (its dictionary may repeat a value)."""
    if isinstance(column, pa.ChunkedArray) and pa.types.is_dictionary(column.type):
        column = column.combine_chunks()
    if isinstance(column, pa.DictionaryArray) and column.null_count:
        column = column.cast(column.type.value_type)
    if isinstance(column, pa.DictionaryArray):
        codes, values = string_values(column.dictionary)
        indices = column.indices.to_numpy(zero_copy_only=False)
        return codes[indices] if len(codes) else codes, values
    kernel, chunks = native.groupstates, _chunks(column)
    if kernel is None or chunks is None:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if column.null_count:
            column = pc.fill_null(column, "")
        encoded = pc.dictionary_encode(column)
        return encoded.indices.to_numpy().astype(np.int32, copy=False), encoded.dictionary
    out, first = kernel.encode(chunks)
    rows = np.frombuffer(first, np.int64)
    return np.frombuffer(out, np.int32), _strings(len(rows), *kernel.gather([(chunks, rows)], b""))


def take_strings(column: Column, rows: np.ndarray) -> pa.Array:
    """The values of ``column`` at ``rows`` (int64 row numbers), as one array; a null reads as ""."""
    return join_strings([column], [rows], "")


def join_strings(columns: Sequence[Column], rows: Sequence[np.ndarray], separator: str) -> pa.Array:
    """Per row i, the values of ``columns`` at ``rows[k][i]`` joined by ``separator`` (nulls read as "")."""
    kernel = native.groupstates
    chunks = [_chunks(c) for c in columns]
    if kernel is None or any(c is None for c in chunks):
        taken = [pc.fill_null(c.take(pa.array(r, pa.int64())), "") for c, r in zip(columns, rows)]
        out = taken[0] if len(taken) == 1 else pc.binary_join_element_wise(*taken, separator)
        return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out
    picks = [np.ascontiguousarray(r, np.int64) for r in rows]
    return _strings(len(picks[0]), *kernel.gather(list(zip(chunks, picks)), separator.encode()))
