"""The OpenTelemetry Collector beside drainpipe: built here from its published Go modules, run on loopback.

The peer of ``drainpipe serve`` for RED metrics from spans is the Collector with the spanmetrics connector. It is
built by the OpenTelemetry Collector builder (``go.opentelemetry.io/collector/cmd/builder``, installed with ``go
install``) from the manifest below: the OTLP and Kafka receivers, the spanmetrics connector, the Prometheus and
Kafka exporters and the batch processor, one release (core v0.165.0, contrib v0.165.1). The binary goes to
``~/.cache/drainpipe-bench/otelcol-<release>-<digest of the manifest>/`` and is reused; nothing of it is
committed, and ``make test`` never builds it (it takes a few minutes and the Go module proxy).

    .venv/bin/python benchmarks/otelcol.py      # build (or find) the binary and print its path
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

CORE = "v0.165.0"
CONTRIB = "v0.165.1"
COMPONENTS = f"""\
receivers:
  - gomod: go.opentelemetry.io/collector/receiver/otlpreceiver {CORE}
  - gomod: github.com/open-telemetry/opentelemetry-collector-contrib/receiver/kafkareceiver {CONTRIB}
processors:
  - gomod: go.opentelemetry.io/collector/processor/batchprocessor {CORE}
connectors:
  - gomod: github.com/open-telemetry/opentelemetry-collector-contrib/connector/spanmetricsconnector {CONTRIB}
exporters:
  - gomod: github.com/open-telemetry/opentelemetry-collector-contrib/exporter/prometheusexporter {CONTRIB}
  - gomod: github.com/open-telemetry/opentelemetry-collector-contrib/exporter/kafkaexporter {CONTRIB}
"""
# a build per set of components: a binary built before a component was added is not reused
HOME = (Path.home() / ".cache" / "drainpipe-bench"
        / f"otelcol-{CONTRIB}-{hashlib.sha256(COMPONENTS.encode()).hexdigest()[:8]}")  # fmt: skip
BINARY = HOME / "dist" / "otelcol-drainpipe"
MANIFEST = f"""\
dist:
  name: otelcol-drainpipe
  description: OpenTelemetry Collector for drainpipe's side-by-side benchmarks
  output_path: {HOME / "dist"}
{COMPONENTS}"""


def build() -> Path:
    """The Collector binary, built once (``go install`` of the builder, then the builder over the manifest)."""
    if BINARY.exists():
        return BINARY
    HOME.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOBIN": str(HOME / "bin"), "CGO_ENABLED": "0"}
    builder = HOME / "bin" / "builder"
    if not builder.exists():
        print(f"installing the Collector builder {CORE} ...", file=sys.stderr, flush=True)
        subprocess.run(["go", "install", f"go.opentelemetry.io/collector/cmd/builder@{CORE}"], env=env, check=True)
    (HOME / "manifest.yaml").write_text(MANIFEST)
    print("building the Collector (a few minutes the first time) ...", file=sys.stderr, flush=True)
    subprocess.run([str(builder), "--config", str(HOME / "manifest.yaml")], env=env, check=True, cwd=HOME)
    return BINARY


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(grpc_port: int, http_port: int, prom_port: int, buckets_ms: list[float],
           kafka: tuple[str, str] | None = None,
           kafka_in: tuple[str, str, str] | None = None, telemetry_port: int | None = None) -> dict[str, Any]:  # fmt: skip
    """The Collector's configuration (YAML is a superset of JSON): OTLP in, spanmetrics with ``buckets_ms`` as its
    explicit histogram (milliseconds, cumulative, flushed every second, ``http.route`` as a dimension), the
    Prometheus exporter out; with ``kafka`` (servers, topic), the spans also to that topic as OTLP protobuf; with
    ``kafka_in`` (servers, topic, group), the spans of that topic (OTLP protobuf, from its first offset, as a
    member of ``group``) into spanmetrics as well; with ``telemetry_port``, the Collector's own metrics (level
    basic: ``otelcol_receiver_accepted_spans_total`` and the like) on that port, a cheap scrape beside the
    exporter's."""
    trace_exporters = ["spanmetrics"]
    exporters: dict[str, Any] = {"prometheus": {"endpoint": f"127.0.0.1:{prom_port}"}}
    receivers: dict[str, Any] = {
        "otlp": {
            "protocols": {
                "grpc": {"endpoint": f"127.0.0.1:{grpc_port}"},
                "http": {"endpoint": f"127.0.0.1:{http_port}"},
            }
        }
    }  # fmt: skip
    if kafka_in is not None:
        servers, topic, group = kafka_in
        receivers["kafka"] = {"brokers": servers.split(","), "group_id": group, "initial_offset": "earliest",
                              "traces": {"topics": [topic], "encoding": "otlp_proto"}}  # fmt: skip
        # each resource's series apart (host.name as a label): without it the exporter keeps one of the series
        # that differ only by resource, and the calls summed over its series fall short of the spans it counted
        exporters["prometheus"]["resource_to_telemetry_conversion"] = {"enabled": True}
    if kafka is not None:
        servers, topic = kafka
        exporters["kafka"] = {"brokers": servers.split(","), "traces": {"topic": topic, "encoding": "otlp_proto"}}
        trace_exporters.append("kafka")
    telemetry: dict[str, Any] = {"level": "none"}
    if telemetry_port is not None:
        prometheus = {"host": "127.0.0.1", "port": telemetry_port}
        telemetry = {"level": "basic", "readers": [{"pull": {"exporter": {"prometheus": prometheus}}}]}
    return {
        "receivers": receivers,
        "processors": {"batch": {}},
        "connectors": {
            "spanmetrics": {
                "histogram": {"unit": "ms", "explicit": {"buckets": [f"{b}ms" for b in buckets_ms]}},
                "dimensions": [{"name": "http.route"}],
                "aggregation_temporality": "AGGREGATION_TEMPORALITY_CUMULATIVE",
                "metrics_flush_interval": "1s",
            }
        },
        "exporters": exporters,
        "service": {
            "telemetry": {"logs": {"level": "warn"}, "metrics": telemetry},
            "pipelines": {
                "traces": {"receivers": list(receivers), "processors": ["batch"], "exporters": trace_exporters},
                "metrics": {"receivers": ["spanmetrics"], "exporters": ["prometheus"]},
            },
        },
    }


class Collector:
    """A running Collector (``with Collector(...) as c``): ``c.grpc`` / ``c.http`` the OTLP endpoints, ``c.metrics``
    its Prometheus exporter's URL, ``c.telemetry`` its own metrics' URL (with ``kafka_in``), ``c.proc`` the
    process. ``kafka``, ``kafka_in``: :func:`config`'s."""

    def __init__(self, work: Path, buckets_ms: list[float], kafka: tuple[str, str] | None = None,
                 kafka_in: tuple[str, str, str] | None = None) -> None:  # fmt: skip
        self.grpc_port, self.http_port, self.prom_port = free_port(), free_port(), free_port()
        telemetry_port = free_port() if kafka_in is not None else None
        self.telemetry = None if telemetry_port is None else f"http://127.0.0.1:{telemetry_port}/metrics"
        self.path = work / "otelcol.yaml"
        self.path.write_text(json.dumps(config(self.grpc_port, self.http_port, self.prom_port, buckets_ms, kafka,
                                               kafka_in, telemetry_port)))  # fmt: skip
        self.log = work / "otelcol.log"
        self.grpc = f"127.0.0.1:{self.grpc_port}"
        self.http = f"http://127.0.0.1:{self.http_port}"
        self.metrics = f"http://127.0.0.1:{self.prom_port}/metrics"

    def __enter__(self) -> Collector:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([str(build()), "--config", str(self.path)], stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.grpc_port), timeout=1):
                    with urllib.request.urlopen(self.metrics, timeout=2):
                        return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.proc.kill()
                    raise SystemExit("the Collector did not start:\n" + self.log.read_text()[-3000:]) from None
                time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


if __name__ == "__main__":
    print(build())
