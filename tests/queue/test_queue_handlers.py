"""add_handler / remove_handler, adaptive partition growth under load (docs/api.md BatchQueue, Handlers)."""

from __future__ import annotations

import collections
import itertools
import threading
import time

import pytest
from queue_testlib import A, B, Blocker, C, Recorder, make_gate, make_types, new_queue

from drainpipe import PartitionPolicy, PartitionSelector, ThreadPolicy
from testlib import wait_until


def _check_assignment(q):
    parts = [p for task in q.assigned_partitions for p in task]
    assert sorted(parts) == list(range(q.partition_count))  # every partition in exactly one task
    assert len(q.assigned_partitions) == q.task_count


@pytest.mark.stress
@pytest.mark.parametrize("round_", range(5))
def test_add_handler_while_producing_grows_partitions_without_loss_or_misrouting(qname, round_):
    types = make_types(24, "Grow")
    recs = {t: Recorder(t.__name__, expect_type=t) for t in types}
    q = new_queue(
        qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.adaptive(multiplier=1), buffer_size=1000
    )
    assert q.partition_count == 2
    registered: list[type] = []
    q.add_handler(types[0], recs[types[0]])
    registered.append(types[0])

    stop = threading.Event()
    accepted: dict[int, list] = {}
    ids = itertools.count()

    def producer(src):
        mine = accepted[src] = []
        seq = 0
        while not stop.is_set():
            ts = list(registered)
            batch = [ts[(seq + k) % len(ts)](next(ids), src, seq + k) for k in range(8)]
            if seq % 16:
                n = q.produce_many(batch)
                assert n == len(batch)
                mine.extend(batch)
            else:
                for x in batch:
                    assert q.produce(x)
                    mine.append(x)
            seq += len(batch)
            time.sleep(0)

    producers = [threading.Thread(target=producer, args=(s,), daemon=True) for s in range(3)]
    for t in producers:
        t.start()
    counts = [q.partition_count]
    for t in types[1:]:
        q.add_handler(t, recs[t])
        registered.append(t)
        assert recs[registered[-2]].wait_items(1)  # the previous type is flowing while we grow
        counts.append(q.partition_count)
        _check_assignment(q)
    for r in recs.values():
        assert r.wait_items(20)
    stop.set()
    for t in producers:
        t.join(10)
    q.shutdown()

    assert counts == sorted(counts)  # never shrinks
    assert q.partition_count == PartitionPolicy.adaptive(1).resolve(2, 24) == 13
    produced = [x for mine in accepted.values() for x in mine]
    by_type = collections.defaultdict(list)
    for x in produced:
        by_type[type(x)].append(x.id)
    for t, r in recs.items():
        assert r.wrong_type == 0, t  # each handler sees only its type
        assert r.overlaps == 0, t
        assert sorted(r.ids) == sorted(by_type[t]), t  # every item exactly once
        # produce order per producer is preserved (a type never changes partition)
        for src in accepted:
            seqs = [x.seq for x in r.items if x.src == src]
            assert seqs == sorted(seqs), (t, src)
    s = q.stats()
    assert s.dropped_no_handler == 0 and s.handler_errors == 0
    assert s.produced == s.dispatched == len(produced)


def test_weighted_handlers_grow_adaptive_partitions(qname):
    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.adaptive(multiplier=1))
    assert q.partition_count == 2
    t1, t2, t3, t4 = make_types(4, "W")
    q.add_handler(t1, Recorder(), weight=2.0)
    assert q.partition_count == 2  # resolve(2, 2) = 2
    q.add_handler(t2, Recorder(), weight=2.0)
    assert q.partition_count == 3  # resolve(2, 4) = 2 + 2 // 2
    q.add_handler(t3, Recorder(), weight=2.5)
    assert q.partition_count == 4  # ceil(6.5) = 7 -> 2 + 5 // 2
    q.add_handler(t4, Recorder(), weight=1.5)
    assert q.partition_count == 5  # ceil(8.0) = 8 -> 2 + 6 // 2
    _check_assignment(q)
    assert q.remove_handler(t4)
    assert q.partition_count == 5  # partitions never shrink


def test_fixed_partitions_do_not_grow(qname):
    q = new_queue(qname, partitions=PartitionPolicy.fixed(3))
    for t in make_types(10, "F"):
        q.add_handler(t, Recorder())
    assert q.partition_count == 3


@pytest.mark.parametrize("weight", [0, -1, -0.5])
def test_add_handler_rejects_non_positive_weight(qname, weight):
    q = new_queue(qname)
    with pytest.raises(ValueError):
        q.add_handler(A, Recorder(), weight=weight)


def test_remove_handler_returns_true_then_false_and_drops_later_items(qname):
    rec = Recorder("A")
    q = new_queue(qname, partitions=PartitionPolicy.fixed(2))
    assert q.remove_handler(A) is False  # never registered
    q.add_handler(A, rec)
    q.produce(A(1))
    assert rec.wait_items(1)
    assert q.remove_handler(A) is True
    assert q.remove_handler(A) is False
    before = q.stats().dropped_no_handler
    for i in range(2, 7):
        q.produce(A(i))
    q.produce_many([A(7), A(8)])
    q.shutdown()
    assert rec.ids == [1]
    assert q.stats().dropped_no_handler - before == 7


def test_remove_handler_waits_for_in_flight_call_and_drops_buffered_items(qname):
    blk, rec_b = Recorder("blocker"), Recorder("B")
    blk.gate = make_gate()
    q = new_queue(qname, partitions=PartitionPolicy.fixed(2))  # one task owns both partitions
    q.add_handler(Blocker, blk)
    q.add_handler(B, rec_b)
    q.produce(B(0))
    assert rec_b.wait_items(1)
    q.produce(Blocker(0))
    assert blk.entered.wait(5)
    for i in range(1, 6):
        assert q.produce(B(i))  # buffered: the only task is busy
    out = []
    remover = threading.Thread(target=lambda: out.append(q.remove_handler(B)), daemon=True)
    remover.start()
    remover.join(0.1)
    assert remover.is_alive()  # waits for the cycle the task is in
    blk.gate.set()
    remover.join(5)
    assert out == [True]
    assert wait_until(lambda: q.stats().dropped_no_handler == 5)
    q.shutdown()
    assert rec_b.ids == [0]
    assert q.stats().dropped_no_handler == 5


@pytest.mark.parametrize("selector", ["type_hash", "key_hash"])
def test_removed_handler_is_never_called_after_remove_returns(qname, selector):
    """With a custom selector the type's items are in every partition and any task calls its handler: remove waits
    for all of them (it waited for the owner of the type's home partition only, and returned during a call)."""
    custom = {"partition_selector": PartitionSelector.key_hash(lambda x: x.id)} if selector == "key_hash" else {}
    rec = Recorder("A", delay=0.02 if custom else 0.001)
    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(4), **custom)
    q.add_handler(A, rec)
    stop = threading.Event()

    def producer():
        i = 0
        while not stop.is_set():
            q.produce(A(i))
            i += 1
            if i % 50 == 0:
                time.sleep(0.0005)

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    assert rec.wait_items(20)
    assert q.remove_handler(A)
    assert not rec.active
    calls = len(rec.batches)
    idle = rec.idle_calls
    time.sleep(0.05)
    stop.set()
    t.join(5)
    q.shutdown()
    assert len(rec.batches) == calls and rec.idle_calls == idle
    assert q.stats().dropped_no_handler > 0


def test_a_handler_registered_again_and_again_under_a_custom_selector_never_runs_twice_at_once(qname):
    """Replacing a handler waits for the old registration's calls on every task (a custom selector spreads the
    type over all partitions) before the new one runs: the same handler registered again while producing never
    overlaps itself."""
    rec = Recorder("A", delay=0.005)
    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(4),
                  partition_selector=PartitionSelector.key_hash(lambda x: x.id))  # fmt: skip
    q.add_handler(A, rec)
    stop = threading.Event()

    def producer():
        i = 0
        while not stop.is_set():
            q.produce_many([A(i + k) for k in range(20)])
            i += 20
            time.sleep(0.001)

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        q.add_handler(A, rec)
        time.sleep(0.02)
    stop.set()
    t.join(5)
    q.shutdown()
    assert rec.overlaps == 0 and len(rec.batches) > 20


def test_readding_a_handler_routes_its_type_again(qname):
    first, second = Recorder("first"), Recorder("second")
    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(4))
    q.add_handler(A, first)
    q.produce(A(1))
    assert first.wait_items(1)
    assert q.remove_handler(A)
    q.add_handler(A, second)
    q.produce_many([A(2), A(3)])
    q.shutdown()
    assert first.ids == [1] and second.ids == [2, 3]


def test_add_handler_replaces_previous_handler(qname):
    first, second = Recorder("first"), Recorder("second")
    q = new_queue(qname, partitions=PartitionPolicy.fixed(2))
    q.add_handler(C, first)
    q.produce(C(1))
    assert first.wait_items(1)
    q.add_handler(C, second)
    q.produce(C(2))
    q.shutdown()
    assert first.ids == [1] and second.ids == [2]


def test_remove_handler_racing_shutdown_still_waits_for_the_running_handler(qname):
    rec_b = Recorder("B")
    rec_b.gate = make_gate()
    q = new_queue(qname, partitions=PartitionPolicy.fixed(2), shutdown_timeout_ms=0)
    q.add_handler(B, rec_b)
    q.produce(B(0))
    assert rec_b.entered.wait(5)  # B.consume is in flight (blocked)
    out = []

    def remove():
        result = q.remove_handler(B)
        out.append((result, rec_b.active))  # was B still running when remove_handler returned?

    remover = threading.Thread(target=remove, daemon=True)
    remover.start()
    remover.join(0.1)
    assert remover.is_alive()  # waiting for B's call to end, as documented
    closer = threading.Thread(target=q.shutdown, daemon=True)
    closer.start()
    remover.join(0.3)
    rec_b.gate.set()
    remover.join(5)
    closer.join(5)
    assert out == [(True, False)], "remove_handler returned while the removed handler was still running"


def test_the_read_only_views_follow_registration_and_ownership(qname):
    """handler_types(), partitions_of() and partition_owners(): what the behaviour tests read instead of internals.
    A type's items reach its handler on the partition partitions_of() names, owned by the task partition_owners()
    names; a split type names one partition per instance; a removed type is gone from both views."""
    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(4))
    assert q.handler_types() == frozenset() and q.partitions_of(A) == ()
    ra = Recorder("a")
    q.add_handler(A, ra)
    q.add_handler(B, lambda: Recorder("b"), split=2)
    assert q.handler_types() == {A, B}
    (pa,) = q.partitions_of(A)
    pb = q.partitions_of(B)
    assert len(pb) == 2 and all(0 <= p < 4 for p in (pa, *pb))
    owners = q.partition_owners()
    assert owners == tuple(t for p in range(4) for t, ps in enumerate(q.assigned_partitions) if p in ps)
    assert len({owners[p] for p in pb}) == 2  # a split type's instances on different tasks
    q.produce(A(1))
    assert ra.wait_items(1) and ra.threads[0].endswith(f"-{owners[pa]}")  # drained by the owner named
    assert q.produced_count(pa) == 1
    assert q.remove_handler(A)
    assert q.handler_types() == {B} and q.partitions_of(A) == ()
