"""The serving core, without HTTP: a long-running live :class:`LocalEngine`, admission control, and the sampled
view that ``/v1/stats``, ``/metrics``, the dashboard and ``drainpipe stats`` show.

Admission (back-pressure as refusals, never unbounded memory). An HTTP request is only handed to the engine
when the pipeline has room for it:

* at most ``max_pending_batches`` accepted batches may wait for the ingest stage (the engine's ingest queue is
  BLOCKING and small; we never let request threads pile up on it);
* no partition of L1, L2, top-N or persist may be above ``high_watermark`` of its buffer. L1 runs IF_POSSIBLE
  (live mode drops when a partition is *full*); refusing at the watermark keeps it from ever getting full, so
  what was accepted is not dropped;
* at most ``max_persist_backlog`` merged L2 flushes may wait for the store. The persist queue's own buffer is
  large (1000 flushes, each one metric's merged states of a flush period): waiting for its watermark would let
  a store outage hold hundreds of MB before anyone is refused. With the cap, an outage is refused (503) after a
  few flush periods, and what was accepted waits in small, bounded buffers until the store is back.

A request that finds no room waits up to ``admit_wait_s``, then is refused: 503 when the store is unavailable
or the server is shutting down, 429 when the pipeline is merely busy; both with ``Retry-After``.

Source ids. With a server store (PostgreSQL) the events of one request get a fresh source id (``http:<uuid4>``):
requests are never replayed, and the id keeps the store's idempotent merge exact when the engine retries a write
whose COMMIT went through but whose acknowledgement was lost. The store records every (source, definition) pair
in its ``applied_sources`` ledger; once a write has succeeded it is never retried, so its request ids are then
removed again (``Store.forget``, after the write, on the persist thread) and the ledger holds only the writes in
flight instead of growing with every request. With the embedded DuckDB store a write either commits or raises (no
lost acknowledgements, no retries), so requests carry no source id: the ledger would be pure growth, one row per
request and definition, held by DuckDB in the server's memory (its primary-key index) and scanned on every write.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import IngestRefused, StoreUnavailable
from ..pipeline.definitions import Definitions, MetricDef
from ..pipeline.engine import EngineOptions, LocalEngine
from ..pipeline.functions import iso_from_ms

log = logging.getLogger("drainpipe.server")

# store write latency buckets (seconds) for the histogram
WRITE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
HANDOFF_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass(frozen=True)
class ServiceOptions:
    """Limits and periods of a serving engine."""

    max_body_bytes: int = 16 << 20  # request body as sent (compressed or not): 413 above
    max_decoded_bytes: int = 64 << 20  # body after gzip: 413 above
    max_events: int = 200_000  # events (records) per request: 413 above
    max_pending_batches: int = 8  # accepted batches waiting for the ingest stage
    high_watermark: float = 0.5  # refuse when a downstream partition is fuller than this
    max_persist_backlog: int = 128  # refuse when more L2 flushes than this wait for the store
    admit_wait_s: float = 0.5  # how long a request waits for room before 429/503
    max_concurrent_requests: int = 64  # POSTs being processed at once: 429 above
    header_deadline_s: float = 30.0  # a request line and headers (or an idle keep-alive wait) take at most this
    body_deadline_s: float = 60.0  # a request body takes at most this to arrive
    retry_after_s: int = 1
    sample_interval_s: float = 1.0  # the dashboard's time resolution
    history: int = 300  # samples kept (5 minutes at 1 s)
    top_services: int = 8
    top_refresh_s: float = 2.0


def serve_engine_options(**overrides: Any) -> EngineOptions:
    """The engine configuration for serving: live mode (L1 IF_POSSIBLE), small buffers (admission keeps them
    from filling), one batch per ingest partition, shorter flush periods so the dashboard moves."""
    base: dict[str, Any] = dict(
        live=True,
        l1_buffer=2_000,
        l2_buffer=1_000,
        ingest_buffer=2,
        l1_flush_s=0.5,
        l2_flush_s=1.0,
        rebalance_interval_ms=1_000,
        store_retry_s=(0.05, 2.0),
    )
    base.update(overrides)
    return EngineOptions(**base)


REQUEST_SOURCE_PREFIX = "http:"  # source ids of request batches (never replayed)


def needs_source_ids(store: Any) -> bool:
    """Whether request batches need source ids for exactness: unless the store is embedded (DuckDB), a write can
    commit and still fail for the engine (a lost acknowledgement), and only the id makes the retry a no-op."""
    from ..pipeline.store import DuckDBStore

    return not isinstance(store, DuckDBStore)


class InstrumentedStore:
    """Wraps the engine's store: times each merge (write latency), notices unavailability. Everything else passes
    through. ``merge`` is only called from the engine's single persist thread.

    ``forget_prefix``: sources starting with it are never merged again once written (HTTP requests), so after each
    successful merge they are removed from the store's ledger; if that fails they are tried after the next one.
    """

    def __init__(self, store: Any, forget_prefix: str | None = None) -> None:
        self._store = store
        self._forget_prefix = forget_prefix
        self._to_forget: set[str] = set()
        self.lock = threading.Lock()
        self.writes = 0
        self.failures = 0
        self.consecutive_failures = 0
        self.last_error = ""
        self.last_write_s = 0.0
        self.write_seconds: deque[float] = deque(maxlen=2048)  # recent latencies (for p50/p99 in the view)
        self.on_write: Callable[[float], None] | None = None  # e.g. a Prometheus histogram's observe

    def merge(self, partials: Iterable[Any], **kwargs: Any) -> Any:
        partials = list(partials)
        t0 = time.perf_counter()
        try:
            result = self._store.merge(partials, **kwargs)
        except StoreUnavailable as exc:
            with self.lock:
                self.failures += 1
                self.consecutive_failures += 1
                self.last_error = str(exc)
            raise
        dt = time.perf_counter() - t0
        with self.lock:
            self.writes += 1
            self.consecutive_failures = 0
            self.last_write_s = dt
            self.write_seconds.append(dt)
        if self.on_write is not None:
            self.on_write(dt)
        if self._forget_prefix is not None:
            self._forget([p.sources for p in partials])
        return result

    def _forget(self, source_sets: list[Any]) -> None:
        prefix = self._forget_prefix
        self._to_forget.update(s for sources in source_sets for s in sources if s.startswith(prefix))
        if not self._to_forget:
            return
        try:
            self._store.forget(self._to_forget)
        except Exception as exc:
            log.warning("could not trim the store's source ledger (%s); will retry after the next write", exc)
            return
        self._to_forget.clear()

    @property
    def available(self) -> bool:
        return self.consecutive_failures == 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@dataclass
class IngestCounters:
    requests: int = 0
    accepted: int = 0  # events handed to the engine
    rejected: int = 0  # events that failed validation
    refused_busy: int = 0  # 429
    refused_unavailable: int = 0  # 503
    batches: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


class IngestService:
    """A live engine plus admission control and sampling. ``submit`` from any thread; ``close`` once."""

    def __init__(
        self,
        definitions: Definitions,
        store: Any,
        *,
        store_url: str = "",
        engine_options: EngineOptions | None = None,
        options: ServiceOptions | None = None,
        name: str = "serve",
    ) -> None:
        self.definitions = definitions
        self.options = options or ServiceOptions()
        self.store_url = store_url
        self.source_ids = needs_source_ids(store)
        self.store = InstrumentedStore(store, forget_prefix=REQUEST_SOURCE_PREFIX if self.source_ids else None)
        self.engine = LocalEngine(definitions, self.store, engine_options or serve_engine_options(), name=name)
        self.counters = IngestCounters()
        self.started = time.time()
        self._lock = threading.Lock()
        self._draining = False
        self._closed = False
        self._inflight = 0
        self._inflight_zero = threading.Condition(self._lock)
        self._submitted_batches = 0
        self._max_ts: int | None = None
        self._pressure_at = 0.0
        self._pressure: tuple[float, str, int] = (0.0, "", 0)
        self._pressure_lock = threading.Lock()
        self.sampler = Sampler(self)
        self.sampler.start()

    # ------------------------------------------------------------------ requests

    @property
    def draining(self) -> bool:
        return self._draining

    def enter(self) -> None:
        """A POST begins (raises :class:`IngestRefused` when shutting down or too many are in flight)."""
        with self._lock:
            if self._draining:
                self.counters.refused_unavailable += 1
                raise IngestRefused(503, "shutting down", self.options.retry_after_s)
            if self._inflight >= self.options.max_concurrent_requests:
                self.counters.refused_busy += 1
                raise IngestRefused(429, "too many concurrent requests", self.options.retry_after_s)
            self._inflight += 1
            self.counters.requests += 1

    def leave(self) -> None:
        with self._lock:
            self._inflight -= 1
            if self._inflight == 0:
                self._inflight_zero.notify_all()

    def admit(self) -> None:
        """Wait (up to ``admit_wait_s``) until the pipeline has room; else raise :class:`IngestRefused`."""
        deadline = time.monotonic() + self.options.admit_wait_s
        while True:
            if self._draining:
                with self._lock:
                    self.counters.refused_unavailable += 1
                raise IngestRefused(503, "shutting down", self.options.retry_after_s)
            full, why = self.pressure()
            if not full:
                return
            if time.monotonic() >= deadline:
                down = not self.store.available
                with self._lock:
                    if down:
                        self.counters.refused_unavailable += 1
                    else:
                        self.counters.refused_busy += 1
                if down:
                    raise IngestRefused(
                        503, f"store unavailable, pipeline full ({why})", 2 * self.options.retry_after_s
                    )
                raise IngestRefused(429, f"pipeline busy ({why})", self.options.retry_after_s)
            time.sleep(0.005)

    def pressure(self) -> tuple[bool, str]:
        """(no room?, why): pending ingest batches and the fullest downstream partition (cached for 5 ms)."""
        pending = self._submitted_batches - self.engine.counters.batches
        if pending >= self.options.max_pending_batches:
            return True, f"{pending} batches waiting for ingest"
        now = time.monotonic()
        with self._pressure_lock:
            if now - self._pressure_at > 0.005:
                worst, where = 0.0, ""
                e = self.engine
                for q in (e.l1, e.l2, e.topn, e.persist):
                    s = q.stats()
                    used = max(s.partition_used_counts, default=0) / max(1, s.buffer_size)
                    if used > worst:
                        worst, where = used, q.name
                    if q is e.persist:
                        backlog = s.total_used()
                self._pressure = (worst, where, backlog)
                self._pressure_at = now
            worst, where, backlog = self._pressure
        if backlog >= self.options.max_persist_backlog:
            return True, f"{backlog} flushes waiting for the store"
        if worst >= self.options.high_watermark:
            return True, f"{where} {100 * worst:.0f}% full"
        return False, ""

    def submit(self, batch: pa.RecordBatch, rejected: int, reasons: Iterable[str]) -> None:
        """Hand one validated batch (already admitted) to the engine and count it. Raises :class:`IngestRefused` if
        the engine is closed meanwhile (nothing was accepted then)."""
        n = batch.num_rows
        if n:
            with self._lock:
                self._submitted_batches += 1
            if not self.engine.ingest(batch, f"{REQUEST_SOURCE_PREFIX}{uuid.uuid4().hex}" if self.source_ids else None):
                with self._lock:
                    self._submitted_batches -= 1
                    self.counters.refused_unavailable += 1
                raise IngestRefused(503, "shutting down", self.options.retry_after_s)
            top = pc.max(batch.column("ts")).as_py()
        with self._lock:
            if n:
                self.counters.accepted += n
                self.counters.batches += 1
                if self._max_ts is None or top > self._max_ts:
                    self._max_ts = top
            self.counters.rejected += rejected
            for reason in reasons:
                self.counters.reasons[reason] = self.counters.reasons.get(reason, 0) + 1

    # ------------------------------------------------------------------ shutdown

    def drain(self, timeout_s: float = 60.0) -> bool:
        """Stop admitting and wait until no request is in flight. True if none is left."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._draining = True
            while self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._inflight_zero.wait(left)
        return True

    def close(self) -> dict[str, Any]:
        """Drain requests, flush the engine (L1, L2, top-N, persist) and close the store. Returns a summary."""
        self.drain()
        with self._lock:
            if self._closed:
                return self.summary()
            self._closed = True
        self.sampler.stop()
        self._report = self.engine.close()
        self.store.close()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        report = getattr(self, "_report", None) or self.engine.report()
        c = self.counters
        return {
            "requests": c.requests,
            "accepted": c.accepted,
            "rejected": c.rejected,
            "refused_429": c.refused_busy,
            "refused_503": c.refused_unavailable,
            "dropped": report["dropped"],
            "handler_errors": report["handler_errors"],
            "store_retries": self.engine.counters.store_retries,
            "store_errors": self.engine.counters.store_errors,
            "persisted_batches": self.engine.counters.persisted_batches,
        }

    # ------------------------------------------------------------------ views

    @property
    def max_ts(self) -> int | None:
        return self._max_ts

    def health(self) -> tuple[int, dict[str, Any]]:
        status = "draining" if self._draining else "ok"
        body = {
            "status": status,
            "store": "ok" if self.store.available else "unavailable",
            "uptime_s": round(time.time() - self.started, 1),
        }
        return (503 if self._draining else 200), body

    def stats_view(self) -> dict[str, Any]:
        """The JSON behind the dashboard and ``drainpipe stats``."""
        return self.sampler.view()


def _rate(delta: float, dt: float) -> float:
    return delta / dt if dt > 0 else 0.0


class Sampler(threading.Thread):
    """Samples the engine every ``sample_interval_s``: ingest and drop rates, per-drain-task load of each queue,
    new rebalances (for the handoff histogram and the dashboard markers); refreshes the top services from the
    store every ``top_refresh_s``. Readers get the last snapshot, so any number of dashboards costs nothing."""

    def __init__(self, service: IngestService) -> None:
        super().__init__(name="drainpipe-sampler", daemon=True)
        self.service = service
        o = service.options
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.samples: deque[dict[str, Any]] = deque(maxlen=o.history)
        self.rebalances: deque[dict[str, Any]] = deque(maxlen=200)
        self.on_handoff: Callable[[str, float], None] | None = None  # (queue, seconds), e.g. a histogram
        self._seen_at: dict[str, float] = {}
        self._prev: dict[str, Any] | None = None
        self._top: dict[str, Any] = {"granularity": "minute", "bucket": None, "columns": [], "rows": []}
        # the store query runs on its own thread: a slow store write (which holds the store's lock) must not
        # stall the sampling of the queues
        self._top_thread = threading.Thread(target=self._refresh_top, name="drainpipe-top-services", daemon=True)
        self._view: dict[str, Any] = {}
        self.task_load: dict[str, list[float]] = {}
        self.sample()

    def run(self) -> None:
        interval = self.service.options.sample_interval_s
        while not self._halt.wait(interval):
            try:
                self.sample()
            except Exception:  # never let a sampling bug take the server down
                log.exception("sampling failed")

    def start(self) -> None:
        super().start()
        self._top_thread.start()

    def _refresh_top(self) -> None:
        while True:
            try:
                self._top = self._top_services()
            except Exception:
                log.exception("top services refresh failed")
            if self._halt.wait(self.service.options.top_refresh_s):
                return

    def stop(self) -> None:
        self._halt.set()

    def sample(self) -> None:
        svc = self.service
        e = svc.engine
        now = time.time()
        stats = {q.name: q.stats() for q in e.queues()}
        dropped = sum(s.dropped_full + s.dropped_no_handler for s in stats.values())
        cur: dict[str, Any] = {
            "t": now,
            "accepted": svc.counters.accepted,
            "rejected": svc.counters.rejected,
            "dropped": dropped,
            "refused": svc.counters.refused_busy + svc.counters.refused_unavailable,
            "tasks": {name: s.task_dispatched for name, s in stats.items()},
        }
        prev = self._prev
        point: dict[str, Any] = {"t": round(now, 3)}
        if prev is not None:
            dt = now - prev["t"]
            point["events_per_s"] = round(_rate(cur["accepted"] - prev["accepted"], dt), 1)
            point["rejected_per_s"] = round(_rate(cur["rejected"] - prev["rejected"], dt), 1)
            point["drops_per_s"] = round(_rate(cur["dropped"] - prev["dropped"], dt), 1)
            point["refused_per_s"] = round(_rate(cur["refused"] - prev["refused"], dt), 1)
            loads = {}
            for name, tasks in cur["tasks"].items():
                before = prev["tasks"].get(name, ())
                loads[name] = [
                    round(_rate(a - (before[i] if i < len(before) else 0), dt), 1) for i, a in enumerate(tasks)
                ]
            point["task_load"] = loads
            self.task_load = loads
        new_rebalances: list[dict[str, Any]] = []
        for name, s in stats.items():
            seen = self._seen_at.get(name, 0.0)
            for r in s.rebalance_history:
                if r.at > seen and r.moved:
                    new_rebalances.append(
                        {
                            "queue": name,
                            "at": round(r.at, 3),
                            "moved": r.moved,
                            "duration_ms": round(r.duration_ms, 3),
                            "ratio_before": _finite(r.ratio_before),
                            "ratio_after": _finite(r.ratio_after),
                            "loads_before": list(r.loads_before),
                            "loads_after": list(r.loads_after),
                        }
                    )
            if s.rebalance_history:
                self._seen_at[name] = max(seen, max(r.at for r in s.rebalance_history))
        with self._lock:
            for event in new_rebalances:
                self.rebalances.append(event)
            if prev is not None:
                self.samples.append(point)
        if self.on_handoff is not None:
            for event in new_rebalances:
                self.on_handoff(event["queue"], event["duration_ms"] / 1000)
        self._prev = cur
        self._view = self._build_view(now, stats)

    def view(self) -> dict[str, Any]:
        return self._view

    def _build_view(self, now: float, stats: dict[str, Any]) -> dict[str, Any]:
        svc = self.service
        e = svc.engine
        c = svc.counters
        st = svc.store
        with self._lock:
            history = list(self.samples)
            rebalances = list(self.rebalances)[-50:]
        last = history[-1] if history else {}
        queues = []
        for q in e.queues():
            s = stats[q.name]
            queues.append(
                {
                    "name": q.name,
                    "role": q.name.rsplit("-", 1)[-1],
                    "buffer_size": s.buffer_size,
                    "partitions": [round(100 * n / max(1, s.buffer_size), 1) for n in s.partition_used_counts],
                    "used": s.total_used(),
                    "used_pct": round(s.total_used_percentage(), 2),
                    "produced": s.produced,
                    "dispatched": s.dispatched,
                    "dropped_full": s.dropped_full,
                    "dropped_no_handler": s.dropped_no_handler,
                    "handler_errors": s.handler_errors,
                    "tasks": list(s.task_dispatched),
                    "task_partitions": [len(p) for p in s.task_partitions],
                    "task_load": self.task_load.get(q.name, []),
                    "rebalances": s.rebalances,
                    "rebalance_state": s.rebalance_state,
                }
            )
        ec = e.counters
        latencies = sorted(st.write_seconds)
        return {
            "now": round(now, 3),
            "uptime_s": round(now - svc.started, 1),
            "store_url": svc.store_url,
            "draining": svc.draining,
            "ingest": {
                "requests": c.requests,
                "accepted": c.accepted,
                "rejected": c.rejected,
                "refused_429": c.refused_busy,
                "refused_503": c.refused_unavailable,
                "events_per_s": last.get("events_per_s", 0.0),
                "drops_per_s": last.get("drops_per_s", 0.0),
                "dropped": sum(q["dropped_full"] + q["dropped_no_handler"] for q in queues),
                "reasons": dict(sorted(c.reasons.items(), key=lambda kv: -kv[1])[:8]),
            },
            "engine": {
                "batches": ec.batches,
                "events": ec.events,
                "partials": ec.partials,
                "persisted_batches": ec.persisted_batches,
                "persisted_partials": ec.persisted_partials,
                "store_retries": ec.store_retries,
                "store_errors": ec.store_errors,
            },
            "store": {
                "available": st.available,
                "writes": st.writes,
                "failures": st.failures,
                "last_error": st.last_error,
                "last_write_ms": round(1000 * st.last_write_s, 2),
                "p50_write_ms": round(1000 * _quantile(latencies, 0.5), 2),
                "p99_write_ms": round(1000 * _quantile(latencies, 0.99), 2),
            },
            "queues": queues,
            "history": history[-120:],
            "rebalances": rebalances,
            "top_services": self._top,
        }

    def _top_services(self) -> dict[str, Any]:
        """Latest minute values of the service-scope metrics for the busiest services (from the store)."""
        svc = self.service
        out: dict[str, Any] = {"granularity": "minute", "bucket": None, "columns": [], "rows": []}
        max_ts = svc.max_ts
        metrics = [m for m in svc.definitions.metrics if isinstance(m, MetricDef) and m.scope == "service"]
        if max_ts is None or not metrics:
            return out
        rate = next((m for m in metrics if m.function in ("cpm", "count")), metrics[0])
        ordered = [rate] + [m for m in metrics if m is not rate]
        start = str(iso_from_ms(np.array([max_ts - max_ts % 60_000 - 5 * 60_000]))[0])
        latest: dict[str, str] = {}
        values: dict[tuple[str, str], dict[str, float]] = {}
        try:
            for m in ordered:
                for _metric, entity, _g, bucket, label, value in svc.store.query(
                    metric=m.name, granularity="minute", start=start
                ):
                    if m.function == "percentile" and label != "p99":
                        continue
                    values.setdefault((entity, bucket), {})[m.name] = value
                    if m is rate and bucket > latest.get(entity, ""):
                        latest[entity] = bucket
        except Exception as exc:  # the store may be down: keep what we had
            log.debug("top services query failed: %s", exc)
            return self._top
        rows: list[list[Any]] = []
        for entity, bucket in latest.items():
            v = values.get((entity, bucket), {})
            rows.append([entity, bucket] + [v.get(m.name) for m in ordered])
        rows.sort(key=lambda r: -(r[2] or 0))
        out["columns"] = ["service", "minute"] + [
            m.name + (" p99" if m.function == "percentile" else "") for m in ordered
        ]
        out["rows"] = rows[: svc.options.top_services]
        out["bucket"] = max(latest.values()) if latest else None
        return out


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _finite(x: float) -> float | None:
    return None if x == float("inf") else round(x, 3)
