"""OTLP protobuf exports read by the C pass (``_otlpproto.c``) give exactly what the reference gives.

The reference is the official classes (upb) judging an export, then ptars reading it (``decode_traces``): it
decides what a valid export is. The pass may decline any export (the reference then reads it), but what it accepts
must map to the same events, rejects and warnings. The exports below are written at the wire level: every field of
every message through the official classes, then raw fields beside them (unknown fields of every wire type, a
group, a duplicate singular field, a known field of another wire type, field number 0, a second oneof member,
negative enums), strings made invalid UTF-8, and bytes truncated or flipped. It also checks that the pass really
takes the common shapes (the OpenTelemetry SDK's exports): declining everything would pass the comparison."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from drainpipe import native
from drainpipe.inputs import span_columns
from drainpipe.inputs.options import InputOptions
from drainpipe.inputs.otlp import decode_proto_exports
from drainpipe.inputs.spans import SpanMapping
from otlp_exports import fuzzed_export

OPTIONS = InputOptions()
TRACED = InputOptions(spans=SpanMapping(trace_ids=True))


# ------------------------------------------------------------------------------------------------- the tests


def _rows(batch: Any) -> list:
    rows = pa.Table.from_batches([batch.rows]).to_pylist()
    return sorted((tuple(r.values()) for r in rows), key=repr)


def _same(exports: list[bytes]) -> list[int]:
    """The pass and the reference over the same exports: the same events (trace ids too), rejects and warnings.
    Returns the exports the pass declined."""
    for options in (OPTIONS, TRACED):
        fast, fast_bad = decode_proto_exports(exports, options)
        with native.disabled("otlpproto"):
            ref, ref_bad = decode_proto_exports(exports, options)
        assert (_rows(fast), fast.requests) == (_rows(ref), ref.requests), exports
        assert fast_bad == ref_bad, exports
        assert dict(fast.warnings) == dict(ref.warnings), exports
    scanned = span_columns.proto_span_columns(exports)
    assert scanned is not None
    return scanned.declined


def test_the_pass_gives_the_reference_result_on_fuzzed_exports() -> None:
    rng = random.Random(55)
    declined = taken = 0
    for _ in range(200):
        exports = [fuzzed_export(rng) for _ in range(rng.randrange(1, 8))]
        d = _same(exports)
        declined += len(d)
        taken += len(exports) - len(d)
    print(f"exports taken by the pass {taken}, declined {declined}")
    assert taken > 0.6 * (taken + declined), (taken, declined)


def test_every_prefix_of_an_export_gives_the_reference_result() -> None:
    rng = random.Random(56)
    for _ in range(5):
        export = fuzzed_export(rng)
        _same([export[:cut] for cut in range(len(export) + 1)])


def test_the_sdks_exports_are_taken_not_declined() -> None:
    """What the OpenTelemetry SDK's OTLP exporter sends (its own encoder over real spans) is read by the pass."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource as SdkResource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, StatusCode
    from opentelemetry.trace import Status as SdkStatus

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=SdkResource.create({"service.name": "checkout", "host.name": "h1"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("shop", "1.0")
    for i in range(20):
        with tracer.start_as_current_span(
            "GET /pay", kind=SpanKind.SERVER, attributes={"http.route": "/pay", "http.response.status_code": 200 + i}
        ):
            with tracer.start_as_current_span(
                "SELECT", kind=SpanKind.CLIENT, attributes={"db.query.text": "SELECT 1", "tags": ["a", "b"]}
            ) as db:
                db.add_event("retry", {"n": 1})
                if i % 5 == 0:
                    db.set_status(SdkStatus(StatusCode.ERROR, "boom"))  # fmt: skip
    export = encode_spans(memory.get_finished_spans()).SerializeToString()
    assert _same([export, export]) == []
    batch, rejects = decode_proto_exports([export], OPTIONS)
    assert (batch.requests, batch.num_rows, rejects) == (20, 40, [])


def test_every_enum_value_and_a_negative_kind_are_read_as_protobuf_reads_them() -> None:
    for kind in [*Span.SpanKind.values(), 9, -1, 2**31 - 1, -(2**31)]:
        for code in [*Status.StatusCode.values(), -5]:
            span = Span(trace_id=bytes(range(16)), span_id=bytes(8), name="op", kind=kind, start_time_unix_nano=1,
                        end_time_unix_nano=2, status=Status(code=code))  # fmt: skip
            export = ExportTraceServiceRequest()
            export.resource_spans.add().scope_spans.add().spans.append(span)
            scanned = span_columns.proto_span_columns([export.SerializeToString()])
            assert scanned is not None and scanned.declined == [], (kind, code)
            assert scanned.columns.kind.to_pylist() == [kind]
            assert scanned.columns.status_code.to_pylist() == [code]


def test_with_the_pass_off_every_export_goes_to_the_reference() -> None:
    export = fuzzed_export(random.Random(3))
    with native.disabled("otlpproto"):
        assert span_columns.proto_span_columns([export]) is None
        assert native.otlpproto is None


def test_the_endpoint_column_is_gathered_from_its_distinct_values_by_code() -> None:
    for scanner in (native.otlpproto, native.otlpjson):
        assert scanner is not None
        codes = np.array([2, 0, 0, 1, 2], np.int32).tobytes()
        offsets, data = scanner.gather(codes, ["/a", "é/b", ""])
        column = pa.Array.from_buffers(pa.string(), 5, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        assert column.to_pylist() == ["", "/a", "/a", "é/b", ""]
        assert scanner.gather(b"", []) == (np.zeros(1, np.int32).tobytes(), b"")
        with pytest.raises(IndexError, match="out of range"):
            scanner.gather(np.array([0, 3], np.int32).tobytes(), ["a", "b", "c"])
        with pytest.raises(IndexError, match="out of range"):
            scanner.gather(np.array([-1], np.int32).tobytes(), ["a"])
        with pytest.raises(TypeError, match="must be str"):
            scanner.gather(np.array([0], np.int32).tobytes(), [b"a"])


def _varint(n: int, width: int = 0) -> bytes:
    """``n`` as a protobuf varint, padded to ``width`` bytes with continuation bytes (a longer encoding of the same
    value, as protobuf's grammar allows and upb refuses past 5 bytes for a tag or a length)."""
    out = bytearray()
    while True:
        out.append(n & 0x7F)
        n >>= 7
        if not n:
            break
    while len(out) < width:
        out.append(0)
    return bytes(b | 0x80 for b in out[:-1]) + bytes(out[-1:])


def test_tags_and_lengths_longer_than_upb_reads_are_declined_and_judged_by_it() -> None:
    """The pass reads a varint of up to 10 bytes; upb reads a tag or a length in at most 5 and refuses the export
    otherwise. A tag or a length in 6 bytes or more is declined, so the reference judges it (and refuses it)."""
    export = ExportTraceServiceRequest()
    span = export.resource_spans.add().scope_spans.add().spans.add()
    span.CopyFrom(Span(trace_id=bytes(range(16)), span_id=bytes(8), name="GET /x", kind=Span.SPAN_KIND_SERVER,
                       start_time_unix_nano=10**18, end_time_unix_nano=10**18 + 5_000_000))  # fmt: skip
    wire = export.SerializeToString()
    assert wire[0] == 0x0A  # resource_spans: field 1, length-delimited
    n, at = 0, 1
    for shift in range(0, 64, 7):
        n |= (wire[at] & 0x7F) << shift
        at += 1
        if not wire[at - 1] & 0x80:
            break
    payload = wire[at:]
    assert len(payload) == n
    for width in range(1, 11):
        for padded in (_varint(0x0A, width) + _varint(n) + payload, b"\x0a" + _varint(n, width) + payload):
            declined = _same([padded])
            batch, rejects = decode_proto_exports([padded], OPTIONS)
            if width <= 5:
                assert (declined, batch.requests, rejects) == ([], 1, []), width
            else:
                assert declined == [0] and batch.requests == 0 and len(rejects) == 1, width


def _nested(depth: int, kvlist: bool) -> Any:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    value = AnyValue(string_value="x")
    for _ in range(depth):
        outer = AnyValue()
        if kvlist:
            outer.kvlist_value.values.add(key="k").value.CopyFrom(value)
        else:
            outer.array_value.values.add().CopyFrom(value)
        value = outer
    return value


@pytest.mark.parametrize("where", ["resource", "scope", "span", "event", "link"])
def test_values_nested_up_to_and_past_upbs_depth_limit_give_the_reference_result(where: str) -> None:
    """upb refuses an export nested more than 100 messages deep; a kvlist level is three messages, an array level
    two, and an event's or a link's attributes start deepest. The pass declines before that depth everywhere."""
    taken = []
    for kvlist, deepest in ((True, 36), (False, 52)):
        for depth in range(1, deepest):
            export = ExportTraceServiceRequest()
            rs = export.resource_spans.add()
            ss = rs.scope_spans.add()
            span = ss.spans.add(trace_id=bytes(range(16)), span_id=bytes(8), name="GET /x", kind=Span.SPAN_KIND_SERVER,
                                start_time_unix_nano=1, end_time_unix_nano=2)  # fmt: skip
            if where == "resource":
                owner = rs.resource.attributes
            elif where == "scope":
                owner = ss.scope.attributes
            elif where == "span":
                owner = span.attributes
            elif where == "event":
                owner = span.events.add(name="e").attributes
            else:
                owner = span.links.add(trace_id=bytes(16), span_id=bytes(8)).attributes
            owner.add(key="deep").value.CopyFrom(_nested(depth, kvlist))
            if not _same([export.SerializeToString()]):
                taken.append((kvlist, depth))
    assert (True, 1) in taken and (False, 1) in taken  # the pass takes what nests little
