"""``GET /metrics``: the runtime in Prometheus text format (prometheus-client).

A custom collector reads ``stats()`` of every engine queue at scrape time (nothing is copied between scrapes):
per-queue and per-partition buffer usage, produced / dropped / dispatched counters, per-drain-task dispatched
items, partitions and recent load, rebalance counts; plus the engine counters (store retries, write time).
Rebalance handoff durations (``RebalanceResult.duration_ms``) and store write latencies are histograms fed by
the sampler and the instrumented store. HTTP request counts and ingest latency are ordinary client metrics.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from .otlp_answers import GRPC_EXPORT_PATH
from .remote_metrics import RemoteWriteCollector
from .service import HANDOFF_BUCKETS, WRITE_BUCKETS, IngestService

PREFIX = "drainpipe"
# the paths counted under their own label (any other is "other": a label per path a client invents is unbounded)
_PATHS = frozenset(("/", "/v1/events", "/v1/traces", "/v1/stats", "/v1/service", "/metrics", "/healthz",
                    GRPC_EXPORT_PATH))  # fmt: skip


class EngineCollector(Collector):
    """Reads the live engine at scrape time."""

    def __init__(self, service: IngestService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        svc = self.service
        e = svc.engine
        g = lambda name, doc, labels=(): GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))
        c = lambda name, doc, labels=(): CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))

        partitions = g("queue_partitions", "Partitions of the queue", ["queue"])
        capacity = g("queue_partition_capacity_items", "Buffer size of each partition", ["queue"])
        used = g("queue_used_items", "Items buffered in the queue", ["queue"])
        usage = g("queue_usage_ratio", "Buffered items / capacity of the queue (0..1)", ["queue"])
        p_used = g("partition_used_items", "Items buffered in one partition", ["queue", "partition"])
        p_usage = g(
            "partition_usage_ratio", "Buffered items / capacity of one partition (0..1)", ["queue", "partition"]
        )
        produced = c("queue_produced", "Items accepted by produce", ["queue"])
        dropped = c("queue_dropped", "Items dropped: full partition (IF_POSSIBLE) or no handler", ["queue", "reason"])
        dispatched = c("queue_dispatched", "Items handed to handlers", ["queue"])
        errors = c("queue_handler_errors", "Handler calls that raised", ["queue"])
        restarts = c("queue_task_restarts", "Drain cycles that raised (the task was restarted)", ["queue"])
        lost = c("queue_lost", "Items a failed drain cycle held and could not hand on", ["queue"])
        slow = g(
            "queue_slow_handler_seconds",
            "Seconds so far of each handler call running longer than slow_handler_ms",
            ["queue", "task", "type", "method"],
        )
        t_disp = c("drain_task_dispatched", "Items dispatched by one drain task (thread)", ["queue", "task"])
        t_parts = g("drain_task_partitions", "Partitions owned by one drain task", ["queue", "task"])
        t_load = g(
            "drain_task_load_items_per_second",
            "Items per second one drain task dispatched over the last sampling interval",
            ["queue", "task"],
        )
        rebalances = c("queue_rebalances", "Rebalances that moved partitions", ["queue"])
        rebalancing = g(
            "queue_rebalancing", "1 while a handoff is in progress (revoking, fencing, assigning)", ["queue"]
        )
        failovers = c("queue_failovers", "Times a stuck drain task's partitions were taken without a fence", ["queue"])
        failed_over = g("queue_failed_over_tasks", "Drain tasks stuck in a handler call, failed over, now", ["queue"])
        loads = svc.sampler.task_load
        for q in e.queues():
            s = q.stats()
            name = q.name
            partitions.add_metric([name], s.partition_count)
            capacity.add_metric([name], s.buffer_size)
            used.add_metric([name], s.total_used())
            usage.add_metric([name], s.total_used_percentage() / 100)
            for i, n in enumerate(s.partition_used_counts):
                p_used.add_metric([name, str(i)], n)
                p_usage.add_metric([name, str(i)], n / max(1, s.buffer_size))
            produced.add_metric([name], s.produced)
            dropped.add_metric([name, "full"], s.dropped_full)
            dropped.add_metric([name, "no_handler"], s.dropped_no_handler)
            dispatched.add_metric([name], s.dispatched)
            errors.add_metric([name], s.handler_errors)
            restarts.add_metric([name], s.task_restarts)
            lost.add_metric([name], s.lost)
            for call in s.slow_calls:
                slow.add_metric([name, str(call.task), call.type_name, call.method], call.seconds)
            for t, n in enumerate(s.task_dispatched):
                t_disp.add_metric([name, str(t)], n)
            for t, owned in enumerate(s.task_partitions):
                t_parts.add_metric([name, str(t)], len(owned))
            for t, rate in enumerate(loads.get(name, ())):
                t_load.add_metric([name, str(t)], rate)
            rebalances.add_metric([name], s.rebalances)
            rebalancing.add_metric([name], 0 if s.rebalance_state == "stable" else 1)
            failovers.add_metric([name], s.failovers)
            failed_over.add_metric([name], len(s.failed_over))
        yield from (
            partitions,
            capacity,
            used,
            usage,
            p_used,
            p_usage,
            produced,
            dropped,
            dispatched,
            errors,
            restarts,
            lost,
            slow,
            failovers,
            failed_over,
            t_disp,
            t_parts,
            t_load,
            rebalances,
            rebalancing,
        )

        ec = e.counters
        for field, doc in (
            ("batches", "Event batches aggregated"),
            ("events", "Events aggregated"),
            ("partials", "Partial chunks sent to L1"),
            ("persisted_batches", "Store transactions committed"),
            ("persisted_partials", "Partials written to the store"),
            ("store_errors", "Store writes that failed for good"),
            ("store_retries", "Store writes retried because the store was unavailable"),
        ):
            yield CounterMetricFamily(f"{PREFIX}_engine_{field}", doc, value=getattr(ec, field))
        yield CounterMetricFamily(
            f"{PREFIX}_engine_store_write_seconds", "Time spent in successful store writes", value=ec.store_write_s
        )
        folded = c("engine_overflow_rows", "State rows folded into the __overflow__ entity (max_entities), by scope",
                   ["scope"])  # fmt: skip
        for scope, n in sorted(e.guard.folded.items()):
            folded.add_metric([scope], n)
        yield folded
        up = g("store_up", "1 when the last store write succeeded")
        up.add_metric([], 1 if svc.store.available else 0)
        yield up

        ic = svc.counters
        events = c("ingest_events", "Events received over HTTP, by outcome", ["outcome"])
        events.add_metric(["accepted"], ic.accepted)
        events.add_metric(["rejected"], ic.rejected)
        yield events
        warned = c("ingest_warnings", "Events accepted with a caveat, by reason (an odd optional field dropped, "
                   "such as a trace id that cannot be used; a sampled span whose sampling threshold could not be "
                   "used counts 1)", ["reason"])  # fmt: skip
        for reason, n in sorted(ic.warnings.items()):
            warned.add_metric([reason], n)
        yield warned
        refused = c("ingest_refused_requests", "Requests refused by back-pressure, by status", ["status"])
        refused.add_metric(["429"], ic.refused_busy)
        refused.add_metric(["503"], ic.refused_unavailable)
        yield refused
        lg = svc.log
        for name, doc, value in (
            ("log_bytes", "Bytes in the event log not yet in the store (the write-ahead log on disk, when durable)",
             lg.size),
            ("log_max_bytes", "The event log's byte budget: requests get 503 beyond it", lg.max_bytes),
            ("log_lag_bytes", "Bytes of the event log not yet fed to the engine", svc.feeder.lag),
            ("log_durable", "1 when acknowledged events are fsynced to a write-ahead log", int(lg.durable)),
            ("store_failed", "1 after a store write failed for good (the server accepts nothing more)",
             int(bool(svc.feeder.failed))),
        ):  # fmt: skip
            gauge = g(name, doc)
            gauge.add_metric([], value)
            yield gauge
        if svc.feeder.failed:  # why, for an alert's annotation (one series, only while failed)
            why = g("store_failure_info", "Why the server stopped accepting (a store write failed for good)",
                    ["reason"])  # fmt: skip
            why.add_metric([svc.feeder.failed[:300]], 1)
            yield why
        yield CounterMetricFamily(f"{PREFIX}_log_replayed_events", "Events replayed from the log at start-up",
                                  value=svc.feeder.replayed_events)  # fmt: skip
        draining = g("draining", "1 while shutting down")
        draining.add_metric([], 1 if svc.draining else 0)
        yield draining
        yield from svc.disk.collect()


class ServerMetrics:
    """The registry behind ``/metrics``: the engine collector plus histograms and HTTP counters."""

    def __init__(self, service: IngestService) -> None:
        self.service = service
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(EngineCollector(service))
        self.registry.register(service.red)  # the traffic's own RED metrics (calls, latency histograms)
        if service.remote_writer is not None:
            self.registry.register(RemoteWriteCollector(service.remote_writer))
        self.write_latency = Histogram(
            f"{PREFIX}_store_write_latency_seconds",
            "Latency of one store transaction (merge of a persist batch)",
            buckets=WRITE_BUCKETS,
            registry=self.registry,
        )
        self.handoff = Histogram(
            f"{PREFIX}_rebalance_handoff_seconds",
            "Duration of a rebalance handoff (revoke, fence, assign) that moved partitions",
            ["queue"],
            buckets=HANDOFF_BUCKETS,
            registry=self.registry,
        )
        self._request_counts: dict[tuple[str, int], Any] = {}  # (path, status) -> its child of ``requests``
        self.requests = Counter(
            f"{PREFIX}_http_requests",
            "Requests by path and status (OTLP/gRPC calls under their path, with the HTTP status of the outcome)",
            ["path", "status"],
            registry=self.registry,
        )
        self.ingest_latency = Histogram(
            f"{PREFIX}_ingest_request_seconds",
            "Time to answer POST /v1/events",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry,
        )

        service.store.on_write = self.write_latency.observe
        service.sampler.on_handoff = lambda queue, seconds: self.handoff.labels(queue).observe(seconds)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The page and its content type: OpenMetrics (with the exemplars) when ``accept`` asks for it, else the
        classic text format."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    def count_request(self, path: str, status: int) -> None:
        """Count a request by path and status. Thread-safe (the children are kept, by the path as counted, so a
        client's made-up paths add none: ``labels`` takes a lock and checks its arguments, once a request on serve's
        connection loop otherwise)."""
        known = path if path in _PATHS else "other"
        child = self._request_counts.get((known, status))
        if child is None:
            child = self._request_counts[(known, status)] = self.requests.labels(known, str(status))
        child.inc()
