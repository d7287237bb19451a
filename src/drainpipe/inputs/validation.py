"""The validation rules, once, for every input: a scalar core for records given as Python values (JSON Lines, CSV,
HTTP JSON bodies, decoded spans and log lines) and a columnar core for Arrow batches (Parquet, the JSON fast
paths). Both apply the rules in the same field order, so a record gets the same reject reason whichever core saw
it (``tests/inputs/test_validation.py`` holds them equal).

The rules (``docs/pipeline.md``, "Input events"):

========================= ===================================================================
``ts``                    int epoch ms (not bool, not float) or ISO-8601 string (``2026-11-21``,
                          ``2026-11-21T10:00:00[.fff][Z|+hh:mm|+hhmm|+hh]``; no offset = UTC;
                          sub-millisecond digits are truncated); must lie in years 0001..9999
``service``               non-empty string
``instance``/``endpoint`` string; null/absent -> ``""``; anything else is dropped (``""``) with a warning
``latency_ms``            number (int or float, not bool, not a string), 0 <= latency_ms <= 1e12
                          (:data:`~.schema.LATENCY_MAX_MS`)
``status``                ``true``/``false``, ``0``/``1`` or the strings ``"true"``/``"false"``;
                          null/absent -> ``true``; anything else is rejected
``db_statement``          string or null; ``""`` -> null; anything else is dropped (null) with a warning
``trace_id`` (optional)   null, or an id :mod:`.trace_ids` can use, kept as its 16 bytes; anything else is
                          dropped (null) with a warning; a batch has the column only when an accepted record
                          has one
========================= ===================================================================

An odd *optional* field never costs its event: the field is dropped (its default) and the event is accepted with a
warning (``bad instance``, ``bad endpoint``, ``bad db_statement``, ``bad trace_id``), counted where the read counts
its records (:attr:`~.rejects.ReadStats.warnings`), as a sampled span's unusable threshold is. The required fields
(``ts``, ``service``, ``latency_ms``) and ``status`` (a dropped status would count a failure as a success) reject.

Scalar: :func:`validate_values` returns the canonical row tuple or raises :class:`~drainpipe.errors.Rejected`
(a control-flow exception the readers catch: its ``reason`` goes to the dead letter), and adds an accepted row's
warnings to the caller's counter. Columnar: :func:`validate_columns` returns the canonical batch, the rejected rows
with their reasons, and the accepted rows with warnings; string-typed ``ts``/``status`` columns are mapped through
the scalar rules once per distinct value.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import Rejected
from .rejects import ReadStats
from .schema import EVENT_SCHEMA, LATENCY_MAX_MS, TRACE_ID, TS_MAX, TS_MIN, batch_schema
from .trace_ids import BAD_TRACE_ID, trace_id_bytes, trace_id_column

__all__ = [
    "validate_values",
    "check_fields",
    "validate_records",
    "validate_tuples",
    "validate_columns",
    "rows_to_batch",
    "settle_trace_ids",
    "plain_strings",
    "counted",
    "counted_batch",
    "Warned",
    "warning_counts",
    "check_ts",
    "check_status",
    "is_stringish",
]


_ISO_RE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
    r"(?:[Tt ]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]+))?)?"
    r"(?:([Zz])|([+-])([0-9]{2})(?::?([0-9]{2}))?)?)?",
    re.ASCII,
)
_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()


def _parse_iso_ms(text: str) -> int:
    """ISO-8601 date or date-time -> epoch ms (UTC when there is no offset). Raises ``Rejected``."""
    m = _ISO_RE.fullmatch(text)
    if m is None:
        raise Rejected("bad timestamp: ts")
    year, month, day, hh, mm, ss, frac, _z, sign, oh, om = m.groups()
    try:
        days = _dt.date(int(year), int(month), int(day)).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        raise Rejected("bad timestamp: ts") from None
    hour, minute, second = int(hh or 0), int(mm or 0), int(ss or 0)
    off_h, off_m = int(oh or 0), int(om or 0)
    if hour > 23 or minute > 59 or second > 59 or off_h > 23 or off_m > 59:
        raise Rejected("bad timestamp: ts")
    millis = int((frac or "")[:3].ljust(3, "0"))
    offset_min = (off_h * 60 + off_m) * (-1 if sign == "-" else 1)
    ms = (((days * 24 + hour) * 60 + minute - offset_min) * 60 + second) * 1000 + millis
    if not TS_MIN <= ms <= TS_MAX:
        raise Rejected("out of range: ts")
    return ms


def check_ts(value: Any) -> int:
    kind = type(value)
    if kind is int:
        if TS_MIN <= value <= TS_MAX:
            return value
        raise Rejected("out of range: ts")
    if kind is str:
        return _parse_iso_ms(value)
    raise Rejected("missing field: ts" if value is None else "bad type: ts")


def _encodable(value: str) -> bool:
    """Whether a string is text UTF-8 can encode: JSON escapes can produce lone surrogates ("\ud800"), which are
    not."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_service(value: Any) -> str:
    if type(value) is not str:
        raise Rejected("missing field: service" if value is None else "bad type: service")
    if not value or not _encodable(value):
        raise Rejected("bad value: service")
    return value


def _optional_str(value: Any, name: str, odd: list[str]) -> str | None:
    """An optional string field (null and "" are None). An odd value (not a string, not encodable text) is dropped
    and its warning noted in ``odd``: the field is not worth its event."""
    if type(value) is str and _encodable(value):
        return value or None
    if value is not None:
        odd.append(f"bad {name}")
    return None


def _check_latency(value: Any) -> float:
    kind = type(value)
    if kind is float:
        if 0.0 <= value <= LATENCY_MAX_MS:
            return value
        raise Rejected("out of range: latency_ms")
    if kind is int:
        if 0 <= value <= LATENCY_MAX_MS:
            return float(value)
        raise Rejected("out of range: latency_ms")
    raise Rejected("missing field: latency_ms" if value is None else "bad type: latency_ms")


_STATUS_VALUES: dict[Any, bool] = {True: True, False: False, "true": True, "false": False}


def check_status(value: Any) -> bool:
    if value is None:
        return True
    kind = type(value)
    if kind is bool or kind is str or (kind is int and (value == 0 or value == 1)):
        result = _STATUS_VALUES.get(bool(value) if kind is int else value)
        if result is not None:
            return result
    raise Rejected("bad value: status")


def validate_values(
    ts: Any, service: Any, instance: Any, endpoint: Any, latency: Any, status: Any, db_statement: Any,
    trace_id: Any = None, *, warnings: Counter[str] | None = None,
) -> tuple:  # fmt: skip
    """The validation core for one record given as JSON-typed Python values (``None`` = absent/null).

    Returns the canonical row tuple in :data:`FIELDS` order (and the trace id's 16 bytes after them when the record
    has one that can be used) or raises ``Rejected``; fields are checked in that order and the first failure is the
    reason. An accepted record's warnings (an odd optional field, dropped) are added to ``warnings``; a rejected
    record adds none. The inline test is only a shortcut for the common, plainly valid record (a strict subset of
    what the field checks accept, with the same result; ``test_fast_path_agrees_with_field_checks`` holds it to
    that)."""
    if trace_id is not None:
        row = validate_values(ts, service, instance, endpoint, latency, status, db_statement, warnings=warnings)
        raw = trace_id_bytes(trace_id)
        if raw is not None:
            return (*row, raw)
        if warnings is not None:  # (after the other fields: a rejected record counts no warning)
            warnings[BAD_TRACE_ID] += 1
        return row
    if (
        type(ts) is int and TS_MIN <= ts <= TS_MAX
        and type(service) is str and service and service.isascii()
        and type(instance) is str and instance.isascii()
        and type(endpoint) is str and endpoint.isascii()
        and type(latency) is float and 0.0 <= latency <= LATENCY_MAX_MS
        and type(status) is bool
        and (db_statement is None or (type(db_statement) is str and db_statement and db_statement.isascii()))
    ):  # fmt: skip
        return (ts, service, instance, endpoint, latency, status, db_statement)
    return check_fields(ts, service, instance, endpoint, latency, status, db_statement, warnings)


def check_fields(
    ts: Any, service: Any, instance: Any, endpoint: Any, latency: Any, status: Any, db_statement: Any,
    warnings: Counter[str] | None = None,
) -> tuple:  # fmt: skip
    """:func:`validate_values`' field checks, without the shortcut and the trace id."""
    odd: list[str] = []
    row = (
        check_ts(ts),
        _check_service(service),
        _optional_str(instance, "instance", odd) or "",
        _optional_str(endpoint, "endpoint", odd) or "",
        _check_latency(latency),
        check_status(status),
        _optional_str(db_statement, "db_statement", odd),
    )
    if odd and warnings is not None:  # only now: a required field checked after an odd one may still reject
        warnings.update(odd)
    return row


_ROW_TYPE = pa.struct(list(EVENT_SCHEMA))
_TRACED_ROW_TYPE = pa.struct(list(batch_schema([TRACE_ID])))
_FIELD_COUNT = len(EVENT_SCHEMA)


def rows_to_batch(rows: list[tuple]) -> pa.RecordBatch:
    """Rows already valid by every rule (in :data:`~.schema.FIELDS` order, canonical Python types; a row with a
    trace id has its bytes after them) -> a canonical batch (one struct conversion: the fastest route), with the
    ``trace_id`` column when some row has one."""
    if not rows:
        return pa.RecordBatch.from_pylist([], schema=EVENT_SCHEMA)
    if any(len(row) > _FIELD_COUNT for row in rows):
        rows = [row if len(row) > _FIELD_COUNT else (*row, None) for row in rows]
        return pa.RecordBatch.from_struct_array(pa.array(rows, type=_TRACED_ROW_TYPE))
    return pa.RecordBatch.from_struct_array(pa.array(rows, type=_ROW_TYPE))


def validate_records(
    records: Sequence[Any], stats: ReadStats | None = None
) -> tuple[pa.RecordBatch, list[tuple[int, str]]]:
    """Already-parsed JSON records (e.g. the elements of a JSON array an HTTP client sent) -> a canonical
    :data:`EVENT_SCHEMA` batch of the valid ones and ``(index, reason)`` per rejected one, by the same rules as
    files. ``stats`` (optional) counts them as a read would, warnings too."""
    rows: list[tuple] = []
    rejects: list[tuple[int, str]] = []
    warnings: Counter[str] = Counter()
    for i, obj in enumerate(records):
        try:
            if type(obj) is not dict:
                raise Rejected("not an object")
            get = obj.get
            rows.append(validate_values(
                get("ts"), get("service"), get("instance"), get("endpoint"),
                get("latency_ms"), get("status"), get("db_statement"), get(TRACE_ID), warnings=warnings,
            ))  # fmt: skip
        except Rejected as r:
            rejects.append((i, r.reason))
    return counted(rows, rejects, stats, warnings)


def validate_tuples(
    numbered: Iterable[tuple[int, tuple]], stats: ReadStats | None = None
) -> tuple[pa.RecordBatch, list[tuple[int, str]]]:
    """``(index, (ts, service, instance, endpoint, latency_ms, status, db_statement))`` per record, as an input
    format decoded them (for example a span) -> a canonical batch of the valid ones and ``(index, reason)`` per
    rejected one, by the same rules as every other input (``stats``: as :func:`validate_records`)."""
    rows: list[tuple] = []
    rejects: list[tuple[int, str]] = []
    warnings: Counter[str] = Counter()
    for i, values in numbered:
        try:
            rows.append(validate_values(*values, warnings=warnings))
        except Rejected as r:
            rejects.append((i, r.reason))
    return counted(rows, rejects, stats, warnings)


def counted(
    rows: list[tuple], rejects: list[tuple[int, str]], stats: ReadStats | None, warnings: Counter[str] | None = None
) -> tuple[pa.RecordBatch, list[tuple[int, str]]]:
    """Valid rows (as :func:`rows_to_batch` takes them) -> their batch, and the rows, rejects and warnings counted
    in ``stats`` (if any)."""
    batch = rows_to_batch(rows)
    return counted_batch(batch, rejects, stats, warnings)


def counted_batch(
    batch: pa.RecordBatch,
    rejects: list[tuple[int, str]],
    stats: ReadStats | None,
    warnings: Counter[str] | None = None,
) -> tuple[pa.RecordBatch, list[tuple[int, str]]]:
    """``batch`` and ``rejects``, counted in ``stats`` (if any) with the accepted rows' ``warnings``."""
    if stats is not None:
        stats.add_accepted(batch.num_rows)
        for _, reason in rejects:
            stats.add_rejected(reason)
        for reason, n in (warnings or {}).items():
            stats.add_warning(reason, n)
    return batch, rejects


#: accepted rows read with a caveat (an odd optional field dropped): per reason, a mask over a batch's rows
Warned = list[tuple[np.ndarray, str]]


def warning_counts(warned: Warned, keep: np.ndarray | None = None) -> Counter[str]:
    """How many rows each reason of ``warned`` holds (only those in ``keep``, when given)."""
    counts: Counter[str] = Counter()
    for mask, reason in warned:
        n = int((mask & keep).sum() if keep is not None else mask.sum())
        if n:
            counts[reason] += n
    return counts


def _np_mask(arr: pa.Array) -> np.ndarray:
    """Boolean Arrow array -> numpy bool array, nulls as False."""
    return pc.fill_null(arr, False).to_numpy(zero_copy_only=False)


def _null_mask(arr: pa.Array) -> np.ndarray | None:
    return None if arr.null_count == 0 else _np_mask(arr.is_null())


def is_stringish(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


class _Checks:
    """Collects (row mask, reason) pairs in field order; the first reason flagged for a row wins. Rows read with a
    caveat are collected beside them (:meth:`optional`, :meth:`warned`)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.flags: list[tuple[np.ndarray, str]] = []
        self.warnings: Warned = []

    def optional(self, warning: str) -> _Checks:
        """The checks of an optional field: what they flag is not rejected but noted as ``warning`` (the caller
        gives such rows the field's default)."""
        return _Warnings(self, warning)

    def flag(self, mask: np.ndarray | None, reason: str) -> None:
        if mask is not None and mask.any():
            self.flags.append((mask, reason))

    def flag_nulls(self, arr: pa.Array, reason: str) -> None:
        self.flag(_null_mask(arr), reason)

    def flag_non_null(self, arr: pa.Array, reason: str) -> None:
        self.flag(_np_mask(arr.is_valid()), reason)

    def rejected(self) -> tuple[np.ndarray, list[str]] | None:
        """(mask of rejected rows, reason per rejected row) or None when every row passes."""
        if not self.flags:
            return None
        reasons = np.full(self.n, None, dtype=object)
        for mask, reason in reversed(self.flags):
            reasons[mask] = reason
        mask = reasons != None  # noqa: E711 (elementwise)
        return mask, list(reasons[mask])

    def warned(self, rejected: np.ndarray | None) -> Warned:
        """The warnings of the rows not ``rejected`` (a rejected row counts none)."""
        if rejected is None:
            return self.warnings
        return [(mask & ~rejected, reason) for mask, reason in self.warnings if (mask & ~rejected).any()]


class _Warnings(_Checks):
    """:meth:`_Checks.optional`: flags become the parent's warnings, under one reason."""

    def __init__(self, parent: _Checks, warning: str) -> None:
        super().__init__(parent.n)
        self.parent, self.warning = parent, warning

    def flag(self, mask: np.ndarray | None, reason: str) -> None:
        if mask is not None and mask.any():
            self.parent.warnings.append((mask, self.warning))


def _map_distinct(arr: pa.Array, check: Callable[[Any], Any], checks: _Checks, default: Any, dtype: Any) -> np.ndarray:
    """Apply a scalar rule once per distinct value of ``arr``; returns the per-row results (``default``
    for nulls and rejected rows) and flags the rejected rows with the rule's reason."""
    encoded = pc.dictionary_encode(arr)
    indices = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)
    results: list[Any] = []
    bad: dict[str, list[int]] = {}
    for i, value in enumerate(encoded.dictionary.to_pylist()):
        try:
            results.append(check(value))
        except Rejected as r:
            results.append(default)
            bad.setdefault(r.reason, []).append(i)
    for reason, ids in bad.items():
        checks.flag(np.isin(indices, ids), reason)
    return np.array(results + [default], dtype=dtype)[indices]


def _decode_utf8(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise Rejected("not UTF-8") from None


def _as_strings(arr: pa.Array, checks: _Checks) -> pa.Array | None:
    """A text column as plain ``string``; binary is decoded (rows that are not UTF-8 are flagged).
    None for any other type."""
    t = arr.type
    if is_stringish(t):
        return arr.cast(pa.string())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        try:
            return arr.cast(pa.string())
        except pa.ArrowInvalid:
            return pa.array(_map_distinct(arr, _decode_utf8, checks, None, object), pa.string())
    return None


_TS_UNIT_MS = {"s": (1000, 1), "ms": (1, 1), "us": (1, 1000), "ns": (1, 1_000_000)}


def _int_ts_ms(arr: pa.Array, checks: _Checks) -> np.ndarray:
    if pa.types.is_unsigned_integer(arr.type):
        values = pc.fill_null(arr.cast(pa.uint64()), 0).to_numpy()
        out = values > TS_MAX
        values = np.where(out, 0, values).astype(np.int64)
    else:
        values = pc.fill_null(arr.cast(pa.int64()), 0).to_numpy()
        out = (values < TS_MIN) | (values > TS_MAX)
    checks.flag(out, "out of range: ts")
    return values


def _temporal_ts_ms(arr: pa.Array, checks: _Checks) -> np.ndarray:
    """date32/date64/timestamp[any unit, any tz] -> epoch ms (floored; the stored values are UTC)."""
    t = arr.type
    if pa.types.is_date32(t):
        mul, div = 86_400_000, 1
    elif pa.types.is_date64(t):
        mul, div = 1, 1
    else:
        mul, div = _TS_UNIT_MS[t.unit]
    storage = pa.int32() if pa.types.is_date32(t) else pa.int64()
    raw = pc.fill_null(arr.cast(storage).cast(pa.int64()), 0).to_numpy()
    if mul > 1:  # check before multiplying, so nothing overflows
        out = (raw < -(-TS_MIN // mul)) | (raw > TS_MAX // mul)
        values = np.where(out, 0, raw) * mul
    else:
        values = np.floor_divide(raw, div)
        out = (values < TS_MIN) | (values > TS_MAX)
    checks.flag(out, "out of range: ts")
    return values


def _ts_column(arr: pa.Array, checks: _Checks) -> pa.Array:
    t = arr.type
    checks.flag_nulls(arr, "missing field: ts")
    if pa.types.is_integer(t):
        values = _int_ts_ms(arr, checks)
    elif pa.types.is_timestamp(t) or pa.types.is_date(t):
        values = _temporal_ts_ms(arr, checks)
    elif (text := _as_strings(arr, checks)) is not None:
        values = _map_distinct(text, check_ts, checks, 0, np.int64)
    else:
        checks.flag_non_null(arr, "bad type: ts")
        values = np.zeros(len(arr), dtype=np.int64)
    return pa.array(values, type=pa.int64())


def _str_column(arr: pa.Array, name: str, checks: _Checks, keep_dictionary: bool = False) -> pa.Array:
    """service (required, non-empty), instance/endpoint (null -> ""), db_statement (null, "" -> null); a value of
    an optional one that is not text (another type, bytes that are not UTF-8) is dropped with a warning.

    ``keep_dictionary``: a dictionary-encoded column stays encoded when these rules change none of its values
    (:func:`_checked_dictionary`); otherwise it is decoded first, as always without the flag."""
    if pa.types.is_dictionary(arr.type):
        kept = _checked_dictionary(arr, name, checks) if keep_dictionary else None
        if kept is not None:
            return kept
        arr = arr.dictionary_decode()
    if name == "service":
        checks.flag_nulls(arr, "missing field: service")
    else:
        checks = checks.optional(f"bad {name}")  # (a flagged row's value is null: the default)
    text = _as_strings(arr, checks)
    if text is None:
        checks.flag_non_null(arr, f"bad type: {name}")
        text = pa.nulls(len(arr), pa.string())
    if name == "service":
        checks.flag(_np_mask(pc.equal(text, "")), "bad value: service")
    elif name == "db_statement":
        empty = pc.equal(text, "")
        if pc.any(empty).as_py():
            text = pc.if_else(empty, pa.scalar(None, pa.string()), text)
    elif text.null_count:
        text = pc.fill_null(text, "")
    return text


def _checked_dictionary(arr: pa.DictionaryArray, name: str, checks: _Checks) -> pa.DictionaryArray | None:
    """``arr`` (dictionary-encoded) checked by :func:`_str_column`'s rules on its dictionary, which is small, and
    kept encoded; None when the rules would rewrite values (empty statements) or the values are not plain strings:
    the caller decodes it then. An instance's or endpoint's nulls become "" (one more value when it has none)."""
    values = arr.dictionary
    if not pa.types.is_string(values.type) or values.null_count:
        return None
    if name == "service":
        checks.flag_nulls(arr, "missing field: service")
        empty = pc.equal(values, "")
        if pc.any(empty).as_py():
            checks.flag(_np_mask(pc.take(empty, arr.indices)), "bad value: service")
        return arr
    if name == "db_statement":
        return None if pc.any(pc.equal(values, "")).as_py() else arr
    if not arr.null_count:
        return arr
    empty = pc.index(values, "").as_py()
    if empty < 0:
        empty = len(values)
        values = pa.concat_arrays([values, pa.array([""], values.type)])
    return pa.DictionaryArray.from_arrays(pc.fill_null(arr.indices, empty), values)


def _latency_column(arr: pa.Array, checks: _Checks) -> pa.Array:
    t = arr.type
    checks.flag_nulls(arr, "missing field: latency_ms")
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        values = pc.fill_null(pc.cast(arr, pa.float64(), safe=False), 0.0).to_numpy()
        checks.flag(~((values >= 0.0) & (values <= LATENCY_MAX_MS)), "out of range: latency_ms")
    else:
        checks.flag_non_null(arr, "bad type: latency_ms")
        values = np.zeros(len(arr))
    return pa.array(values, type=pa.float64())


def _status_column(arr: pa.Array, checks: _Checks) -> pa.Array:
    t = arr.type
    if pa.types.is_boolean(t):
        return pc.fill_null(arr, True)
    if pa.types.is_integer(t):
        bad = pc.and_(arr.is_valid(), pc.invert(pc.is_in(arr, pa.array([0, 1], t))))
        checks.flag(_np_mask(bad), "bad value: status")
        return pc.fill_null(pc.not_equal(arr, pa.scalar(0, t)), True)
    if (text := _as_strings(arr, checks)) is not None:
        return pa.array(_map_distinct(text, check_status, checks, True, bool), pa.bool_())
    checks.flag_non_null(arr, "bad value: status")
    return pa.array(np.ones(len(arr), dtype=bool))


def _plain(arr: pa.Array) -> pa.Array:
    return arr.dictionary_decode() if pa.types.is_dictionary(arr.type) else arr


def validate_columns(
    batch: pa.RecordBatch, keep_dictionaries: bool = False
) -> tuple[pa.RecordBatch, tuple[np.ndarray, list[str]] | None, Warned]:
    """The columnar validation core: any Arrow batch -> (canonical batch of every row, rejects, warnings of the
    rows not rejected).

    Rows flagged in ``rejects`` hold placeholder values in the canonical batch; filter them out.
    ``keep_dictionaries``: see :func:`parquet_batch`."""
    n = batch.num_rows
    names = batch.schema.names

    def column(name: str) -> pa.Array:
        return batch.column(names.index(name)) if name in names else pa.nulls(n)

    def text(name: str) -> pa.Array:
        return _str_column(column(name), name, checks, keep_dictionaries)

    checks = _Checks(n)
    arrays = [
        _ts_column(_plain(column("ts")), checks),
        text("service"),
        text("instance"),
        text("endpoint"),
        _latency_column(_plain(column("latency_ms")), checks),
        _status_column(_plain(column("status")), checks),
        text("db_statement"),
    ]
    fields = list(EVENT_SCHEMA)
    rejected = checks.rejected()
    if TRACE_ID in names and batch.column(names.index(TRACE_ID)).null_count < n:  # some record has one
        traces, dropped = trace_id_column(column(TRACE_ID))
        if dropped is not None:
            checks.warnings.append((dropped, BAD_TRACE_ID))
        kept = traces if rejected is None else traces.filter(pa.array(~rejected[0]))
        if kept.null_count < len(kept):
            arrays.append(traces)  # an accepted record kept one (else the batch is as if none had: no column)
            fields = list(batch_schema([TRACE_ID]))
    warned = checks.warned(None if rejected is None else rejected[0])
    if not any(pa.types.is_dictionary(a.type) for a in arrays):
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields)), rejected, warned
    schema = pa.schema([f.with_type(a.type) for f, a in zip(fields, arrays)])
    return pa.RecordBatch.from_arrays(arrays, schema=schema), rejected, warned


def plain_strings(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with its dictionary-encoded columns decoded (to concatenate it with plain batches)."""
    if not any(pa.types.is_dictionary(t) for t in batch.schema.types):
        return batch
    arrays = [_plain(c) for c in batch.columns]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema([f.with_type(a.type) for f, a in
                                                                zip(batch.schema, arrays)]))  # fmt: skip


def settle_trace_ids(*batches: pa.RecordBatch) -> list[pa.RecordBatch]:
    """Canonical batches made alike for concatenation: all with the ``trace_id`` column when one has a trace id,
    else none with it (a column left all null after its rows were filtered out is dropped)."""
    traced = any(TRACE_ID in b.schema.names and b.column(TRACE_ID).null_count < b.num_rows for b in batches)
    out = []
    for b in batches:
        has = TRACE_ID in b.schema.names
        if has and not traced:
            b = b.drop_columns([TRACE_ID])
        elif traced and not has:
            b = b.append_column(batch_schema([TRACE_ID]).field(TRACE_ID), pa.nulls(b.num_rows, pa.binary()))
        out.append(b)
    return out
