"""The live view of a running process: the :class:`Sampler` thread, which samples the engine, its intake and the
store a few times a second into the one dict that ``/v1/stats``, ``/metrics``, the dashboard and ``drainpipe
stats`` show, and the display formatting of metrics (:func:`display_format`).

What is watched is anything with the :class:`Watched` shape: ``serve``'s :class:`~.service.IngestService` (its
sections: the write-ahead log, alerts, retention) and a Kafka group member's view
(:mod:`drainpipe.kafka.member_http`; its section: the partitions and their lag). The common part of the view
(intake, engine, queues, store, top services) is built here; each watched process adds its own sections."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..pipeline import MetricDef, iso_from_ms

__all__ = ["Intake", "LiveOptions", "Sampler", "Watched", "display_format"]

log = logging.getLogger("drainpipe.server")


@dataclass(frozen=True)
class Intake:
    """What a watched process took in so far (counters that only grow)."""

    accepted: int  # events handed to the engine
    rejected: int  # events (records, messages) that failed validation
    refused_busy: int = 0  # requests answered 429
    refused_unavailable: int = 0  # requests answered 503
    requests: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # rejects by reason
    warnings: dict[str, int] = field(default_factory=dict)  # events accepted with a caveat, by reason


@dataclass(frozen=True)
class LiveOptions:
    """The sampler's periods and sizes."""

    sample_interval_s: float = 1.0  # the dashboard's time resolution
    history: int = 300  # samples kept (5 minutes at 1 s)
    top_services: int = 8
    top_refresh_s: float = 2.0


class Watched(Protocol):
    """What the sampler reads of the process it watches (from its own thread: every member thread-safe to read)."""

    engine: Any  # a LocalEngine
    store: Any  # its Store
    definitions: Any  # its Definitions
    store_url: str
    started: float  # time.time() at start

    @property
    def draining(self) -> bool: ...

    @property
    def max_ts(self) -> int | None:
        """The newest event time taken in (ms), where the top services are looked up; None before any."""

    def intake(self) -> Intake: ...

    def sections(self) -> dict[str, Any]:
        """The process's own parts of the view; a dict merges into the common section of its name."""


#: how long a read of the view waits for top services it found from long ago (a store busy with a write may hold
#: the lookup: then the read answers with what it has)
TOP_WAIT_S = 1.0


def _rate(delta: float, dt: float) -> float:
    return delta / dt if dt > 0 else 0.0


class Sampler(threading.Thread):
    """Samples the engine every ``sample_interval_s``: ingest and drop rates, per-drain-task load of each queue,
    new rebalances (for the handoff histogram and the dashboard markers). Readers get the last snapshot, so any
    number of dashboards costs nothing.

    The top services come from the store, and only while someone reads the view: a read finds them older than
    ``top_refresh_s`` and asks the top thread to look them up again (so one lookup every ``top_refresh_s`` at most,
    whatever the readers). A read after none for longer than twice that (``drainpipe stats``, a dashboard opened)
    waits for the lookup, up to :data:`TOP_WAIT_S`, rather than answer with services from long ago. Looked up all
    along, the queries were 1.4% of a saturated ``serve``'s CPU with nobody watching.

    Thread-safety: :meth:`view` from any thread; the rest runs on the sampler's and the top thread."""

    def __init__(self, watched: Watched, options: LiveOptions) -> None:
        super().__init__(name="drainpipe-sampler", daemon=True)
        self.watched = watched
        self.options = o = options
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.samples: deque[dict[str, Any]] = deque(maxlen=o.history)
        self.rebalances: deque[dict[str, Any]] = deque(maxlen=200)
        self.on_handoff: Callable[[str, float], None] | None = None  # (queue, seconds), e.g. a histogram
        self._seen_at: dict[str, float] = {}
        self._prev: dict[str, Any] | None = None
        self._top: dict[str, Any] = {"granularity": "minute", "bucket": None, "columns": [], "rows": []}
        # guards _top_at (when _top was last looked up, monotonic; -inf: never) and its waits; _top is replaced whole
        self._top_cond = threading.Condition()
        self._top_at = -math.inf
        self._top_wanted = threading.Event()  # a reader found the top services old (or stop(): the thread ends)
        # the store query runs on its own thread: a slow store write (which holds the store's lock) must not
        # stall the sampling of the queues
        self._top_thread = threading.Thread(target=self._refresh_top, name="drainpipe-top-services", daemon=True)
        self._view: dict[str, Any] = {}
        self.task_load: dict[str, list[float]] = {}
        self.sample()

    def run(self) -> None:
        interval = self.options.sample_interval_s
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
            self._top_wanted.wait()
            if self._halt.is_set():
                return
            self._top_wanted.clear()
            try:
                top = self._top_services()
            except Exception:
                log.exception("top services refresh failed")
                top = self._top
            with self._top_cond:
                self._top, self._top_at = top, time.monotonic()
                self._top_cond.notify_all()
            if self._halt.wait(self.options.top_refresh_s):  # (one lookup a period at most, however many readers)
                return

    def stop(self) -> None:
        self._halt.set()
        self._top_wanted.set()

    def sample(self) -> None:
        e = self.watched.engine
        now = time.time()
        stats = {q.name: q.stats() for q in e.queues()}
        dropped = sum(s.dropped_full + s.dropped_no_handler for s in stats.values())
        intake = self.watched.intake()
        cur: dict[str, Any] = {
            "t": now,
            "accepted": intake.accepted,
            "rejected": intake.rejected,
            "dropped": dropped,
            "refused": intake.refused_busy + intake.refused_unavailable,
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
        self._view = self._build_view(now, stats, intake)

    def view(self) -> dict[str, Any]:
        """The last snapshot with the top services (see the class docstring: a read may wait up to
        :data:`TOP_WAIT_S` for them). Thread-safe."""
        period = self.options.top_refresh_s
        age = time.monotonic() - self._top_at
        if age > period and not self._halt.is_set():
            self._top_wanted.set()
            if age > 2 * period and self._top_thread.is_alive():
                with self._top_cond:  # (waits for the lookup that was asked: _top_at moves)
                    self._top_cond.wait_for(lambda: time.monotonic() - self._top_at <= 2 * period, TOP_WAIT_S)
        return self._view | {"top_services": self._top}

    def _build_view(self, now: float, stats: dict[str, Any], c: Intake) -> dict[str, Any]:
        svc = self.watched
        e = svc.engine
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
                    "task_restarts": s.task_restarts,
                    "lost": s.lost,
                    "slow_calls": [
                        {"type": c.type_name, "task": c.task, "method": c.method, "seconds": round(c.seconds, 1)}
                        for c in s.slow_calls
                    ],
                    "tasks": list(s.task_dispatched),
                    "task_partitions": [len(p) for p in s.task_partitions],
                    "task_load": self.task_load.get(q.name, []),
                    "rebalances": s.rebalances,
                    "rebalance_state": s.rebalance_state,
                }
            )
        ec = e.counters
        latencies = sorted(st.write_seconds)
        view: dict[str, Any] = {
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
                "warnings": dict(sorted(c.warnings.items(), key=lambda kv: -kv[1])[:8]),
            },
            "engine": {
                "batches": ec.batches,
                "events": ec.events,
                "partials": ec.partials,
                "persisted_batches": ec.persisted_batches,
                "persisted_partials": ec.persisted_partials,
                "store_retries": ec.store_retries,
                "store_errors": ec.store_errors,
                "overflow_rows": dict(e.guard.folded),
            },
            "store": {
                "available": st.available,
                "writes": st.writes,
                "failures": st.failures,
                "last_error": st.last_error,
                "last_write_ms": round(1000 * st.last_write_s, 2),
                "p50_write_ms": round(1000 * _quantile(latencies, 0.5), 2),
                "p99_write_ms": round(1000 * _quantile(latencies, 0.99), 2),
                "retention": svc.definitions.retention.describe(),
            },
            "queues": queues,
            "history": history[-120:],
            "rebalances": rebalances,
        }
        for name, section in svc.sections().items():
            common = view.get(name)
            view[name] = common | section if isinstance(common, dict) and isinstance(section, dict) else section
        return view

    def _top_services(self) -> dict[str, Any]:
        """Latest minute values of the service-scope metrics for the busiest services (from the store)."""
        svc = self.watched
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
        out["formats"] = [None, None] + [display_format(m) for m in ordered]
        out["rows"] = rows[: self.options.top_services]
        out["bucket"] = max(latest.values()) if latest else None
        return out


def display_format(metric: MetricDef) -> dict[str, Any]:
    """How the dashboard shows a value of ``metric``: decimals and unit, by function (apdex 0..1 to 4 decimals as
    stored, SLA in % to 2, rates and latencies to 1, counts whole, percentiles to the precision of their buckets)."""
    f = metric.function
    if f == "apdex":
        return {"decimals": 4, "unit": ""}
    if f == "sla":
        return {"decimals": 2, "unit": "%"}
    if f == "cpm":
        return {"decimals": 1, "unit": "/min"}
    if f == "count":
        return {"decimals": 0, "unit": ""}
    if f == "percentile":
        step = metric.precision_ms or 1.0
        decimals = 0 if float(step).is_integer() else len(repr(float(step)).split(".")[1])
        return {"decimals": decimals, "unit": " ms"}
    return {"decimals": 1, "unit": " ms" if metric.field == "latency_ms" else ""}


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _finite(x: float) -> float | None:
    return None if x == float("inf") else round(x, 3)
