"""Shutdown: concurrent callers, in-flight handler calls, no loss, idempotence (docs/api.md BatchQueue "Shutdown")."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from queue_testlib import (
    A,
    B,
    Blocker,
    C,
    D,
    Recorder,
    config,
    make_gate,
    make_types,
    new_queue,
    pool_threads,
    queue_threads,
)

from drainpipe import BatchQueue, BufferStrategy, PartitionPolicy, ThreadPolicy
from testlib import wait_until


def test_concurrent_callers_all_return_after_completion(qname):
    rec = Recorder("consumer")
    rec.gate = make_gate()
    first = [True]
    rec.block_if = lambda batch: first.pop() if first else False
    q = new_queue(qname, consumer=rec, shutdown_timeout_ms=20)
    q.produce(Blocker(0))
    assert rec.entered.wait(5)
    for i in range(20):
        assert q.produce(i)
    seen_at_return = []

    def caller():
        q.shutdown()
        seen_at_return.append((len(rec.items), rec.active, q.is_running))

    callers = [threading.Thread(target=caller, daemon=True) for _ in range(4)]
    for t in callers:
        t.start()
    assert wait_until(lambda: not q.is_running)
    assert q.produce(99) is False
    time.sleep(0.1)  # longer than shutdown_timeout_ms
    assert seen_at_return == []  # nobody returns while the handler is in flight
    rec.gate.set()
    for t in callers:
        t.join(5)
        assert not t.is_alive()
    assert seen_at_return == [(21, False, False)] * 4
    assert [x for x in rec.items if not isinstance(x, Blocker)] == list(range(20))
    assert rec.overlaps == 0
    t0 = time.monotonic()
    q.shutdown()  # after completion: returns at once
    assert time.monotonic() - t0 < 0.05


@pytest.mark.parametrize("threads", [1, 2])
def test_final_dispatch_never_overlaps_in_flight_consume(qname, threads):
    """Slow handlers, a 5 ms shutdown timeout: the final dispatch must wait out every in-flight call."""
    types = (A, B, C, D)
    recs = {t: Recorder(t.__name__, delay=0.02, expect_type=t) for t in types}
    q = new_queue(
        qname, threads=ThreadPolicy.fixed(threads), partitions=PartitionPolicy.fixed(4), shutdown_timeout_ms=5
    )
    for t, r in recs.items():
        q.add_handler(t, r)
    n = 0
    for _i in range(50):
        for t in types:
            assert q.produce(t(n))
            n += 1
    assert wait_until(lambda: any(r.active for r in recs.values()))
    q.shutdown()
    assert not any(r.active for r in recs.values())  # no handler is running once shutdown returned
    calls = {t: len(r.batches) for t, r in recs.items()}
    time.sleep(0.05)
    assert {t: len(r.batches) for t, r in recs.items()} == calls
    assert sorted(i for r in recs.values() for i in r.ids) == list(range(n))
    assert all(r.overlaps == 0 and r.wrong_type == 0 for r in recs.values())
    s = q.stats()
    assert s.produced == s.dispatched == n and s.handler_errors == 0


def test_single_consumer_slow_with_zero_timeout_no_overlap(qname):
    rec = Recorder("consumer", delay=0.03)
    q = new_queue(qname, consumer=rec, shutdown_timeout_ms=0, buffer_size=5)
    q.produce_many(range(3))
    assert wait_until(lambda: rec.active)
    assert q.produce_many(range(3, 8)) == 5
    q.shutdown()
    assert not rec.active
    assert rec.items == list(range(8)) and rec.overlaps == 0


def test_final_dispatch_waits_for_in_flight_on_idle(qname):
    gate = make_gate()
    armed = threading.Event()
    in_idle = threading.Event()

    class SlowIdle(Recorder):
        def on_idle(self):
            super().on_idle()
            if armed.is_set() and not in_idle.is_set():
                self._busy.acquire()  # stays "inside" the handler while it waits
                try:
                    in_idle.set()
                    gate.wait(10)
                finally:
                    self._busy.release()

    rec = SlowIdle("A")
    q = new_queue(qname, shutdown_timeout_ms=0)
    q.add_handler(A, rec)
    armed.set()
    assert in_idle.wait(5)
    for i in range(5):
        q.produce(A(i))  # buffered while the only task is in on_idle
    done = threading.Event()
    closer = threading.Thread(target=lambda: (q.shutdown(), done.set()), daemon=True)
    closer.start()
    assert not done.wait(0.1)
    assert rec.items == []  # the final dispatch did not start during on_idle
    gate.set()
    assert done.wait(5)
    assert rec.ids == list(range(5)) and rec.overlaps == 0


@pytest.mark.stress
@pytest.mark.parametrize("strategy", [BufferStrategy.BLOCKING, BufferStrategy.IF_POSSIBLE])
@pytest.mark.parametrize("round_", range(3))
def test_nothing_accepted_is_lost_when_shutdown_races_producers(qname, strategy, round_):
    types = make_types(6, "Race")
    recs = {t: Recorder(t.__name__, expect_type=t) for t in types}
    q = new_queue(
        qname,
        threads=ThreadPolicy.fixed(2),
        partitions=PartitionPolicy.fixed(4),
        buffer_size=64,
        strategy=strategy,
        shutdown_timeout_ms=5,
    )
    for t, r in recs.items():
        q.add_handler(t, r)
    ids = itertools.count()
    accepted: list[list] = [[] for _ in range(4)]
    started = threading.Barrier(5)

    def producer(src):
        started.wait()
        mine = accepted[src]
        k = 0
        while True:
            k += 1
            if k % 3:
                x = types[k % len(types)](next(ids), src, k)
                if q.produce(x):
                    mine.append(x.id)
                elif not q.is_running:
                    return
            else:
                batch = [types[(k + j) % len(types)](next(ids), src, k) for j in range(5)]
                n = q.produce_many(batch)
                mine.append((n, [x.id for x in batch]))
                if n == 0 and not q.is_running:
                    return

    producers = [threading.Thread(target=producer, args=(s,), daemon=True) for s in range(4)]
    for t in producers:
        t.start()
    started.wait()
    assert recs[types[0]].wait_items(50)
    q.shutdown()
    for t in producers:
        t.join(5)
        assert not t.is_alive()

    dispatched = [i for r in recs.values() for i in r.ids]
    assert len(dispatched) == len(set(dispatched))  # exactly once
    got = set(dispatched)
    total_accepted = 0
    for mine in accepted:
        for entry in mine:
            if isinstance(entry, int):  # produce() returned True
                total_accepted += 1
                assert entry in got
            else:  # produce_many() returned n
                n, batch_ids = entry
                total_accepted += n
                assert sum(i in got for i in batch_ids) == n  # exactly that many of its items were dispatched
    assert total_accepted == len(dispatched)  # sum of accepted == items dispatched
    s = q.stats()
    assert s.produced == s.dispatched == len(dispatched)
    assert all(r.overlaps == 0 and r.wrong_type == 0 for r in recs.values())


def test_shutdown_twice_and_after_completion_returns_immediately(qname):
    rec = Recorder()
    q = new_queue(qname, consumer=rec)
    q.produce_many(range(10))
    q.shutdown()
    assert rec.items == list(range(10))
    t0 = time.monotonic()
    for _ in range(5):
        q.shutdown()
    assert time.monotonic() - t0 < 0.05
    assert not q.is_running


def _control_threads():
    return [t for t in threading.enumerate() if t.name == "drainpipe-control"]


def test_shutdown_stops_every_queue_thread(qname):
    """A queue has its pool threads; the control thread is one per process, shared, and ends with the last queue."""
    alive = len(_control_threads())
    q = BatchQueue(qname, config(threads=ThreadPolicy.fixed(3), partitions=PartitionPolicy.fixed(3)))
    q2 = BatchQueue(qname + "_b", config(threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(2)))
    assert len(queue_threads(qname)) == 3  # its pool threads, and no thread of its own for control
    assert len(_control_threads()) == 1
    q.shutdown()
    assert pool_threads(qname) == []
    assert len(_control_threads()) == 1  # still serving q2
    q2.shutdown()
    if alive == 0:  # no other queue of this process is alive: the control thread ends
        assert wait_until(lambda: _control_threads() == [], timeout=2)


def test_shutdown_from_a_handler_on_a_drain_thread_returns(qname):
    returned = threading.Event()
    got = []

    def handler(batch):
        got.extend(batch)
        if any(x.flag == "stop" for x in batch):
            q.shutdown()  # would wait for itself if it blocked here
            returned.set()

    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(2))
    q.add_handler(A, handler)
    q.produce_many([A(1), A(2, flag="stop")])
    assert returned.wait(5)
    assert not q.is_running
    q.shutdown()
    assert [x.id for x in got] == [1, 2]


def test_shutdown_timeout_zero_still_delivers_everything(qname):
    rec = Recorder("A", expect_type=A)
    q = new_queue(
        qname,
        threads=ThreadPolicy.fixed(2),
        partitions=PartitionPolicy.fixed(2),
        shutdown_timeout_ms=0,
        min_idle_ms=50,
        max_idle_ms=50,
    )
    q.add_handler(A, rec)
    q.produce_many([A(i) for i in range(1000)])
    q.shutdown()
    assert rec.ids == list(range(1000))


def test_shutdown_from_a_handler_during_the_final_drain_does_not_deadlock(qname):
    gate = make_gate()
    entered = threading.Event()

    def handler(batch):
        if any(x.flag == "block" for x in batch):
            entered.set()
            gate.wait(10)
        if any(x.flag == "stop" for x in batch):
            q.shutdown()  # e.g. a poison pill; here dispatched by the final drain

    # not registered with the manager: if the bug is present the queue never finishes shutting down
    q = BatchQueue(qname, config(shutdown_timeout_ms=0))
    q.add_handler(A, handler)
    q.produce(A(0, flag="block"))
    assert entered.wait(5)
    q.produce(A(1, flag="stop"))  # buffered behind the blocked cycle -> final drain
    closer = threading.Thread(target=q.shutdown, daemon=True)
    closer.start()
    assert wait_until(lambda: not q.is_running)
    gate.set()
    closer.join(1.5)
    assert not closer.is_alive(), "shutdown() deadlocked"


def test_a_produce_still_routing_when_shutdown_completes_is_refused_not_lost(qname):
    """The race the fast path closes: a producer checked the closing flag, then ran Python code while routing (a
    split type's key), and shutdown finished its final drain meanwhile. Its append must be refused (False), not
    land in a partition nobody will drain."""

    class Hot:
        __slots__ = ("n", "block")

        def __init__(self, n, block=False):
            self.n, self.block = n, block

    routing = threading.Event()
    release = threading.Event()

    def key(item):
        if item.block:
            routing.set()
            release.wait(5)
        return item.n

    got: list = []
    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(4))
    q.add_handler(Hot, lambda: got.extend, split=True, key=key)
    assert q.produce(Hot(1)) and q.produce_many([Hot(2), Hot(3)]) == 2
    result: list = []
    producer = threading.Thread(target=lambda: result.append(q.produce(Hot(4, block=True))), daemon=True)
    producer.start()
    assert routing.wait(5)  # past the first closing check, inside the key function
    q.shutdown()  # stops intake and runs the final drain
    release.set()
    producer.join(5)
    assert result == [False]
    s = q.stats()
    assert s.produced == s.dispatched == 3 and sorted(x.n for x in got) == [1, 2, 3]
