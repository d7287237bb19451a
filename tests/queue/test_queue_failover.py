"""Failover of a stuck handler call (seeds 002 and 003): once a call has run longer than slow_handler_ms, the stuck
task's other partitions go to healthy tasks (or, when it is the only one, to a stand-in task) without waiting for
its fence; the stuck type's own items wait and flow when the call returns, and the task rejoins. Exact counts, no
overlapping calls, the listener told (on_lost), stats counted."""

from __future__ import annotations

import itertools
import logging
import threading
import time

import pytest
from queue_testlib import Recorder, in_background, make_gate, make_types, new_queue

from drainpipe import PartitionPolicy, ThreadPolicy
from testlib import wait_until

SLOW_MS = 200
HANG_S = 1.6


class Events:
    def __init__(self) -> None:
        self.events: list[tuple[str, int, tuple[int, ...]]] = []

    def on_revoked(self, task, partitions, types):
        self.events.append(("revoked", task, partitions))

    def on_assigned(self, task, partitions, types):
        self.events.append(("assigned", task, partitions))

    def on_lost(self, task, partitions, types):
        self.events.append(("lost", task, partitions))


def _scenario(qname: str, threads: int) -> dict:
    """8 types, one partition each; the first type on task 0 hangs for HANG_S in one call while items of every type
    keep coming. Returns what each type received, and when."""
    listener = Events()
    q = new_queue(qname, threads=ThreadPolicy.fixed(threads), partitions=PartitionPolicy.fixed(8),
                  slow_handler_ms=SLOW_MS, rebalance_listener=listener)  # fmt: skip
    types = make_types(8, prefix=f"F{threads}")
    recs = {t: Recorder(t.__name__) for t in types}
    arrivals: dict[type, list[float]] = {t: [] for t in types}
    for t in types:
        rec = recs[t]
        original = rec.consume

        def consume(batch, original=original, t=t):
            original(batch)
            arrivals[t].append(time.monotonic())

        rec.consume = consume  # type: ignore[method-assign]
        q.add_handler(t, rec)
    owners = q.partition_owners()
    owner_of = {t: owners[q.partitions_of(t)[0]] for t in types}
    before = q.stats().task_partitions
    stuck = next(t for t in types if owner_of[t] == 0)
    gate, holding = threading.Event(), threading.Event()

    def block_if(batch) -> bool:
        if any(x.flag == "hang" for x in batch):
            holding.set()
            return True
        return False

    recs[stuck].gate = gate
    recs[stuck].block_if = block_if
    sent: dict[type, int] = {t: 0 for t in types}

    def produce(stop: threading.Event) -> None:
        i = 0
        while not stop.is_set():
            for t in types:
                assert q.produce(t(i))
                sent[t] += 1
            i += 1
            time.sleep(0.002)

    with in_background(produce):
        time.sleep(0.1)
        assert q.produce(stuck(-1, flag="hang"))
        sent[stuck] += 1
        assert holding.wait(2)
        hung_at = time.monotonic()
        time.sleep(HANG_S)
        during = q.stats()
        gate.set()
        released_at = time.monotonic()

        # the task rejoins: failed_over is cleared first, then its partitions come back through a fenced handoff
        def rejoined() -> bool:
            s = q.stats()
            return (
                s.failed_over == () and s.task_partitions[:threads] == before and not any(s.task_partitions[threads:])
            )

        wait_until(rejoined, timeout=10, interval=0.01)
    after = q.stats()
    q.shutdown()
    final = q.stats()
    return {"q": q, "types": types, "recs": recs, "arrivals": arrivals, "owner_of": owner_of, "stuck": stuck,
            "sent": sent, "hung_at": hung_at, "released_at": released_at, "during": during, "after": after,
            "final": final, "events": listener.events}  # fmt: skip


def _check(r: dict) -> None:
    recs, arrivals, stuck = r["recs"], r["arrivals"], r["stuck"]
    # nothing lost or handled twice, no overlapping call, the stuck type's items flowed once it returned
    for t in r["types"]:
        ids = [x.id for x in recs[t].items]
        assert len(ids) == len(set(ids)) == r["sent"][t], (t.__name__, len(ids), len(set(ids)), r["sent"][t])
        assert recs[t].overlaps == 0
    # every other type kept flowing while the call was stuck, from SLOW_MS + the watch's period + a margin on
    window = (r["hung_at"] + SLOW_MS / 1000 + 0.4, r["released_at"])
    starved = [t.__name__ for t in r["types"] if t is not stuck
               and not any(window[0] <= a <= window[1] for a in arrivals[t])]  # fmt: skip
    assert starved == [], starved
    assert not any(window[0] <= a <= window[1] for a in arrivals[stuck][1:])  # it really was stuck
    assert r["during"].failovers == 1 and r["during"].failed_over == (0,)
    assert r["after"].failed_over == () and r["final"].failovers == 1
    lost = [e for e in r["events"] if e[0] == "lost"]
    moved = {p for _, _, ps in lost for p in ps}
    assert lost and all(task == 0 for _, task, _ in lost)
    assert moved == {r["q"].partitions_of(t)[0] for t in r["types"] if r["owner_of"][t] == 0 and t is not stuck}


def test_a_stuck_call_fails_its_tasks_other_partitions_over_to_healthy_tasks(qname: str) -> None:
    r = _scenario(qname, threads=2)
    _check(r)
    # they returned to task 0 once its call did
    q = r["q"]
    assert [len(ps) for ps in r["after"].task_partitions] == [4, 4]
    assert len(r["final"].task_partitions) == 2  # no stand-in for a queue with healthy tasks
    assert q.stats().task_partitions == r["after"].task_partitions


def test_a_queue_whose_only_task_is_stuck_gets_a_stand_in(qname: str) -> None:
    r = _scenario(qname, threads=1)
    _check(r)
    assert len(r["during"].task_partitions) == 2 and len(r["during"].task_partitions[1]) == 7  # the stand-in
    assert r["after"].task_partitions[1] == ()  # back on the queue's own task once the call returned


def test_a_consumer_queue_says_it_cannot_fail_over(qname: str, caplog: pytest.LogCaptureFixture) -> None:
    gate = threading.Event()
    got: list = []

    def consumer(batch):
        if any(x.flag == "hang" for x in batch):
            gate.wait(5)
        got.extend(batch)

    types = make_types(2, prefix="FC")
    q = new_queue(qname, threads=ThreadPolicy.fixed(1), consumer=consumer, slow_handler_ms=SLOW_MS)
    with caplog.at_level(logging.WARNING, logger="drainpipe.control"):
        q.produce(types[0](0, flag="hang"))
        time.sleep(SLOW_MS / 1000 + 0.4)
        gate.set()
        q.shutdown()
    assert q.stats().failovers == 0 and len(got) == 1
    assert "cannot fail over" in caplog.text


def test_a_thread_safe_consumer_fails_over_and_round_robin_intake_goes_on(qname: str) -> None:
    """Issue 58's finding: a single-consumer queue with round-robin producers and one consume call hung consumed 0 of
    200 items on the other partitions in 3 s (the producer blocked on the hung task's full partition). Declared
    consumer_thread_safe, the hung task's partitions fail over and every item is consumed while the call hangs;
    exactly once, the held batch when it returns. (Without the declaration: the producer stays blocked.)"""
    gate = make_gate()
    got: list = []
    lock = threading.Lock()

    def consumer(batch):
        if any(x.flag == "hang" for x in batch):
            gate.wait(30)
        with lock:
            got.extend(x.id for x in batch)

    rr = itertools.count()
    (t,) = make_types(1, prefix="FT")
    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(2), buffer_size=2,
                  partition_selector=lambda item, n: next(rr) % n, consumer=consumer, slow_handler_ms=SLOW_MS,
                  consumer_thread_safe=True)  # fmt: skip
    q.produce(t(-1, flag="hang"))
    sent = [0]

    def produce(stop: threading.Event) -> None:
        for i in range(200):
            if stop.is_set():
                return
            q.produce(t(i))
            sent[0] += 1

    with in_background(produce):
        # every item but those the hung call took with it (its batch: task 0's only one) is consumed meanwhile
        wait_until(lambda: q.stats().dispatched == 201 and len(got) == 201 - q.stats().task_dispatched[0],
                   timeout=10, what="the items the hung call does not hold consumed while it hangs")  # fmt: skip
    assert q.stats().failovers >= 1
    gate.set()
    q.shutdown()
    assert sorted(got) == list(range(-1, 200))


class Sometimes:
    """A handler that detects overlapping calls (consume and on_idle alike) and now and then takes longer than
    slow_handler_ms, in consume or in on_idle."""

    def __init__(self, seed: int) -> None:
        import random

        self.rnd = random.Random(seed)
        self.busy = threading.Lock()
        self.ids: list[int] = []
        self.overlaps = 0

    def _slow(self) -> None:
        if self.rnd.random() < 0.03:
            time.sleep(0.03)

    def consume(self, batch) -> None:
        if not self.busy.acquire(blocking=False):
            self.overlaps += 1
            return
        try:
            self.ids.extend(x.id for x in batch)
            self._slow()
        finally:
            self.busy.release()

    def on_idle(self) -> None:
        if not self.busy.acquire(blocking=False):
            self.overlaps += 1
            return
        try:
            self._slow()
        finally:
            self.busy.release()


@pytest.mark.stress
@pytest.mark.parametrize("threads", [1, 3])
def test_failovers_and_rejoins_under_load_lose_nothing_and_never_overlap(qname: str, threads: int) -> None:
    """Calls stuck for 30 ms at random against a 5 ms limit: many failovers and rejoins while items flow."""
    q = new_queue(qname, threads=ThreadPolicy.fixed(threads), partitions=PartitionPolicy.fixed(12), slow_handler_ms=5,
                  min_idle_ms=1, max_idle_ms=5)  # fmt: skip
    types = make_types(12, prefix=f"S{threads}")
    handlers = {t: Sometimes(i) for i, t in enumerate(types)}
    for t, h in handlers.items():
        q.add_handler(t, h)
    sent = 30_000

    def produce(src: int) -> None:
        for i in range(sent // 2):
            q.produce(types[(i * 7 + src) % len(types)](src * sent + i))
            if i % 200 == 0:
                time.sleep(0.002)

    producers = [threading.Thread(target=produce, args=(s,)) for s in range(2)]
    for p in producers:
        p.start()
    for p in producers:
        p.join()
    time.sleep(0.2)
    q.shutdown()
    ids = [i for h in handlers.values() for i in h.ids]
    assert sorted(ids) == sorted(src * sent + i for src in range(2) for i in range(sent // 2))
    assert sum(h.overlaps for h in handlers.values()) == 0
    assert q.stats().failovers > 5


def test_partitions_are_revoked_before_the_stuck_call_is_checked(qname: str) -> None:
    """Deterministic, for the order the failover's safety rests on (revoke, then check that the call is still
    running): at the moment the failover checks, the stuck call returns and its task goes on with its cycle. The
    moved partitions must already be revoked then, so the task cannot start on them while a healthy task gets them.
    Checking first and revoking after fails here every time: the returning task calls the other type's handler and
    the healthy task calls it at the same time (an overlapping call)."""
    import sys

    from drainpipe._drain import Counters

    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(4), slow_handler_ms=400)
    types = make_types(4, prefix="RC")
    recs = {t: Recorder(t.__name__) for t in types}
    for t in types:
        q.add_handler(t, recs[t])
    owners = q.partition_owners()
    owner_of = {t: owners[q.partitions_of(t)[0]] for t in types}
    stuck, other = [t for t in types if owner_of[t] == 0][:2]
    gate, holding, after_release = threading.Event(), threading.Event(), threading.Event()
    recs[stuck].gate, recs[stuck].block_if = gate, lambda batch: holding.set() is None
    recs[other].delay = 0.2  # a call of the other type lasts long enough to be overlapped (not to be stuck)
    original = recs[other].consume

    def other_consume(batch, original=original):
        if gate.is_set():
            after_release.set()  # the other type's handler ran after the stuck call returned
        original(batch)

    recs[other].consume = other_consume  # type: ignore[method-assign]
    counters = q._tasks[0].counters
    seen: dict = {}

    class Spy(Counters):
        """The failover's own reads of task 0's counters: at the first, the stuck call returns and the task gets
        up to a second to go on with its cycle; the failover still sees the stuck call (as if it had read an
        instant before)."""

        __slots__ = ()

        def __getattribute__(self, name: str):
            value = object.__getattribute__(self, name)
            if name in ("calls", "calling") and "calls" in seen and sys._getframe(1).f_code.co_name == "_fail_over":
                if not gate.is_set():
                    gate.set()
                    after_release.wait(1.0)
                return seen[name]
            return value

    sent = {t: 0 for t in types}
    assert q.produce(stuck(-1))
    sent[stuck] += 1
    assert holding.wait(2)
    seen.update(calls=counters.calls, calling=counters.calling)
    counters.__class__ = Spy

    def produce(stop: threading.Event) -> None:
        i = 0
        while not stop.is_set():
            for t in (other, *[t for t in types if t not in (stuck, other)]):
                assert q.produce(t(i))
                sent[t] += 1
            i += 1
            time.sleep(0.005)

    with in_background(produce):
        deadline = time.monotonic() + 5
        while q.stats().failovers == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.6)
    q.shutdown()
    assert q.stats().failovers == 1
    assert all(r.overlaps == 0 for r in recs.values()), {t.__name__: r.overlaps for t, r in recs.items()}
    for t in types:
        assert len(recs[t].items) == len({x.id for x in recs[t].items}) == sent[t], t.__name__
