"""A block of OTLP JSON lines -> span columns with the standard library's ``json`` and pyarrow: what the C pass
(``_otlpjson.c``, :func:`~.span_columns.json_span_columns`) gives, where it is not built (a Spark executor's zip of
drainpipe's Python modules holds no extension). Without it every line went to the reference decoder (protobuf's
JSON mapping, :func:`~.otlp.decode_otlp_lines`: ~38 us a span, and protobuf on every executor).

Like the C pass it is a fast path, never the judge: it accepts only lines whose meaning under the reference is
beyond doubt and declines the others, line by line, for the reference (it declines more than the C pass: nulls,
quoted 32-bit integers, an attribute value without a member). A line is accepted when:

* it is valid UTF-8 without ``\\u`` escapes of surrogates, and one JSON object (``json``'s grammar, without
  ``NaN``/``Infinity``; of a key given twice the last counts, as the reference reads the same ``json.loads``
  result);
* every key is a field of its message under its JSON name (:data:`MESSAGES`, checked against opentelemetry-proto's
  descriptors by a test) and no value is null;
* values have their field's JSON type: strings; 64-bit integers as JSON integers or canonical decimal strings
  (``"0"``, ``"123"``, ``"-5"`` where signed) in range; 32-bit counts and flags as JSON integers in range; enums
  (kind, status code) as the numbers or names of opentelemetry-proto's values; bools; doubles as finite numbers;
  ids as hex of even length; an attribute value (``AnyValue``) with exactly one member, not ``bytesValue``, nested
  at most :data:`MAX_DEPTH` deep.

A blank line (``raw.strip()`` empty) has no spans, as the reference skips it."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np
import pyarrow as pa

from .span_columns import Attributes, ScannedSpans, SpanColumns

__all__ = ["MESSAGES", "MAX_DEPTH", "python_json_spans"]

#: the JSON names of each message's fields this pass accepts (a key outside them declines the line)
MESSAGES: dict[str, frozenset[str]] = {
    "opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest": frozenset({"resourceSpans"}),
    "opentelemetry.proto.trace.v1.ResourceSpans": frozenset({"resource", "scopeSpans", "schemaUrl"}),
    "opentelemetry.proto.resource.v1.Resource": frozenset({"attributes", "droppedAttributesCount"}),
    "opentelemetry.proto.trace.v1.ScopeSpans": frozenset({"scope", "spans", "schemaUrl"}),
    "opentelemetry.proto.common.v1.InstrumentationScope": frozenset(
        {"name", "version", "attributes", "droppedAttributesCount"}
    ),
    "opentelemetry.proto.trace.v1.Span": frozenset(
        {
            "traceId",
            "spanId",
            "traceState",
            "parentSpanId",
            "flags",
            "name",
            "kind",
            "startTimeUnixNano",
            "endTimeUnixNano",
            "attributes",
            "droppedAttributesCount",
            "events",
            "droppedEventsCount",
            "links",
            "droppedLinksCount",
            "status",
        }
    ),
    "opentelemetry.proto.trace.v1.Span.Event": frozenset(
        {"timeUnixNano", "name", "attributes", "droppedAttributesCount"}
    ),
    "opentelemetry.proto.trace.v1.Span.Link": frozenset(
        {"traceId", "spanId", "traceState", "attributes", "droppedAttributesCount", "flags"}
    ),
    "opentelemetry.proto.trace.v1.Status": frozenset({"message", "code"}),
    "opentelemetry.proto.common.v1.KeyValue": frozenset({"key", "value"}),
    "opentelemetry.proto.common.v1.AnyValue": frozenset(
        {"stringValue", "boolValue", "intValue", "doubleValue", "arrayValue", "kvlistValue"}
    ),
    "opentelemetry.proto.common.v1.ArrayValue": frozenset({"values"}),
    "opentelemetry.proto.common.v1.KeyValueList": frozenset({"values"}),
}
_M = {name.rsplit(".", 1)[1]: keys for name, keys in MESSAGES.items()}
#: the values of the two enums, by name (checked against opentelemetry-proto's by a test)
SPAN_KINDS = {"SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3,
              "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}  # fmt: skip
STATUS_CODES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
#: how deep attribute values (arrays and key/value lists in values) may nest
MAX_DEPTH = 16

_U64, _I64, _U32 = 1 << 64, 1 << 63, 1 << 32
_UNSIGNED = re.compile(r"(?:0|[1-9][0-9]*)\Z")
_SIGNED = re.compile(r"-?(?:0|[1-9][0-9]*)\Z")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})*\Z")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # (an escaped backslash before "ud800" declines too: safe)


class _Decline(Exception):
    """This line is the reference's."""


def _no_constant(name: str) -> Any:
    raise _Decline  # NaN, Infinity: not JSON


#: the reference reads the same ``json.loads`` result, so a duplicate key means the same to both (the last one)
_decode = json.JSONDecoder(parse_constant=_no_constant).decode


def _fields(value: Any, message: str) -> dict[str, Any]:
    if type(value) is not dict or not value.keys() <= _M[message]:
        raise _Decline
    return value


def _items(value: Any, message: str) -> list[dict[str, Any]]:
    if type(value) is not list:
        raise _Decline
    return [_fields(item, message) for item in value]


def _string(value: Any) -> str:
    if type(value) is not str:
        raise _Decline
    return value


def _u64(value: Any) -> int:
    if type(value) is str and _UNSIGNED.match(value):
        value = int(value)
    if type(value) is not int or not 0 <= value < _U64:
        raise _Decline
    return value


def _i64(value: Any) -> int:
    if type(value) is str and _SIGNED.match(value):
        value = int(value)
    if type(value) is not int or not -_I64 <= value < _I64:
        raise _Decline
    return value


def _u32(value: Any) -> int:
    if type(value) is not int or not 0 <= value < _U32:
        raise _Decline
    return value


def _enum(value: Any, names: dict[str, int]) -> int:
    if type(value) is str:
        value = names.get(value)
    if type(value) is not int or value not in names.values():
        raise _Decline
    return value


def _id(value: Any) -> bytes:
    if type(value) is not str or not _HEX.match(value):
        raise _Decline
    return bytes.fromhex(value)


def _value(value: Any, depth: int) -> tuple[str | None, int | None]:
    """An ``AnyValue`` -> (its string, its integer): at most one of them, neither for another type."""
    if type(value) is not dict or len(value) != 1 or depth > MAX_DEPTH:
        raise _Decline
    ((member, inner),) = value.items()
    if member == "stringValue":
        return _string(inner), None
    if member == "intValue":
        return None, _i64(inner)
    if member == "boolValue":
        if type(inner) is not bool:
            raise _Decline
    elif member == "doubleValue":
        if type(inner) is float:
            if not math.isfinite(inner):
                raise _Decline
        elif type(inner) is not int or abs(inner) > 1 << 53:
            raise _Decline
    elif member == "arrayValue":
        values = _fields(inner, "ArrayValue").get("values", [])
        if type(values) is not list:
            raise _Decline
        for item in values:
            _value(item, depth + 1)
    elif member == "kvlistValue":
        _attributes(_fields(inner, "KeyValueList").get("values", []), None, depth + 1)
    else:
        raise _Decline  # bytesValue (base64 in protobuf's JSON), or a member this pass does not know
    return None, None


class _Pool:
    """Attribute pairs of several owners, flattened as the mapping reads them (:class:`~.span_columns.Attributes`)."""

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.keys: list[str] = []
        self.has: list[bool] = []
        self.text: list[str | None] = []
        self.integer: list[int | None] = []

    def mark(self) -> tuple[int, int]:
        return len(self.counts), len(self.keys)

    def rollback(self, mark: tuple[int, int]) -> None:
        owners, pairs = mark
        del self.counts[owners:], self.keys[pairs:], self.has[pairs:], self.text[pairs:], self.integer[pairs:]

    def attributes(self) -> Attributes:
        offsets = np.zeros(len(self.counts) + 1, np.int32)
        np.cumsum(self.counts, out=offsets[1:])
        valid = None if all(self.has) else pa.array(self.has, pa.bool_()).buffers()[1]
        return Attributes(len(self.counts), offsets, None, pa.array(self.keys, pa.string()), valid,
                          pa.array(self.text, pa.string()), pa.array(self.integer, pa.int64()))  # fmt: skip


def _attributes(value: Any, pool: _Pool | None, depth: int = 0) -> None:
    """A list of ``KeyValue``, checked, and with a ``pool`` its pairs added to it as one owner's."""
    if type(value) is not list:
        raise _Decline
    names = _M["KeyValue"]
    for pair in value:
        if type(pair) is not dict or not pair.keys() <= names:
            raise _Decline
        key = pair.get("key", "")
        if type(key) is not str:
            raise _Decline
        has = "value" in pair
        text, integer = _value(pair["value"], depth) if has else (None, None)
        if pool is not None:
            pool.keys.append(key)
            pool.has.append(has)
            pool.text.append(text)
            pool.integer.append(integer)
    if pool is not None:
        pool.counts.append(len(value))


def _checked_span(span: dict[str, Any]) -> None:
    """The fields of a span the mapping does not read, checked as the reference checks them."""
    for key in ("parentSpanId",):
        if key in span:
            _id(span[key])
    for key in ("flags", "droppedAttributesCount", "droppedEventsCount", "droppedLinksCount"):
        if key in span:
            _u32(span[key])
    for event in _items(span.get("events", []), "Event"):
        if "timeUnixNano" in event:
            _u64(event["timeUnixNano"])
        if "name" in event:
            _string(event["name"])
        _attributes(event.get("attributes", []), None)
        if "droppedAttributesCount" in event:
            _u32(event["droppedAttributesCount"])
    for link in _items(span.get("links", []), "Link"):
        for key in ("traceId", "spanId"):
            if key in link:
                _id(link[key])
        if "traceState" in link:
            _string(link["traceState"])
        _attributes(link.get("attributes", []), None)
        for key in ("droppedAttributesCount", "flags"):
            if key in link:
                _u32(link[key])


class _Block:
    """The columns being filled, line by line; a line is taken whole or not at all (:meth:`line`)."""

    def __init__(self) -> None:
        self.line_of: list[int] = []
        self.resource_of: list[int] = []
        self.kind: list[int] = []
        self.start: list[int] = []
        self.end: list[int] = []
        self.code: list[int] = []
        self.trace_id: list[bytes] = []
        self.span_id: list[bytes] = []
        self.name: list[str] = []
        self.state: list[str] = []
        self.spans = _Pool()
        self.resources = _Pool()

    def _span_lists(self) -> tuple[list, ...]:
        return (self.line_of, self.resource_of, self.kind, self.start, self.end, self.code, self.trace_id,
                self.span_id, self.name, self.state)  # fmt: skip

    def line(self, document: Any, index: int) -> None:
        """One export's spans and resources, all or nothing (raises :class:`_Decline`, leaving the block as it was)."""
        mark = len(self.line_of), self.spans.mark(), self.resources.mark()
        try:
            self._line(document, index)
        except _Decline:
            for column in self._span_lists():
                del column[mark[0] :]
            self.spans.rollback(mark[1])
            self.resources.rollback(mark[2])
            raise

    def _line(self, document: Any, index: int) -> None:
        for rs in _items(_fields(document, "ExportTraceServiceRequest").get("resourceSpans", []), "ResourceSpans"):
            resource = len(self.resources.counts)
            if "schemaUrl" in rs:
                _string(rs["schemaUrl"])
            if "resource" in rs:
                res = _fields(rs["resource"], "Resource")
                _attributes(res.get("attributes", []), self.resources)
                if "droppedAttributesCount" in res:
                    _u32(res["droppedAttributesCount"])
            else:
                self.resources.counts.append(0)  # an absent resource has no attributes
            for ss in _items(rs.get("scopeSpans", []), "ScopeSpans"):
                if "schemaUrl" in ss:
                    _string(ss["schemaUrl"])
                if "scope" in ss:
                    scope = _fields(ss["scope"], "InstrumentationScope")
                    for key in ("name", "version"):
                        if key in scope:
                            _string(scope[key])
                    _attributes(scope.get("attributes", []), None)
                    if "droppedAttributesCount" in scope:
                        _u32(scope["droppedAttributesCount"])
                for span in _items(ss.get("spans", []), "Span"):
                    get = span.get
                    status = _fields(span["status"], "Status") if "status" in span else {}
                    if "message" in status:
                        _string(status["message"])
                    _checked_span(span)
                    self.line_of.append(index)
                    self.resource_of.append(resource)
                    self.kind.append(_enum(get("kind", 0), SPAN_KINDS))
                    self.start.append(_u64(get("startTimeUnixNano", 0)))
                    self.end.append(_u64(get("endTimeUnixNano", 0)))
                    self.code.append(_enum(status.get("code", 0), STATUS_CODES))
                    self.trace_id.append(_id(get("traceId", "")))
                    self.span_id.append(_id(get("spanId", "")))
                    self.name.append(_string(get("name", "")))
                    self.state.append(_string(get("traceState", "")))
                    _attributes(get("attributes", []), self.spans)

    def columns(self) -> tuple[SpanColumns, np.ndarray]:
        columns = SpanColumns(
            spans=len(self.line_of),
            resources=len(self.resources.counts),
            resource=np.array(self.resource_of, np.int64),
            kind=pa.array(np.array(self.kind, np.int32)),
            trace_id=pa.array(self.trace_id, pa.binary()),
            span_id=pa.array(self.span_id, pa.binary()),
            trace_state=pa.array(self.state, pa.string()),
            name=pa.array(self.name, pa.string()),
            start=pa.array(np.array(self.start, np.uint64)),
            end=pa.array(np.array(self.end, np.uint64)),
            status_valid=None,  # an absent status is code 0 (UNSET), as the mapping reads one
            status_code=pa.array(np.array(self.code, np.int32)),
            attributes=self.spans.attributes(),
            resource_attributes=self.resources.attributes(),
        )
        return columns, np.array(self.line_of, np.int32)


def python_json_spans(data: bytes, count: int) -> ScannedSpans:
    """A block of ``count`` OTLP JSON lines (one export each, blank lines allowed) -> the spans of the lines this pass
    accepts as columns, and the indexes of the lines it declines (for the reference). Raises ``ValueError`` when
    ``data`` does not hold ``count`` lines."""
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # (after the last newline)
    if len(lines) != count:
        raise ValueError(f"an OTLP JSON block of {count} lines does not hold {count} lines")
    block = _Block()
    declined = []
    for index, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            if _SURROGATE_ESCAPE.search(raw):
                raise _Decline
            block.line(_decode(raw.decode("utf-8")), index)
        except (_Decline, ValueError, RecursionError):  # (json's errors and UnicodeDecodeError are ValueErrors)
            declined.append(index)
    columns, line = block.columns()
    return ScannedSpans(columns, line, declined)
