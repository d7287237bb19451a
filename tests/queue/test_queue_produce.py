"""produce / produce_many with both buffer strategies, and partition selectors (docs/api.md BatchQueue, Routing)."""

from __future__ import annotations

import threading
import time

import pytest
from queue_testlib import A, B, Blocker, C, Item, Recorder, first_call_blocks, make_types, new_queue

from drainpipe import BufferStrategy, PartitionPolicy, PartitionSelector, ThreadPolicy
from testlib import wait_until


def blocked_consumer():
    """A single consumer whose first batch blocks until ``rec.gate`` is set (the one drain task is then stuck)."""
    rec = Recorder("consumer")
    first_call_blocks(rec)
    return rec


def stuck(q, rec, blocker=None):
    """Produce a blocker and wait until the consumer holds it (the queue's only drain task is then busy)."""
    assert q.produce(Blocker("blocker") if blocker is None else blocker)
    assert rec.entered.wait(5)


# ---------------------------------------------------------------- BLOCKING


def test_blocking_producer_waits_for_room_and_nothing_is_lost(qname):
    rec = blocked_consumer()
    q = new_queue(qname, consumer=rec, buffer_size=2)
    stuck(q, rec)
    progress = []
    results = []

    def producer():
        for i in range(50):
            results.append(q.produce(i))
            progress.append(i)

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    assert wait_until(lambda: q.stats().total_used() == 2)  # the 2-slot buffer is full ...
    time.sleep(0.15)
    assert t.is_alive()  # ... and the producer waits for room
    assert len(progress) == 2
    assert q.stats().dropped_full == 0
    rec.gate.set()
    t.join(5)
    assert not t.is_alive()
    assert results == [True] * 50
    assert rec.wait_items(51)
    assert [x for x in rec.items if not isinstance(x, Blocker)] == list(range(50))  # all, once, in order
    s = q.stats()
    assert s.produced == 51 and s.dropped_full == 0


def test_blocking_produce_many_waits_and_delivers_everything(qname):
    rec = blocked_consumer()
    q = new_queue(qname, consumer=rec, buffer_size=3)
    stuck(q, rec)
    out = []
    t = threading.Thread(target=lambda: out.append(q.produce_many(range(40))), daemon=True)
    t.start()
    assert wait_until(lambda: q.stats().total_used() == 3)
    time.sleep(0.1)
    assert t.is_alive() and out == []
    rec.gate.set()
    t.join(5)
    assert out == [40]
    assert rec.wait_items(41)
    assert [x for x in rec.items if not isinstance(x, Blocker)] == list(range(40))


def test_blocked_producer_returns_false_when_shutdown_starts(qname):
    rec = blocked_consumer()
    q = new_queue(qname, consumer=rec, buffer_size=1, shutdown_timeout_ms=0)
    stuck(q, rec)
    assert q.produce("buffered") is True
    out = []
    t = threading.Thread(target=lambda: out.append(q.produce("waiting")), daemon=True)
    t.start()
    time.sleep(0.05)
    assert t.is_alive()
    closer = threading.Thread(target=q.shutdown, daemon=True)
    closer.start()
    t.join(5)
    assert out == [False]  # released by the shutdown, not accepted
    rec.gate.set()
    closer.join(5)
    assert not closer.is_alive()
    assert "buffered" in rec.items and "waiting" not in rec.items


# ---------------------------------------------------------------- IF_POSSIBLE


def test_if_possible_returns_false_when_full_and_counts_drops(qname):
    rec = blocked_consumer()
    q = new_queue(qname, consumer=rec, buffer_size=3, strategy=BufferStrategy.IF_POSSIBLE)
    stuck(q, rec)
    results = [q.produce(i) for i in range(10)]
    assert results == [True] * 3 + [False] * 7
    s = q.stats()
    assert s.dropped_full == 7
    assert s.partition_used(0) == 3
    rec.gate.set()
    assert rec.wait_items(4)
    q.shutdown()
    assert [x for x in rec.items if not isinstance(x, Blocker)] == [0, 1, 2]
    s = q.stats()
    assert s.produced == 4 and s.dropped_full == 7 and s.dispatched == 4


def test_if_possible_produce_many_returns_accepted_count(qname):
    rec = blocked_consumer()
    q = new_queue(qname, consumer=rec, buffer_size=4, strategy=BufferStrategy.IF_POSSIBLE)
    stuck(q, rec)
    assert q.produce_many(range(10)) == 4
    assert q.produce_many(range(100, 103)) == 0
    assert q.stats().dropped_full == 9
    rec.gate.set()
    q.shutdown()
    assert [x for x in rec.items if not isinstance(x, Blocker)] == [0, 1, 2, 3]


def test_if_possible_accepts_again_once_drained(qname):
    rec = Recorder()
    q = new_queue(qname, consumer=rec, buffer_size=2, strategy=BufferStrategy.IF_POSSIBLE)
    for i in range(20):
        assert q.produce(i)
        assert rec.wait_items(i + 1)
    assert q.stats().dropped_full == 0


# ---------------------------------------------------------------- produce_many and after shutdown


def test_produce_many_accepts_iterables_and_returns_counts(qname):
    rec = Recorder()
    q = new_queue(qname, consumer=rec)
    assert q.produce_many([]) == 0
    assert q.produce_many(iter(range(5))) == 5
    assert q.produce_many(x for x in range(5, 12)) == 7
    assert q.produce_many([A(1), B(2), 3, "four"]) == 4
    assert rec.wait_items(16)
    assert q.stats().produced == 16


def test_produce_many_multi_type_handler_map(qname):
    recs = {t: Recorder(t.__name__, expect_type=t) for t in (A, B, C)}
    q = new_queue(qname, partitions=PartitionPolicy.fixed(2))
    for t, r in recs.items():
        q.add_handler(t, r)
    items = [t(i) for i in range(30) for t in (A, B, C)]
    assert q.produce_many(items) == 90
    q.shutdown()
    for r in recs.values():
        assert [x.id for x in r.items] == list(range(30))
        assert r.wrong_type == 0


def test_produce_after_shutdown_returns_false(qname):
    rec = Recorder()
    q = new_queue(qname, consumer=rec)
    assert q.is_running
    assert q.produce(1)
    q.shutdown()
    assert not q.is_running
    assert q.produce(2) is False
    assert q.produce_many([3, 4, 5]) == 0
    assert q.produce_many(iter([6])) == 0
    assert rec.items == [1]
    assert q.stats().produced == 1


# ---------------------------------------------------------------- selectors


def _partition_of(q, produce):
    """Produce while the only drain task is stuck and report which partitions grew (index -> delta)."""
    before = q.stats().partition_used_counts
    produce()
    after = q.stats().partition_used_counts
    return {i: a - b for i, (a, b) in enumerate(zip(after, before)) if a != b}


def test_type_hash_is_default_and_puts_a_type_in_one_partition(qname):
    rec = blocked_consumer()
    q = new_queue(qname, consumer=rec, partitions=PartitionPolicy.fixed(4))
    stuck(q, rec)
    seen = {}
    for t in make_types(8, "Th"):
        delta = _partition_of(q, lambda: [q.produce(t(i)) for i in range(5)])  # noqa: B023 (called at once)
        assert len(delta) == 1 and list(delta.values()) == [5]
        seen[t] = next(iter(delta))
        delta = _partition_of(q, lambda: q.produce_many([t(i) for i in range(3)]))  # noqa: B023
        assert delta == {seen[t]: 3}
    assert len(set(seen.values())) > 1  # 8 types over 4 partitions do not all collide
    sel = PartitionSelector.type_hash()
    for n in (1, 3, 7, 64):
        assert {sel(A(i), n) for i in range(20)} == {sel(A(0), n)}
        assert 0 <= sel(B(0), n) < n


def test_key_hash_puts_equal_keys_in_one_partition(qname):
    rec = blocked_consumer()
    sel = PartitionSelector.key_hash(lambda item: item[0])
    q = new_queue(qname, consumer=rec, partitions=PartitionPolicy.fixed(4), partition_selector=sel)
    stuck(q, rec, ("blocker", 0))
    parts = {}
    for key in ["a", "b", "c", "d", "e", "f", 1, 2, 3]:
        # different item types and payloads, one key
        delta = _partition_of(q, lambda: [q.produce((key, i)) for i in range(3)] + [q.produce([key, "x"])])  # noqa: B023
        assert list(delta.values()) == [4]
        parts[key] = next(iter(delta))
    assert len(set(parts.values())) > 1
    for n in (2, 5, 16):
        assert sel(("k", 1), n) == sel(["k", 2], n)
        assert all(0 <= sel((k, 0), n) < n for k in range(50))


def test_custom_callable_selector_is_called_with_partition_count(qname):
    rec = blocked_consumer()
    calls = []

    def selector(item, n):
        calls.append((item, n))
        return item % n

    q = new_queue(qname, consumer=rec, partitions=PartitionPolicy.fixed(4), partition_selector=selector)
    stuck(q, rec, 0)
    calls.clear()
    for x in [1, 1, 1, 2, 5, 7]:
        assert q.produce(x)
    assert q.produce_many([3, 11, 8]) == 3
    assert q.stats().partition_used_counts == (1, 4, 1, 3)
    assert [x for x, _ in calls] == [1, 1, 1, 2, 5, 7, 3, 11, 8]
    assert {n for _, n in calls} == {4}
    rec.gate.set()
    q.shutdown()
    assert sorted(rec.items) == [0, 1, 1, 1, 2, 3, 5, 7, 8, 11]


def test_selector_not_called_with_one_partition(qname):
    def selector(item, n):
        raise AssertionError("selector called with one partition")

    rec = Recorder()
    q = new_queue(qname, consumer=rec, partition_selector=selector)
    assert q.partition_count == 1
    assert q.produce(1)
    assert q.produce_many([2, 3]) == 2
    q.shutdown()
    assert rec.items == [1, 2, 3]


@pytest.mark.parametrize("bad", [4, 5, -1, 100])
def test_selector_out_of_range_raises(qname, bad):
    rec = Recorder()
    q = new_queue(
        qname,
        consumer=rec,
        partitions=PartitionPolicy.fixed(4),
        partition_selector=lambda item, n: bad if item == "bad" else 0,
    )
    with pytest.raises(ValueError):
        q.produce("bad")
    with pytest.raises(ValueError):
        q.produce_many(["bad"])
    assert q.produce("ok")
    q.shutdown()
    assert rec.items == ["ok"]
    assert q.stats().produced == 1


def test_key_hash_handler_map_routes_by_key_but_dispatches_by_type(qname):
    recs = {t: Recorder(t.__name__, expect_type=t) for t in (A, B)}
    q = new_queue(
        qname,
        threads=ThreadPolicy.fixed(2),
        partitions=PartitionPolicy.fixed(4),
        partition_selector=PartitionSelector.key_hash(lambda it: it.id % 5),
    )
    for t, r in recs.items():
        q.add_handler(t, r)
    for i in range(200):
        assert q.produce(A(i) if i % 2 else B(i))
    q.shutdown()
    assert sorted(recs[A].ids) == list(range(1, 200, 2))
    assert sorted(recs[B].ids) == list(range(0, 200, 2))
    assert all(r.overlaps == 0 and r.wrong_type == 0 for r in recs.values())


def test_plain_items_of_builtin_types_work(qname):
    rec = Recorder()
    q = new_queue(qname, consumer=rec, partitions=PartitionPolicy.fixed(3))
    items = [1, "s", 2.5, (1,), None, Item(1)]
    assert q.produce_many(items) == len(items)
    q.shutdown()
    assert sorted(map(repr, rec.items)) == sorted(map(repr, items))
