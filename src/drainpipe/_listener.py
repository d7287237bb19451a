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

Deadline: a call not done ``deadline_s`` after it was posted is counted in ``timeouts`` and logged. If its thread
never reached it (stuck in a handler), it runs on the queue's listener thread instead; if the callback itself is
hanging, the mail moves on without it (the handoff it holds up completes).

Thread rule: :meth:`Teller.tell`, :meth:`Teller.start` and the mail's progress run on the control thread (start:
before the drain tasks are submitted); a call's state changes under ``_lock`` (the control thread, the drain thread
that runs it and the listener thread race for it); :meth:`Teller.farewell` on the thread of the final drain.
``timeouts`` is read by ``stats()`` on any thread.
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
from ._drain import Dispatcher, DrainTask
from ._events import EventQueue
from ._partitions import Partitions
from ._scheduler import Scheduler

log = logging.getLogger("drainpipe.control")

Move = tuple[int, int, int]  # (partition, old owner, new owner)
Events = Sequence[tuple[str, Sequence[Move]]]  # (phase, moves): "revoked", "lost", "assigned"

_QUEUED, _RUNNING, _DONE = 0, 1, 2


class _Call:
    """One callback: ``on_<phase>(task, partitions, types)``, run by the thread of task ``runner``."""

    __slots__ = ("phase", "task", "partitions", "types", "runner", "state", "due")

    def __init__(self, phase: str, task: int, partitions: tuple[int, ...], types: tuple[type, ...], runner: int):
        self.phase = phase
        self.task = task
        self.partitions = partitions
        self.types = types
        self.runner = runner
        self.state = _QUEUED
        self.due = 0.0  # when the control thread stops waiting for it (set when posted)


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
        self._lock = threading.Lock()  # a call's state; the mail once farewell runs beside the control thread
        self._spare: ThreadPoolExecutor | None = None  # the listener thread, for calls whose own thread is stuck
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
            late = [c for c in calls if c.state != _DONE]
            if late:
                self.timeouts += len(late)
                for c in late:
                    if self._events is not None:
                        self._events.put("handoff_timeout", task=c.task, partitions=c.partitions, types=c.types)
                tasks = [c.task for c in late]
                log.warning("queue %r: the rebalance listener's initial on_assigned calls for tasks %s took over "
                            "%.1f s; later calls go on", self._name, tasks, self._deadline_s)  # fmt: skip
            self._initial = []
            if self._head is None:
                self._advance()

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
        self._mail.extend(calls)
        if self._head is None and not self._initial:
            self._advance()
        last = calls[-1]
        return lambda: last.state == _DONE or (last not in self._mail and last is not self._head)

    def farewell(self) -> None:
        """After the final drain (its thread, blocking; no task runs): the calls still in the mail, in order, then
        every partition the ledger holds revoked, per task. Ends the listener thread."""
        if not self.active:
            return
        with self._lock:
            left = self._initial + ([self._head] if self._head is not None else []) + list(self._mail)
            self._mail.clear()
            self._head = None
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
        if self._spare is not None:
            self._spare.shutdown(wait=False)

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
        if head is not None and head.state != _DONE:
            with self._lock:
                queued = head.state == _QUEUED
                if queued:
                    head.state = _RUNNING  # claimed for the listener thread: its own thread never reached it
            self.timeouts += 1
            if self._events is not None:
                self._events.put("handoff_timeout", task=head.task, partitions=head.partitions, types=head.types)
            if queued:
                log.warning("queue %r: drain task %d did not reach the listener's %s call in %.1f s; the listener "
                            "thread makes it", self._name, head.runner, head.phase, self._deadline_s)  # fmt: skip
                self._spare_thread().submit(self._call_listener, head)
                head.due = time.monotonic() + self._deadline_s
                self._loop.when(lambda: head.state == _DONE or time.monotonic() >= head.due, self._advance)
                return
            log.warning("queue %r: the rebalance listener's %s call for task %d has run for over %.1f s; the "
                        "handoff goes on without it", self._name, head.phase, head.task, self._deadline_s)  # fmt: skip
        with self._lock:
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

    def _action(self, call: _Call) -> Callable[[Dispatcher, DrainTask], int]:
        def tell(_dispatcher: Dispatcher, _task: DrainTask) -> int:
            self._run(call)
            return 0

        return tell

    def _run(self, call: _Call) -> None:
        """Make ``call`` here unless another thread claimed it."""
        with self._lock:
            if call.state != _QUEUED:
                return
            call.state = _RUNNING
        self._call_listener(call)

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

    def _spare_thread(self) -> ThreadPoolExecutor:
        if self._spare is None:
            self._spare = ThreadPoolExecutor(1, thread_name_prefix=f"drainpipe-{self._name}-listener")
        return self._spare
