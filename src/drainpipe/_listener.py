"""Telling the rebalance listener: every ownership change, each once, in order, on the thread that loses or gains.

::

    control thread  tell(events) ─► the ledger (who the listener was last told holds each partition) keeps what
                                    changes it, drops what repeats it ─► calls, appended to the queue's mail (FIFO)
                    the head call ─► DrainTask.actions of the task whose thread runs it, woken
    drain thread    at the start of its next cycle: the callback (on_assigned / on_revoked / on_lost)
    control thread  the head is done (or past its deadline) ─► the next call
    final drain     farewell(): what is still in the mail, then "revoked" for every partition the ledger holds

Why a ledger: the changes come from several places (handoffs, failover, growth, shrinking, shutdown) that do not
know what the others told. The ledger is the listener's picture; a partition's events alternate "assigned" and
"revoked"/"lost" by construction, and the picture equals ``partition_owners()`` whenever no change is under way.

Why one call at a time: a partition's events may be told on different threads (revoked on its old owner's,
assigned on its new owner's); delivering the mail in order, one call after the other, keeps every partition's
events in the order the control thread decided them.

Which thread: "revoked" on the old owner's (it has left the cycle it was in: the handoff fenced first), "assigned"
on the new owner's (before it takes anything from the partition: the assignment completes once the call returns),
"lost" on the thread of the task that takes the partitions over (the old owner is stuck in a handler call), the
initial assignment on each task's thread before its first cycle takes anything, and shutdown's "revoked" on the
thread of the final drain (once no task runs).

Deadline: a call not done ``deadline_s`` after it was posted (min(``handoff_timeout_ms``, ``slow_handler_ms``)) is
counted in ``timeouts`` and logged once. If its thread never reached it (stuck in a handler), it runs on the
queue's listener thread instead (and is waited for once more); if the callback itself is hanging, the mail moves on
without it (the handoff it holds up completes). A drain thread inside a callback is timed by liveness as inside a
handler call: a callback that hangs past ``slow_handler_ms`` fails the task over (its partitions go to the others).

Thread rule: :meth:`Teller.tell`, :meth:`Teller.start` and the mail's progress run on the control thread (start:
before the drain tasks are submitted); a call's state and late flag, the mail, the head and ``_closed`` change under
``_lock`` (the control thread, the drain thread that runs a call, the listener thread and the final drain race for
them); :meth:`Teller.farewell` on the thread of the final drain, which closes the mail first: from then on nothing
more is posted or sent to the listener thread, and a call running there is waited for. ``timeouts`` is read by
``stats()`` on any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ._control_loop import ControlLoop
from ._drain import Counters, Dispatcher, DrainTask
from ._events import EventQueue
from ._handlers import Target
from ._partitions import Partitions
from ._scheduler import Scheduler

log = logging.getLogger("drainpipe.control")

Move = tuple[int, int, int]  # (partition, old owner, new owner)
Events = Sequence[tuple[str, Sequence[Move]]]  # (phase, moves): "revoked", "lost", "assigned"

_QUEUED, _RUNNING, _DONE = 0, 1, 2
_LISTENER = type("rebalance listener", (), {})  # the "type" a drain thread's listener call shows in slow_calls


class _Call:
    """One callback: ``on_<phase>(task, partitions, types)``, run by the thread of task ``runner``."""

    __slots__ = ("phase", "task", "partitions", "types", "runner", "state", "due", "late")

    def __init__(self, phase: str, task: int, partitions: tuple[int, ...], types: tuple[type, ...], runner: int):
        self.phase = phase
        self.task = task
        self.partitions = partitions
        self.types = types
        self.runner = runner
        self.state = _QUEUED
        self.due = 0.0  # when the control thread stops waiting for it (set when posted)
        self.late = False  # past its deadline once (counted once)


class Teller:
    """The rebalance listener's ledger and mail of one queue (see the module docstring). Without a listener every
    method is a no-op and :meth:`tell` returns None."""

    def __init__(
        self,
        name: str,
        listener: Any,
        deadline_s: float,
        *,
        loop: ControlLoop,
        parts: Partitions,
        tasks: list[DrainTask],
        scheduler: Scheduler,
        events: EventQueue | None = None,
    ) -> None:
        self._name = name
        self._listener = listener
        self._events = events  # told too, as the control thread decides (no call to wait for)
        self._deadline_s = deadline_s
        self._loop = loop
        self._parts = parts
        self._tasks = tasks
        self._scheduler = scheduler
        self.held: dict[int, int] = {}  # the ledger: partition -> the task the listener was last told holds it
        self._mail: deque[_Call] = deque()
        self._head: _Call | None = None
        self._initial: list[_Call] = []  # the initial assignment's calls: the mail waits for them
        self._lock = threading.Lock()  # a call's state and late flag, the mail and head, _closed, _spare
        self._closed = False  # farewell began: nothing more goes to the listener thread or the drain tasks
        self._spare: ThreadPoolExecutor | None = None  # the listener thread, for calls whose own thread is stuck
        # what a drain thread is in while it makes a call: liveness times it as a handler call (and fails the task
        # over if it hangs); its type's name is what stats().slow_calls shows
        self._marker = Target(lambda batch: None, _LISTENER, False)
        self.timeouts = 0

    @property
    def active(self) -> bool:
        """A listener or an event queue is told: the ledger is kept."""
        return self._listener is not None or self._events is not None

    def start(self) -> None:
        """The initial assignment: each task hears its partitions assigned on its own thread, as the first thing its
        first cycle does; the mail waits for those calls. Before the drain tasks are submitted."""
        if not self.active:
            return
        calls = self._calls([("assigned", [(p, -1, t) for p, t in enumerate(self._parts.owner) if t >= 0])])
        if self._listener is None:
            return
        due = time.monotonic() + self._deadline_s
        for call in calls:
            call.due = due
            self._tasks[call.runner].actions.append(self._action(call))
        self._initial = calls

        def opened() -> None:
            spare = [c for c in calls if c.state != _DONE and self._overdue(c)]
            due = time.monotonic() + self._deadline_s  # those now on the listener thread: waited for once more

            def go() -> None:
                self._initial = []
                if self._head is None:
                    self._advance()

            self._loop.when(lambda: all(c.state == _DONE for c in spare) or time.monotonic() >= due, go)

        if calls:
            self._loop.call(lambda: self._loop.when(
                lambda: all(c.state == _DONE for c in calls) or time.monotonic() >= due, opened))  # fmt: skip

    def tell(self, events: Events) -> Callable[[], bool] | None:
        """Queue ``events`` ((phase, moves) in order; per move the partition, its old and its new owner) for the
        listener; returns a predicate that is true once every call they made is done or past its deadline, or None
        when they change nothing the listener was told. Control thread; never blocks."""
        if not self.active:
            return None
        calls = self._calls(events)
        if not calls or self._listener is None:
            return None
        with self._lock:
            if self._closed:  # farewell tells what the ledger holds
                return None
            self._mail.extend(calls)
        if self._head is None and not self._initial:
            self._advance()
        last = calls[-1]
        return lambda: last.state == _DONE or (last not in self._mail and last is not self._head)

    def farewell(self) -> None:
        """After the final drain (its thread, blocking; no task runs): the calls still in the mail, in order, then
        every partition the ledger holds revoked, per task. A call running on the listener thread is waited for
        first (up to the deadline), so that no two calls run at once. Ends the listener thread."""
        if not self.active:
            return
        with self._lock:
            self._closed = True
            left = self._initial + ([self._head] if self._head is not None else []) + list(self._mail)
            self._mail.clear()
            self._head = None
            spare = self._spare
        due = time.monotonic() + self._deadline_s
        while any(c.state == _RUNNING for c in left) and time.monotonic() < due:
            time.sleep(0.005)
        for call in left:
            self._run(call)
        by_task: dict[int, list[int]] = {}
        for p, t in sorted(self.held.items()):
            by_task.setdefault(t, []).append(p)
        self.held.clear()
        for t, ps in sorted(by_task.items()):
            call = _Call("revoked", t, tuple(ps), self._parts.types_on(ps), t)
            self._record(call)
            if self._listener is not None:
                self._run(call)
        if spare is not None:
            spare.shutdown(wait=False)

    # ------------------------------------------------------------------ the ledger

    def _calls(self, events: Events) -> list[_Call]:
        """The calls that change the ledger, in order, grouped per (phase, task); the ledger updated."""
        out: list[_Call] = []
        held = self.held
        for phase, moves in events:
            by_task: dict[tuple[int, int], list[int]] = {}  # (task told, runner) -> partitions
            for p, _old, new in moves:
                if phase == "assigned":
                    if held.get(p) == new or new < 0:
                        continue
                    if p in held:  # never two "assigned" in a row: the one before leaves first
                        was = held[p]
                        out.append(_Call("revoked", was, (p,), self._parts.types_on([p]), was))
                    held[p] = new
                    by_task.setdefault((new, new), []).append(p)
                else:
                    if p not in held:
                        continue
                    was = held.pop(p)
                    # "lost": the old owner is stuck, so the task taking the partition over tells it
                    runner = new if phase == "lost" and new >= 0 else was
                    by_task.setdefault((was, runner), []).append(p)
            for (task, runner), ps in sorted(by_task.items()):
                out.append(_Call(phase, task, tuple(ps), self._parts.types_on(ps), runner))
        for call in out:
            self._record(call)
        return out

    def _record(self, call: _Call) -> None:
        if self._events is not None:
            self._events.put(call.phase, task=call.task, partitions=call.partitions, types=call.types)

    # ------------------------------------------------------------------ the mail

    def _advance(self) -> None:
        """The head is done, or past its deadline: the next call (control thread)."""
        head = self._head
        if head is not None and head.state != _DONE and self._overdue(head):
            head.due = time.monotonic() + self._deadline_s  # on the listener thread now: waited for once more
            self._loop.when(lambda: head.state == _DONE or time.monotonic() >= head.due, self._advance)
            return
        with self._lock:
            if self._closed:
                return
            self._head = self._mail.popleft() if self._mail else None
            call = self._head
        if call is None:
            return
        call.due = time.monotonic() + self._deadline_s
        runner = self._tasks[call.runner] if 0 <= call.runner < len(self._tasks) else None
        if runner is None:
            self._run(call)  # no such task (never happens): tell it here rather than never
            self._advance()
            return
        runner.actions.append(self._action(call))
        self._scheduler.wake(runner)
        self._loop.when(lambda: call.state == _DONE or time.monotonic() >= call.due, self._advance)

    def _overdue(self, call: _Call) -> bool:
        """``call`` is past its deadline (control thread): counted and logged once. If its drain thread never
        reached it, it goes to the listener thread, and True says to wait for it there; else (the callback hangs,
        or shutdown began) the mail goes on without it."""
        with self._lock:
            first, call.late = not call.late, True
            queued = call.state == _QUEUED and not self._closed
            if queued:
                call.state = _RUNNING  # claimed for the listener thread: its own thread never reached it
                if self._spare is None:
                    self._spare = ThreadPoolExecutor(1, thread_name_prefix=f"drainpipe-{self._name}-listener")
                self._spare.submit(self._call_listener, call)
        if first:
            self.timeouts += 1
            if self._events is not None:
                self._events.put("handoff_timeout", task=call.task, partitions=call.partitions, types=call.types)
            if queued:
                log.warning("queue %r: drain task %d did not reach the listener's %s call in %.1f s; the listener "
                            "thread makes it", self._name, call.runner, call.phase, self._deadline_s)  # fmt: skip
            else:
                log.warning("queue %r: the listener's %s call for task %d has run for over %.1f s; the handoffs go "
                            "on without it", self._name, call.phase, call.task, self._deadline_s)  # fmt: skip
        return queued

    def _action(self, call: _Call) -> Callable[[Dispatcher, DrainTask], int]:
        def tell(_dispatcher: Dispatcher, task: DrainTask) -> int:
            self._run(call, task.counters)
            return 0

        return tell

    def _run(self, call: _Call, counters: Counters | None = None) -> None:
        """Make ``call`` here unless another thread claimed it; on a drain thread (``counters``: its task's), timed
        by liveness as a handler call is."""
        with self._lock:
            if call.state != _QUEUED:
                return
            call.state = _RUNNING
        if counters is None:
            self._call_listener(call)
            return
        counters.calls += 1
        counters.calling = (self._marker, f"on_{call.phase}")
        try:
            self._call_listener(call)
        finally:
            counters.calling = None

    def _call_listener(self, call: _Call) -> None:
        callback = getattr(self._listener, f"on_{call.phase}", None)
        if callback is None:  # on_lost is optional: as Kafka's onPartitionsLost, it defaults to on_revoked
            callback = self._listener.on_revoked
        try:
            callback(call.task, call.partitions, call.types)
        except Exception:
            log.exception("queue %r: rebalance listener failed in %s", self._name, callback.__name__)
        finally:
            call.state = _DONE
