"""Spans in columns -> request events: the OTLP mapping of :mod:`.otlp` (its docstring states the rules), over
:class:`~.span_columns.SpanColumns` however they were read (an export's wire form by ptars, OTLP JSON lines by the
C pass or :mod:`.span_json`). No protobuf here: Spark executors map OTLP JSON files with this module alone. The
per-span passes are C (``drainpipe.native.spanmap``), or where it is not built or is off the same in numpy
(:mod:`._spanmap_fallback`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from .. import native
from . import _spanmap_fallback
from .batches import EventBatch
from .endpoints import EndpointRules
from .sampling import adjusted_counts
from .schema import EVENT_SCHEMA, LATENCY_MAX_MS, TRACE_ID
from .span_columns import Attributes, SpanColumns
from .spans import KINDS, SpanMapping
from .trace_ids import BAD_TRACE_ID, trace_id_column

__all__ = [
    "Mapped",
    "TracesResult",
    "UNKNOWN_SERVICE",
    "BAD_SPAN_ID",
    "TOO_LARGE",
    "decode_halves",
    "map_columns",
    "map_json_block",
    "map_proto_exports",
]

_SERVER = KINDS["server"]
_CLIENT = KINDS["client"]
UNKNOWN_SERVICE = "unknown_service"
#: the warning reason of a span mapped without its span id (which only seeds the rounding of a sampled span's count)
BAD_SPAN_ID = "bad span_id"
#: the reason of an export (a line of OTLP JSON) rejected whole because its events take more than 2 GiB of text in
#: a column (Arrow's offsets are 32-bit): a resource that repeats a long value on every span of a large export
TOO_LARGE = "too large: events past 2 GiB of text"

Decoded = tuple[EventBatch, list[tuple[int, Any, str]]]


def decode_halves(lo: int, hi: int, decode: Callable[[int, int], Decoded], whole: Callable[[int], Any]) -> Decoded:
    """Exports (or lines) ``[lo, hi)``, whose events together raised :class:`OverflowError` in ``decode(lo, hi)``
    (events and ``(index, raw, reason)`` rejects, indexes as the caller numbers them), decoded half by half; one that
    overflows alone is rejected whole, ``(lo, whole(lo), TOO_LARGE)``. The halves' events are joined into one
    batch, which raises :class:`OverflowError` again where even they do not fit one (never rows dropped)."""
    if hi - lo == 1:
        return EventBatch.join([]), [(lo, whole(lo), TOO_LARGE)]
    mid = (lo + hi) // 2
    batches: list[EventBatch] = []
    bad: list[tuple[int, Any, str]] = []
    for a, b in ((lo, mid), (mid, hi)):
        try:
            batch, rejects = decode(a, b)
        except OverflowError:
            batch, rejects = decode_halves(a, b, decode, whole)
        if batch.num_rows:
            batches.append(batch)
        bad += rejects
    return EventBatch.join(batches), bad


@dataclass
class TracesResult:
    """A decoded export: ``batch`` (requests, then exit rows, marked; its warnings count the requests counted 1
    for a sampling threshold that could not be used, and the events whose trace id or span id could not be used),
    ``rejects`` as (span index, reason), and the number of spans looked at (``spans``; the ones that are neither
    requests nor exits are not events)."""

    batch: EventBatch
    rejects: list[tuple[int, str]]
    spans: int


def map_columns(columns: SpanColumns, mapping: SpanMapping, endpoints: EndpointRules) -> TracesResult:
    """The mapping of :func:`map_spans`, over spans already in columns (one export's, or a block of OTLP JSON
    lines'). Raises :class:`OverflowError` where the events would take more than 2 GiB of text in a column, as the
    C passes do (pyarrow's take says so as ArrowInvalid or ArrowCapacityError)."""
    try:
        return _map_columns(columns, mapping, endpoints)
    except (pa.ArrowCapacityError, pa.ArrowInvalid) as exc:
        if "overflow" not in str(exc):
            raise
        raise OverflowError(f"more than 2 GiB of text in one column ({exc})") from exc


def _map_columns(columns: SpanColumns, mapping: SpanMapping, endpoints: EndpointRules) -> TracesResult:
    n = columns.spans
    resource = columns.resource_attributes
    attrs = columns.attributes
    service, instance = _pick(resource, (mapping.service, mapping.instance))
    http_status = np.empty(n, np.int64)
    endpoint, statement, _ = _pick(attrs, (mapping.endpoint, mapping.statement, mapping.http_status), http_status)
    category, ok, latency = np.empty(n, np.int8), np.empty(n, np.bool_), np.empty(n, np.float64)
    request_kinds = sum(1 << KINDS[k] for k in mapping.request_kinds)
    spanmap = native.spanmap
    classify = spanmap.classify if spanmap is not None else _spanmap_fallback.classify
    bad_trace, bad_span = classify(*columns.buffers(), statement, http_status, request_kinds, _CLIENT, _SERVER,
                                   float(LATENCY_MAX_MS), category, ok, latency)  # fmt: skip
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
    for reason, k in ((BAD_TRACE_ID, bad_trace), (BAD_SPAN_ID, bad_span)):  # (mapped all the same, see classify)
        if k:
            warnings[reason] += k
    events = EventBatch(batch, len(requests), tuple(warnings.items()))
    if mapping.trace_ids:  # for exemplars (``[prometheus] exemplars``): 20 more bytes a span through the pipeline
        traces, _ = trace_id_column(columns.trace_id.take(pa.array(rows)))  # (a 64-bit id padded, a bad one null)
        if traces.null_count < len(traces):  # (else none is kept: no column, as for events without trace ids)
            events = events.with_column(TRACE_ID, traces)
    if weights is not None:  # exit rows count nothing: 1 each
        events = events.with_weights(np.concatenate([weights, np.ones(len(rows) - len(requests), np.int64)]))
    bad = [(int(i), _REASONS[int(category[i])]) for i in np.flatnonzero(category < 0)]
    return TracesResult(events, bad, n)


_REASONS = {-3: "bad value: end before start", -4: "out of range: latency_ms"}


class Mapped(NamedTuple):
    """What a pass's mapping gives."""

    events: EventBatch
    #: ``(export, {"span": its index in the export}, reason)`` per rejected span
    rejects: list[tuple[int, dict[str, int], str]]
    #: the exports it declined (for the reference)
    declined: list[int]
    #: per export, its events (requests and exit rows; the C passes: for a caller that answers per export)
    per_export: np.ndarray | None = None


def map_proto_exports(
    exports: Sequence[bytes | memoryview], mapping: SpanMapping, endpoints: EndpointRules
) -> Mapped | None:
    """OTLP protobuf exports -> their events in one C pass from the wire bytes, the mapping of :func:`map_columns`
    done inside it (``native.otlpproto.events``). Python only normalizes the distinct endpoints and wraps the
    columns. None where the pass is not built or is off."""
    otlpproto = native.otlpproto
    if otlpproto is None:
        return None
    return _mapped(otlpproto, otlpproto.events(exports, *_mapping_args(mapping)), mapping, endpoints)


def map_json_block(
    data: bytes | memoryview, count: int, mapping: SpanMapping, endpoints: EndpointRules
) -> Mapped | None:
    """A block of ``count`` OTLP JSON lines (an export each; blank lines allowed) -> their events in one C pass, as
    :func:`map_proto_exports` (``native.otlpjson.events``); an export is a line. None where the pass is not built or
    is off."""
    otlpjson = native.otlpjson
    if otlpjson is None:
        return None
    out = otlpjson.events(data, count, *_mapping_args(mapping))
    if out is None:
        raise ValueError(f"an OTLP JSON block of {count} lines does not hold {count} lines")
    return _mapped(otlpjson, out, mapping, endpoints)


def _mapping_args(mapping: SpanMapping) -> tuple[Any, ...]:
    """The mapping as the C passes' ``events`` take it (after the exports)."""
    request_kinds = sum(1 << KINDS[k] for k in mapping.request_kinds)
    span_roles = _roles((mapping.endpoint, mapping.statement, mapping.http_status))
    resource_roles = _roles((mapping.service, mapping.instance))
    return span_roles, resource_roles, request_kinds, _CLIENT, _SERVER, float(LATENCY_MAX_MS)


def _mapped(native_pass: Any, out: tuple[Any, ...], mapping: SpanMapping, endpoints: EndpointRules) -> Mapped:
    """A C pass's events tuple (``_otlpproto.pyi``) as an :class:`EventBatch`, rejects and declined exports.

    No pyarrow compute and no numpy pass over the rows here: on the connection loop, each such call lets the GIL go,
    and under load winning it back cost more than the work (the endpoints come dictionary-encoded from the pass, and
    their column is gathered by ``native_pass.gather``)."""
    (declined, n, requests, rows, ts, latency, ok, svc_off, svc, inst_off, inst, raw_endpoints, codes, st_off, st,
     st_valid, rej_export, rej_index, rej_cat, bad_trace, bad_span, tid_off, tid, sid_off, sid, xoff, xdata,
     per_export) = out  # fmt: skip
    m = len(rows) // 8
    # endpoint: the chosen attribute or the span's name, normalized once per distinct value; "" for exit rows
    normalize = endpoints.normalize
    templates = [normalize(e) for e in raw_endpoints]
    templates.append("")
    ep_off, ep = native_pass.gather(codes, templates)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.Array.from_buffers(pa.int64(), m, [None, pa.py_buffer(ts)]),
            _strings(m, svc_off, svc),
            _strings(m, inst_off, inst),
            _strings(m, ep_off, ep),
            pa.Array.from_buffers(pa.float64(), m, [None, pa.py_buffer(latency)]),
            pa.Array.from_buffers(pa.bool_(), m, [None, pa.py_buffer(ok)]),
            _strings(m, st_off, st, st_valid),  # null for requests
        ],
        schema=EVENT_SCHEMA,
    )
    index = np.frombuffer(rows, np.int64)
    weights, warnings = adjusted_counts(_strings(n, xoff, xdata), _binary(n, sid_off, sid), index[:requests])
    for reason, k in ((BAD_TRACE_ID, bad_trace), (BAD_SPAN_ID, bad_span)):
        if k:
            warnings[reason] += k
    events = EventBatch(batch, requests, tuple(warnings.items()))
    if mapping.trace_ids:
        traces, _ = trace_id_column(_binary(n, tid_off, tid).take(pa.array(index)))
        if traces.null_count < len(traces):
            events = events.with_column(TRACE_ID, traces)
    if weights is not None:
        events = events.with_weights(np.concatenate([weights, np.ones(m - requests, np.int64)]))
    rejects = [(int(k), {"span": int(j)}, _REASONS[c]) for k, j, c in
               zip(np.frombuffer(rej_export, np.int32), np.frombuffer(rej_index, np.int32),
                   np.frombuffer(rej_cat, np.int8))]  # fmt: skip
    return Mapped(events, rejects, declined, np.frombuffer(per_export, np.int64))


def _roles(fields: tuple[tuple[str, ...], ...]) -> list[tuple[bytes, int, int]]:
    """Per field (a list of keys each, lower rank first): ``(key, field, rank)`` for the C passes."""
    return [(key.encode(), field, rank) for field, keys in enumerate(fields) for rank, key in enumerate(keys)]


def _strings(n: int, offsets: bytes, data: bytes, valid: bytes | None = None) -> pa.Array:
    return pa.Array.from_buffers(pa.string(), n, [None if valid is None else pa.py_buffer(valid),
                                                  pa.py_buffer(offsets), pa.py_buffer(data)])  # fmt: skip


def _binary(n: int, offsets: bytes, data: bytes) -> pa.Array:
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _pick(attrs: Attributes, fields: tuple[tuple[str, ...], ...], status: np.ndarray | None = None) -> np.ndarray:
    """Per field (a list of keys each, lower rank first), per owner: the index of the attribute that gives it, or -1.
    With ``status``, the last field is the HTTP status, whose value goes there (-1 for none)."""
    roles = _roles(fields)
    out = np.empty((len(fields), attrs.owners), np.int64)
    status_field = len(fields) - 1 if status is not None else -1
    spanmap = native.spanmap
    pick = spanmap.pick if spanmap is not None else _spanmap_fallback.pick
    pick(attrs.owners, *attrs.buffers(), roles, len(fields), status_field, out, status)
    return out
