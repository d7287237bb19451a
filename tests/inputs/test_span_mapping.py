"""The span -> event mapping (``drainpipe.inputs.otlp.map_spans``, tuned for speed; its per-span pass both in C and in
the numpy fallback that Spark executors use) against a plain reference written
straight from the documented rules (docs/pipeline.md, "OpenTelemetry spans"), over generated exports: kinds, resource
and span attributes in any order and of any type, both key spellings, status codes, HTTP statuses as integers and
strings, ids of every length (a span whose ids cannot be used is mapped, with a warning; a 64-bit trace id is
padded), end before start, latencies out of range; and a custom ``[spans]`` mapping."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from drainpipe import native
from drainpipe.inputs import otlp
from drainpipe.inputs.endpoints import EndpointRules
from drainpipe.inputs.otlp import map_spans
from drainpipe.inputs.schema import EVENT_SCHEMA, LATENCY_MAX_MS, TRACE_ID, batch_schema
from drainpipe.inputs.spans import KINDS, SpanMapping
from testlib import adjusted_count

T0_NS = 1_795_543_194_000_000_000  # ns


@pytest.fixture(autouse=True, scope="module", params=["C", "numpy"])
def per_span_pass(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test here runs with the C pass and with its numpy fallback (inputs._spanmap_fallback)."""
    if request.param == "C":
        assert native.spanmap is not None, "the C pass is not built"
    with native.disabled(*(("spanmap",) if request.param == "numpy" else ())):
        yield


def trace_id(raw: bytes) -> bytes | None:
    """A span's trace id as an event keeps it (docs/pipeline.md): 16 bytes, or 8 left-padded with zeros; None for
    any other length or all zeros."""
    padded = bytes(8) + raw if len(raw) == 8 else raw
    return padded if len(padded) == 16 and any(padded) else None


def reference(request: ExportTraceServiceRequest, mapping: SpanMapping, rules: EndpointRules) -> tuple:
    """(request rows, exit rows, rejects, spans, warnings, trace ids of the rows), by the documented rules, one span
    at a time."""

    def text(attrs: dict[str, AnyValue], keys: tuple[str, ...]) -> str | None:
        for key in keys:  # the first key present with a non-empty string wins
            value = attrs.get(key)
            if value is not None and value.WhichOneof("value") == "string_value" and value.string_value:
                return value.string_value
        return None

    def http_status(attrs: dict[str, AnyValue]) -> int | None:
        for key in mapping.http_status:
            value = attrs.get(key)
            if value is None:
                continue
            if value.WhichOneof("value") == "int_value":
                return value.int_value
            text = value.string_value
            if value.WhichOneof("value") == "string_value" and text.isascii() and text.isdigit():
                return int(text)
        return None

    requests, exits, rejects, index = [], [], [], -1
    warnings: Counter[str] = Counter()
    request_ids: list[bytes | None] = []
    exit_ids: list[bytes | None] = []
    request_kinds = {KINDS[k] for k in mapping.request_kinds}
    for rs in request.resource_spans:
        resource = {kv.key: kv.value for kv in rs.resource.attributes}
        service = text(resource, mapping.service) or "unknown_service"
        instance = text(resource, mapping.instance) or ""
        for ss in rs.scope_spans:
            for span in ss.spans:
                index += 1
                attrs = {kv.key: kv.value for kv in span.attributes}
                if span.kind in request_kinds:
                    statement = None
                elif span.kind == KINDS["client"]:
                    statement = text(attrs, mapping.statement)
                    if statement is None:
                        continue
                else:
                    continue
                if span.end_time_unix_nano < span.start_time_unix_nano:
                    rejects.append((index, "bad value: end before start"))
                elif (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6 > LATENCY_MAX_MS:
                    rejects.append((index, "out of range: latency_ms"))
                else:
                    ok = span.status.code != 2  # ERROR
                    if ok and span.status.code == 0 and span.kind == KINDS["server"]:
                        status = http_status(attrs)
                        ok = status is None or status < 500
                    # the ids never cost a span: one that cannot be used is counted as a warning
                    warnings["bad trace_id"] += trace_id(span.trace_id) is None
                    warnings["bad span_id"] += len(span.span_id) != 8 or not any(span.span_id)
                    (request_ids if statement is None else exit_ids).append(trace_id(span.trace_id))
                    ts = span.end_time_unix_nano // 1_000_000
                    latency = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6
                    if statement is None:
                        endpoint = rules.normalize(text(attrs, mapping.endpoint) or span.name)
                        requests.append((ts, service, instance, endpoint, latency, ok, None))
                    else:
                        exits.append((ts, service, instance, "", latency, ok, statement))
    return requests, exits, rejects, index + 1, +warnings, request_ids + exit_ids


SPAN_KEYS = ["http.route", "route", "http.response.status_code", "http.status_code", "db.query.text", "db.statement",
             "other"]  # fmt: skip
RESOURCE_KEYS = ["service.name", "svc", "service.instance.id", "host.name", "other"]


def values() -> st.SearchStrategy[AnyValue | None]:
    # (digits that are not ASCII are no HTTP status)
    strings = st.sampled_from(["", "/users/42", "/a", "GET /orders/7", "select 1", "200", "503", "5x", "²", "５０３",
                               "99999999999999999999999"])  # fmt: skip
    return st.one_of(
        strings.map(lambda s: AnyValue(string_value=s)),
        strings.map(lambda s: AnyValue(string_value=s)),  # (strings twice as often)
        st.sampled_from([200, 404, 499, 500, 503]).map(lambda i: AnyValue(int_value=i)),
        st.booleans().map(lambda b: AnyValue(bool_value=b)),
        st.none(),  # a pair without a value
    )


@st.composite
def attributes(draw: Any, keys: list[str]) -> list[KeyValue]:
    # unique keys, as OTLP requires of attribute lists, in any order; often several keys of one field
    chosen = draw(st.permutations(keys))[: draw(st.integers(0, len(keys)))]
    return [KeyValue(key=k) if (v := draw(values())) is None else KeyValue(key=k, value=v) for k in chosen]


@st.composite
def spans(draw: Any) -> dict[str, Any]:
    start = T0_NS + draw(st.integers(0, 10**12))
    # mostly mappable spans, so that the rules after the checks are exercised too
    duration = draw(st.sampled_from([0, 1, 999_999, 1_234_567, 10**9] * 3 + [-1, int(LATENCY_MAX_MS * 1e6) + 1]))
    return {
        "trace_id": draw(
            st.sampled_from(
                [b"\x00" * 15 + b"\x01"] * 8 + [bytes(16), b"\x01" * 8, bytes(8), b"", b"\x03" * 12, b"\x04" * 17]
            )
        ),
        "span_id": draw(st.sampled_from([b"\x00" * 7 + b"\x02"] * 8 + [bytes(8), b"\x02" * 4, b""])),
        "name": draw(st.sampled_from(["checkout", "GET /items/123", ""])),
        "kind": draw(st.sampled_from([0, 1, 2, 2, 2, 3, 3, 3, 4, 5])),  # SERVER and CLIENT more often
        "start_time_unix_nano": start,
        "end_time_unix_nano": max(0, start + duration),
        "attributes": draw(attributes(SPAN_KEYS)),
        "status": draw(st.sampled_from([None, 0, 1, 2])),
    }


@st.composite
def exports(draw: Any) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        rs = request.resource_spans.add()
        rs.resource.attributes.extend(draw(attributes(RESOURCE_KEYS)))
        for _ in range(draw(st.integers(0, 2))):
            ss = rs.scope_spans.add()
            for fields in draw(st.lists(spans(), max_size=8)):
                status = fields.pop("status")
                span = ss.spans.add(**fields)
                if status is not None:
                    span.status.code = status
    return request


MAPPINGS = st.sampled_from([
    SpanMapping(),
    SpanMapping(request_kinds=("server",), service=("svc", "service.name"), instance=("host.name",),
                endpoint=("route", "http.route"), http_status=("http.status_code",), statement=("db.statement",)),
])  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(exports(), MAPPINGS)
def test_map_spans_equals_the_documented_rules(request: ExportTraceServiceRequest, mapping: SpanMapping) -> None:
    rules = EndpointRules()
    result = map_spans(request.SerializeToString(), mapping, rules)
    requests, exits, rejects, count, warnings, ids = reference(request, mapping, rules)
    assert result.spans == count
    assert result.rejects == rejects
    assert dict(result.batch.warnings) == warnings
    assert result.batch.rows.schema == EVENT_SCHEMA  # (no trace state here: no weights; no exemplars asked for)
    # with exemplars asked for, each event keeps its span's trace id (padded, or null when it cannot be used; no
    # column when none is kept)
    kept = map_spans(request.SerializeToString(), dataclasses.replace(mapping, trace_ids=True), rules).batch
    assert kept.rows.select(EVENT_SCHEMA.names) == result.batch.rows and dict(kept.warnings) == warnings
    traces = kept.trace_ids()
    if any(t is not None for t in ids):
        assert kept.rows.schema == batch_schema([TRACE_ID]) and traces is not None and traces.to_pylist() == ids
    else:
        assert traces is None
    rows = result.batch.rows.to_pylist()
    split = result.batch.requests
    as_tuples = [tuple(r[f] for f in EVENT_SCHEMA.names) for r in rows]
    assert as_tuples[:split] == requests
    assert as_tuples[split:] == exits
    assert pa.Table.from_batches([result.batch.rows]).validate(full=True) is None


def one_span(kind: int, attrs: list[tuple[str, Any]], status: int | None = None) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add(
        trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="n", kind=kind, start_time_unix_nano=T0_NS,
        end_time_unix_nano=T0_NS + 5_000_000)  # fmt: skip
    for key, value in attrs:
        span.attributes.add(
            key=key, value=AnyValue(**{"int_value" if isinstance(value, int) else "string_value": value})
        )
    if status is not None:
        span.status.code = status
    return request


def wire(kind: int, attrs: list[tuple[str, Any]], status: int | None = None) -> bytes:
    return one_span(kind, attrs, status).SerializeToString()


def test_the_first_key_of_the_mapping_wins_whatever_the_attribute_order() -> None:
    """Each field's keys in the mapping's order, not the span's: the generated exports rarely hold two keys of one
    field in the losing order, so this case is pinned here too."""
    mapping = SpanMapping(endpoint=("route", "http.route"), statement=("db.statement", "db.query.text"),
                          http_status=("code", "http.status_code"))  # fmt: skip
    rules = EndpointRules()
    for attrs in ([("http.route", "/b"), ("route", "/a")], [("route", "/a"), ("http.route", "/b")]):
        assert map_spans(wire(2, attrs), mapping, rules).batch.rows.column("endpoint").to_pylist() == ["/a"]
    for attrs in ([("db.query.text", "q2"), ("db.statement", "q1")], [("db.statement", "q1"), ("db.query.text", "q2")]):
        assert map_spans(wire(3, attrs), mapping, rules).batch.rows.column("db_statement").to_pylist() == ["q1"]
    for attrs in ([("http.status_code", 200), ("code", 503)], [("code", 503), ("http.status_code", 200)]):
        assert map_spans(wire(2, attrs), mapping, rules).batch.rows.column("status").to_pylist() == [False]
    # one key may give two fields (here the endpoint of SERVER spans and the statement of CLIENT spans)
    shared = SpanMapping(endpoint=("q", "http.route"), statement=("q",))
    assert map_spans(wire(2, [("q", "/x")]), shared, rules).batch.rows.column("endpoint").to_pylist() == ["/x"]
    assert map_spans(wire(3, [("q", "sel")]), shared, rules).batch.rows.column("db_statement").to_pylist() == ["sel"]
    # a key whose value is no status is passed over for the next
    assert map_spans(wire(2, [("code", "x"), ("http.status_code", "503")]), mapping, rules).batch.rows.column(
        "status").to_pylist() == [False]  # fmt: skip


GOOD_TRACE = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
#: a span's trace id as bytes (protobuf, and hex in OTLP JSON), what its event keeps, and whether it warns
TRACE_SHAPES = [
    (GOOD_TRACE, GOOD_TRACE, False), (GOOD_TRACE[8:], bytes(8) + GOOD_TRACE[8:], False),  # 16 bytes; 8, padded
    (bytes(16), None, True), (bytes(8), None, True), (b"", None, True), (GOOD_TRACE[:4], None, True),
    (GOOD_TRACE[:12], None, True), (GOOD_TRACE + GOOD_TRACE[:4], None, True), (GOOD_TRACE[:15], None, True),
]  # fmt: skip
SPAN_IDS = [(b"\x02" * 8, False), (bytes(8), True), (b"", True), (b"\x02" * 4, True), (b"\x02" * 9, True)]


def _traced(trace_id: bytes, span_id: bytes, state: str = "") -> ExportTraceServiceRequest:
    request = one_span(2, [("http.route", "/r")])
    span = request.resource_spans[0].scope_spans[0].spans[0]
    span.trace_id, span.span_id, span.trace_state = trace_id, span_id, state
    return request


@pytest.mark.parametrize("trace_id, kept, warned", TRACE_SHAPES)
@pytest.mark.parametrize("span_id, span_warned", SPAN_IDS)
def test_a_span_with_odd_ids_is_a_request_with_a_warning(
    trace_id: bytes, kept: bytes | None, warned: bool, span_id: bytes, span_warned: bool
) -> None:
    """A span's ids never cost it (the metrics do not need them; the Collector's spanmetrics connector counts such
    spans too): the trace id is kept (16 bytes; 8 left-padded) or dropped, the span id ignored, each with a warning.
    A sampled span whose span id cannot be used rounds its count as a span id of zeros (also when its bytes end the
    export's id column: nothing is read past them)."""
    mapping = SpanMapping(trace_ids=True)
    for state in ("", "ot=th:5555"):  # unsampled; a count rounded from the span id's bits
        result = map_spans(_traced(trace_id, span_id, state).SerializeToString(), mapping, EndpointRules())
        assert (result.batch.requests, result.rejects, result.spans) == (1, [], 1)
        want = {"bad trace_id": 1} if warned else {}
        assert dict(result.batch.warnings) == {**want, **({"bad span_id": 1} if span_warned else {})}
        traces = result.batch.trace_ids()
        assert (traces.to_pylist() if traces is not None else [None]) == [kept]
        weights = result.batch.weights()
        if state:
            seed = span_id if not span_warned else bytes(8)
            assert (weights.tolist() if weights is not None else [1]) == [adjusted_count(state, seed)]


def test_odd_trace_ids_in_otlp_json_on_every_transport_and_pass() -> None:
    """OTLP JSON carries ids as hex: 32 digits, 16 (padded), a UUID (its digits, as on every input), and odd ones
    (empty, not hex, all zeros, a number, a list) that are dropped with a warning: the same through the reference
    decoder (HTTP, gRPC, Kafka), the C pass and the Python pass (files); no span is rejected."""
    from drainpipe.inputs.formats.otlp_format import decode_block
    from drainpipe.inputs.messages import decode_values
    from drainpipe.inputs.options import InputOptions

    good = GOOD_TRACE.hex()
    shapes: list[tuple[Any, bytes | None]] = [
        (good, GOOD_TRACE), (good.upper(), GOOD_TRACE), (good[16:], bytes(8) + GOOD_TRACE[8:]),
        (f"{good[:8]}-{good[8:12]}-{good[12:16]}-{good[16:20]}-{good[20:]}", GOOD_TRACE), ("", None), ("zz" * 16, None),
        ("0" * 32, None), ("0" * 16, None), (good[:-1], None), (good[:24], None), (12, None), ([good], None),
        ("-" * 36, None), (f"{good[:8]}-{good[8:12]}-{good[12:16]}-{good[16:20]}-{good[20:-1]}g", None),
    ]  # fmt: skip
    spans = [{"traceId": trace, "spanId": "02" * 8, "name": "GET /x", "kind": 2, "startTimeUnixNano": "1000000",
              "endTimeUnixNano": "3000000"} for trace, _ in shapes]  # fmt: skip
    line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()
    want_ids = [kept for _, kept in shapes]
    want_warnings = {"bad trace_id": sum(kept is None for kept in want_ids)}
    mapping = SpanMapping(trace_ids=True)
    http = otlp.decode_traces(line, json_body=True, mapping=mapping, endpoints=EndpointRules())  # HTTP, gRPC
    kafka, rejects = decode_values([line], "otlp_json", mapping, EndpointRules())
    assert http.rejects == [] and rejects == []
    batches = [http.batch, kafka]
    options = InputOptions(spans=mapping)
    for off in ((), ("otlpjson",)):  # files: the C pass, and the Python pass of Spark executors
        with native.disabled(*off):
            batch, bad = decode_block(line + b"\n", 1, 0, options, True)
        assert bad == []
        batches.append(batch)
    for batch in batches:
        traces = batch.trace_ids()
        assert batch.requests == len(shapes) and traces is not None and traces.to_pylist() == want_ids
        assert dict(batch.warnings) == want_warnings
