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
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Attributes", "SpanColumns", "byte_lengths", "span_columns"]

#: the fields the mapping reads, per message (everything else is skipped while reading)
_PROJECTION = {
    "opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest": ("resource_spans",),
    "opentelemetry.proto.trace.v1.ResourceSpans": ("resource", "scope_spans"),
    "opentelemetry.proto.resource.v1.Resource": ("attributes",),
    "opentelemetry.proto.trace.v1.ScopeSpans": ("spans",),
    "opentelemetry.proto.trace.v1.Span": (
        "trace_id",
        "span_id",
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
    """Key/value pairs of several owners, flattened: ``owner[i]`` is the index of the owner (resource or span) of
    pair ``i``; ``text`` is its string value ("" when it has none), ``integer`` its integer value and
    ``is_integer`` whether it has one."""

    owner: np.ndarray
    keys: pa.Array
    text: pa.Array
    integer: np.ndarray
    is_integer: np.ndarray

    def key_codes(self, names: list[str]) -> np.ndarray:
        """Each pair's key as an index into ``names`` (len(names) when it is none of them)."""
        if not len(self.keys):
            return np.zeros(0, np.int64)
        encoded = self.keys.dictionary_encode()
        where = {name: i for i, name in enumerate(names)}
        table = np.array([where.get(k, len(names)) for k in encoded.dictionary.to_pylist()], np.int64)
        return table[encoded.indices.to_numpy()]

    def text_lengths(self) -> np.ndarray:
        """The length in bytes of each pair's string value (0 when it has none)."""
        return byte_lengths(self.text)


@dataclass(frozen=True)
class SpanColumns:
    """One export's spans, in export order, as columns: ``resource[i]`` is the index of span ``i``'s resource."""

    spans: int
    resource: np.ndarray
    kind: np.ndarray
    trace_id: pa.Array
    span_id: pa.Array
    name: pa.Array
    start: np.ndarray
    end: np.ndarray
    status_code: np.ndarray
    attributes: Attributes
    resource_attributes: Attributes
    resources: int


def span_columns(body: bytes) -> SpanColumns:
    """An ``ExportTraceServiceRequest``'s wire bytes -> its spans as columns. Raises ``ValueError`` for bytes that
    do not decode (callers have already decoded them with the official classes)."""
    batch = _reader().list_to_record_batch([body])
    resource_spans, _ = _flatten(batch.column(0))
    resource = resource_spans.field("resource")  # null when absent: then it has no attributes
    scope_spans, scope_owner = _flatten(resource_spans.field("scope_spans"))
    spans, span_scope = _flatten(scope_spans.field("spans"))
    status = spans.field("status")  # null when absent: UNSET
    return SpanColumns(
        spans=len(spans),
        resource=scope_owner[span_scope],
        kind=_numbers(spans.field("kind")),
        trace_id=spans.field("trace_id"),
        span_id=spans.field("span_id"),
        name=spans.field("name"),
        start=_numbers(spans.field("start_time_unix_nano")),
        end=_numbers(spans.field("end_time_unix_nano")),
        status_code=_numbers(status.field("code"), _valid(status)),
        attributes=_attributes(spans.field("attributes")),
        resource_attributes=_attributes(resource.field("attributes"), _valid(resource)),
        resources=len(resource_spans),
    )


def _flatten(lists: pa.Array, present: np.ndarray | None = None) -> tuple[pa.Array, np.ndarray]:
    """A list column -> its values and, per value, the index of the list that holds it. ``present``: which lists
    count (a list under an absent message holds nothing, whatever the column says)."""
    offsets = np.frombuffer(lists.buffers()[1], np.int32)[lists.offset : lists.offset + len(lists) + 1]
    counts = np.diff(offsets)
    owner = np.repeat(np.arange(len(lists)), counts)
    values = lists.values  # (a fresh reader's lists start at 0 and cover their values: no slicing needed)
    if len(offsets) and (offsets[0] != 0 or offsets[-1] != len(values)):
        values = lists.flatten()
    if present is not None and not present.all():
        keep = np.repeat(present, counts)
        return values.filter(pa.array(keep)), owner[keep]
    return values, owner


def _attributes(lists: pa.Array, present: np.ndarray | None = None) -> Attributes:
    pairs, owner = _flatten(lists, present)
    value = pairs.field("value")  # null when a pair has no value: then it is neither a string nor an integer
    has_value = _valid(value)
    text = value.field("string_value")
    integer = value.field("int_value")
    is_integer = _valid(integer) & has_value
    if text.null_count or not has_value.all():
        text = pc.if_else(pa.array(has_value & _valid(text)), text, "")
    return Attributes(owner, pairs.field("key"), text, _numbers(integer, is_integer), is_integer)


def byte_lengths(array: pa.Array) -> np.ndarray:
    """Per element of a string or binary column: its length in bytes (read from the offsets: no copy)."""
    offsets = np.frombuffer(array.buffers()[1], np.int32)[array.offset : array.offset + len(array) + 1]
    return np.diff(offsets)


def _numbers(array: pa.Array, present: np.ndarray | None = None) -> np.ndarray:
    """A numeric column's values, 0 where null or not ``present`` (read from the buffer: pyarrow's ``to_numpy``
    imports pandas the first time, ~0.15 s)."""
    dtype = array.type.to_pandas_dtype()
    values = np.frombuffer(array.buffers()[1], dtype)[array.offset : array.offset + len(array)]
    if array.null_count:
        present = _valid(array) if present is None else present & _valid(array)
    return values if present is None or present.all() else np.where(present, values, 0).astype(dtype)


def _valid(array: pa.Array) -> np.ndarray:
    """Per element: not null."""
    if array.null_count == 0:
        return np.ones(len(array), bool)
    bits = np.frombuffer(array.buffers()[0], np.uint8)
    return np.unpackbits(bits, bitorder="little")[array.offset : array.offset + len(array)].astype(bool)


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
