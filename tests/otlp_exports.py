"""OTLP protobuf trace exports written at the wire level, for tests that hold a decoder to the reference: every
field of every message through the official classes, then raw fields beside them (unknown fields of every wire
type, a group, a duplicate singular field, a known field of another wire type, field number 0, a second oneof
member, negative enums), strings made invalid UTF-8, and bytes truncated or flipped."""

from __future__ import annotations

import random

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

__all__ = ["END", "fuzzed_export"]

END = 1_790_000_000_000_000_000  # spans end about here (epoch ns)


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


def fuzzed_export(rng: random.Random) -> bytes:
    """An OTLP protobuf export written at the wire level (see the module docstring)."""
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
