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
* a span that cannot be mapped (end before start, a latency out of range) is rejected with a reason;
  :func:`decode_traces` reports it for OTLP's ``partial_success``. Its ids never cost it (the metrics do not need
  them, and the Collector's spanmetrics connector counts such spans too): a trace id that cannot be used
  (:mod:`.trace_ids`: 16 bytes, or 8 left-padded with zeros; in OTLP JSON also a UUID's 32 digits) is dropped and a
  span id that cannot be used is ignored, each counted as a warning (``bad trace_id``, ``bad span_id``);
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
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ..errors import OtlpError
from .batches import EventBatch
from .endpoints import EndpointRules
from .options import InputOptions
from .span_columns import span_columns
from .span_events import TracesResult, decode_halves, map_columns, map_proto_exports
from .spans import SpanMapping
from .trace_ids import trace_id_bytes

__all__ = ["TracesResult", "decode_traces", "decode_otlp_lines", "decode_proto_exports", "map_columns", "map_spans"]


def decode_traces(body: bytes, *, json_body: bool, mapping: SpanMapping, endpoints: EndpointRules) -> TracesResult:
    """An ``ExportTraceServiceRequest`` (protobuf, or OTLP JSON if ``json_body``) -> events. Raises
    :class:`OtlpError` for a body that does not decode at all."""
    request = ExportTraceServiceRequest()
    if json_body:
        try:
            document = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # (nesting past Python's recursion limit)
            raise OtlpError(f"invalid JSON: {exc}") from None
        if not isinstance(document, dict):
            raise OtlpError("invalid OTLP JSON: not an object")
        if document and "resourceSpans" not in document and "resource_spans" not in document:
            # ParseDict skips unknown fields: any other object would be an export of no span, its line lost unseen
            # (an events file given an OTLP suffix); {} stays the empty export it is
            raise OtlpError("invalid OTLP JSON: no resourceSpans")
        _hex_ids_to_base64(document)
        try:
            json_format.ParseDict(document, request, ignore_unknown_fields=True)
        except (json_format.ParseError, RecursionError) as exc:
            raise OtlpError(f"invalid OTLP JSON: {str(exc).splitlines()[0]}") from None
        body = request.SerializeToString()  # one mapping, on the wire form
    else:
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise OtlpError(f"invalid OTLP protobuf: {exc}") from None
    return map_spans(body, mapping, endpoints)


def decode_proto_exports(
    exports: Sequence[bytes | memoryview], options: InputOptions
) -> tuple[EventBatch, list[tuple[int, Any, str]]]:
    """OTLP protobuf exports as they come in bodies and messages -> their events and ``(export index, raw, reason)``
    rejects, as :func:`~.formats.otlp_format.decode_exports` gives them for OTLP JSON: an export rejected whole is
    ``(index, its bytes, the reason decode_traces raises)``, a span ``(index, {"span": its index in the export},
    reason)``, in export order.

    The exports are read, judged and mapped to events in one C pass over their wire bytes
    (:func:`~.span_events.map_proto_exports`); an export the pass declines, and every export where it is not built
    or is off, is decoded by the reference (:func:`decode_traces`), which accepts it or says why not. Exports whose
    events take more than 2 GiB of text in a column are decoded apart (:func:`~.span_events.decode_halves`)."""
    try:
        return _decode_proto(exports, options)
    except OverflowError:
        return decode_halves(0, len(exports), lambda lo, hi: _decode_proto(exports[lo:hi], options, lo),
                             lambda k: bytes(exports[k]))  # fmt: skip


def _decode_proto(
    exports: Sequence[bytes | memoryview], options: InputOptions, first: int = 0
) -> tuple[EventBatch, list[tuple[int, Any, str]]]:
    """:func:`decode_proto_exports` of ``exports``, the first numbered ``first`` in the rejects."""
    mapped = map_proto_exports(exports, options.spans, options.endpoints)
    batches: list[EventBatch] = []
    bad: list[tuple[int, Any, str]] = []
    declined: Sequence[int] = range(len(exports))
    if mapped is not None:
        events, span_rejects, declined, _ = mapped
        if events.num_rows:
            batches.append(events)
        bad += span_rejects
    for k in declined:
        export = bytes(exports[k])
        try:
            one = decode_traces(export, json_body=False, mapping=options.spans, endpoints=options.endpoints)
        except OtlpError as exc:
            bad.append((k, export, str(exc)))
            continue
        if one.batch.num_rows:
            batches.append(one.batch)
        bad += [(k, {"span": index}, reason) for index, reason in one.rejects]
    if declined:
        bad.sort(key=lambda reject: reject[0])  # export order (the sort is stable: spans stay in order)
    if first:
        bad = [(k + first, raw, reason) for k, raw, reason in bad]
    return EventBatch.join(batches), bad


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


# ---------------------------------------------------------------------------------------------- OTLP JSON ids

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids_to_base64(document: dict[str, Any]) -> None:
    """OTLP JSON carries ids as hex; protobuf's JSON mapping wants base64. An id that is not hex (or not a string)
    becomes empty, so that its span is mapped without it (and counted as a warning) instead of failing the whole
    request. A span's trace id follows the trace id rule of every input (:func:`~.trace_ids.trace_id_bytes`: a
    UUID's dashes are read too)."""
    for holder, is_span in _id_holders(document):
        for key in _ID_FIELDS:
            value = holder.get(key)
            if value is None:  # (absent, or null: protobuf's default, the empty id)
                continue
            if is_span and key == "traceId":
                raw = trace_id_bytes(value) or b""
            else:
                try:
                    raw = bytes.fromhex(value) if isinstance(value, str) else b""
                except ValueError:
                    raw = b""
            holder[key] = base64.b64encode(raw).decode()


def _id_holders(document: dict[str, Any]) -> Iterator[tuple[dict[str, Any], bool]]:
    """The spans (``True``) and their links (``False``) of an export."""
    for rs in _list(document.get("resourceSpans", document.get("resource_spans"))):
        for ss in _list(rs.get("scopeSpans", rs.get("scope_spans"))) if isinstance(rs, dict) else ():
            for span in _list(ss.get("spans")) if isinstance(ss, dict) else ():
                if isinstance(span, dict):
                    yield span, True
                    for link in _list(span.get("links")):
                        if isinstance(link, dict):
                            yield link, False


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
