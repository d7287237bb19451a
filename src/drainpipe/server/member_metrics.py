"""``drainpipe consume --port``: ``/metrics`` and ``/healthz`` of a group member.

``/metrics`` (Prometheus text) holds the traffic's RED series, as ``serve`` exposes them (:mod:`.red`: calls and
latency histograms per service and endpoint of every request the member hands the engine), and the member's own:

* ``drainpipe_kafka_partition_lag{topic, partition}``: messages between the partition's high watermark (as of the
  member's last fetch) and the next offset the member feeds;
* ``drainpipe_kafka_partition_offset{topic, partition}``: that next offset; ``..._committed_offset``: the one the
  store has;
* ``drainpipe_kafka_events_total{outcome}`` (``accepted``, ``rejected``) and ``drainpipe_kafka_rebalances_total{kind}``
  (``assigned``, ``revoked``, ``lost``, ``rewound``, ``fenced_commit``).

``/healthz`` answers 200 while the member runs, 503 once it stopped on its own (a store commit failed for good, a
rewind failed).

The member thread refreshes the partition figures at each checkpoint (:meth:`GroupMember.positions`); a scrape only
reads them. The server is the standard library's threading HTTP server (one thread per scrape), on ``--host``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["MemberEndpoints"]


class _MemberCollector(Collector):
    def __init__(self, member: Any) -> None:
        self.member = member

    def collect(self) -> Iterator[Any]:
        m = self.member
        lag = GaugeMetricFamily("drainpipe_kafka_partition_lag", "messages not fed yet (high watermark - next offset)",
                                labels=["topic", "partition"])  # fmt: skip
        offset = GaugeMetricFamily(
            "drainpipe_kafka_partition_offset", "the next offset fed", labels=["topic", "partition"]
        )
        committed = GaugeMetricFamily("drainpipe_kafka_partition_committed_offset", "the next offset the store has",
                                      labels=["topic", "partition"])  # fmt: skip
        for (topic, partition), (next_offset, high, stored) in sorted(m.positions.items()):
            labels = [topic, str(partition)]
            offset.add_metric(labels, next_offset)
            committed.add_metric(labels, stored)
            if high >= 0:
                lag.add_metric(labels, max(0, high - next_offset))
        events = CounterMetricFamily("drainpipe_kafka_events", "events read, by outcome", labels=["outcome"])
        events.add_metric(["accepted"], m.stats.accepted)
        events.add_metric(["rejected"], m.stats.rejected)
        rebalances = CounterMetricFamily("drainpipe_kafka_rebalances", "the member's rebalance events", labels=["kind"])
        for kind, value in (("assigned", m.assignments), ("revoked", m.revocations), ("lost", m.losses),
                            ("rewound", m.rewinds), ("fenced_commit", m.fenced_commits)):  # fmt: skip
            rebalances.add_metric([kind], value)
        yield from (lag, offset, committed, events, rebalances)


class MemberEndpoints:
    """The HTTP endpoints of one member: :meth:`start` serves them on a thread, :meth:`stop` ends it."""

    def __init__(self, member: Any, red: Collector, host: str, port: int) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(red)
        self.registry.register(_MemberCollector(member))
        registry, healthy = self.registry, lambda: not member.failed

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    ok = healthy()
                    body = json.dumps({"status": "ok" if ok else "failing", "failed": member.failed}).encode()
                    self._send(200 if ok else 503, body, "application/json")
                else:
                    self._send(404, b'{"error": "no such endpoint"}', "application/json")

            def _send(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # scrapes are not news
                return None

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="drainpipe-member-http", daemon=True)

    def start(self) -> MemberEndpoints:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
