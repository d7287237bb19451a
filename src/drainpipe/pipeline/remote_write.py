"""Prometheus remote-write of the stored metrics: each minute's values, once the minute is final, sent once, in order.

::

    store (metric_values, minute rows) --query (position, final]--> WriteRequest (protobuf, snappy)
        --POST--> receiver (Prometheus, Mimir, Thanos)  --2xx--> position := the last minute sent (in the store)

**The model.** Per-minute values, as the store holds them, each stamped with its minute's start: a series per
(metric, entity, label), named ``drainpipe_<metric>`` with labels ``service`` and the scope's ``instance`` or
``endpoint`` (the entity split at its first ``/``) and ``percentile`` for a percentile's rank. A minute is *final*
``lateness_s`` after it ends (serve and consume: by the wall clock; ``run``: its data is final when it ends), and
sent once every event taken in before that moment is in the store (the ``barrier``: serve's write-ahead log
committed up to where it was, consume's engine), so that the pipeline's own delay never makes an event late; then
it is never sent again. Events that arrive for a minute already sent still count in the store (it stays right)
and are counted here as late (:meth:`RemoteWriter.observe`), not re-sent: a series' samples only move forward,
which is what a receiver without an out-of-order window requires.

**Exemplars.** With ``[prometheus] exemplars = true`` (the stored top-N ``exemplars``), each minute's slowest
traced request per entity goes with it, as an exemplar (label ``trace_id``, value its latency in ms, the minute's
timestamp) on the series of the first percentile metric of that scope at its highest percentile
(``drainpipe_endpoint_percentile{percentile="p99"}`` with the default metrics): one a series and minute, in time
order, as a receiver's exemplar storage takes them. Without such a metric no exemplar is sent.

**Once.** The position (the start of the last minute sent) is a progress row of the store (source
``remote-write``, part the receiver's URL), written after the receiver acknowledged the minutes: a restart resumes
after it. A process killed between the acknowledgement and that write sends those minutes again (Prometheus takes
a sample equal to the one it has without complaint); nothing else is ever sent twice.

**Faults.** A receiver that is down (no connection, 5xx, 429) gets the same minutes again after a back-off (0.5 s
doubling to 30 s, or its Retry-After); nothing is lost, and memory holds one request at a time: the store is the
buffer. A 4xx other than 429 means the receiver refuses those samples for good (too old, a bad label): they are
counted as rejected and the position moves on. Minutes older than ``max_age_s`` (default one hour: Prometheus
refuses samples older than its head block without an out-of-order window) are skipped and counted; ``run`` over
historical data sends them only with a larger ``max_age_s``, for a receiver configured with
``out_of_order_time_window``.

Thread-safety: :meth:`RemoteWriter.observe` and :meth:`RemoteWriter.stats` from any thread; the sending is done by
one thread (:meth:`start`) or by the caller (:meth:`send_final`), never both.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import RemoteWriteError
from .buckets import PERCENTILE_LABELS
from .definitions import EXEMPLARS, Definitions
from .prompb import write_request
from .remote_write_flags import RemoteWriteOptions
from .store import SourceProgress
from .times import parse_time_ms

__all__ = ["RemoteWriter", "REMOTE_WRITE_SOURCE", "series_labels", "send_stored"]

log = logging.getLogger("drainpipe.remote_write")

REMOTE_WRITE_SOURCE = "remote-write"  # the store's progress rows of the writer: part = the receiver's URL
_MINUTE_MS = 60_000
_BACKOFF = (0.5, 30.0)


def series_labels(metric: str, scope: str, entity: str, label: str) -> list[tuple[str, str]]:
    """A stored value's series: its labels, sorted by name (as remote-write asks), ``__name__`` first."""
    labels = [("__name__", f"drainpipe_{metric}")]
    if scope == "service":
        labels.append(("service", entity))
    else:
        service, _, sub = entity.partition("/")
        labels += [(scope, sub), ("service", service)]
    if label:
        labels.append(("percentile", label))
    return sorted(labels)


#: a minute's values ``(metric, entity, label, value)`` and its exemplars ``entity -> (trace id, latency ms)``
_Minute = tuple[list[tuple[str, str, str, float]], dict[str, tuple[str, float]]]


def _exemplar_series(definitions: Definitions) -> tuple[str, str, str] | None:
    """Where stored exemplars go: ``(top-N, metric, label)``, the series of the first percentile metric of the
    exemplars' scope at its highest percentile (the tail they explain); None without exemplars or such a metric."""
    topn = next((t for t in definitions.topns if t.name == EXEMPLARS), None)
    if topn is None:
        return None
    metric = next((m for m in definitions.metrics if m.function == "percentile" and m.scope == topn.scope), None)
    return None if metric is None else (topn.name, metric.name, PERCENTILE_LABELS[-1])


class RemoteWriter:
    """Sends the store's final minutes of ``definitions``' metrics to one receiver (see the module docstring)."""

    def __init__(self, store: Any, definitions: Definitions, options: RemoteWriteOptions,
                 clock: Callable[[], int] | None = None,
                 barrier: Callable[[], Callable[[], bool]] | None = None) -> None:  # fmt: skip
        """``clock``: epoch ms of "now" (default the store's clock, which tests replace). ``barrier()``, called as a
        round starts, gives a check that is true once everything taken in until then is in the store; the round
        sends only then (None: no wait)."""
        self.store = store
        self.options = options
        self.clock = clock or (lambda: int(store.clock()))
        self.barrier = barrier
        self._scopes = {m.name: m.scope for m in definitions.metrics}
        self._exemplars = _exemplar_series(definitions)
        self._lock = threading.Lock()  # guards the counters below (the sending thread writes, scrapes read)
        self.sent_samples = 0
        self.sent_exemplars = 0
        self.requests = 0
        self.failures = 0  # requests the receiver could not take now (retried)
        self.rejected_samples = 0  # refused for good by the receiver (4xx)
        self.skipped_minutes = 0  # older than max_age_s when their turn came
        self.late_events = 0  # events of minutes already sent (in the store, not re-sent)
        rows = store.progress(REMOTE_WRITE_SOURCE, part=options.url)
        self.position = rows[0].end if rows else -1  # start of the last minute sent (-1: none yet)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ observing

    def observe(self, batch: Any) -> None:
        """Count the events of an ingested batch (an ``EventBatch``) that fall in minutes already sent. Thread-safe."""
        position = self.position
        if position < 0 or batch.requests == 0:
            return
        ts = batch.request_rows().column("ts").to_numpy()
        late = int(np.count_nonzero(ts < position + _MINUTE_MS))
        if late:
            with self._lock:
                self.late_events += late

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"sent_samples": self.sent_samples, "sent_exemplars": self.sent_exemplars,
                    "requests": self.requests, "failures": self.failures,
                    "rejected_samples": self.rejected_samples, "skipped_minutes": self.skipped_minutes,
                    "late_events": self.late_events, "position_ms": self.position}  # fmt: skip

    # ------------------------------------------------------------------ sending

    def final_until(self) -> int:
        """The start of the last minute that is final now (by the clock and ``lateness_s``)."""
        return (self.clock() - int(self.options.lateness_s * 1000)) // _MINUTE_MS * _MINUTE_MS - _MINUTE_MS

    def send_final(self, until_ms: int | None = None) -> int:
        """Send every unsent minute up to the one starting at ``until_ms`` (default: :meth:`final_until`), in order;
        the number of samples sent. Raises :class:`RemoteWriteError` when the receiver cannot take a request now
        (the minutes before it are sent and recorded)."""
        until = self.final_until() if until_ms is None else until_ms // _MINUTE_MS * _MINUTE_MS
        oldest = (self.clock() - int(self.options.max_age_s * 1000)) // _MINUTE_MS * _MINUTE_MS + _MINUTE_MS
        start = self.position + _MINUTE_MS if self.position >= 0 else None
        if start is None or start < oldest:
            self._skip(start, min(oldest, until + _MINUTE_MS) - _MINUTE_MS)
        first = oldest if start is None else max(start, oldest)
        sent = 0
        while first <= until:
            last = min(until, first + (self.options.window_minutes - 1) * _MINUTE_MS)
            sent += self._send_range(first, last)
            first = last + _MINUTE_MS
        return sent

    def _skip(self, first: int | None, last: int) -> None:
        """Pass over the minutes from ``first`` (None: the oldest stored) to ``last``: counted (those with values),
        not sent."""
        if first is not None and last < first:
            return
        metric = next(iter(self._scopes), None)
        rows = [] if metric is None else self.store.query(metric=metric, granularity="minute", start=first, end=last)
        minutes = len({row[3] for row in rows})
        if minutes:
            with self._lock:
                self.skipped_minutes += minutes
            log.warning("remote write: %d stored minutes are older than %.0f s: not sent", minutes,
                        self.options.max_age_s)  # fmt: skip
        self._advance(last)

    def _send_range(self, first: int, last: int) -> int:
        """Read minutes [first, last] from the store and send them in requests of whole minutes."""
        rows = self.store.query(granularity="minute", start=first, end=last)
        by_minute: dict[int, _Minute] = {}
        minutes: dict[str, int] = {}  # bucket text -> epoch ms (rows share a few buckets)

        def minute_of(bucket: str) -> _Minute:
            minute = minutes.get(bucket)
            if minute is None:
                minute = minutes[bucket] = parse_time_ms(bucket)
            return by_minute.setdefault(minute, ([], {}))

        for metric, entity, _, bucket, label, value in rows:
            if metric in self._scopes:
                minute_of(bucket)[0].append((metric, entity, label, value))
        if self._exemplars is not None:  # the slowest traced request of each entity and minute (rank 1)
            for _, entity, bucket, rank, trace, latency in self.store.query_topn(self._exemplars[0], start=first,
                                                                                  end=last):  # fmt: skip
                if rank == 1:
                    minute_of(bucket)[1][entity] = (trace, latency)
        sent = 0
        batch: list[tuple[int, _Minute]] = []
        size = 0
        for minute in sorted(by_minute):
            values = by_minute[minute]
            if batch and size + len(values[0]) > self.options.max_samples:
                sent += self._post(batch)
                batch, size = [], 0
            batch.append((minute, values))
            size += len(values[0])
        if batch:
            sent += self._post(batch)
        self._advance(last)  # (minutes without values are sent as nothing)
        return sent

    def _post(self, minutes: Sequence[tuple[int, _Minute]]) -> int:
        """One request of whole minutes; the position moves past them once the receiver took (or refused) them."""
        request = write_request()
        series: dict[tuple[tuple[str, str], ...], Any] = {}

        def series_of(metric: str, entity: str, label: str) -> Any:
            labels = tuple(series_labels(metric, self._scopes[metric], entity, label))
            ts = series.get(labels)
            if ts is None:
                ts = series[labels] = request.timeseries.add()
                for name, text in labels:
                    ts.labels.add(name=name, value=text)
            return ts

        samples = exemplars = 0
        for minute, (values, slowest) in minutes:  # minutes in order: each series' samples in time order
            for metric, entity, label, value in values:
                series_of(metric, entity, label).samples.add(value=float(value), timestamp=minute)
                samples += 1
            if self._exemplars is not None:
                _, metric, label = self._exemplars
                for entity, (trace, latency) in slowest.items():
                    exemplar = series_of(metric, entity, label).exemplars.add(value=latency, timestamp=minute)
                    exemplar.labels.add(name="trace_id", value=trace)
                    exemplars += 1
        import cramjam  # (here, not at the top: a process that never writes remotely saves its 3 MB)

        body = cramjam.snappy.compress_raw(request.SerializeToString())
        status = self._deliver(bytes(body))
        with self._lock:
            self.requests += 1
            if status < 300:
                self.sent_samples += samples
                self.sent_exemplars += exemplars
            else:
                self.rejected_samples += samples
        self._advance(minutes[-1][0])
        return samples if status < 300 else 0

    def _deliver(self, body: bytes) -> int:
        """POST one request; its status when the receiver answered for good (2xx, or a 4xx other than 429, which
        is logged). Raises :class:`RemoteWriteError` when it could not take it now."""
        headers = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
                   "X-Prometheus-Remote-Write-Version": "0.1.0", "User-Agent": "drainpipe",
                   **dict(self.options.headers)}  # fmt: skip
        request = urllib.request.Request(self.options.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.options.timeout_s) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            text = exc.read(500).decode(errors="replace").strip()
            if exc.code == 429 or exc.code >= 500:
                with self._lock:
                    self.failures += 1
                retry = exc.headers.get("Retry-After")
                raise RemoteWriteError(f"remote write to {self.options.url}: {exc.code} {text}",
                                       float(retry) if retry and retry.isdigit() else None) from None  # fmt: skip
            log.warning("remote write: %s refused %d bytes: %d %s", self.options.url, len(body), exc.code, text)
            return exc.code
        except (OSError, urllib.error.URLError) as exc:
            with self._lock:
                self.failures += 1
            raise RemoteWriteError(f"remote write to {self.options.url}: {exc}") from None

    def _advance(self, minute: int) -> None:
        if minute <= self.position:
            return
        self.store.merge([], progress=[SourceProgress(REMOTE_WRITE_SOURCE, self.options.url, "sent", minute)])
        self.position = minute

    # ------------------------------------------------------------------ the sending thread

    def start(self) -> RemoteWriter:
        """Send final minutes every ``interval_s`` from a thread of its own, retrying with back-off."""
        self._thread = threading.Thread(target=self._loop, name="drainpipe-remote-write", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay or self.options.interval_s):
            try:
                until = self.final_until()
                if self.barrier is not None and not self._settled(self.barrier()):
                    continue  # the store is behind what was taken in: the next round
                self.send_final(until)
                delay = 0.0
            except RemoteWriteError as exc:
                backoff = min(max(delay * 2, _BACKOFF[0]), _BACKOFF[1])
                delay = backoff if exc.retry_after_s is None else exc.retry_after_s
                log.warning("%s; again in %.1f s", exc, delay)
            except Exception:  # a store outage: the next round tries again
                log.exception("remote write: a round failed")
                delay = _BACKOFF[1]

    def _settled(self, check: Callable[[], bool]) -> bool:
        """Whether ``check`` holds within one interval."""
        deadline = time.monotonic() + self.options.interval_s
        while not check():
            if time.monotonic() > deadline or self._stop.wait(0.05):
                return False
        return True

    def close(self, flush_s: float = 10.0) -> None:
        """Stop the thread; then, for up to ``flush_s``, send what is final by now (a clean stop loses no minute to
        the next start). Never raises."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            self.flush(flush_s)
        except Exception:
            log.exception("remote write: the last round failed")

    def flush(self, deadline_s: float) -> bool:
        """Send what is final by now, retrying a receiver that is down (back-off) for up to ``deadline_s``; whether
        everything final was sent (else the next start sends the rest). Not with :meth:`start`'s thread running."""
        deadline = time.monotonic() + deadline_s
        delay = _BACKOFF[0]
        while True:
            try:
                self.send_final()
                return True
            except RemoteWriteError as exc:
                if time.monotonic() + delay > deadline:
                    log.warning("%s; left for the next start", exc)
                    return False
                time.sleep(delay)
                delay = min(delay * 2, _BACKOFF[1])


def send_stored(
    store: Any, definitions: Definitions, options: RemoteWriteOptions, deadline_s: float = 60.0
) -> dict[str, int]:
    """Send what is final in ``store`` now (``drainpipe run`` after its data is stored), retrying a receiver that is
    down for up to ``deadline_s``; the writer's counts, and ``unsent``: 1 when it gave up (the next run or server
    sends the rest)."""
    writer = RemoteWriter(store, definitions, options)
    sent = writer.flush(deadline_s)
    return {**writer.stats(), "unsent": 0 if sent else 1}
