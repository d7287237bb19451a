"""Sampled spans counted by their adjusted counts, through every OTLP transport of ``drainpipe serve``: an application
instrumented with the OpenTelemetry Python SDK, whose sampler records its probability in the span's trace state as
OpenTelemetry's probability sampling does (``ot=th:8`` is 1/2, ``ot=th:c`` 1/4; the SDK's own samplers do not write
it yet), exports the same spans over OTLP/HTTP protobuf (the SDK's exporter), OTLP/HTTP JSON and OTLP/gRPC (the
SDK's exporter). Every store holds the adjusted counts exactly: calls, errors, SLA, the weighted average; the live
RED series on ``/metrics`` count the same; malformed thresholds count 1 and are counted as warnings, and the OTLP
answer names them. (Files and Kafka carry sampled spans in their own suites: tests/engine/test_telemetry_files.py,
tests/kafka/test_consume.py and the Spark suites, which compare with the local engine and ``consume``.)"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import SpanKind, StatusCode, TraceState
from opentelemetry.trace import Status as SpanStatus
from server_testlib import request, running_server
from test_otlp import _base_ns, _grpc_exporter, stored, to_otlp_json

from testlib import wait_until

N = 24  # requests per service

#: per service: the trace state of its spans (the mixed service alternates), and what one span counts
PLAN = {
    "half": ("ot=th:8", 2),
    "quarter": ("vendor=x,ot=th:c", 4),
    "unsampled": ("", 1),
    "malformed": ("ot=th:zz", 1),
}


class ThresholdSampler(Sampler):
    """Keeps every span and writes the trace state its ``sample.state`` attribute names (a test's stand-in for a
    probability sampler: which spans were dropped does not matter here, only what the kept ones say)."""

    def should_sample(self, parent_context: Any, trace_id: int, name: str, kind: Any = None,
                      attributes: Any = None, links: Any = None, trace_state: Any = None) -> SamplingResult:  # fmt: skip
        state = (attributes or {}).get("sample.state", "")
        members = [tuple(m.split("=", 1)) for m in state.split(",") if m]
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, TraceState(members))

    def get_description(self) -> str:
        return "ThresholdSampler"


def _spans(base: int) -> Sequence[Any]:
    """Each planned service's requests, and the mixed service's: a quarter-sampled fast one, then an unsampled slow
    one, in turn."""
    spans: list[Any] = []
    services = [*((name, [state] * N) for name, (state, _) in PLAN.items()),
                ("mixed", ["ot=th:c", ""] * (N // 2))]  # fmt: skip
    for name, states in services:
        provider = TracerProvider(resource=Resource.create({"service.name": name}), sampler=ThresholdSampler())
        memory = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracer = provider.get_tracer("drainpipe-test")
        for i, state in enumerate(states):
            start = base + i * 1_000_000_000
            latency_ms = (10 if state else 100) if name == "mixed" else 5 + i
            span = tracer.start_span("GET /items", kind=SpanKind.SERVER, start_time=start,
                                     attributes={"http.route": "/items", "sample.state": state})  # fmt: skip
            if i % 6 == 1:
                span.set_status(SpanStatus(StatusCode.ERROR, "boom"))
            span.end(start + latency_ms * 1_000_000)
        spans += memory.get_finished_spans()
        provider.shutdown()
    return spans


def _expected() -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    errors = sum(1 for i in range(N) if i % 6 == 1)
    for name, (_, weight) in PLAN.items():
        out[("service_cpm", name)] = N * weight
        out[("service_error_count", name)] = errors * weight
        out[("service_sla", name)] = 100.0 * (N - errors) / N
        out[("service_resp_time", name)] = sum(5 + i for i in range(N)) / N  # one weight per service: the plain mean
    # mixed: even spans weigh 4 (10 ms), odd ones 1 (100 ms); errors are i % 6 == 1: odd, weighing 1
    out[("service_cpm", "mixed")] = N // 2 * 4 + N // 2
    out[("service_error_count", "mixed")] = errors
    out[("service_resp_time", "mixed")] = (N // 2 * 4 * 10 + N // 2 * 100) / (N // 2 * 5)
    out[("service_sla", "mixed")] = 100.0 * (N // 2 * 5 - errors) / (N // 2 * 5)
    return out


def _red(page: str) -> dict[tuple[str, str], float]:
    """``drainpipe_calls_total`` per (service, status), and the warnings counter, from a ``/metrics`` page."""
    out: dict[tuple[str, str], float] = {}
    for line in page.splitlines():
        if line.startswith("drainpipe_calls_total{"):
            labels = dict(part.split("=", 1) for part in line[line.index("{") + 1 : line.index("}")].split(","))
            out[(labels["service"].strip('"'), labels["status"].strip('"'))] = float(line.rsplit(" ", 1)[1])
        if line.startswith('drainpipe_ingest_warnings_total{reason="malformed sampling threshold"}'):
            out[("warnings", "malformed")] = float(line.rsplit(" ", 1)[1])
    return out


def test_sampled_spans_count_their_adjusted_counts_over_every_otlp_transport(tmp_path: Path) -> None:
    spans = _spans(_base_ns())
    want = _expected()
    urls = {kind: f"duckdb:///{tmp_path / kind}.duckdb" for kind in ("protobuf", "json", "grpc")}
    # OTLP/HTTP protobuf, by the SDK's exporter; the live RED series and the warnings on /metrics
    with running_server(store_url=urls["protobuf"]) as srv:
        assert OTLPSpanExporter(endpoint=srv.url + "/v1/traces").export(spans) == SpanExportResult.SUCCESS
        total = sum(v for (metric, _), v in want.items() if metric == "service_cpm")
        # (the series count what the engine was fed: the feeder reads the log after the answer)
        red = wait_until(lambda: (r := _red(request(srv.url + "/metrics")[2].decode())) and sum(
            v for (s, _), v in r.items() if s != "warnings") == total and r, timeout=30)  # fmt: skip
    for name, (_, weight) in PLAN.items():
        errors = want[("service_error_count", name)]
        assert (red.get((name, "ok"), 0), red.get((name, "error"), 0)) == (N * weight - errors, errors), name
    assert red[("mixed", "ok")] + red[("mixed", "error")] == want[("service_cpm", "mixed")]
    assert red[("warnings", "malformed")] == N
    # OTLP/HTTP JSON: the answer names the warning (with no span rejected: the spec's warning)
    with running_server(store_url=urls["json"]) as srv:
        status, _, raw = request(srv.url + "/v1/traces", "POST", to_otlp_json(spans),
                                 {"Content-Type": "application/json"})  # fmt: skip
        answer = json.loads(raw)
        assert status == 200 and answer["partialSuccess"] == {
            "errorMessage": f"accepted with a warning: malformed sampling threshold ({N})"}, answer  # fmt: skip
        warnings = wait_until(lambda: json.loads(request(srv.url + "/v1/stats")[2])["ingest"]["warnings"])
        assert warnings == {"malformed sampling threshold": N}  # (the live view, sampled every 0.25 s)
    # OTLP/gRPC, by the SDK's exporter
    with running_server(store_url=urls["grpc"], token="t", grpc_port=0) as srv:
        assert srv.grpc is not None
        assert _grpc_exporter(srv.grpc.address, "t").export(spans) == SpanExportResult.SUCCESS
    got = {kind: stored(url) for kind, url in urls.items()}
    for key, value in want.items():
        assert got["protobuf"].get(key) == pytest.approx(value), key
    assert got["json"] == got["protobuf"] and got["grpc"] == got["protobuf"]
