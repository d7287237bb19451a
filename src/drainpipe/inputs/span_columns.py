"""An OTLP trace export's wire bytes -> the columns the span mapping reads, with no Python object per field.

Reading a span through protobuf's Python objects builds a wrapper per field and per attribute (~1.3 us per span
for the handful the mapping needs), several times what the rest of OTLP ingest costs. Here the export is read by
ptars (protobuf -> Apache Arrow, in Rust) into Arrow columns, driven by the official ``opentelemetry-proto``
descriptors *projected* to the fields the mapping reads: the other fields are skipped as unknown ones, as any
protobuf reader skips fields it does not know, and cost no column. Nothing here parses the wire format by hand.

The projection drops fields, never changes one: the numbers, types and enums are the official ones. One consequence
of reading only ``string_value`` and ``int_value`` of an ``AnyValue``: a value of another type reads as neither,
which is what the mapping wants (an endpoint or statement must be a string, an HTTP status an integer or digits).

Callers decode each export with the official message classes first (they are the authority on what is valid: an
undecodable body is their error); a body they accept, ptars reads the same way.

This is the reference road. Both wire formats take a shorter one to the same columns, one C pass that reads and
judges at once, accepting only exports whose meaning under the official decoding is beyond doubt and handing the
others back to it: :func:`json_span_columns` for a block of OTLP JSON lines (``native.otlpjson``),
:func:`proto_span_columns` for protobuf exports (``native.otlpproto``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .. import native

__all__ = ["Attributes", "ScannedSpans", "SpanColumns", "json_span_columns", "proto_span_columns", "span_columns"]

#: the fields the mapping reads, per message (everything else is skipped while reading)
_PROJECTION = {
    "opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest": ("resource_spans",),
    "opentelemetry.proto.trace.v1.ResourceSpans": ("resource", "scope_spans"),
    "opentelemetry.proto.resource.v1.Resource": ("attributes",),
    "opentelemetry.proto.trace.v1.ScopeSpans": ("spans",),
    "opentelemetry.proto.trace.v1.Span": (
        "trace_id",
        "span_id",
        "trace_state",
        "name",
        "kind",
        "start_time_unix_nano",
        "end_time_unix_nano",
        "attributes",
        "status",
    ),  # fmt: skip
    "opentelemetry.proto.trace.v1.Status": ("code",),
    "opentelemetry.proto.common.v1.KeyValue": ("key", "value"),
    "opentelemetry.proto.common.v1.AnyValue": ("string_value", "int_value"),
}


@dataclass(frozen=True)
class Attributes:
    """Key/value pairs of several owners (spans, or resources), flattened: owner ``i``'s pairs are
    ``offsets[i]:offsets[i + 1]``, and an owner that is not ``present`` (an absent resource) has none.
    ``value_valid`` is the validity bitmap of the pairs' values (a pair may have none; None: all have one); ``text``
    is a pair's string value (null when it is not a string), ``integer`` its integer value (null when it is not an
    integer)."""

    owners: int
    offsets: np.ndarray
    present: pa.Buffer | None
    keys: pa.Array
    value_valid: pa.Buffer | None
    text: pa.Array
    integer: pa.Array

    def buffers(self) -> tuple[Any, Any, Any, Any, Any, Any, Any, Any, Any, Any]:
        """The buffers :func:`drainpipe.native.spanmap.pick` reads, in its order (after the owner count)."""
        keys, text, integer = self.keys.buffers(), self.text.buffers(), self.integer.buffers()
        return (self.offsets, self.present, keys[1], keys[2], self.value_valid, _validity(self.text), text[1],
                text[2], _validity(self.integer), integer[1])  # fmt: skip


@dataclass(frozen=True)
class SpanColumns:
    """Spans, in export order, as Arrow columns (unsliced); ``resource[i]`` is the index of span ``i``'s resource;
    ``status_valid`` is the validity bitmap of the spans' statuses (None: every span has one) and ``status_code``
    their codes; ``trace_state`` their W3C trace states (empty for none)."""

    spans: int
    resources: int
    resource: np.ndarray
    kind: pa.Array
    trace_id: pa.Array
    span_id: pa.Array
    trace_state: pa.Array
    name: pa.Array
    start: pa.Array
    end: pa.Array
    status_valid: pa.Buffer | None
    status_code: pa.Array
    attributes: Attributes
    resource_attributes: Attributes

    def buffers(self) -> tuple[Any, Any, Any, Any, Any, Any, Any, Any, Any]:
        """The buffers :func:`drainpipe.native.spanmap.classify` reads first, in its order."""
        tid, sid = self.trace_id.buffers(), self.span_id.buffers()
        return (self.kind.buffers()[1], self.start.buffers()[1], self.end.buffers()[1], self.status_valid,
                self.status_code.buffers()[1], tid[1], tid[2], sid[1], sid[2])  # fmt: skip


def span_columns(body: bytes) -> SpanColumns:
    """An ``ExportTraceServiceRequest``'s wire bytes -> its spans as columns. Raises ``ValueError`` for bytes that
    do not decode (callers have already decoded them with the official classes)."""
    batch = _reader().list_to_record_batch([body])
    resource_spans, _ = _values(batch.column(0))
    resource = resource_spans.field("resource")  # null when absent: then it has no attributes
    scope_spans, scope_owner = _values(resource_spans.field("scope_spans"))
    spans, span_scope = _values(scope_spans.field("spans"))
    status = spans.field("status")
    return SpanColumns(
        spans=len(spans),
        resources=len(resource_spans),
        resource=scope_owner[span_scope],
        kind=spans.field("kind"),
        trace_id=spans.field("trace_id"),
        span_id=spans.field("span_id"),
        trace_state=spans.field("trace_state"),
        name=spans.field("name"),
        start=spans.field("start_time_unix_nano"),
        end=spans.field("end_time_unix_nano"),
        status_valid=_validity(status),
        status_code=status.field("code"),
        attributes=_attributes(spans.field("attributes"), None),
        resource_attributes=_attributes(resource.field("attributes"), _validity(resource)),
    )


@dataclass(frozen=True)
class ScannedSpans:
    """The spans of a block of exports (OTLP JSON lines, or protobuf messages) read by a scanner: ``columns`` hold
    the spans of every export but the ``declined`` ones (indexes into the block, for the reference decoder), and
    ``line[i]`` is the index of span ``i``'s export."""

    columns: SpanColumns
    line: np.ndarray
    declined: list[int]

    def span_rejects(self, rejects: list[tuple[int, str]], first: int = 0) -> list[tuple[int, dict[str, int], str]]:
        """The mapping's ``(span index, reason)`` rejects of these columns as ``(first + export index, {"span":
        the span's index in its export}, reason)``."""
        if not rejects:
            return []
        index = np.array([i for i, _ in rejects], np.int64)
        exports = self.line[index]
        in_export = index - np.searchsorted(self.line, exports)  # (line holds sorted values)
        return [(first + int(k), {"span": int(j)}, why) for k, j, (_, why) in zip(exports, in_export, rejects)]


def json_span_columns(data: bytes | memoryview, count: int) -> ScannedSpans | None:
    """A block of ``count`` OTLP JSON lines (one export each, blank lines allowed) -> its spans as columns, in one
    C pass; None where the pass is not built or is off (:mod:`drainpipe.native`'s ``otlpjson``)."""
    otlpjson = native.otlpjson
    if otlpjson is None:
        return None
    scanned = otlpjson.scan(data, count)
    if scanned is None:
        raise ValueError(f"an OTLP JSON block of {count} lines does not hold {count} lines")
    return _scanned(scanned)


def proto_span_columns(exports: Sequence[bytes | memoryview]) -> ScannedSpans | None:
    """OTLP protobuf exports (an ``ExportTraceServiceRequest`` each) -> their spans as columns, in one C pass over
    the wire bytes that also judges them: an export it cannot vouch for is declined, for the reference (the official
    classes, then :func:`span_columns`). None where the pass is not built or is off (``otlpproto``)."""
    otlpproto = native.otlpproto
    if otlpproto is None:
        return None
    return _scanned(otlpproto.scan(exports))


def _scanned(scanned: tuple[Any, ...]) -> ScannedSpans:
    """A scanner's tuple (``_otlpjson.pyi``) as columns."""
    declined, n, resources, line, resource, kind, start, end, code = scanned[:9]
    toff, tdata, soff, sdata, noff, ndata, xoff, xdata = scanned[9:17]
    columns = SpanColumns(
        spans=n,
        resources=resources,
        resource=np.frombuffer(resource, np.int64),
        kind=_fixed(pa.int32(), n, kind),
        trace_id=_binary(pa.binary(), n, toff, tdata),
        span_id=_binary(pa.binary(), n, soff, sdata),
        trace_state=_binary(pa.string(), n, xoff, xdata),
        name=_binary(pa.string(), n, noff, ndata),
        start=_fixed(pa.uint64(), n, start),
        end=_fixed(pa.uint64(), n, end),
        status_valid=None,  # an absent status is code 0 (UNSET), as the mapping reads one
        status_code=_fixed(pa.int32(), n, code),
        attributes=_pool_attributes(scanned[17]),
        resource_attributes=_pool_attributes(scanned[18]),
    )
    return ScannedSpans(columns, np.frombuffer(line, np.int32), declined)


def _pool_attributes(pool: tuple[Any, ...]) -> Attributes:
    owners, offsets, koff, kdata, vvalid, tvalid, toff, tdata, ivalid, idata = pool
    rows = len(koff) // 4 - 1
    return Attributes(
        owners,
        np.frombuffer(offsets, np.int32),
        None,
        _binary(pa.string(), rows, koff, kdata),
        None if vvalid is None else pa.py_buffer(vvalid),
        _binary(pa.string(), rows, toff, tdata, tvalid),
        _fixed(pa.int64(), rows, idata, ivalid),
    )


def _fixed(kind: pa.DataType, n: int, data: bytes, valid: bytes | None = None) -> pa.Array:
    return pa.Array.from_buffers(kind, n, [_buffer(valid), pa.py_buffer(data)], null_count=-1 if valid else 0)


def _binary(kind: pa.DataType, n: int, offsets: bytes, data: bytes, valid: bytes | None = None) -> pa.Array:
    return pa.Array.from_buffers(kind, n, [_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=-1 if valid else 0)  # fmt: skip


def _buffer(data: bytes | None) -> pa.Buffer | None:
    return None if data is None else pa.py_buffer(data)


def _values(lists: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """A list column -> its values (the whole child array) and, per value, the index of the list that holds it."""
    offsets = _offsets(lists)
    return _fresh(lists.values), np.repeat(np.arange(len(lists)), np.diff(offsets))


def _attributes(lists: pa.Array, present: pa.Buffer | None) -> Attributes:
    pairs = _fresh(lists.values)
    value = pairs.field("value")
    return Attributes(len(lists), _offsets(lists), present, pairs.field("key"), _validity(value),
                      value.field("string_value"), value.field("int_value"))  # fmt: skip


def _offsets(lists: pa.Array) -> np.ndarray:
    offsets = np.frombuffer(lists.buffers()[1], np.int32)[: len(lists) + 1]
    if lists.offset or (len(offsets) and (offsets[0] != 0 or offsets[-1] != len(lists.values))):
        raise RuntimeError("ptars returned a sliced list column")  # (its batches are fresh: never seen)
    return offsets


def _fresh(array: pa.Array) -> pa.Array:
    """``array``, checked to be unsliced: the kernels read its buffers from their start."""
    if array.offset:
        raise RuntimeError("ptars returned a sliced column")
    return array


def _validity(array: pa.Array) -> pa.Buffer | None:
    """An array's validity bitmap; None when it has no nulls (every element valid)."""
    return array.buffers()[0] if array.null_count else None


@functools.cache
def _reader():  # type: ignore[no-untyped-def]
    """ptars' reader for ``ExportTraceServiceRequest`` over the projected descriptors (built once per process)."""
    import ptars
    from google.protobuf import descriptor_pb2, descriptor_pool
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    files: list = []

    def add(file) -> None:  # type: ignore[no-untyped-def]
        for dependency in file.dependencies:
            add(dependency)
        if file not in files:
            files.append(file)

    add(ExportTraceServiceRequest.DESCRIPTOR.file)
    pool = descriptor_pool.DescriptorPool()
    for file in files:
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        _project(proto.message_type, proto.package)
        pool.Add(proto)
    name = ExportTraceServiceRequest.DESCRIPTOR.full_name
    handlers = ptars.HandlerPool([pool.FindFileByName(files[-1].name)])
    return handlers.get_for_message(pool.FindMessageTypeByName(name))


def _project(messages, scope: str) -> None:  # type: ignore[no-untyped-def]
    for message in messages:
        full_name = f"{scope}.{message.name}"
        keep = _PROJECTION.get(full_name)
        if keep is not None:
            missing = set(keep) - {f.name for f in message.field}
            if missing:  # a field the mapping reads is gone from opentelemetry-proto: fail loudly, not read nothing
                raise RuntimeError(f"opentelemetry-proto's {full_name} has no field {sorted(missing)[0]!r}")
            fields = [f for f in message.field if f.name in keep]
            del message.field[:]
            message.field.extend(fields)
        _project(message.nested_type, full_name)
