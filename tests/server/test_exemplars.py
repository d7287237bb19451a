"""Exemplars (``[prometheus] exemplars = true``): spans keep their trace ids.

* On ``/metrics``: each latency bucket of the live RED histogram links to the slowest traced request in it, exposed
  in the OpenMetrics format when the scraper asks for it (the classic text format cannot carry them). A real
  Prometheus (Debian's, with its exemplar storage on) scrapes the server and gives the exemplars back through its
  query API: the trace ids of the slowest span per service, endpoint and bucket.
* Stored (the top-N ``exemplars``, per endpoint, minute and latency bucket) and sent by remote-write: the slowest of
  each endpoint and minute, on its p99 series; Prometheus gives back exactly the store's."""

from __future__ import annotations

import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from server_testlib import PROMETHEUS, prometheus, request, running_server

from drainpipe.pipeline.definitions import (
    DEFAULT_LATENCY_BUCKETS_MS,
    default_definitions,
    parse_definitions,
    with_exemplars,
)
from testlib import wait_until

pytestmark = [
    pytest.mark.skipif(
        not Path(PROMETHEUS).exists(), reason="needs Debian's prometheus package (make test installs it)"
    ),
    pytest.mark.wall_clock("a real Prometheus takes samples by its own clock"),
]


def _export(now_ns: int) -> tuple[bytes, dict[tuple[str, str, float], str]]:
    """An export of SERVER spans over two services and routes, latencies spread over the buckets; and the trace id
    (hex) of the slowest span per (service, route, bucket bound in seconds)."""
    request = ExportTraceServiceRequest()
    slowest: dict[tuple[str, str, float], tuple[float, str]] = {}
    bounds = [*DEFAULT_LATENCY_BUCKETS_MS, float("inf")]
    for s, service in enumerate(("shop", "cart")):
        rs = request.resource_spans.add()
        rs.resource.attributes.add(key="service.name").value.string_value = service
        spans = rs.scope_spans.add().spans
        for i in range(120):
            route = f"/r{i % 2}"
            latency_ms = (i * 37 + s * 11) % 3000 + 0.5
            trace_id = (s * 1000 + i + 1).to_bytes(16, "big")
            span = spans.add(trace_id=trace_id, span_id=(i + 1).to_bytes(8, "big"), name="GET", kind=2,
                             start_time_unix_nano=now_ns - int(latency_ms * 1e6), end_time_unix_nano=now_ns)  # fmt: skip
            span.attributes.add(key="http.route").value.string_value = route
            le = next(b for b in bounds if latency_ms <= b)
            key = (service, route, le / 1000 if le != float("inf") else le)
            if latency_ms > slowest.get(key, (-1.0, ""))[0]:
                slowest[key] = (latency_ms, trace_id.hex())
    return request.SerializeToString(), {k: v[1] for k, v in slowest.items()}


def _exemplars(base: str, start: float, end: float) -> dict[tuple[str, str, float], list[str]]:
    query = urllib.parse.urlencode({"query": "drainpipe_call_duration_seconds_bucket", "start": start, "end": end})
    with urllib.request.urlopen(f"{base}/api/v1/query_exemplars?{query}", timeout=10) as answer:
        import json

        data = json.loads(answer.read())["data"]
    out: dict[tuple[str, str, float], list[str]] = {}
    for series in data:
        labels: dict[str, Any] = series["seriesLabels"]
        key = (labels["service"], labels["endpoint"], float(labels["le"]))
        out[key] = [e["labels"]["trace_id"] for e in series["exemplars"]]
    return out


def test_prometheus_stores_the_slowest_trace_of_each_bucket_as_its_exemplar(tmp_path: Path) -> None:
    body, slowest = _export(time.time_ns())
    toml = '[prometheus]\nexemplars = true\n[[metric]]\nname = "c"\nscope = "service"\nfunction = "cpm"\n'
    assert parse_definitions(toml).spans.trace_ids  # the switch, in the metrics TOML
    definitions = with_exemplars(default_definitions())
    store_url = f"duckdb:///{tmp_path / 'store.duckdb'}"
    with running_server(store_url=store_url, definitions=definitions) as srv:
        status, _, _ = request(srv.url + "/v1/traces", "POST", body, {"Content-Type": "application/x-protobuf"})
        assert status == 200
        wait_until(
            lambda: b"drainpipe_calls_total{" in request(srv.url + "/metrics")[2], 30, what="the series", interval=0.1
        )
        # the classic text format has no exemplars; OpenMetrics, when asked for, has them
        _, headers, classic = request(srv.url + "/metrics")
        assert headers["Content-Type"].startswith("text/plain") and b"trace_id" not in classic
        _, headers, page = request(srv.url + "/metrics", headers={"Accept": "application/openmetrics-text"})
        assert headers["Content-Type"].startswith("application/openmetrics-text") and b'# {trace_id="' in page
        target = srv.url.removeprefix("http://")
        config = ("global: {scrape_interval: 1s}\n"
                  f"scrape_configs:\n  - job_name: drainpipe\n    static_configs: [{{targets: ['{target}']}}]\n")  # fmt: skip
        with prometheus(tmp_path, config, ["--enable-feature=exemplar-storage"]) as prom:
            start = time.time() - 60
            got = wait_until(lambda: (e := _exemplars(prom, start, time.time() + 60)) and len(e) >= len(slowest) and e,
                           30, what="the exemplars in Prometheus", interval=0.1)  # fmt: skip
    for key, trace in slowest.items():
        assert got.get(key) == [trace], key
    assert set(got) == set(slowest)  # no bucket without traced requests has one
    # the store keeps the same ones: the top-N "exemplars", per endpoint, minute and latency bucket (the spans all
    # end in one minute)
    from drainpipe.pipeline.store import open_store

    with open_store(store_url) as store:
        stored = store.query_topn("exemplars")
    assert len({row[2] for row in stored}) == 1
    bounds = [*DEFAULT_LATENCY_BUCKETS_MS, float("inf")]
    as_stored = {}
    for _n, entity, _bucket, _rank, trace, latency in stored:
        le = next(b for b in bounds if latency <= b)
        service, route = entity.split("/", 1)
        as_stored[(service, route, le / 1000 if le != float("inf") else le)] = trace
    assert as_stored == slowest


def test_stored_exemplars_reach_prometheus_by_remote_write(tmp_path: Path) -> None:
    """``drainpipe run --remote-write`` over OTLP JSON spans of the last minutes, with exemplars on: every endpoint's
    slowest traced request of each minute is in Prometheus' exemplar storage, on the endpoint's p99 series, with the
    trace id, latency and minute the store holds; nothing else."""
    import json
    import subprocess
    import sys

    from drainpipe.pipeline.store import open_store
    from telemetry_files import otlp_file

    base_ms = (int(time.time() * 1000) // 60_000 - 10) * 60_000
    otlp_file(tmp_path / "traces.otlp.jsonl", 4, base_ms)
    (tmp_path / "metrics.toml").write_text(
        '[prometheus]\nexemplars = true\n[[metric]]\nname = "endpoint_percentile"\nscope = "endpoint"\n'
        'function = "percentile"\nprecision_ms = 10\n'
    )
    store_url = f"duckdb:///{tmp_path / 'store.duckdb'}"
    (tmp_path / "prom").mkdir()
    flags = ["--web.enable-remote-write-receiver", "--enable-feature=exemplar-storage"]
    with prometheus(tmp_path / "prom", "global: {scrape_interval: 1h}\n", flags) as prom:
        done = subprocess.run([str(Path(sys.executable).with_name("drainpipe")), "run", "-q", "--input",
                               str(tmp_path / "traces.otlp.jsonl"), "--metrics", str(tmp_path / "metrics.toml"),
                               "--store", store_url, "--remote-write", prom + "/api/v1/write"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        with open_store(store_url) as store:
            rows = store.query_topn("exemplars")
        want = {(entity, bucket): (trace, latency) for _n, entity, bucket, rank, trace, latency in rows if rank == 1}
        assert len(want) > 10 and f"with {len(want)} exemplars" in done.stdout, done.stdout
        query = urllib.parse.urlencode({"query": 'drainpipe_endpoint_percentile{percentile="p99"}',
                                        "start": base_ms / 1000 - 60, "end": time.time() + 60})  # fmt: skip

        def exemplars() -> dict[tuple[str, str], tuple[str, float]]:
            with urllib.request.urlopen(f"{prom}/api/v1/query_exemplars?{query}", timeout=10) as answer:
                data = json.loads(answer.read())["data"]
            out = {}
            for series in data:
                labels = series["seriesLabels"]
                for e in series["exemplars"]:
                    minute = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(e["timestamp"])))
                    out[(f"{labels['service']}/{labels['endpoint']}", minute)] = (e["labels"]["trace_id"],
                                                                                 float(e["value"]))  # fmt: skip
            return out

        got = wait_until(
            lambda: (e := exemplars()) and len(e) >= len(want) and e,
            30,
            what="the exemplars in Prometheus",
            interval=0.1,
        )
    assert got == want


def test_http_json_events_may_carry_a_trace_id(tmp_path: Path) -> None:
    """``POST /v1/events`` (a JSON array, and JSON Lines): an event's optional ``trace_id`` (32 hex digits) is kept
    and stored as an exemplar; one that cannot be used is dropped, its event counted with a warning."""
    from server_testlib import post_events

    from drainpipe.pipeline.store import open_store

    now = int(time.time() * 1000) // 60_000 * 60_000
    traces = [(i + 1).to_bytes(16, "big").hex() for i in range(3)]
    array = [{"ts": now, "service": "web", "endpoint": "/a", "latency_ms": 10.0 * (i + 1), "trace_id": traces[i]}
             for i in range(2)]  # fmt: skip
    array.append({"ts": now, "service": "web", "endpoint": "/a", "latency_ms": 5.0, "trace_id": "0" * 32})
    lines = [{"ts": now, "service": "web", "endpoint": "/b", "latency_ms": 900.0, "trace_id": traces[2].upper()},
             {"ts": now, "service": "web", "endpoint": "/b", "latency_ms": 1.0}]  # fmt: skip
    store_url = f"duckdb:///{tmp_path / 'store.duckdb'}"
    with running_server(store_url=store_url, definitions=with_exemplars(default_definitions())) as srv:
        status, _, answer = post_events(srv.url, array)
        assert status == 200 and (answer["accepted"], answer["rejected"]) == (3, 0), answer
        assert answer["warnings"] == {"bad trace_id": 1}, answer
        status, _, answer = post_events(srv.url, lines, kind="ndjson")
        assert status == 200 and answer["rejected"] == 0, answer
    with open_store(store_url) as store:
        stored = {(row[1], row[4], row[5]) for row in store.query_topn("exemplars")}
    assert stored == {("web//a", traces[0], 10.0), ("web//a", traces[1], 20.0), ("web//b", traces[2], 900.0)}
