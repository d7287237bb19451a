"""The queue's event queue: what happened to it (ownership changes, errors, failovers, timeouts), for an application
to poll, as a Kafka client's background thread hands events to the application through a queue it polls.

::

    drain threads   handler errors, a failed cycle ─┐
    control thread  assigned / revoked / lost,      ├─► EventQueue.put (any thread; never blocks: the oldest is
                    failover, slow call, timeout  ──┘   dropped and counted when full)
    application     BatchQueue.events(timeout) ─► EventQueue.poll: what is there, waiting up to ``timeout`` for the
                                                   first

Optional (``BatchQueueConfig(event_queue_size=N)``; 0, the default, keeps none and costs nothing). The events are
the same the error handler and the rebalance listener get, in the order they were decided; both keep working.

Thread rule: :meth:`EventQueue.put` from any thread, :meth:`EventQueue.poll` from any thread; ``_lock`` guards the
deque, ``dropped`` and the waiting count (errors and ownership changes are the uncommon path: a lock costs nothing
on the produce or drain path, which never puts).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueEvent:
    """One thing that happened to a queue.

    ``kind``: ``assigned`` / ``revoked`` / ``lost`` (ownership: ``task`` gains or loses ``partitions``, holding
    ``types``), ``handler_error`` (a handler raised ``error`` on a batch of ``items`` items of ``types``),
    ``task_failed`` (a drain cycle raised ``error``; the task restarted, handing on what it held), ``slow_call`` (a
    handler call on ``task`` has run past ``slow_handler_ms``), ``failover`` (``task`` is stuck in a call; its
    ``partitions`` fail over), ``handoff_timeout`` (a fence or a listener call passed ``handoff_timeout_ms``). ``at``
    is ``time.time()`` when it was recorded."""

    kind: str
    at: float
    task: int = -1
    partitions: tuple[int, ...] = ()
    types: tuple[type, ...] = ()
    error: BaseException | None = None
    items: int = 0


class EventQueue:
    """A bounded queue of :class:`QueueEvent` (see the module docstring)."""

    def __init__(self, size: int) -> None:
        self._events: deque[QueueEvent] = deque()
        self._size = size
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self.dropped = 0  # events dropped because the queue was full (the oldest go first)

    def put(self, kind: str, **fields: object) -> None:
        """Record an event (any thread, never blocks)."""
        event = QueueEvent(kind, time.time(), **fields)  # type: ignore[arg-type]
        with self._lock:
            if len(self._events) >= self._size:
                self._events.popleft()
                self.dropped += 1
            self._events.append(event)
            self._ready.notify()

    def poll(self, timeout: float | None, max_events: int) -> list[QueueEvent]:
        """Up to ``max_events`` events, oldest first; waits up to ``timeout`` seconds (None: for ever) for the first
        when there is none. Any thread."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while not self._events:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return []
                self._ready.wait(left)
            out: list[QueueEvent] = []
            while self._events and len(out) < max_events:
                out.append(self._events.popleft())
            return out
