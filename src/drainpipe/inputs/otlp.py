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
import pyarrow.compute as pc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .endpoints import EndpointRules
from .options import InputOptions
from .records import EVENT_SCHEMA, LATENCY_MAX_MS, ReadStats, join_events, mark_requests
from .span_columns import Attributes, byte_lengths, span_columns
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
        body = request.SerializeToString()  # one mapping, on the wire form
    else:
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise OtlpError(f"invalid OTLP protobuf: {exc}") from None
    return map_spans(body, mapping, endpoints, stats)


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
    body: bytes, mapping: SpanMapping, endpoints: EndpointRules, stats: ReadStats | None = None
) -> TracesResult:
    """The mapping of the module docstring over an export's wire bytes (decoded once already by the official
    classes, which judged them valid).

    The per-span work is the whole cost of OTLP ingest, so it is done on columns (:mod:`.span_columns`), a whole
    export at a time, never a Python object per span or field. The rows it builds are valid by construction:
    protobuf strings are valid UTF-8, a service is never empty, and an end time (uint64 nanoseconds) is always within
    the event timestamp range, so of the event rules only the latency bound is left to check here."""
    columns = span_columns(body)
    n = columns.spans
    services, instances = _resource_fields(columns.resource_attributes, columns.resources, mapping)
    # which spans are events: requests, and CLIENT spans with a statement (exit rows)
    attrs = columns.attributes
    names = list(dict.fromkeys(mapping.endpoint + mapping.http_status + mapping.statement))
    codes, has_text = attrs.key_codes(names), attrs.text_lengths() > 0
    kind = columns.kind
    request_kinds = np.zeros(len(KINDS) + 2, bool)  # by kind; the last entry for a kind OTLP does not define
    request_kinds[[KINDS[k] for k in mapping.request_kinds]] = True
    is_request = request_kinds[np.where((kind >= 0) & (kind <= len(KINDS)), kind, len(KINDS) + 1)]
    statement = _first(attrs.owner, _ranks(codes, names, mapping.statement), has_text, n)
    is_exit = ~is_request & (kind == _CLIENT) & (statement >= 0)
    # the checks, in this order: the first that fails is the reason
    trace_id, span_id = columns.trace_id, columns.span_id
    start, end = columns.start, columns.end
    backwards = end < start
    latency = np.where(backwards, 0, end - start).astype(np.float64) / 1e6  # as Python's (end - start) / 1e6
    reason = np.select(
        [
            ~_is_id(trace_id, 16),
            ~_is_id(span_id, 8),
            backwards,
            latency > LATENCY_MAX_MS,
        ],
        [1, 2, 3, 4],
        0,
    )
    mapped = is_request | is_exit
    good = mapped & (reason == 0)
    code = columns.status_code
    ok = code != _STATUS_ERROR
    unset_server = good & ok & (code == _STATUS_UNSET) & (kind == _SERVER)
    if unset_server.any():  # a SERVER span with status UNSET fails with an HTTP status >= 500
        status, is_status = _http_statuses(attrs, codes, names, mapping.http_status)
        pair = _first(attrs.owner, _ranks(codes, names, mapping.http_status), is_status, n)
        judged = unset_server & (pair >= 0)
        ok[judged] = status[pair[judged]] < 500
    rows = np.flatnonzero(good & is_request)
    exits = np.flatnonzero(good & is_exit)
    # endpoint = the first endpoint attribute, else the span name, normalized once per distinct value
    endpoint = _first(attrs.owner, _ranks(codes, names, mapping.endpoint), has_text, n)[rows]
    raw = pa.concat_arrays([attrs.text, columns.name]).take(
        pa.array(np.where(endpoint >= 0, endpoint, len(attrs.text) + rows))
    )
    distinct = raw.dictionary_encode()
    normalize = endpoints.normalize
    templates = pa.array([normalize(e) for e in distinct.dictionary.to_pylist()], pa.string())
    endpoint_column, statement_column = templates.take(distinct.indices), pa.nulls(len(rows), pa.string())
    if len(exits):  # exit rows after the requests: no endpoint, their statement
        endpoint_column = pa.concat_arrays([endpoint_column, pa.array([""] * len(exits), pa.string())])
        statement_column = pa.concat_arrays([statement_column, attrs.text.take(pa.array(statement[exits]))])
        rows = np.concatenate([rows, exits])
    where = pa.array(columns.resource[rows])
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array((end[rows] // np.uint64(1_000_000)).astype(np.int64)),  # exactly as Python's end // 1_000_000
            services.take(where),
            instances.take(where),
            endpoint_column,
            pa.array(latency[rows]),
            pa.array(ok[rows]),
            statement_column,
        ],
        schema=EVENT_SCHEMA,
    )
    bad = [(int(i), _REASONS[reason[i]]) for i in np.flatnonzero(mapped & (reason > 0))]
    if stats is not None:
        stats.add_accepted(len(rows))
        for _, why in bad:
            stats.add_rejected(why)
    return TracesResult(mark_requests(batch, len(rows) - len(exits)), bad, n)


_REASONS = {1: "bad value: trace_id", 2: "bad value: span_id", 3: "bad value: end before start",
            4: "out of range: latency_ms"}  # fmt: skip
_NONE = np.iinfo(np.int64).max  # the rank of a key that does not give the field


def _ranks(codes: np.ndarray, names: list[str], keys: tuple[str, ...]) -> np.ndarray:
    """Per attribute (its key's index in ``names``): its key's rank among ``keys`` (lower wins), or :data:`_NONE`."""
    table = np.full(len(names) + 1, _NONE, np.int64)
    for rank, key in reversed(list(enumerate(keys))):  # a key listed twice: its first rank counts
        table[names.index(key)] = rank
    return table[codes]


def _first(owner: np.ndarray, rank: np.ndarray, usable: np.ndarray, owners: int) -> np.ndarray:
    """Per owner: the index of its usable attribute of the lowest rank (the earliest among equals), else -1."""
    out = np.full(owners, -1, np.int64)
    candidates = np.flatnonzero(usable & (rank != _NONE))
    if len(candidates):
        holder = owner[candidates]  # ascending: the pairs are flattened owner by owner
        if len(holder) > 1 and not (holder[1:] != holder[:-1]).all():  # an owner with several: lowest rank first
            candidates = candidates[np.lexsort((rank[candidates], holder))]  # stable: equals keep their order
            holder = owner[candidates]
        order = candidates
        first = np.ones(len(order), bool)
        first[1:] = holder[1:] != holder[:-1]
        out[holder[first]] = order[first]
    return out


def _resource_fields(attrs: Attributes, resources: int, mapping: SpanMapping) -> tuple[pa.Array, pa.Array]:
    """Per resource: its service and its instance (each the non-empty string of its first-ranked key). A loop: an
    export has few resources (usually one), and each few attributes."""
    fields = []
    for keys, default in ((mapping.service, UNKNOWN_SERVICE), (mapping.instance, "")):
        rank_of = {key: rank for rank, key in reversed(list(enumerate(keys)))}
        fields.append((rank_of, [default] * resources, [len(keys)] * resources))
    for owner, key, text in zip(attrs.owner.tolist(), attrs.keys.to_pylist(), attrs.text.to_pylist()):
        for rank_of, values, ranks in fields:
            rank = rank_of.get(key)
            if rank is not None and rank < ranks[owner] and text:
                values[owner], ranks[owner] = text, rank
    return pa.array(fields[0][1], pa.string()), pa.array(fields[1][1], pa.string())


def _http_statuses(
    attrs: Attributes, codes: np.ndarray, names: list[str], keys: tuple[str, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Per attribute: its HTTP status and whether it is one (an integer, or a string of ASCII digits)."""
    status = attrs.integer.copy()
    is_status = attrs.is_integer.copy()
    digits = np.flatnonzero(~is_status & (_ranks(codes, names, keys) != _NONE) & (attrs.text_lengths() > 0))
    for i, text in zip(digits, attrs.text.take(pa.array(digits)).to_pylist()):  # few: statuses are integers
        if text.isascii() and text.isdigit():
            status[i], is_status[i] = min(int(text), 1 << 62), True
    return status, is_status


def _is_id(ids: pa.Array, size: int) -> np.ndarray:
    """Per element: ``size`` bytes, not all zero (an all-zero id is invalid in OTLP)."""
    lengths = byte_lengths(ids)
    if not (lengths == size).all():
        return (lengths == size) & ~pc.equal(ids, pa.scalar(bytes(size), pa.binary())).to_numpy(zero_copy_only=False)
    start = np.frombuffer(ids.buffers()[1], np.int32)[ids.offset]
    words = np.frombuffer(ids.buffers()[2], np.uint8)[start : start + size * len(ids)].view(np.uint64)
    return words != 0 if size == 8 else (words[0::2] | words[1::2]) != 0


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
