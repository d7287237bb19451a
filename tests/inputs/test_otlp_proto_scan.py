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

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from drainpipe import native
from drainpipe.inputs import span_columns
from drainpipe.inputs.options import InputOptions
from drainpipe.inputs.otlp import decode_proto_exports
from drainpipe.inputs.spans import SpanMapping

OPTIONS = InputOptions()
TRACED = InputOptions(spans=SpanMapping(trace_ids=True))
END = 1_790_000_000_000_000_000


# ------------------------------------------------------------------------------------------- the wire, by hand


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _ld(field: int, payload: bytes) -> bytes:
    return _tag(field, 2) + _varint(len(payload)) + payload


def _odd_field(rng: random.Random, known: list[tuple[int, int]]) -> bytes:
    """A raw field beside a message's own: unknown ones of every wire type (protobuf skips them), or one that
    protobuf reads otherwise than plainly (a group, a known field's other wire type, field 0, a second copy)."""
    kind = rng.randrange(8)
    if kind == 0:
        return _tag(rng.choice([17, 99, 1000, 2**28]), 0) + _varint(rng.randrange(2**40))
    if kind == 1:
        return _tag(99, 1) + rng.randbytes(8)
    if kind == 2:
        return _ld(99, rng.randbytes(rng.randrange(6)))
    if kind == 3:
        return _tag(99, 5) + rng.randbytes(4)
    if kind == 4:
        return _tag(99, 3) + _tag(99, 4)  # a group
    if kind == 5:
        field, wire = rng.choice(known)
        return _ld(field, b"ab") if wire != 2 else _tag(field, 0) + b"\x01"
    if kind == 6:
        return b"\x00\x01"  # field number 0
    field, wire = rng.choice(known)  # a second copy of a known field
    return _tag(field, wire) + {0: b"\x03", 1: bytes(8), 2: b"\x00", 5: bytes(4)}[wire]


def _value(rng: random.Random, depth: int = 0) -> AnyValue:
    if rng.random() < 0.6:
        return rng.choice([AnyValue(string_value="GET /users/{id}"), AnyValue(int_value=503), AnyValue(int_value=200)])
    kinds = [
        lambda: AnyValue(string_value=rng.choice(["", "caf\u00e9", "a\u0000b", "\U0001f600", "/x"])),
        lambda: AnyValue(int_value=rng.choice([0, -3, 2**63 - 1, -(2**63), 404])),
        lambda: AnyValue(bool_value=rng.random() < 0.5),
        lambda: AnyValue(double_value=rng.choice([1.5, -0.0, 1e308])),
        lambda: AnyValue(bytes_value=b"hi"),
        lambda: AnyValue(),
    ]
    if depth < 3:
        kinds.append(
            lambda: AnyValue(array_value={"values": [_value(rng, depth + 1) for _ in range(rng.randrange(3))]})
        )
        kinds.append(lambda: AnyValue(kvlist_value={"values": _attributes(rng, depth + 1)}))
    return rng.choice(kinds)()


def _attributes(rng: random.Random, depth: int = 0) -> list[KeyValue]:
    keys = ["http.route", "http.response.status_code", "http.status_code", "service.name", "host.name",
            "service.instance.id", "db.statement", "db.query.text", "other"]  # fmt: skip
    out = []
    for _ in range(rng.randrange(4)):
        pair = KeyValue(key=rng.choice(keys)) if rng.random() < 0.97 else KeyValue()
        if rng.random() < 0.97:
            pair.value.CopyFrom(_value(rng, depth))
        out.append(pair)
    return out


def _span(rng: random.Random) -> bytes:
    end = END + rng.randrange(10**12)
    span = Span(
        trace_id=rng.choice([rng.randbytes(16)] * 8 + [rng.randbytes(8), bytes(16), b"", rng.randbytes(5)]),
        span_id=rng.choice([rng.randbytes(8)] * 8 + [b"", rng.randbytes(3)]),
        name=rng.choice(["GET /users/123", "op", "", "\u00e9t\u00e9"]),
        kind=rng.choice([2, 2, 3, 1, 5, 4, 0, 9]),
        start_time_unix_nano=end - rng.randrange(2 * 10**9) if rng.random() < 0.97 else end + 5,
        end_time_unix_nano=end,
        attributes=_attributes(rng),
    )
    if rng.random() < 0.2:
        span.parent_span_id = rng.randbytes(8)
    if rng.random() < 0.2:
        span.trace_state = rng.choice(["ot=th:8", "vendor=a,ot=th:c", "ot=th:5555", "ot=th:zz", "\u00e9", ""])
    if rng.random() < 0.2:
        span.flags = rng.choice([1, 256, 2**32 - 1])
    if rng.random() < 0.2:
        span.dropped_attributes_count = 3
    if rng.random() < 0.2:
        event = span.events.add(time_unix_nano=end, name="exception")
        event.attributes.extend(_attributes(rng))
    if rng.random() < 0.2:
        link = span.links.add(trace_id=rng.randbytes(16), span_id=rng.randbytes(8), flags=1, trace_state="a=b")
        link.attributes.extend(_attributes(rng))
    if rng.random() < 0.3:
        span.status.CopyFrom(rng.choice([Status(), Status(code=2), Status(code=1, message="m"), Status(code=7)]))
    raw = span.SerializeToString()
    if rng.random() < 0.03:  # a negative kind, as protobuf writes one (ten bytes)
        raw += _tag(6, 0) + _varint(-1)
    if rng.random() < 0.05:  # an attribute whose value has two oneof members (protobuf keeps the last)
        members = [_ld(1, b"/a"), _tag(3, 0) + _varint(503), _tag(2, 0) + b"\x01"]
        rng.shuffle(members)
        key = rng.choice([b"http.route", b"http.response.status_code", b"db.statement"])
        raw += _ld(9, _ld(1, key) + _ld(2, b"".join(members[:2])))
    if rng.random() < 0.06:
        known = [(1, 2), (2, 2), (3, 2), (5, 2), (6, 0), (7, 1), (8, 1), (9, 2), (15, 2), (16, 5)]
        raw += _odd_field(rng, known)
    return raw


def _export(rng: random.Random) -> bytes:
    out = b""
    for _ in range(rng.randrange(3)):
        rs = b""
        if rng.random() < 0.9:
            resource = Resource(attributes=_attributes(rng))
            if rng.random() < 0.1:
                resource.dropped_attributes_count = 1
            rs += _ld(1, resource.SerializeToString() + (_odd_field(rng, [(1, 2), (2, 0)]) if rng.random() < 0.05
                                                         else b""))  # fmt: skip
        for _ in range(rng.choice([1, 1, 1, 2, 0])):
            ss = b""
            if rng.random() < 0.8:
                ss += _ld(1, InstrumentationScope(name="s", version="1").SerializeToString())
            for _ in range(rng.randrange(4)):
                ss += _ld(2, _span(rng))
            if rng.random() < 0.1:
                ss += _ld(3, b"https://opentelemetry.io/schemas/1.26.0")
            rs += _ld(2, ss)
        if rng.random() < 0.03:
            rs += _ld(1, b"")  # a second resource: protobuf merges the two
        out += _ld(1, rs)
    raw = bytearray(out)
    if raw and rng.random() < 0.05:  # a string made invalid UTF-8 (protobuf refuses the export)
        i = raw.find(b"GET /users/")
        if i >= 0:
            raw[i + 7] = rng.choice([0xFF, 0xC3, 0xED])
    if raw and rng.random() < 0.05:  # bytes mutated: truncation, a flipped byte
        i = rng.randrange(len(raw))
        if rng.random() < 0.5:
            del raw[i:]
        else:
            raw[i] ^= 1 << rng.randrange(8)
    return bytes(raw)


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
        exports = [_export(rng) for _ in range(rng.randrange(1, 8))]
        d = _same(exports)
        declined += len(d)
        taken += len(exports) - len(d)
    print(f"exports taken by the pass {taken}, declined {declined}")
    assert taken > 0.6 * (taken + declined), (taken, declined)


def test_every_prefix_of_an_export_gives_the_reference_result() -> None:
    rng = random.Random(56)
    for _ in range(5):
        export = _export(rng)
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
    export = _export(random.Random(3))
    with native.disabled("otlpproto"):
        assert span_columns.proto_span_columns([export]) is None
        assert native.otlpproto is None
