"""Moving partitions between the drain tasks of one queue, and telling the rebalance listener.

A partition changes owner with the two-phase handoff of the seed::

    move(moves) ─► revoke: owner[p] = UNOWNED, p in ``moving``         (at once, on the control thread)
                └► fence:  per old owner, a wait until it has left      (:meth:`Handoffs.after_cycle`: a wait the
                           the drain cycle it was in                     control loop polls, never a block)
                └► tell:   the listener hears "revoked", "assigned"     (on the queue's listener thread)
                └► assign: owner[p] = new, published, p leaves          (control thread); the new owner is woken
                           ``moving``

Items produced meanwhile stay in the partition and are drained by the new owner. The fence is per old owner: a moved
partition waits only for its own old owner, and a task sleeping in backoff is not in a cycle. A partition in
``moving`` is not moved again until its handoff completes (callers check). A shutdown ends the fences early: the
moves it cut stay in ``moving`` and :meth:`Handoffs.settle_cut` gives them their new owner once every task has
stopped (the final drain empties them). :meth:`Handoffs.take_over` is the one move without a fence: a failover,
whose old owner is stuck in a handler call (:mod:`._liveness` says why that is safe).

The listener (``config.rebalance_listener``) is told on a thread of the queue's own, started with the first event,
so that a slow listener holds up this queue's handoffs only, never the control thread that every queue shares.

Thread rule: everything here runs on the control thread, except :meth:`Handoffs.farewell` (on the thread of the
final drain, once nothing else runs) and the listener's callbacks (on the listener thread). ``state`` is read by
``stats()`` on any thread (a str, replaced whole).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ._control_loop import ControlLoop
from ._drain import DrainTask
from ._partitions import UNOWNED, Partitions
from ._scheduler import Scheduler

log = logging.getLogger("drainpipe.control")

Move = tuple[int, int, int]  # (partition, old owner, new owner)
Events = Sequence[tuple[str, Sequence[Move]]]  # (phase, moves): "revoked", "lost", "assigned"


class Handoffs:
    """The ownership moves of one queue's partitions (see the module docstring). ``state`` is
    stable | revoking | fencing | assigning (stats' ``rebalance_state``); ``moving`` maps each partition in a handoff
    to (old owner, new owner): others read it, only this class writes it."""

    def __init__(
        self,
        name: str,
        listener: Any,
        *,
        loop: ControlLoop,
        parts: Partitions,
        tasks: list[DrainTask],
        scheduler: Scheduler,
    ) -> None:
        self._name = name
        self._listener = listener
        self._loop = loop
        self._parts = parts
        self._tasks = tasks
        self._scheduler = scheduler
        self.state = "stable"
        self.moving: dict[int, tuple[int, int]] = {}
        self._listener_thread: ThreadPoolExecutor | None = None  # started with the first event to tell

    def after_cycle(self, tasks: Iterable[int], then: Callable[[], None], abortable: bool) -> None:
        """Run ``then`` once each of ``tasks`` has left the drain cycle it is in now (at once if none is in one).
        An abortable wait also ends when shutdown begins. Control thread; never blocks."""
        waiting = self._parts.in_cycle(tasks)
        closing = self._parts.closing
        self._loop.when(lambda: self._parts.left(waiting) or (abortable and closing[0]), then)

    def move(self, moves: Sequence[Move]) -> Future[bool]:
        """Revoke every moved partition now; assign each old owner's share once that owner has left its cycle.
        The Future is True once all are assigned, False if shutdown came first (the rest is left to the final
        drain). Control thread; never blocks."""
        done: Future[bool] = Future()
        self.state = "revoking"
        groups: dict[int, list[Move]] = {}
        for move in moves:
            p, old, new = move
            self._parts.owner[p] = UNOWNED
            self.moving[p] = (old, new)
            groups.setdefault(old, []).append(move)
        self.state = "fencing"
        left = [len(groups)]

        def assign(group: list[Move]) -> None:
            """The old owner has left its cycle: tell the listener (on its own thread), then hand over. Moves a
            failover completed meanwhile (the old owner hung) are done already."""
            group = [m for m in group if self.moving.get(m[0]) == (m[1], m[2])]
            if self._parts.closing[0]:
                handed(group, closing=True)
                return
            events = [("revoked", group), ("assigned", group)]
            self.after_told(events, lambda: handed(group, closing=self._parts.closing[0]))

        def handed(group: list[Move], closing: bool) -> None:
            if not closing:  # cut by shutdown: left in ``moving``, assigned once every task has stopped
                self.state = "assigning"
                group = self._complete(group)
            self.state = "fencing" if self.moving else "stable"
            if not closing:
                for t in {new for _, _, new in group}:
                    self._scheduler.wake(self._tasks[t])
            left[0] -= 1
            if left[0] == 0 or closing:
                if not done.done():
                    done.set_result(not closing)

        for old, group in groups.items():
            self.after_cycle({old}, functools.partial(assign, group), abortable=True)
        return done

    def take_over(self, moves: Sequence[Move]) -> None:
        """Move partitions the caller has revoked already, from a task stuck in a handler call, without waiting for
        its fence (:meth:`._liveness.Liveness.watch` checked that it is inside that call, after revoking). Moves
        that are in ``moving`` already (a handoff from the stuck task under way) complete here. The listener hears
        them "lost", then "assigned"; at shutdown they are left to :meth:`settle_cut`. Control thread."""
        for p, old, new in moves:
            self.moving[p] = (old, new)

        def assign() -> None:
            if self._parts.closing[0]:
                return
            self._complete(moves)
            self.state = "fencing" if self.moving else "stable"
            for i in {m[2] for m in moves}:
                self._scheduler.wake(self._tasks[i])

        self.after_told([("lost", moves), ("assigned", moves)], assign)

    def _complete(self, moves: Sequence[Move]) -> list[Move]:
        """Give the moves still in ``moving`` as planned (not completed or redone by another) their new owner, and
        publish; returns those."""
        group = [m for m in moves if self.moving.get(m[0]) == (m[1], m[2])]
        for p, _, new in group:
            self._parts.owner[p] = new
        self._parts.publish()
        for p, _, _ in group:
            del self.moving[p]
        return group

    def settle_cut(self) -> None:
        """At shutdown, once no task runs: each partition whose handoff shutdown cut gets its new owner, so that
        every partition has exactly one owner after shutdown (the final drain empties them whoever owns them)."""
        for p, (_, new) in self.moving.items():
            self._parts.owner[p] = new
        self.moving.clear()
        self._parts.publish()
        self.state = "stable"

    # ------------------------------------------------------------------ the rebalance listener

    def after_told(self, events: Events, then: Callable[[], None]) -> None:
        """Tell the listener ``events`` (``(phase, moves)``: "revoked" and "lost" per old owner, "assigned" per new
        owner) in order on the queue's listener thread, then run ``then`` on the control thread. A slow listener
        thus holds up this queue's handoffs only, never the control thread (other queues' work). Without a
        listener, or with nothing to tell, ``then`` runs at once."""
        listener = self._listener
        if listener is None or not any(moves for _, moves in events):
            then()
            return
        told = self._executor().submit(self._tell, listener, [(ph, list(m)) for ph, m in events if m])
        self._loop.when(told.done, then)

    def farewell(self) -> None:
        """After the final drain (on its thread, blocking): the listener hears each task's partitions revoked, as a
        Kafka consumer's listener does when it closes, and its thread ends."""
        if self._listener is not None:
            owned = [(p, t, UNOWNED) for p, t in enumerate(self._parts.owner) if t >= 0]
            self._executor().submit(self._tell, self._listener, [("revoked", owned)]).result()
        if self._listener_thread is not None:
            self._listener_thread.shutdown(wait=True)

    def _executor(self) -> ThreadPoolExecutor:
        """The queue's listener thread, started with the first event to tell."""
        if self._listener_thread is None:
            self._listener_thread = ThreadPoolExecutor(1, thread_name_prefix=f"drainpipe-{self._name}-listener")
        return self._listener_thread

    def _tell(self, listener: Any, events: list[tuple[str, list[Move]]]) -> None:
        """On the listener thread: each event's callback per task, with its partitions and their types. A callback
        that raises is logged; the others are still called."""
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
                    log.exception("queue %r: rebalance listener failed in %s", self._name, callback.__name__)
