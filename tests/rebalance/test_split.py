"""Hot types split over several partitions: one handler instance per sub-partition, each never overlapping."""

from __future__ import annotations

import threading
import time

import pytest

from drainpipe import BatchQueue, BatchQueueConfig, PartitionPolicy, PartitionSelector, ThreadPolicy


class Hot:
    __slots__ = ("key", "seq")

    def __init__(self, key, seq):
        self.key, self.seq = key, seq


class Cold:
    __slots__ = ("key", "seq")

    def __init__(self, seq):
        self.key, self.seq = -1, seq


class Counting:
    """Detector + mergeable state (a per-key count), as an L1 aggregation instance would hold."""

    instances: list[Counting] = []

    def __init__(self, violations):
        self.lock = threading.Lock()
        self.violations = violations
        self.counts: dict[int, int] = {}
        self.threads: set[str] = set()
        self.seen: list[int] = []

    def consume(self, batch):
        if not self.lock.acquire(blocking=False):
            self.violations.append("overlap")
            return
        try:
            self.threads.add(threading.current_thread().name)
            for it in batch:
                self.counts[it.key] = self.counts.get(it.key, 0) + 1
                self.seen.append(it.seq)
            time.sleep(0.0001 * len(batch) / 100)  # a cost that releases the GIL, like a DB write
        finally:
            self.lock.release()


def test_split_handler_spreads_a_hot_type_over_threads_and_states_merge():
    violations: list[str] = []
    instances: list[Counting] = []

    def factory():
        inst = Counting(violations)
        instances.append(inst)
        return inst

    cold = Counting(violations)
    q = BatchQueue(
        "split",
        BatchQueueConfig(threads=ThreadPolicy.fixed(4), partitions=PartitionPolicy.adaptive(), buffer_size=2000),
    )
    q.add_handler(Hot, factory, split=True, key=lambda it: it.key)
    q.add_handler(Cold, cold)
    assert len(instances) == 4  # one instance per sub-partition
    n = 40_000

    def produce(offset):
        for i in range(offset, n, 2):
            q.produce(Hot(i % 97, i) if i % 5 < 3 else Cold(i))

    ths = [threading.Thread(target=produce, args=(o,)) for o in (0, 1)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    q.shutdown()
    assert not violations
    hot_expected = sum(1 for i in range(n) if i % 5 < 3)
    seen = [s for inst in instances for s in inst.seen]
    assert len(seen) == hot_expected and len(set(seen)) == hot_expected  # exactly once across instances
    merged: dict[int, int] = {}
    for inst in instances:
        for k, c in inst.counts.items():
            merged[k] = merged.get(k, 0) + c
    assert merged == {k: sum(1 for i in range(n) if i % 5 < 3 and i % 97 == k) for k in range(97)}
    # equal keys stay on one instance
    keys_per_instance = [set(inst.counts) for inst in instances]
    assert sum(len(k) for k in keys_per_instance) == 97
    drained_by = set().union(*(inst.threads for inst in instances))
    assert len(drained_by) >= 2, drained_by  # the hot type really ran on several threads
    assert len(cold.threads) == 1  # non-split: one task, pinned to one thread
    assert len(cold.seen) == n - hot_expected


def test_split_needs_a_factory_and_type_hash():
    q = BatchQueue(
        "split-bad",
        BatchQueueConfig(
            threads=ThreadPolicy.fixed(2),
            partitions=PartitionPolicy.fixed(2),
            partition_selector=PartitionSelector.key_hash(id),
        ),
    )
    try:
        with pytest.raises(ValueError):
            q.add_handler(Hot, object(), split=True)
        with pytest.raises(ValueError):
            q.add_handler(Hot, lambda: lambda b: None, split=True)
        with pytest.raises(ValueError):
            q.add_handler(Hot, lambda b: None, split=-1)
    finally:
        q.shutdown()


def test_items_left_in_a_partition_the_new_registration_does_not_serve_are_dropped_and_counted():
    """A type re-registered with another split may leave items in a partition none of its new instances serves.
    Handing them to an instance owned by another task could run it twice at once: they are dropped and counted,
    as remove_handler does with what is still buffered."""
    q = BatchQueue(
        "split-leftover", BatchQueueConfig(threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(4))
    )
    try:
        violations: list[str] = []
        Counting.instances = []

        def factory():
            c = Counting(violations)
            Counting.instances.append(c)
            return c

        q.add_handler(Hot, factory, split=2, key=lambda it: it.key)
        served = set(q.partitions_of(Hot))
        stray = min(set(range(4)) - served)
        assert q._parts.buffers.put(stray, [Hot(1, i) for i in range(50)]) == 50  # as an earlier registration left them
        for i in range(100):
            assert q.produce(Hot(i % 7, 1000 + i))
        deadline = time.monotonic() + 10
        while q.stats().dispatched + q.stats().dropped_no_handler < 150 and time.monotonic() < deadline:
            time.sleep(0.01)
        s = q.stats()
        assert (s.dispatched, s.dropped_no_handler) == (100, 50)
        assert sorted(x for c in Counting.instances for x in c.seen) == list(range(1000, 1100))
        assert not violations
    finally:
        q.shutdown()
