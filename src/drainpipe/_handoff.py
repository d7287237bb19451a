"""Moving partitions between the drain tasks of one queue, within a deadline.

A partition changes owner with the two-phase handoff of the seed::

    move(moves) ─► revoke: owner[p] = UNOWNED, p in ``moving``         (at once, on the control thread)
                └► fence:  per old owner, a wait until it has left      (:meth:`Handoffs.after_cycle`: a wait the
                           the drain cycle it was in                     control loop polls, never a block)
                └► tell:   the listener hears "revoked" on the old      (:mod:`._listener`: one call at a time)
                           owner's thread, "assigned" on the new one's
                └► assign: owner[p] = new, published, p leaves          (control thread); the new owner is woken
                           ``moving``

Items produced meanwhile stay in the partition and are drained by the new owner. The fence is per old owner: a moved
partition waits only for its own old owner, and a task sleeping in backoff is not in a cycle. A partition in
``moving`` is not moved again until its handoff completes (callers check). A shutdown ends the fences early: the
moves it cut stay in ``moving`` and :meth:`Handoffs.settle_cut` gives them their new owner once every task has
stopped (the final drain empties them). :meth:`Handoffs.take_over` is the one move without a fence: a failover,
whose old owner is stuck in a handler call (:mod:`._liveness` says why that is safe).

Deadline (``handoff_timeout_ms``): a fence not passed by then is rolled back (the partitions go back to their old
owner, which is still inside its cycle and will drain them when it leaves it: no one else took them meanwhile); a
listener call past it is left behind (:mod:`._listener`) and the handoff completes. Either is logged and counted
(``timeouts``). So every partition has an owner again within the deadline, and ``state`` says ``stable`` only when
no partition is in a handoff or unowned.

Thread rule: everything here runs on the control thread, except :meth:`Handoffs.farewell` (on the thread of the
final drain, once nothing else runs). ``state`` and ``timeouts`` are read by ``stats()`` on any thread.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future

from ._control_loop import ControlLoop
from ._drain import DrainTask
from ._events import EventQueue
from ._listener import Events, Move, Teller
from ._partitions import UNOWNED, Partitions
from ._scheduler import Scheduler

log = logging.getLogger("drainpipe.control")


class Handoffs:
    """The ownership moves of one queue's partitions (see the module docstring). ``state`` is
    stable | revoking | fencing | assigning (stats' ``rebalance_state``); ``moving`` maps each partition in a handoff
    to (old owner, new owner): others read it, only this class writes it."""

    def __init__(
        self,
        name: str,
        teller: Teller,
        deadline_s: float,
        *,
        loop: ControlLoop,
        parts: Partitions,
        tasks: list[DrainTask],
        scheduler: Scheduler,
        events: EventQueue | None = None,
    ) -> None:
        self._name = name
        self._events = events
        self._teller = teller
        self._deadline_s = deadline_s
        self._loop = loop
        self._parts = parts
        self._tasks = tasks
        self._scheduler = scheduler
        self._phase = "stable"
        self.moving: dict[int, tuple[int, int]] = {}
        self.past_fence: set[int] = set()  # moving partitions whose old owner has left its cycle (being told)
        self._taken: set[int] = set()  # moving partitions a failover took over: its own, not the move's any more
        self.rolled_back = 0  # fences not passed within the deadline

    @property
    def state(self) -> str:
        """stable | revoking | fencing | assigning: ``stable`` only when no partition is in a handoff or unowned."""
        if self.moving:
            return "assigning" if self._phase == "stable" else self._phase
        n = self._parts.count[0]
        return "assigning" if any(t < 0 for t in self._parts.owner[:n]) else "stable"

    @property
    def timeouts(self) -> int:
        """Fences rolled back and listener calls left behind past the deadline."""
        return self.rolled_back + self._teller.timeouts

    def after_cycle(
        self, tasks: Iterable[int], then: Callable[[], None], abortable: bool,
        expired: Callable[[], None] | None = None,
    ) -> None:  # fmt: skip
        """Run ``then`` once each of ``tasks`` has left the drain cycle it is in now (at once if none is in one).
        An abortable wait also ends when shutdown begins; with ``expired``, the wait ends at the handoff deadline
        too, and ``expired`` runs instead of ``then``. Control thread; never blocks."""
        waiting = self._parts.in_cycle(tasks)
        closing = self._parts.closing
        if expired is None:
            self._loop.when(lambda: self._parts.left(waiting) or (abortable and closing[0]), then)
            return
        due = time.monotonic() + self._deadline_s

        def ready() -> bool:
            return self._parts.left(waiting) or (abortable and closing[0]) or time.monotonic() >= due

        self._loop.when(ready, lambda: then() if not waiting or closing[0] else expired())

    def move(self, moves: Sequence[Move]) -> Future[bool]:
        """Revoke every moved partition now; assign each old owner's share once that owner has left its cycle.
        The Future is True once all are assigned, False if shutdown came first (the rest is left to the final
        drain). Control thread; never blocks."""
        done: Future[bool] = Future()
        self._phase = "revoking"
        groups: dict[int, list[Move]] = {}
        for move in moves:
            p, old, new = move
            self._parts.owner[p] = UNOWNED
            self.moving[p] = (old, new)
            groups.setdefault(old, []).append(move)
        self._phase = "fencing"
        left = [len(groups)]
        whole = [True]  # no group rolled back

        def assign(group: list[Move]) -> None:
            """The old owner has left its cycle: tell the listener (on its own thread), then hand over. Moves a
            failover took over or completed meanwhile (the old owner hung) are not this move's any more."""
            group = self._still(group)
            self.past_fence.update(m[0] for m in group)
            if self._parts.closing[0]:
                handed(group, closing=True)
                return
            events = [("revoked", group), ("assigned", group)]
            self.after_told(events, lambda: handed(group, closing=self._parts.closing[0]))

        def handed(group: list[Move], closing: bool) -> None:
            if not closing:  # cut by shutdown: left in ``moving``, assigned once every task has stopped
                self._phase = "assigning"
                group = self._complete(group)
            self._phase = "fencing" if self.moving else "stable"
            if not closing:
                for t in {new for _, _, new in group}:
                    self._scheduler.wake(self._tasks[t])
            left[0] -= 1
            if left[0] == 0 or closing:
                if not done.done():
                    done.set_result(whole[0] and not closing)

        def roll_back(old: int, group: list[Move]) -> None:
            """The old owner has not left its cycle by the deadline: the partitions go back to it (not those a
            failover took over meanwhile: they are the failover's)."""
            group = self._still(group)
            for p, _, _ in group:
                self._parts.owner[p] = old
                del self.moving[p]
            self._parts.publish()
            self.rolled_back += 1
            whole[0] = False
            if self._events is not None:
                self._events.put("handoff_timeout", task=old, partitions=tuple(m[0] for m in group))
            log.warning("queue %r: drain task %d did not leave its cycle within %.1f s; %d partition(s) stay with "
                        "it", self._name, old, self._deadline_s, len(group))  # fmt: skip
            handed([], closing=False)

        for old, group in groups.items():
            self.after_cycle({old}, functools.partial(assign, group), abortable=True,
                             expired=functools.partial(roll_back, old, group))  # fmt: skip
        return done

    def take_over(self, moves: Sequence[Move]) -> None:
        """Move partitions the caller has revoked already, from a task stuck in a handler call, without waiting for
        its fence (:meth:`._liveness.Liveness.watch` checked that it is inside that call, after revoking). Moves
        that are in ``moving`` already (a handoff from the stuck task under way) complete here. The listener hears
        them "lost", then "assigned"; at shutdown they are left to :meth:`settle_cut`. Control thread."""
        for p, old, new in moves:
            self.moving[p] = (old, new)
            self._taken.add(p)
            self.past_fence.discard(p)
        self._phase = "assigning"

        def assign() -> None:
            if self._parts.closing[0]:
                return
            self._complete(moves, taken=True)
            self._phase = "fencing" if self.moving else "stable"
            for i in {m[2] for m in moves}:
                self._scheduler.wake(self._tasks[i])

        self.after_told([("lost", moves), ("assigned", moves)], assign)

    def _still(self, moves: Sequence[Move], taken: bool = False) -> list[Move]:
        """The moves still in ``moving`` as planned: not completed, redone by another, or (unless ``taken``: the
        failover's own) taken over by a failover."""
        return [m for m in moves if self.moving.get(m[0]) == (m[1], m[2]) and (m[0] in self._taken) == taken]

    def _complete(self, moves: Sequence[Move], taken: bool = False) -> list[Move]:
        """Give the moves still in ``moving`` as planned their new owner (:meth:`_still`), and publish; returns
        those."""
        group = self._still(moves, taken)
        for p, _, new in group:
            self._parts.owner[p] = new
        self._parts.publish()
        for p, _, _ in group:
            del self.moving[p]
            self.past_fence.discard(p)
            self._taken.discard(p)
        return group

    def settle_cut(self) -> None:
        """At shutdown, once no task runs: each partition whose handoff shutdown cut gets its new owner, so that
        every partition has exactly one owner after shutdown (the final drain empties them whoever owns them)."""
        for p, (_, new) in self.moving.items():
            self._parts.owner[p] = new
        self.moving.clear()
        self.past_fence.clear()
        self._taken.clear()
        self._parts.publish()
        self._phase = "stable"

    # ------------------------------------------------------------------ the rebalance listener

    def after_told(self, events: Events, then: Callable[[], None]) -> None:
        """Tell the listener ``events`` (``(phase, moves)``, in order: see :mod:`._listener`), then run ``then`` on
        the control thread, once the calls have returned or passed their deadline. Without a listener, or with
        nothing that changes what it was told, ``then`` runs at once. Never blocks."""
        told = self._teller.tell(events)
        if told is None:
            then()
        else:
            self._loop.when(told, then)

    def farewell(self) -> None:
        """After the final drain (on its thread, blocking): the listener hears every partition revoked, as a Kafka
        consumer's listener does when it closes."""
        self._teller.farewell()
