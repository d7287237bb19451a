"""OpenTelemetry in: an application instrumented with the real OpenTelemetry Python SDK exports its spans with the
SDK's own OTLP/HTTP exporter to a running server; the stored metrics equal what was sent (counts per service and
endpoint, average latency, SLA with ERROR spans and 5xx, INTERNAL spans not counted, http.route as endpoint,
statements of CLIENT spans). The same spans as OTLP JSON give the same store. Malformed protobuf, malformed JSON and
a partly invalid export are answered as the OTLP specification says."""

from __future__ import annotations

import base64
import gzip
import json
import time
from collections import defaultdict
from pathlib import Path

import pytest
from google.protobuf import json_format
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace import Status as SpanStatus
from server_testlib import request, running_server

from drainpipe.pipeline.store import open_store

MINUTE_NS = 60_000_000_000


def _base_ns() -> int:
    return (time.time_ns() // MINUTE_NS - 2) * MINUTE_NS  # a whole minute two minutes ago: one bucket


def emit(url: str, plan: list[dict]) -> list:
    """Spans per ``plan`` entry (a service's requests), through the SDK: exported by its OTLP/HTTP exporter to
    ``url`` (batched, as applications do), and also returned (kept by an in-memory exporter)."""
    spans: list = []
    for service in plan:
        provider = TracerProvider(resource=Resource.create(
            {"service.name": service["name"], "service.instance.id": service["instance"]}))  # fmt: skip
        memory = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url), max_export_batch_size=64,
                                                       schedule_delay_millis=50))  # fmt: skip
        tracer = provider.get_tracer("drainpipe-test")
        for r in service["requests"]:
            kind = SpanKind.CONSUMER if r.get("consumer") else SpanKind.SERVER
            attrs = {"http.route": r["route"]} if r.get("route") else {}
            if "http_status" in r:
                attrs["http.response.status_code"] = r["http_status"]
            span = tracer.start_span(r["name"], kind=kind, attributes=attrs, start_time=r["start"])
            if r.get("error"):
                span.set_status(SpanStatus(StatusCode.ERROR, "boom"))
            # children: INTERNAL work (not a request) and a database call (a statement)
            from opentelemetry import trace

            ctx = trace.set_span_in_context(span)
            tracer.start_span("work", context=ctx, kind=SpanKind.INTERNAL, start_time=r["start"]).end(r["end"])
            if r.get("sql"):
                db = tracer.start_span("SELECT", context=ctx, kind=SpanKind.CLIENT, start_time=r["start"],
                                       attributes={"db.query.text": r["sql"]})  # fmt: skip
                db.end(r["start"] + r["sql_ns"])
            span.end(r["end"])
        assert provider.force_flush(10_000)
        spans += memory.get_finished_spans()
        provider.shutdown()
    return spans


def make_plan(base: int) -> list[dict]:
    plan = []
    for s in range(3):
        requests = []
        for i in range(40):
            start = base + (s * 40 + i) * 100_000_000  # within the minute
            requests.append({
                "name": f"GET /orders/{1000 + i}" if i % 4 == 0 else "GET /items",
                "route": None if i % 4 == 0 else "/items/{id}",
                "start": start, "end": start + (5 + 7 * i + s) * 1_000_000,
                "error": i % 10 == 3, "http_status": 503 if i % 10 == 5 else 200,
                "consumer": i == 39, "sql": f"SELECT * FROM t{s} WHERE k = ?" if i % 8 == 1 else None,
                "sql_ns": (100 + i) * 1_000_000,
            })  # fmt: skip
        plan.append({"name": f"svc{s}", "instance": f"i-{s}", "requests": requests})
    return plan


def expected(plan: list[dict]) -> dict:
    out: dict = {}
    for svc in plan:
        rs = svc["requests"]
        lat = [(r["end"] - r["start"]) / 1e6 for r in rs]
        ok = [not (r["error"] or r["http_status"] >= 500) for r in rs]
        name = svc["name"]
        out[("service_cpm", name)] = len(rs)
        out[("service_resp_time", name)] = sum(lat) / len(lat)
        out[("service_sla", name)] = 100.0 * sum(ok) / len(rs)
        out[("service_error_count", name)] = len(rs) - sum(ok)
        out[("instance_cpm", f"{name}/i-{name[-1]}")] = len(rs)
        by_endpoint: dict = defaultdict(int)
        for r in rs:
            endpoint = r["route"] or r["name"].replace(r["name"].rsplit("/", 1)[1], "{id}")
            by_endpoint[endpoint] += 1
        for endpoint, n in by_endpoint.items():
            out[("endpoint_cpm", f"{name}/{endpoint}")] = n
        statements = sorted(((r["sql_ns"] / 1e6, r["sql"]) for r in rs if r["sql"]), reverse=True)
        out[("statements", name)] = statements[:10]
    return out


def stored(url: str) -> dict:
    store = open_store(url)
    try:
        out: dict = {}
        for metric, entity, _gran, _, label, value in store.query(granularity="minute"):
            if metric in ("service_cpm", "service_resp_time", "service_sla", "service_error_count", "instance_cpm",
                          "endpoint_cpm") and not label:  # fmt: skip
                out[(metric, entity)] = out.get((metric, entity), 0) + value
        statements: dict = defaultdict(list)
        for _name, entity, _bucket, _rank, key, latency in store.query_topn("top_slow_statements"):
            statements[entity].append((latency, key))
        for entity, rows in statements.items():
            out[("statements", entity)] = sorted(rows, reverse=True)
        return out
    finally:
        store.close()


def to_otlp_json(spans) -> bytes:
    """The SDK's spans as OTLP JSON (protobuf's JSON mapping, ids in hex)."""
    document = json_format.MessageToDict(encode_spans(spans))
    for rs in document["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(document).encode()


def test_the_sdk_exporter_reaches_the_store_and_otlp_json_gives_the_same(tmp_path: Path) -> None:
    plan = make_plan(_base_ns())
    url_a, url_b = f"duckdb:///{tmp_path / 'a.duckdb'}", f"duckdb:///{tmp_path / 'b.duckdb'}"
    with running_server(store_url=url_a) as srv:
        spans = emit(srv.url + "/v1/traces", plan)
    assert len(spans) == 3 * (40 * 2 + 5)  # requests, their INTERNAL children and 5 statements each
    want = expected(plan)
    got = stored(url_a)
    for key, value in want.items():
        if key[0] == "statements":
            assert got.get(key) == value, key
        else:
            assert got.get(key) == pytest.approx(value), key
    assert {k for k in got if k[0] == "service_cpm"} == {k for k in want if k[0] == "service_cpm"}
    with running_server(store_url=url_b) as srv:
        body = to_otlp_json(spans)
        status, headers, raw = request(srv.url + "/v1/traces", "POST", gzip.compress(body),
                                       {"Content-Type": "application/json", "Content-Encoding": "gzip"})  # fmt: skip
        assert status == 200 and headers["Content-Type"] == "application/json", raw
        assert json.loads(raw) == {}  # an ExportTraceServiceResponse without partial_success
    assert stored(url_b) == got


def _span(trace_id: bytes, span_id: bytes, start: int, end: int) -> dict:
    return {"traceId": trace_id.hex(), "spanId": span_id.hex(), "name": "GET /x", "kind": 2,
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(end)}  # fmt: skip


def test_bad_bodies_and_partial_success_as_the_spec_says(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'c.duckdb'}"
    base = _base_ns()
    with running_server(store_url=url) as srv:
        traces = srv.url + "/v1/traces"
        status, headers, raw = request(
            traces, "POST", b"\xff\xff\xff garbage", {"Content-Type": "application/x-protobuf"}
        )
        assert status == 400 and headers["Content-Type"] == "application/x-protobuf"
        assert "protobuf" in Status.FromString(raw).message and Status.FromString(raw).code == 3
        status, headers, raw = request(traces, "POST", b"{not json", {"Content-Type": "application/json"})
        assert status == 400 and json.loads(raw)["message"].startswith("invalid JSON")
        status, _, raw = request(traces, "POST", b"x", {"Content-Type": "text/plain"})
        assert status == 415 and Status.FromString(raw).code == 3
        good = [_span(bytes([1] * 16), bytes([i + 1] * 8), base, base + 5_000_000) for i in range(3)]
        bad = [_span(bytes(16), bytes([9] * 8), base, base + 1),  # all-zero trace id
               _span(bytes([2] * 16), bytes([8] * 8), base + 10, base)]  # ends before it starts  # fmt: skip
        document = {"resourceSpans": [{"resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "shop"}}]},
            "scopeSpans": [{"spans": good + bad}]}]}  # fmt: skip
        status, _, raw = request(traces, "POST", json.dumps(document).encode(), {"Content-Type": "application/json"})
        answer = json.loads(raw)
        assert status == 200 and answer["partialSuccess"]["rejectedSpans"] == "2", answer
        assert "trace_id" in answer["partialSuccess"]["errorMessage"] and "end before start" in answer[
            "partialSuccess"]["errorMessage"]  # fmt: skip
        pb = ExportTraceServiceRequest()
        rs = pb.resource_spans.add()
        rs.resource.attributes.add(key="service.name").value.string_value = "shop"
        sp = rs.scope_spans.add().spans.add(trace_id=bytes([3] * 16), span_id=bytes([4] * 8), name="GET /y", kind=2,
                                            start_time_unix_nano=base, end_time_unix_nano=base + 2_000_000)  # fmt: skip
        assert sp.kind == 2
        status, _, raw = request(traces, "POST", pb.SerializeToString(), {"Content-Type": "application/x-protobuf"})
        assert status == 200 and not ExportTraceServiceResponse.FromString(raw).HasField("partial_success")
    got = stored(url)
    assert got[("service_cpm", "shop")] == 4
