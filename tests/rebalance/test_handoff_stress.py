"""Stress: ownership changes (periodic + on-demand rebalances, growth, removal) while traffic flows.

A broken handoff shows up here as an overlapping handler call (detector), a lost or duplicated item (exact id
accounting), or an item of one producer arriving before an earlier one of the same type (per-type FIFO).
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from drainpipe import BatchQueue, BatchQueueConfig, DrainBalancer, PartitionPolicy, RebalanceResult, ThreadPolicy


class ChaosBalancer:
    """Moves a random subset of partitions at every call: a handoff at every tick."""

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.lock = threading.Lock()

    def assign(self, throughput, current_owner, task_count, spread=None):
        with self.lock:
            plan = list(current_owner)
            for p in range(len(plan)):
                if self.rnd.random() < 0.5:
                    plan[p] = self.rnd.randrange(task_count)
            return plan


class Detector:
    """A handler that fails the test if it is ever entered twice at once, and records what it saw."""

    def __init__(self, name: str, violations: list) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.violations = violations
        self.seen: list[tuple[int, int]] = []  # (producer, seq)
        self.calls = 0
        self.threads: set[str] = set()

    def _enter(self):
        if not self.lock.acquire(blocking=False):
            self.violations.append(f"overlap in {self.name}")
            return False
        return True

    def consume(self, batch):
        entered = self._enter()
        try:
            self.calls += 1
            self.threads.add(threading.current_thread().name)
            self.seen.extend((it.producer, it.seq) for it in batch)
            if self.calls % 7 == 0:
                time.sleep(0.0002)  # widen the window in which a broken fence would overlap
        finally:
            if entered:
                self.lock.release()

    def on_idle(self):
        entered = self._enter()
        if entered:
            self.lock.release()


def make_types(n):
    return [
        type(
            f"E{i}",
            (),
            {
                "__slots__": ("producer", "seq"),
                "__init__": lambda self, p, s: (setattr(self, "producer", p), setattr(self, "seq", s)) and None,
            },
        )
        for i in range(n)
    ]


def check_fifo(det: Detector):
    last: dict[int, int] = {}
    for producer, seq in det.seen:
        assert seq > last.get(producer, -1), f"{det.name}: producer {producer} seq {seq} after {last[producer]}"
        last[producer] = seq


def run_stress(balancer, tasks: int, seconds: float, seed: int):
    rnd = random.Random(seed)
    violations: list[str] = []
    types = make_types(24)
    q = BatchQueue(
        "stress",
        BatchQueueConfig(
            threads=ThreadPolicy.fixed(tasks),
            partitions=PartitionPolicy.adaptive(multiplier=2),
            buffer_size=500,
            balancer=balancer,
            rebalance_interval_ms=10,
            min_idle_ms=1,
            max_idle_ms=5,
        ),
    )
    detectors = {t: Detector(t.__name__, violations) for t in types}
    stable = types[:16]  # always registered
    churn = types[16:]  # added / removed / re-added while traffic flows
    for t in stable:
        q.add_handler(t, detectors[t])
    stop = threading.Event()
    produced_ok = [dict() for _ in range(4)]

    def producer(pid: int):
        r = random.Random(seed * 31 + pid)
        seq = 0
        counts = produced_ok[pid]
        while not stop.is_set():
            for _ in range(200):
                t = types[0] if r.random() < 0.9 else r.choice(types)  # one type carries 90%
                if q.produce(t(pid, seq)):
                    counts[t] = counts.get(t, 0) + 1
                seq += 1

    def controller():
        registered = set()
        while not stop.is_set():
            t = rnd.choice(churn)
            if t in registered and rnd.random() < 0.5:
                q.remove_handler(t)
                registered.discard(t)
            else:
                q.add_handler(t, detectors[t])
                registered.add(t)
            time.sleep(0.003)

    rebalance_results: list[RebalanceResult] = []

    def hammer():
        while not stop.is_set():
            rebalance_results.append(q.rebalance_now())

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=controller), threading.Thread(target=hammer)]
    for th in threads:
        th.start()
    time.sleep(seconds)
    stop.set()
    for th in threads:
        th.join()
    q.shutdown()

    s = q.stats()
    assert not violations, violations[:5]
    total_ok = sum(sum(c.values()) for c in produced_ok)
    assert s.produced == total_ok
    assert s.dispatched + s.dropped_no_handler == total_ok
    for t in stable:
        det = detectors[t]
        expected = sum(c.get(t, 0) for c in produced_ok)
        assert len(det.seen) == expected, (t.__name__, len(det.seen), expected)
        assert len(set(det.seen)) == len(det.seen)
        check_fifo(det)
    for t in churn:
        det = detectors[t]
        assert len(set(det.seen)) == len(det.seen)
        check_fifo(det)
    # every partition owned by exactly one task
    flat = sorted(p for ps in q.assigned_partitions for p in ps)
    assert flat == list(range(q.partition_count))
    moved = s.rebalances
    return moved, len(rebalance_results), s


@pytest.mark.stress
@pytest.mark.parametrize("tasks", [2, 4])
def test_chaos_handoffs_keep_every_guarantee(tasks):
    moved, on_demand, s = run_stress(ChaosBalancer(seed=tasks), tasks, seconds=3.0, seed=tasks)
    assert moved >= 300, f"only {moved} rebalances moved partitions"


@pytest.mark.stress
def test_throughput_balancer_under_skew():
    moved, on_demand, s = run_stress(DrainBalancer.throughput_weighted(), 3, seconds=2.0, seed=7)
    assert on_demand > 50


def test_rebalance_states_and_history_visible():
    q = BatchQueue(
        "hist",
        BatchQueueConfig(
            threads=ThreadPolicy.fixed(2),
            partitions=PartitionPolicy.fixed(4),
            balancer=ChaosBalancer(1),
            rebalance_interval_ms=0,
        ),
    )
    types = make_types(4)
    for t in types:
        q.add_handler(t, lambda b: None)
    for i in range(100):
        q.produce(types[i % 4](0, i))
    res = q.rebalance_now()
    s = q.stats()
    q.shutdown()
    assert s.rebalance_state == "stable"
    if res.moves:
        assert s.rebalances == 1 and s.rebalance_history[-1] == res
        assert res.duration_ms >= 0 and len(res.loads_before) == 2


def test_growth_after_rebalance_keeps_moved_partitions():
    """The anchor's bug: growth after a rebalance rebuilt the assignment round-robin and orphaned moves."""
    q = BatchQueue(
        "grow",
        BatchQueueConfig(
            threads=ThreadPolicy.fixed(2),
            partitions=PartitionPolicy.adaptive(),
            balancer=DrainBalancer.throughput_weighted(),
        ),
    )
    types = make_types(8)
    for t in types[:4]:
        q.add_handler(t, lambda b: None)
    for i in range(4000):  # types 0 and 2 hot: round-robin puts both on task 0
        q.produce(types[(i % 2) * 2 if i % 10 else 1](0, i))
    res = q.rebalance_now()
    assert res.moves, res
    owners_after = {p: t for t, ps in enumerate(q.assigned_partitions) for p in ps}
    for t in types[4:]:
        q.add_handler(t, lambda b: None)
    grown = {p: t for t, ps in enumerate(q.assigned_partitions) for p in ps}
    q.shutdown()
    assert q.partition_count == 8
    for p, t in owners_after.items():
        assert grown[p] == t, "growth moved an existing partition"
    assert sorted(grown) == list(range(8))


def test_shutdown_during_fence_ends_it():
    """A handler stuck in a call keeps a fence waiting; shutdown must still end (after the call returns)."""
    release = threading.Event()
    entered = threading.Event()

    class Slow:
        def consume(self, batch):
            entered.set()
            release.wait(5)

    class Fast:
        def consume(self, batch):
            pass

    types = make_types(2)
    q = BatchQueue(
        "fence",
        BatchQueueConfig(
            threads=ThreadPolicy.fixed(2),
            partitions=PartitionPolicy.fixed(2),
            balancer=ChaosBalancer(3),
            shutdown_timeout_ms=50,
        ),
    )
    q.add_handler(types[0], Slow())
    q.add_handler(types[1], Fast())
    q.produce(types[0](0, 0))
    assert entered.wait(2)
    for i in range(50):
        q.produce(types[1](0, i))
    rebal = threading.Thread(target=lambda: q.rebalance_now())
    rebal.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    threading.Timer(0.2, release.set).start()
    q.shutdown()
    rebal.join(2)
    assert not rebal.is_alive()
    assert time.monotonic() - t0 < 3
    assert q.stats().dispatched == 51
