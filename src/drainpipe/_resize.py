"""The shape of one queue changing under load: ``split="auto"`` types split and joined, adaptive partitions shrunk.

Both run from the controller's periodic tick, on the control thread::

    tick ─► resize_autos() ─ each auto type's measured load, :func:`._autosplit.wanted_instances`, CONFIRM times
       │        in a row ─► change(T): T CHANGING, in turn with T's add/remove_handler requests
       │            ├─ more: _split_up: retired instances first, then free partitions (growing the queue if
       │            │        needed), each handed to a task without one (Handoffs.move); the listener hears them
       │            │        assigned; then producers route to them
       │            └─ fewer: _join: producers stop routing to the last ones at once; each keeps its instance
       │                      until its partition is empty, then gets its final on_idle flush on its owner's thread
       └─► shrink() ─ the policy wants fewer partitions than there are (handlers removed):
                ├─ a type on a partition beyond: change(T) with _rehome (moved to one below by its own owner)
                └─ none left, nothing buffered: DROPPING; once their owners have left any cycle over them, the
                   count drops (Partitions.shrink)

The states a resize and a shrink take (a type CHANGING, the partitions DROPPING) and what they forbid are in
:mod:`._control_state`; a task FAILED_OVER forbids both (its partitions are where the failover put them).

The route table of the C producer is written by the control thread, except one switch a shrink leaves to the drain
task that owns both the old and the new partition of a moving type (:meth:`Resizer._rehome`): only that task can
tell the items of the old partition apart from the new ones, and it hands the old ones on first.

Thread rule: the control thread only, except the steps put on a drain task's ``actions`` (run by that task at the
start of a cycle, on its thread: they read owners and call back to the control thread through the loop).
``resizes`` is read by ``stats()`` on any thread.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

from ._autosplit import CONFIRM, wanted_instances
from ._control_loop import ControlLoop
from ._control_state import ControlState, TypeState
from ._drain import Dispatcher, DrainTask
from ._fastpath import Producer
from ._handlers import Entry, HandlerTable
from ._handoff import Handoffs
from ._load import WARMUP_SAMPLES, LoadEstimate
from ._partitions import UNOWNED, Partitions
from ._policies import PartitionPolicy
from ._requests import Op
from ._scheduler import Scheduler

log = logging.getLogger("drainpipe.control")


class Resizer:
    """Resizes the ``split="auto"`` types and shrinks the adaptive partitions of one queue (see the module
    docstring). ``in_turn(op, serial)`` runs a request in order with the others of its key (:mod:`._requests`)."""

    def __init__(
        self,
        name: str,
        policy: PartitionPolicy,
        *,
        consumer: bool,
        type_routing: bool,
        thread_count: int,
        planned_tasks: int,
        loop: ControlLoop,
        parts: Partitions,
        table: HandlerTable,
        tasks: list[DrainTask],
        scheduler: Scheduler,
        producer: Producer,
        handoffs: Handoffs,
        load: LoadEstimate,
        state: ControlState,
        in_turn: Callable[[Op, Hashable], None],
    ) -> None:
        self._name = name
        self._policy = policy
        self._consumer = consumer
        self._type_routing = type_routing
        self._thread_count = thread_count
        self._planned_tasks = planned_tasks  # the queue's own tasks (a stand-in is not planned on)
        self._loop = loop
        self._parts = parts
        self._table = table
        self._tasks = tasks
        self._scheduler = scheduler
        self._producer = producer
        self._handoffs = handoffs
        self._load = load
        self._state = state
        self._in_turn = in_turn
        self.resizes = 0  # split="auto" resizes started
        self._asked: dict[type, tuple[int, int]] = {}  # auto type -> (instances its load asks for, intervals in a row)

    # ------------------------------------------------------------------ split="auto"

    def resize_autos(self) -> None:
        """Resize each ``split="auto"`` type whose measured load has asked for another instance count
        :data:`CONFIRM` intervals in a row (see :mod:`._autosplit`). Not while a task is failed over."""
        if not self._state.may_resize() or self._parts.closing[0] or self._load.samples < WARMUP_SAMPLES:
            return
        mean = self._load.mean
        total = sum(mean)
        for entry in [e for e in self._table.entries.values() if e.auto]:
            if self._state.type(entry.type) is TypeState.CHANGING:
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
        is CHANGING until it is done."""
        self._state.begin_change(entry.type)
        fut: Future[Any] = Future()
        fut.add_done_callback(functools.partial(self._changed, entry.type))
        self._in_turn((fn, (entry, arg), fut), entry.type)

    def _changed(self, type_: type, _: Future[Any]) -> None:
        # a step of its own, queued as the type's next request is (:mod:`._requests`): a tick between them finds
        # the type still CHANGING
        self._loop.call(lambda: self._state.end_change(type_))

    def _resize(self, entry: Entry, want: int) -> Future[None] | None:
        """Run ``entry`` as ``want`` instances (see :meth:`_split_up` and :meth:`_join`)."""
        if self._table.entries.get(entry.type) is not entry or self._parts.closing[0]:
            return None  # replaced or removed meanwhile
        have = len(entry.partitions)
        log.info("queue %r: %s %s from %d to %d instances", self._name, "splitting" if want > have else "joining",
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
        moving = self._handoffs.moving
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
                if parts.owner[p] != t and p not in moving:
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
            self._handoffs.after_told([("assigned", told)], publish)

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
            self._handoffs.move(moves).add_done_callback(lambda _: self._loop.call(route))
        else:
            route()
        return done

    def _join(self, entry: Entry, want: int) -> None:
        """Fewer instances: producers stop routing to the last ones at once; each retired instance stays bound to
        its partition (a late item is never dropped, and a later split reuses it), handles what is buffered there,
        and once its partition is empty gets its final flush: one ``on_idle()`` call on the thread of the task
        that owns the partition. The partition stays with its owner (no listener event: ownership does not change)."""
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
        return not self._parts.buffers.size(p) and p not in self._handoffs.moving

    def _final_flush(self, entry: Entry, p: int) -> None:
        """A retired instance's partition is empty: its owner calls the instance's on_idle at its next cycle."""
        target = entry.targets.get(p)
        owner = self._parts.owner[p]
        if target is None or p in entry.partitions or owner < 0 or self._table.entries.get(entry.type) is not entry:
            return  # reused by a split, or the handler is gone
        task = self._tasks[owner]

        def flush(dispatcher: Dispatcher, running: DrainTask) -> int:
            """On the owner's thread, at the start of a cycle."""
            if self._parts.owner[p] == running.index:  # moved meanwhile: the new owner flushes it
                dispatcher.flush(target, running.counters)
            else:
                self._loop.call(functools.partial(self._final_flush, entry, p))
            return 0

        task.actions.append(flush)
        self._scheduler.wake(task)

    # ------------------------------------------------------------------ shrinking adaptive partitions

    def shrink(self) -> None:
        """Adaptive partitions follow the handlers: when the policy asks for fewer than there are (handlers
        removed), the types on the partitions beyond move to ones below (:meth:`_rehome`), and once those carry no
        type and hold no item, and their owners have left any cycle over them, the count drops. A split type's
        partitions are not moved: while one sits beyond, the count stays above it. With a custom selector no type
        has a home to move (its items go to any partition the selector picks): the count stays."""
        parts, policy, moving = self._parts, self._policy, self._handoffs.moving
        if self._consumer or not self._type_routing or not policy.is_adaptive or parts.closing[0]:
            return
        if not self._state.may_start_shrink():
            return
        want = max(policy.resolve(self._thread_count, self._table.weighted_count()), self._planned_tasks)
        n = parts.count[0]
        if want >= n or moving:
            return
        beyond = range(want, n)
        entries = {tg.type: self._table.entries.get(tg.type) for p in beyond for tg in parts.targets[p] if tg.type}
        if any(e is None or e.split or e.auto for e in entries.values()):
            return  # a split type, or a removed one's items still to drop: later
        if entries:
            for entry in entries.values():
                assert entry is not None
                if self._state.type(entry.type) is TypeState.STEADY:
                    self._change(entry, self._rehome, want)
            return
        if any(parts.buffers.size(p) for p in beyond):
            return
        self._state.begin_shrink()

        def drop() -> None:
            self._state.end_shrink()
            busy = not self._state.may_drop() or moving
            if not busy and parts.count[0] == n and not any(parts.targets[p] or parts.buffers.size(p) for p in beyond):
                dropped = [(p, parts.owner[p], UNOWNED) for p in beyond]
                parts.shrink(want)
                log.info("queue %r: partitions %d -> %d", self._name, n, want)
                self._handoffs.after_told([("revoked", dropped)], lambda: None)  # on their old owners' threads

        self._handoffs.after_cycle(parts.owners_of(beyond), drop, abortable=True)

    def _rehome(self, entry: Entry, below: int) -> Future[None] | None:
        """Move a plain type from its partition p (beyond ``below``) to the partition below with the fewest types
        owned by p's owner, keeping its order: the owner itself switches the route at the start of a cycle and
        hands on what p holds before anything that arrives in the new partition; once it has, p is unbound."""
        parts, moving = self._parts, self._handoffs.moving
        if self._table.entries.get(entry.type) is not entry or len(entry.partitions) != 1:
            return None  # removed or replaced meanwhile
        (p,) = entry.partitions
        owner = parts.owner[p]
        if owner < 0 or p in moving or p < below:
            return None
        mine = [q for q in range(below) if parts.owner[q] == owner and q not in moving]
        if not mine:  # the owner has no partition below: one comes to it first (empty or not: a handoff)
            q = min(range(below), key=lambda q: (parts.type_count[q], q))
            if q not in moving:
                self._handoffs.move([(q, parts.owner[q], owner)])
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
            with parts.conds[p]:  # producers waiting for room in p read the route under this lock (_put_rest)
                self._producer.set_route(entry.type, q)
                parts.moved_off[p] += 1
                items = parts.buffers.take(p)
                parts.conds[p].notify_all()
            found = dispatcher.dispatch([(p, items)], task.counters) if items is not None else 0
            self._loop.call(lambda: self._handoffs.after_cycle({task.index}, unbind, abortable=False))
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
