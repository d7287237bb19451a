"""The local engine: event batches -> columnar partials -> L1 aggregation -> L2 merge -> persistence.

Four BatchQueues, as in the seed's "Usage in the Codebase":

* ``ingest`` (single consumer, called from every drain task at once, so declared thread-safe: a hung call fails
  the task's partitions over to the other tasks and intake goes on): turns each event batch into one partial per
  definition with :func:`aggregate_batch` (columnar, numpy/pyarrow). Metric partials are cut into chunks of at most
  ``chunk_rows`` state rows (:func:`split_partial`), so the number of items a metric puts into L1 follows the merge
  work it causes: that is what throughput-weighted rebalancing measures.
* ``L1`` (handler map, one handler per metric type; defaults cpu_cores(1.0), adaptive, idle 1-50 ms): merges minute
  states in memory and hands them to L2 every ``l1_flush_s`` and when idle. Every metric type is registered
  ``split="auto"``: while one carries more than one thread's share of the rows the queue runs it as several
  instances on different threads (separate accumulators; L2 merges their partial states again), and joins them
  when its load falls back.
* ``L2`` (handler map, ``split="auto"`` too; defaults cpu_cores_with_base(1, 0.25), adaptive, BLOCKING): merges
  again and every ``l2_flush_s`` sends its minute states to the persist queue (the store rolls them up to hour and
  day); with checkpoints, only when a checkpoint asks.
* ``topn`` (fixed(1) thread, one handler per top-N definition), like the seed's TopN worker.
* ``persist`` (one thread, one partition, BLOCKING): one store transaction per drained batch of partials.
  A store that is down (:class:`StoreUnavailable`) is retried with backoff while BLOCKING back-pressure holds the
  data upstream.

Back-pressure: a file replay must never lose an accepted event, so ``LocalEngine`` uses BLOCKING for L1 unless
told otherwise (``live=True`` picks the seed's IF_POSSIBLE for live telemetry). Every summary reports drops.
Thread-safety: ``ingest`` may be called from several threads; ``close`` once, after the last ``ingest``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from .. import BatchQueue, BatchQueueConfig, BufferStrategy, DrainBalancer, PartitionPolicy, ThreadPolicy
from ..errors import Fenced, StoreUnavailable, first_line
from ..inputs import EventBatch
from .aggregate import RequestColumns, aggregate_batch
from .cardinality import EntityGuard
from .definitions import Definitions
from .driver import Commit
from .partials import MetricAccumulator, MetricPartial, Partial, partial_type, split_partial
from .store import SourceProgress

log = logging.getLogger("drainpipe.engine")

#: most drain threads of one stage: the engine is one GIL-bound process, and past a few dozen threads more only
#: contend for it (a 64-core host would otherwise start 148 threads)
MAX_STAGE_THREADS = 32


@dataclass(frozen=True)
class EngineOptions:
    """Queue configurations of the local engine (the seed's defaults), all overridable."""

    l1_threads: ThreadPolicy = field(default_factory=lambda: ThreadPolicy.cpu_cores(1.0, at_most=MAX_STAGE_THREADS))
    l1_partitions: PartitionPolicy = field(default_factory=PartitionPolicy.adaptive)
    l1_buffer: int = 256  # items are partial chunks of up to chunk_rows state rows
    l1_idle_ms: tuple[int, int] = (1, 50)
    l2_threads: ThreadPolicy = field(
        default_factory=lambda: ThreadPolicy.cpu_cores_with_base(1, 0.25, at_most=MAX_STAGE_THREADS)
    )
    l2_partitions: PartitionPolicy = field(default_factory=PartitionPolicy.adaptive)
    l2_buffer: int = 64  # items are merged L1 flushes
    ingest_threads: ThreadPolicy = field(default_factory=lambda: ThreadPolicy.cpu_cores(1.0, at_most=MAX_STAGE_THREADS))
    ingest_buffer: int = 2  # event batches per ingest partition: bounds memory
    live: bool = False  # True: L1 drops when full (IF_POSSIBLE), as the seed does for telemetry
    rebalance_interval_ms: int = 500
    l1_flush_s: float = 1.0
    l2_flush_s: float = 5.0
    chunk_rows: int = 4096
    store_retry_s: tuple[float, float] = (0.05, 2.0)  # backoff from .. to
    slow_handler_ms: int = 10_000  # a stage call running longer than this is reported (stats, /metrics, dashboard)
    #: the longest idle backoff of every stage's drain threads (None: each stage's own, 50-100 ms). An idle drain
    #: thread wakes at this period to call its handlers' ``on_idle``; data and checkpoints wake it at once anyway
    max_idle_ms: int | None = None
    checkpoints: bool = False  # True: the store is written only at checkpoint(), one transaction each (file runs)


@dataclass
class EngineCounters:
    batches: int = 0
    events: int = 0
    partials: int = 0
    persisted_batches: int = 0
    persisted_partials: int = 0
    store_errors: int = 0
    store_retries: int = 0
    store_write_s: float = 0.0
    checkpoints: int = 0  # committed
    events_stored: int = 0  # events covered by committed checkpoints
    events_not_stored: int = 0  # events covered by checkpoints whose commit failed (or rolled back)
    store_error: str = ""  # the first store failure, one line


class _FlushRequest:
    """While ``active`` (a checkpoint is draining the stages), every handler hands its state on as soon as it has
    any and is idle, instead of on its period."""

    def __init__(self) -> None:
        self.active = False


class _L1Handler:
    """One metric's minute states on L1; flushes to L2 on a period and when its drain task is idle.

    ``consumed`` and ``emitted`` count items in and flushes out; only the handler's own thread writes them (a
    handler is never called concurrently with itself), and a checkpoint reads them to know the stage is empty."""

    def __init__(self, definition: Any, emit: Callable[[Partial], Any], flush_s: float, request: _FlushRequest) -> None:
        self.acc = MetricAccumulator(definition)
        self.emit = emit
        self.flush_s = flush_s
        self.last = time.monotonic()
        self.held = False
        self.consumed = 0
        self.emitted = 0
        self.request = request

    def consume(self, batch: list[Partial]) -> None:
        for p in batch:
            self.acc.add(p)
        self.held = True
        if time.monotonic() - self.last >= self.flush_s:
            self.flush()
        self.consumed += len(batch)

    def on_idle(self) -> None:
        if self.held:
            self.flush()

    def flush(self) -> None:
        self.last = time.monotonic()
        merged = self.acc.drain()
        if merged is not None:
            self.emit(merged)
            self.emitted += 1
        self.held = False


class _L2Handler(_L1Handler):
    """One metric's minute states (or one top-N's) on L2: merges what arrives and sends it to persistence on its
    period, idle or not (the store derives hour and day states by merging, in the same transaction), and at once
    when a checkpoint asks; with checkpoints, only then (its period is infinite: :meth:`LocalEngine._l2_period`)."""

    def on_idle(self) -> None:
        if self.held and (self.request.active or time.monotonic() - self.last >= self.flush_s):
            self.flush()


class LocalEngine:
    """The pipeline on this machine's BatchQueues. ``ingest(batch)`` from any thread, then ``close()``."""

    def __init__(
        self,
        definitions: Definitions,
        store: Any,
        options: EngineOptions | None = None,
        name: str = "pipeline",
        observe: Callable[[EventBatch, RequestColumns], None] | None = None,
    ) -> None:
        """``observe(batch, columns)``: called on the ingest thread for every :class:`EventBatch` ingested, once it
        is aggregated, with its request rows' columns as the aggregation read them (``serve``'s RED metrics count
        them without encoding the strings again); an error there is logged, never raised."""
        self.observe = observe
        self.definitions = definitions
        self.store = store
        self.options = o = options or EngineOptions()
        self.counters = EngineCounters()
        self._count_lock = threading.Lock()
        self._l1_handlers: list[_L1Handler] = []
        self._l2_handlers: list[_L2Handler] = []
        self._topn_handlers: list[_L2Handler] = []
        self._request = _FlushRequest()
        self._ingest_in = self._ingest_done = self._topn_in = 0  # written under _count_lock
        self._held: list[Partial] = []  # persist thread: states waiting for their checkpoint
        self.name = name
        self.guard = EntityGuard(definitions.max_entities)
        balancer = DrainBalancer.throughput_weighted()
        self.persist = BatchQueue(
            f"{name}-persist",
            BatchQueueConfig(
                threads=ThreadPolicy.fixed(1),
                partitions=PartitionPolicy.fixed(1),
                buffer_size=1_000,
                consumer=self._persist,
                min_idle_ms=5,
                max_idle_ms=self._max_idle(5, 100),
                shutdown_timeout_ms=60_000,
                slow_handler_ms=o.slow_handler_ms,
            ),
        )
        self.l2 = BatchQueue(
            f"{name}-L2",
            BatchQueueConfig(
                threads=o.l2_threads,
                partitions=o.l2_partitions,
                buffer_size=o.l2_buffer,
                strategy=BufferStrategy.BLOCKING,
                min_idle_ms=1,
                max_idle_ms=self._max_idle(1, 50),
                balancer=balancer,
                rebalance_interval_ms=o.rebalance_interval_ms,
                shutdown_timeout_ms=60_000,
                slow_handler_ms=o.slow_handler_ms,
            ),
        )
        self.topn = BatchQueue(
            f"{name}-topn",
            BatchQueueConfig(
                threads=ThreadPolicy.fixed(1),
                partitions=PartitionPolicy.adaptive(),
                buffer_size=1_000,
                strategy=BufferStrategy.BLOCKING,
                min_idle_ms=10,
                max_idle_ms=self._max_idle(10, 100),
                shutdown_timeout_ms=60_000,
                slow_handler_ms=o.slow_handler_ms,
            ),
        )
        self.l1 = BatchQueue(
            f"{name}-L1",
            BatchQueueConfig(
                threads=o.l1_threads,
                partitions=o.l1_partitions,
                buffer_size=o.l1_buffer,
                strategy=BufferStrategy.IF_POSSIBLE if o.live else BufferStrategy.BLOCKING,
                min_idle_ms=o.l1_idle_ms[0],
                max_idle_ms=self._max_idle(*o.l1_idle_ms),
                balancer=balancer,
                rebalance_interval_ms=o.rebalance_interval_ms,
                shutdown_timeout_ms=60_000,
                slow_handler_ms=o.slow_handler_ms,
            ),
        )
        rr = itertools.count()
        self.ingest_queue = BatchQueue(
            f"{name}-ingest",
            BatchQueueConfig(
                threads=o.ingest_threads,
                partitions=PartitionPolicy.thread_multiply(1),
                buffer_size=o.ingest_buffer,
                partition_selector=lambda item, n: next(rr) % n,
                consumer=self._aggregate,
                # _aggregate is called from every ingest task at once already: a hung call fails over, so the
                # round-robin producers blocked on its partition go on (intake never stops for one batch)
                consumer_thread_safe=True,
                # (the queue's default backoff)
                max_idle_ms=self._max_idle(BatchQueueConfig.min_idle_ms, BatchQueueConfig.max_idle_ms),
                strategy=BufferStrategy.BLOCKING,
                shutdown_timeout_ms=60_000,
                slow_handler_ms=o.slow_handler_ms,
            ),
        )
        for topn in definitions.topns:
            h = _L2Handler(topn, self.persist.produce, self._l2_period(), self._request)
            self._topn_handlers.append(h)
            self.topn.add_handler(partial_type(topn), h)
        for metric in definitions.metrics:  # split="auto": a metric that turns hot spreads over more threads
            self.l1.add_handler(partial_type(metric), self._l1_factory(metric), weight=1.0, split="auto")
            self.l2.add_handler(partial_type(metric), self._l2_factory(metric), weight=1.0, split="auto")

    # ------------------------------------------------------------------ intake

    def ingest(
        self,
        batch: EventBatch | pa.RecordBatch | pa.Table,
        *,
        definitions: Definitions | None = None,
    ) -> bool:
        """The engine's front door for events: queue one validated event batch (a plain batch or table is requests
        only; ``definitions``: a subset to aggregate it for, default all). Blocks when the pipeline is full; False if
        the engine is closed. Events aggregated elsewhere (``run``'s worker processes) come in as partials, through
        :meth:`ingest_partials`."""
        with self._count_lock:
            self._ingest_in += 1
        if self.ingest_queue.produce((batch, definitions)):
            return True
        with self._count_lock:
            self._ingest_in -= 1
        return False

    def ingest_partials(self, partials: Sequence[Partial], events: int, batches: int = 1) -> None:
        """Queue partials aggregated elsewhere (e.g. in worker processes, :mod:`.parallel`) from ``events``
        events of ``batches`` input batches: metric partials go to L1 in chunks, top-N partials to topn. Blocks
        while L1 is full."""
        self._dispatch(list(partials), events, batches)

    def _aggregate(self, items: list[tuple[EventBatch | pa.RecordBatch | pa.Table, Definitions | None]]) -> None:
        """ingest consumer: columnar aggregation, then partial chunks into L1 and top-N partials into topn."""
        for batch, definitions in items:
            observe = None
            if self.observe is not None and isinstance(batch, EventBatch) and batch.requests:
                observe = functools.partial(self._observe, batch)
            partials = aggregate_batch(batch, definitions or self.definitions, observe)
            self._dispatch(partials, batch.requests if isinstance(batch, EventBatch) else batch.num_rows, 1)
            with self._count_lock:
                self._ingest_done += 1

    def _observe(self, batch: EventBatch, columns: RequestColumns) -> None:
        assert self.observe is not None
        try:
            self.observe(batch, columns)
        except Exception:  # the traffic's metrics must not stop the aggregation
            log.exception("observing an ingested batch failed")

    def _dispatch(self, partials: list[Partial], events: int, batches: int) -> None:
        partials = self.guard.apply(partials)  # entities beyond max_entities fold before any stage keeps them
        l1_items: list[Partial] = []
        topns = 0
        for p in partials:
            if isinstance(p, MetricPartial):
                l1_items.extend(split_partial(p, self.options.chunk_rows))
            elif self.topn.produce(p):
                topns += 1
        self.l1.produce_many(l1_items)
        with self._count_lock:
            self.counters.batches += batches
            self.counters.events += events
            self.counters.partials += len(l1_items)
            self._topn_in += topns

    def _l1_factory(self, definition: Any) -> Callable[[], _L1Handler]:
        def make() -> _L1Handler:
            h = _L1Handler(definition, self.l2.produce, self.options.l1_flush_s, self._request)
            self._l1_handlers.append(h)  # before it is routed to: the checkpoints count what it consumes
            return h

        return make

    def _max_idle(self, min_ms: int, max_ms: int) -> int:
        """A stage's longest idle backoff: its own ``max_ms``, else ``EngineOptions.max_idle_ms`` (at least
        ``min_ms``)."""
        o = self.options.max_idle_ms
        return max_ms if o is None else max(min_ms, o)

    def _l2_period(self) -> float:
        """How often L2 hands its states to persistence unasked: every ``l2_flush_s``; never with checkpoints, where
        each checkpoint asks for them and the persist stage holds them until it commits. A flush on a period there
        would only hold the same keys twice: the paced checkpoints come up to five periods apart."""
        return math.inf if self.options.checkpoints else self.options.l2_flush_s

    def _l2_factory(self, definition: Any) -> Callable[[], _L2Handler]:
        def make() -> _L2Handler:
            h = _L2Handler(definition, self.persist.produce, self._l2_period(), self._request)
            self._l2_handlers.append(h)
            return h

        return make

    # ------------------------------------------------------------------ persistence

    def _persist(self, items: list[Any]) -> None:
        """persist consumer. Live: one transaction per drained batch. With checkpoints: partials are held until
        their :class:`Commit` marker, then written in one transaction with its file progress."""
        if not self.options.checkpoints:
            self._write(items, ())
            return
        for item in items:
            if not isinstance(item, Commit):
                self._held.append(item)  # L2's flushes: already merged per definition; the store merges them once
                continue
            held, self._held = self._held, []
            if item.rollback:
                self.counters.events_not_stored += item.events
            elif self.counters.store_error:
                # a checkpoint failed: committing a later one would record its input position past the states
                # that were not stored, and they would never be stored (Flink's rule: a failed checkpoint ends
                # the job). Its input is applied again by the next run or start, from the last committed position.
                item.error = f"not stored: an earlier checkpoint failed ({self.counters.store_error})"
                self.counters.events_not_stored += item.events
            else:
                try:
                    self._write(held, item.progress, item.fences)
                    self.counters.checkpoints += 1
                    self.counters.events_stored += item.events
                except Fenced as exc:  # another owner has the input now: this commit's states are not ours to
                    # write; the writer drops what it holds and reads its parts again from the store (not an error
                    # that stops later commits: they carry fresh tokens, or are fenced in turn)
                    item.error, item.fenced = first_line(exc), True
                    self.counters.events_not_stored += item.events
                    log.warning("checkpoint fenced: %s", item.error)
                except Exception as exc:  # recorded for the run's summary and exit status; a rerun stores it
                    item.error = first_line(exc)
                    self.counters.events_not_stored += item.events
                    self.counters.store_error = self.counters.store_error or item.error
                    log.error("checkpoint not stored: %s", item.error)
            item.finish()

    def _write(
        self, partials: Sequence[Partial], progress: Sequence[SourceProgress], fences: Sequence[SourceProgress] = ()
    ) -> None:
        """One store transaction, retried with backoff while the store is down (StoreUnavailable)."""
        delay, cap = self.options.store_retry_s
        while True:
            t0 = time.perf_counter()
            try:
                self.store.merge(partials, progress=progress, fences=fences)
            except StoreUnavailable as exc:
                self.counters.store_retries += 1
                log.warning("store unavailable (%s); retrying in %.2fs", exc, delay)
                time.sleep(delay)
                delay = min(cap, delay * 2)
                continue
            except Exception:
                self.counters.store_errors += 1
                raise
            self.counters.store_write_s += time.perf_counter() - t0
            self.counters.persisted_batches += 1
            self.counters.persisted_partials += len(partials)
            return

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self, progress: Sequence[SourceProgress], events: int, *, wait: bool = False,
                   rollback: bool = False, fences: Sequence[SourceProgress] = ()) -> Commit:  # fmt: skip
        """Hand everything ingested so far to the store in one transaction together with ``progress`` (the input
        it covers: ``events`` events), or discard it (``rollback``, e.g. after a read error in a file). ``fences``:
        the writer's fencing tokens (:meth:`Store.fence`): a commit with a stale one is discarded, ``fenced``.

        Call between ingests, from the thread that ingests (nothing may be ingested meanwhile). Blocks until every
        stage has passed its states on (usually a few milliseconds), then queues the commit behind them; with
        ``wait``, until it is done. Needs ``EngineOptions.checkpoints``."""
        if not self.options.checkpoints:
            raise RuntimeError("checkpoint() needs EngineOptions(checkpoints=True)")
        self._quiesce()
        commit = Commit(list(progress), events, rollback, list(fences))
        self.persist.produce(commit)
        if wait:
            commit.done.wait()
        return commit

    def _quiesce(self) -> None:
        """Wait until ingest, L1, L2 and top-N have processed what they were given and flushed it downstream."""
        dropped = lambda q: q.stats().dropped_full
        self._wait(lambda: self._ingest_done == self._ingest_in)
        self._wait(lambda: sum(h.consumed for h in self._l1_handlers) + dropped(self.l1) >= self.counters.partials)
        self._request.active = True  # every handler holding state hands it on when idle
        for q in (self.l1, self.l2, self.topn):
            q.wake_idle()  # now, not after their idle backoff (up to 100 ms; serve's, up to max_idle_ms = 500)
        try:
            self._wait(lambda: not any(h.held for h in self._l1_handlers))
            self._wait(lambda: sum(h.consumed for h in self._l2_handlers) >= sum(h.emitted for h in self._l1_handlers))
            self._wait(lambda: sum(h.consumed for h in self._topn_handlers) >= self._topn_in)
            self._wait(lambda: not any(h.held for h in (*self._l2_handlers, *self._topn_handlers)))
        finally:
            self._request.active = False

    @staticmethod
    def _wait(condition: Callable[[], bool]) -> None:
        pause = 0.0002
        while not condition():
            time.sleep(pause)
            pause = min(pause * 2, 0.005)

    # ------------------------------------------------------------------ shutdown

    def close(self) -> dict[str, Any]:
        """Flush every stage in order and shut the queues down; returns the queue statistics and drops."""
        self.ingest_queue.shutdown()
        self.l1.shutdown()
        for h in self._l1_handlers:  # no L1 drain task runs any more: flushing here cannot race them
            h.flush()
        self.l2.shutdown()
        for h2 in self._l2_handlers:
            h2.flush()
        self.topn.shutdown()
        for h3 in self._topn_handlers:
            h3.flush()
        if self.options.checkpoints:  # what no checkpoint covered is not written (the caller checkpoints first)
            self.persist.produce(Commit([], 0, rollback=True))
        self.persist.shutdown()
        return self.report()

    def queues(self) -> Sequence[BatchQueue]:
        return (self.ingest_queue, self.l1, self.l2, self.topn, self.persist)

    def report(self) -> dict[str, Any]:
        stats = {q.name: q.stats() for q in self.queues()}
        return {
            "counters": self.counters,
            "stats": stats,
            "dropped": sum(s.dropped_full + s.dropped_no_handler for s in stats.values()),
            "handler_errors": sum(s.handler_errors for s in stats.values()),
            "overflow": dict(self.guard.folded),  # per scope: state rows folded into __overflow__
        }
