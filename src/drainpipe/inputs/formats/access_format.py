"""Web-server access logs (``.log``): nginx's and Apache's, in the format given with ``--log-format`` (an nginx
``log_format`` or Apache ``LogFormat`` string, :mod:`drainpipe.inputs.log_formats`) or, by default, "combined" with
the request time appended. One line is one request of the service given with ``--service``: ts = the line's time,
endpoint = method + normalized path (:mod:`..endpoints`), status = HTTP status < 500, latency from the request time
in the format's unit, instance from ``$hostname`` / ``%v`` (else empty).

A block of lines is read in columns, as JSON Lines are: the C scanner (``drainpipe.native.logscan``) cuts
every line by the format's program and converts its fields in one pass; where it is not built (the pure-Python
code Spark executors import) or declines a block, pyarrow does the same with the format's regular expression
(RE2) and vectorized casts. Both leave the endpoint as the raw ``METHOD path`` text: it is normalized once per
distinct value, never per line. Times, request times and statuses are converted exactly as the per-line reference
(:func:`decode_line`) converts them, and every line the columns flag gets its dead-letter reason from that
reference, so the result never depends on the path (property tests hold the paths equal).
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ... import native
from ...errors import InputError, Rejected
from ..batches import EventBatch
from ..log_formats import (
    AUTO_TIME,
    INSTANCE,
    METHOD,
    MICROS,
    MILLIS,
    PATH,
    REQUEST,
    SECONDS,
    STATUS,
    TS_CLF,
    TS_ISO,
    TS_MSEC,
    TS_SEC,
    UPSTREAM,
    WHOLE_SECONDS,
    LogFormat,
)
from ..options import InputOptions
from ..schema import EVENT_SCHEMA
from ..validation import check_ts, rows_to_batch, validate_columns, validate_values
from .base import LineDecoder, LineFormat, split_lines

__all__ = ["AccessLog", "decode_access_block", "decode_line"]

NOT_A_LOG_LINE = "not an access log line"
_REQUEST = re.compile(r"(?P<method>[A-Za-z]+) (?P<path>[^ ?]*)")  # "$request": the method, the path before its query
_METHOD = re.compile(r"[A-Za-z]+")
_BARE_PATH = re.compile(r"[^ ?]*")  # a path up to its query (or a space: the endpoint's path has none)
_BLANK = " \t\r\n\f\v"
_UPSTREAM_SPLIT = re.compile(r", | : ")
_CLF = re.compile(r"([0-9]{2})/([A-Z][a-z]{2})/([0-9]{4}):([0-9]{2}):([0-9]{2}):([0-9]{2}) ([+-])([0-9]{2})([0-9]{2})")
_MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}


class AccessLog(LineFormat):
    """``.log`` files: one request of ``--service`` per line, in the format of ``--log-format``."""

    name = "access"
    suffixes = (".log",)
    cost_per_byte = 1.0

    def check(self, path: str, options: InputOptions) -> None:
        if not options.service:
            raise InputError(f"{path!r} is an access log: say which service it belongs to with --service NAME")

    def decoder(self, options: InputOptions) -> LineDecoder:
        return lambda data, count, first: decode_access_block(data, count, first, options)


# ------------------------------------------------------------------------------------------------ conversions
# One definition of each, used per line (the reference) and per distinct value (the columnar paths).


def clf_ms(text: str) -> int | None:
    """``10/Oct/2000:13:55:36 -0700`` -> epoch ms, or None."""
    m = _CLF.fullmatch(text)
    if m is None or m.group(2) not in _MONTHS:
        return None
    day, mon, year, hh, mm, ss = int(m[1]), _MONTHS[m[2]], int(m[3]), int(m[4]), int(m[5]), int(m[6])
    if not (1 <= day <= 31 and hh <= 23 and mm <= 59 and ss <= 60):
        return None
    offset = (int(m[8]) * 60 + int(m[9])) * 60 * (1 if m[7] == "+" else -1)
    try:
        seconds = calendar.timegm((year, mon, day, hh, mm, ss, 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    return (seconds - offset) * 1000


def _iso_ms(text: str) -> int | None:
    try:
        return check_ts(text)
    except Rejected:
        return None


def _sec_ms(text: str) -> int | None:
    """``1700000000.123`` (nginx's ``$msec``) -> epoch ms: whole milliseconds, the rest cut off."""
    whole, _, frac = text.partition(".")
    if len(whole) > 15:
        return None
    return int(whole) * 1000 + int((frac + "000")[:3])


def _msec_ms(text: str) -> int | None:
    return int(text) if len(text) <= 18 else None


_TIME = {TS_CLF: clf_ms, TS_ISO: _iso_ms, TS_SEC: _sec_ms, TS_MSEC: _msec_ms}


def _upstream_ms(text: str) -> float | None:
    """``0.010, 0.020 : 0.005`` -> the sum in ms (``-`` parts are not there); None when none is."""
    times = [float(t) for t in _UPSTREAM_SPLIT.split(text) if t != "-"]
    if not times:
        return None
    total = 0.0
    for t in times:
        total += t
    return total * 1000.0


def _latency_ms(role: str, text: str) -> float | None:
    if text == "-":
        return None
    if role == SECONDS or role == WHOLE_SECONDS:
        return float(text) * 1000.0
    if role == MICROS:
        return float(text) / 1000.0
    if role == MILLIS:
        return float(text)
    # AUTO_TIME: a decimal point says seconds, none microseconds
    return float(text) * 1000.0 if "." in text else float(text) / 1000.0


# ------------------------------------------------------------------------------------------------ per line


def decode_line(line: bytes, fmt: LogFormat, compiled: re.Pattern[str], options: InputOptions) -> tuple | str | None:
    """The reference: one raw line -> its canonical row tuple, or the reason it is rejected, or None for a blank
    line."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8"
    if not text.strip(_BLANK):
        return None
    m = compiled.match(text)
    if m is None:
        return NOT_A_LOG_LINE
    ts: Any = None
    raw = None
    latency = upstream = None
    status: Any = True
    instance = ""
    method = path = None
    for name, role in fmt.fields:
        value = m.group(name)
        if role in _TIME:
            ts = _TIME[role](value)
            if ts is None:
                return "bad timestamp: ts"
        elif role == REQUEST:
            r = _REQUEST.match(value)
            if r is None:
                return "bad value: request"
            raw = f"{r[1]} {r[2]}"
        elif role == METHOD:
            method = value
        elif role == PATH:
            path = value
        elif role == STATUS:
            status = int(value) < 500
        elif role == UPSTREAM:
            upstream = _upstream_ms(value)
        elif role == INSTANCE:
            instance = "" if value == "-" else value
        else:
            latency = _latency_ms(role, value)
    if raw is None:
        if method is None or path is None or not _METHOD.fullmatch(method):
            return "bad value: request"
        raw = f"{method} {_BARE_PATH.match(path)[0]}"  # type: ignore[index]
    if latency is None:
        latency = upstream
    try:
        return validate_values(ts, options.service, instance, options.endpoints.normalize(raw), latency, status, None)
    except Rejected as r:
        return r.reason


def _per_line(data: bytes | memoryview, first_line: int,
              options: InputOptions) -> tuple[EventBatch, list[tuple[int, bytes, str]]]:  # fmt: skip
    fmt = options.log_format
    compiled = re.compile(fmt.pattern)  # re keeps it compiled between blocks
    rows: list[tuple] = []
    bad: list[tuple[int, bytes, str]] = []
    for i, line in enumerate(split_lines(bytes(data)), first_line + 1):
        out = decode_line(line, fmt, compiled, options)
        if isinstance(out, tuple):
            rows.append(out)
        elif out is not None:
            bad.append((i, line, out))
    return EventBatch.of(rows_to_batch(rows)), bad


# ------------------------------------------------------------------------------------------------ columns


@dataclass
class _Columns:
    """A block's lines read into columns, before normalization and range checks. ``good``: the lines that gave
    a row (matched, time and request read, a latency present); ``blank``: blank lines (skipped, no reject)."""

    good: np.ndarray
    blank: np.ndarray
    ts: np.ndarray  # int64 epoch ms
    endpoint: pa.Array  # raw "METHOD path"
    latency: np.ndarray  # float64 ms
    status: np.ndarray  # bool
    instance: pa.Array | None
    normalized: bool = False  # the endpoints are templates already


def decode_access_block(
    data: bytes | memoryview, count: int, first_line: int, options: InputOptions
) -> tuple[EventBatch, list[tuple[int, bytes, str]]]:
    """A block of ``count`` whole lines (the first is line ``first_line + 1``) -> the canonical batch of their
    requests and ``(line, raw, reason)`` per rejected line. Blank lines are skipped. The ``columnar`` tier off
    (:mod:`drainpipe.native`), every block is read line by line."""
    if count == 0 or not native.enabled("columnar"):
        return _per_line(data, first_line, options)
    cols = _scanned(data, count, options)
    if cols is None:
        cols = _arrow_columns(data, count, options.log_format)
    if cols is None:
        return _per_line(data, first_line, options)
    out = _finish(cols, data, count, first_line, options)
    return out if out is not None else _per_line(data, first_line, options)


def _scanned(data: bytes | memoryview, count: int, options: InputOptions) -> _Columns | None:
    """The C scanner's columns, or None where it is not built or is off, or declines (non-ASCII bytes, a format it
    has no program for). Without user rules it writes the id segments as ``{id}`` itself."""
    fmt = options.log_format
    logscan = native.logscan
    if logscan is None or not fmt.program:
        return None
    ids = options.endpoints.ids and not options.endpoints.rules
    out = logscan.scan(data, count, fmt.program, fmt.quoted, ids)
    if out is None:
        return None
    good, blank = np.frombuffer(out[0], bool), np.frombuffer(out[1], bool)
    ts, latency = np.frombuffer(out[2], np.int64), np.frombuffer(out[3], np.float64)
    status = np.frombuffer(out[4], bool)
    endpoint = pa.StringArray.from_buffers(count, pa.py_buffer(out[5]), pa.py_buffer(out[6]))
    instance = None
    if out[7] is not None and out[8] is not None:
        instance = pa.StringArray.from_buffers(count, pa.py_buffer(out[7]), pa.py_buffer(out[8]))
    return _Columns(good, blank, ts, endpoint, latency, status, instance, normalized=not options.endpoints.rules)


def _arrow_columns(data: bytes | memoryview, count: int, fmt: LogFormat) -> _Columns | None:
    """The columns by pyarrow: the format's regular expression (RE2) over the block's lines, then vectorized casts;
    times, upstream lists and anything else parsed in Python once per distinct text. None for a block that is not
    UTF-8 (the reference rejects its lines one by one)."""
    buf = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(buf == 10)
    offsets = np.empty(count + 1, np.int32)  # a block is far below 2 GiB
    offsets[0] = 0
    offsets[1 : len(ends) + 1] = ends + 1
    if len(ends) < count:
        offsets[count] = len(data)
    lines = pa.StringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(data))
    try:
        lines.validate(full=True)
    except pa.ArrowInvalid:
        return None
    blank = pc.match_substring_regex(lines, r"^[ \t\r\n\f\v]*$").to_numpy(zero_copy_only=False)
    fields = pc.extract_regex(lines, fmt.pattern)
    matched = fields.is_valid()
    good = matched.to_numpy(zero_copy_only=False) & ~blank
    null = pa.scalar(None, pa.string())
    ts = np.zeros(count, np.int64)
    latency = np.full(count, np.nan)
    upstream = None
    status = np.ones(count, bool)
    endpoint = instance = method = path = None
    for name, role in fmt.fields:
        col = pc.if_else(matched, fields.field(name), null)  # a struct's null rows hold "" in its fields
        if role in _TIME:
            values, ok = _per_distinct(col, _TIME[role], np.int64, 0)
            ts = values
            good &= ok
        elif role == REQUEST:
            parts = pc.extract_regex(col, "^" + _REQUEST.pattern)
            good &= parts.is_valid().to_numpy(zero_copy_only=False)
            endpoint = pc.binary_join_element_wise(parts.field(0), parts.field(1), " ")
        elif role == METHOD:
            method = col
        elif role == PATH:
            path = col
        elif role == STATUS:
            status = pc.less(pc.cast(pc.fill_null(col, "0"), pa.int32()), 500).to_numpy(zero_copy_only=False)
        elif role == UPSTREAM:
            upstream, _ = _per_distinct(col, _upstream_ms, np.float64, np.nan)
        elif role == INSTANCE:
            instance = pc.if_else(pc.equal(col, "-"), "", col)
        else:
            latency = _arrow_latency(role, col)
    if endpoint is None:
        assert method is not None and path is not None
        good &= pc.fill_null(pc.match_substring_regex(method, "^[A-Za-z]+$"), False).to_numpy(zero_copy_only=False)
        bare = pc.extract_regex(path, "^(?P<p>" + _BARE_PATH.pattern + ")").field(0)
        endpoint = pc.binary_join_element_wise(method, bare, " ")
    if upstream is not None:
        latency = np.where(np.isnan(latency), upstream, latency)
    good &= ~np.isnan(latency)
    return _Columns(good, blank, ts, endpoint, latency, status, instance)


def _per_distinct(
    col: pa.Array, convert: Callable[[str], Any], dtype: Any, missing: Any
) -> tuple[np.ndarray, np.ndarray]:
    """``convert`` applied once per distinct text of ``col``: (values, converted) per row (``missing`` where the
    text is null or ``convert`` gave None)."""
    encoded = pc.dictionary_encode(col)
    assert isinstance(encoded, pa.DictionaryArray)
    out = [convert(t) for t in encoded.dictionary.to_pylist()]
    ok = np.array([v is not None for v in out] + [False], bool)
    values = np.array([missing if v is None else v for v in out] + [missing], dtype)
    idx = encoded.indices.fill_null(len(out)).to_numpy(zero_copy_only=False)
    return values[idx], ok[idx]


def _arrow_latency(role: str, col: pa.Array) -> np.ndarray:
    """Request times in ms, NaN where ``-`` (or not matched), converted as :func:`_latency_ms` does."""
    text = pc.if_else(pc.equal(col, "-"), pa.scalar(None, pa.string()), col)
    value = pc.cast(text, pa.float64())
    if role == SECONDS or role == WHOLE_SECONDS:
        ms = pc.multiply(value, 1000.0)
    elif role == MICROS:
        ms = pc.divide(value, 1000.0)
    elif role == MILLIS:
        ms = value
    else:
        assert role == AUTO_TIME
        ms = pc.if_else(pc.match_substring(text, "."), pc.multiply(value, 1000.0), pc.divide(value, 1000.0))
    return pc.fill_null(ms, np.nan).to_numpy(zero_copy_only=False)


def _repeat(value: str, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, pa.string()), n)


def _finish(
    cols: _Columns, data: bytes | memoryview, count: int, first_line: int, options: InputOptions
) -> tuple[EventBatch, list[tuple[int, bytes, str]]] | None:
    """Columns -> (canonical batch, rejects). Lines the columns flag (and rows the range checks flag) get their
    reasons from the reference; should the reference accept one of them (never expected), None: the caller reads
    the block line by line."""
    good = cols.good
    mask = pa.array(good)
    n = int(good.sum())
    endpoint = cols.endpoint.filter(mask)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(cols.ts[good]),
            _repeat(options.service, n),
            cols.instance.filter(mask) if cols.instance is not None else _repeat("", n),
            endpoint if cols.normalized else options.endpoints.normalize_column(endpoint),
            pa.array(cols.latency[good]),
            pa.array(cols.status[good]),
            pa.nulls(n, pa.string()),
        ],
        schema=EVENT_SCHEMA,
    )
    canonical, flagged, _ = validate_columns(batch)  # (no warnings: every field here is text the line gave)
    bad = ~good & ~cols.blank
    if flagged is not None:
        rows = np.flatnonzero(good)
        bad[rows[flagged[0]]] = True
        canonical = canonical.filter(pa.array(~flagged[0]))
    if not bad.any():
        return EventBatch.of(canonical), []
    starts = np.concatenate(([0], np.flatnonzero(np.frombuffer(data, np.uint8) == 10) + 1))
    compiled = re.compile(options.log_format.pattern)
    rejects = []
    for i in np.flatnonzero(bad).tolist():
        line = bytes(data[starts[i] : starts[i + 1] if i + 1 < len(starts) else len(data)])
        out = decode_line(line, options.log_format, compiled, options)
        if not isinstance(out, str):
            return None
        rejects.append((first_line + 1 + i, line, out))
    return EventBatch.of(canonical), rejects
