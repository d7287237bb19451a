"""Time conversions, in one place: bucket starts between epoch milliseconds, ISO-8601 text (the store API's form)
and the stores' timestamps, and user-given time bounds (text, dates, datetimes, epoch ms) parsed once.

A leaf module (it imports only :mod:`drainpipe.errors`)."""

from __future__ import annotations

import datetime as _dt
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import StoreError

__all__ = [
    "ISO_FORMAT",
    "BUCKET_TIME",
    "iso_from_ms",
    "ms_from_iso",
    "ms_from_bucket",
    "parse_time",
    "parse_time_ms",
    "instant",
]

ISO_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
#: how stores hold a bucket start: an instant (SQL ``TIMESTAMP WITH TIME ZONE``), here in UTC milliseconds
BUCKET_TIME = pa.timestamp("ms", tz="UTC")


def iso_from_ms(ms: np.ndarray | pa.Array) -> pa.Array:
    """Epoch milliseconds (whole seconds) -> ISO-8601 UTC strings ``YYYY-MM-DDTHH:MM:SSZ``."""
    encoded = pc.dictionary_encode(pa.array(np.asarray(ms, dtype=np.int64) // 1000, pa.int64()))
    text = pc.strftime(encoded.dictionary.cast(pa.timestamp("s")), format=ISO_FORMAT)
    return text.take(encoded.indices)  # formats each distinct bucket once


def ms_from_iso(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """ISO-8601 UTC strings ``YYYY-MM-DDTHH:MM:SSZ`` -> epoch milliseconds."""
    parsed = pc.strptime(values, format=ISO_FORMAT, unit="s")
    return parsed.cast(pa.int64()).to_numpy(zero_copy_only=False) * 1000


def ms_from_bucket(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Bucket starts as a store gives them back (timestamps of any unit and zone, or ISO text) -> epoch ms."""
    if pa.types.is_timestamp(values.type):
        return values.cast(BUCKET_TIME).cast(pa.int64()).to_numpy(zero_copy_only=False)
    return ms_from_iso(values)


def parse_time(value: Any) -> str:
    """A time bound (ISO-8601 text with optional offset, a date, a datetime or epoch ms) as bucket text."""
    if isinstance(value, bool):
        raise StoreError(f"bad time {value!r}: expected ISO-8601 (2026-11-21T10:05:00Z) or epoch milliseconds")
    if isinstance(value, int):
        return str(iso_from_ms(np.array([value - value % 1000]))[0])
    if isinstance(value, str):
        try:
            value = _dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise StoreError(f"bad time {value!r}: expected ISO-8601 like 2026-11-21T10:05:00Z") from None
    if isinstance(value, _dt.date) and not isinstance(value, _dt.datetime):
        value = _dt.datetime(value.year, value.month, value.day)
    if not isinstance(value, _dt.datetime):
        raise StoreError(f"bad time {value!r}: expected ISO-8601 (2026-11-21T10:05:00Z) or epoch milliseconds")
    if value.tzinfo is not None:
        value = value.astimezone(_dt.UTC).replace(tzinfo=None)
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time_ms(value: Any) -> int:
    """:func:`parse_time` as epoch milliseconds (of the whole second)."""
    return int(instant(value).timestamp()) * 1000


def instant(value: Any) -> _dt.datetime:
    """A time bound (as :func:`parse_time` takes it) as an aware UTC datetime, the parameter type that both
    databases compare with a TIMESTAMPTZ column."""
    return _dt.datetime.strptime(parse_time(value), ISO_FORMAT).replace(tzinfo=_dt.UTC)
