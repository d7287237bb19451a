"""OpenTelemetry in: an application instrumented with the real OpenTelemetry Python SDK exports its spans with the
SDK's own OTLP/HTTP exporter to a running server; the stored metrics equal what was sent (counts per service and
endpoint, average latency, SLA with ERROR spans and 5xx, INTERNAL spans not counted, http.route as endpoint,
statements of CLIENT spans). The same spans as OTLP JSON give the same store. Malformed protobuf, malformed JSON and
a partly invalid export are answered as the OTLP specification says."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from grpc_status import rpc_status
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace import Status as SpanStatus
from server_testlib import request, running_server

from drainpipe.pipeline.store import open_store
from drainpipe.server.otlp_answers import GRPC_EXPORT_PATH
from drainpipe.server.service import ServiceOptions

MINUTE_NS = 60_000_000_000


def _base_ns() -> int:
    return (time.time_ns() // MINUTE_NS - 2) * MINUTE_NS  # a whole minute two minutes ago: one bucket


def emit(exporter: Callable[[], SpanExporter], plan: list[dict]) -> list:
    """Spans per ``plan`` entry (a service's requests), through the SDK: exported by one of its OTLP exporters
    (``exporter()`` makes one; batched, as applications do), and also returned (kept by an in-memory exporter)."""
    spans: list = []
    for service in plan:
        provider = TracerProvider(resource=Resource.create(
            {"service.name": service["name"], "service.instance.id": service["instance"]}))  # fmt: skip
        memory = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        provider.add_span_processor(BatchSpanProcessor(exporter(), max_export_batch_size=64,
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


def assert_as_sent(plan: list[dict], got: dict) -> None:
    """The store's figures (:func:`stored`) are what ``plan`` sent, and no other service is there."""
    want = expected(plan)
    for key, value in want.items():
        if key[0] == "statements":
            assert got.get(key) == value, key
        else:
            assert got.get(key) == pytest.approx(value), key
    assert {k for k in got if k[0] == "service_cpm"} == {k for k in want if k[0] == "service_cpm"}


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
        spans = emit(lambda: OTLPSpanExporter(endpoint=srv.url + "/v1/traces"), plan)
    assert len(spans) == 3 * (40 * 2 + 5)  # requests, their INTERNAL children and 5 statements each
    got = stored(url_a)
    assert_as_sent(plan, got)
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
        bad = [_span(bytes(16), bytes([9] * 8), base, base + 1),  # all-zero trace id: mapped, with a warning
               _span(bytes([2] * 16), bytes([8] * 8), base + 10, base)]  # ends before it starts  # fmt: skip
        document = {"resourceSpans": [{"resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "shop"}}]},
            "scopeSpans": [{"spans": good + bad}]}]}  # fmt: skip
        status, _, raw = request(traces, "POST", json.dumps(document).encode(), {"Content-Type": "application/json"})
        answer = json.loads(raw)
        assert status == 200 and answer["partialSuccess"]["rejectedSpans"] == "1", answer
        assert "end before start" in answer["partialSuccess"]["errorMessage"]
        assert "accepted with a warning: bad trace_id (1)" in answer["partialSuccess"]["errorMessage"]
        pb = ExportTraceServiceRequest()
        rs = pb.resource_spans.add()
        rs.resource.attributes.add(key="service.name").value.string_value = "shop"
        sp = rs.scope_spans.add().spans.add(trace_id=bytes([3] * 16), span_id=bytes([4] * 8), name="GET /y", kind=2,
                                            start_time_unix_nano=base, end_time_unix_nano=base + 2_000_000)  # fmt: skip
        assert sp.kind == 2
        status, _, raw = request(traces, "POST", pb.SerializeToString(), {"Content-Type": "application/x-protobuf"})
        assert status == 200 and not ExportTraceServiceResponse.FromString(raw).HasField("partial_success")
    got = stored(url)
    assert got[("service_cpm", "shop")] == 5


# ------------------------------------------------------------------------------------------------------ OTLP/gRPC


def _grpc_exporter(address: str, token: str) -> SpanExporter:
    return GrpcSpanExporter(endpoint=address, insecure=True, headers={"authorization": f"Bearer {token}"},
                            compression=grpc.Compression.Gzip)  # fmt: skip


def test_the_sdk_grpc_exporter_reaches_the_store_as_over_http(tmp_path: Path) -> None:
    """The SDK's OTLP/gRPC exporter, gzip-compressed and with the token as metadata, to ``--grpc-port``: the stored
    metrics equal what was sent, as over HTTP; the calls are counted under their path in /metrics."""
    plan = make_plan(_base_ns())
    url = f"duckdb:///{tmp_path / 'g.duckdb'}"
    with running_server(store_url=url, token="s3cret", grpc_port=0) as srv:
        assert srv.grpc is not None
        spans = emit(lambda: _grpc_exporter(srv.grpc.address, "s3cret"), plan)
        _, _, page = request(srv.url + "/metrics", headers={"Authorization": "Bearer s3cret"})
    assert len(spans) == 3 * (40 * 2 + 5)
    assert_as_sent(plan, stored(url))
    calls = [line for line in page.decode().splitlines() if f'path="{GRPC_EXPORT_PATH}"' in line]
    assert any('status="200"' in line and not line.endswith(" 0.0") for line in calls), calls


def _export_with_rejects(base: int) -> bytes:
    """Three valid SERVER spans of "shop", one with an all-zero trace id (mapped, with a warning) and one that cannot
    be mapped (end before start)."""
    pb = ExportTraceServiceRequest()
    rs = pb.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "shop"
    spans = rs.scope_spans.add().spans
    for i in range(3):
        spans.add(trace_id=bytes([1] * 16), span_id=bytes([i + 1] * 8), name="GET /x", kind=2,
                  start_time_unix_nano=base, end_time_unix_nano=base + 5_000_000)  # fmt: skip
    spans.add(trace_id=bytes(16), span_id=bytes([9] * 8), name="GET /x", kind=2, start_time_unix_nano=base,
              end_time_unix_nano=base + 1)  # fmt: skip
    spans.add(trace_id=bytes([2] * 16), span_id=bytes([8] * 8), name="GET /x", kind=2, start_time_unix_nano=base + 10,
              end_time_unix_nano=base)  # fmt: skip
    return pb.SerializeToString()


def _call(
    address: str, body: bytes, token: str | None, gzipped: bool = False
) -> tuple[bytes | None, grpc.RpcError | None]:
    """One raw Export call (bytes in, bytes out): (answer, None) or (None, the error)."""
    with grpc.insecure_channel(address) as channel:
        export = channel.unary_unary(GRPC_EXPORT_PATH)
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        compression = grpc.Compression.Gzip if gzipped else None
        try:
            return export(body, metadata=metadata, timeout=30, compression=compression), None
        except grpc.RpcError as err:
            return None, err


def test_grpc_answers_as_the_spec_says(tmp_path: Path) -> None:
    """Every OTLP/gRPC outcome: success without partial_success; partial success with the rejected count; an
    undecodable export INVALID_ARGUMENT; one over the size limit RESOURCE_EXHAUSTED without RetryInfo (not to be
    retried); no token UNAUTHENTICATED; throttling UNAVAILABLE with RetryInfo (the Retry-After delay)."""
    url = f"duckdb:///{tmp_path / 'e.duckdb'}"
    base = _base_ns()
    opts = ServiceOptions(sample_interval_s=0.25, top_refresh_s=0.5, max_decoded_bytes=64 << 10)
    with running_server(store_url=url, token="t", grpc_port=0, options=opts) as srv:
        assert srv.grpc is not None
        address = srv.grpc.address
        answer, err = _call(address, _export_with_rejects(base), "t")
        assert err is None and answer is not None
        partial = ExportTraceServiceResponse.FromString(answer).partial_success
        assert partial.rejected_spans == 1 and "end before start" in partial.error_message, partial
        assert "bad trace_id (1)" in partial.error_message, partial
        _, err = _call(address, _export_with_rejects(base), None)
        assert err is not None and err.code() == grpc.StatusCode.UNAUTHENTICATED
        _, err = _call(address, b"\xff\xff\xff garbage", "t")
        assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT and "protobuf" in err.details()
        big = ExportTraceServiceRequest()
        big.resource_spans.add().resource.attributes.add(key="pad").value.string_value = "x" * (100 << 10)
        for gzipped in (False, True):  # the limit holds after decompression too (100 KB of "x" gzip to ~100 bytes)
            _, err = _call(address, big.SerializeToString(), "t", gzipped)
            assert err is not None and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, gzipped
            status = rpc_status.from_call(err)
            assert status is None or not status.details  # no RetryInfo: the client must not retry
        good = ExportTraceServiceRequest.FromString(_export_with_rejects(base))
        del good.resource_spans[0].scope_spans[0].spans[3:]
        answer, err = _call(address, good.SerializeToString(), "t")
        assert err is None and answer is not None
        assert not ExportTraceServiceResponse.FromString(answer).HasField("partial_success")
    assert stored(url)[("service_cpm", "shop")] == 7  # 4 of the partly valid export, 3 of the good one
    throttled = ServiceOptions(sample_interval_s=0.25, top_refresh_s=0.5, max_concurrent_requests=0, retry_after_s=7)
    with running_server(store_url=f"duckdb:///{tmp_path / 'f.duckdb'}", grpc_port=0, options=throttled) as srv:
        assert srv.grpc is not None
        _, err = _call(srv.grpc.address, good.SerializeToString(), None)
    assert err is not None and err.code() == grpc.StatusCode.UNAVAILABLE
    status = rpc_status.from_call(err)
    assert status is not None and len(status.details) == 1
    info = RetryInfo()
    assert status.details[0].Unpack(info) and info.retry_delay.seconds == 7


def test_the_sdk_grpc_exporter_waits_as_the_server_s_retry_info_says(tmp_path: Path) -> None:
    """Throttled (UNAVAILABLE with RetryInfo of 3 s), the SDK's gRPC exporter waits those 3 s, not its own backoff
    (about 1 s before the first retry), then delivers: the server's delay reaches the real client."""
    base = _base_ns()
    provider = TracerProvider(resource=Resource.create({"service.name": "shop"}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("drainpipe-test")
    for i in range(5):
        tracer.start_span("GET /x", kind=SpanKind.SERVER, start_time=base + i).end(base + i + 2_000_000)
    spans = memory.get_finished_spans()
    url = f"duckdb:///{tmp_path / 'r.duckdb'}"
    closed = ServiceOptions(sample_interval_s=0.25, top_refresh_s=0.5, max_concurrent_requests=0, retry_after_s=3)
    with running_server(store_url=url, grpc_port=0, options=closed) as srv:
        assert srv.grpc is not None
        exporter = GrpcSpanExporter(endpoint=srv.grpc.address, insecure=True)
        result: list = []
        t0 = time.monotonic()
        sender = threading.Thread(target=lambda: result.append(exporter.export(spans)))
        sender.start()
        while srv.service.counters.refused_busy == 0:  # the first call is refused
            assert time.monotonic() - t0 < 10
            time.sleep(0.01)
        refused_at = time.monotonic()
        srv.service.options = dataclasses.replace(closed, max_concurrent_requests=64)  # open again
        sender.join(30)
        waited = time.monotonic() - refused_at
        exporter.shutdown()
    assert result == [SpanExportResult.SUCCESS]
    assert srv.service.counters.refused_busy == 1 and 2.5 < waited < 10, waited
    assert stored(url)[("service_cpm", "shop")] == 5
