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


class Scheduler:
    """A timer heap served by ``threads`` daemon threads named ``drainpipe-<name>-<n>``. Thread-safe."""

    def __init__(self, name: str, threads: int) -> None:
        self.name = name
        self.thread_count = threads
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Task]] = []
        self._due: dict[int, float] = {}   # id(task) -> due time of its live heap entry (absent while running)
        self._seq = itertools.count()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"drainpipe-{name}-{i}", daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    def submit(self, task: Task, delay: float = 0.0) -> None:
        with self._cond:
            self._push(task, time.monotonic() + delay)

    def wake(self, task: Task) -> None:
        """Run ``task`` as soon as a thread is free if it is waiting in backoff (no-op while it runs)."""
        with self._cond:
            due = self._due.get(id(task))
            if due is not None and due > time.monotonic():
                self._push(task, 0.0)

    def _push(self, task: Task, due: float) -> None:
        self._due[id(task)] = due
        heapq.heappush(self._heap, (due, next(self._seq), task))
        self._cond.notify()

    def _work(self) -> None:
        while True:
            with self._cond:
                task = None
                while task is None:
                    if self._closed:
                        return
                    if not self._heap:
                        self._cond.wait()
                        continue
                    due, _, cand = self._heap[0]
                    if self._due.get(id(cand)) != due:      # stale entry (woken or finished)
                        heapq.heappop(self._heap)
                        continue
                    wait = due - time.monotonic()
                    if wait > 0:
                        self._cond.wait(wait)
                        continue
                    heapq.heappop(self._heap)
                    del self._due[id(cand)]
                    task = cand
            try:
                delay = task.run()
            except BaseException:  # a task must never kill a pool thread
                log.exception("drain task crashed; it will not run again")
                delay = None
            if delay is not None:
                with self._cond:
                    if not self._closed:
                        self._push(task, time.monotonic() + delay)

    def shutdown(self, wait: bool = True) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if wait:
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
