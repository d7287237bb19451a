"""Concurrency stress: many producers, several drain threads, many types; exactly-once and no handler overlap."""

from __future__ import annotations

import collections
import itertools
import random
import threading

import pytest
from queue_testlib import Item, make_types, new_queue

from drainpipe import DrainBalancer, PartitionPolicy, PartitionSelector, ThreadPolicy

PRODUCERS = 4
PER_PRODUCER = 12000


class Detector:
    """A per-type handler that fails on concurrent entry (non-blocking acquire) and records every item id."""

    def __init__(self, type_: type) -> None:
        self.type = type_
        self.lock = threading.Lock()
        self.ids: list[int] = []
        self.items: list[Item] = []
        self.overlaps = 0
        self.wrong_type = 0
        self.idle = 0

    def _enter(self) -> None:
        if not self.lock.acquire(blocking=False):
            self.overlaps += 1
            raise AssertionError(f"{self.type.__name__}: handler entered concurrently")

    def consume(self, batch: list) -> None:
        self._enter()
        try:
            for x in batch:
                if type(x) is not self.type:
                    self.wrong_type += 1
            self.items.extend(batch)
            self.ids.extend(x.id for x in batch)
            if len(batch) > 3:
                threading.Event().wait(0)  # give other threads a chance to run into us
        finally:
            self.lock.release()

    def on_idle(self) -> None:
        self._enter()
        try:
            self.idle += 1
        finally:
            self.lock.release()


class Eager(DrainBalancer):
    """Plans on each interval's figures as if they were exact (the default waits for the noise to settle): many
    handoffs while items flow, which is what the stress test is after."""

    def assign(self, throughput, current_owner, task_count, spread=None):
        return super().assign(throughput, current_owner, task_count)


def _run(qname, *, selector=None, rebalance=False, types_n=50, threads=3, partitions=None):
    types = make_types(types_n, "S")
    kw = {}
    if selector is not None:
        kw["partition_selector"] = selector
    if rebalance:
        kw["balancer"] = Eager()
        kw["rebalance_interval_ms"] = 5
    errors = []
    q = new_queue(
        qname,
        threads=ThreadPolicy.fixed(threads),
        partitions=partitions or PartitionPolicy.thread_multiply(4),
        buffer_size=256,
        error_handler=lambda batch, exc: errors.append(exc),
        shutdown_timeout_ms=200,
        **kw,
    )
    detectors = {t: Detector(t) for t in types}
    for t, d in detectors.items():
        q.add_handler(t, d)
    assert q.rebalancing_enabled is rebalance

    ids = itertools.count()
    accepted: list[list[Item]] = [[] for _ in range(PRODUCERS)]
    barrier = threading.Barrier(PRODUCERS)

    def producer(src: int) -> None:
        rnd = random.Random(src)
        # skewed type popularity so that rebalancing has something to move
        weights = [1.0 / (i + 1) for i in range(len(types))]
        mine = accepted[src]
        seq = 0
        barrier.wait()
        while seq < PER_PRODUCER:
            if rnd.random() < 0.5:
                x = rnd.choices(types, weights)[0](next(ids), src, seq)
                seq += 1
                assert q.produce(x)
                mine.append(x)
            else:
                batch = []
                for t in rnd.choices(types, weights, k=rnd.randint(1, 20)):
                    batch.append(t(next(ids), src, seq))
                    seq += 1
                assert q.produce_many(batch) == len(batch)
                mine.extend(batch)

    workers = [threading.Thread(target=producer, args=(s,), daemon=True) for s in range(PRODUCERS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
        assert not w.is_alive()
    q.shutdown()

    produced = [x for mine in accepted for x in mine]
    produced_ids = collections.Counter(x.id for x in produced)
    dispatched = collections.Counter(i for d in detectors.values() for i in d.ids)
    assert sum(d.overlaps for d in detectors.values()) == 0
    assert errors == []
    assert sum(d.wrong_type for d in detectors.values()) == 0
    assert max(dispatched.values()) == 1  # never twice
    assert dispatched == produced_ids  # every produced id exactly once
    by_type = collections.defaultdict(set)
    for x in produced:
        by_type[type(x)].add(x.id)
    for t, d in detectors.items():
        assert set(d.ids) == by_type[t]
    s = q.stats()
    assert s.produced == s.dispatched == len(produced) >= PRODUCERS * PER_PRODUCER
    assert s.handler_errors == 0 and s.dropped_no_handler == 0 and s.dropped_full == 0
    return q, detectors


def _assert_fifo_per_producer(detectors):
    for d in detectors.values():
        last: dict[int, int] = {}
        for x in d.items:
            assert x.seq > last.get(x.src, -1), (d.type.__name__, x.src)
            last[x.src] = x.seq


@pytest.mark.stress
def test_stress_type_hash_exactly_once_no_overlap(qname):
    q, detectors = _run(qname)
    _assert_fifo_per_producer(detectors)  # one type, one partition: produce order per producer kept


@pytest.mark.stress
def test_stress_type_hash_with_periodic_rebalancing(qname):
    q, detectors = _run(qname, rebalance=True)
    assert q.stats().rebalances >= 1  # partitions really moved while items flowed
    _assert_fifo_per_producer(detectors)  # handoffs keep order (fence before assign)


@pytest.mark.stress
def test_stress_key_hash_spreads_types_over_tasks_without_overlap(qname):
    """key_hash puts one type's items in several partitions owned by different tasks: the handler is still never
    entered concurrently."""
    _run(qname, selector=PartitionSelector.key_hash(lambda it: it.id % 11))


@pytest.mark.stress
def test_stress_adaptive_partitions(qname):
    q, detectors = _run(qname, partitions=PartitionPolicy.adaptive(multiplier=4))
    assert q.partition_count == PartitionPolicy.adaptive(4).resolve(3, 50) == 31
    _assert_fifo_per_producer(detectors)
