"""The control thread's step queue returns by its deadline. CPython's ``SimpleQueue.get(timeout=...)`` does not
always: after taking its lock without waiting on a still-empty queue, a deadline passed meanwhile becomes "wait for
ever" (:mod:`drainpipe._control_loop` says how). The control loop waited like that once with its timers 24 s
overdue, and a ``remove_handler`` never returned."""

from __future__ import annotations

import queue
import threading
import time

from drainpipe._control_loop import new_step_queue


def _stalls(steps: queue.Queue | queue.SimpleQueue, seconds: float, stall: float = 1.5) -> int:
    """Drive ``steps`` through the state that trips SimpleQueue (a put while nobody waits, the item taken without
    the lock, then a get with a deadline of a microsecond) for ``seconds``; the rounds done before one get outlived
    its deadline by ``stall`` seconds (long enough that a busy machine's scheduling is not mistaken for it), or -1
    if none did."""
    rounds = [0]
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                steps.get(timeout=1e-6)
            except queue.Empty:
                pass
            steps.put(1)  # releases the lock the timed-out get left taken
            steps.get()  # taken without the lock: empty now, the lock free
            rounds[0] += 1

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    end = time.monotonic() + seconds
    last, since = 0, time.monotonic()
    try:
        while time.monotonic() < end:
            time.sleep(0.05)
            if rounds[0] != last:
                last, since = rounds[0], time.monotonic()
            elif time.monotonic() - since > stall:
                return last
        return -1
    finally:
        stop.set()
        steps.put(None)  # wakes a stalled get (then the loop ends)


def test_the_step_queue_returns_by_its_deadline() -> None:
    """Sabotaged once: with ``queue.SimpleQueue`` as the step queue this fails within a few thousand rounds."""
    assert _stalls(new_step_queue(), 2.5) == -1
