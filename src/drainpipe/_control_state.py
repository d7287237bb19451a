"""The states of a queue's control work that forbid other control work, and their checked transitions.

Three subjects have a state of their own; each starts in its first state, and only the transitions drawn here are
allowed (any other is a bug in the caller: it raises ``AssertionError``, on the control thread, where
:mod:`._control_loop` logs it)::

    drain task t    RUNNING ──fail_over(t)──► FAILED_OVER ──rejoin(t)──► RUNNING           (:mod:`._liveness`)
    handler type T  STEADY ──begin_change(T)──► CHANGING ──end_change(T)──► STEADY          (:mod:`._resize`)
    the partitions  IDLE ──begin_shrink()──► DROPPING ──end_shrink()──► IDLE                (:mod:`._resize`)

What each state forbids while it lasts (the rules were ad-hoc flags in the controller: ``_failed``,
``_resizing``, ``_shrinking``; they are the predicates below now, written once):

* a task FAILED_OVER (stuck in one handler call, its other partitions moved to healthy tasks): planning a rebalance
  (its result says ``skipped="failover"``: the partitions are where the failover put them, and a plan would move
  them back onto the stuck task), resizing a ``split="auto"`` type, starting a shrink. The task is no healthy
  target for another task's failover either.
* a type CHANGING (split up, joined, or moved off a partition beyond the count a shrink wants): changing it again
  (the change runs in order with the type's add/remove_handler requests, and one is under way); starting a shrink,
  and dropping the partitions of one already started (a split's new partitions carry no type until it binds them,
  so they would look free to drop).
* the partitions DROPPING (a shrink waits for the owners of the partitions beyond the new count to leave any cycle
  over them): starting another shrink.

Thread rule: only the control thread changes a state or asks the predicates. :meth:`ControlState.failed_over` is
also read by ``stats()`` on any thread: a snapshot of a dict the control thread changes one key at a time.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable


class TaskState(enum.Enum):
    RUNNING = "running"
    FAILED_OVER = "failed over"


class TypeState(enum.Enum):
    STEADY = "steady"
    CHANGING = "changing"


class ShrinkState(enum.Enum):
    IDLE = "idle"
    DROPPING = "dropping"


_ALLOWED: set[tuple[enum.Enum, enum.Enum]] = {
    (TaskState.RUNNING, TaskState.FAILED_OVER),
    (TaskState.FAILED_OVER, TaskState.RUNNING),
    (TypeState.STEADY, TypeState.CHANGING),
    (TypeState.CHANGING, TypeState.STEADY),
    (ShrinkState.IDLE, ShrinkState.DROPPING),
    (ShrinkState.DROPPING, ShrinkState.IDLE),
}


def _check(subject: object, now: enum.Enum, new: enum.Enum) -> None:
    if (now, new) not in _ALLOWED:
        raise AssertionError(f"control state of {subject!r}: {now.value} -> {new.value} is not a transition")


class ControlState:
    """The states of one queue's tasks, types and partition count (see the module docstring). Only subjects out of
    their first state are stored."""

    def __init__(self) -> None:
        self._tasks: dict[int, TaskState] = {}  # FAILED_OVER only
        self._types: dict[Hashable, TypeState] = {}  # CHANGING only
        self._shrink = ShrinkState.IDLE

    # ------------------------------------------------------------------ transitions (control thread)

    def fail_over(self, task: int) -> None:
        _check(f"task {task}", self.task(task), TaskState.FAILED_OVER)
        self._tasks[task] = TaskState.FAILED_OVER

    def rejoin(self, task: int) -> None:
        _check(f"task {task}", self.task(task), TaskState.RUNNING)
        del self._tasks[task]

    def begin_change(self, type_: Hashable) -> None:
        _check(type_, self.type(type_), TypeState.CHANGING)
        self._types[type_] = TypeState.CHANGING

    def end_change(self, type_: Hashable) -> None:
        _check(type_, self.type(type_), TypeState.STEADY)
        del self._types[type_]

    def begin_shrink(self) -> None:
        _check("partitions", self._shrink, ShrinkState.DROPPING)
        self._shrink = ShrinkState.DROPPING

    def end_shrink(self) -> None:
        _check("partitions", self._shrink, ShrinkState.IDLE)
        self._shrink = ShrinkState.IDLE

    # ------------------------------------------------------------------ states

    def task(self, task: int) -> TaskState:
        return self._tasks.get(task, TaskState.RUNNING)

    def type(self, type_: Hashable) -> TypeState:
        return self._types.get(type_, TypeState.STEADY)

    def failed_over(self) -> tuple[int, ...]:
        """The tasks FAILED_OVER now, in order (any thread: a snapshot)."""
        return tuple(sorted(list(self._tasks)))

    # ------------------------------------------------------------------ what the states forbid (control thread)

    def may_plan(self) -> bool:
        """A rebalance may be planned: no task is FAILED_OVER."""
        return not self._tasks

    def may_resize(self) -> bool:
        """``split="auto"`` types may be resized (each only if it is STEADY): no task is FAILED_OVER."""
        return not self._tasks

    def may_start_shrink(self) -> bool:
        """A shrink may start: no task FAILED_OVER, no type CHANGING, the partitions IDLE."""
        return not self._tasks and not self._types and self._shrink is ShrinkState.IDLE

    def may_drop(self) -> bool:
        """A shrink under way may drop its partitions: no type CHANGING."""
        return not self._types
