"""BatchQueue: bounded partitions, self-draining tasks, type-based dispatch.

Concurrency rules (who may touch what):

* Partition buffers, their bound and their produced counters live in ``_fastpath.Buffers`` (C). Producers (any
  thread) route, check the bound, append and count inside one C call (``_fastpath.Producer``, ``Buffers.put``),
  which no other Python thread can interleave with (see ``_fastpath.c``), so the common produce path takes no
  lock, never overshoots the bound, and the counters are exact.
* A drain task runs on one scheduler thread at a time. It marks each cycle in ``_epoch[task]`` (odd while inside
  a cycle), then drains only the partitions whose ``_owner`` entry names it, swapping each one's buffer for an
  empty one (``Buffers.take``, O(1): each item leaves exactly once) and dispatching the items.
* Every ownership change (rebalance, partition growth, handler removal, shutdown) runs on the queue's control thread
  (``_control.Controller``): it revokes (owner = -1), fences on ``_epoch`` (waits until each old owner has left the
  cycle it was in), then assigns. Drain threads never run or wait for control work.
* Handlers registered with ``add_handler`` are therefore never called concurrently with themselves under the
  default ``type_hash`` selector (one type, one partition, one owner at a time). With any other selector a type's
  items may sit in several partitions owned by different tasks, so its handler is additionally guarded by a lock.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any, Callable, Iterable

from ._config import BatchQueueConfig
from ._fastpath import Buffers, Producer, group_by_type
from ._routing import BufferStrategy, is_type_hash, stable_type_hash
from ._scheduler import Scheduler, shared_schedulers
from ._stats import BatchQueueStats, RebalanceResult

log = logging.getLogger("drainpipe.queue")

UNOWNED = -1
_SLICE_S = 0.05          # a busy task yields to the scheduler after this long (fairness on shared pools)
_SMALL_BATCH = 64       # a cycle that found fewer items than this waits min_idle_ms before the next,
_PER_CALL = 16          # as does one that averaged fewer items than this per handler call
_on_drain_thread = threading.local()


def count_value(counter: itertools.count) -> int:
    """The next value an ``itertools.count()`` would return: how many times it was advanced."""
    return int(repr(counter)[6:-1])


class _Target:
    """One handler instance, as the dispatcher calls it."""

    __slots__ = ("consume", "on_idle", "lock", "type")

    def __init__(self, handler: Any, type_: type | None, locked: bool) -> None:
        consume = getattr(handler, "consume", None)
        if consume is None:
            if not callable(handler):
                raise TypeError(f"handler for {type_!r} must be callable or have consume(batch)")
            consume = handler
        self.consume: Callable[[list], None] = consume
        self.on_idle: Callable[[], None] | None = getattr(handler, "on_idle", None)
        self.lock = threading.Lock() if locked else None
        self.type = type_


class _Entry:
    """A registered handler: its type, weight, and the partition(s) it serves.

    ``split`` entries own one handler instance per sub-partition (built by the factory) and spread their type over
    ``partitions`` by ``key``; plain entries have one target for their one partition.
    """

    __slots__ = ("type", "weight", "split", "factory", "key", "partitions", "targets", "_single", "_anywhere", "_rr")

    def __init__(self, type_: type, handler: Any, weight: float, split: int, key: Callable | None) -> None:
        self.type = type_
        self.weight = weight
        self.split = split
        self.factory = handler if split else None
        self.key = key
        self.partitions: tuple[int, ...] = ()
        self.targets: dict[int, _Target] = {}
        self._single: _Target | None = None
        self._anywhere = False
        self._rr = itertools.count()

    def bind(self, partitions: tuple[int, ...], handler: Any, locked: bool) -> None:
        self.partitions = partitions
        if self.split:
            self.targets = {p: _Target(self.factory(), self.type, locked) for p in partitions}
        else:
            self._single = _Target(handler, self.type, locked)
            self.targets = {partitions[0]: self._single}
            self._anywhere = locked     # a custom selector may put the type anywhere: the lock guards the instance

    def target(self, partition: int) -> _Target | None:
        """The instance that serves this type's items in ``partition``; None if none does (items an earlier
        registration of the type left in a partition this one does not use: they are dropped and counted, as
        after remove_handler, since handing them to an instance owned elsewhere could run it twice at once)."""
        return self._single if self._anywhere else self.targets.get(partition)

    @property
    def weighted_count(self) -> float:
        return self.weight * max(1, self.split)

    def route(self, item: Any) -> int:
        """Sub-partition of an item of a split type (hash of its key, or round-robin without a key)."""
        parts = self.partitions
        i = hash(self.key(item)) if self.key is not None else next(self._rr)
        return parts[i % len(parts)]


class _Counters:
    """Counters written by a single thread (one drain task, or the control thread for the final drain)."""

    __slots__ = ("dispatched", "errors", "no_handler", "last_calls")

    def __init__(self) -> None:
        self.last_calls = 0           # handler calls of the latest cycle
        self.dispatched = 0
        self.errors = 0
        self.no_handler = 0


class _DrainTask:
    """One drain task of a queue: runs cycles until its partitions are empty, then backs off."""

    def __init__(self, queue: BatchQueue, index: int) -> None:
        self.queue = queue
        self.index = index
        self.idle = 0                   # empty cycles in a row (the backoff exponent)
        self.trickle = 0                # trickle cycles in a row
        self.counters = _Counters()
        self.stopped = False            # hard stop: no new cycle starts
        self.drain_then_stop = False    # shutdown: run until empty, then finish
        self.finished = threading.Event()

    def run(self) -> float | None:
        q = self.queue
        _on_drain_thread.queue = q
        try:
            deadline = time.monotonic() + _SLICE_S
            while not self.stopped:
                found = q._cycle(self)
                if not found:
                    break                                   # empty: back off
                if self.drain_then_stop:
                    continue                                # shutdown: empty the partitions at full speed
                self.idle = 0                               # any data resets the idle backoff
                if found < max(_SMALL_BATCH, _PER_CALL * self.counters.last_calls):
                    # A trickle (few items, or few per handler call) costs more in per-cycle overhead and GIL
                    # hand-offs than it moves: wait, longer after each trickle in a row, so batches grow.
                    # (latency stays <= max_idle_ms).
                    self.trickle += 1
                    return self._delay(self.trickle - 1)
                self.trickle = max(0, self.trickle - 1)
                if time.monotonic() > deadline:
                    return 0.0
            if self.stopped or self.drain_then_stop:
                self.finished.set()
                return None
            self.idle += 1
            return self._delay(self.idle - 1)
        finally:
            _on_drain_thread.queue = None

    def _delay(self, exponent: int) -> float:
        """min(min_idle_ms * 2**exponent, max_idle_ms), in seconds."""
        cfg = self.queue.config
        return min(cfg.min_idle_ms * (1 << min(exponent, 30)), cfg.max_idle_ms) / 1000.0


class BatchQueue:
    """A partitioned, self-draining batch queue with type-based dispatch. Starts draining immediately.

    Thread-safety: every public method may be called from any thread. ``produce``/``produce_many`` never take a
    lock on the common path; with ``BLOCKING`` they wait for room. Handlers must not call ``produce`` with
    ``BLOCKING`` on their own queue (a full partition would wait for the very thread that is producing).
    """

    def __init__(self, name: str, config: BatchQueueConfig) -> None:
        from ._control import Controller   # the control thread operates on this queue's internals

        if not isinstance(name, str) or not name:
            raise ValueError("queue name must be a non-empty string")
        config.validate()
        self._name = name
        self.config = config
        self._log = logging.getLogger(f"drainpipe.queue.{name}")
        self._cap = config.buffer_size
        self._if_possible = config.strategy is BufferStrategy.IF_POSSIBLE
        self._type_routing = is_type_hash(config.partition_selector)
        self._consumer = _Target(config.consumer, None, False) if config.consumer is not None else None

        if config.threads is not None:
            self._thread_count = config.threads.resolve()
        else:
            self._thread_count = 1
        partitions = config.partitions.resolve(self._thread_count, 0)
        tasks = self._thread_count if config.threads is not None else 1
        if tasks > partitions:
            self._log.warning("queue %r: %d threads for %d partitions; reducing threads to %d",
                              name, tasks, partitions, partitions)
            tasks = partitions

        # partition state: grown in place (never replaced) by the control thread
        self._closing = [False]                    # set once, under _close_lock; read by the C fast path
        self._buffers = Buffers(partitions, self._cap, self._closing)
        self._conds = [threading.Condition(threading.Lock()) for _ in range(partitions)]
        self._waiters = [0] * partitions
        self._dropped_full = itertools.count()
        self._dropped_early = itertools.count()    # no handler, seen at produce time
        self._owner = [p % tasks for p in range(partitions)]
        self._pcount = [partitions]                # published partition count (custom selectors read it)
        self._part_targets: list[tuple[_Target, ...]] = [() for _ in range(partitions)]
        self._part_types = [0] * partitions

        # routing (type_hash): type -> partition; split types route through their entry
        self._routes: dict[type, int] = {}         # read by the C producer; change only via produce.set_route/drop_route
        self._split: dict[type, _Entry] = {}
        self._handlers: dict[type, _Entry] = {}
        self._home: dict[type, tuple[int, ...]] = {}
        self._warned: set[type] = set()
        self._warn_lock = threading.Lock()

        # drain tasks and their cycle epochs (odd = inside a cycle)
        self._tasks = [_DrainTask(self, i) for i in range(tasks)]
        self._epoch = [0] * tasks
        self._assigned: list[tuple[int, ...]] = self._assignment_from_owner()
        self._final = _Counters()

        # shutdown
        self._close_lock = threading.Lock()
        self._done = threading.Event()

        self.produce = self._make_produce()

        self._shared_name = config.shared_scheduler[0] if config.shared_scheduler else None
        if self._shared_name is not None:
            self._scheduler = shared_schedulers.acquire(*config.shared_scheduler)
        else:
            self._scheduler = Scheduler(name, tasks, pinned=True)
        self._control = Controller(self)
        for task in self._tasks:
            self._scheduler.submit(task)

    # ------------------------------------------------------------------ intake

    def _make_produce(self) -> Callable[[Any], bool]:
        """``produce(item) -> bool``: route, check the bound, append and count in one C call; the rare cases
        (unknown or split type, full partition) call back into this class."""
        typed = self._type_routing
        return Producer(self._buffers, self._routes if typed else None,
                        None if typed else self.config.partition_selector, self._pcount,
                        self._route_slow, self._produce_full)

    def _route_slow(self, item: Any) -> int | None:
        """Partition of an item the fast route table does not know, or None to drop it (no handler)."""
        t = type(item)
        entry = self._split.get(t)
        if entry is not None:
            return entry.route(item)
        if self._consumer is not None:
            p = stable_type_hash(t) % self._pcount[0]
            self.produce.set_route(t, p)
            return p
        next(self._dropped_early)
        self._warn_no_handler(t)
        return None

    def _produce_full(self, item: Any, p: int) -> bool:
        """produce() found partition ``p`` full: drop (IF_POSSIBLE) or wait for room (BLOCKING)."""
        return self._put_rest(p, [item]) == 1

    def _put_rest(self, p: int, items: list) -> int:
        """``items`` found partition ``p`` full: count them as dropped (IF_POSSIBLE), or wait for room and put them
        in order (BLOCKING) until all are in or shutdown begins. Returns how many went in."""
        if self._if_possible:
            for _ in items:
                next(self._dropped_full)
            return 0
        put = 0
        while put < len(items) and self._wait_for_room(p):
            put += self._buffers.put(p, items, put)
        return put

    def _wait_for_room(self, p: int) -> bool:
        cond, size = self._conds[p], self._buffers.size
        owner = self._owner[p]
        if owner >= 0:        # the owner may be asleep in backoff: a full partition is not an idle one
            self._scheduler.wake(self._tasks[owner])
        with cond:
            self._waiters[p] += 1
            try:
                while size(p) >= self._cap:
                    if self._closing[0]:
                        return False
                    cond.wait(0.05)
            finally:
                self._waiters[p] -= 1
        return not self._closing[0]

    def produce_many(self, items: Iterable[Any]) -> int:
        """Produce every item (same rules as ``produce``, item by item); returns how many were accepted.

        One C call routes and appends the items; only those that found their partition full come back to Python.
        """
        if self._closing[0]:
            return 0
        if not isinstance(items, list):
            items = list(items)
        accepted, overflow = self.produce.many(items)
        if overflow is not None:                  # partitions that were full: drop, or wait for room (BLOCKING)
            for p, rest in overflow.items():
                accepted += self._put_rest(p, rest)
        return accepted

    def _warn_no_handler(self, t: type) -> None:
        if t in self._warned:
            return
        with self._warn_lock:
            if t in self._warned:
                return
            self._warned.add(t)
        self._log.warning("queue %r: no handler for %s; its items are dropped", self._name, t.__qualname__)

    # ------------------------------------------------------------------ drain

    def _cycle(self, task: _DrainTask) -> int:
        """One drain cycle of ``task``: take everything it owns, dispatch it; on_idle when there was nothing."""
        t = task.index
        epoch = self._epoch
        epoch[t] += 1                      # odd: inside a cycle (published before any ownership read)
        try:
            if task.stopped:
                return 0
            found = self._dispatch(self._take_owned(t), task.counters)
            if not found:
                self._idle(t)
            return found
        finally:
            epoch[t] += 1

    def _take_owned(self, t: int) -> Iterable[tuple[int, list]]:
        """(partition, items) of each non-empty partition task ``t`` owns, taken as the iteration reaches it."""
        owner, take, waiters = self._owner, self._buffers.take, self._waiters
        for p in self._assigned[t]:
            if owner[p] != t:
                continue
            items = take(p)
            if items is not None:
                if waiters[p]:
                    self._notify_room(p)
                yield p, items

    def _notify_room(self, p: int) -> None:
        cond = self._conds[p]
        with cond:
            cond.notify_all()

    def _dispatch(self, drained: Iterable[tuple[int, list]], counters: _Counters) -> int:
        """Hand drained items to the consumer, or group them by exact type: one call per handler instance.

        With type_hash routing every handler instance serves one partition, so a partition's groups are dispatched
        as soon as it is taken (its batches die young, before the cyclic GC walks them again and again). With
        other selectors a type may sit in several partitions: its batches are merged over the cycle first.
        """
        if self._consumer is not None:
            parts = [items for _, items in drained]
            if not parts:
                return 0
            batch = parts[0] if len(parts) == 1 else [x for items in parts for x in items]
            self._invoke(self._consumer, batch, counters)
            return len(batch)
        handlers = self._handlers
        merge: dict[_Target, list] | None = None if self._type_routing else {}
        total = calls = 0
        for p, items in drained:
            total += len(items)
            for typ, run in group_by_type(items):
                entry = handlers.get(typ)
                target = None if entry is None else entry.target(p)
                if target is None:
                    counters.no_handler += len(run)
                    self._warn_no_handler(typ)
                    continue
                if merge is None:
                    self._invoke(target, run, counters)
                    calls += 1
                    continue
                batch = merge.get(target)
                if batch is None:
                    merge[target] = run
                else:
                    batch.extend(run)
        if merge:
            for target, batch in merge.items():
                self._invoke(target, batch, counters)
            calls += len(merge)
        counters.last_calls = calls
        return total

    def _invoke(self, target: _Target, batch: list, counters: _Counters) -> None:
        counters.dispatched += len(batch)
        try:
            if target.lock is None:
                target.consume(batch)
            else:
                with target.lock:
                    target.consume(batch)
        except BaseException as exc:   # the queue survives any handler error
            counters.errors += 1
            self._report_error(batch, exc)

    def _report_error(self, batch: list, exc: BaseException) -> None:
        handler = self.config.error_handler
        if handler is None:
            self._log.error("queue %r: handler failed on %d items: %r", self._name, len(batch), exc,
                            exc_info=exc)
            return
        try:
            handler(batch, exc)
        except BaseException:
            self._log.exception("queue %r: error_handler failed", self._name)

    def _idle(self, t: int) -> None:
        """on_idle of the consumer, or of each handler on a partition this task owns."""
        if self._consumer is not None:
            targets: Iterable[_Target] = (self._consumer,)
        else:
            owner = self._owner
            targets = [tg for p in self._assigned[t] if owner[p] == t for tg in self._part_targets[p]]
        for target in targets:
            if target.on_idle is None:
                continue
            try:
                if target.lock is None:
                    target.on_idle()
                else:
                    with target.lock:
                        target.on_idle()
            except BaseException as exc:
                self._report_error([], exc)

    def _final_drain(self) -> None:
        """Dispatch everything still buffered, once (control thread, after every drain task has stopped).

        ``_closing`` was set before this runs, and the C fast path never appends once it is set, so nothing can
        arrive after the take. Dispatch holds no lock, so a handler may call ``shutdown()`` without deadlocking.
        """
        take = self._buffers.take
        drained = [(p, items) for p in range(len(self._buffers)) if (items := take(p)) is not None]
        if drained:
            _on_drain_thread.queue = self
            try:
                self._dispatch(drained, self._final)
            finally:
                _on_drain_thread.queue = None

    def _assignment_from_owner(self) -> list[tuple[int, ...]]:
        per: list[list[int]] = [[] for _ in self._tasks]
        for p, t in enumerate(self._owner):
            if t >= 0:
                per[t].append(p)
        return [tuple(x) for x in per]

    # ------------------------------------------------------------------ public API

    @property
    def name(self) -> str:
        return self._name

    @property
    def is_running(self) -> bool:
        return not self._closing[0]

    @property
    def partition_count(self) -> int:
        return self._pcount[0]

    @property
    def task_count(self) -> int:
        return len(self._tasks)

    @property
    def assigned_partitions(self) -> tuple[tuple[int, ...], ...]:
        """Partitions per drain task, as last published by the control thread (each partition in one task)."""
        return tuple(self._assigned)

    @property
    def rebalancing_enabled(self) -> bool:
        return self._control.periodic

    def add_handler(self, type_: type, handler: Any, weight: float = 1.0, *, split: int | bool = False,
                    key: Callable[[Any], Any] | None = None) -> None:
        """Register ``handler`` for items of exactly ``type_`` (replacing any previous one).

        ``weight`` (> 0) counts toward adaptive partition growth. ``split=True`` (one sub-partition per drain task)
        or ``split=k`` makes ``handler`` a zero-argument factory: the queue builds one instance per sub-partition
        and spreads the type over them by ``hash(key(item))`` (round-robin without ``key``), so several threads
        drain a hot type, each into its own instance; the instances' states must be mergeable. Blocks until the
        control thread has applied the change (returns at once when called from this queue's drain thread).
        Raises ValueError for a bad weight/split, RuntimeError after shutdown.
        """
        if not isinstance(type_, type):
            raise ValueError(f"add_handler needs a type, got {type_!r}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise ValueError(f"weight must be > 0, got {weight!r}")
        if split is True:
            parts = len(self._tasks)
        elif split is False or split is None:
            parts = 0
        elif isinstance(split, int) and split >= 1:
            parts = split
        else:
            raise ValueError(f"split must be a bool or an int >= 1, got {split!r}")
        if parts and not callable(handler):
            raise ValueError("a split handler must be a zero-argument factory of handler instances")
        if not parts:
            _Target(handler, type_, False)     # validate the handler's shape now, in the caller
        self._run_control(self._control.add_handler, type_, handler, float(weight), parts, key)

    def remove_handler(self, type_: type) -> bool:
        """Unregister the handler of ``type_``; True if there was one. When it returns (called from outside a drain
        thread) the handler is no longer being called. Items of that type still buffered are dropped and counted."""
        return bool(self._run_control(self._control.remove_handler, type_))

    def rebalance_now(self) -> RebalanceResult:
        """Measure throughput since the last measurement and rebalance once, waiting for the handoff to finish."""
        return self._run_control(self._control.rebalance)

    def _run_control(self, fn: Callable, *args: Any) -> Any:
        if self._closing[0]:
            raise RuntimeError(f"queue {self._name!r} is shut down")
        future = self._control.submit(fn, *args)
        if getattr(_on_drain_thread, "queue", None) is self:
            return None   # a drain thread never waits on control work (the control thread may be fencing it)
        return future.result()

    def stats(self) -> BatchQueueStats:
        """An immutable snapshot. Counters are exact; buffer usage is a moment's view."""
        n = self._pcount[0]
        counters = [t.counters for t in self._tasks] + [self._final]
        ctl = self._control
        return BatchQueueStats(
            name=self._name,
            buffer_size=self._cap,
            partition_used_counts=self._buffers.sizes()[:n],
            produced=self.produced_count(),
            dropped_full=count_value(self._dropped_full),
            dropped_no_handler=count_value(self._dropped_early) + sum(c.no_handler for c in counters),
            dispatched=sum(c.dispatched for c in counters),
            handler_errors=sum(c.errors for c in counters),
            task_dispatched=tuple(t.counters.dispatched for t in self._tasks),
            task_partitions=tuple(self._assigned),
            rebalances=ctl.rebalances,
            rebalance_state=ctl.state,
            rebalance_history=tuple(ctl.history),
        )

    def produced_count(self, partition: int | None = None) -> int:
        """Items accepted so far: into one partition, or in all (then including items accepted and dropped at
        once for want of a handler)."""
        if partition is not None:
            return self._buffers.produced(partition)
        return sum(self._buffers.produced_all()) + count_value(self._dropped_early)

    def load_history(self) -> list[tuple[float, tuple[int, ...]]]:
        """Per-interval per-task load samples (time, items per task) recorded by periodic rebalancing."""
        return list(self._control.load_history)

    def shutdown(self) -> None:
        """Stop intake, let drain tasks finish (up to ``shutdown_timeout_ms``), then dispatch what is left once.

        The first caller does the work; concurrent callers wait for it; later calls return at once. When it returns
        no handler of this queue is running and nothing accepted by ``produce`` is lost.
        """
        first = False
        with self._close_lock:
            if not self._closing[0]:
                self._closing[0] = True
                first = True
        if first:
            for p in range(len(self._conds)):
                self._notify_room(p)
            future = self._control.submit(self._control.shutdown)
            future.add_done_callback(lambda _: self._done.set())
        if getattr(_on_drain_thread, "queue", None) is self:
            return   # called from one of our handlers: waiting here would wait for ourselves
        self._done.wait()

    def _release_scheduler(self) -> None:
        if self._shared_name is not None:
            shared_schedulers.release(self._shared_name)
        else:
            self._scheduler.shutdown(wait=threading.current_thread() not in self._scheduler._threads)

    def __repr__(self) -> str:
        return (f"BatchQueue({self._name!r}, partitions={self.partition_count}, tasks={self.task_count}, "
                f"running={self.is_running})")
