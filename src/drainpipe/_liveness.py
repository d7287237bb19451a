"""Liveness of one queue's drain tasks: slow handler calls, and failover of a task stuck in one (seed 002: a dead
member's work is released to the others; 003: the poll interval as liveness).

::

    drain task ── Counters.calling / .calls ──► watch() every min(1 s, slow_handler_ms / 4), on the control thread
      (writes two fields per call, no clock)        │
                                                    ├─ a call first seen: timed from now (``_seen``)
                                                    ├─ past slow_handler_ms: logged once, listed by slow_calls()
                                                    ├─ still in it: the task FAILS OVER: its other partitions go
                                                    │  to healthy tasks at once (Handoffs.take_over, no fence)
                                                    └─ a failed-over task's call returned: it REJOINS, its
                                                       partitions come back by the ordinary fenced handoff

A failover skips the fence, which is safe because the partitions are revoked *before* the check that the task is
still inside that call: whatever the task does once the call returns, it reads a partition's owner before taking from
it (and before each ``on_idle``), so it can no longer touch them. If the call has returned meanwhile, nothing moves.
The partitions holding the hung handler stay (Python cannot interrupt the call), with the other types placed on
them: those wait with it. Items the task had already taken from them are in its hands and are handed on when the
call returns. A queue whose every task is stuck gets one stand-in drain task. A queue
with a single ``consumer`` fails over only when the consumer is declared safe to call from several threads at once
(``consumer_thread_safe``): then a stuck call's task loses every partition (the consumer is on all of them; items
the stuck call holds are handled when it returns, possibly after later items of their partitions). Otherwise it
cannot (it says so once per task): a failover would start a second call of a consumer that may not allow it.

A task's failover is its state FAILED_OVER in :class:`._control_state.ControlState` (what that forbids is written
there); this module alone moves a task into it and out of it.

Thread rule: :meth:`Liveness.watch` runs on the control thread, the only writer of everything here;
:meth:`Liveness.slow_calls` and ``failovers`` are read by ``stats()`` on any thread (snapshots).
"""

from __future__ import annotations

import logging
import time
from typing import Any, cast

from ._control_state import ControlState, TaskState
from ._drain import DrainTask
from ._events import EventQueue
from ._handlers import Target
from ._handoff import Handoffs, Move
from ._load import LoadEstimate
from ._partitions import UNOWNED, Partitions
from ._scheduler import Scheduler
from ._stats import SlowCall

log = logging.getLogger("drainpipe.control")


class Liveness:
    """Times the handler calls of one queue's drain tasks and fails a stuck task over (see the module docstring)."""

    def __init__(
        self,
        name: str,
        slow_ms: int,
        can_fail_over: bool,
        *,
        parts: Partitions,
        tasks: list[DrainTask],
        scheduler: Scheduler,
        handoffs: Handoffs,
        load: LoadEstimate,
        state: ControlState,
        events: EventQueue | None = None,
    ) -> None:
        self._name = name
        self._events = events
        self._slow_ms = slow_ms
        self._can_fail_over = can_fail_over  # False: a single consumer not declared consumer_thread_safe
        self._parts = parts
        self._tasks = tasks  # the queue's list: a stand-in is appended to it
        self._scheduler = scheduler
        self._handoffs = handoffs
        self._load = load
        self._state = state
        self.failovers = 0
        self._seen: dict[int, tuple[int, Any, float]] = {}  # per task: (call count, the call, first seen at)
        self._reported: set[tuple[int, float]] = set()  # slow calls already logged: (task, first seen at)
        # per task FAILED_OVER: (call count, the call it is stuck in, the moves its failover made)
        self._stuck: dict[int, tuple[int, Any, list[Move]]] = {}
        self._reported_failover: set[tuple[int, str]] = set()
        self._standin: int | None = None

    def interval(self) -> float:
        """Seconds between two :meth:`watch` calls: a quarter of slow_handler_ms, within 10 ms .. 1 s."""
        return min(1.0, max(0.01, self._slow_ms / 4000.0))

    def watch(self) -> None:
        """Time the handler calls in progress, log each one past slow_handler_ms once, let the failed-over tasks
        whose call returned rejoin, and fail over the tasks stuck in a call (not while shutdown is under way).
        Control thread; never blocks."""
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
                            "(slow_handler_ms=%d)", self._name, call.type_name, call.task, call.method,
                            call.seconds, self._slow_ms)  # fmt: skip
                if self._events is not None:
                    calling = self._seen[call.task][1]
                    typ = (calling if isinstance(calling, Target) else calling[0]).type
                    self._events.put("slow_call", task=call.task, types=() if typ is None else (typ,))
        self._reported &= {(t, since) for t, (_, _, since) in self._seen.items()}
        for t, (calls, calling, _) in list(self._stuck.items()):
            counters = self._tasks[t].counters
            if counters.calls != calls or counters.calling is not calling:
                self._rejoin(t)
        for call in slow:  # a task that just rejoined is not among them: its call has changed
            if self._state.task(call.task) is TaskState.RUNNING and not self._parts.closing[0]:
                calls, calling, _ = self._seen[call.task]
                self._fail_over(call.task, calls, calling)

    def slow_calls(self) -> tuple[SlowCall, ...]:
        """Handler calls running now for longer than slow_handler_ms. Any thread. The control thread times a call
        from when its check (every :meth:`interval`) first saw it, so seconds are a lower bound."""
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

    def _mark(self, t: int, calls: int, calling: Any, moves: list[Move]) -> None:
        self._state.fail_over(t)
        self._stuck[t] = (calls, calling, moves)

    def _fail_over(self, t: int, calls: int, calling: Any) -> None:
        """Task ``t`` has been in one handler call for longer than slow_handler_ms: its other partitions go to
        healthy tasks now, without waiting for its fence (the module docstring says why that is safe)."""
        if not self._can_fail_over:
            if (t, "consumer") not in self._reported_failover:
                self._reported_failover.add((t, "consumer"))
                log.warning("queue %r: the single consumer is stuck on drain task %d; a consumer queue cannot fail "
                            "over unless its consumer is declared consumer_thread_safe", self._name, t)  # fmt: skip
            return
        parts, moving = self._parts, self._handoffs.moving
        target = calling if isinstance(calling, Target) else calling[0]
        # the stuck handler's partitions stay where they are, whoever owns them now: t may have taken their items
        # before a handoff under way revoked them, and the call runs on
        kept = {p for p in range(parts.count[0]) if target in parts.targets[p]}
        taking = [p for p in range(parts.count[0]) if parts.owner[p] == t and p not in kept]
        # handoffs from t under way wait for t's fence, which may never come: they complete now too (not those past
        # their fence: t left that cycle, and the listener is hearing them handed over already)
        past = self._handoffs.past_fence
        pending = [(p, new) for p, (old, new) in moving.items() if old == t and p not in kept and p not in past]
        healthy = [i for i in range(len(self._tasks)) if i != t and self._state.task(i) is TaskState.RUNNING]
        if not taking and not pending:
            self._mark(t, calls, calling, [])
            return
        if not healthy:
            if t == self._standin:  # the stand-in itself is stuck as well: nothing is left to take over
                self._mark(t, calls, calling, [])
                return
            healthy = [self._stand_in()]
        for p in taking:
            parts.owner[p] = UNOWNED  # first revoke, then check: see the module docstring
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
        moves += [(p, t, new) for p, new in pending]
        self._mark(t, calls, calling, moves)
        self.failovers += 1
        log.warning("queue %r: drain task %d is stuck in a handler call; %d of its partitions fail over to tasks %s "
                    "(the stuck handler's own %d stay)", self._name, t, len(moves), sorted({m[2] for m in moves}),
                    len(kept))  # fmt: skip
        if self._events is not None:
            self._events.put("failover", task=t, partitions=tuple(m[0] for m in moves))
        self._handoffs.take_over(moves)

    def _rejoin(self, t: int) -> None:
        """Task ``t``'s stuck call returned: the partitions that failed over from it and are still where they went
        come back by the ordinary fenced handoff."""
        _, _, moves = self._stuck.pop(t)
        self._state.rejoin(t)
        moving = self._handoffs.moving
        back = [(p, new, t) for p, _, new in moves if self._parts.owner[p] == new and p not in moving]
        log.warning("queue %r: drain task %d is back; %d partitions return to it", self._name, t, len(back))
        if back and not self._parts.closing[0]:
            self._handoffs.move(back)

    def _stand_in(self) -> int:
        """The queue's one temporary drain task, for a queue whose every task is stuck: started on first need on a
        thread of its own, it keeps running (owning nothing once the stuck tasks are back) until shutdown."""
        if self._standin is None:
            index = self._parts.add_task()
            task = self._tasks[0].sibling(index)
            self._tasks.append(task)
            self._scheduler.submit_extra(task)
            self._standin = index
            log.warning("queue %r: started stand-in drain task %d", self._name, index)
        return self._standin
