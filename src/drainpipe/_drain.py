"""Drain tasks and dispatch: take whole partitions, group them by type, call the handlers.

A :class:`DrainTask` runs on one scheduler thread at a time. Each cycle it marks itself inside a cycle in
``Partitions.epoch`` (odd), takes every partition it owns (``Buffers.take``: O(1), each item leaves exactly once)
and hands the items to the :class:`Dispatcher`. The task knows nothing of the queue: it gets the dispatcher, its
partitions and the idle delays, as a worker of ``concurrent.futures.thread`` gets only its work queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from ._events import EventQueue
from ._fastpath import group_by_type
from ._handlers import HandlerTable, Target
from ._partitions import Partitions

_SLICE_S = 0.05  # a busy task yields to the scheduler after this long (fairness on shared pools)
_SMALL_BATCH = 64  # a cycle that found fewer items than this waits min_idle_ms before the next,
_PER_CALL = 16  # as does one that averaged fewer items than this per handler call

#: ``on_drain_thread.queue`` is the queue whose handler this thread is running (None elsewhere): a control call
#: made from a handler must not wait for the control thread, which may be fencing this very thread.
on_drain_thread = threading.local()


class Counters:
    """Counters written by a single thread (one drain task, or the thread of the final drain), and what
    that thread holds in its hands during a cycle: items taken from a partition but not yet handed to a handler
    (so that a cycle that fails can hand them on instead of dropping them)."""

    __slots__ = ("dispatched", "errors", "no_handler", "last_calls", "restarts", "lost", "calling", "calls",
                 "hand", "next_run", "merged", "parts")  # fmt: skip

    def __init__(self) -> None:
        self.last_calls = 0  # handler calls of the latest cycle
        self.dispatched = 0
        self.errors = 0
        self.no_handler = 0
        self.restarts = 0  # cycles that raised (the task was restarted)
        self.lost = 0  # items a failed cycle had taken and that could not be handed on even then
        # the handler call in progress (the Target for consume, (Target, "on_idle") for on_idle) and a count of
        # calls that tells one call from the next: the control thread's liveness check reads both without a lock
        # and times the call itself, so the hot path pays two stores and an increment, no clock
        self.calling: Target | tuple[Target, str] | None = None
        self.calls = 0
        self.clear_hands()

    def clear_hands(self) -> None:
        # (partition, its items as taken, the items grouped by type or None before grouping)
        self.hand: tuple[int, list[Any], list[tuple[type, list[Any]]] | None] | None = None
        self.next_run = 0  # set on failure: the runs before this one were handed on
        self.merged: dict[Target, list[Any]] | None = None  # merged batches not yet handed on (other selectors)
        self.parts: list[list[Any]] | None = None  # the consumer's items, taken


class Dispatcher:
    """Hands taken items to the consumer, or by exact type to the handler instances of ``table``."""

    def __init__(
        self,
        name: str,
        parts: Partitions,
        table: HandlerTable,
        consumer: Target | None,
        type_routing: bool,
        error_handler: Callable[[list[Any], BaseException], None] | None,
        log: logging.Logger,
        owner: object,
        events: EventQueue | None = None,
    ) -> None:
        self._name = name
        self._events = events  # the queue's event queue, if it keeps one
        self._parts = parts
        self._table = table
        self._consumer = consumer
        self._type_routing = type_routing
        self._error_handler = error_handler
        self._log = log
        self._owner = owner  # the queue, as recorded in on_drain_thread
        self.final = Counters()

    def cycle(self, task: DrainTask) -> int:
        """One drain cycle of ``task``: run the actions the control thread left for it, take everything it owns,
        dispatch it; on_idle when there was nothing."""
        t = task.index
        epoch = self._parts.epoch
        epoch[t] += 1  # odd: inside a cycle (published before any ownership read)
        try:
            if task.stopped:
                return 0
            found = 0
            while task.actions:  # rare: a partition's type moving within this task, a retired instance's flush
                found += task.actions.popleft()(self, task)
            found += self.dispatch(self._parts.take_owned(t), task.counters)
            if not found:
                self._idle(t, task.counters)
            return found
        except BaseException as exc:
            # what the cycle held is handed on inside the cycle: a handoff's fence waits for this task until it is
            # done (after the epoch went even, a new owner could call the same handler while recover is in it)
            self.recover(task.counters, exc, t)
            raise
        finally:
            epoch[t] += 1

    def dispatch(self, drained: Iterable[tuple[int, list[Any]]], counters: Counters) -> int:
        """Hand drained items to the consumer, or group them by exact type: one call per handler instance.

        With type_hash routing every handler instance serves one partition, so a partition's groups are dispatched
        as soon as it is taken (its batches die young, before the cyclic GC walks them again and again). With
        other selectors a type may sit in several partitions: its batches are merged over the cycle first.

        What has been taken and not yet handed on is recorded in ``counters`` (see :meth:`recover`).
        """
        if self._consumer is not None:
            parts = counters.parts = []
            for _, taken in drained:
                parts.append(taken)
            if not parts:
                counters.parts = None
                return 0
            batch = parts[0] if len(parts) == 1 else [x for taken in parts for x in taken]
            counters.parts = [batch]
            self._invoke(self._consumer, batch, counters)
            counters.parts = None
            return len(batch)
        entries = self._table.entries
        merge: dict[Target, list[Any]] | None = None if self._type_routing else {}
        counters.merged = merge
        total = calls = 0
        # What this thread holds is kept in locals (free on the happy path) and recorded only if something raises
        p, i = -1, 0
        items: list[Any] | None = None
        runs: list[tuple[type, list[Any]]] | None = None
        try:
            for p, items in drained:
                runs = None
                total += len(items)
                runs = group_by_type(items)
                i = 0
                for typ, run in runs:
                    entry = entries.get(typ)
                    target = None if entry is None else entry.target(p)
                    if target is None:
                        counters.no_handler += len(run)
                        self._table.warn_no_handler(typ)
                    elif merge is None:
                        self._invoke(target, run, counters)
                        calls += 1
                    else:
                        pending = merge.get(target)
                        if pending is None:
                            merge[target] = run
                        else:
                            pending.extend(run)
                    i += 1
                items = None  # this partition is handed on (or merged)
        except BaseException:
            # the partition in hand: all of it (grouping failed), or its runs from the one that failed on
            counters.hand = None if items is None else (p, items, runs)
            counters.next_run = i
            raise
        if merge:
            while merge:  # each batch leaves the record just before it is handed on
                target = next(iter(merge))
                self._invoke(target, merge.pop(target), counters)
                calls += 1
        counters.merged = None
        counters.last_calls = calls
        return total

    def recover(self, counters: Counters, exc: BaseException, task: int) -> None:
        """After a cycle raised: hand on what the task had taken and not yet handed on (grouped again in plain
        Python, in case the fast path was what failed). What cannot be handed on even then is counted as lost and
        logged: nothing vanishes. Runs on the failed task's own thread, so no handler runs twice at once."""
        counters.restarts += 1
        left: list[tuple[Target | None, int, list[Any]]] = []
        if counters.hand is not None:
            p, taken, runs = counters.hand
            if runs is not None:
                left += [(None, p, run) for _, run in runs[counters.next_run :]]
            else:
                left.append((None, p, taken))
        if counters.merged:
            left += [(target, -1, batch) for target, batch in counters.merged.items()]
        if counters.parts and self._consumer is not None:
            left += [(self._consumer, -1, items) for items in counters.parts]
        counters.clear_hands()
        held = sum(len(items) for _, _, items in left)
        self._log.error("queue %r: drain task %d failed (%r); restarted, handing on the %d item(s) it held",
                        self._name, task, exc, held, exc_info=exc)  # fmt: skip
        if self._events is not None:
            self._events.put("task_failed", task=task, error=exc, items=held)
        try:
            for target, p, items in left:
                if target is not None:
                    self._invoke(target, items, counters)
                    held -= len(items)
                    continue
                by_type: dict[type, list[Any]] = {}
                for x in items:
                    by_type.setdefault(type(x), []).append(x)
                for typ, run in by_type.items():
                    entry = self._table.entries.get(typ)
                    handler = None if entry is None else entry.target(p)
                    if handler is None:
                        counters.no_handler += len(run)
                    else:
                        self._invoke(handler, run, counters)
                    held -= len(run)
        except BaseException as again:
            counters.lost += held
            self._log.error("queue %r: %d item(s) lost: drain task %d could not hand them on (%r)",
                            self._name, held, task, again)  # fmt: skip

    def final_drain(self) -> None:
        """Dispatch everything still buffered, once (a scheduler thread, after every drain task has stopped).

        ``closing`` was set before this runs, and the C fast path never appends once it is set, so nothing can
        arrive after the take. Dispatch holds no lock, so a handler may call ``shutdown()`` without deadlocking.
        """
        drained = self._parts.take_all()
        if drained:
            on_drain_thread.queue = self._owner
            try:
                if self._consumer is not None:  # one call; every part is recorded before it
                    self._dispatch_or_recover(drained)
                else:  # one partition at a time: everything is taken already, a failure must not skip the rest
                    for part in drained:
                        self._dispatch_or_recover([part])
            finally:
                on_drain_thread.queue = None

    def has_items(self, t: int) -> bool:
        """Whether a partition task ``t`` owns holds items now."""
        return self._parts.has_items(t)

    def set_idle(self, t: int, idle: bool) -> None:
        """Task ``t`` backs off idle (producers wake it), or is busy again."""
        self._parts.idle[t] = idle

    def _dispatch_or_recover(self, drained: list[tuple[int, list[Any]]]) -> None:
        try:
            self.dispatch(drained, self.final)
        except BaseException as exc:
            self.recover(self.final, exc, -1)

    def _invoke(self, target: Target, batch: list[Any], counters: Counters) -> None:
        counters.dispatched += len(batch)
        counters.calls += 1
        counters.calling = target
        try:
            if target.lock is None:
                target.consume(batch)
            else:
                with target.lock:
                    target.consume(batch)
        except BaseException as exc:  # the queue survives any handler error
            counters.errors += 1
            self._report_error(batch, exc)
        finally:
            counters.calling = None

    def _report_error(self, batch: list[Any], exc: BaseException) -> None:
        if self._events is not None:
            self._events.put("handler_error", types=tuple(dict.fromkeys(map(type, batch))), error=exc, items=len(batch))
        handler = self._error_handler
        if handler is None:
            self._log.error("queue %r: handler failed on %d items: %r", self._name, len(batch), exc, exc_info=exc)
            return
        try:
            handler(batch, exc)
        except BaseException:
            self._log.exception("queue %r: error_handler failed", self._name)

    def _idle(self, t: int, counters: Counters) -> None:
        """on_idle of the consumer, or of each handler on a partition this task owns. Ownership is checked again
        before each call: a failover may take a partition from this task while it is inside an earlier on_idle."""
        if self._consumer is not None:
            self._idle_call(self._consumer, counters)
            return
        owner = self._parts.owner
        for p, target in self._parts.owned_targets(t):
            if owner[p] == t:
                self._idle_call(target, counters)

    def flush(self, target: Target, counters: Counters) -> None:
        """Call ``target``'s on_idle now (a retired instance's final flush), on the thread of the task that owns its
        partition."""
        self._idle_call(target, counters)

    def _idle_call(self, target: Target, counters: Counters) -> None:
        if target.on_idle is None:
            return
        counters.calls += 1
        counters.calling = (target, "on_idle")
        try:
            if target.lock is None:
                target.on_idle()
            else:
                with target.lock:
                    target.on_idle()
        except BaseException as exc:
            self._report_error([], exc)
        finally:
            counters.calling = None


class DrainTask:
    """One drain task: runs cycles until its partitions are empty, then backs off (``run`` returns the delay)."""

    def __init__(self, index: int, dispatcher: Dispatcher, idle_ms: tuple[int, int], owner: object) -> None:
        self.index = index
        self._dispatcher = dispatcher
        self._min_idle_ms, self._max_idle_ms = idle_ms
        self._owner = owner
        self.idle = 0  # empty cycles in a row (the backoff exponent); > 0: producers wake this task
        self.counters = Counters()
        self.stopped = False  # hard stop: no new cycle starts
        self.drain_then_stop = False  # shutdown: run until empty, then finish
        # work the control thread leaves for this task's own thread, run at the start of its next cycle:
        # ``action(dispatcher, task) -> items dispatched`` (the control thread appends, this task pops)
        self.actions: deque[Callable[[Dispatcher, DrainTask], int]] = deque()
        self.finished = threading.Event()

    def sibling(self, index: int) -> DrainTask:
        """A new task of the same queue with the same idle delays (a stand-in for a hung task)."""
        return DrainTask(index, self._dispatcher, (self._min_idle_ms, self._max_idle_ms), self._owner)

    def run(self) -> float | None:
        cycle = self._dispatcher.cycle
        on_drain_thread.queue = self._owner
        try:
            deadline = time.monotonic() + _SLICE_S
            while not self.stopped:
                try:
                    found = cycle(self)
                except BaseException:  # supervision (what it held was handed on inside the cycle): the same task,
                    return 0.0  # in the same slot, at once
                if not found:
                    break  # empty: back off
                if self.drain_then_stop:
                    continue  # shutdown: empty the partitions at full speed
                if self.idle:
                    self.idle = 0  # any data resets the idle backoff
                    self._dispatcher.set_idle(self.index, False)  # (a waking producer may have lowered it)
                if found < max(_SMALL_BATCH, _PER_CALL * self.counters.last_calls):
                    # A trickle (few items, or few per handler call) costs more in per-cycle overhead and GIL
                    # hand-offs than it moves: wait min_idle_ms so the next batch is bigger (at most one cycle per
                    # min_idle_ms; latency stays about min_idle_ms). Producers do not cut this wait short.
                    return self._min_idle_ms / 1000.0
                if time.monotonic() > deadline:
                    return 0.0
            if self.stopped or self.drain_then_stop:
                self.finished.set()
                return None
            # Empty: back off, min_idle_ms * 2**k up to max_idle_ms (the API's contract for on_idle). A producer
            # that puts the first item into an empty partition of this task wakes it (BatchQueue._wake_owner), so
            # the first item after a pause waits for no backoff, and an idle queue still costs almost nothing.
            self._dispatcher.set_idle(self.index, True)  # from here on the first producer wakes this task
            self.idle += 1
            if self._dispatcher.has_items(self.index):  # arrived after the take, before the flag was up: the
                return 0.0  # producer did not wake us
            return self._delay(self.idle - 1)
        finally:
            on_drain_thread.queue = None

    def _delay(self, exponent: int) -> float:
        """min(min_idle_ms * 2**exponent, max_idle_ms), in seconds."""
        return min(self._min_idle_ms * (1 << min(exponent, 30)), self._max_idle_ms) / 1000.0
