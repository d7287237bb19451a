"""The control work of one queue: what runs on the control thread, and the parts that do it.

::

    any thread       BatchQueue ── submit(fn, *args, serial=T) ──► Requests (:mod:`._requests`) ──► Future
                                                                      │ ControlLoop.call
    control thread   Controller ◄── one step at a time; requests about one type in order ──┘
                       ├─ add_handler / remove_handler ─────────────────┐
                       ├─ rebalance: measure, plan ─────────────────────┤
                       ├─ tick (every interval): Resizer.resize_autos,  ├──► Handoffs (:mod:`._handoff`): revoke,
                       │    Resizer.shrink (:mod:`._resize`) ───────────┤      fence, tell the listener, assign
                       ├─ watch: Liveness.watch (:mod:`._liveness`) ────┘
                       └─ shutdown: stop the tasks, then the final drain (on a scheduler thread)
                     ControlState (:mod:`._control_state`): a task FAILED_OVER, a type CHANGING, the partitions
                       DROPPING, and what each forbids; Liveness and Resizer change it, all three ask it

The controller owns the request queue, the timers, rebalance planning, handler registration and shutdown; the
others get from it only the parts they work on and the state they share. Drain threads never run control work.
Steps of one queue run one at a time; requests about one handler type run in order; requests about different
types never wait for each other. The control thread never blocks: every wait (a drain task leaving its cycle, the
listener answering) is a condition the control loop polls.

The controller works on the queue's parts, never on the queue: the partition state (:mod:`._partitions`), the
handler table (:mod:`._handlers`), the drain tasks and dispatcher (:mod:`._drain`), the scheduler, and the C
producer (whose route table only the control thread writes, except one switch a shrink leaves to a drain task:
see :mod:`._resize`).

Thread rule: every method runs on the control thread, except :meth:`Controller.submit` (any thread), the read-only
properties and :meth:`Controller.slow_calls`/:meth:`Controller.failed_over` (``stats()``, any thread: snapshots),
and :class:`_FinalDrain` (a scheduler thread, once no drain task runs).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from typing import Any

from ._balancer import SKIP_RATIO, DrainBalancer, task_loads
from ._config import BatchQueueConfig
from ._control_loop import ControlLoop
from ._control_state import ControlState
from ._drain import Dispatcher, DrainTask
from ._events import EventQueue
from ._fastpath import Producer
from ._handlers import Entry, HandlerTable
from ._handoff import Handoffs
from ._listener import Teller
from ._liveness import Liveness
from ._load import WARMUP_SAMPLES, LoadEstimate
from ._partitions import UNOWNED, Partitions
from ._requests import Requests, then
from ._resize import Resizer
from ._routing import is_type_hash
from ._scheduler import Scheduler
from ._stats import RebalanceResult, SlowCall
from .errors import ConfigError

log = logging.getLogger("drainpipe.control")
_DEFAULT_BALANCER = DrainBalancer.throughput_weighted()
_HISTORY = 200
AUTO_INTERVAL_MS = 1000  # how often split="auto" types are measured in a queue without periodic rebalancing
_LOAD_SAMPLES = 2000


class Controller:
    """The control work of one queue (see the module docstring). Built by the queue with its parts; ``submit`` is
    the way in. ``state`` is the handoff state: stable | revoking | fencing | assigning."""

    def __init__(
        self,
        name: str,
        config: BatchQueueConfig,
        *,
        loop: ControlLoop,
        parts: Partitions,
        table: HandlerTable,
        tasks: list[DrainTask],
        dispatcher: Dispatcher,
        scheduler: Scheduler,
        producer: Producer,
        thread_count: int,
        release: Callable[[], None],
        events: EventQueue | None = None,
    ) -> None:
        self.name = name
        self._config = config
        self._loop = loop
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
        # the interval turns rebalancing on; without a balancer, with the default one (throughput-weighted)
        self.periodic = config.rebalance_interval_ms > 0 and len(tasks) > 1 and config.shared_scheduler is None
        self.interval = (config.rebalance_interval_ms or AUTO_INTERVAL_MS) / 1000.0
        self._ticking = False
        # rebalances, history and load_history: written here, read by stats() on any thread (an int, deques)
        self.rebalances = 0
        self.history: deque[RebalanceResult] = deque(maxlen=_HISTORY)
        self.load_history: deque[tuple[float, tuple[int, ...]]] = deque(maxlen=_LOAD_SAMPLES)
        self._last_counts: list[int] = []
        self._load = LoadEstimate()
        self._planned_tasks = len(tasks)  # the queue's own tasks (a stand-in is not planned on)
        self._requests = Requests(name, loop, last=self.shutdown)
        self._state = ControlState()
        deadline_s = config.handoff_timeout_ms / 1000.0
        # a stuck call fails over unless a second call of a single consumer might not be allowed
        can_fail_over = not self._consumer or config.consumer_thread_safe
        # a listener call is waited for no longer than a handler call is before its task fails over
        told_s = min(deadline_s, config.slow_handler_ms / 1000.0)
        teller = Teller(
            name, config.rebalance_listener, told_s, loop=loop, parts=parts, tasks=tasks, scheduler=scheduler,
            events=events,
        )  # fmt: skip
        teller.start()  # before the drain tasks run: each first hears its initial partitions
        self._handoffs = Handoffs(
            name, teller, deadline_s, loop=loop, parts=parts, tasks=tasks, scheduler=scheduler, events=events
        )
        self._liveness = Liveness(
            name, config.slow_handler_ms, can_fail_over, parts=parts, tasks=tasks, scheduler=scheduler,
            handoffs=self._handoffs, load=self._load, state=self._state, events=events,
        )  # fmt: skip
        self._resizer = Resizer(
            name, config.partitions, consumer=self._consumer, type_routing=self._type_routing,
            thread_count=thread_count, planned_tasks=self._planned_tasks, loop=loop, parts=parts, table=table,
            tasks=tasks, scheduler=scheduler, producer=producer, handoffs=self._handoffs, load=self._load,
            state=self._state, in_turn=self._requests.in_turn,
        )  # fmt: skip
        loop.call(self._start_timers)

    # ------------------------------------------------------------------ requests, and what stats() reads

    def submit(self, fn: Callable[..., Any], *args: Any, serial: Hashable | None = None) -> Future[Any]:
        """Queue ``fn(*args)`` for the control thread (any thread; see :meth:`._requests.Requests.submit`)."""
        return self._requests.submit(fn, *args, serial=serial)

    @property
    def state(self) -> str:
        return self._handoffs.state

    @property
    def failovers(self) -> int:
        return self._liveness.failovers

    @property
    def resizes(self) -> int:
        return self._resizer.resizes

    @property
    def handoff_timeouts(self) -> int:
        return self._handoffs.timeouts

    def failed_over(self) -> tuple[int, ...]:
        """The tasks stuck in a call whose partitions failed over (any thread: a snapshot)."""
        return self._state.failed_over()

    def slow_calls(self) -> tuple[SlowCall, ...]:
        """Handler calls running now for longer than slow_handler_ms (any thread; see :mod:`._liveness`)."""
        return self._liveness.slow_calls()

    # ------------------------------------------------------------------ timers

    def _start_timers(self) -> None:
        if self.periodic:
            self._ticking = True
            self._loop.at(self.interval, self._tick)
        self._loop.at(self._liveness.interval(), self._watch)

    def _tick(self) -> None:
        """Every interval: measure, resize the ``split="auto"`` types, rebalance (if periodic), shrink."""
        if self._requests.stopped:
            return
        try:
            if self.periodic:
                self.rebalance(periodic=True)
            else:
                self._load.add(self._throughput())
            self._resizer.resize_autos()
            self._resizer.shrink()
        except Exception:
            log.exception("queue %r: periodic control work failed", self.name)
        self._loop.at(self.interval, self._tick)

    def _ensure_ticking(self) -> None:
        """Measure every interval from now on (a ``split="auto"`` type needs it even without a balancer)."""
        if not self._ticking:
            self._ticking = True
            self._loop.at(self.interval, self._tick)

    def _watch(self) -> None:
        """Every :meth:`._liveness.Liveness.interval`: the liveness check, until shutdown."""
        if self._requests.stopped:
            return
        self._liveness.watch()
        self._loop.at(self._liveness.interval(), self._watch)

    # ------------------------------------------------------------------ rebalancing

    def _throughput(self) -> list[int]:
        """Items produced per partition since the previous measurement (snapshot-and-reset). Every slot a shrink
        left is followed too, so a partition that comes back reports what it took since, not all it ever took."""
        produced = self._parts.buffers.produced
        counts = [produced(p) for p in range(len(self._parts.owner))]
        last = self._last_counts + [0] * (len(counts) - len(self._last_counts))
        self._last_counts = counts
        return [c - b for c, b in zip(counts[: self._parts.count[0]], last)]

    def rebalance(self, periodic: bool = False) -> RebalanceResult | Future[RebalanceResult]:
        """Plan on the load and start the handoffs; the result (a Future when partitions move) is settled once every
        moved partition is assigned."""
        started = time.monotonic()
        tp = self._throughput()
        spread: list[float] | None = None
        if periodic:  # plan on the smoothed load; rebalance_now plans on what happened since the last measurement
            self._load.add(tp)
            tp, spread = self._load.rounded(), self._load.spread()
        # a partition in handoff counts as its new owner's, and is not moved again before it gets there
        owner = list(self._parts.owner[: len(tp)])  # slots a shrink left beyond the count are not planned
        for p, (_, new) in self._handoffs.moving.items():
            if p < len(owner):
                owner[p] = new
        tasks = self._planned_tasks
        before = _int_loads(tp, owner, tasks)
        if periodic:
            self.load_history.append((time.time(), before))

        def result(
            moves: tuple[tuple[int, int, int], ...] = (), after: tuple[int, ...] = before, skipped: str = ""
        ) -> RebalanceResult:
            return RebalanceResult(time.time(), moves, before, after, (time.monotonic() - started) * 1000, skipped)

        if tasks <= 1:
            return result(skipped="single task")
        if periodic and self._load.samples < WARMUP_SAMPLES:
            return result(skipped="measuring")
        if not self._state.may_plan():  # a task is FAILED_OVER: its partitions are where the failover put them
            return result(skipped="failover")
        balancer = self._config.balancer or _DEFAULT_BALANCER
        plan = balancer.assign(tp, owner, tasks, spread)
        if plan is None:
            if sum(tp) == 0:
                return result(skipped="no load")
            trigger = getattr(balancer, "trigger", SKIP_RATIO)
            return result(skipped="already even" if RebalanceResult.ratio(before) < trigger else "no gain")
        if len(plan) != len(owner) or any(not (0 <= t < tasks) for t in plan):
            log.error("queue %r: balancer returned an invalid plan; ignored", self.name)
            return result(skipped="invalid plan")
        plan = [owner[p] if p in self._handoffs.moving else t for p, t in enumerate(plan)]
        moves = tuple((p, owner[p], plan[p]) for p in range(len(owner)) if plan[p] != owner[p])
        if not moves:
            return result(skipped="no gain")

        def finish(done: bool) -> RebalanceResult:
            if not done:  # cut by shutdown, or a fence rolled back at handoff_timeout_ms
                return result(skipped="shutdown" if self._parts.closing[0] else "timed out")
            res = result(moves, _int_loads(tp, plan, tasks))
            self.rebalances += 1
            self.history.append(res)
            log.info("queue %r: rebalanced %d partitions, max/min load %.2f -> %.2f in %.1f ms", self.name,
                     len(moves), res.ratio_before, res.ratio_after, res.duration_ms)  # fmt: skip
            return res

        return then(self._handoffs.move(moves), finish)

    # ------------------------------------------------------------------ handlers and growth

    def add_handler(
        self, type_: type, handler: Any, weight: float, split: int, key: Callable[[Any], Any] | None,
        auto: bool = False,
    ) -> None | Future[None]:  # fmt: skip
        if split and not self._type_routing:
            raise ConfigError("split handlers need the type_hash partition selector")
        entry = Entry(type_, handler, weight, split, key, auto)
        old = self._table.entries.get(type_)
        if old is None:
            return self._attach(entry, handler)
        # the old instance must have left every drain cycle before the new one can be called
        return then(self._detach(old), lambda _: self._attach(entry, handler))

    def _attach(self, entry: Entry, handler: Any) -> Future[None]:
        """Grow the partitions if the policy wants more for this handler (the listener hears the new partitions
        assigned before their owners get them), then bind the handler and publish its route."""
        table, parts = self._table, self._parts
        grown: list[tuple[int, int]] = []
        if not self._consumer and self._config.partitions.is_adaptive:
            weighted = table.weighted_count() + entry.weighted_count
            want = self._config.partitions.resolve(self._thread_count, weighted)
            grown = parts.grow(want, hold=self._config.rebalance_listener is not None)
        done: Future[None] = Future()

        def bind() -> None:
            if any(parts.owner[p] != t for p, t in grown):
                for p, t in grown:
                    parts.owner[p] = t
                parts.publish()
            self._bind(entry, handler)
            done.set_result(None)

        self._handoffs.after_told([("assigned", [(p, UNOWNED, t) for p, t in grown])], bind)
        return done

    def _bind(self, entry: Entry, handler: Any) -> None:
        table, parts, type_ = self._table, self._parts, entry.type
        home = table.home.get(type_)
        free = parts.free(1, set()) if entry.auto and home is None else []
        placed = tuple(free) or parts.place(max(1, entry.split), home)
        entry.bind(placed, handler, locked=not self._type_routing)
        table.home[type_] = placed
        table.entries[type_] = entry
        for p in placed:
            target = entry.target(p)
            assert target is not None
            parts.attach(p, target)
        if self._type_routing and not self._consumer:  # publish the route last: the handler is ready
            if len(placed) > 1:
                table.split[type_] = entry
            else:
                self._producer.set_route(type_, placed[0])
        table.clear_warning(type_)
        if entry.auto:
            self._ensure_ticking()

    def remove_handler(self, type_: type) -> bool | Future[bool]:
        entry = self._table.entries.get(type_)
        if entry is None:
            return False
        if self._config.partitions.is_adaptive:
            self._ensure_ticking()  # adaptive partitions shrink with the handlers (:mod:`._resize`)
        return then(self._detach(entry), lambda _: True)

    def _detach(self, entry: Entry) -> Future[None]:
        """Unroute and unregister a handler; the Future is settled once it is no longer running: when every task
        that owns, or owned until a handoff still under way, one of its partitions has left its cycle."""
        if self._type_routing:
            self._producer.drop_route(entry.type)
        self._table.split.pop(entry.type, None)
        self._table.entries.pop(entry.type, None)
        bound = tuple(entry.targets)  # a split="auto" type's retired instances are bound to their partitions too
        for p in bound:
            self._parts.detach(p, entry.type)
        # with a custom selector the type's items are in any partition and its handler is called by any task (the
        # tasks that own its bound partitions only: remove_handler returned while another task was in the handler)
        calling = bound if self._type_routing else range(self._parts.count[0])
        tasks = self._parts.owners_of(calling)
        moving = self._handoffs.moving
        tasks |= {moving[p][0] for p in calling if p in moving}
        done: Future[None] = Future()
        self._handoffs.after_cycle(tasks, lambda: done.set_result(None), abortable=False)
        return done

    # ------------------------------------------------------------------ shutdown

    def shutdown(self) -> Future[None]:
        """Let drain tasks empty their partitions (up to shutdown_timeout_ms), stop them, wait out any in-flight
        handler call however long it takes, then dispatch what is left once, on a thread of the queue's scheduler,
        and release the scheduler. The Future is settled when all that is done."""
        self._requests.stop()  # requests queued after this one are refused
        self.periodic = False
        for task in self._tasks:
            task.drain_then_stop = True
            self._scheduler.wake(task)
        deadline = time.monotonic() + self._config.shutdown_timeout_ms / 1000.0
        done: Future[None] = Future()

        def stop() -> None:
            for task in self._tasks:
                task.stopped = True
            self._handoffs.after_cycle(range(len(self._tasks)), final, abortable=False)

        def final() -> None:
            self._handoffs.settle_cut()  # no task runs any more: each partition gets exactly one owner
            self._scheduler.submit(_FinalDrain(self._dispatcher, self._handoffs.farewell, self._release, done))

        tasks = self._tasks
        self._loop.when(lambda: time.monotonic() >= deadline or all(t.finished.is_set() for t in tasks), stop)
        return done


class _FinalDrain:
    """The last task a queue puts on its scheduler: dispatch what is left, say farewell (the listener hears every
    partition revoked), release the scheduler, settle ``done``. It runs on a drain thread (not the control thread)
    because it calls handlers and the listener, which may take their time."""

    def __init__(
        self, dispatcher: Dispatcher, farewell: Callable[[], None], release: Callable[[], None], done: Future[None]
    ) -> None:
        self._dispatcher = dispatcher
        self._farewell = farewell
        self._release = release
        self._done = done

    def run(self) -> None:
        try:
            try:
                self._dispatcher.final_drain()
            finally:
                self._farewell()
        finally:
            try:
                self._release()
            finally:
                self._done.set_result(None)


def _int_loads(throughput: Sequence[int], owner: Sequence[int], tasks: int) -> tuple[int, ...]:
    return tuple(round(x) for x in task_loads(throughput, owner, tasks))
