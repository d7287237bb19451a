"""The serving core, without a transport: the one request path (:meth:`IngestService.ingest`), an event log feeding
a long-running :class:`LocalEngine`, admission control; the service owns its helper processes, its sampler
(:mod:`.live`), purger (:mod:`.purger`) and alerter. It is built in one place, :func:`.assembly.build_service`.

Data flow across the processes::

    server process                                   parser processes (BodyDecoder: a HelperPool)
    ───────────────────────────────────────────      ──────────────────────────────────────────────
    connection loop (http_loop.py): the OTLP/HTTP protobuf exports a turn read ─► IngestService.ingest_now
      │ (on the loop's thread: GroupIntake.serve_now, the same group path as below) ──► 200 to each client
    HTTP thread / gRPC call                           decode_body of a JSON body: gunzip, JSON/NDJSON,
      │ token, limits (http.py, otlp_grpc.py)          validation  ──► EventBatch
      ▼                                                      ▲   │ body in / EventBatch.encode() out
    IngestService.ingest ── admit (429/503) ── a JSON body ───┘   │  (channel: shared memory + one frame)
      │ ◄─────────────────────────────────────────────────────────┘
      ▼ (the work: an OTLP export's native decode, or the decoded JSON body)
    GroupIntake thread (intake.py): every request waiting, decoded, joined
      ─► WriteAheadLog.append (one record, group commit, fsync) ──► 200 to each client
      ┊ (the log on disk: EventBatch.encode() records)
    Feeder thread: read the log in order, join up to 32k requests ─► Driver.feed ─► LocalEngine.ingest
      ▼ the engine's ingest threads: aggregate_batch ─► partials (as for `consume`: one placement)
    L1 ─► L2 ─► persist: one store transaction with the states and "log <id> applied to <position>"
      ┊ every checkpoint_s                             ─► WriteAheadLog.release(position)
    Sampler thread (live.py): the view of /v1/stats, /metrics, the dashboard
    Purger thread (purger.py), Alerter thread (alerting.py): against the store

Acknowledged means logged. A request's validated events are appended to the event log (:mod:`.wal`): on disk and
fsynced for a durable :class:`~.wal.WriteAheadLog` (the default of ``drainpipe serve``), in memory for a
:class:`~.wal.MemoryLog` (``--durability none``). Only then is the request answered 200. The engine consumes the
log in order (:mod:`.feeder`) and commits the log position with the states in one store transaction, so on a
restart it resumes exactly where the store is: each acknowledged event is counted once, whatever killed the
process and when. The same position makes a retried commit whose acknowledgement was lost a no-op, so requests
need no ids in the store.

Admission (back-pressure as refusals, never unbounded memory). A request is refused when:

* the server is shutting down, or a store write failed for good (503: the data stays in the log);
* the log holds ``max_bytes`` not yet in the store (503 with Retry-After: the store is down or far behind). A
  store outage is ridden out in the log, on disk, up to that budget (``--wal-max-bytes``); memory stays flat;
* more than ``max_lag_bytes`` of the log wait for the engine while the store keeps up: the engine is the
  bottleneck (429 after waiting up to ``admit_wait_s``).

The engine runs BLOCKING throughout: nothing accepted is dropped inside it; the feeder simply reads slower.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc

from .. import ThreadPolicy
from ..errors import IngestRefused, LogFull, UsageError
from ..inputs import EventBatch
from ..pipeline import Definitions, EngineOptions, LocalEngine, RemoteWriteOptions, RemoteWriter
from .alerting import Alerter, WebhookNotifier
from .bodies import NATIVE_FORMS, BadBody, BodyDecoder, Decoded, Rejects, decode_body, decode_proto_bodies
from .disk import DiskLimits, DiskWatch, store_directory
from .feeder import COALESCE_EVENTS, Feeder
from .instrumented import InstrumentedStore
from .intake import Body, GroupIntake, Work
from .live import Intake, LiveOptions, Sampler
from .purger import Purger
from .red import RedMetrics
from .wal import EventLog, MemoryLog

log = logging.getLogger("drainpipe.server")

#: how a request's outcome is handed back without waiting: ``then(decoded, None)`` or ``then(None, error)``
Answer = Callable[[Decoded | None, BaseException | None], None]

# store write latency buckets (seconds) for the histogram
WRITE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: a shutdown whose grace ran out still waits this long for the store's last commits before the process goes on
CLOSE_WAIT_S = 10.0
ADMIT_POLL_S = 0.005  # how often a request waiting for admission looks again
HANDOFF_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def _ready(result: tuple[EventBatch, Rejects]) -> Work:
    """Work already done: a body a parser process decoded, handed to the intake only to be logged."""
    return lambda: result


@dataclass(frozen=True)
class ServiceOptions:
    """Limits and periods of a serving engine."""

    max_body_bytes: int = 16 << 20  # request body as sent (compressed or not): 413 above
    max_decoded_bytes: int = 64 << 20  # body after gzip: 413 above
    max_events: int = 200_000  # events (records) per request: 413 above
    max_lag_bytes: int = 64 << 20  # log bytes not yet fed to the engine before 429 (while the store keeps up)
    checkpoint_s: float = 2.0  # how often the engine commits states with the log position
    admit_wait_s: float = 0.5  # how long a request waits for room before 429/503
    max_concurrent_requests: int = 64  # POSTs being processed at once: 429 above
    header_deadline_s: float = 30.0  # a request line and headers (or an idle keep-alive wait) take at most this
    body_deadline_s: float = 60.0  # a request body takes at most this to arrive
    answer_deadline_s: float = 60.0  # a client that takes none of its answer for this long is cut (SO_SNDTIMEO)
    retry_after_s: int = 1
    sample_interval_s: float = LiveOptions.sample_interval_s  # the dashboard's time resolution
    history: int = LiveOptions.history  # samples kept (5 minutes at 1 s)
    top_services: int = LiveOptions.top_services
    top_refresh_s: float = LiveOptions.top_refresh_s
    purge_every_s: float = 3600.0  # how often the store is purged by the definitions' retention (0: never)
    alert_webhook: str = ""  # where firing / resolved alert notifications are posted (none: dashboard only)
    alert_every_s: float = 30.0  # how often the definitions' [[alert]] rules are evaluated on the store
    # a period is evaluated once it ended this long ago (its last events merged); None: the longest time between
    # checkpoints (five intervals, when commits are slow or costly) and 5 s more, 15 s at the default checkpoint_s
    alert_settle_s: float | None = None
    alert_retry_s: float = 0.5  # the webhook's first retry delay (doubling up to 30 s, giving up after an hour)
    remote_write: RemoteWriteOptions | None = None  # send the stored minutes to Prometheus (None: off)
    disk: DiskLimits = DiskLimits()  # free space under which /healthz is degraded, and POSTs are refused (503)
    disk_purge_gap_s: float = 60.0  # while a volume stays low, a retention purge at most this often

    def __post_init__(self) -> None:
        for name in ("header_deadline_s", "body_deadline_s", "answer_deadline_s"):
            if not getattr(self, name) > 0:  # (0 would mean "never" to the kernel's send timeout)
                raise UsageError(f"ServiceOptions.{name} must be > 0, got {getattr(self, name)!r}")


def serve_engine_options(**overrides: Any) -> EngineOptions:
    """The engine configuration for serving: checkpoints (states are committed with the log position), BLOCKING
    stages (the feeder slows down instead of anything being dropped), two batches waiting per ingest partition, one
    drain thread per stage and partial chunks as large as the feeder's batches (131,072), shorter flush periods so
    the dashboard moves, idle drain threads that sleep up to 0.5 s."""
    base: dict[str, Any] = dict(
        checkpoints=True,
        # The stages share the server's GIL with each other and with the connection loop: a second thread per stage
        # only adds hand-overs of it (futex waits and wake-ups were a fifth of the process's CPU under a saturated
        # OTLP load), and every chunk of a partial is a queue item and a merge call that lets it go. One thread per
        # stage and chunks of 16,384 rows (4,096): the engine replaying a log alone at 1.51x the events per CPU
        # second, a saturated server at 1.08x-1.20x the spans (docs/performance.md, "Where the server's CPU goes in
        # the kernel, and what fewer GIL hand-overs buy"). Chunks as large as the feeder's batches: a batch's partial
        # is one item, whatever its groups.
        ingest_threads=ThreadPolicy.fixed(1),
        l1_threads=ThreadPolicy.fixed(1),
        l2_threads=ThreadPolicy.fixed(1),
        chunk_rows=COALESCE_EVENTS,
        l1_buffer=2_000,
        l2_buffer=1_000,
        ingest_buffer=2,
        l1_flush_s=0.5,
        l2_flush_s=1.0,
        rebalance_interval_ms=1_000,
        store_retry_s=(0.05, 2.0),
        # With checkpoints no stage hands states on by a timer (L1 when idle, L2 and top-N when a checkpoint asks,
        # and it wakes them), so an idle drain thread has nothing to do at its backoff's end: at 50 ms the eight of
        # them cost an idle ``serve`` 11 of its 21 ms of CPU a second, and at a steady 150k spans/s (feeder batches
        # every 0.2 s) they woke between batches on the other CPU (docs/performance.md, "Idle wake-ups, and
        # commits half as often").
        max_idle_ms=500,
    )
    base.update(overrides)
    return EngineOptions(**base)


@dataclass
class IngestCounters:
    requests: int = 0
    accepted: int = 0  # events handed to the engine
    rejected: int = 0  # events that failed validation
    refused_busy: int = 0  # 429
    refused_unavailable: int = 0  # 503
    batches: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)  # events accepted with a caveat, by reason


class IngestService:
    """An event log, a live engine fed from it, admission control and sampling. ``submit`` from any thread;
    ``close`` once. ``log`` defaults to a :class:`MemoryLog` (not durable); ``drainpipe serve`` passes a
    :class:`WriteAheadLog`. On construction the engine starts replaying what the store has not applied."""

    def __init__(
        self,
        definitions: Definitions,
        store: Any,
        *,
        log: EventLog | None = None,
        store_url: str = "",
        engine_options: EngineOptions | None = None,
        options: ServiceOptions | None = None,
        name: str = "serve",
        decoder: BodyDecoder | None = None,
    ) -> None:
        self.definitions = definitions
        self.options = options or ServiceOptions()
        self.store_url = store_url
        self.store = InstrumentedStore(store)
        self.log = log if log is not None else MemoryLog()
        engine_options = engine_options or serve_engine_options()
        if not engine_options.checkpoints or engine_options.live:
            raise ValueError("serving needs EngineOptions(checkpoints=True, live=False): see serve_engine_options")
        self.disk = DiskWatch(
            {"log": self.log.location if self.log.durable else "", "store": store_directory(store_url) or ""},
            self.options.disk,
        )
        self.purger = Purger(self.store, definitions.retention, self.options.purge_every_s, disk=self.disk,
                             early_gap_s=self.options.disk_purge_gap_s)  # fmt: skip
        if self.options.purge_every_s > 0:
            self.purger.purge()  # at start, before anything is fed: a restart catches up, and no purge races new data
        # L1 aggregation of what the feeder hands the engine on the engine's ingest threads, as for consume
        # (docs/architecture.md, "One live path")
        # (the RED metrics read the request columns the aggregation made: encoding the strings again on the feeder
        # was a third of its CPU)
        self.red = RedMetrics(definitions.latency_buckets_ms, definitions.max_entities)
        self.engine = LocalEngine(definitions, self.store, engine_options, name=name, observe=self.red.observe)
        self.decoder = decoder if decoder is not None else BodyDecoder()  # in this process unless given parsers
        self._intake = GroupIntake(self.log.append, decode_group=self._decode_group)
        rw = self.options.remote_write
        self.remote_writer = RemoteWriter(self.store, definitions, rw, barrier=self._stored) if rw is not None else None
        self.feeder = Feeder(
            self.log,
            self.engine,
            definitions,
            checkpoint_s=self.options.checkpoint_s,
            observe=self._observe,
        )
        self.feeder.recover()
        self.counters = IngestCounters()
        self.started = time.time()
        self._lock = threading.Lock()
        self._draining = False
        self._closed = False
        self._inflight = 0
        self._inflight_zero = threading.Condition(self._lock)
        self._max_ts: int | None = None
        self.feeder.start()
        self.notifier = (
            WebhookNotifier(self.options.alert_webhook, retry_initial_s=self.options.alert_retry_s)
            if self.options.alert_webhook
            else None
        )
        self.alerter = Alerter(
            definitions.alerts,
            self.store,
            every_s=self.options.alert_every_s,
            settle_s=(
                self.feeder.driver.max_checkpoint_s + 5.0
                if self.options.alert_settle_s is None
                else self.options.alert_settle_s
            ),  # fmt: skip
            notify=self.notifier.send if self.notifier else None,
        )
        o = self.options
        live = LiveOptions(o.sample_interval_s, o.history, o.top_services, o.top_refresh_s)
        self.sampler = Sampler(self, live)  # its view reads the purger's counts
        self.sampler.start()
        if self.notifier is not None:
            self.notifier.start()
        self.alerter.start()
        if self.options.purge_every_s > 0:
            self.purger.start()
        if self.remote_writer is not None:
            self.remote_writer.start()

    def _stored(self) -> Callable[[], bool]:
        """A check that holds once the store has every event acknowledged until now (the log committed to here)."""
        end = self.log.end
        return lambda: self.feeder.committed >= end

    def _observe(self, batch: EventBatch) -> None:
        """What the feeder hands the engine, seen by the remote writer's late count and the live view's latest event
        time (here, once a fed batch, not once a request: on the intake thread a request's ``pc.max`` was a tenth of
        its time). The RED series see it on the engine's ingest thread (``observe`` of the engine)."""
        if batch.num_rows:
            top = pc.max(batch.rows.column("ts")).as_py()
            if self._max_ts is None or top > self._max_ts:  # (one writer: the feeder; a reader sees old or new)
                self._max_ts = top
        if self.remote_writer is not None:
            self.remote_writer.observe(batch)

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

    @property
    def in_flight(self) -> int:
        """POSTs entered and not left: being read, waiting for admission, or at the intake."""
        return self._inflight

    def leave(self) -> None:
        with self._lock:
            self._inflight -= 1
            if self._inflight == 0:
                self._inflight_zero.notify_all()

    def _refuse(self, status: int, why: str, retry_after: int) -> IngestRefused:
        with self._lock:
            if status == 503:
                self.counters.refused_unavailable += 1
            else:
                self.counters.refused_busy += 1
        return IngestRefused(status, why, retry_after)

    def admit(self) -> None:
        """Wait (up to ``admit_wait_s``) until the engine has caught up enough; else raise :class:`IngestRefused`:
        503 when shutting down, when a store write failed for good, or when the log is at its byte budget; 429
        when the engine is merely behind. Blocks; thread-safe."""
        since = time.monotonic()
        while not self.try_admit(since):
            time.sleep(ADMIT_POLL_S)

    def try_admit(self, since: float) -> bool:
        """One look at admission for a request waiting since ``since`` (``time.monotonic()``): True if admitted
        now, False if it is worth waiting (the engine is behind and ``admit_wait_s`` has not passed: ask again in
        :data:`ADMIT_POLL_S`); raises :class:`IngestRefused` as :meth:`admit` does. Does not block; thread-safe."""
        verdict = self._verdict()
        if verdict is None:
            return True
        status, why, retry_after = verdict
        if status != 429 or time.monotonic() >= since + self.options.admit_wait_s:
            raise self._refuse(status, why, retry_after)
        return False

    def _verdict(self) -> tuple[int, str, int] | None:
        """Why a request would be refused now, ``(status, message, Retry-After)``: 429 is the engine behind (worth
        waiting out); None: admitted."""
        retry = self.options.retry_after_s
        if self._draining:
            return 503, "shutting down", retry
        if self.feeder.failed:
            return 503, f"store write failed; accepting nothing until restarted ({self.feeder.failed})", 10 * retry
        full = self.disk.check().full
        if full:  # refused while the log and the store can still be written, not once a write failed
            return 503, f"disk nearly full: {full[0].describe()}, refusing under {full[0].refuse:,}", 10 * retry
        if self.log.size >= self.log.max_bytes:
            what = "write-ahead log" if self.log.durable else "in-memory buffer"
            return 503, f"{what} full ({self.log.size:,} of {self.log.max_bytes:,} bytes wait for the store)", 2 * retry
        lag = self.feeder.lag
        # half the budget at most: the other half is what a store outage can be ridden out with
        if lag <= min(self.options.max_lag_bytes, self.log.max_bytes // 2) or not self.store.available:
            return None  # while the store is down the log takes the data, up to its budget
        return 429, f"pipeline busy ({lag:,} bytes of the log wait for the engine)", retry

    def ingest(self, body: bytes, *, form: str, gzipped: bool) -> Decoded:
        """One posted body, whatever the transport (HTTP, gRPC; the caller has called :meth:`enter`): wait for
        admission, decode it under the service's limits and definitions (``form``: one of
        :data:`~.bodies.FORMS`), and log it; returns what the answer says (accepted, rejects, warnings) once it is
        durable. Raises :class:`IngestRefused` (429/503: nothing was accepted) or :class:`~.bodies.BadBody`
        (400/413).

        An OTLP export is decoded on the intake thread by the native pass, with the others waiting then (no round
        trip to a process: the pass is ~0.2 us a span); a JSON body, whose decoding is per-event Python work, in a
        parser process when there are any, before it joins them."""
        self.admit()  # 429/503 before the parsing work, not after
        decoded = self._logged(self._work(body, form, gzipped), len(body))
        self._count(decoded)
        return decoded

    def ingest_now(self, bodies: Sequence[tuple[bytes, bool, Answer]]) -> None:
        """OTLP protobuf bodies already admitted (:meth:`try_admit`), each ``(body, gzipped, then)``, decoded and
        logged as one group on the calling thread (:meth:`GroupIntake.serve_now`); returns once each ``then`` was
        called: ``then(decoded, None)`` once its events are durable, or ``then(None, error)``
        (:class:`~.bodies.BadBody`, :class:`IngestRefused`). ``then`` must not block; the caller has called
        :meth:`enter` for each body and calls :meth:`leave` in its ``then``."""
        self._intake.serve_now([(Body(body, gz), len(body), self._counted(then)) for body, gz, then in bodies])

    def _counted(self, then: Answer) -> Answer:
        """``then``, after the outcome is counted (a log refusal made the request's 503)."""

        def done(result: Decoded | None, error: BaseException | None) -> None:
            try:
                if isinstance(error, LogFull):
                    error = self._log_refusal(error)
                elif result is not None:
                    self._count(result)
            finally:  # the answer is the caller's to give, whatever happened here
                then(result, error)

        return done

    def _work(self, body: bytes, form: str, gzipped: bool) -> Work | Body:
        """What the intake thread does with a body: OTLP protobuf exports decoded there with the others of the
        group (one native pass), an OTLP JSON export there too (its own pass); a JSON body decoded now, in a parser
        process when there are any (per-event Python work), only logged there."""
        if form == "otlp-protobuf":
            return Body(body, gzipped)
        opts, defs = self.options, self.definitions
        kwargs: dict[str, Any] = dict(form=form, gzipped=gzipped, max_decoded=opts.max_decoded_bytes,
                                      max_events=opts.max_events, spans=defs.spans,
                                      endpoints=defs.endpoints)  # fmt: skip
        if form in NATIVE_FORMS or not self.decoder.processes:
            return functools.partial(decode_body, body, **kwargs)
        return _ready(self.decoder.decode(body, **kwargs))

    def _decode_group(self, bodies: list[Body]) -> tuple[list[EventBatch], list[Decoded | BadBody]]:
        """The intake's pass over a group's OTLP protobuf bodies, under the service's limits and definitions."""
        opts, defs = self.options, self.definitions
        return decode_proto_bodies([(b.data, b.gzipped) for b in bodies], max_decoded=opts.max_decoded_bytes,
                                   max_events=opts.max_events, spans=defs.spans, endpoints=defs.endpoints)  # fmt: skip

    def submit(self, batch: EventBatch, rejected: int, reasons: Iterable[str]) -> None:
        """Log one validated batch (already admitted) and count it; returns once it is durable (the request may be
        answered 200 then). Raises :class:`IngestRefused` (503) if the log cannot take it: nothing was accepted."""
        self._logged(_ready((batch, [])))
        self._count(Decoded.of(batch, []), rejected, reasons)

    def _logged(self, work: Work | Body, size: int = 0) -> Decoded:
        """``work``'s events in the log (the intake thread's group), durable on return."""
        try:
            return self._intake.submit(work, size)
        except LogFull as exc:
            raise self._log_refusal(exc) from None

    def _log_refusal(self, exc: LogFull) -> IngestRefused:
        """The 503 of a request the log could not take (nothing of it was logged)."""
        return self._refuse(503, str(exc), 2 * self.options.retry_after_s)

    def _count(self, decoded: Decoded, rejected: int | None = None, reasons: Iterable[str] | None = None) -> None:
        """Count a request's outcome (``rejected``, ``reasons``: instead of its rejects')."""
        n = decoded.accepted
        if reasons is None:
            rejected, reasons = len(decoded.rejects), (reason for _, reason in decoded.rejects)
        with self._lock:
            if n:
                self.counters.accepted += n
                self.counters.batches += 1
            self.counters.rejected += rejected or 0
            for reason in reasons:
                self.counters.reasons[reason] = self.counters.reasons.get(reason, 0) + 1
            for reason, k in decoded.warnings:
                self.counters.warnings[reason] = self.counters.warnings.get(reason, 0) + k

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

    def close(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Drain requests, feed and commit the rest of the log (waiting up to ``timeout_s`` for the store), close
        the engine, the store and the log. Returns a summary. If the store does not take the rest in time, it stays
        in a durable log for the next start (logged); a memory log loses it (logged, counted as not stored)."""
        self.drain()
        with self._lock:
            if self._closed:
                return self.summary()
            self._closed = True
        self.decoder.close()  # drained: no request decodes any more
        self._intake.close()
        self.sampler.stop()
        self.purger.stop()
        self.alerter.stop()
        if self.notifier is not None:  # notifications still pending are logged as lost: they live in memory only
            pending = self.notifier.pending
            self.notifier.stop()
            if pending:
                log.warning("%d alert notifications were not delivered before shutdown", pending)
        self.all_stored = self.feeder.stop(timeout_s)
        if self.all_stored:
            self._close_engine()
        else:
            self._close_engine(wait_s=max(timeout_s, CLOSE_WAIT_S))
            self.feeder.settle()  # what the close committed is stored: the count below is what is not
            left = self.log.end - self.feeder.committed
            if self.log.durable:
                log.warning("%d bytes of acknowledged events are not in the store yet; they stay in the write-ahead "
                            "log and are stored at the next start", left)  # fmt: skip
            else:
                log.error("%d bytes of acknowledged events were not stored (--durability none: they are lost)", left)
        self.log.close()
        return self.summary()

    def _close_engine(self, wait_s: float | None = None) -> None:
        """Close the engine (states no checkpoint covered are dropped: the log has their events) and the store.
        With ``wait_s``, wait at most that long, in case the store is down and its commits retry: the process may
        then exit without them (they stay in a durable log). Not closing them at all had let a replay cut short
        run on in the engine's threads while the process exited: the C++ runtime aborted it (exit -6)."""

        def close() -> None:
            self._report = self.engine.close()
            if self.remote_writer is not None:  # after the engine's last commit: its minutes may be final now
                self.remote_writer.close()
            self.store.close()

        if wait_s is None:
            close()
            return
        closer = threading.Thread(target=close, name="drainpipe-close", daemon=True)
        closer.start()
        closer.join(wait_s)
        if closer.is_alive():
            log.error("the store did not take its last commits in %.0f s; exiting without them", wait_s)

    def summary(self) -> dict[str, Any]:
        report = getattr(self, "_report", None) or self.engine.report()
        c = self.counters
        return {
            "requests": c.requests,
            "accepted": c.accepted,
            "rejected": c.rejected,
            "refused_429": c.refused_busy,
            "refused_503": c.refused_unavailable,
            "replayed": self.feeder.replayed_events,
            "stored": self.engine.counters.events_stored,
            "in_log": self.log.end - self.feeder.committed,
            "dropped": report["dropped"],
            "handler_errors": report["handler_errors"],
            "overflow_rows": report["overflow"],
            "store_retries": self.engine.counters.store_retries,
            "store_errors": self.engine.counters.store_errors,
            "persisted_batches": self.engine.counters.persisted_batches,
        }

    # ------------------------------------------------------------------ views

    def log_note(self) -> str:
        """One phrase for the start-up line: where acknowledged events are kept, and what was replayed."""
        lg = self.log
        if not lg.durable:
            return "durability none: acknowledged events are held in memory"
        return f"write-ahead log {lg.location}, {lg.end - self.feeder.committed:,} bytes to replay"

    @property
    def max_ts(self) -> int | None:
        return self._max_ts

    def health(self) -> tuple[int, dict[str, Any]]:
        """200 with status ``ok`` or ``degraded`` (a volume low on space), 503 otherwise (draining, failed, a disk
        under the refusal threshold)."""
        status = "draining" if self._draining else "failed" if self.feeder.failed else "ok"
        body = {
            "status": status,
            "store": "ok" if self.store.available else "unavailable",
            "uptime_s": round(time.time() - self.started, 1),
        }
        disk = self.disk.health()
        if disk is not None:
            body["disk"] = disk[1]
            if status == "ok":
                body["status"] = status = disk[0]
        if self.feeder.failed:
            body["error"] = self.feeder.failed
        return (200 if status in ("ok", "degraded") else 503), body

    def stats_view(self) -> dict[str, Any]:
        """The JSON behind the dashboard and ``drainpipe stats``."""
        return self.sampler.view()

    def intake(self) -> Intake:
        """What the service took in so far (the sampler's :class:`~.live.Watched` shape)."""
        c = self.counters
        return Intake(c.accepted, c.rejected, c.refused_busy, c.refused_unavailable, c.requests, c.reasons.copy(),
                      c.warnings.copy())  # fmt: skip

    def sections(self) -> dict[str, Any]:
        """The service's parts of the live view: the write-ahead log, purges, alerts."""
        lg, feeder = self.log, self.feeder
        return {
            "store": {
                "purges": self.purger.purges,
                "early_purges": self.purger.early_purges,
                "purged_rows": self.purger.purged_rows,
                "purge_error": self.purger.last_error,
            },  # fmt: skip
            "disk": self.disk.describe(),
            "log": {
                "durable": lg.durable,
                "bytes": lg.size,
                "max_bytes": lg.max_bytes,
                "end": lg.end,
                "fed": feeder.position,
                "committed": feeder.committed,
                "replayed_events": feeder.replayed_events,
                "recovery_s": None if feeder.recovered_s is None else round(feeder.recovered_s, 3),
                "failed": feeder.failed,
            },
            "alerts": self.alerter.view() | {"webhook": self.notifier.view() if self.notifier else None},
        }
