"""OTLP JSON files read by the C pass (``_otlpjson.c``), and by the Python pass of Spark executors (``span_json.py``),
give exactly what the reference decoder gives.

The reference is protobuf's JSON mapping (``decode_otlp_lines``): it decides what a valid export is. The C pass may
decline any line (the reference then reads it), but what it accepts must map to the same events and rejects. The
fuzz below writes exports with every field of every message in valid and invalid spellings (enum names and numbers,
quoted integers, ids in hex, odd, upper case or with spaces, escapes, nulls, unknown and snake_case keys, nested
values, a second oneof member), mutates bytes of some, and compares the two paths block by block. It also checks
that each pass really takes the common shapes (the Collector's and protobuf's own JSON): declining everything would
pass the comparison."""

from __future__ import annotations

import base64
import json
import random
import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from drainpipe import native
from drainpipe.inputs import span_columns
from drainpipe.inputs.formats.otlp_format import decode_block
from drainpipe.inputs.options import InputOptions
from drainpipe.inputs.span_json import MESSAGES, SPAN_KINDS, STATUS_CODES, python_json_spans
from drainpipe.inputs.spans import SpanMapping

OPTIONS = InputOptions()
#: the same, the spans' trace ids kept (exemplars): the passes and the reference must give the same ids too
TRACED = InputOptions(spans=SpanMapping(trace_ids=True))
END = 1_790_000_000_000_000_000


def _rows(batch: Any) -> tuple[list, int]:
    rows = pa.Table.from_batches([batch.rows]).to_pylist()
    return sorted((tuple(r.values()) for r in rows), key=repr), batch.requests


@pytest.fixture(params=["c", "python"])
def json_pass(request: pytest.FixtureRequest) -> Iterator[str]:
    """Which pass reads the blocks: the C one, or the Python one (as where the C pass is not built)."""
    with native.disabled(*(("otlpjson",) if request.param == "python" else ())):
        yield str(request.param)


def _scanned(data: bytes, count: int) -> Any:
    scanned = span_columns.json_span_columns(data, count)
    return scanned if scanned is not None else python_json_spans(data, count)


def _same(data: bytes, count: int) -> list[int]:
    """A pass and the reference over one block: the same events (trace ids too), rejects and warnings. Returns the
    lines the pass declined."""
    for options in (OPTIONS, TRACED):
        fast, fast_bad = decode_block(data, count, 100, options, True)
        ref, ref_bad = decode_block(data, count, 100, options, False)
        assert _rows(fast) == _rows(ref), data[:2000]
        assert fast_bad == ref_bad, data[:2000]
        assert dict(fast.warnings) == dict(ref.warnings), data[:2000]
    return _scanned(data, count).declined


def _pick(rng: random.Random, *choices: Any) -> Any:
    return rng.choice(choices)


def _usually(rng: random.Random, common: Any, *odd: Any) -> Any:
    """``common`` mostly; now and then one of the ``odd`` spellings (valid or not): a line has dozens of fields,
    and one invalid among them makes the whole line the reference's."""
    return common if rng.random() < 0.93 else rng.choice(odd)


def _value(rng: random.Random, depth: int = 0) -> Any:
    if rng.random() < 0.6:
        return _usually(rng, {"stringValue": "GET /users/{id}"}, {"intValue": "503"}, {"intValue": 404})
    kinds = [
        lambda: {"stringValue": _pick(rng, "GET /users/{id}", "", "caf\u00e9", "a\u0000b", "\U0001f600", "x\"y\\z")},
        lambda: {"intValue": _pick(rng, "503", 404, "-3", "9223372036854775807", "9223372036854775808", "1.0",
                                   5.0, "0x10", " 5", "+5", "1_000", True)},
        lambda: {"boolValue": _pick(rng, True, False, "true", 1)},
        lambda: {"doubleValue": _pick(rng, 1.5, 0, -2, 1e308, "NaN", "1.5")},
        lambda: {"bytesValue": "aGk="},
        lambda: {"stringValue": None},
        lambda: {},
        lambda: {"stringValue": "a", "intValue": 1},
        lambda: {"string_value": "snake"},
        lambda: {"stringValue": 5},
    ]  # fmt: skip
    if depth < 2:
        kinds += [lambda: {"arrayValue": {"values": [_value(rng, depth + 1) for _ in range(rng.randrange(3))]}},
                  lambda: {"kvlistValue": {"values": _attributes(rng, depth + 1)}}]  # fmt: skip
    return rng.choice(kinds)()


def _attributes(rng: random.Random, depth: int = 0) -> Any:
    keys = ["http.route", "http.response.status_code", "http.status_code", "service.name", "host.name",
            "service.instance.id", "db.statement", "db.query.text", "other"]  # fmt: skip
    out: list[Any] = []
    for _ in range(rng.randrange(4)):
        pair: dict[str, Any] = {}
        if rng.random() < 0.98:
            pair["key"] = rng.choice(keys)
        if rng.random() < 0.98:
            pair["value"] = _value(rng, depth) if rng.random() < 0.98 else None
        if rng.random() < 0.01:
            pair["extra"] = 1
        out.append(pair)
    if rng.random() < 0.03:
        return None
    return out


def _id(rng: random.Random, width: int) -> Any:
    good = rng.randbytes(width).hex()
    if rng.random() < 0.8:
        return good
    odd = [good.upper(), good[:-1], "zz" * width, good[:4] + " " + good[4:], "", 12, None, bytes(width).hex(),
           good[:6] + "\u00e9", good[:width], [good], True]  # fmt: skip
    if width == 16:  # a trace id: a 64-bit one (padded), a UUID (its digits), a UUID's length that is none
        odd += [
            good[:16],
            bytes(8).hex(),
            f"{good[:8]}-{good[8:12]}-{good[12:16]}-{good[16:20]}-{good[20:]}",
            "-" * 36,
            f"{good[:8]}-{good[8:12]}-{good[12:16]}-{good[16:20]}_{good[20:]}",
        ]
    return rng.choice(odd)


def _integer(rng: random.Random, value: int) -> Any:
    return _usually(rng, _pick(rng, str(value), value), str(-value), "0" + str(value), float(value), "x", None)


def _span(rng: random.Random) -> dict[str, Any]:
    end = END + rng.randrange(10**12)
    span: dict[str, Any] = {
        "traceId": _id(rng, 16),
        "spanId": _id(rng, 8),
        "name": _usually(rng, "GET /users/123", "op", "", "\u00e9t\u00e9", 7),
        "kind": _usually(
            rng, _pick(rng, 2, 2, 3, 1), 5, "SPAN_KIND_SERVER", "SPAN_KIND_CLIENT", "2", "server", 9, -1, 2.5
        ),
        "startTimeUnixNano": _integer(rng, end - rng.randrange(2 * 10**9)),
        "endTimeUnixNano": _integer(rng, end),
        "attributes": _attributes(rng),
    }
    optional = {
        "parentSpanId": lambda: _id(rng, 8),
        "traceState": lambda: _pick(rng, "ot=th:8", "vendor=a,ot=th:c", "ot=th:5555", "ot=th:zz", "\u00e9", "", None,
                                    5),
        "flags": lambda: _pick(rng, 1, 256, "1", -1, 2**32),
        "droppedAttributesCount": lambda: _pick(rng, 0, 3, "2", -1),
        "events": lambda: [{"timeUnixNano": _integer(rng, end), "name": "exception",
                            "attributes": _attributes(rng)} for _ in range(rng.randrange(2))],
        "links": lambda: [{"traceId": _id(rng, 16), "spanId": _id(rng, 8), "flags": 1}],
        "droppedEventsCount": lambda: 1,
        "status": lambda: _pick(rng, {}, {"code": 2}, {"code": "STATUS_CODE_ERROR"}, {"code": 1, "message": "m"},
                                {"code": "2"}, {"message": 5}, None, {"code": 7}),
        "span_id": lambda: "00",
        "unknownField": lambda: {"a": [1]},
    }  # fmt: skip
    for key, make in optional.items():
        if rng.random() < (0.01 if key in ("span_id", "unknownField") else 0.2):
            span[key] = make()
    for key in list(span):
        if rng.random() < 0.01:
            del span[key]
    return span


def _export(rng: random.Random) -> dict[str, Any]:
    resources = []
    for _ in range(rng.randrange(3)):
        rs: dict[str, Any] = {"scopeSpans": [{"scope": {"name": "s", "version": "1"},
                                              "spans": [_span(rng) for _ in range(rng.randrange(4))]}
                                             for _ in range(_usually(rng, 1, 2, 0))]}  # fmt: skip
        if rng.random() < 0.9:
            rs["resource"] = _pick(rng, {"attributes": _attributes(rng)}, {}, None, {"droppedAttributesCount": 1},
                                   {"attributes": _attributes(rng)})  # fmt: skip
        if rng.random() < 0.2:
            rs["schemaUrl"] = "https://opentelemetry.io/schemas/1.21.0"
        resources.append(rs)
    return {"resourceSpans": resources}


_EDITS = [
    (rb'"kind": ?[0-9]', b'"kind": 02'),
    (rb'"kind": ?2', b'"kind": 2.0'),
    (rb'"kind": ?2', b'"kind": -0'),
    (rb'"GET /users/', b'"GET /us\xffers/'),
    (rb'"GET /users/', b'"GET /us\xed\xa0\x80ers/'),  # an encoded surrogate: not UTF-8
    (rb'"GET /users/', b'"GET /us\xc3\xa9ers/'),
    (rb'"name": ?"', b'"name": "\\u00e9\\ud83d\\ude00\\n\\/'),
    (rb'"name": ?"', b'"name": "\\ud800'),
    (rb'"name": ?"', b'"name": "\\udc00x'),
    (rb'"name": ?"', b'"name": "\\x'),
    (rb'"name": ?"', b'"name": "a\tb'),
    (rb'"stringValue": ?"', b'"stringValue": "\\u0041\\"'),
    (rb'"spanId": ?"', b'"spanId": "\\u0030\\u0031'),
    (rb'"traceId": ?"', b'"trace\\u0049d": "'),
    (rb'"endTimeUnixNano": ?"', b'"endTimeUnixNano": "+'),
    (rb'"endTimeUnixNano": ?"', b'"endTimeUnixNano": "1_0'),
    (rb'"endTimeUnixNano": ?"', b'"endTimeUnixNano": "99999999999999999999'),
    (rb"\}$", b"} x"),
    (rb"\}$", b"}]"),
    (rb"^\{", b"\xef\xbb\xbf{"),
    (rb"true", b"True"),
]


def _line(rng: random.Random) -> bytes:
    text = json.dumps(_export(rng), ensure_ascii=rng.random() < 0.3,
                      separators=_pick(rng, (",", ":"), (", ", ": ")))  # fmt: skip
    if rng.random() < 0.1:  # a duplicate key (json.loads keeps the last)
        key = _pick(rng, '"spanId":', '"name":', '"kind":', '"key":')
        text = text.replace(key, f'{key} "00", {key}', 1)
    if rng.random() < 0.05:
        text = " \t" + text + " \r"
    raw = bytearray(text.encode())
    if rng.random() < 0.4:  # a targeted edit: a token JSON refuses, bad UTF-8, escapes (good and bad)
        pattern, replacement = rng.choice(_EDITS)
        raw = bytearray(re.sub(pattern, lambda _: replacement, bytes(raw), count=1))
    if rng.random() < 0.1:  # byte mutations: truncation, junk, a flipped character
        for _ in range(rng.randrange(1, 3)):
            i = rng.randrange(len(raw))
            raw[i : i + 1] = _pick(rng, b"", b"\xff", b"\\", b'"', b"}", b"0", b"\x00", b"\xc3")
    return bytes(raw)


def test_each_pass_gives_the_reference_result_on_fuzzed_exports(json_pass: str) -> None:
    rng = random.Random(37)
    declined = taken = 0
    for _ in range(200):
        lines = [_line(rng) for _ in range(rng.randrange(1, 12))]
        if rng.random() < 0.2:
            lines.insert(rng.randrange(len(lines) + 1), _pick(rng, b"", b"  ", b"\x0c"))
        data = b"\n".join(lines) + _pick(rng, b"\n", b"")
        count = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
        d = _same(data, count)
        declined += len(d)
        taken += count - len(d)
    print(f"lines taken by the {json_pass} pass {taken}, declined {declined}")
    # the comparison exercises the pass (the Python one is the stricter: it declines nulls and odd integer spellings)
    assert taken > (0.4 if json_pass == "c" else 0.3) * (taken + declined), (taken, declined)


def _collector_line(spans: int, seed: int) -> bytes:
    """An export shaped as the Collector's file exporter writes it (enums as numbers, every kind of field)."""
    rng = random.Random(seed)
    out = []
    for i in range(spans):
        end = END + i * 1_000_000
        out.append({"traceId": rng.randbytes(16).hex(), "spanId": rng.randbytes(8).hex(),
                    "parentSpanId": rng.randbytes(8).hex() if i % 2 else "", "flags": 257, "traceState": "",
                    "name": f"GET /users/{i}", "kind": 2 if i % 3 else 3, "startTimeUnixNano": str(end - 5_000_000),
                    "endTimeUnixNano": str(end),
                    "attributes": [{"key": "http.route", "value": {"stringValue": "/users/{id}"}},
                                   {"key": "http.response.status_code", "value": {"intValue": "503" if i % 5 == 0 else "200"}},
                                   {"key": "db.statement", "value": {"stringValue": "SELECT 1"}},
                                   {"key": "tags", "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"doubleValue": 1.5}]}}},
                                   {"key": "ok", "value": {"boolValue": True}}],
                    "events": [{"timeUnixNano": str(end), "name": "exception",
                                "attributes": [{"key": "exception.type", "value": {"stringValue": "E"}}]}],
                    "links": [{"traceId": rng.randbytes(16).hex(), "spanId": rng.randbytes(8).hex(), "flags": 1}],
                    "status": {"code": 2, "message": "boom"} if i % 7 == 0 else {}})  # fmt: skip
    document = {"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "checkout"}},
        {"key": "host.name", "value": {"stringValue": "h1"}}], "droppedAttributesCount": 0},
        "scopeSpans": [{"scope": {"name": "io.opentelemetry.http", "version": "1.2"}, "spans": out,
                        "schemaUrl": "https://opentelemetry.io/schemas/1.26.0"}]}]}  # fmt: skip
    return json.dumps(document, separators=(",", ":")).encode()


def _protobuf_line(seed: int) -> bytes:
    """protobuf's own JSON of an export (enum names, 64-bit integers quoted), its ids made hex as OTLP wants."""
    rng = random.Random(seed)
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "shop"
    spans = rs.scope_spans.add().spans
    for kind in Span.SpanKind.values():
        span = spans.add(trace_id=rng.randbytes(16), span_id=rng.randbytes(8), name="op", kind=kind,
                         start_time_unix_nano=END, end_time_unix_nano=END + 1000)  # fmt: skip
        span.status.code = Status.STATUS_CODE_ERROR
        span.attributes.add(key="http.response.status_code").value.int_value = 500
    document = json_format.MessageToDict(request)
    for span in document["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        for key in ("traceId", "spanId"):
            span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(document).encode()


def test_the_common_shapes_are_taken_by_each_pass_not_declined(json_pass: str) -> None:
    lines = [_collector_line(50, 1), _protobuf_line(2), _collector_line(3, 3)]
    data = b"\n".join(lines) + b"\n"
    assert _same(data, 3) == []
    batch, _ = decode_block(data, 3, 0, OPTIONS, True)
    assert batch.requests == 33 + 2 + 2  # the SERVER spans of the Collector's lines, SERVER and CONSUMER of protobuf's
    # every enum name of opentelemetry-proto is read as its number (the names are a table in each pass)
    for name, number in list(Span.SpanKind.items()) + [(n, v) for n, v in Status.StatusCode.items()]:
        field = "kind" if name.startswith("SPAN_KIND") else "status"
        value: Any = name if field == "kind" else {"code": name}
        span = {"traceId": "01" * 16, "spanId": "02" * 8, "name": "op", "kind": 2, "startTimeUnixNano": "1",
                "endTimeUnixNano": "2", field: value}  # fmt: skip
        line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()
        scanned = _scanned(line, 1)
        assert scanned.declined == [], name
        got = scanned.columns.kind if field == "kind" else scanned.columns.status_code
        assert got.to_pylist() == [number], name


def test_the_python_pass_knows_only_fields_and_enum_values_opentelemetry_proto_has() -> None:
    """Its tables of JSON names and enum values are opentelemetry-proto's: a key it accepted that the reference did
    not know (the reference ignores unknown fields) would be read with a meaning the reference does not give it."""
    from google.protobuf import descriptor_pool
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: F401 (registers the messages)

    pool = descriptor_pool.Default()
    for name, keys in MESSAGES.items():
        fields = pool.FindMessageTypeByName(name).fields
        assert keys <= {f.json_name for f in fields}, name
    assert SPAN_KINDS == dict(Span.SpanKind.items()) and STATUS_CODES == dict(Status.StatusCode.items())


EXECUTOR = r"""
import importlib.abc, sys
class Hidden(importlib.abc.MetaPathFinder):  # a Spark executor: drainpipe's zip (no C extension), no protobuf
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("google", "opentelemetry", "ptars") or name.rsplit(".", 1)[-1] in (
                "_otlpjson", "_spanmap", "_jsonscan", "_csvscan", "_logscan", "_fastpath"):
            raise ImportError(f"no {name} here")
sys.meta_path.insert(0, Hidden())
from drainpipe.errors import InputError
from drainpipe.inputs.formats.otlp_format import decode_block
from drainpipe.inputs.options import InputOptions
data = open(sys.argv[1], "rb").read()
batch, bad = decode_block(data, data.count(b"\n"), 0, InputOptions())
print(batch.requests, batch.num_rows, len(bad))
try:
    decode_block(b'{"resourceSpans": null}\n', 1, 0, InputOptions())
except InputError as e:
    print("refused:", e)
"""


def test_an_executor_without_protobuf_or_c_extensions_reads_otlp_json_files(tmp_path) -> None:
    """Spark executors: the Python pass and the mapping need neither the C extensions nor opentelemetry-proto; a line
    only the reference can read is refused with one clear line naming what is missing."""
    import subprocess
    import sys

    path = tmp_path / "spans.otlp.jsonl"
    path.write_bytes(_collector_line(50, 1) + b"\n" + _collector_line(3, 3) + b"\n")
    want, _ = decode_block(path.read_bytes(), 2, 0, OPTIONS, False)  # the reference, here
    out = subprocess.run([sys.executable, "-c", EXECUTOR, str(path)], capture_output=True, text=True, check=True)
    first, refused = out.stdout.splitlines()
    assert first == f"{want.requests} {want.num_rows} 0"
    assert (
        refused.startswith("refused: an OTLP JSON line outside the fast passes needs")
        and "opentelemetry-proto" in refused
    )


def test_exports_as_bodies_and_messages_read_by_the_pass_give_the_reference_result() -> None:
    """One decoder per wire format: OTLP JSON from HTTP bodies and Kafka values goes through the files' pass
    (``decode_exports``: each export, its line breaks blanked, a line of one block). Exports pretty-printed across
    lines, blank, broken or not objects give, export by export, what the reference decoder
    (:func:`~drainpipe.inputs.otlp.decode_traces`) gives: the same events, the same span rejects, and the same
    one-line reason for an export rejected whole."""
    from drainpipe.errors import OtlpError
    from drainpipe.inputs import EventBatch, decode_exports
    from drainpipe.inputs.otlp import decode_traces

    rng = random.Random(54)
    exports = []
    for i in range(120):
        line = _line(rng)
        if i % 3 == 0:
            try:  # the same export laid out over lines, as SDKs and people send bodies
                line = json.dumps(json.loads(line), indent=2).encode()
            except ValueError:
                pass
        exports.append(line)
    exports += [b"", b"  \n ", b"[]", b"{", _collector_line(5, 9).replace(b", ", b",\r\n  ")]
    for options in (OPTIONS, TRACED):
        batch, rejects = decode_exports(exports, options)
        want_batches: list = []
        want_rejects: list = []
        for k, export in enumerate(exports):
            try:
                result = decode_traces(export, json_body=True, mapping=options.spans, endpoints=options.endpoints)
            except OtlpError as exc:
                want_rejects.append((k, export, str(exc)))
                continue
            want_batches.append(result.batch)
            want_rejects += [(k, {"span": i}, reason) for i, reason in result.rejects]
        assert _rows(batch) == _rows(EventBatch.join(want_batches))
        assert rejects == want_rejects
    assert any(isinstance(raw, bytes) for _, raw, _ in rejects) and any(isinstance(raw, dict) for _, raw, _ in rejects)


def test_a_line_nested_past_pythons_recursion_limit_is_invalid_json_not_a_crash(json_pass: str) -> None:
    """The passes decline a line nested deeper than they read; the reference's json.loads then raised RecursionError,
    which escaped as a traceback (drainpipe run exited 70)."""
    deep = b"[" * 1000 + b"\n"
    good = _export_line("svc")
    batch, rejects = decode_block(good + deep + good, 3, 10, OPTIONS)
    assert batch.requests == 2 and rejects == [(12, deep, "invalid JSON")]


def test_a_json_object_that_is_not_an_export_is_rejected_not_read_as_an_empty_one(json_pass: str) -> None:
    """Protobuf's JSON parser skips unknown fields, so any object was an export of no span: an events file given an
    OTLP suffix was read as nothing, unseen. An object without resourceSpans is rejected; {} is the empty export."""
    event = b'{"ts":1795255200000,"service":"svc","latency_ms":1.5}\n'
    batch, rejects = decode_block(event + b"{}\n" + b'{"resourceSpans":[]}\n' + event, 4, 0, OPTIONS)
    assert batch.num_rows == 0 and rejects == [(1, event, "invalid OTLP"), (4, event, "invalid OTLP")]


def _export_line(service: str) -> bytes:
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    resource.resource.attributes.add(key="service.name").value.string_value = service
    resource.scope_spans.add().spans.add(trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)), name="GET /x",
                                         kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=10**18,
                                         end_time_unix_nano=10**18 + 10**6)  # fmt: skip
    return json_format.MessageToJson(request, indent=None).encode() + b"\n"
