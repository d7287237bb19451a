"""Supervision: a drain cycle that raises (an internal error, a MemoryError, anything) restarts its task at once
in the same slot, hands on the items that cycle held, and counts the restart; nothing vanishes, no handler runs
twice at once, no partition keeps a dead owner."""

from __future__ import annotations

import threading
import time

import pytest
from queue_testlib import A, B, Item, Recorder, make_types, new_queue

import drainpipe._drain as drain_module
from drainpipe import BufferStrategy, PartitionPolicy, ThreadPolicy
from testlib import wait_until


def failing_once(real, exc: BaseException, after: int = 0):
    """``real`` that raises ``exc`` on its (after+1)-th call only."""
    calls = [0]
    lock = threading.Lock()

    def fake(*args, **kwargs):
        with lock:
            calls[0] += 1
            n = calls[0]
        if n == after + 1:
            raise exc
        return real(*args, **kwargs)

    return fake


@pytest.mark.parametrize("where", ["grouping", "handing on"])
def test_a_failed_cycle_hands_on_what_it_held_and_draining_resumes_within_100_ms(
    qname: str, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(4))
    ra, rb = Recorder("a", expect_type=A), Recorder("b", expect_type=B)
    q.add_handler(A, ra)
    q.add_handler(B, rb)
    if where == "grouping":  # the C grouping step raises MemoryError once: the whole partition is in hand
        monkeypatch.setattr(drain_module, "group_by_type", failing_once(drain_module.group_by_type, MemoryError()))
    else:  # after grouping, between two handler calls (an internal error): part of the partition is in hand
        monkeypatch.setattr(
            drain_module.Dispatcher, "_invoke", failing_once(drain_module.Dispatcher._invoke, RuntimeError("bug"))
        )
    items = [A(i) if i % 2 else B(i) for i in range(11)]
    assert q.produce_many(items) == 11
    assert wait_until(lambda: q.stats().task_restarts == 1, 2)
    # draining resumes at once: items produced after the failure reach their handlers within 100 ms
    t0 = time.monotonic()
    later = [A(100 + i) if i % 2 else B(100 + i) for i in range(10)]
    q.produce_many(later)
    assert wait_until(lambda: len(ra.items) + len(rb.items) == 21, 1.0)
    assert time.monotonic() - t0 < 0.1
    s = q.stats()
    assert sorted(x.id for x in ra.items + rb.items) == sorted(x.id for x in items + later)  # each once
    assert s.lost == 0 and s.produced == s.dispatched == 21 and s.task_restarts == 1
    assert ra.overlaps == rb.overlaps == 0 and ra.wrong_type == rb.wrong_type == 0
    assert all(owner >= 0 for owner in q.partition_owners())


def test_a_failure_in_the_consumer_path_is_handed_on(qname: str, monkeypatch: pytest.MonkeyPatch) -> None:
    got: list = []
    q = new_queue(qname, consumer=got.extend, partitions=PartitionPolicy.fixed(2))
    monkeypatch.setattr(
        drain_module.Dispatcher, "_invoke", failing_once(drain_module.Dispatcher._invoke, MemoryError())
    )
    q.produce_many([Item(i) for i in range(50)])
    assert wait_until(lambda: len(got) == 50, 2)
    assert q.stats().task_restarts == 1 and q.stats().lost == 0


def test_items_that_cannot_be_handed_on_are_counted_lost_never_silent(
    qname: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    q = new_queue(qname, partitions=PartitionPolicy.fixed(1), strategy=BufferStrategy.BLOCKING)
    rec = Recorder("a")
    q.add_handler(A, rec)
    real = drain_module.Dispatcher._invoke
    failures = [2]  # the cycle fails, and handing on fails too

    def broken(self, target, batch, counters):
        if failures[0]:
            failures[0] -= 1
            raise MemoryError()
        return real(self, target, batch, counters)

    monkeypatch.setattr(drain_module.Dispatcher, "_invoke", broken)
    q.produce_many([A(i) for i in range(7)])
    assert wait_until(lambda: q.stats().lost == 7, 2)
    q.produce_many([A(i) for i in range(7, 10)])  # and the task goes on
    assert rec.wait_items(3, 2)
    s = q.stats()
    assert s.produced == 10 and s.dispatched + s.lost == 10 and s.task_restarts == 1
    assert "7 item(s) lost" in caplog.text


def test_supervision_under_stress_accounts_for_every_item(qname: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Failures injected at random cycles while 4 producers run: produced = dispatched + lost, lost = 0, and
    the overlap detector stays at zero."""
    import random

    rng = random.Random(3)
    real = drain_module.group_by_type
    lock = threading.Lock()

    def flaky(items):
        with lock:
            fail = rng.random() < 0.2
        if fail:
            raise MemoryError()
        return real(items)

    monkeypatch.setattr(drain_module, "group_by_type", flaky)
    q = new_queue(qname, threads=ThreadPolicy.fixed(3), partitions=PartitionPolicy.fixed(8), buffer_size=32,
                  strategy=BufferStrategy.BLOCKING, rebalance_interval_ms=20)  # fmt: skip
    types = make_types(6)
    recs = {t: Recorder(t.__name__, expect_type=t) for t in types}
    for t, r in recs.items():
        q.add_handler(t, r)

    def produce(k: int) -> None:
        for i in range(2000):
            q.produce(types[(i * 7 + k) % 6]((k, i)))

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wait_until(lambda: sum(len(r.items) for r in recs.values()) == 8000, 10)
    s = q.stats()
    assert s.task_restarts > 0 and s.lost == 0 and s.produced == s.dispatched == 8000
    ids = [x.id for r in recs.values() for x in r.items]
    assert len(set(ids)) == 8000
    assert all(r.overlaps == 0 and r.wrong_type == 0 for r in recs.values())


class _SwapAll:
    """A balancer that moves every partition to the next task."""

    def assign(self, tp, owner, n, spread=None):
        return [(o + 1) % n for o in owner]


def test_what_a_failed_cycle_held_is_handed_on_inside_its_fence(qname: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The items a failed cycle held are handed on before the task leaves the cycle: a handoff of their partition
    waits for that, so its new owner never calls the handler while the hand-on is inside it (it did, once the
    hand-on ran after the cycle: one overlapping call in this case)."""
    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(2), balancer=_SwapAll())
    ra = Recorder("a", expect_type=A, delay=0.3)
    q.add_handler(A, ra)
    monkeypatch.setattr(drain_module, "group_by_type", failing_once(drain_module.group_by_type, MemoryError()))
    assert q.produce_many([A(i) for i in range(10)]) == 10
    assert ra.entered.wait(5)  # the hand-on's call is in the handler (0.3 s)
    q.rebalance_now(timeout=5)  # moves the partition to the other task
    q.produce_many([A(100 + i) for i in range(3)])  # the new owner's call
    assert wait_until(lambda: len(ra.items) == 13, 5)
    assert ra.overlaps == 0 and sorted(x.id for x in ra.items) == [*range(10), 100, 101, 102]
    assert q.stats().task_restarts == 1 and q.stats().lost == 0
