"""OpenTelemetry traces (OTLP) into request events: protobuf and the OTLP JSON encoding, one mapping.

Decoding uses the official ``opentelemetry-proto`` message classes: they decide whether a body is a valid export.
OTLP JSON differs from protobuf's canonical JSON in one point, its ids (hex, not base64), which are converted before
``json_format.ParseDict``; everything else (lowerCamelCase names, 64-bit integers as strings, enums as integers) is
protobuf's JSON mapping. The spans of a valid export are then read from its wire form into Arrow columns
(:mod:`.span_columns`: ptars, over the official descriptors) and mapped a whole export at a time (the per-span
rules in one C pass, :mod:`._spanmap`): reading them through protobuf's Python objects cost three times as much.

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
* a CLIENT span with ``db.query.text`` (or the older ``db.statement``) is an *exit row* (:class:`~.batches.EventBatch`):
  its statement and duration feed the top-Ns keyed on ``db_statement``, under the calling service;
* a span that cannot be mapped (ids missing or malformed, end before start, a value out of range) is rejected with
  a reason; :func:`decode_traces` reports it for OTLP's ``partial_success``;
* an HTTP status is an integer value, or a string of ASCII digits;
* with ``trace_ids`` (the metrics TOML's ``[prometheus] exemplars = true``), each event keeps its span's trace id
  (the ``trace_id`` column), from which the live RED series pick exemplars;
* a sampled span counts as its adjusted count, from the sampling threshold in its trace state (``ot=th:8``: 2;
  :mod:`.sampling`): the batch then has a ``weight`` column. A threshold that cannot be used counts 1 and is
  reported (:attr:`TracesResult.warnings`).
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

from ..errors import OtlpError
from .batches import EventBatch
from .endpoints import EndpointRules
from .options import InputOptions
from .sampling import adjusted_counts
from .schema import EVENT_SCHEMA, LATENCY_MAX_MS, TRACE_ID
from .span_columns import Attributes, SpanColumns, span_columns

try:
    from ._spanmap import classify, pick
except ImportError:  # a Spark executor's zip of drainpipe's Python modules holds no extension
    from ._spanmap_fallback import classify, pick
from .spans import KINDS, SpanMapping

__all__ = ["TracesResult", "decode_traces", "decode_otlp_lines", "map_columns", "map_spans"]

_SERVER = KINDS["server"]
_CLIENT = KINDS["client"]
UNKNOWN_SERVICE = "unknown_service"


@dataclass
class TracesResult:
    """A decoded export: ``batch`` (requests, then exit rows, marked; its warnings count the requests counted 1
    for a sampling threshold that could not be used), ``rejects`` as (span index, reason), and the number of spans
    looked at (``spans``; the ones that are neither requests nor exits are not events)."""

    batch: EventBatch
    rejects: list[tuple[int, str]]
    spans: int


def decode_traces(body: bytes, *, json_body: bool, mapping: SpanMapping, endpoints: EndpointRules) -> TracesResult:
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
        body = request.SerializeToString()  # one mapping, on the wire form
    else:
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise OtlpError(f"invalid OTLP protobuf: {exc}") from None
    return map_spans(body, mapping, endpoints)


def decode_otlp_lines(
    lines: Sequence[bytes], first_line: int, options: InputOptions
) -> tuple[EventBatch, list[tuple[int, Any, str]]]:
    """OTLP JSON files (the OpenTelemetry Collector's file exporter: one ``ExportTraceServiceRequest`` per line) ->
    the events of lines ``first_line + 1`` on, and ``(line, raw, reason)`` per rejected line or span. Blank lines are
    skipped."""
    batches: list[EventBatch] = []
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
    return EventBatch.join(batches), bad


def map_spans(body: bytes, mapping: SpanMapping, endpoints: EndpointRules) -> TracesResult:
    """The mapping of the module docstring over an export's wire bytes (decoded once already by the official
    classes, which judged them valid).

    The per-span work is the whole cost of OTLP ingest, so it never builds a Python object per span or field: the
    export is read into Arrow columns (:mod:`.span_columns`), one C pass per export applies the rules
    (:mod:`._spanmap`), and the events are assembled from the columns. The rows are valid by construction: protobuf
    strings are valid UTF-8, a service is never empty, and an end time (uint64 nanoseconds) is always within the
    event timestamp range, so of the event rules only the latency bound is checked (in the C pass)."""
    return map_columns(span_columns(body), mapping, endpoints)


def map_columns(columns: SpanColumns, mapping: SpanMapping, endpoints: EndpointRules) -> TracesResult:
    """The mapping of :func:`map_spans`, over spans already in columns (one export's, or a block of OTLP JSON
    lines')."""
    n = columns.spans
    resource = columns.resource_attributes
    attrs = columns.attributes
    service, instance = _pick(resource, (mapping.service, mapping.instance))
    http_status = np.empty(n, np.int64)
    endpoint, statement, _ = _pick(attrs, (mapping.endpoint, mapping.statement, mapping.http_status), http_status)
    category, ok, latency = np.empty(n, np.int8), np.empty(n, np.bool_), np.empty(n, np.float64)
    request_kinds = sum(1 << KINDS[k] for k in mapping.request_kinds)
    classify(*columns.buffers(), statement, http_status, request_kinds, _CLIENT, _SERVER, float(LATENCY_MAX_MS),
             category, ok, latency)  # fmt: skip
    # the events: requests, then exit rows
    requests = np.flatnonzero(category == 1)
    rows = np.concatenate([requests, np.flatnonzero(category == 2)])
    is_exit = np.arange(len(rows)) >= len(requests)
    # service and instance: the resource's attribute, else the default (the last two entries of the pool)
    owner = columns.resource[rows]
    pool = pa.concat_arrays([resource.text, pa.array([UNKNOWN_SERVICE, ""], pa.string())])
    k = len(resource.text)
    services = pool.take(np.where(service >= 0, service, k)[owner])
    instances = pool.take(np.where(instance >= 0, instance, k + 1)[owner])
    # endpoint: the first endpoint attribute, else the span name, normalized once per distinct value; "" for exits
    chosen = endpoint[rows]
    chosen = np.where(chosen >= 0, chosen, len(attrs.text) + rows)
    distinct = pa.concat_arrays([attrs.text, columns.name]).take(chosen).dictionary_encode()
    normalize = endpoints.normalize
    templates = [normalize(e) for e in distinct.dictionary.to_pylist()]
    codes = np.frombuffer(distinct.indices.buffers()[1], np.int32, len(rows))  # (to_numpy would import pandas)
    if len(requests) < len(rows):
        codes = np.where(is_exit, len(templates), codes)
        templates.append("")
    end = np.frombuffer(columns.end.buffers()[1], np.uint64, n)
    ts = (end[rows] // np.uint64(1_000_000)).astype(np.int64)  # exactly as Python's end // 1_000_000
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(ts),
            services,
            instances,
            pa.array(templates, pa.string()).take(codes),
            pa.array(latency[rows]),
            pa.array(ok[rows]),
            attrs.text.take(pa.array(statement[rows], mask=~is_exit)),  # null for requests
        ],
        schema=EVENT_SCHEMA,
    )
    weights, warnings = adjusted_counts(columns.trace_state, columns.span_id, requests)
    events = EventBatch(batch, len(requests), tuple(warnings.items()))
    if mapping.trace_ids:  # for exemplars (``[prometheus] exemplars``): 20 more bytes a span through the pipeline
        events = events.with_column(TRACE_ID, columns.trace_id.take(pa.array(rows)))
    if weights is not None:  # exit rows count nothing: 1 each
        events = events.with_weights(np.concatenate([weights, np.ones(len(rows) - len(requests), np.int64)]))
    bad = [(int(i), _REASONS[int(category[i])]) for i in np.flatnonzero(category < 0)]
    return TracesResult(events, bad, n)


_REASONS = {-1: "bad value: trace_id", -2: "bad value: span_id", -3: "bad value: end before start",
            -4: "out of range: latency_ms"}  # fmt: skip


def _pick(attrs: Attributes, fields: tuple[tuple[str, ...], ...], status: np.ndarray | None = None) -> np.ndarray:
    """Per field (a list of keys each, lower rank first), per owner: the index of the attribute that gives it, or -1.
    With ``status``, the last field is the HTTP status, whose value goes there (-1 for none)."""
    roles = [(key.encode(), field, rank) for field, keys in enumerate(fields) for rank, key in enumerate(keys)]
    out = np.empty((len(fields), attrs.owners), np.int64)
    status_field = len(fields) - 1 if status is not None else -1
    pick(attrs.owners, *attrs.buffers(), roles, len(fields), status_field, out, status)
    return out


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
