"""The control thread: every ownership change of one queue, serialised, answered with Futures.

Requests (periodic rebalance, ``rebalance_now``, ``add_handler`` growth, ``remove_handler``, shutdown) arrive as
events on a queue and run one at a time on the thread ``drainpipe-<queue>-control``, in the spirit of a consumer's
background thread: callers wait on a ``concurrent.futures.Future``; drain threads never run control work.

A partition changes owner with the two-phase handoff: revoke (owner = UNOWNED), fence (wait until each old owner
has left the drain cycle it was in; a task sleeping in backoff is not in a cycle), assign. Moves are batched: all
revokes, one fence over all old owners, all assigns. Items produced meanwhile stay in the partition and are drained
by the new owner. A fence is bounded by the old owner's current cycle; a shutdown ends a rebalance's fence early
(the revoked partitions are then emptied by the final drain).
"""
from __future__ import annotations

import logging
import queue as _queue_mod
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ._balancer import SKIP_RATIO, DrainBalancer, task_loads
from ._stats import RebalanceResult

if TYPE_CHECKING:
    from ._queue import BatchQueue, _Entry

log = logging.getLogger("drainpipe.control")
_DEFAULT_BALANCER = DrainBalancer.throughput_weighted()
_HISTORY = 200
_LOAD_SAMPLES = 2000


class Controller:
    """Owns the control thread of one queue. ``state`` is stable | revoking | fencing | assigning."""

    def __init__(self, q: BatchQueue) -> None:
        from ._queue import UNOWNED

        self.q = q
        self._unowned = UNOWNED
        cfg = q.config
        self.periodic = (cfg.balancer is not None and cfg.rebalance_interval_ms > 0 and len(q._tasks) > 1
                         and cfg.shared_scheduler is None)
        self.interval = cfg.rebalance_interval_ms / 1000.0
        self.state = "stable"
        self.rebalances = 0
        self.history: deque[RebalanceResult] = deque(maxlen=_HISTORY)
        self.load_history: deque[tuple[float, tuple[int, ...]]] = deque(maxlen=_LOAD_SAMPLES)
        self._last_counts: list[int] = []
        self._events: _queue_mod.SimpleQueue = _queue_mod.SimpleQueue()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=f"drainpipe-{q.name}-control", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ event loop

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Queue ``fn(*args)`` for the control thread; its Future fails with RuntimeError once shut down."""
        fut: Future = Future()
        with self._lock:
            if self._stopped:
                fut.set_exception(RuntimeError(f"queue {self.q.name!r} is shut down"))
                return fut
            self._events.put((fn, args, fut))
        return fut

    def _loop(self) -> None:
        next_tick = time.monotonic() + self.interval if self.periodic else None
        while True:
            timeout = None if next_tick is None else max(0.0, next_tick - time.monotonic())
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
                    log.exception("queue %r: periodic rebalance failed", self.q.name)
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
                fut.set_exception(RuntimeError(f"queue {self.q.name!r} is shut down"))

    # ------------------------------------------------------------------ fencing and handoff

    def _fence(self, tasks: Iterable[int], abortable: bool) -> bool:
        """Wait until each task has left the cycle it is in now. False if a shutdown cut a rebalance's fence short."""
        epoch = self.q._epoch
        waiting = {t: epoch[t] for t in tasks if epoch[t] & 1}
        pause = 0.00005
        while waiting:
            if abortable and self.q._closing[0]:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.001)
            waiting = {t: e for t, e in waiting.items() if epoch[t] == e}
        return True

    def _handoff(self, moves: list[tuple[int, int, int]]) -> bool:
        q = self.q
        self.state = "revoking"
        for p, _, _ in moves:
            q._owner[p] = self._unowned
        self.state = "fencing"
        if not self._fence({old for _, old, _ in moves}, abortable=True):
            self.state = "stable"
            return False
        self.state = "assigning"
        for p, _, new in moves:
            q._owner[p] = new
        q._assigned = q._assignment_from_owner()
        for t in {new for _, _, new in moves}:
            q._scheduler.wake(q._tasks[t])
        self.state = "stable"
        return True

    # ------------------------------------------------------------------ rebalancing

    def _throughput(self) -> list[int]:
        """Items produced per partition since the previous measurement (snapshot-and-reset)."""
        q = self.q
        counts = [q.produced_count(p) for p in range(q._pcount[0])]
        last = self._last_counts + [0] * (len(counts) - len(self._last_counts))
        self._last_counts = counts
        return [c - b for c, b in zip(counts, last)]

    def rebalance(self, periodic: bool = False) -> RebalanceResult:
        q = self.q
        started = time.monotonic()
        tp = self._throughput()
        owner = list(q._owner)
        tasks = len(q._tasks)
        before = tuple(task_loads(tp, owner, tasks))
        if periodic:
            self.load_history.append((time.time(), before))

        def result(moves: tuple = (), after: tuple = before, skipped: str = "") -> RebalanceResult:
            return RebalanceResult(time.time(), moves, before, after, (time.monotonic() - started) * 1000, skipped)

        if tasks <= 1:
            return result(skipped="single task")
        plan = (q.config.balancer or _DEFAULT_BALANCER).assign(tp, owner, tasks)
        if plan is None:
            if sum(tp) == 0:
                return result(skipped="no load")
            return result(skipped="already even" if RebalanceResult.ratio(before) < SKIP_RATIO else "no gain")
        if len(plan) != len(owner) or any(not (0 <= t < tasks) for t in plan):
            log.error("queue %r: balancer returned an invalid plan; ignored", q.name)
            return result(skipped="invalid plan")
        moves = [(p, owner[p], plan[p]) for p in range(len(owner)) if plan[p] != owner[p]]
        if not moves:
            return result(skipped="no gain")
        if not self._handoff(moves):
            return result(skipped="shutdown")
        res = result(tuple(moves), tuple(task_loads(tp, plan, tasks)))
        self.rebalances += 1
        self.history.append(res)
        log.info("queue %r: rebalanced %d partitions, max/min load %.2f -> %.2f in %.1f ms", q.name, len(moves),
                 res.ratio_before, res.ratio_after, res.duration_ms)
        return res

    # ------------------------------------------------------------------ handlers and growth

    def add_handler(self, type_: type, handler: Any, weight: float, split: int, key: Callable | None) -> None:
        from ._queue import _Entry

        q = self.q
        if split and not q._type_routing:
            raise ValueError("split handlers need the type_hash partition selector")
        old = q._handlers.get(type_)
        if old is not None:
            self._detach(old)
        entry = _Entry(type_, handler, weight, split, key)
        if q._consumer is None and q.config.partitions.is_adaptive:
            weighted = sum(e.weighted_count for e in q._handlers.values()) + entry.weighted_count
            self._grow(q.config.partitions.resolve(q._thread_count, weighted))
        parts = self._place(type_, max(1, split))
        entry.bind(parts, handler, locked=not q._type_routing)
        q._home[type_] = parts
        q._handlers[type_] = entry
        for p in parts:
            q._part_targets[p] = q._part_targets[p] + (entry.target(p),)
            q._part_types[p] += 1
        if q._type_routing and q._consumer is None:       # publish the route last: the handler is ready
            if split:
                q._split[type_] = entry
            else:
                q.produce.set_route(type_, parts[0])
        q._warned.discard(type_)

    def remove_handler(self, type_: type) -> bool:
        entry = self.q._handlers.get(type_)
        if entry is None:
            return False
        self._detach(entry)
        return True

    def _detach(self, entry: _Entry) -> None:
        """Unroute and unregister a handler, then fence its partitions' owners so it is no longer running."""
        q = self.q
        if q._type_routing:
            q.produce.drop_route(entry.type)
        q._split.pop(entry.type, None)
        q._handlers.pop(entry.type, None)
        for p in entry.partitions:
            q._part_targets[p] = tuple(tg for tg in q._part_targets[p] if tg.type is not entry.type)
            q._part_types[p] -= 1
        # not abortable: the caller is promised the handler is no longer running when this returns
        self._fence({q._owner[p] for p in entry.partitions if q._owner[p] >= 0}, abortable=False)

    def _place(self, type_: type, k: int) -> tuple[int, ...]:
        """Partitions for a newly registered type: its previous ones if it had any (items of a re-registered type
        must not sit in two partitions), else the k partitions carrying the fewest types, on distinct owners."""
        q = self.q
        n = q._pcount[0]
        k = min(k, n)
        home = q._home.get(type_)
        if home is not None and len(home) == k and all(p < n for p in home):
            return home
        order = sorted(range(n), key=lambda p: (q._part_types[p], p))
        chosen: list[int] = []
        owners: set[int] = set()
        for p in order:
            if len(chosen) < k and q._owner[p] not in owners:
                chosen.append(p)
                owners.add(q._owner[p])
        for p in order:
            if len(chosen) < k and p not in chosen:
                chosen.append(p)
        return tuple(sorted(chosen))

    def _grow(self, want: int) -> None:
        """Add partitions up to ``want``. Existing partitions keep their owners (and their items); each new
        partition goes to the task that owns the fewest. The new count is published last."""
        q = self.q
        current = q._pcount[0]
        if want <= current:
            return
        owned = [0] * len(q._tasks)
        for t in q._owner:
            if t >= 0:
                owned[t] += 1
        for _ in range(current, want):
            q._buffers.grow()
            q._conds.append(threading.Condition(threading.Lock()))
            q._waiters.append(0)
            q._part_targets.append(())
            q._part_types.append(0)
            t = min(range(len(owned)), key=lambda i: (owned[i], i))
            owned[t] += 1
            q._owner.append(t)
        q._assigned = q._assignment_from_owner()
        q._pcount[0] = want

    # ------------------------------------------------------------------ shutdown

    def shutdown(self) -> None:
        """Let drain tasks empty their partitions (up to shutdown_timeout_ms), stop them, wait out any in-flight
        handler call however long it takes, then dispatch what is left once and release the scheduler."""
        q = self.q
        self.periodic = False
        for task in q._tasks:
            task.drain_then_stop = True
            q._scheduler.wake(task)
        deadline = time.monotonic() + q.config.shutdown_timeout_ms / 1000.0
        for task in q._tasks:
            task.finished.wait(max(0.0, deadline - time.monotonic()))
        for task in q._tasks:
            task.stopped = True
        self._fence(range(len(q._tasks)), abortable=False)
        q._final_drain()
        q._release_scheduler()
        self.state = "stable"
