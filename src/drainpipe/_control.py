"""The control thread: every ownership change of one queue, serialised, answered with Futures.

Requests (periodic rebalance, ``rebalance_now``, ``add_handler`` growth, ``remove_handler``, shutdown) arrive as
events on a queue and run one at a time on the thread ``drainpipe-<queue>-control``, in the spirit of a consumer's
background thread: callers wait on a ``concurrent.futures.Future``; drain threads never run control work.

A partition changes owner with the two-phase handoff (:meth:`Partitions.handoff`): revoke (owner = UNOWNED),
fence (wait until each old owner has left the drain cycle it was in; a task sleeping in backoff is not in a
cycle), assign. Moves are batched: all revokes, one fence over all old owners, all assigns. Items produced
meanwhile stay in the partition and are drained by the new owner. A fence is bounded by the old owner's current
cycle; a shutdown ends a rebalance's fence early (the revoked partitions are then emptied by the final drain).

The controller works on the queue's parts, never on the queue: the partition state (:mod:`._partitions`), the
handler table (:mod:`._handlers`), the drain tasks and dispatcher (:mod:`._drain`), the scheduler, and the C
producer (the only writer of the route table).
"""

from __future__ import annotations

import logging
import queue as _queue_mod
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from ._balancer import SKIP_RATIO, DrainBalancer, task_loads
from ._config import BatchQueueConfig
from ._drain import Dispatcher, DrainTask
from ._fastpath import Producer
from ._handlers import Entry, HandlerTable
from ._partitions import Partitions
from ._routing import is_type_hash
from ._scheduler import Scheduler
from ._stats import RebalanceResult
from .errors import ConfigError, QueueError

log = logging.getLogger("drainpipe.control")
_DEFAULT_BALANCER = DrainBalancer.throughput_weighted()
_HISTORY = 200
_LOAD_SAMPLES = 2000


SMOOTHING = 0.25  # weight of the newest interval in the per-partition load the periodic rebalance plans on
WARMUP_SAMPLES = 3  # intervals measured before the first periodic plan


def smooth(previous: Sequence[float], sample: Sequence[int], n: int, alpha: float = SMOOTHING) -> list[float]:
    """Per-partition load: the mean of the first ``1/alpha`` intervals, then an exponentially weighted mean with
    ``alpha`` for the newest (``n`` counts the intervals so far, this one included). Interval noise on a steady
    load then stays under the balancer's trigger, while a real shift shows within a few intervals. A partition
    new since the last sample starts at its sample."""
    a = max(alpha, 1.0 / max(1, n))
    return [a * x + (1 - a) * previous[i] if i < len(previous) else float(x) for i, x in enumerate(sample)]


class Controller:
    """Owns the control thread of one queue. ``state`` is stable | revoking | fencing | assigning."""

    def __init__(
        self,
        name: str,
        config: BatchQueueConfig,
        *,
        parts: Partitions,
        table: HandlerTable,
        tasks: Sequence[DrainTask],
        dispatcher: Dispatcher,
        scheduler: Scheduler,
        producer: Producer,
        thread_count: int,
        release: Callable[[], None],
    ) -> None:
        self.name = name
        self._config = config
        self._parts = parts
        self._table = table
        self._tasks = tasks
        self._dispatcher = dispatcher
        self._scheduler = scheduler
        self._producer = producer
        self._thread_count = thread_count
        self._release = release
        self._type_routing = is_type_hash(config.partition_selector)
        self._consumer = config.consumer is not None
        self.periodic = (
            config.balancer is not None
            and config.rebalance_interval_ms > 0
            and len(tasks) > 1
            and config.shared_scheduler is None
        )
        self.interval = config.rebalance_interval_ms / 1000.0
        self.state = "stable"
        self.rebalances = 0
        self.history: deque[RebalanceResult] = deque(maxlen=_HISTORY)
        self.load_history: deque[tuple[float, tuple[int, ...]]] = deque(maxlen=_LOAD_SAMPLES)
        self._last_counts: list[int] = []
        self._smoothed: list[float] = []
        self._samples = 0
        self._events: _queue_mod.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]]] = (
            _queue_mod.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=f"drainpipe-{name}-control", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ event loop

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Queue ``fn(*args)`` for the control thread; its Future fails with RuntimeError once shut down."""
        fut: Future[Any] = Future()
        with self._lock:
            if self._stopped:
                fut.set_exception(QueueError(f"queue {self.name!r} is shut down"))
                return fut
            self._events.put((fn, args, fut))
        return fut

    def _loop(self) -> None:
        next_tick = time.monotonic() + self.interval if self.periodic else None
        while True:
            timeout = None if next_tick is None else max(0.0, next_tick - time.monotonic())
            fn: Callable[..., Any] | None
            try:
                fn, args, fut = self._events.get(timeout=timeout)
            except _queue_mod.Empty:
                fn = None
            if fn is not None and fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as exc:
                    fut.set_exception(exc)
                if fn == self.shutdown:
                    self._refuse_pending()
                    return
            if self.periodic and next_tick is not None and time.monotonic() >= next_tick:
                try:
                    self.rebalance(periodic=True)
                except Exception:
                    log.exception("queue %r: periodic rebalance failed", self.name)
                next_tick = time.monotonic() + self.interval

    def _refuse_pending(self) -> None:
        with self._lock:
            self._stopped = True
        while True:
            try:
                _, _, fut = self._events.get_nowait()
            except _queue_mod.Empty:
                return
            if fut.set_running_or_notify_cancel():
                fut.set_exception(QueueError(f"queue {self.name!r} is shut down"))

    # ------------------------------------------------------------------ rebalancing

    def _set_state(self, state: str) -> None:
        self.state = state

    def _throughput(self) -> list[int]:
        """Items produced per partition since the previous measurement (snapshot-and-reset)."""
        produced = self._parts.buffers.produced
        counts = [produced(p) for p in range(self._parts.count[0])]
        last = self._last_counts + [0] * (len(counts) - len(self._last_counts))
        self._last_counts = counts
        return [c - b for c, b in zip(counts, last)]

    def rebalance(self, periodic: bool = False) -> RebalanceResult:
        started = time.monotonic()
        tp = self._throughput()
        if periodic:  # plan on the smoothed load; rebalance_now plans on what happened since the last measurement
            self._samples += 1
            self._smoothed = smooth(self._smoothed, tp, self._samples)
            tp = [round(x) for x in self._smoothed]
        owner = list(self._parts.owner)
        tasks = len(self._tasks)
        before = tuple(task_loads(tp, owner, tasks))
        if periodic:
            self.load_history.append((time.time(), before))

        def result(
            moves: tuple[tuple[int, int, int], ...] = (), after: tuple[int, ...] = before, skipped: str = ""
        ) -> RebalanceResult:
            return RebalanceResult(time.time(), moves, before, after, (time.monotonic() - started) * 1000, skipped)

        if tasks <= 1:
            return result(skipped="single task")
        if periodic and self._samples < WARMUP_SAMPLES:
            return result(skipped="measuring")
        balancer = self._config.balancer or _DEFAULT_BALANCER
        plan = balancer.assign(tp, owner, tasks)
        if plan is None:
            if sum(tp) == 0:
                return result(skipped="no load")
            trigger = getattr(balancer, "trigger", SKIP_RATIO)
            return result(skipped="already even" if RebalanceResult.ratio(before) < trigger else "no gain")
        if len(plan) != len(owner) or any(not (0 <= t < tasks) for t in plan):
            log.error("queue %r: balancer returned an invalid plan; ignored", self.name)
            return result(skipped="invalid plan")
        moves = [(p, owner[p], plan[p]) for p in range(len(owner)) if plan[p] != owner[p]]
        if not moves:
            return result(skipped="no gain")
        listener = self._config.rebalance_listener

        def on_state(state: str) -> None:
            if state in ("revoked", "assigned"):
                if listener is not None:
                    self._tell(listener, state, moves)
                return
            self._set_state(state)

        done = self._parts.handoff(moves, on_state)
        self.state = "stable"
        if not done:
            return result(skipped="shutdown")
        for t in {new for _, _, new in moves}:
            self._scheduler.wake(self._tasks[t])
        res = result(tuple(moves), tuple(task_loads(tp, plan, tasks)))
        self.rebalances += 1
        self.history.append(res)
        log.info(
            "queue %r: rebalanced %d partitions, max/min load %.2f -> %.2f in %.1f ms",
            self.name,
            len(moves),
            res.ratio_before,
            res.ratio_after,
            res.duration_ms,
        )
        return res

    def _tell(self, listener: Any, phase: str, moves: list[tuple[int, int, int]]) -> None:
        """on_revoked per old owner, or on_assigned per new owner, with its partitions and their types."""
        by_task: dict[int, list[int]] = {}
        for p, old, new in moves:
            by_task.setdefault(old if phase == "revoked" else new, []).append(p)
        callback = listener.on_revoked if phase == "revoked" else listener.on_assigned
        for task, partitions in sorted(by_task.items()):
            try:
                callback(task, tuple(partitions), self._parts.types_on(partitions))
            except Exception:
                log.exception("queue %r: rebalance listener failed in %s", self.name, callback.__name__)

    # ------------------------------------------------------------------ handlers and growth

    def add_handler(
        self, type_: type, handler: Any, weight: float, split: int, key: Callable[[Any], Any] | None
    ) -> None:
        table, parts = self._table, self._parts
        if split and not self._type_routing:
            raise ConfigError("split handlers need the type_hash partition selector")
        old = table.entries.get(type_)
        if old is not None:
            self._detach(old)
        entry = Entry(type_, handler, weight, split, key)
        if not self._consumer and self._config.partitions.is_adaptive:
            weighted = table.weighted_count() + entry.weighted_count
            parts.grow(self._config.partitions.resolve(self._thread_count, weighted))
        placed = parts.place(max(1, split), table.home.get(type_))
        entry.bind(placed, handler, locked=not self._type_routing)
        table.home[type_] = placed
        table.entries[type_] = entry
        for p in placed:
            target = entry.target(p)
            assert target is not None
            parts.attach(p, target)
        if self._type_routing and not self._consumer:  # publish the route last: the handler is ready
            if split:
                table.split[type_] = entry
            else:
                self._producer.set_route(type_, placed[0])
        table.clear_warning(type_)

    def remove_handler(self, type_: type) -> bool:
        entry = self._table.entries.get(type_)
        if entry is None:
            return False
        self._detach(entry)
        return True

    def _detach(self, entry: Entry) -> None:
        """Unroute and unregister a handler, then fence its partitions' owners so it is no longer running."""
        if self._type_routing:
            self._producer.drop_route(entry.type)
        self._table.split.pop(entry.type, None)
        self._table.entries.pop(entry.type, None)
        for p in entry.partitions:
            self._parts.detach(p, entry.type)
        # not abortable: the caller is promised the handler is no longer running when this returns
        self._parts.fence(self._parts.owners_of(entry.partitions), abortable=False)

    # ------------------------------------------------------------------ shutdown

    def shutdown(self) -> None:
        """Let drain tasks empty their partitions (up to shutdown_timeout_ms), stop them, wait out any in-flight
        handler call however long it takes, then dispatch what is left once and release the scheduler."""
        self.periodic = False
        for task in self._tasks:
            task.drain_then_stop = True
            self._scheduler.wake(task)
        deadline = time.monotonic() + self._config.shutdown_timeout_ms / 1000.0
        for task in self._tasks:
            task.finished.wait(max(0.0, deadline - time.monotonic()))
        for task in self._tasks:
            task.stopped = True
        self._parts.fence(range(len(self._tasks)), abortable=False)
        self._dispatcher.final_drain()
        self._release()
        self.state = "stable"
