"""The rebalance listener: each task hears the partitions (and types) it loses and gains, a partition's on_revoked
before its on_assigned, revoked only once the old owner has left its cycle and assigned before the new owner gets
them; the initial assignment, growth and shutdown are told too; a failing listener does not stop the rebalance, and
a slow one holds up its own queue only. (Every change, in order, per partition: test_queue_listener_ledger.py.)"""

from __future__ import annotations

import threading
import time

import pytest
from queue_testlib import Recorder, in_background, make_types, new_queue

from drainpipe import DrainBalancer, PartitionPolicy, ThreadPolicy
from testlib import wait_until


class Log:
    def __init__(self, q_box: list, fail: bool = False) -> None:
        self.events: list[tuple[str, int, tuple[int, ...], tuple[type, ...]]] = []
        self.q_box = q_box
        self.fail = fail
        self.lock = threading.Lock()
        self.watching = False  # from the rebalance on: the initial assignment is told before, with owners set

    def on_revoked(self, task, partitions, types):
        owners = self.q_box[0].partition_owners()
        # the old owner has left its cycle and does not own these any more
        assert all(owners[p] == -1 for p in partitions)
        with self.lock:
            self.events.append(("revoked", task, partitions, types))
        if self.fail:
            raise RuntimeError("listener bug")

    def on_assigned(self, task, partitions, types):
        if not self.watching:
            return
        owners = self.q_box[0].partition_owners()
        assert all(owners[p] == -1 for p in partitions)  # not handed over yet: no one drains them
        with self.lock:
            self.events.append(("assigned", task, partitions, types))


@pytest.mark.parametrize("fail", [False, True])
def test_revoked_before_assigned_with_partitions_and_types(qname: str, fail: bool) -> None:
    box: list = []
    listener = Log(box, fail=fail)
    q = new_queue(qname, threads=ThreadPolicy.fixed(3), partitions=PartitionPolicy.fixed(12),
                  balancer=DrainBalancer.throughput_weighted(), rebalance_listener=listener)  # fmt: skip
    box.append(q)
    types = make_types(12)
    recs = [Recorder(t.__name__) for t in types]
    for t, r in zip(types, recs):
        q.add_handler(t, r)
    owner_before = q.partition_owners()
    # load: the types on task 0's partitions are hot
    hot = [t for t in types if owner_before[q.partitions_of(t)[0]] == 0]
    for i in range(3000):
        q.produce(hot[i % len(hot)](i))
    for t in types:
        q.produce(t(-1))
    listener.watching = True
    result = q.rebalance_now(timeout=5)
    assert result.moved > 0
    for p in {p for _, _, ps, _ in listener.events for p in ps}:  # each partition: revoked, then assigned
        assert [e[0] for e in listener.events if p in e[2]] == ["revoked", "assigned"]
    revoked = {p for e in listener.events if e[0] == "revoked" for p in e[2]}
    assigned = {p for e in listener.events if e[0] == "assigned" for p in e[2]}
    moved = {p for p, _, _ in result.moves}
    assert revoked == assigned == moved
    for kind, task, partitions, tps in listener.events:
        for p, old, new in result.moves:
            if p in partitions:
                assert task == (old if kind == "revoked" else new)
        assert set(tps) == {t for t in types if q.partitions_of(t)[0] in partitions}
    assert all(r.overlaps == 0 for r in recs)


class Slow:
    """A listener whose on_assigned takes ``seconds``; it records what each moved type's handler did meanwhile."""

    def __init__(self, recorders: dict, seconds: float) -> None:
        self.recorders = recorders
        self.seconds = seconds
        self.calls_during: list[int] = []
        self.events: list[tuple[str, int, tuple[int, ...]]] = []
        self.asleep = threading.Event()  # set as a callback begins its sleep

    def on_revoked(self, task, partitions, types):
        self.events.append(("revoked", task, partitions))

    def on_assigned(self, task, partitions, types):
        self.events.append(("assigned", task, partitions))
        before = sum(len(self.recorders[t].batches) for t in types)
        self.asleep.set()
        time.sleep(self.seconds)
        self.calls_during.append(sum(len(self.recorders[t].batches) for t in types) - before)


def _hot_queue(qname: str, listener, n: int = 12):
    q = new_queue(qname, threads=ThreadPolicy.fixed(3), partitions=PartitionPolicy.fixed(n),
                  balancer=DrainBalancer.throughput_weighted(), rebalance_listener=listener)  # fmt: skip
    types = make_types(n, prefix=qname[-6:])
    return q, types


def test_the_new_owner_starts_only_after_on_assigned_returns(qname: str) -> None:
    """Measured before the fix: the new owner consumed 1 to 151 batches during a 0.2 s on_assigned."""
    recorders: dict = {}
    listener = Slow(recorders, 0.2)
    q, types = _hot_queue(qname, listener)
    for t in types:
        recorders[t] = Recorder(t.__name__)
        q.add_handler(t, recorders[t])
    owner = q.partition_owners()
    hot = [t for t in types if owner[q.partitions_of(t)[0]] == 0]

    def produce(stop: threading.Event) -> None:  # items keep arriving for every type while the handoff runs
        i = 0
        while not stop.is_set():
            q.produce_many([t(i) for t in types] + [h(i) for h in hot for _ in range(20)])
            i += 1
            time.sleep(0.001)

    with in_background(produce):
        time.sleep(0.05)
        result = q.rebalance_now(timeout=10)
        deadline = time.monotonic() + 5
        while len(listener.calls_during) < sum(e[0] == "assigned" for e in listener.events):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert result.moved > 0 and listener.calls_during and all(n == 0 for n in listener.calls_during), (
        listener.calls_during
    )
    assert all(r.overlaps == 0 for r in recorders.values())


def test_the_initial_assignment_growth_and_shutdown_are_told(qname: str) -> None:
    events: list[tuple[str, int, tuple[int, ...]]] = []

    class Log2:
        def on_revoked(self, task, partitions, types):
            events.append(("revoked", task, partitions))

        def on_assigned(self, task, partitions, types):
            events.append(("assigned", task, partitions))

    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.adaptive(1),
                  rebalance_listener=Log2())  # fmt: skip
    start = q.partition_count
    wait_until(lambda: len(events) == 2, what="each task's initial on_assigned")
    assert sorted(events) == [("assigned", t, ps) for t, ps in enumerate(q.assigned_partitions)]
    types = make_types(6, prefix="G")
    for t in types:
        q.add_handler(t, Recorder())
    grown = {p for kind, _, ps in events[2:] if kind == "assigned" for p in ps}
    assert q.partition_count > start and grown == set(range(start, q.partition_count))
    owners = q.partition_owners()
    for _, task, ps in events:  # each partition told to the task that owns it
        assert all(owners[p] == task for p in ps)
    assigned_now = [tuple(ps) for ps in q.assigned_partitions]
    q.produce_many([t(0) for t in types])
    q.shutdown()
    farewell = [(task, ps) for kind, task, ps in events if kind == "revoked"]
    assert sorted(farewell) == [(t, ps) for t, ps in enumerate(assigned_now) if ps]  # every task, once, at the end


def test_a_slow_listener_holds_up_its_own_queue_only(qname: str) -> None:
    """Listener callbacks run on the queue's own drain threads, not on the control thread that every queue shares:
    while one queue's listener sleeps for 1.5 s, another queue's rebalance completes at once."""
    recorders: dict = {}
    listener = Slow(recorders, 1.5)
    slow_q, slow_types = _hot_queue(qname, listener)
    fast_q, fast_types = _hot_queue(qname + "-fast", None)
    for t in slow_types + fast_types:
        recorders[t] = Recorder(t.__name__)
    for q, ts in ((slow_q, slow_types), (fast_q, fast_types)):
        for t in ts:
            q.add_handler(t, recorders[t])
        owner = q.partition_owners()
        for i in range(3000):
            q.produce([t for t in ts if owner[q.partitions_of(t)[0]] == 0][i % 4](i))
    slow = threading.Thread(target=slow_q.rebalance_now, kwargs={"timeout": 10})
    slow.start()
    assert listener.asleep.wait(10)  # the slow queue's listener is asleep now
    t0 = time.monotonic()
    result = fast_q.rebalance_now(timeout=10)
    took = time.monotonic() - t0
    slow.join()
    assert result.moved > 0 and took < 0.5, took


def test_revoked_is_told_only_after_the_old_owner_left_its_cycle(qname: str) -> None:
    """Deterministic: the old owner is held inside a handler call (a batch of a type on one of its partitions) while
    a rebalance moves partitions away from it; on_revoked must not be told until that call has returned, since the
    old owner still works on what it took in that cycle. (Telling it at revoke time, before the fence, fails here
    every time: the call is still running.)"""
    entered, release = threading.Event(), threading.Event()
    seen_busy: list[bool] = []

    class Held(Recorder):
        hold = False

        def consume(self, batch: list) -> None:
            if self.hold:
                entered.set()
                release.wait(5)
            super().consume(batch)

    class Listener:
        def on_revoked(self, task, partitions, types):
            seen_busy.append(not release.is_set())

        def on_assigned(self, task, partitions, types):
            pass

    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(8),
                  balancer=DrainBalancer.throughput_weighted(), rebalance_listener=Listener())  # fmt: skip
    types = make_types(8, prefix="RV")
    recs = {t: Held(t.__name__) for t in types}
    for t in types:
        q.add_handler(t, recs[t])
    owner = q.partition_owners()
    on_zero = [t for t in types if owner[q.partitions_of(t)[0]] == 0]
    held = on_zero[0]
    recs[held].hold = True
    for i in range(4000):  # task 0's other types hot: the plan moves some of them to task 1
        q.produce(on_zero[1 + i % (len(on_zero) - 1)](i))
    q.produce(held(-1))
    assert entered.wait(5)  # task 0 is inside the held call now
    result: list = []
    with in_background(lambda stop: result.append(q.rebalance_now(timeout=10))):
        time.sleep(0.3)  # the rebalance revokes, then waits for task 0's cycle
        assert seen_busy == []
        release.set()
        deadline = time.monotonic() + 10
        while not result and time.monotonic() < deadline:
            time.sleep(0.01)
    assert result and result[0].moved > 0 and all(old == 0 for _, old, _ in result[0].moves)
    assert seen_busy and not any(seen_busy)
