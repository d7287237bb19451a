"""BatchQueue: bounded partitions, self-draining tasks, type-based dispatch.

The queue is the public face over four internal parts, each in its own module:

* :mod:`._partitions`: the shared partition state (buffers, owners, cycle epochs) and the handoff over it;
* :mod:`._handlers`: the handler table;
* :mod:`._drain`: the drain tasks and the dispatcher;
* :mod:`._control`: the control work (on the process's control thread, :mod:`._control_loop`), the only writer of
  ownership, routes and handler registrations.

Concurrency rules (who may touch what):

* Partition buffers, their bound and their produced counters live in ``_fastpath.Buffers`` (C). Producers (any
  thread) route, check the bound, append and count inside one C call (``_fastpath.Producer``, ``Buffers.put``),
  which no other Python thread can interleave with (see ``_fastpath.c``), so the common produce path takes no
  lock, never overshoots the bound, and the counters are exact.
* A drain task runs on one scheduler thread at a time. It marks each cycle in ``epoch[task]`` (odd while inside
  a cycle), then drains only the partitions whose owner entry names it.
* Every ownership change (rebalance, failover, partition growth and shrinking, split resizes, handler removal,
  shutdown) runs on the control thread: it revokes (owner = -1), fences on the epochs (a non-blocking wait until
  the partition's old owner has left the cycle it was in), then assigns. A failover skips the fence for a task
  stuck in one handler call: it revokes, then checks the task is still inside that call, then assigns (the task
  reads owners before anything else it does once the call returns). Drain threads never wait for control work;
  they run the little the control thread leaves them (``DrainTask.actions``) at the start of a cycle.
* Handlers registered with ``add_handler`` are therefore never called concurrently with themselves under the
  default ``type_hash`` selector (one type, one partition, one owner at a time). With any other selector a type's
  items may sit in several partitions owned by different tasks, so its handler is additionally guarded by a lock.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ._config import BatchQueueConfig
from ._control import Controller
from ._control_loop import control_loops
from ._drain import Counters, Dispatcher, DrainTask, on_drain_thread
from ._events import EventQueue, QueueEvent
from ._fastpath import Producer
from ._handlers import HandlerConsumer, HandlerTable, Target
from ._partitions import Partitions
from ._routing import BufferStrategy, is_type_hash, stable_type_hash
from ._scheduler import Scheduler, shared_schedulers
from ._stats import BatchQueueStats, RebalanceResult
from .errors import ConfigError, QueueError

log = logging.getLogger("drainpipe.queue")


def count_value(counter: itertools.count[int]) -> int:
    """The next value an ``itertools.count()`` would return: how many times it was advanced."""
    return int(repr(counter)[6:-1])


class BatchQueue:
    """A partitioned, self-draining batch queue with type-based dispatch. Starts draining immediately.

    Thread-safety: every public method may be called from any thread. ``produce``/``produce_many`` never take a
    lock on the common path; with ``BLOCKING`` they wait for room. Handlers must not call ``produce`` with
    ``BLOCKING`` on their own queue (a full partition would wait for the very thread that is producing).
    """

    produce: Producer
    """``produce(item) -> bool``: put ``item`` into its partition.

    Returns False after shutdown began, or with ``IF_POSSIBLE`` when the item's partition is full (the item is
    dropped and counted in ``stats().dropped_full``). With ``BLOCKING`` it waits for room (until shutdown).
    Items of a type with no handler (handler-map mode) are accepted and dropped, counted as ``dropped_no_handler``.
    Thread-safe, lock-free on the common path: routing, the bound check, the append and the count are one call of
    the C extension ``drainpipe._fastpath`` (an instance attribute, set in ``__init__``)."""

    def __init__(self, name: str, config: BatchQueueConfig) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError("queue name must be a non-empty string")
        config.validate()
        self._name = name
        self.config = config
        self._log = logging.getLogger(f"drainpipe.queue.{name}")
        self._if_possible = config.strategy is BufferStrategy.IF_POSSIBLE
        typed = is_type_hash(config.partition_selector)
        self._consumer = Target(config.consumer, None, False) if config.consumer is not None else None

        thread_count = config.threads.resolve() if config.threads is not None else 1
        partitions = config.partitions.resolve(thread_count, 0)
        tasks = thread_count if config.threads is not None else 1
        if tasks > partitions:
            self._log.warning(
                "queue %r: %d threads for %d partitions; reducing threads to %d", name, tasks, partitions, partitions
            )
            tasks = partitions

        self._parts = Partitions(partitions, config.buffer_size, tasks)
        self._table = HandlerTable(name, self._log)
        self._dropped_full = itertools.count()
        self._dropped_early = itertools.count()  # no handler, seen at produce time
        self._routes: dict[type, int] = {}  # read by the C producer; changed only via produce.set_route/drop_route
        self.produce = Producer(
            self._parts.buffers,
            self._routes if typed else None,
            None if typed else config.partition_selector,
            self._parts.count,
            self._route_slow,
            self._produce_full,
            self._wake_owner,
            self._parts.owner,
            self._parts.idle,
        )

        self._events = EventQueue(config.event_queue_size) if config.event_queue_size else None
        dispatcher = Dispatcher(
            name, self._parts, self._table, self._consumer, typed, config.error_handler, self._log, self, self._events
        )
        self._final: Counters = dispatcher.final
        self._tasks = [DrainTask(i, dispatcher, (config.min_idle_ms, config.max_idle_ms), self) for i in range(tasks)]
        self._close_lock = threading.Lock()
        self._done = threading.Event()

        self._shared_name = config.shared_scheduler[0] if config.shared_scheduler else None
        if config.shared_scheduler is not None:
            self._scheduler = shared_schedulers.acquire(*config.shared_scheduler)
        else:
            self._scheduler = Scheduler(name, tasks, pinned=True)
        self._control = Controller(
            name,
            config,
            loop=control_loops.acquire(),
            parts=self._parts,
            table=self._table,
            tasks=self._tasks,
            dispatcher=dispatcher,
            scheduler=self._scheduler,
            producer=self.produce,
            thread_count=thread_count,
            release=self._release_scheduler,
            events=self._events,
        )
        for task in self._tasks:
            self._scheduler.submit(task)

    # ------------------------------------------------------------------ intake

    def _route_slow(self, item: Any) -> int | None:
        """Partition of an item the fast route table does not know, or None to drop it (no handler)."""
        t = type(item)
        entry = self._table.split.get(t)
        if entry is not None:
            return entry.route(item)
        if self._consumer is not None:
            p = stable_type_hash(t) % self._parts.count[0]
            self.produce.set_route(t, p)
            return p
        next(self._dropped_early)
        self._table.warn_no_handler(t)
        return None

    def _wake_owner(self, p: int) -> None:
        """An item made partition ``p`` non-empty while its owner backs off idle (the C producer checked): wake it.
        A busy owner, or one waiting on purpose after a trickle so that batches grow, is not called for."""
        owner = self._parts.owner[p]
        if owner >= 0:
            self._parts.idle[owner] = False  # one wake per idle spell: other partitions' first items skip it
            self._scheduler.wake(self._tasks[owner])

    def _produce_full(self, item: Any, p: int) -> bool:
        """produce() found partition ``p`` full: drop (IF_POSSIBLE) or wait for room (BLOCKING)."""
        return self._put_rest(p, [item]) == 1

    def _put_rest(self, p: int, items: list[Any]) -> int:
        """``items`` found partition ``p`` full: count them as dropped (IF_POSSIBLE), or wait for room and put them
        in order (BLOCKING) until all are in or shutdown begins. Returns how many went in."""
        if self._if_possible:
            for _ in items:
                next(self._dropped_full)
            return 0
        put = 0
        parts = self._parts
        routes = self._routes  # (empty with a custom selector: no type is moved off a partition then)
        while put < len(items) and self._wait_for_room(p):
            # A shrink may move a type off p while this waited (the resizer's switch: its route and p's items change
            # under p's condition lock): the routes are read and the items put under that lock, as one step, and
            # the items whose type moved are produced again, to where their type is now.
            with parts.conds[p]:
                if not parts.moved_off[p]:  # no type was ever moved off p: every item's route is p still
                    put += parts.buffers.put(p, items, put)
                    continue
                end = min(len(items), put + max(1, parts.capacity - parts.buffers.size(p)))
                k = put
                while k < end and routes.get(type(items[k]), p) == p:
                    k += 1
                if k > put:
                    put += parts.buffers.put(p, items[put:k], 0)
            if k < end and put == k:  # items[k] is of a type moved off p
                return put + self.produce_many(items[put:])
        return put

    def _wait_for_room(self, p: int) -> bool:
        owner = self._parts.owner[p]
        if owner >= 0:  # the owner may be asleep in backoff: a full partition is not an idle one
            self._scheduler.wake(self._tasks[owner])
        return self._parts.wait_for_room(p)

    def produce_many(self, items: Iterable[Any]) -> int:
        """Produce every item (same rules as ``produce``, item by item); returns how many were accepted.

        One C call routes and appends the items; only those that found their partition full come back to Python.
        Blocks like ``produce`` with ``BLOCKING``; thread-safe.
        """
        if self._parts.closing[0]:
            return 0
        if not isinstance(items, list):
            items = list(items)
        accepted, overflow = self.produce.many(items)
        if overflow is not None:  # partitions that were full: drop, or wait for room (BLOCKING)
            for p, rest in overflow.items():
                accepted += self._put_rest(p, rest)
        return accepted

    # ------------------------------------------------------------------ public API

    @property
    def name(self) -> str:
        return self._name

    @property
    def is_running(self) -> bool:
        return not self._parts.closing[0]

    @property
    def partition_count(self) -> int:
        return self._parts.count[0]

    @property
    def task_count(self) -> int:
        return len(self._tasks)

    @property
    def assigned_partitions(self) -> tuple[tuple[int, ...], ...]:
        """Partitions per drain task, as last published by the control thread (each partition in one task)."""
        return tuple(self._parts.assigned)

    def partition_owners(self) -> tuple[int, ...]:
        """The drain task that owns each partition now (index = partition), ``-1`` for a partition in a handoff:
        revoked from its old owner and not yet assigned to its new one. The live owner table, which
        :attr:`assigned_partitions` follows only once a handoff is done.

        Read-only; thread-safety: a snapshot, callable from any thread (including a rebalance listener's); the
        control thread may change owners right after."""
        parts = self._parts
        return tuple(parts.owner[: parts.count[0]])

    def partitions_of(self, type_: type) -> tuple[int, ...]:
        """The partitions the handler of ``type_`` serves and its items are routed to now: one for a plain handler,
        one per instance for a split handler (a ``split="auto"`` type's retired instances excluded); ``()`` when
        ``type_`` has no handler. With a custom ``partition_selector`` the selector decides where items go; this is
        the partition the handler was placed on.

        Read-only; thread-safety: a snapshot, callable from any thread; the control thread may change it right
        after (a split resize, a removal)."""
        entry = self._table.entries.get(type_)
        return entry.partitions if entry is not None else ()

    def handler_types(self) -> frozenset[type]:
        """The item types that have a handler now. A type leaves as soon as its removal starts (its items are
        dropped from then on), which may be before ``remove_handler`` returns; it joins once ``add_handler`` has
        been applied.

        Read-only; thread-safety: a snapshot, callable from any thread."""
        return frozenset(self._table.entries)

    @property
    def rebalancing_enabled(self) -> bool:
        return self._control.periodic

    def add_handler(
        self,
        type_: type,
        handler: HandlerConsumer | Callable[..., Any],
        weight: float = 1.0,
        *,
        split: int | bool | str = False,
        key: Callable[[Any], Any] | None = None,
        timeout: float | None = None,
    ) -> None:
        """Register ``handler`` for items of exactly ``type_`` (replacing any previous one).

        ``handler`` is a :class:`HandlerConsumer` or a callable ``f(batch)``. ``weight`` (> 0) counts toward
        adaptive partition growth. ``split=True`` (one sub-partition per drain task) or ``split=k`` makes
        ``handler`` a zero-argument factory: the queue builds one instance per sub-partition and spreads the type
        over them by ``hash(key(item))`` (round-robin without ``key``), so several threads drain a hot type, each
        into its own instance; the instances' states must be mergeable. Blocks until the control thread has applied
        the change (returns at once when called from this queue's drain thread); ``timeout`` (seconds) bounds
        the wait (see :meth:`remove_handler`).
        Raises ValueError for a bad weight/split, RuntimeError after shutdown, TimeoutError after ``timeout``.
        """
        if not isinstance(type_, type):
            raise ConfigError(f"add_handler needs a type, got {type_!r}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise ConfigError(f"weight must be > 0, got {weight!r}")
        auto = split == "auto"
        if split is True:
            parts = len(self._tasks)
        elif split is False or split is None:
            parts = 0
        elif auto:
            parts = 1
        elif isinstance(split, int) and split >= 1:
            parts = split
        else:
            raise ConfigError(f"split must be a bool, an int >= 1 or 'auto', got {split!r}")
        if parts and not callable(handler):
            raise ConfigError("a split handler must be a zero-argument factory of handler instances")
        if not parts:
            Target(handler, type_, False)  # validate the handler's shape now, in the caller
        self._run_control(self._control.add_handler, (type_, handler, float(weight), parts, key, auto), timeout, type_)

    def remove_handler(self, type_: type, timeout: float | None = None) -> bool:
        """Unregister the handler of ``type_``; True if there was one. When it returns (called from outside a drain
        thread) the handler is no longer being called. Items of that type still buffered are dropped and counted.

        ``timeout`` (seconds): raise TimeoutError if the change is not done by then. If the control thread had not
        started it yet it is withdrawn (nothing changed); if it had (it waits for a handler call to end), it
        completes when that call ends. Either way the queue stays consistent."""
        return bool(self._run_control(self._control.remove_handler, (type_,), timeout, type_))

    def wake_idle(self) -> None:
        """End every drain task's idle backoff: each runs a drain cycle now, and calls its handlers' ``on_idle`` if
        it finds nothing. For a caller that needs ``on_idle`` soon (a checkpoint asking handlers to hand their held
        state on) rather than after a backoff of up to ``max_idle_ms``. Thread-safe; does not block."""
        for task in self._tasks:
            self._scheduler.wake(task)

    def rebalance_now(self, timeout: float | None = None) -> RebalanceResult:
        """Measure throughput since the last measurement and rebalance once, waiting for the handoff to finish;
        ``timeout`` as for :meth:`remove_handler`."""
        result: RebalanceResult = self._run_control(self._control.rebalance, (), timeout)
        return result

    def _run_control(
        self, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float | None, serial: type | None = None
    ) -> Any:
        if self._parts.closing[0]:
            raise QueueError(f"queue {self._name!r} is shut down")
        future = self._control.submit(fn, *args, serial=serial)
        if getattr(on_drain_thread, "queue", None) is self:
            return None  # a drain thread never waits on control work (the control thread may be fencing it)
        try:
            return future.result(timeout)
        except TimeoutError:
            what = "withdrawn, nothing changed" if future.cancel() else "still running; it completes in the background"
            raise TimeoutError(f"queue {self._name!r}: {fn.__name__} not done after {timeout} s ({what})") from None

    def stats(self) -> BatchQueueStats:
        """An immutable snapshot. Counters are exact; buffer usage is a moment's view. Thread-safe."""
        n = self._parts.count[0]
        counters = [t.counters for t in self._tasks] + [self._final]
        ctl = self._control
        return BatchQueueStats(
            name=self._name,
            buffer_size=self._parts.capacity,
            partition_used_counts=self._parts.buffers.sizes()[:n],
            produced=self.produced_count(),
            dropped_full=count_value(self._dropped_full),
            dropped_no_handler=count_value(self._dropped_early) + sum(c.no_handler for c in counters),
            dispatched=sum(c.dispatched for c in counters),
            handler_errors=sum(c.errors for c in counters),
            task_restarts=sum(c.restarts for c in counters),
            lost=sum(c.lost for c in counters),
            task_dispatched=tuple(t.counters.dispatched for t in self._tasks),
            task_partitions=tuple(self._parts.assigned),
            rebalances=ctl.rebalances,
            rebalance_state=ctl.state,
            rebalance_history=tuple(ctl.history),
            slow_calls=ctl.slow_calls(),
            failovers=ctl.failovers,
            failed_over=ctl.failed_over(),
            resizes=ctl.resizes,
            handoff_timeouts=ctl.handoff_timeouts,
            events_dropped=0 if self._events is None else self._events.dropped,
            split_instances=tuple(
                (e.type.__qualname__, len(e.partitions)) for e in list(self._table.entries.values()) if e.split
            ),
        )

    def produced_count(self, partition: int | None = None) -> int:
        """Items accepted so far: into one partition, or in all (then including items accepted and dropped at
        once for want of a handler)."""
        if partition is not None:
            return self._parts.buffers.produced(partition)
        return sum(self._parts.buffers.produced_all()) + count_value(self._dropped_early)

    def events(self, timeout: float | None = 0.0, max_events: int = 1000) -> list[QueueEvent]:
        """What happened to the queue since the last call, oldest first (:class:`QueueEvent`: ownership changes,
        handler errors, failed cycles, slow calls, failovers, handoff timeouts), up to ``max_events``. Waits up to
        ``timeout`` seconds (None: for ever) for the first when there is none; ``0`` never blocks. Thread-safe.
        The queue keeps ``event_queue_size`` events; when full the oldest are dropped and counted
        (``stats().events_dropped``). Raises ConfigError when the queue was built without ``event_queue_size``."""
        if self._events is None:
            raise ConfigError(f"queue {self._name!r} keeps no events: build it with event_queue_size > 0")
        return self._events.poll(timeout, max_events)

    def load_history(self) -> list[tuple[float, tuple[int, ...]]]:
        """Per-interval per-task load samples (time, items per task) recorded by periodic rebalancing."""
        return list(self._control.load_history)

    def shutdown(self) -> None:
        """Stop intake, let drain tasks finish (up to ``shutdown_timeout_ms``), then dispatch what is left once.

        The first caller does the work; concurrent callers wait for it; later calls return at once. When it returns
        no handler of this queue is running and nothing accepted by ``produce`` is lost. Called from one of this
        queue's handlers it starts the shutdown and returns at once (waiting would wait for itself).
        """
        first = False
        with self._close_lock:
            if not self._parts.closing[0]:
                self._parts.closing[0] = True
                first = True
        if first:
            self._parts.notify_all_rooms()
            future = self._control.submit(self._control.shutdown)
            future.add_done_callback(lambda _: self._done.set())
        if getattr(on_drain_thread, "queue", None) is self:
            return  # called from one of our handlers: waiting here would wait for ourselves
        self._done.wait()
        self._scheduler.join()  # the final drain ran on a scheduler thread: let its threads end

    def _release_scheduler(self) -> None:
        """The last step of shutdown (on a scheduler thread, after the final drain): release the scheduler and the
        control thread."""
        if self._shared_name is not None:
            shared_schedulers.release(self._shared_name)
        else:
            self._scheduler.shutdown(wait=False)
        control_loops.release()

    def __repr__(self) -> str:
        return (
            f"BatchQueue({self._name!r}, partitions={self.partition_count}, tasks={self.task_count}, "
            f"running={self.is_running})"
        )
