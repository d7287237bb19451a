"""The optional trace id of an event: one rule for every input, as a scalar function (records given as Python values)
and a columnar one (Arrow columns: Parquet, the JSON and CSV fast paths, the span mapping's ids).

A trace id only serves exemplars; the metrics never need it, so an id that cannot be used never costs its event:
the id is dropped (null) and the event counted with the warning :data:`BAD_TRACE_ID`. Which ids are used:

================================= =====================================================================
32 hex digits, either case        its 16 bytes (the W3C trace-context trace id)
16 hex digits (8 bytes as bytes)  left-padded with zeros to 16 bytes: W3C trace context's rule for the
                                  64-bit ids that Zipkin/B3 and older tracers write
a UUID, 8-4-4-4-12 hex digits     its 32 digits
anything else, or all zeros       dropped (all zeros is W3C's invalid id)
================================= =====================================================================

The C pass of the span mapping (``_spanmap.c``, ``classify``) applies the same rule to span ids as bytes, to count
the spans whose id is dropped; the tests hold all three to it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["BAD_TRACE_ID", "trace_id_bytes", "trace_id_column"]

#: the warning reason of an event whose trace id was dropped
BAD_TRACE_ID = "bad trace_id"

_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_ZERO = bytes(16)
_UUID_DASHES = (8, 13, 18, 23)


def trace_id_bytes(value: Any) -> bytes | None:
    """A trace id as a JSON value or CSV cell -> its 16 bytes, or None when it cannot be used (the module's rule)."""
    if type(value) is not str:
        return None
    n = len(value)
    if n == 16:
        value = "0" * 16 + value
    elif n == 36 and all(value[i] == "-" for i in _UUID_DASHES):
        value = value[:8] + value[9:13] + value[14:18] + value[19:23] + value[24:]
    elif n != 32:
        return None
    if not _HEX_DIGITS.issuperset(value):  # (before fromhex, which skips whitespace)
        return None
    raw = bytes.fromhex(value)
    return None if raw == _ZERO else raw


_NIBBLE = np.full(256, 255, np.uint8)  # a byte's value as a hex digit, 255 for any other byte
for _digit, _value in zip(b"0123456789abcdefABCDEF", [*range(16), *range(10, 16)]):
    _NIBBLE[_digit] = _value
_ZERO_DIGIT = np.uint8(ord("0"))
#: where a UUID's 32 digits are, and its dashes
_UUID_DIGITS = np.array([i for i in range(36) if i not in _UUID_DASHES])
_UUID_DASH_AT = np.array(_UUID_DASHES)


def trace_id_column(arr: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    """A column of trace ids as read (text of hex digits, or bytes; any other type holds no usable id) -> each id's
    16 bytes (binary; null where there was none or it was dropped), and the rows whose id was dropped (None when
    none was). Vectorized: the rows are decoded as one numpy array; the common case (every id 32 digits) is one
    reshape of the column's bytes."""
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if pa.types.is_fixed_size_binary(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return _from_bytes(arr.cast(pa.binary()))
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return _from_hex(arr.cast(pa.string()))
    present = _present(arr)
    return pa.nulls(len(arr), pa.binary()), (present if present.any() else None)


def _present(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), bool)
    if arr.null_count == len(arr):
        return np.zeros(len(arr), bool)
    return np.unpackbits(np.frombuffer(arr.buffers()[0], np.uint8), bitorder="little")[
        arr.offset : arr.offset + len(arr)
    ].astype(bool)


def _layout(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A string or binary array's offsets (from its first row), bytes and validity, without copying."""
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], np.int32, n + 1, arr.offset * 4) if n else np.zeros(1, np.int32)
    data = arr.buffers()[2]
    return offsets, (np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)), _present(arr)


def _gather(data: np.ndarray, starts: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The bytes at ``starts[i] + at[j]``, one row per start."""
    return data[starts[:, None] + at[None, :]]


def _from_hex(text: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    n = len(text)
    offsets, data, present = _layout(text)
    lengths = np.diff(offsets)
    digits = np.full((n, 32), 255, np.uint8)  # a row whose length is none of the three stays non-hex: dropped
    whole = present & (lengths == 32)
    if whole.all() and n:  # the common case: every row 32 digits, back to back
        digits = _NIBBLE[data[offsets[0] : offsets[-1]]].reshape(n, 32)
    else:
        rows = np.flatnonzero(whole)
        digits[rows] = _NIBBLE[_gather(data, offsets[rows], np.arange(32))]
        rows = np.flatnonzero(present & (lengths == 16))
        if len(rows):
            digits[rows, :16] = 0
            digits[rows, 16:] = _NIBBLE[_gather(data, offsets[rows], np.arange(16))]
        rows = np.flatnonzero(present & (lengths == 36))
        if len(rows):
            dashed = (_gather(data, offsets[rows], _UUID_DASH_AT) == ord("-")).all(axis=1)
            rows = rows[dashed]
            digits[rows] = _NIBBLE[_gather(data, offsets[rows], _UUID_DIGITS)]
    hexed = (digits != 255).all(axis=1)
    nibbles = np.where(hexed[:, None], digits, 0)
    raw = (nibbles[:, 0::2] << 4) | nibbles[:, 1::2]
    return _column(raw, present, hexed & raw.any(axis=1))


def _from_bytes(arr: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    n = len(arr)
    offsets, data, present = _layout(arr)
    lengths = np.diff(offsets)
    raw = np.zeros((n, 16), np.uint8)
    whole = present & (lengths == 16)
    if whole.all() and n:
        raw = data[offsets[0] : offsets[-1]].reshape(n, 16)
    else:
        rows = np.flatnonzero(whole)
        raw[rows] = _gather(data, offsets[rows], np.arange(16))
        rows = np.flatnonzero(present & (lengths == 8))  # a 64-bit id, left-padded with zeros
        raw[rows, 8:] = _gather(data, offsets[rows], np.arange(8))
        whole |= present & (lengths == 8)
    return _column(raw, present, whole & raw.any(axis=1))


def _column(raw: np.ndarray, present: np.ndarray, good: np.ndarray) -> tuple[pa.Array, np.ndarray | None]:
    """16 bytes a row (a dropped or absent row's are behind its null bit) -> a binary array, and the dropped rows."""
    n = len(raw)
    dropped = present & ~good
    kept = int(good.sum())
    validity = None if kept == n else pa.py_buffer(np.packbits(good, bitorder="little").tobytes())
    offsets = np.arange(n + 1, dtype=np.int32) * 16
    ids = pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(raw.tobytes())],
                                null_count=n - kept)  # fmt: skip
    return ids, (dropped if dropped.any() else None)
