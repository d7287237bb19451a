"""BatchQueueStats: usage view and exact counters (docs/api.md Stats)."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from queue_testlib import A, B, Blocker, C, Recorder, make_gate, make_types, new_queue

from drainpipe import BatchQueueStats, BufferStrategy, PartitionPolicy, PartitionSelector, PartitionUsage, ThreadPolicy
from testlib import wait_until


def _stuck_queue(qname, **kw):
    """One drain task, a Blocker handler holding it; returns (queue, blocker recorder)."""
    blk = Recorder("blocker")
    blk.gate = make_gate()
    q = new_queue(qname, **kw)
    q.add_handler(Blocker, blk)
    q.produce(Blocker(0))
    assert blk.entered.wait(5)
    return q, blk


def _produce_into(q, make, n):
    """Produce n items and return the one partition they went to."""
    before = q.stats().partition_used_counts
    for i in range(n):
        assert q.produce(make(i))
    after = q.stats().partition_used_counts
    grown = [p for p in range(len(after)) if after[p] != before[p]]
    assert len(grown) == 1 and after[grown[0]] - before[grown[0]] == n
    return grown[0]


def test_usage_view_and_top_n_ordering(qname):
    q, blk = _stuck_queue(qname, partitions=PartitionPolicy.fixed(4), buffer_size=10)
    for t in (A, B, C):
        q.add_handler(t, Recorder(t.__name__))
    pa = _produce_into(q, A, 3)
    pb = _produce_into(q, B, 7)
    pc = _produce_into(q, C, 10)
    pblk = _produce_into(q, Blocker, 3)
    assert len({pa, pb, pc, pblk}) == 4  # fewest-types placement: one type per partition

    s = q.stats()
    assert s.partition_count == 4 == q.partition_count
    assert s.buffer_size == 10
    assert s.total_capacity() == 40
    assert s.total_used() == 23
    assert s.total_used_percentage() == pytest.approx(57.5)
    expected = {pa: 3, pb: 7, pc: 10, pblk: 3}
    for p, used in expected.items():
        assert s.partition_used(p) == used
        assert s.partition_used_percentage(p) == pytest.approx(used * 10.0)
    assert s.partition_used_percentage(pc) == pytest.approx(100.0)

    top = s.top_n(4)
    assert [u.partition_index for u in top[:2]] == [pc, pb]
    assert [u.partition_index for u in top[2:]] == sorted([pa, pblk])  # tie on used -> index ascending
    assert top[0] == PartitionUsage(pc, 10, pytest.approx(100.0))
    assert [(u.used, u.used_percentage) for u in top] == [(10, 100.0), (7, 70.0), (3, 30.0), (3, 30.0)]
    assert len(s.top_n(2)) == 2 and s.top_n(2) == top[:2]
    assert len(s.top_n(10)) == 4
    assert s.top_n(0) == []

    # a snapshot is immutable and does not follow the queue
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.produced = 0
    blk.gate.set()
    assert wait_until(lambda: q.stats().total_used() == 0)
    assert s.total_used() == 23


def test_empty_stats(qname):
    q = new_queue(qname, partitions=PartitionPolicy.fixed(3), buffer_size=5)
    s = q.stats()
    assert isinstance(s, BatchQueueStats)
    assert s.partition_used_counts == (0, 0, 0)
    assert s.total_capacity() == 15 and s.total_used() == 0 and s.total_used_percentage() == 0.0
    assert s.top_n(2) == [PartitionUsage(0, 0, 0.0), PartitionUsage(1, 0, 0.0)]
    assert (s.produced, s.dropped_full, s.dropped_no_handler, s.dispatched, s.handler_errors) == (0, 0, 0, 0, 0)
    assert len(s.task_dispatched) == q.task_count


def test_counters_are_exact(qname):
    errors = threading.Event()
    rec_a = Recorder("A", fail_if=lambda batch: any(x.flag == "bad" for x in batch))
    rec_b = Recorder("B")
    Unhandled = make_types(1, "Unhandled")[0]
    q = new_queue(
        qname,
        threads=ThreadPolicy.fixed(2),
        partitions=PartitionPolicy.fixed(2),
        error_handler=lambda batch, exc: errors.set(),
    )
    q.add_handler(A, rec_a)
    q.add_handler(B, rec_b)
    assert q.produce_many([A(i) for i in range(10)]) == 10
    assert rec_a.wait_items(10)
    for k in range(2):  # two failing calls, one at a time
        errors.clear()
        assert q.produce(A(100 + k, flag="bad"))
        assert errors.wait(5)
    assert q.produce_many([B(i) for i in range(5)]) == 5
    assert rec_b.wait_items(5)
    for i in range(4):
        q.produce(Unhandled(i))
    assert wait_until(lambda: sum(q.stats().task_dispatched) == 17)
    s = q.stats()
    assert s.produced == 21  # accepted: 17 handled + 4 accepted-and-dropped
    assert s.dispatched == 17  # items handed to handlers, failed calls included
    assert s.handler_errors == 2
    assert s.dropped_no_handler == 4
    assert s.dropped_full == 0
    assert len(s.task_dispatched) == 2
    q.shutdown()
    s2 = q.stats()
    assert (s2.produced, s2.dispatched, s2.handler_errors, s2.dropped_no_handler) == (21, 17, 2, 4)


def test_dropped_full_exact(qname):
    q, blk = _stuck_queue(qname, buffer_size=4, strategy=BufferStrategy.IF_POSSIBLE)
    rec = Recorder("A")
    q.add_handler(A, rec)
    results = [q.produce(A(i)) for i in range(10)]
    assert results.count(True) == 4
    assert q.produce_many([A(i) for i in range(10, 15)]) == 0
    s = q.stats()
    assert s.dropped_full == 11
    assert s.produced == 1 + 4  # blocker + accepted
    blk.gate.set()
    q.shutdown()
    s = q.stats()
    assert s.dispatched == 5 and s.dropped_full == 11
    assert rec.ids == [0, 1, 2, 3]


def test_task_dispatched_is_per_task(qname):
    recs = {t: Recorder(t.__name__) for t in (A, B)}
    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(2))
    for t, r in recs.items():
        q.add_handler(t, r)
    q.produce_many([A(i) for i in range(30)])
    q.produce_many([B(i) for i in range(12)])
    assert recs[A].wait_items(30) and recs[B].wait_items(12)
    assert wait_until(lambda: sum(q.stats().task_dispatched) == 42)
    assert sorted(q.stats().task_dispatched) == [12, 30]  # A and B live on different tasks


def test_produced_counts_accepted_items_whatever_the_selector(qname):
    """An item of a type without handler is accepted (and dropped, counted) under either selector: type_hash drops
    it at produce time, key_hash at dispatch time; the counters must not depend on where it was dropped."""
    Unhandled = make_types(1, "Unhandled")[0]
    results = {}
    for name, sel in (
        ("type_hash", PartitionSelector.type_hash()),
        ("key_hash", PartitionSelector.key_hash(lambda it: it.id)),
    ):
        q = new_queue(f"{qname}_{name}", partitions=PartitionPolicy.fixed(2), partition_selector=sel)
        q.add_handler(A, Recorder())
        accepted = sum([q.produce(A(1)), q.produce(A(2)), q.produce(Unhandled(3))])
        accepted += q.produce_many([A(4), Unhandled(5)])
        q.shutdown()
        s = q.stats()
        results[name] = (accepted, s.produced, s.dispatched, s.dropped_no_handler)
    assert results["type_hash"] == results["key_hash"] == (5, 5, 3, 2)


def test_stats_while_adaptive_partitions_grow(qname):
    """Force the interleaving: right after stats() read the published partition count, a handler registration
    grows the partitions (as the control thread can at any moment). stats() must still return a snapshot."""
    t1, t2, t3 = make_types(3, "G")
    q = new_queue(qname, partitions=PartitionPolicy.adaptive(multiplier=1))
    q.add_handler(t1, Recorder())
    q.add_handler(t2, Recorder())
    assert q.partition_count == 1  # resolve(1, 2) = 1 + 1 // 2
    me = threading.current_thread()
    armed = [True]
    real = q._parts.buffers

    class HookBuffers:  # the real buffers, growing just before stats reads sizes
        def __getattr__(self, name):
            return getattr(real, name)

        def sizes(self):
            if threading.current_thread() is me and armed[0]:
                armed[0] = False
                q.add_handler(t3, Recorder())  # resolve(1, 3) = 2 partitions
                assert q.partition_count == 2
            return real.sizes()

    q._parts.buffers = HookBuffers()
    s = q.stats()
    q._parts.buffers = real
    assert not armed[0]
    assert len(s.partition_used_counts) == 1  # the snapshot is of the partition count it read
    assert s.partition_count in (1, 2)
