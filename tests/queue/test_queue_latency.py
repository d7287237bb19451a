"""Low load, low latency: with defaults, an item produced at 200 items/s reaches its handler in <= 2 ms (p50) and
<= 6 ms (p99), because a producer that puts the first item into an empty partition wakes its owner out of its
idle backoff; and an idle queue costs <= 1% of a core. (Before: 24 ms p50, 50 ms p99, the backoff's.)"""

from __future__ import annotations

import threading
import time

import pytest
from queue_testlib import new_queue

from drainpipe import ThreadPolicy

# milliseconds of latency: measured with the machine to itself (make test runs these after the parallel run)
pytestmark = pytest.mark.exclusive


class Ping:
    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = time.perf_counter()


def _latencies(qname: str, n: int = 200, gap_s: float = 0.005) -> list[float]:
    lat: list[float] = []
    q = new_queue(qname, threads=ThreadPolicy.fixed(1))
    q.add_handler(Ping, lambda batch: lat.extend(time.perf_counter() - x.t for x in batch))
    time.sleep(0.2)  # the task is deep in its idle backoff (max_idle_ms)
    nxt = time.perf_counter()
    for _ in range(n):
        nxt += gap_s
        time.sleep(max(0.0, nxt - time.perf_counter()))
        q.produce(Ping())
    time.sleep(0.05)
    assert len(lat) == n
    return sorted(lat)


def test_200_items_per_second_reach_their_handler_within_2_ms_p50_and_6_ms_p99(qname: str) -> None:
    # best of 3 attempts: the bound is on the queue, not on a machine that a parallel job may stall for 10 ms
    results = []
    for k in range(3):
        lat = _latencies(f"{qname}{k}")
        p50, p99 = lat[len(lat) // 2] * 1000, lat[int(0.99 * len(lat))] * 1000
        results.append((p50, p99))
        if p50 <= 2 and p99 <= 6:
            return
    raise AssertionError(f"p50/p99 ms of 3 attempts: {results}")


def test_after_a_pause_the_first_item_waits_for_no_backoff(qname: str) -> None:
    """10 items/s: every item meets a task asleep in its longest backoff (max_idle_ms = 50); the producer wakes it.
    (Without the wake, these items wait 25 ms on average.)"""
    results = []
    for k in range(3):
        lat = _latencies(f"{qname}{k}", n=20, gap_s=0.1)
        p50, worst = lat[len(lat) // 2] * 1000, lat[-1] * 1000
        results.append((p50, worst))
        if p50 <= 2 and worst <= 6:
            return
    raise AssertionError(f"p50/max ms of 3 attempts: {results}")


def _runtime_cpu_s() -> dict[int, float]:
    """CPU seconds so far of each live thread of the queue runtime (named ``drainpipe-...``: the queues' pool and
    control threads), by its own CPU clock: other threads of the test process (a library's, left by an earlier
    test) do not count, as they did when this measured the whole process."""
    out = {}
    for thread in threading.enumerate():
        if thread.name.startswith("drainpipe-") and thread.ident is not None:
            try:
                out[thread.ident] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except (OSError, ProcessLookupError):  # (ended meanwhile)
                pass
    return out


def test_an_idle_queue_costs_under_1_percent_of_a_core(qname: str) -> None:
    q = new_queue(qname, threads=ThreadPolicy.fixed(2))
    q.add_handler(Ping, lambda batch: None)
    time.sleep(0.3)
    before, t0 = _runtime_cpu_s(), time.perf_counter()
    time.sleep(1.0)
    after = _runtime_cpu_s()
    busy = sum(after[t] - before.get(t, 0.0) for t in after)
    assert len(after) >= 2, after  # (the queue's threads were measured)
    assert busy / (time.perf_counter() - t0) < 0.01, busy
