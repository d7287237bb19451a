"""OpenTelemetry traces (OTLP) into request events: protobuf and the OTLP JSON encoding, one mapping.

Decoding uses the official ``opentelemetry-proto`` message classes. OTLP JSON differs from protobuf's canonical
JSON in one point, its ids (hex, not base64), which are converted before ``json_format.ParseDict``; everything
else (lowerCamelCase names, 64-bit integers as strings, enums as integers) is protobuf's JSON mapping.

The mapping (``docs/pipeline.md``, "OpenTelemetry spans"; every attribute list overridable in the metrics TOML's
``[spans]`` table, see :class:`~drainpipe.inputs.spans.SpanMapping`):

* a span of a request kind (SERVER or CONSUMER) is one request of its service; INTERNAL, CLIENT and PRODUCER spans
  are not;
* service = the resource's ``service.name`` (``unknown_service`` when missing, as OpenTelemetry does); instance =
  ``service.instance.id``, else ``host.name``, else empty; endpoint = ``http.route``, else the span name, through
  the endpoint rules (:mod:`.endpoints`);
* ts = end time (ms); latency_ms = end - start;
* status is false when the span's status is ERROR, or for a SERVER span whose status is UNSET with
  ``http.response.status_code`` (or the older ``http.status_code``) >= 500;
* a CLIENT span with ``db.query.text`` (or the older ``db.statement``) is an *exit row* (:data:`REQUESTS_KEY`):
  its statement and duration feed the top-Ns keyed on ``db_statement``, under the calling service;
* a span that cannot be mapped (ids missing or malformed, end before start, a value out of range) is rejected with
  a reason; :func:`decode_traces` reports it for OTLP's ``partial_success``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from .endpoints import EndpointRules
from .options import InputOptions
from .records import EVENT_SCHEMA, LATENCY_MAX_MS, ReadStats, join_events, rows_to_batch, with_exits
from .spans import KINDS, SpanMapping

__all__ = ["OtlpError", "TracesResult", "decode_traces", "decode_otlp_lines", "map_spans"]

_SERVER = KINDS["server"]
_CLIENT = KINDS["client"]
_STATUS_ERROR = 2
_STATUS_UNSET = 0
UNKNOWN_SERVICE = "unknown_service"


class OtlpError(ValueError):
    """A body that is not an OTLP trace export at all (undecodable protobuf, invalid JSON): one line."""


@dataclass
class TracesResult:
    """A decoded export: ``batch`` (requests, then exit rows, marked), ``rejects`` as (span index, reason), and
    the number of spans looked at (``spans``; the ones that are neither requests nor exits are not events)."""

    batch: pa.RecordBatch
    rejects: list[tuple[int, str]]
    spans: int


def decode_traces(
    body: bytes, *, json_body: bool, mapping: SpanMapping, endpoints: EndpointRules, stats: ReadStats | None = None
) -> TracesResult:
    """An ``ExportTraceServiceRequest`` (protobuf, or OTLP JSON if ``json_body``) -> events. Raises
    :class:`OtlpError` for a body that does not decode at all."""
    request = ExportTraceServiceRequest()
    if json_body:
        try:
            document = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise OtlpError(f"invalid JSON: {exc}") from None
        if not isinstance(document, dict):
            raise OtlpError("invalid OTLP JSON: not an object")
        _hex_ids_to_base64(document)
        try:
            json_format.ParseDict(document, request, ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            raise OtlpError(f"invalid OTLP JSON: {str(exc).splitlines()[0]}") from None
    else:
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise OtlpError(f"invalid OTLP protobuf: {exc}") from None
    return map_spans(request, mapping, endpoints, stats)


def decode_otlp_lines(
    lines: Sequence[bytes], first_line: int, options: InputOptions
) -> tuple[pa.RecordBatch, list[tuple[int, Any, str]]]:
    """OTLP JSON files (the OpenTelemetry Collector's file exporter: one ``ExportTraceServiceRequest`` per line) ->
    the events of lines ``first_line + 1`` on, and ``(line, raw, reason)`` per rejected line or span. Blank lines are
    skipped."""
    batches: list[pa.RecordBatch] = []
    bad: list[tuple[int, Any, str]] = []
    for i, raw in enumerate(lines, first_line + 1):
        if not raw.strip():
            continue
        try:
            result = decode_traces(raw, json_body=True, mapping=options.spans, endpoints=options.endpoints)
        except OtlpError as exc:
            bad.append((i, raw, "invalid JSON" if str(exc).startswith("invalid JSON") else "invalid OTLP"))
            continue
        if result.batch.num_rows:
            batches.append(result.batch)
        bad += [(i, {"span": index}, reason) for index, reason in result.rejects]
    if not batches:
        return pa.RecordBatch.from_pylist([], EVENT_SCHEMA), bad
    return join_events(batches), bad


def map_spans(
    request: ExportTraceServiceRequest, mapping: SpanMapping, endpoints: EndpointRules, stats: ReadStats | None = None
) -> TracesResult:
    """The mapping of the module docstring over a decoded export.

    The per-span work is the whole cost of OTLP ingest, so this loop touches each span's fields once and builds rows
    that are valid by construction: protobuf strings are valid UTF-8, a service is never empty, and an end time
    (uint64 nanoseconds) is always within the event timestamp range, so of the event rules only the latency bound is
    left to check here."""
    requests: list[tuple] = []
    exits: list[tuple] = []
    bad: list[tuple[int, str]] = []
    request_kinds = frozenset(KINDS[k] for k in mapping.request_kinds)
    wanted_span = frozenset(mapping.endpoint + mapping.http_status + mapping.statement)
    wanted_resource = frozenset(mapping.service + mapping.instance)
    endpoint_keys, statement_keys = mapping.endpoint, mapping.statement
    normalize = endpoints.normalize
    max_ns = LATENCY_MAX_MS * 1e6
    has_field = Span.HasField
    index = -1
    for resource_spans in request.resource_spans:
        rattrs = _attributes(resource_spans.resource.attributes, wanted_resource)
        service = _first_str(rattrs, mapping.service) or UNKNOWN_SERVICE
        instance = _first_str(rattrs, mapping.instance) or ""
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                index += 1
                kind = span.kind
                is_request = kind in request_kinds
                if not is_request and kind != _CLIENT:
                    continue
                attrs = _attributes(span.attributes, wanted_span)
                statement = None
                if not is_request:
                    statement = _first_str(attrs, statement_keys)
                    if statement is None:
                        continue  # a CLIENT span without a statement is no event
                trace_id, span_id = span.trace_id, span.span_id
                if len(trace_id) != 16 or trace_id == _ZERO16:
                    bad.append((index, "bad value: trace_id"))
                    continue
                if len(span_id) != 8 or span_id == _ZERO8:
                    bad.append((index, "bad value: span_id"))
                    continue
                start, end = span.start_time_unix_nano, span.end_time_unix_nano
                if end < start:
                    bad.append((index, "bad value: end before start"))
                    continue
                if end - start > max_ns:
                    bad.append((index, "out of range: latency_ms"))
                    continue
                code = span.status.code if has_field(span, "status") else _STATUS_UNSET  # (the wrapper is costly)
                ok = code != _STATUS_ERROR
                if ok and code == _STATUS_UNSET and kind == _SERVER and attrs:
                    http = _first_int(attrs, mapping.http_status)
                    ok = http is None or http < 500
                if is_request:
                    endpoint = (_first_str(attrs, endpoint_keys) if attrs else None) or span.name
                    requests.append((end // 1_000_000, service, instance, normalize(endpoint), (end - start) / 1e6,
                                     ok, None))  # fmt: skip
                else:
                    exits.append((end // 1_000_000, service, instance, "", (end - start) / 1e6, ok, statement))
    if stats is not None:
        stats.add_accepted(len(requests) + len(exits))
        for _, reason in bad:
            stats.add_rejected(reason)
    return TracesResult(with_exits(rows_to_batch(requests), rows_to_batch(exits)), bad, index + 1)


def _attributes(kvs: Any, wanted: frozenset[str]) -> dict[str, Any] | None:
    """The wanted attributes among ``kvs`` (by index: iterating an upb repeated field costs twice as much)."""
    found = None
    for i in range(len(kvs)):
        kv = kvs[i]
        key = kv.key
        if key in wanted:
            if found is None:
                found = {}
            found[key] = kv.value
    return found


def _first_str(attrs: dict[str, Any] | None, keys: tuple[str, ...]) -> str | None:
    if attrs:
        for key in keys:
            value = attrs.get(key)
            if value is not None:
                text = value.string_value  # "" when the value is not a string
                if text:
                    return str(text)
    return None


def _first_int(attrs: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = attrs.get(key)
        if value is None:
            continue
        which = value.WhichOneof("value")
        if which == "int_value":
            return int(value.int_value)
        if which == "string_value" and value.string_value.isdigit():
            return int(value.string_value)
    return None


_ZERO16 = bytes(16)
_ZERO8 = bytes(8)


# ---------------------------------------------------------------------------------------------- OTLP JSON ids

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids_to_base64(document: dict[str, Any]) -> None:
    """OTLP JSON carries ids as hex; protobuf's JSON mapping wants base64. An id that is not hex becomes empty, so
    its span is rejected with a reason instead of failing the whole request."""
    for holder in _id_holders(document):
        for key in _ID_FIELDS:
            value = holder.get(key)
            if isinstance(value, str):
                try:
                    holder[key] = base64.b64encode(bytes.fromhex(value)).decode()
                except ValueError:
                    holder[key] = ""


def _id_holders(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for rs in _list(document.get("resourceSpans", document.get("resource_spans"))):
        for ss in _list(rs.get("scopeSpans", rs.get("scope_spans"))) if isinstance(rs, dict) else ():
            for span in _list(ss.get("spans")) if isinstance(ss, dict) else ():
                if isinstance(span, dict):
                    yield span
                    for link in _list(span.get("links")):
                        if isinstance(link, dict):
                            yield link


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
