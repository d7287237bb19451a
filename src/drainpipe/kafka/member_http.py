"""``drainpipe consume --port``: the HTTP endpoints of a group member, as ``serve`` has them.

::

    GET /            the dashboard (:mod:`.dashboard`; its Kafka panel: the partitions held and their lag)
    GET /v1/stats    the live view as JSON (:mod:`.live`: the engine's queues, the store, the busiest services,
                     and a ``kafka`` section)
    GET /v1/service  one service over a range of buckets, from the store (:mod:`.drilldown`)
    GET /metrics     Prometheus text (below)
    GET /healthz     200 {"status": "ok"} while the member runs ("degraded" while a volume it writes to is low on
                     space); 503 once it stopped on its own (a store commit failed for good, a rewind failed), or
                     "disk full" while a volume is under the refusal threshold (its partitions paused)

``/metrics`` holds the traffic's RED series, as ``serve`` exposes them (:mod:`.red`: calls and latency histograms
per service and endpoint of every request the member hands the engine), and the member's own:

* ``drainpipe_kafka_partition_lag{topic, partition}``: messages between the partition's high watermark (as of the
  member's last fetch) and the next offset the member feeds;
* ``drainpipe_kafka_partition_offset{topic, partition}``: that next offset; ``..._committed_offset``: the one the
  store has;
* ``drainpipe_kafka_events_total{outcome}`` (``accepted``, ``rejected``) and ``drainpipe_kafka_rebalances_total{kind}``
  (``assigned``, ``revoked``, ``lost``, ``rewound``, ``fenced_commit``); ``drainpipe_kafka_pauses_total``: times
  the member paused its partitions because the store was behind or a volume was under the refusal threshold
  (``drainpipe_kafka_disk_pauses_total``; it keeps polling meanwhile);
* ``drainpipe_disk_free_bytes{volume, path}`` (and ``..._total_bytes``, ``..._low``) for the store's and the dead
  letter's volumes (:mod:`~drainpipe.server.disk`).

The member thread refreshes the partition figures every 0.5 s and at each checkpoint (:attr:`GroupMember.positions`,
replaced whole); a scrape or the sampler only reads them. The server is the standard library's threading HTTP
server (one thread per request), on ``--host``. The routes and their token rule are ``serve``'s (:mod:`.http_face`):
with ``--token`` (or ``DRAINPIPE_TOKEN``) every route but ``/`` and ``/healthz`` wants it, and a non-loopback
``--host`` without a token is refused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pyarrow.compute as pc
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from ..inputs import EventBatch
from ..pipeline import RemoteWriter
from ..server.http_face import ReadRoutes, check_bind, error_answer
from ..server.live import Intake, LiveOptions, Sampler
from ..server.red import RedMetrics
from ..server.remote_metrics import RemoteWriteCollector

__all__ = ["MemberEndpoints", "MemberView"]


class MemberView:
    """A group member as the live sampler watches it (:class:`~.live.Watched`): the intake is the member's read
    counts, ``max_ts`` the newest event handed to the engine, and its section the partitions held.

    :meth:`observe` runs on the member thread (it sees every batch handed to the engine), ``red.observe`` on the
    engine's ingest threads (the engine's observer: it reads the columns the aggregation made); the rest is read
    from the sampler's and the HTTP threads."""

    def __init__(self, member: Any, store_url: str, writer: RemoteWriter | None = None) -> None:
        self.member = member
        self.writer = writer
        self.engine = member.engine
        self.store = member.engine.store
        self.definitions = member.definitions
        self.store_url = store_url
        self.started = time.time()
        self.red = RedMetrics(self.definitions.latency_buckets_ms, self.definitions.max_entities)
        self._max_ts: int | None = None

    def observe(self, batch: EventBatch) -> None:
        if self.writer is not None:
            self.writer.observe(batch)
        top = pc.max(batch.rows.column("ts")).as_py()
        if top is not None and (self._max_ts is None or top > self._max_ts):
            self._max_ts = top

    @property
    def draining(self) -> bool:
        return self.member.stopping

    @property
    def max_ts(self) -> int | None:
        return self._max_ts

    def intake(self) -> Intake:
        stats = self.member.stats
        return Intake(stats.accepted, stats.rejected, reasons=dict(stats.reasons), warnings=dict(stats.warnings))

    def sections(self) -> dict[str, Any]:
        m = self.member
        partitions = [
            {
                "topic": topic,
                "partition": partition,
                "offset": offset,
                "committed": stored,
                "lag": max(0, high - offset) if high >= 0 else None,
            }  # fmt: skip
            for (topic, partition), (offset, high, stored) in sorted(m.positions.items())
        ]
        return {
            "kafka": {
                "group": m.config.group,
                "topics": list(m.config.topics),
                "partitions": partitions,
                "assignments": m.assignments,
                "revocations": m.revocations,
                "losses": m.losses,
                "rewinds": m.rewinds,
                "fenced_commits": m.fenced_commits,
                "pauses": m.pauses,
                "failed": m.failed,
            }
        }


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
        pauses = CounterMetricFamily(
            "drainpipe_kafka_pauses", "times the partitions were paused (the store behind, or its disk full)"
        )
        pauses.add_metric([], m.pauses)
        disk_pauses = CounterMetricFamily(
            "drainpipe_kafka_disk_pauses", "times a volume under the refusal threshold paused the partitions"
        )
        disk_pauses.add_metric([], m.disk_pauses)
        yield from (lag, offset, committed, events, rebalances, pauses, disk_pauses)
        if m.disk is not None:
            yield from m.disk.collect()


class MemberEndpoints:
    """The HTTP endpoints of one member (see the module docstring): :meth:`start` serves them and starts the
    sampler, :meth:`stop` ends both. Construction binds the port (``OSError`` when it cannot)."""

    def __init__(
        self, view: MemberView, host: str, port: int, options: LiveOptions | None = None, token: str | None = None
    ) -> None:
        member = view.member
        check_bind(host, token, "consume")
        self.registry = CollectorRegistry()
        self.registry.register(view.red)
        self.registry.register(_MemberCollector(member))
        if view.writer is not None:
            self.registry.register(RemoteWriteCollector(view.writer))
        self.sampler = Sampler(view, options or LiveOptions())
        registry = self.registry

        def health() -> tuple[int, dict[str, Any]]:
            """200 ``ok`` or ``degraded`` (a volume low on space), 503 ``failing`` or ``disk full`` (paused)."""
            if member.failed:
                return 503, {"status": "failing", "failed": member.failed}
            disk = member.disk.health() if member.disk is not None else None
            if disk is None:
                return 200, {"status": "ok", "failed": ""}
            return (200 if disk[0] == "degraded" else 503), {"status": disk[0], "disk": disk[1], "failed": ""}

        def metrics(accept: str) -> tuple[bytes, str]:
            encoder, content_type = choose_encoder(accept)
            return encoder(registry), content_type

        routes = ReadRoutes(health, self.sampler.view, metrics, view.store, view.definitions, token)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                answer = routes.get(self.path, self.headers.get("Authorization"), self.headers.get("Accept", ""))
                if answer is None:
                    answer = error_answer(404, f"no such endpoint: {self.path.partition('?')[0]}")
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                self.send_header("Content-Length", str(len(answer.body)))
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(answer.body)

            def log_message(self, *args: Any) -> None:  # requests are not news
                return None

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="drainpipe-member-http", daemon=True)

    def start(self) -> MemberEndpoints:
        self.sampler.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self.sampler.stop()
        self._server.shutdown()
        self._server.server_close()
