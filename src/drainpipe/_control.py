"""The control work of one queue: ownership changes, handler registrations, rebalancing, liveness, shutdown.

Requests (periodic rebalance, ``rebalance_now``, ``add_handler`` growth, ``remove_handler``, shutdown) arrive as
steps on the process's control thread (:mod:`._control_loop`) and are answered with ``concurrent.futures.Future``s;
drain threads never run control work. Steps of one queue run one at a time. Requests about one handler type run in
order; requests about different types never wait for each other.

A partition changes owner with the two-phase handoff of the seed: revoke (owner = UNOWNED), fence (wait until its
old owner has left the drain cycle it was in; a task sleeping in backoff is not in a cycle), assign. The fence is
per old owner: a moved partition waits only for its own old owner, and the control thread never blocks on it (the
fence is a wait the control loop polls). Items produced meanwhile stay in the partition and are drained by the new
owner. A partition in motion is not moved again until its handoff completes. A shutdown ends a rebalance's fences
early (the revoked partitions are then emptied by the final drain).

The controller works on the queue's parts, never on the queue: the partition state (:mod:`._partitions`), the
handler table (:mod:`._handlers`), the drain tasks and dispatcher (:mod:`._drain`), the scheduler, and the C
producer (whose route table only the control thread writes, except one switch a shrink leaves to the drain task
that owns both the old and the new partition of a moving type: see :meth:`Controller._rehome`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

from ._autosplit import CONFIRM, wanted_instances
from ._balancer import SKIP_RATIO, DrainBalancer, task_loads
from ._config import BatchQueueConfig
from ._control_loop import ControlLoop
from ._drain import Dispatcher, DrainTask
from ._fastpath import Producer
from ._handlers import Entry, HandlerTable, Target
from ._load import WARMUP_SAMPLES, LoadEstimate
from ._partitions import UNOWNED, Partitions
from ._routing import is_type_hash
from ._scheduler import Scheduler
from ._stats import RebalanceResult, SlowCall
from .errors import ConfigError, QueueError

log = logging.getLogger("drainpipe.control")
_DEFAULT_BALANCER = DrainBalancer.throughput_weighted()
_HISTORY = 200
AUTO_INTERVAL_MS = 1000  # how often split="auto" types are measured in a queue without periodic rebalancing
_LOAD_SAMPLES = 2000
Op = tuple[Callable[..., Any], tuple[Any, ...], "Future[Any]"]


def _then(source: Future[Any], fn: Callable[[Any], Any]) -> Future[Any]:
    """A Future of ``fn(source's result)``, settled where ``source`` is (on the control thread)."""
    out: Future[Any] = Future()

    def settle(f: Future[Any]) -> None:
        try:
            result = fn(f.result())
        except BaseException as exc:
            out.set_exception(exc)
            return
        if isinstance(result, Future):  # a step that waits in turn: settled when it is
            result.add_done_callback(lambda r: _copy(r, out))
        else:
            out.set_result(result)

    source.add_done_callback(settle)
    return out


class Controller:
    """The control state of one queue. ``state`` is stable | revoking | fencing | assigning."""

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
        self.periodic = (
            config.balancer is not None
            and config.rebalance_interval_ms > 0
            and len(tasks) > 1
            and config.shared_scheduler is None
        )
        self.interval = (config.rebalance_interval_ms or AUTO_INTERVAL_MS) / 1000.0
        self._ticking = False
        self.state = "stable"
        self.rebalances = 0
        self.history: deque[RebalanceResult] = deque(maxlen=_HISTORY)
        self.load_history: deque[tuple[float, tuple[int, ...]]] = deque(maxlen=_LOAD_SAMPLES)
        self._last_counts: list[int] = []
        self._load = LoadEstimate()
        self._moving: dict[int, tuple[int, int]] = {}  # partition -> (old owner, new owner) while in handoff
        self._serial: dict[Hashable, deque[Op]] = {}  # requests waiting behind a running one about the same type
        self._slow_ms = config.slow_handler_ms
        self._seen: dict[int, tuple[int, Any, float]] = {}  # per task: (call count, the call, first seen at)
        self._reported: set[tuple[int, float]] = set()  # slow calls already logged: (task, first seen at)
        self._lock = threading.Lock()
        self._stopped = False
        self._listener_thread: ThreadPoolExecutor | None = None  # started with the first event to tell
        self.failovers = 0
        # tasks stuck in a call, failed over: (call count, the call, the moves made)
        self._failed: dict[int, tuple[int, Any, list[tuple[int, int, int]]]] = {}
        self._reported_failover: set[tuple[int, str]] = set()
        self._standin: int | None = None
        self._planned_tasks = len(tasks)  # the queue's own tasks (a stand-in is not planned on)
        self.resizes = 0  # split="auto" resizes started
        self._resizing: set[type] = set()  # types being resized or moved
        self._asked: dict[type, tuple[int, int]] = {}  # auto type -> (instances its load asks for, intervals in a row)
        self._shrinking = False
        loop.call(self._start_timers)

    # ------------------------------------------------------------------ requests

    def submit(self, fn: Callable[..., Any], *args: Any, serial: Hashable | None = None) -> Future[Any]:
        """Queue ``fn(*args)`` for the control thread (thread-safe). ``fn`` returns its result, or a Future of it
        (when it has to wait for drain tasks). Requests with the same ``serial`` key run one after another. The
        Future fails with QueueError once the queue is shut down; cancelling it before it starts withdraws it."""
        fut: Future[Any] = Future()
        with self._lock:
            if self._stopped:
                fut.set_exception(QueueError(f"queue {self.name!r} is shut down"))
                return fut
        self._loop.call(lambda: self._admit((fn, args, fut), serial))
        return fut

    def _admit(self, op: Op, serial: Hashable | None) -> None:
        if serial is None:
            self._start(op)
            return
        waiting = self._serial.get(serial)
        if waiting is not None:  # one about this type is running: this one runs after it
            waiting.append(op)
            return
        self._serial[serial] = deque()
        op[2].add_done_callback(lambda _: self._loop.call(lambda: self._next(serial)))
        self._start(op)

    def _next(self, serial: Hashable) -> None:
        waiting = self._serial.get(serial)
        if not waiting:
            self._serial.pop(serial, None)
            return
        op = waiting.popleft()
        op[2].add_done_callback(lambda _: self._loop.call(lambda: self._next(serial)))
        self._start(op)

    def _start(self, op: Op) -> None:
        fn, args, fut = op
        if not fut.set_running_or_notify_cancel():
            return  # withdrawn by a caller's timeout
        if self._stopped and fn != self.shutdown:
            fut.set_exception(QueueError(f"queue {self.name!r} is shut down"))
            return
        try:
            out = fn(*args)
        except BaseException as exc:
            fut.set_exception(exc)
            return
        if isinstance(out, Future):
            out.add_done_callback(lambda f: _copy(f, fut))
        else:
            fut.set_result(out)

    def _after_cycle(self, tasks: Iterable[int], then: Callable[[], None], abortable: bool) -> None:
        """Run ``then`` once each of ``tasks`` has left the drain cycle it is in now (at once if none is in one).
        An abortable wait also ends when shutdown begins."""
        waiting = self._parts.in_cycle(tasks)
        closing = self._parts.closing
        self._loop.when(lambda: self._parts.left(waiting) or (abortable and closing[0]), then)

    # ------------------------------------------------------------------ timers

    def _start_timers(self) -> None:
        if self.periodic:
            self._ticking = True
            self._loop.at(self.interval, self._tick)
        self._loop.at(self._watch_interval(), self._watch)

    def _tick(self) -> None:
        """Every interval: measure, resize the ``split="auto"`` types, rebalance (if periodic), shrink."""
        if self._stopped:
            return
        try:
            if self.periodic:
                self.rebalance(periodic=True)
            else:
                self._load.add(self._throughput())
            self._resize_autos()
            self._shrink()
        except Exception:
            log.exception("queue %r: periodic control work failed", self.name)
        self._loop.at(self.interval, self._tick)

    def _ensure_ticking(self) -> None:
        """Measure every interval from now on (a ``split="auto"`` type needs it even without a balancer)."""
        if not self._ticking:
            self._ticking = True
            self._loop.at(self.interval, self._tick)

    def _watch_interval(self) -> float:
        return min(1.0, max(0.01, self._slow_ms / 4000.0))

    def _watch(self) -> None:
        """Time the handler calls in progress, and log each one past slow_handler_ms once."""
        if self._stopped:
            return
        now = time.monotonic()
        for task in self._tasks:
            counters = task.counters
            calling, calls = counters.calling, counters.calls
            seen = self._seen.get(task.index)
            if calling is None:
                self._seen.pop(task.index, None)
            elif seen is None or seen[0] != calls or seen[1] is not calling:
                self._seen[task.index] = (calls, calling, now)  # a new call: timed from its first sighting
        slow = self.slow_calls()
        for call in slow:
            if (call.task, call.started) not in self._reported:
                self._reported.add((call.task, call.started))
                log.warning("queue %r: handler of %s on drain task %d has been in %s for %.1f s "
                            "(slow_handler_ms=%d)", self.name, call.type_name, call.task, call.method,
                            call.seconds, self._slow_ms)  # fmt: skip
        self._reported &= {(t, since) for t, (_, _, since) in self._seen.items()}
        for t, (calls, calling, _) in list(self._failed.items()):
            counters = self._tasks[t].counters
            if counters.calls != calls or counters.calling is not calling:
                self._rejoin(t)
        for call in slow:  # a task that just rejoined is not among them: its call has changed
            if call.task not in self._failed and not self._parts.closing[0]:
                calls, calling, _ = self._seen[call.task]
                self._fail_over(call.task, calls, calling)
        self._loop.at(self._watch_interval(), self._watch)

    # ------------------------------------------------------------------ failover (a hung handler call)

    def _fail_over(self, t: int, calls: int, calling: Any) -> None:
        """Task ``t`` has been in one handler call for longer than slow_handler_ms: its other partitions go to
        healthy tasks now, without waiting for its fence (seed 002: a dead member's work is released to the
        others; 003: the poll interval as liveness).

        Safe without the fence because the partitions are revoked *before* the check that ``t`` is still inside
        that call: whatever ``t`` does once the call returns, it reads a partition's owner before taking from it
        (and before each ``on_idle``), so it can no longer touch them. If the call has returned meanwhile,
        nothing moves. The partitions holding the hung handler stay (Python cannot interrupt the call), with the
        other types placed on them: those wait with it. Items ``t`` had already taken from them are in its hands
        and are handed on when the call returns."""
        if self._consumer:
            if (t, "consumer") not in self._reported_failover:
                self._reported_failover.add((t, "consumer"))
                log.warning("queue %r: the single consumer is stuck on drain task %d; a consumer queue cannot fail "
                            "over (every task calls that consumer)", self.name, t)  # fmt: skip
            return
        parts = self._parts
        target = calling if isinstance(calling, Target) else calling[0]
        # the stuck handler's partitions stay where they are, whoever owns them now: t may have taken their items
        # before a handoff under way revoked them, and the call runs on
        kept = {p for p in range(parts.count[0]) if target in parts.targets[p]}
        taking = [p for p in range(parts.count[0]) if parts.owner[p] == t and p not in kept]
        # handoffs from t under way wait for t's fence, which may never come: they complete now too
        pending = [(p, new) for p, (old, new) in self._moving.items() if old == t and p not in kept]
        healthy = [i for i in range(len(self._tasks)) if i != t and i not in self._failed]
        if not taking and not pending:
            self._failed[t] = (calls, calling, [])
            return
        if not healthy:
            if t == self._standin:  # the stand-in itself is stuck as well: nothing is left to take over
                self._failed[t] = (calls, calling, [])
                return
            healthy = [self._stand_in()]
        for p in taking:
            parts.owner[p] = UNOWNED  # first revoke, then check: see the docstring
        counters = self._tasks[t].counters
        if counters.calls != calls or counters.calling is not calling:  # returned meanwhile: not hung after all
            for p in taking:
                parts.owner[p] = t
            return
        load = self._load.mean if self._load.samples else [0.0] * parts.count[0]
        task_load = {i: sum(load[p] for p in parts.assigned[i] if p < len(load)) for i in healthy}
        owned = {i: len(parts.assigned[i]) for i in healthy}  # unmeasured loads: spread by partition count
        moves = []
        for p in sorted(taking, key=lambda p: -(load[p] if p < len(load) else 0.0)):
            new = min(healthy, key=lambda i: (task_load[i], owned[i], i))
            task_load[new] += load[p] if p < len(load) else 0.0
            owned[new] += 1
            moves.append((p, t, new))
            self._moving[p] = (t, new)
        moves += [(p, t, new) for p, new in pending]
        self._failed[t] = (calls, calling, moves)
        self.failovers += 1
        log.warning("queue %r: drain task %d is stuck in a handler call; %d of its partitions fail over to tasks %s "
                    "(the stuck handler's own %d stay)", self.name, t, len(moves), sorted({m[2] for m in moves}),
                    len(kept))  # fmt: skip

        def assign() -> None:
            if parts.closing[0]:  # left in _moving: the shutdown assigns them once every task has stopped
                return
            for p, old, new in moves:
                if self._moving.get(p) == (old, new):
                    parts.owner[p] = new
                    del self._moving[p]
            parts.publish()
            self.state = "fencing" if self._moving else "stable"
            for i in {m[2] for m in moves}:
                self._scheduler.wake(self._tasks[i])

        self._after_told([("lost", moves), ("assigned", moves)], assign)

    def failed_over(self) -> tuple[int, ...]:
        """The tasks stuck in a call whose partitions failed over (thread-safe: a snapshot)."""
        return tuple(sorted(list(self._failed)))

    def _rejoin(self, t: int) -> None:
        """Task ``t``'s stuck call returned: the partitions that failed over from it and are still where they went
        come back by the ordinary fenced handoff."""
        _, _, moves = self._failed.pop(t)
        back = [(p, new, t) for p, _, new in moves if self._parts.owner[p] == new and p not in self._moving]
        log.warning("queue %r: drain task %d is back; %d partitions return to it", self.name, t, len(back))
        if back and not self._parts.closing[0]:
            self._handoff(back)

    def _stand_in(self) -> int:
        """The queue's one temporary drain task, for a queue whose every task is stuck: started on first need on a
        thread of its own, it keeps running (owning nothing once the stuck tasks are back) until shutdown."""
        if self._standin is None:
            index = self._parts.add_task()
            task = self._tasks[0].sibling(index)
            self._tasks.append(task)
            self._scheduler.submit_extra(task)
            self._standin = index
            log.warning("queue %r: started stand-in drain task %d", self.name, index)
        return self._standin

    def slow_calls(self) -> tuple[SlowCall, ...]:
        """Handler calls running now for longer than slow_handler_ms. Thread-safe. The control thread times a call
        from when its check (every min(1 s, slow_handler_ms / 4)) first saw it, so seconds are a lower bound."""
        now = time.monotonic()
        out = []
        for index, (calls, calling, since) in list(self._seen.items()):
            counters = self._tasks[index].counters
            if counters.calls != calls or counters.calling is not calling or (now - since) * 1000 < self._slow_ms:
                continue
            pair = (calling, "consume") if isinstance(calling, Target) else cast("tuple[Target, str]", calling)
            target, method = pair
            name = "consumer" if target.type is None else target.type.__qualname__
            out.append(SlowCall(name, index, method, now - since, since))
        return tuple(out)

    # ------------------------------------------------------------------ rebalancing

    def _throughput(self) -> list[int]:
        """Items produced per partition since the previous measurement (snapshot-and-reset)."""
        produced = self._parts.buffers.produced
        counts = [produced(p) for p in range(self._parts.count[0])]
        last = self._last_counts + [0] * (len(counts) - len(self._last_counts))
        self._last_counts = counts
        return [c - b for c, b in zip(counts, last)]

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
        for p, (_, new) in self._moving.items():
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
        if self._failed:
            return result(skipped="failover")  # a task is stuck: its partitions are where the failover put them
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
        plan = [owner[p] if p in self._moving else t for p, t in enumerate(plan)]
        moves = tuple((p, owner[p], plan[p]) for p in range(len(owner)) if plan[p] != owner[p])
        if not moves:
            return result(skipped="no gain")

        def finish(done: bool) -> RebalanceResult:
            if not done:
                return result(skipped="shutdown")
            res = result(moves, _int_loads(tp, plan, tasks))
            self.rebalances += 1
            self.history.append(res)
            log.info("queue %r: rebalanced %d partitions, max/min load %.2f -> %.2f in %.1f ms", self.name,
                     len(moves), res.ratio_before, res.ratio_after, res.duration_ms)  # fmt: skip
            return res

        return _then(self._handoff(moves), finish)

    def _handoff(self, moves: Sequence[tuple[int, int, int]]) -> Future[bool]:
        """Revoke every moved partition now; assign each old owner's share once that owner has left its cycle.
        The Future is True once all are assigned, False if shutdown came first (the rest is left to the final
        drain)."""
        done: Future[bool] = Future()
        self.state = "revoking"
        groups: dict[int, list[tuple[int, int, int]]] = {}
        for move in moves:
            p, old, new = move
            self._parts.owner[p] = UNOWNED
            self._moving[p] = (old, new)
            groups.setdefault(old, []).append(move)
        self.state = "fencing"
        left = [len(groups)]

        def assign(group: list[tuple[int, int, int]]) -> None:
            """The old owner has left its cycle: tell the listener (on its own thread), then hand over. Moves a
            failover completed meanwhile (the old owner hung) are done already."""
            group = [m for m in group if self._moving.get(m[0]) == (m[1], m[2])]
            if self._parts.closing[0]:
                handed(group, closing=True)
                return
            events = [("revoked", group), ("assigned", group)]
            self._after_told(events, lambda: handed(group, closing=self._parts.closing[0]))

        def handed(group: list[tuple[int, int, int]], closing: bool) -> None:
            if not closing:
                self.state = "assigning"
                group = [m for m in group if self._moving.get(m[0]) == (m[1], m[2])]
                for p, _, new in group:
                    self._parts.owner[p] = new
                self._parts.publish()
                for p, _, _ in group:  # cut by shutdown: left in _moving, assigned once every task has stopped
                    del self._moving[p]
            self.state = "fencing" if self._moving else "stable"
            if not closing:
                for t in {new for _, _, new in group}:
                    self._scheduler.wake(self._tasks[t])
            left[0] -= 1
            if left[0] == 0 or closing:
                if not done.done():
                    done.set_result(not closing)

        for old, group in groups.items():
            self._after_cycle({old}, functools.partial(assign, group), abortable=True)
        return done

    # ------------------------------------------------------------------ the rebalance listener

    def _after_told(
        self, events: Sequence[tuple[str, Sequence[tuple[int, int, int]]]], then: Callable[[], None]
    ) -> None:
        """Tell the listener ``events`` (``(phase, moves)``: "revoked" and "lost" per old owner, "assigned" per new
        owner) in order on the queue's listener thread, then run ``then`` on the control thread. A slow listener
        thus holds up this queue's handoffs only, never the control thread (other queues' work). Without a
        listener ``then`` runs at once."""
        listener = self._config.rebalance_listener
        if listener is None or not any(moves for _, moves in events):
            then()
            return
        told = self._listener_executor().submit(self._tell, listener, [(ph, list(m)) for ph, m in events if m])
        self._loop.when(told.done, then)

    def _listener_executor(self) -> ThreadPoolExecutor:
        """The queue's listener thread, started with the first event to tell."""
        if self._listener_thread is None:
            self._listener_thread = ThreadPoolExecutor(1, thread_name_prefix=f"drainpipe-{self.name}-listener")
        return self._listener_thread

    def _tell(self, listener: Any, events: list[tuple[str, list[tuple[int, int, int]]]]) -> None:
        """On the listener thread: each event's callback per task, with its partitions and their types."""
        for phase, moves in events:
            by_task: dict[int, list[int]] = {}
            for p, old, new in moves:
                by_task.setdefault(new if phase == "assigned" else old, []).append(p)
            callback = getattr(listener, f"on_{phase}", None)
            if callback is None:  # on_lost is optional: as Kafka's onPartitionsLost, it defaults to on_revoked
                callback = listener.on_revoked
            for task, partitions in sorted(by_task.items()):
                try:
                    callback(task, tuple(partitions), self._parts.types_on(partitions))
                except Exception:
                    log.exception("queue %r: rebalance listener failed in %s", self.name, callback.__name__)

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
        return _then(self._detach(old), lambda _: self._attach(entry, handler))

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

        self._after_told([("assigned", [(p, UNOWNED, t) for p, t in grown])], bind)
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
            self._ensure_ticking()  # adaptive partitions shrink with the handlers (:meth:`_shrink`)
        return _then(self._detach(entry), lambda _: True)

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
        tasks = self._parts.owners_of(bound)
        tasks |= {self._moving[p][0] for p in bound if p in self._moving}
        done: Future[None] = Future()
        self._after_cycle(tasks, lambda: done.set_result(None), abortable=False)
        return done

    # ------------------------------------------------------------------ split="auto" and shrinking

    def _resize_autos(self) -> None:
        """Resize each ``split="auto"`` type whose measured load has asked for another instance count
        :data:`CONFIRM` intervals in a row (see :mod:`._autosplit`). Not while a task is failed over."""
        if self._failed or self._parts.closing[0] or self._load.samples < WARMUP_SAMPLES:
            return
        mean = self._load.mean
        total = sum(mean)
        for entry in [e for e in self._table.entries.values() if e.auto]:
            if entry.type in self._resizing:
                continue
            load = sum(mean[p] for p in entry.partitions if p < len(mean))
            want = wanted_instances(load, total, self._planned_tasks, len(entry.partitions))
            if want == len(entry.partitions):
                self._asked.pop(entry.type, None)
                continue
            last, times = self._asked.get(entry.type, (0, 0))
            times = times + 1 if last == want else 1
            self._asked[entry.type] = (want, times)
            if times >= CONFIRM:
                self._asked.pop(entry.type, None)
                self._change(entry, self._resize, want)

    def _change(self, entry: Entry, fn: Callable[[Entry, int], Future[None] | None], arg: int) -> None:
        """Run ``fn(entry, arg)`` (a resize or a move) in order with the type's add/remove_handler requests; the type
        counts as changing (``_resizing``) until it is done."""
        self._resizing.add(entry.type)
        fut: Future[Any] = Future()
        fut.add_done_callback(functools.partial(self._resized, entry.type))
        self._admit((fn, (entry, arg), fut), entry.type)

    def _resized(self, type_: type, _: Future[Any]) -> None:
        self._loop.call(lambda: self._resizing.discard(type_))

    def _resize(self, entry: Entry, want: int) -> Future[None] | None:
        """Run ``entry`` as ``want`` instances (see :meth:`_split_up` and :meth:`_join`)."""
        if self._table.entries.get(entry.type) is not entry or self._parts.closing[0]:
            return None  # replaced or removed meanwhile
        have = len(entry.partitions)
        log.info("queue %r: %s %s from %d to %d instances", self.name, "splitting" if want > have else "joining",
                 entry.type.__qualname__, have, want)  # fmt: skip
        self.resizes += 1
        if want > have:
            return self._split_up(entry, want)
        self._join(entry, want)
        return None

    def _split_up(self, entry: Entry, want: int) -> Future[None]:
        """More instances: the type's own retired partitions first (their instances are still bound), then free
        partitions, growing the queue if there are too few; each moved, empty, to a task without an instance of the
        type (the least loaded first) by the ordinary handoff; the listener hears them assigned; then producers
        route to them."""
        parts, need = self._parts, want - len(entry.partitions)
        retired = [p for p in entry.targets if p not in entry.partitions][:need]
        owners = {parts.owner[p] for p in entry.partitions}
        fresh = parts.free(need - len(retired), owners)
        if len(retired) + len(fresh) < need:
            grown = parts.grow(parts.count[0] + need - len(retired) - len(fresh))
            fresh += [p for p, _ in grown]
        mean = self._load.mean
        load = {t: sum(mean[p] for p in parts.assigned[t] if p < len(mean)) for t in range(self._planned_tasks)}
        spare = sorted((t for t in range(self._planned_tasks) if t not in owners), key=lambda t: (load[t], t))
        moves = []
        for p in retired + fresh:
            if spare:
                t = spare.pop(0)
                if parts.owner[p] != t and p not in self._moving:
                    moves.append((p, parts.owner[p], t))
        done: Future[None] = Future()

        def route() -> None:
            if self._table.entries.get(entry.type) is not entry or parts.closing[0]:
                done.set_result(None)
                return
            entry.bind_more(tuple(fresh), locked=not self._type_routing)
            for p in fresh:
                parts.attach(p, entry.targets[p])
            told = [(p, UNOWNED, parts.owner[p]) for p in retired + fresh]
            self._after_told([("assigned", told)], publish)

        def publish() -> None:
            before = entry.partitions
            entry.route_to(entry.partitions + tuple(retired) + tuple(fresh))
            self._load.respread(before, entry.partitions)
            self._table.home[entry.type] = entry.partitions
            if self._table.split.get(entry.type) is not entry:
                self._table.split[entry.type] = entry  # producers route through the entry from now on
                self._producer.drop_route(entry.type)
            done.set_result(None)

        if moves:
            self._handoff(moves).add_done_callback(lambda _: self._loop.call(route))
        else:
            route()
        return done

    def _join(self, entry: Entry, want: int) -> None:
        """Fewer instances: producers stop routing to the last ones at once; each retired instance stays bound to
        its partition (a late item is never dropped, and a later split reuses it), handles what is buffered there,
        and once its partition is empty gets its final flush: one ``on_idle()`` call on the thread of the task
        that owns the partition. The listener hears those partitions revoked."""
        table = self._table
        before = entry.partitions
        retired = entry.retire_partitions(want)
        self._load.respread(before, entry.partitions)
        if want == 1 and self._type_routing:
            self._producer.set_route(entry.type, entry.partitions[0])  # the fast path again
            table.split.pop(entry.type, None)
        table.home[entry.type] = entry.partitions
        for p in retired:
            self._loop.when(functools.partial(self._drained, p), functools.partial(self._final_flush, entry, p))

    def _drained(self, p: int) -> bool:
        return not self._parts.buffers.size(p) and p not in self._moving

    def _final_flush(self, entry: Entry, p: int) -> None:
        """A retired instance's partition is empty: its owner calls the instance's on_idle at its next cycle."""
        target = entry.targets.get(p)
        owner = self._parts.owner[p]
        if target is None or p in entry.partitions or owner < 0 or self._table.entries.get(entry.type) is not entry:
            return  # reused by a split, or the handler is gone
        task = self._tasks[owner]

        def flush(dispatcher: Dispatcher, running: DrainTask) -> int:
            if self._parts.owner[p] == running.index:  # moved meanwhile: the new owner flushes it
                dispatcher.flush(target, running.counters)
            else:
                self._loop.call(functools.partial(self._final_flush, entry, p))
            return 0

        task.actions.append(flush)
        self._scheduler.wake(task)
        self._after_told([("revoked", [(p, owner, UNOWNED)])], lambda: None)

    def _shrink(self) -> None:
        """Adaptive partitions follow the handlers: when the policy asks for fewer than there are (handlers
        removed), the types on the partitions beyond move to ones below (:meth:`_rehome`), and once those carry no
        type and hold no item, and their owners have left any cycle over them, the count drops. A split type's
        partitions are not moved: while one sits beyond, the count stays above it."""
        parts, cfg = self._parts, self._config.partitions
        if self._consumer or not cfg.is_adaptive or self._failed or self._shrinking or parts.closing[0]:
            return
        if self._resizing:  # a split's new partitions carry no type until it binds them: not now
            return
        want = max(cfg.resolve(self._thread_count, self._table.weighted_count()), self._planned_tasks)
        n = parts.count[0]
        if want >= n or self._moving:
            return
        beyond = range(want, n)
        entries = {tg.type: self._table.entries.get(tg.type) for p in beyond for tg in parts.targets[p] if tg.type}
        if any(e is None or e.split or e.auto for e in entries.values()):
            return  # a split type, or a removed one's items still to drop: later
        if entries:
            for entry in entries.values():
                assert entry is not None
                if entry.type not in self._resizing:
                    self._change(entry, self._rehome, want)
            return
        if any(parts.buffers.size(p) for p in beyond):
            return
        self._shrinking = True

        def drop() -> None:
            self._shrinking = False
            busy = self._resizing or self._moving
            if not busy and parts.count[0] == n and not any(parts.targets[p] or parts.buffers.size(p) for p in beyond):
                parts.shrink(want)
                log.info("queue %r: partitions %d -> %d", self.name, n, want)

        self._after_cycle(parts.owners_of(beyond), drop, abortable=True)

    def _rehome(self, entry: Entry, below: int) -> Future[None] | None:
        """Move a plain type from its partition p (beyond ``below``) to the partition below with the fewest types
        owned by p's owner, keeping its order: the owner itself switches the route at the start of a cycle and
        hands on what p holds before anything that arrives in the new partition; once it has, p is unbound."""
        parts = self._parts
        if self._table.entries.get(entry.type) is not entry or len(entry.partitions) != 1:
            return None  # removed or replaced meanwhile
        (p,) = entry.partitions
        owner = parts.owner[p]
        if owner < 0 or p in self._moving or p < below:
            return None
        mine = [q for q in range(below) if parts.owner[q] == owner and q not in self._moving]
        if not mine:  # the owner has no partition below: one comes to it first (empty or not: a handoff)
            q = min(range(below), key=lambda q: (parts.type_count[q], q))
            if q not in self._moving:
                self._handoff([(q, parts.owner[q], owner)])
            return None
        q = min(mine, key=lambda q: (parts.type_count[q], q))
        target = entry.target(p)
        assert target is not None
        done: Future[None] = Future()

        # bound to q already (no item of the type is there yet, and q's owner is p's: never two calls at once)
        entry.targets = {p: target, q: target}
        entry.partitions = (q,)
        parts.attach(q, target)

        def switch(dispatcher: Dispatcher, task: DrainTask) -> int:
            """On the owner's thread, at the start of a cycle: producers send the type to q from here on, and what
            p holds (all produced before) is handed on now, before anything in q."""
            if parts.owner[p] != task.index or parts.owner[q] != task.index:
                self._loop.call(undo)  # moved meanwhile: the next shrink tries again
                return 0
            self._producer.set_route(entry.type, q)
            items = parts.buffers.take(p)
            found = dispatcher.dispatch([(p, items)], task.counters) if items is not None else 0
            self._loop.call(lambda: self._after_cycle({task.index}, unbind, abortable=False))
            return found

        def undo() -> None:
            entry.targets = {p: target}
            entry.partitions = (p,)
            parts.detach(q, entry.type)
            done.set_result(None)

        def unbind() -> None:
            entry.targets = {q: target}
            parts.detach(p, entry.type)
            self._table.home[entry.type] = (q,)
            done.set_result(None)

        self._tasks[owner].actions.append(switch)
        self._scheduler.wake(self._tasks[owner])
        return done

    # ------------------------------------------------------------------ shutdown

    def shutdown(self) -> Future[None]:
        """Let drain tasks empty their partitions (up to shutdown_timeout_ms), stop them, wait out any in-flight
        handler call however long it takes, then dispatch what is left once, on a thread of the queue's scheduler,
        and release the scheduler. The Future is settled when all that is done."""
        with self._lock:
            self._stopped = True  # requests queued after this one are refused
        self.periodic = False
        for task in self._tasks:
            task.drain_then_stop = True
            self._scheduler.wake(task)
        deadline = time.monotonic() + self._config.shutdown_timeout_ms / 1000.0
        done: Future[None] = Future()

        def stop() -> None:
            for task in self._tasks:
                task.stopped = True
            self._after_cycle(range(len(self._tasks)), final, abortable=False)

        def final() -> None:
            # no task runs any more: partitions whose handoff shutdown cut get their new owner now, so every
            # partition has exactly one owner after shutdown (the final drain empties them whoever owns them)
            for p, (_, new) in self._moving.items():
                self._parts.owner[p] = new
            self._moving.clear()
            self._parts.publish()
            self.state = "stable"
            self._scheduler.submit(_FinalDrain(self._dispatcher, self._farewell, self._release, done))

        tasks = self._tasks
        self._loop.when(lambda: time.monotonic() >= deadline or all(t.finished.is_set() for t in tasks), stop)
        return done

    def _farewell(self) -> None:
        """After the final drain (on its thread): the listener hears each task's partitions revoked, as a Kafka
        consumer's listener does when it closes, and its thread ends."""
        listener = self._config.rebalance_listener
        if listener is not None:
            owned = [(p, t, UNOWNED) for p, t in enumerate(self._parts.owner) if t >= 0]
            self._listener_executor().submit(self._tell, listener, [("revoked", owned)]).result()
        if self._listener_thread is not None:
            self._listener_thread.shutdown(wait=True)


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


def _copy(source: Future[Any], target: Future[Any]) -> None:
    exc = source.exception()
    if exc is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())
