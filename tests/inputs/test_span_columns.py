"""``drainpipe.inputs.span_columns``: an export's wire bytes read into columns (ptars over the projected official
descriptors) hold what the official message classes read from the same bytes, field by field. Generated exports
carry what the projection skips (events, links, trace state, attribute values of every type, fields this
opentelemetry-proto does not know) and what is absent (a resource, a status, an attribute's value). The same exports
in OTLP JSON, read by the C pass of OTLP JSON files, give the same columns."""

from __future__ import annotations

import base64
import json
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

from drainpipe.inputs.span_columns import SpanColumns, json_span_columns, span_columns


def values() -> st.SearchStrategy[AnyValue | None]:
    return st.one_of(
        st.none(),  # a KeyValue without a value
        st.text(max_size=5).map(lambda s: AnyValue(string_value=s)),
        st.integers(-(2**63), 2**63 - 1).map(lambda i: AnyValue(int_value=i)),
        st.booleans().map(lambda b: AnyValue(bool_value=b)),
        st.floats(allow_nan=False).map(lambda f: AnyValue(double_value=f)),
        st.binary(max_size=4).map(lambda b: AnyValue(bytes_value=b)),
        st.just(AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="x")]))),
        st.just(AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="k", value=AnyValue(int_value=1))]))),
    )


def attribute_lists() -> st.SearchStrategy[list[KeyValue]]:
    pair = st.tuples(st.sampled_from(["http.route", "service.name", "k", ""]), values())
    return st.lists(pair, max_size=4).map(
        lambda pairs: [KeyValue(key=k) if v is None else KeyValue(key=k, value=v) for k, v in pairs]
    )


def _tag(field: int, wire_type: int) -> bytes:
    value, out = (field << 3) | wire_type, b""
    while value >= 0x80:
        out += bytes([value & 0x7F | 0x80])
        value >>= 7
    return out + bytes([value])


#: fields this opentelemetry-proto does not define, of every wire type (as a newer SDK may send)
UNKNOWN = _tag(1000, 0) + b"\x05" + _tag(1001, 1) + bytes(8) + _tag(1002, 2) + b"\x02ab" + _tag(1003, 5) + bytes(4)


@st.composite
def exports(draw: Any) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 3))):
        rs = request.resource_spans.add()
        if draw(st.booleans()):  # else the resource is absent
            rs.resource.SetInParent()
            rs.resource.attributes.extend(draw(attribute_lists()))
        for _ in range(draw(st.integers(0, 2))):
            ss = rs.scope_spans.add()
            ss.scope.name = "lib"
            for _ in range(draw(st.integers(0, 4))):
                span = ss.spans.add(
                    trace_id=draw(st.binary(max_size=17)), span_id=draw(st.binary(max_size=9)),
                    name=draw(st.text(max_size=4)), kind=draw(st.integers(0, 7)), trace_state="a=b",
                    start_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
                    end_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
                )  # fmt: skip
                span.attributes.extend(draw(attribute_lists()))
                status = draw(st.sampled_from([None, 0, 1, 2, 7]))
                if status is not None:
                    span.status.code = status  # type: ignore[assignment]
                    span.status.message = "m"
                if draw(st.booleans()):
                    span.events.add(name="e", time_unix_nano=1).attributes.extend(draw(attribute_lists()))
                    span.links.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
                if draw(st.booleans()):
                    span.MergeFromString(UNKNOWN)
    return request


def official(request: ExportTraceServiceRequest) -> dict[str, list]:
    """The columns, read through the official message classes."""
    out: dict[str, list] = {k: [] for k in ("resource", "kind", "trace_id", "span_id", "name", "start", "end",
                                            "status", "attrs", "resource_attrs")}  # fmt: skip

    def pairs(kvs: Any, owner: int) -> list[tuple]:
        return [
            (owner, kv.key, kv.value.string_value if kv.value.WhichOneof("value") == "string_value" else "",
             kv.value.int_value if kv.value.WhichOneof("value") == "int_value" else 0,
             kv.value.WhichOneof("value") == "int_value")
            for kv in kvs
        ]  # fmt: skip

    index = 0
    for r, rs in enumerate(request.resource_spans):
        out["resource_attrs"] += pairs(rs.resource.attributes, r)
        for ss in rs.scope_spans:
            for span in ss.spans:
                out["resource"].append(r)
                out["kind"].append(span.kind)
                out["trace_id"].append(span.trace_id)
                out["span_id"].append(span.span_id)
                out["name"].append(span.name)
                out["start"].append(span.start_time_unix_nano)
                out["end"].append(span.end_time_unix_nano)
                out["status"].append(span.status.code)
                out["attrs"] += pairs(span.attributes, index)
                index += 1
    return out


def columnar(c: SpanColumns) -> dict[str, list]:

    def pairs(a: Any) -> list[tuple]:
        present = [True] * a.owners if a.present is None else pa.Array.from_buffers(
            pa.bool_(), a.owners, [None, a.present]).to_pylist()  # fmt: skip
        has_value = [True] * len(a.keys) if a.value_valid is None else pa.Array.from_buffers(
            pa.bool_(), len(a.keys), [None, a.value_valid]).to_pylist()  # fmt: skip
        rows = zip(a.keys.to_pylist(), has_value, a.text.to_pylist(), a.integer.to_pylist())
        out = []
        for owner, (start, end) in enumerate(zip(a.offsets[:-1], a.offsets[1:])):
            for key, has_value, text, integer in [next(rows) for _ in range(start, end)]:
                if present[owner]:
                    has_text, has_int = has_value and text is not None, has_value and integer is not None
                    out.append((owner, key, text if has_text else "", integer if has_int else 0, has_int))
        return out

    status_valid = [True] * c.spans if c.status_valid is None else pa.Array.from_buffers(
        pa.bool_(), c.spans, [None, c.status_valid]).to_pylist()  # fmt: skip
    return {
        "resource": c.resource.tolist(), "kind": c.kind.to_pylist(), "trace_id": c.trace_id.to_pylist(),
        "span_id": c.span_id.to_pylist(), "name": c.name.to_pylist(), "start": c.start.to_pylist(),
        "end": c.end.to_pylist(), "attrs": pairs(c.attributes),
        "status": [code if valid else 0 for code, valid in zip(c.status_code.to_pylist(), status_valid)],
        "resource_attrs": pairs(c.resource_attributes),
    }  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(exports())
def test_the_columns_hold_what_the_official_classes_read(request: ExportTraceServiceRequest) -> None:
    body = request.SerializeToString()
    assert columnar(span_columns(body)) == official(request)
    assert span_columns(body).spans == len(official(request)["kind"])


def otlp_json(request: ExportTraceServiceRequest) -> bytes:
    """The export in OTLP JSON: protobuf's JSON mapping with hex ids, as a file exporter writes it."""
    document = json_format.MessageToDict(request)
    for rs in document.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for holder in [span, *span.get("links", [])]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in holder:
                            holder[key] = base64.b64decode(holder[key]).hex()
    return json.dumps(document).encode()


@settings(max_examples=150, deadline=None)
@given(exports())
def test_the_otlp_json_pass_reads_what_the_official_classes_read(request: ExportTraceServiceRequest) -> None:
    """The C pass over the export's OTLP JSON gives the columns the official classes read; it declines a line only
    for what it leaves to the reference on purpose (a bytes value, a double that JSON cannot write as a number)."""
    line = otlp_json(request)
    scanned = json_span_columns(line, 1)
    assert scanned is not None
    assert bool(scanned.declined) == any(word in line for word in (b'"bytesValue"', b'"Infinity"', b'"-Infinity"'))
    if not scanned.declined:
        assert columnar(scanned.columns) == official(request)
        assert scanned.line.tolist() == [0] * scanned.columns.spans


def test_bytes_that_do_not_decode_raise_value_error() -> None:
    with pytest.raises(ValueError):
        span_columns(b"\x0a\x05abc")  # a length past the end
