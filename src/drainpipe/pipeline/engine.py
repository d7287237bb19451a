"""The local engine: event batches -> columnar partials -> L1 aggregation -> L2 merge -> persistence.

Four BatchQueues, as in the seed's "Usage in the Codebase":

* ``ingest`` (single consumer, called from every drain task at once): turns each event batch into one partial per
  definition with :func:`aggregate_batch` (columnar, numpy/pyarrow). Metric partials are cut into chunks of at most
  ``chunk_rows`` state rows (:func:`split_partial`, which names the pieces so stores stay idempotent), so the
  number of items a metric puts into L1 follows the merge work it causes: that is what throughput-weighted
  rebalancing measures.
* ``L1`` (handler map, one handler per metric type; defaults cpu_cores(1.0), adaptive, idle 1-50 ms): merges minute
  states in memory and hands them to L2 every ``l1_flush_s`` and when idle. Metric types that carry more than one
  thread's share of the rows are registered ``split=True``: several threads merge them into separate accumulators
  and L2 merges those partial states again.
* ``L2`` (handler map; defaults cpu_cores_with_base(1, 0.25), adaptive, BLOCKING): merges again and every
  ``l2_flush_s`` sends its minute states to the persist queue (the store rolls them up to hour and day).
* ``topn`` (fixed(1) thread, one handler per top-N definition), like the seed's TopN worker.
* ``persist`` (one thread, one partition, BLOCKING): one store transaction per drained batch of partials.
  A store that is down (:class:`StoreUnavailable`) is retried with backoff while BLOCKING back-pressure holds the
  data upstream.

Back-pressure: a file replay must never lose an accepted event, so ``LocalEngine`` uses BLOCKING for L1 unless
told otherwise (``live=True`` picks the seed's IF_POSSIBLE for live telemetry). Every summary reports drops.
Thread-safety: ``ingest`` may be called from several threads; ``close`` once, after the last ``ingest``.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from .. import BatchQueue, BatchQueueConfig, BufferStrategy, DrainBalancer, PartitionPolicy, ThreadPolicy
from ..errors import StoreUnavailable
from .definitions import Definitions
from .functions import MetricAccumulator, MetricPartial, Partial, aggregate_batch, partial_type, split_partial

log = logging.getLogger("drainpipe.engine")


@dataclass(frozen=True)
class EngineOptions:
    """Queue configurations of the local engine (the seed's defaults), all overridable."""

    l1_threads: ThreadPolicy = field(default_factory=lambda: ThreadPolicy.cpu_cores(1.0))
    l1_partitions: PartitionPolicy = field(default_factory=PartitionPolicy.adaptive)
    l1_buffer: int = 256  # items are partial chunks of up to chunk_rows state rows
    l1_idle_ms: tuple[int, int] = (1, 50)
    l2_threads: ThreadPolicy = field(default_factory=lambda: ThreadPolicy.cpu_cores_with_base(1, 0.25))
    l2_partitions: PartitionPolicy = field(default_factory=PartitionPolicy.adaptive)
    l2_buffer: int = 64  # items are merged L1 flushes
    ingest_threads: ThreadPolicy = field(default_factory=lambda: ThreadPolicy.cpu_cores(1.0))
    ingest_buffer: int = 2  # event batches per ingest partition: bounds memory
    live: bool = False  # True: L1 drops when full (IF_POSSIBLE), as the seed does for telemetry
    rebalance_interval_ms: int = 500
    l1_flush_s: float = 1.0
    l2_flush_s: float = 5.0
    chunk_rows: int = 4096
    store_retry_s: tuple[float, float] = (0.05, 2.0)  # backoff from .. to


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


class _L1Handler:
    """One metric's minute states on L1; flushes to L2 on a period and when its drain task is idle."""

    def __init__(self, definition: Any, emit: Callable[[Partial], Any], flush_s: float) -> None:
        self.acc = MetricAccumulator(definition)
        self.emit = emit
        self.flush_s = flush_s
        self.last = time.monotonic()
        self.held = False

    def consume(self, batch: list[Partial]) -> None:
        for p in batch:
            self.acc.add(p)
        self.held = True
        if time.monotonic() - self.last >= self.flush_s:
            self.flush()

    def on_idle(self) -> None:
        if self.held:
            self.flush()

    def flush(self) -> None:
        self.last = time.monotonic()
        self.held = False
        merged = self.acc.drain()
        if merged is not None:
            self.emit(merged)


class _L2Handler(_L1Handler):
    """One metric's minute states (or one top-N's) on L2: merges what arrives and sends it to persistence on its
    period only, idle or not (the store derives hour and day states by merging, in the same transaction)."""

    def on_idle(self) -> None:
        if self.held and time.monotonic() - self.last >= self.flush_s:
            self.flush()


class LocalEngine:
    """The pipeline on this machine's BatchQueues. ``ingest(batch, source)`` from any thread, then ``close()``."""

    def __init__(
        self, definitions: Definitions, store: Any, options: EngineOptions | None = None, name: str = "pipeline"
    ) -> None:
        self.definitions = definitions
        self.store = store
        self.options = o = options or EngineOptions()
        self.counters = EngineCounters()
        self._count_lock = threading.Lock()
        self._registered = False
        self._register_lock = threading.Lock()
        self._l1_handlers: list[_L1Handler] = []
        self._l2_handlers: list[_L2Handler] = []
        self._topn_handlers: list[_L2Handler] = []
        self.name = name
        balancer = DrainBalancer.throughput_weighted()
        self.persist = BatchQueue(
            f"{name}-persist",
            BatchQueueConfig(
                threads=ThreadPolicy.fixed(1),
                partitions=PartitionPolicy.fixed(1),
                buffer_size=1_000,
                consumer=self._persist,
                min_idle_ms=5,
                max_idle_ms=100,
                shutdown_timeout_ms=60_000,
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
                max_idle_ms=50,
                balancer=balancer,
                rebalance_interval_ms=o.rebalance_interval_ms,
                shutdown_timeout_ms=60_000,
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
                max_idle_ms=100,
                shutdown_timeout_ms=60_000,
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
                max_idle_ms=o.l1_idle_ms[1],
                balancer=balancer,
                rebalance_interval_ms=o.rebalance_interval_ms,
                shutdown_timeout_ms=60_000,
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
                strategy=BufferStrategy.BLOCKING,
                shutdown_timeout_ms=60_000,
            ),
        )
        for topn in definitions.topns:
            h = _L2Handler(topn, self.persist.produce, o.l2_flush_s)
            self._topn_handlers.append(h)
            self.topn.add_handler(partial_type(topn), h)
        for metric in definitions.metrics:
            h2 = _L2Handler(metric, self.persist.produce, o.l2_flush_s)
            self._l2_handlers.append(h2)
            self.l2.add_handler(partial_type(metric), h2)

    # ------------------------------------------------------------------ intake

    def ingest(self, batch: pa.RecordBatch | pa.Table, source: str | None = None) -> bool:
        """Queue one validated event batch (``source`` = its identity, for idempotent stores). Blocks when the
        pipeline is full; False if the engine is closed."""
        return self.ingest_queue.produce((batch, source))

    def ingest_partials(self, partials: Sequence[Partial], events: int, batches: int = 1) -> None:
        """Queue partials aggregated elsewhere (e.g. in worker processes, :mod:`.parallel`) from ``events``
        events of ``batches`` input batches: metric partials go to L1 in chunks, top-N partials to topn. Blocks
        while L1 is full. Each partial must carry the sources of its batches (see :func:`aggregate_batch`)."""
        self._dispatch(list(partials), events, batches)

    def _aggregate(self, items: list[tuple[pa.RecordBatch, str | None]]) -> None:
        """ingest consumer: columnar aggregation, then partial chunks into L1 and top-N partials into topn."""
        for batch, source in items:
            self._dispatch(aggregate_batch(batch, self.definitions, source=source), batch.num_rows, 1)

    def _dispatch(self, partials: list[Partial], events: int, batches: int) -> None:
        self._register_l1(partials)
        l1_items: list[Partial] = []
        for p in partials:
            if isinstance(p, MetricPartial):
                l1_items.extend(split_partial(p, self.options.chunk_rows))
            else:
                self.topn.produce(p)
        self.l1.produce_many(l1_items)
        with self._count_lock:
            self.counters.batches += batches
            self.counters.events += events
            self.counters.partials += len(l1_items)

    def _register_l1(self, partials: list[Partial]) -> None:
        """Register L1 handlers on the first batch, splitting metric types heavier than one thread's share."""
        if self._registered:
            return
        with self._register_lock:
            if self._registered:
                return
            metric_parts = [p for p in partials if isinstance(p, MetricPartial)]
            total = sum(p.table.num_rows for p in metric_parts) or 1
            fair = total / max(1, self.l1.task_count)
            for p in metric_parts:
                split = self.l1.task_count > 1 and p.table.num_rows > fair
                factory = self._l1_factory(p.definition)
                if split:
                    self.l1.add_handler(type(p), factory, weight=1.0, split=True)
                else:
                    self.l1.add_handler(type(p), factory())
            self._registered = True

    def _l1_factory(self, definition: Any) -> Callable[[], _L1Handler]:
        def make() -> _L1Handler:
            h = _L1Handler(definition, self.l2.produce, self.options.l1_flush_s)
            self._l1_handlers.append(h)
            return h

        return make

    # ------------------------------------------------------------------ persistence

    def _persist(self, partials: list[Partial]) -> None:
        """persist consumer: one transaction per drained batch; retried with backoff while the store is down."""
        delay, cap = self.options.store_retry_s
        while True:
            t0 = time.perf_counter()
            try:
                self.store.merge(partials)
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
        }
