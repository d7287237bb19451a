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

import numpy as np
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
_ENDPOINT, _HTTP, _STATEMENT = 0, 1, 2  # the fields span attributes give
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
    (requests as columns) that are valid by construction: protobuf strings are valid UTF-8, a service is never
    empty, and an end time (uint64 nanoseconds) is always within the event timestamp range, so of the event rules
    only the latency bound is left to check here."""
    # requests as columns (ts and latency computed at the end, vectorized); exit rows, few, as rows
    ends: list[int] = []
    durations: list[int] = []
    services: list[str] = []
    instances: list[str] = []
    endpoint_col: list[str] = []
    oks: list[bool] = []
    exits: list[tuple] = []
    bad: list[tuple[int, str]] = []
    request_kinds = frozenset(KINDS[k] for k in mapping.request_kinds)
    roles = _span_roles(mapping)
    role_of = roles.get
    wanted_resource = frozenset(mapping.service + mapping.instance)
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
                # the wanted attributes, each by its role and rank (inlined: this loop is the cost of OTLP ingest; by
                # index, since iterating an upb repeated field costs twice as much)
                endpoint = statement = None
                endpoint_rank = statement_rank = len(roles)
                http: list[tuple[int, Any]] | None = None
                kvs = span.attributes
                for i in range(len(kvs)):
                    kv = kvs[i]
                    fields = role_of(kv.key)
                    if fields is None:
                        continue
                    for field, rank in fields:  # (usually one: a key may serve several fields)
                        if field == _ENDPOINT:
                            if rank < endpoint_rank and is_request:
                                text = kv.value.string_value  # "" when the value is not a string
                                if text:
                                    endpoint, endpoint_rank = text, rank
                        elif field == _STATEMENT:
                            if rank < statement_rank and not is_request:
                                text = kv.value.string_value
                                if text:
                                    statement, statement_rank = text, rank
                        elif http is None:
                            http = [(rank, kv.value)]
                        else:
                            http.append((rank, kv.value))
                if not is_request and statement is None:
                    continue  # a CLIENT span without a statement is no event
                trace_id = span.trace_id
                if len(trace_id) != 16 or trace_id == _ZERO16:
                    bad.append((index, "bad value: trace_id"))
                    continue
                span_id = span.span_id
                if len(span_id) != 8 or span_id == _ZERO8:
                    bad.append((index, "bad value: span_id"))
                    continue
                start, end = span.start_time_unix_nano, span.end_time_unix_nano
                if end < start:
                    bad.append((index, "bad value: end before start"))
                    continue
                if end - start > max_ns and (end - start) / 1e6 > LATENCY_MAX_MS:  # as the event rule reads it
                    bad.append((index, "out of range: latency_ms"))
                    continue
                if has_field(span, "status"):  # (reading an absent status builds a costly wrapper)
                    code = span.status.code
                    ok = code != _STATUS_ERROR
                else:
                    code, ok = _STATUS_UNSET, True
                if ok and http is not None and code == _STATUS_UNSET and kind == _SERVER:
                    status = _http_status(http)
                    ok = status is None or status < 500
                if is_request:
                    ends.append(end)
                    durations.append(end - start)
                    services.append(service)
                    instances.append(instance)
                    endpoint_col.append(normalize(endpoint or span.name))
                    oks.append(ok)
                else:
                    exits.append((end // 1_000_000, service, instance, "", (end - start) / 1e6, ok, statement))
    if stats is not None:
        stats.add_accepted(len(ends) + len(exits))
        for _, reason in bad:
            stats.add_rejected(reason)
    requests = _request_batch(ends, durations, services, instances, endpoint_col, oks)
    return TracesResult(with_exits(requests, rows_to_batch(exits)), bad, index + 1)


def _request_batch(ends: list[int], durations: list[int], services: list[str], instances: list[str],
                   endpoints: list[str], oks: list[bool]) -> pa.RecordBatch:  # fmt: skip
    """Request columns -> an event batch: ts = end (ms, floored), latency_ms = duration / 1e6, exactly as Python's
    ``end // 1_000_000`` and ``(end - start) / 1e6`` give them (uint64 in numpy: both fit; the float conversion
    rounds as Python's does)."""
    end_ns = np.array(ends, dtype=np.uint64)
    return pa.RecordBatch.from_arrays(
        [
            pa.array((end_ns // np.uint64(1_000_000)).astype(np.int64)),
            pa.array(services, pa.string()),
            pa.array(instances, pa.string()),
            pa.array(endpoints, pa.string()),
            pa.array(np.array(durations, dtype=np.uint64).astype(np.float64) / 1e6),
            pa.array(oks, pa.bool_()),
            pa.nulls(len(ends), pa.string()),
        ],
        schema=EVENT_SCHEMA,
    )


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


def _span_roles(mapping: SpanMapping) -> dict[str, tuple[tuple[int, int], ...]]:
    """Span attribute key -> every (field it gives, its rank among that field's keys: lower wins)."""
    roles: dict[str, tuple[tuple[int, int], ...]] = {}
    for field, keys in ((_ENDPOINT, mapping.endpoint), (_HTTP, mapping.http_status), (_STATEMENT, mapping.statement)):
        for rank, key in enumerate(keys):
            known = roles.get(key, ())
            if all(f != field for f, _ in known):  # a key listed twice for one field: its first rank counts
                roles[key] = (*known, (field, rank))
    return roles


def _http_status(candidates: list[tuple[int, Any]]) -> int | None:
    """The HTTP status of the first key (by rank) whose value is an integer or a string of digits."""
    for _, value in sorted(candidates, key=lambda c: c[0]):
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
