"""The same spans into ``drainpipe serve`` and into the OpenTelemetry Collector's spanmetrics connector: the same
numbers, after mapping one model onto the other.

The Collector is built by ``benchmarks/otelcol.py`` (its builder, from the Go module proxy; not committed). Both run
on loopback. Spans are made with the OpenTelemetry Python SDK, one ``TracerProvider`` per service (the resource
carries ``service.name`` and ``service.instance.id``), each with two OTLP/HTTP exporters: one to the Collector, one
to drainpipe, so both receive the very same spans. Per service: SERVER spans named ``METHOD route`` with
``http.route`` and ``http.response.status_code`` (5xx answers with status ERROR, as HTTP instrumentations set it),
a route-less SERVER span (``GET /health``: its name is its endpoint), CONSUMER spans, and CLIENT (database) and
INTERNAL children; durations drawn from a log-normal, a share of them exactly on a bucket bound (Prometheus ``le``
bounds are upper-inclusive: both must put those in the bucket they bound). Four traces in ten are sampled, as
OpenTelemetry's probability sampling records it in the trace state (``ot=th:8``: 1/2, ``ot=th:c``: 1/4; the SDK's
samplers do not write it yet, so a sampler here does), and a few carry a malformed threshold (``ot=th:zz``): both
must count a sampled span as its adjusted count, a malformed one as 1. (Only powers of two: the connector rounds
other adjusted counts at random, so no two runs of it agree on them.)

The mapping (``docs/pipeline.md``, "Beside the OpenTelemetry Collector"): the connector counts every span per
(service, span name, span kind, status code, and here ``http.route``, configured as a dimension); drainpipe counts
request spans (SERVER and CONSUMER) per (service, endpoint), the endpoint being ``http.route``, else the span name.
So drainpipe's ``drainpipe_calls_total`` per (service, endpoint) must equal the connector's ``calls`` summed over
the SERVER and CONSUMER series of that service whose ``http_route`` (else ``span_name``) is the endpoint; its errors
the connector's ``STATUS_CODE_ERROR`` calls; and its ``drainpipe_call_duration_seconds`` buckets (``le`` in
seconds) the connector's ``duration`` buckets (``le`` in milliseconds, configured with drainpipe's bounds),
bucket by bucket.

With ``--kafka HOST:PORT`` (``scripts/kafka.sh start``): the Collector's Kafka exporter also writes the spans to a
topic (OTLP protobuf), ``drainpipe consume --encoding otlp_proto --exit-at-end`` reads it into a DuckDB store, and
the stored day counts per endpoint (calls and errors) must equal the connector's too.

Prints a table per (service, endpoint) and writes ``benchmarks/results/otel_compare.json``; exits 1 on a difference.

    .venv/bin/python benchmarks/otel_compare.py [--spans 20000] [--kafka 127.0.0.1:9092]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from prometheus_client.parser import text_string_to_metric_families

from drainpipe.pipeline.definitions import DEFAULT_LATENCY_BUCKETS_MS
from ingest_load import start_server
from otelcol import Collector

RESULTS = Path(__file__).parent / "results"
SERVICES = ("checkout", "cart", "search")
ROUTES = (
    ("GET", "/api/users/{id}"),
    ("POST", "/api/orders"),
    ("GET", "/api/products/{sku}"),
    ("PUT", "/api/carts/{id}"),
)
REQUEST_KINDS = ("SPAN_KIND_SERVER", "SPAN_KIND_CONSUMER")

Key = tuple[str, str]  # (service, endpoint)


#: a trace's sampling, recorded in its trace state, by share of the traces: (state, adjusted count, share)
SAMPLING = (("ot=th:8", 2, 0.25), ("vendor=acme,ot=th:c", 4, 0.13), ("ot=th:zz", 1, 0.02))


def _sampler() -> Any:
    """A sampler that keeps every span and gives a trace the trace state of :attr:`state` (set before its root span
    starts); children inherit their parent's, as OpenTelemetry's probability samplers propagate it."""
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
    from opentelemetry.trace import TraceState, get_current_span

    class ThresholdSampler(Sampler):
        state = ""

        def should_sample(self, parent_context: Any, trace_id: int, name: str, kind: Any = None,
                          attributes: Any = None, links: Any = None, trace_state: Any = None) -> SamplingResult:  # fmt: skip
            parent = get_current_span(parent_context).get_span_context()
            if parent.is_valid:
                return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, parent.trace_state)
            members = [tuple(m.split("=", 1)) for m in self.state.split(",") if m]
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, TraceState(members))

        def get_description(self) -> str:
            return "ThresholdSampler"

    return ThresholdSampler()


def send_spans(spans: int, endpoints: list[str], seed: int = 5) -> dict[str, int]:
    """About ``spans`` request spans over the services (each with CLIENT and INTERNAL children), exported to every
    OTLP/HTTP traces URL of ``endpoints``; returns counts by kind, and ``adjusted``: the requests they stand for."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

    rng = random.Random(seed)
    kinds: Counter[str] = Counter()
    providers = []
    sampler = _sampler()
    for s, service in enumerate(SERVICES):
        provider = TracerProvider(resource=Resource({"service.name": service, "service.instance.id": f"{service}-{s}"}),
                                  sampler=sampler)  # fmt: skip
        for url in endpoints:
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url), max_queue_size=1 << 16,
                                                           max_export_batch_size=512, schedule_delay_millis=200))  # fmt: skip
        providers.append((service, provider.get_tracer("drainpipe.compare"), provider))
    bounds = list(DEFAULT_LATENCY_BUCKETS_MS)
    now = time.time_ns()
    for i in range(spans):
        service, tracer, _ = providers[i % len(providers)]
        if rng.random() < 0.1:
            duration_ms: float = rng.choice(bounds)  # exactly on a bound: le is upper-inclusive
        else:
            duration_ms = min(rng.lognormvariate(3.5, 1.2), 20_000)
        start = now - int(60e9) + rng.randrange(0, int(50e9))
        end = start + int(round(duration_ms * 1e6))
        sampler.state, weight, draw = "", 1, rng.random()
        for state, count, share in SAMPLING:
            if draw < share:
                sampler.state, weight = state, count
                kinds[f"sampled {state}"] += 1
                break
            draw -= share
        kinds["adjusted"] += weight
        which = rng.random()
        if which < 0.08:
            span = tracer.start_span("GET /health", kind=SpanKind.SERVER, start_time=start)
            span.set_attribute("http.response.status_code", 200)
            kinds["server"] += 1
        elif which < 0.16:
            span = tracer.start_span("orders process", kind=SpanKind.CONSUMER, start_time=start)
            if rng.random() < 0.1:
                span.set_status(Status(StatusCode.ERROR))
            kinds["consumer"] += 1
        else:
            method, route = rng.choice(ROUTES)
            span = tracer.start_span(f"{method} {route}", kind=SpanKind.SERVER, start_time=start)
            code = rng.choice((200, 200, 200, 201, 404, 500, 503))
            span.set_attributes({"http.route": route, "http.request.method": method, "http.response.status_code": code})
            if code >= 500:
                span.set_status(Status(StatusCode.ERROR))  # as HTTP server instrumentations do
            kinds["server"] += 1
        context = set_span_in_context(span)
        db = tracer.start_span("SELECT shop", kind=SpanKind.CLIENT, context=context, start_time=start + 1000)
        db.set_attribute("db.query.text", "SELECT * FROM items WHERE id = ?")
        db.end(end_time=start + 1000 + rng.randrange(1, 5_000_000))
        tracer.start_span("render", kind=SpanKind.INTERNAL, context=context, start_time=start).end(end_time=end)
        span.end(end_time=end)
        kinds["client"] += 1
        kinds["internal"] += 1
    for _, _, provider in providers:
        provider.force_flush()
        provider.shutdown()
    return dict(kinds)


def scrape(url: str) -> list[Any]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return list(text_string_to_metric_families(r.read().decode()))


def drainpipe_view(families: list[Any]) -> tuple[dict[Key, int], dict[Key, int], dict[tuple[str, str, float], int]]:
    """(calls, errors, cumulative bucket counts with ``le`` in ms) per (service, endpoint) from drainpipe's RED
    series."""
    calls: dict[Key, int] = Counter()
    errors: dict[Key, int] = Counter()
    buckets: dict[tuple[str, str, float], int] = {}
    for family in families:
        for s in family.samples:
            if s.name == "drainpipe_calls_total":
                key = (s.labels["service"], s.labels["endpoint"])
                calls[key] += int(s.value)
                if s.labels["status"] == "error":
                    errors[key] += int(s.value)
            elif s.name == "drainpipe_call_duration_seconds_bucket":
                le = float(s.labels["le"]) * 1000
                buckets[(s.labels["service"], s.labels["endpoint"], round(le, 6))] = int(s.value)
    return dict(calls), dict(errors), buckets


def collector_view(families: list[Any]) -> tuple[dict[Key, int], dict[Key, int], dict[tuple[str, str, float], int]]:
    """The connector's series mapped onto drainpipe's model (module docstring): request kinds only, keyed by
    (service, ``http_route`` else ``span_name``), summed over the status codes (and span kinds)."""
    calls: dict[Key, int] = Counter()
    errors: dict[Key, int] = Counter()
    buckets: dict[tuple[str, str, float], int] = Counter()
    for family in families:
        for s in family.samples:
            if s.labels.get("span_kind") not in REQUEST_KINDS:
                continue
            key = (s.labels["service_name"], s.labels.get("http_route") or s.labels["span_name"])
            if s.name.endswith("_calls_total"):
                calls[key] += int(s.value)
                if s.labels.get("status_code") == "STATUS_CODE_ERROR":
                    errors[key] += int(s.value)
            elif s.name.endswith("_duration_milliseconds_bucket"):
                buckets[(*key, round(float(s.labels["le"]), 6))] += int(s.value)
    return dict(calls), dict(errors), dict(buckets)


def stored_view(store: str) -> tuple[dict[Key, int], dict[Key, int]]:
    """(calls, errors) per (service, endpoint) from a store's day states (``endpoint_cpm`` counts, ``endpoint_sla``
    ok counts)."""
    import duckdb

    con = duckdb.connect(store.removeprefix("duckdb:///"), read_only=True)
    try:
        rows = con.execute(
            "SELECT metric, entity, sum(n), sum(ok) FROM metric_state WHERE granularity = 'day' "
            "AND metric IN ('endpoint_cpm', 'endpoint_sla') GROUP BY metric, entity"
        ).fetchall()
    finally:
        con.close()
    calls: dict[Key, int] = {}
    errors: dict[Key, int] = {}
    for metric, entity, n, ok in rows:
        service, _, endpoint = entity.partition("/")  # (the endpoint scope's entity: service/endpoint)
        if metric == "endpoint_cpm":
            calls[(service, endpoint)] = int(n)
        else:
            errors[(service, endpoint)] = int(n) - int(ok)
    return calls, {k: v for k, v in errors.items() if v}


def settle(read: Any, expected: int, timeout_s: float = 60) -> Any:
    """``read()`` until its calls add up to ``expected`` (the exporters and the connector flush on timers)."""
    deadline = time.monotonic() + timeout_s
    while True:
        view = read()
        if sum(view[0].values()) >= expected or time.monotonic() > deadline:
            return view
        time.sleep(0.5)


def differences(name: str, ours: dict[Any, int], theirs: dict[Any, int]) -> list[str]:
    keys = set(ours) | {k for k, v in theirs.items() if v}
    return [f"{name} {k}: drainpipe {ours.get(k, 0)}, collector {theirs.get(k, 0)}"
            for k in sorted(keys, key=str) if ours.get(k, 0) != theirs.get(k, 0)]  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=20_000, help="request spans (each with two children)")
    ap.add_argument("--kafka", default=None, help="a broker: also the Collector's Kafka exporter into consume")
    ap.add_argument("--json", type=Path, default=RESULTS / "otel_compare.json")
    args = ap.parse_args()
    report: dict[str, Any] = {"spans": args.spans, "buckets_ms": list(DEFAULT_LATENCY_BUCKETS_MS)}
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="drainpipe-otel-") as tmp:
        work = Path(tmp)
        topic = f"otel-compare-{uuid.uuid4().hex[:8]}" if args.kafka else None
        kafka = (args.kafka, topic) if args.kafka and topic else None
        if kafka is not None:  # (the test broker creates no topic by itself)
            from confluent_kafka.admin import AdminClient, NewTopic

            admin = AdminClient({"bootstrap.servers": args.kafka})  # (kept: its futures need it alive)
            for future in admin.create_topics([NewTopic(topic, 3, 1)]).values():
                future.result(30)
        with Collector(work, list(DEFAULT_LATENCY_BUCKETS_MS), kafka) as collector:
            server, host, port = start_server(f"duckdb:///{work / 'serve.duckdb'}", extra=("--wal", str(work / "wal")))
            try:
                t0 = time.perf_counter()
                print(f"sending {args.spans:,} request spans to both ...", file=sys.stderr, flush=True)
                kinds = send_spans(args.spans, [f"{collector.http}/v1/traces", f"http://{host}:{port}/v1/traces"])
                report["sent"] = kinds
                report["send_s"] = round(time.perf_counter() - t0, 2)
                requests = kinds["adjusted"]  # the requests the request spans stand for
                ours = settle(lambda: drainpipe_view(scrape(f"http://{host}:{port}/metrics")), requests)
                theirs = settle(lambda: collector_view(scrape(collector.metrics)), requests)
            finally:
                server.terminate()
                server.wait(60)
        for name, i in (("calls", 0), ("errors", 1), ("bucket", 2)):
            problems += differences(name, ours[i], theirs[i])
        report["endpoints"] = {f"{s} {e}": {"calls": ours[0].get((s, e), 0), "collector_calls": theirs[0].get((s, e), 0),
                                            "errors": ours[1].get((s, e), 0),
                                            "collector_errors": theirs[1].get((s, e), 0)}
                               for s, e in sorted(set(ours[0]) | set(theirs[0]))}  # fmt: skip
        report["bucket_series_compared"] = len(set(ours[2]) | set(theirs[2]))
        if kafka is not None:
            store = f"duckdb:///{work / 'consume.duckdb'}"
            print(f"consume from the Collector's topic {topic} ...", file=sys.stderr, flush=True)
            done = subprocess.run(
                [sys.executable, "-m", "drainpipe.cli", "consume", "--bootstrap-servers", args.kafka, "--topic", topic,
                 "--group", f"g-{topic}", "--encoding", "otlp_proto", "--exit-at-end", "--store", store],
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            if done.returncode:
                problems.append(f"consume failed: {done.stderr[-2000:]}")
            else:
                calls, errors = stored_view(store)
                problems += differences("kafka calls", calls, theirs[0])
                problems += differences("kafka errors", errors, theirs[1])
                report["kafka"] = {"topic": topic, "stored_calls": sum(calls.values())}
    sent = report["sent"]
    spans = sent["server"] + sent["consumer"] + sent["client"] + sent["internal"]
    sampled = ", ".join(f"{k.split(' ', 1)[1]}: {v:,}" for k, v in sent.items() if k.startswith("sampled "))
    print(
        f"\n{sum(ours[0].values()):,} requests counted from {sent['server'] + sent['consumer']:,} request spans "
        f"({spans:,} spans in all) sent to both; traces sampled: {sampled}\n"
    )
    print("| service | endpoint | drainpipe calls | connector calls | drainpipe errors | connector errors |")
    print("|---|---|---|---|---|---|")
    for name, row in report["endpoints"].items():
        service, endpoint = name.split(" ", 1)
        print(f"| {service} | {endpoint} | {row['calls']:,} | {row['collector_calls']:,} | {row['errors']:,} | "
              f"{row['collector_errors']:,} |")  # fmt: skip
    print(f"\nhistogram: {report['bucket_series_compared']} (service, endpoint, le) buckets compared")
    if "kafka" in report:
        print(f"kafka: consume stored {report['kafka']['stored_calls']:,} calls from the Collector's topic")
    report["problems"] = problems
    print("\n" + ("the same numbers" if not problems else "DIFFERENCES:\n" + "\n".join(problems[:40])))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
