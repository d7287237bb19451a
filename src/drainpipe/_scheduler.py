"""Drain schedulers: a pool of daemon threads that runs drain tasks, each after its own backoff delay.

A dedicated scheduler belongs to one queue (one thread per drain task). A named shared scheduler is created on first
use, reference-counted, and shut down when its last queue releases it; each queue puts one drain task on it.

A task is any object with ``run() -> float | None``: the delay in seconds before it runs again, or None when it is
finished. A task is never run by two threads at once (it is out of the timer heap while it runs).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Protocol

from ._policies import ThreadPolicy

log = logging.getLogger("drainpipe.scheduler")


class Task(Protocol):
    def run(self) -> float | None: ...


class _Lane:
    """A timer heap and the condition its threads wait on."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.heap: list[tuple[float, int, Task]] = []
        self.due: dict[int, float] = {}  # id(task) -> due time of its live heap entry (absent while it runs)
        self.woken: set[int] = set()  # tasks woken while they ran: they run again at once


class Scheduler:
    """Daemon threads named ``drainpipe-<name>-<n>`` running tasks from timer heaps ("lanes"). Thread-safe.

    ``pinned=True`` (a dedicated scheduler) gives every thread its own lane, and the n-th submitted task goes to
    the n-th lane: drain task i always runs on thread i. Otherwise (a shared scheduler) all threads serve one lane.
    """

    def __init__(self, name: str, threads: int, pinned: bool = False) -> None:
        self.name = name
        self._pinned = pinned
        self._lanes = [_Lane() for _ in range(threads if pinned else 1)]
        self._lane_of: dict[int, _Lane] = {}
        self._submitted = itertools.count()
        self._seq = itertools.count()
        self._closed = False
        self._threads = [
            threading.Thread(
                target=self._work, args=(self._lanes[i % len(self._lanes)],), name=f"drainpipe-{name}-{i}", daemon=True
            )
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    def submit(self, task: Task, delay: float = 0.0) -> None:
        lane = self._lanes[next(self._submitted) % len(self._lanes)]
        self._lane_of[id(task)] = lane
        with lane.cond:
            self._push(lane, task, time.monotonic() + delay)

    def submit_extra(self, task: Task) -> None:
        """Run ``task`` besides the others: on a thread of its own that this scheduler starts (a pinned scheduler:
        its threads are the queue's drain tasks, and the one a stand-in replaces is stuck), or on the shared
        threads. The thread ends with the scheduler."""
        if not self._pinned:
            self.submit(task)
            return
        lane = _Lane()
        self._lanes.append(lane)
        thread = threading.Thread(
            target=self._work, args=(lane,), name=f"drainpipe-{self.name}-{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        self._lane_of[id(task)] = lane
        thread.start()
        with lane.cond:
            self._push(lane, task, time.monotonic())

    def wake(self, task: Task) -> None:
        """Run ``task`` as soon as a thread is free if it is waiting in backoff; if it is running, run it again as
        soon as this run ends, whatever delay it asks for (what woke it arrived after it looked)."""
        lane = self._lane_of.get(id(task))
        if lane is None:
            return
        with lane.cond:
            due = lane.due.get(id(task))
            if due is None:
                lane.woken.add(id(task))
            elif due > time.monotonic():
                self._push(lane, task, 0.0)

    def _push(self, lane: _Lane, task: Task, due: float) -> None:
        lane.due[id(task)] = due
        heapq.heappush(lane.heap, (due, next(self._seq), task))
        lane.cond.notify()

    def _next(self, lane: _Lane) -> Task | None:
        with lane.cond:
            while True:
                if self._closed:
                    return None
                if not lane.heap:
                    lane.cond.wait()
                    continue
                due, _, cand = lane.heap[0]
                if lane.due.get(id(cand)) != due:  # stale entry (woken early, or finished)
                    heapq.heappop(lane.heap)
                    continue
                wait = due - time.monotonic()
                if wait > 0:
                    lane.cond.wait(wait)
                    continue
                heapq.heappop(lane.heap)
                del lane.due[id(cand)]
                return cand

    def _work(self, lane: _Lane) -> None:
        while (task := self._next(lane)) is not None:
            try:
                delay = task.run()
            except BaseException:  # a task must never kill a pool thread, nor be dropped (its partitions would
                log.exception("drain task raised out of run(); running it again in 0.1 s")  # keep a dead owner)
                delay = 0.1
            if delay is None:
                self._lane_of.pop(id(task), None)
                with lane.cond:
                    lane.woken.discard(id(task))
                continue
            with lane.cond:
                if id(task) in lane.woken:
                    lane.woken.discard(id(task))
                    delay = 0.0
                if not self._closed:
                    self._push(lane, task, time.monotonic() + delay)

    def owns_current_thread(self) -> bool:
        """Whether the calling thread is one of this scheduler's threads."""
        return threading.current_thread() in self._threads

    def shutdown(self, wait: bool = True) -> None:
        """Stop the threads once their current task returns; ``wait``: join them (see :meth:`join`)."""
        self._closed = True
        for lane in self._lanes:
            with lane.cond:
                lane.cond.notify_all()
        if wait:
            self.join()

    def join(self) -> None:
        """Wait for the threads of a shut-down scheduler to end (the calling thread excepted); no-op before."""
        if not self._closed:
            return
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:
                t.join()


class _SharedRegistry:
    """Named shared schedulers, created on first use and reference-counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pools: dict[str, tuple[Scheduler, ThreadPolicy, int]] = {}

    def acquire(self, name: str, policy: ThreadPolicy) -> Scheduler:
        with self._lock:
            entry = self._pools.get(name)
            if entry is None:
                sched = Scheduler(name, policy.resolve())
                self._pools[name] = (sched, policy, 1)
                return sched
            sched, first, refs = entry
            if first != policy:
                log.warning("shared scheduler %r already exists with %s; ignoring %s", name, first, policy)
            self._pools[name] = (sched, first, refs + 1)
            return sched

    def release(self, name: str) -> None:
        with self._lock:
            entry = self._pools.get(name)
            if entry is None:
                return
            sched, policy, refs = entry
            if refs > 1:
                self._pools[name] = (sched, policy, refs - 1)
                return
            del self._pools[name]
        sched.shutdown()

    def names(self) -> list[str]:
        with self._lock:
            return list(self._pools)

    def shutdown_all(self) -> None:
        with self._lock:
            pools = [e[0] for e in self._pools.values()]
            self._pools.clear()
        for s in pools:
            s.shutdown()


shared_schedulers = _SharedRegistry()
