"""The control thread of the process: every queue's control work, one step at a time, and nothing ever blocking it.

One daemon thread, ``drainpipe-control``, serves every queue (:mod:`._control` keeps each queue's state). It runs
three kinds of work, in this order on each turn of its loop:

* *steps* (:meth:`ControlLoop.call`, from any thread): short functions, run one at a time in arrival order;
* *timers* (:meth:`ControlLoop.at`): steps due at a time (periodic rebalancing, liveness checks);
* *waits* (:meth:`ControlLoop.when`): a condition (a drain task has left its cycle; the tasks have finished) and the
  step to run once it holds. The thread polls them, every 50 us at first and backing off to 1 ms, then to 20 ms for a
  wait older than half a second (a stuck handler). A wait costs nothing to the steps behind it: this is what lets
  one queue's stuck handler hold up only the steps that wait for that very drain task.

The steps wait in a :class:`queue.Queue`, not a ``queue.SimpleQueue``: CPython's ``SimpleQueue.get(timeout=...)``
can block for ever. When it takes its lock without waiting (a ``put`` released it while nobody waited) and finds the
queue still empty, it recomputes the time left; if the deadline passed meanwhile (the thread was preempted for
longer than the timeout, easy with this loop's 50 us polls on a busy machine) the negative time left means "wait
for ever", and only the next ``put`` wakes it. Every wait and timer of every queue then stood still: a queue's
``remove_handler`` never returned, its control thread asleep with its timers 24 s overdue. ``Queue.get`` stops at
its deadline (:func:`new_step_queue`; ``tests/queue/test_control_loop.py`` shows the difference).

The thread is started by the first queue (:func:`acquire`) and stops when the last one has released it. A step that
raises is logged and the loop goes on; steps own their Futures and must settle them.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue as _queue_mod
import threading
import time
from collections.abc import Callable

log = logging.getLogger("drainpipe.control")

Step = Callable[[], None]

_FIRST_POLL = 0.00005
_YOUNG_POLL = 0.001
_OLD_POLL = 0.02
_YOUNG_S = 0.5


class ControlLoop:
    """The shared control thread (see the module docstring). ``call`` is thread-safe; ``at`` and ``when`` are for
    steps already running on this thread."""

    def __init__(self) -> None:
        self._steps = new_step_queue()
        self._timers: list[tuple[float, int, Step]] = []
        self._waits: list[tuple[float, Callable[[], bool], Step]] = []  # (registered at, ready, then)
        self._seq = itertools.count()
        self._poll = _FIRST_POLL
        self._thread = threading.Thread(target=self._run, name="drainpipe-control", daemon=True)
        self._thread.start()

    def call(self, step: Step) -> None:
        """Run ``step`` on the control thread after the steps already queued. Thread-safe, never blocks."""
        self._steps.put(step)

    def at(self, delay: float, step: Step) -> None:
        """Run ``step`` on the control thread ``delay`` seconds from now (control thread only)."""
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._seq), step))

    def when(self, ready: Callable[[], bool], then: Step) -> None:
        """Run ``then`` as soon as ``ready()`` is true: now, if it is (control thread only)."""
        if ready():
            then()
            return
        self._waits.append((time.monotonic(), ready, then))
        self._poll = _FIRST_POLL

    def owns_current_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def stop(self) -> None:
        """Let the thread finish the steps queued so far, then end (thread-safe)."""
        self._steps.put(None)

    def join(self) -> None:
        if not self.owns_current_thread():
            self._thread.join()

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        while True:
            try:
                step = self._steps.get(timeout=self._timeout())
            except _queue_mod.Empty:
                step = _nothing
            if step is None:
                return
            self._safely(step)
            self._idle()

    def _timeout(self) -> float | None:
        timeout = None
        if self._timers:
            timeout = max(0.0, self._timers[0][0] - time.monotonic())
        if self._waits:
            timeout = self._poll if timeout is None else min(timeout, self._poll)
        return timeout

    def _idle(self) -> None:
        """Run the timers that are due, and the waits whose condition holds."""
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            self._safely(heapq.heappop(self._timers)[2])
        if not self._waits:
            return
        waits, self._waits = self._waits, []
        for wait in waits:
            _, ready, then = wait
            try:
                done = ready()
            except Exception:
                log.exception("control wait failed; dropped")
                continue
            if done:
                self._safely(then)
            else:
                self._waits.append(wait)
        young = any(now - since < _YOUNG_S for since, _, _ in self._waits)
        self._poll = min(self._poll * 2, _YOUNG_POLL if young else _OLD_POLL)

    @staticmethod
    def _safely(step: Step) -> None:
        try:
            step()
        except Exception:
            log.exception("control step failed")


def new_step_queue() -> _queue_mod.Queue[Step | None]:
    """The queue the control thread takes its steps from: one whose ``get(timeout=...)`` returns by its deadline
    (the module docstring says why not a ``SimpleQueue``)."""
    return _queue_mod.Queue()


def _nothing() -> None:
    pass


class _Registry:
    """The one control loop, started by the first queue and stopped when the last one releases it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: ControlLoop | None = None
        self._refs = 0

    def acquire(self) -> ControlLoop:
        with self._lock:
            if self._loop is None:
                self._loop = ControlLoop()
            self._refs += 1
            return self._loop

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            if self._refs > 0 or self._loop is None:
                return
            loop, self._loop = self._loop, None
        loop.stop()


control_loops = _Registry()
