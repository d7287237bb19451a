"""BatchQueue.events(): what happened to a queue, for an application to poll (the design's background-to-application
event queue): ownership changes in the listener's order, handler errors, failovers; bounded, what it drops
counted."""

from __future__ import annotations

import threading
import time

import pytest
from queue_testlib import Recorder, make_gate, make_types, new_queue

from drainpipe import PartitionPolicy, QueueEvent, ThreadPolicy
from drainpipe.errors import ConfigError
from testlib import wait_until


def test_events_tell_ownership_errors_and_a_failover_in_order(qname: str) -> None:
    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(6), slow_handler_ms=60,
                  event_queue_size=1000)  # fmt: skip
    types = make_types(6, prefix="EV")
    recs = {t: Recorder(t.__name__, fail_if=lambda batch: any(x.flag == "bad" for x in batch)) for t in types}
    for t in types:
        q.add_handler(t, recs[t])
    first = q.events()
    assert [e.kind for e in first] == ["assigned", "assigned"]  # the initial assignment, per task
    assert sorted(p for e in first for p in e.partitions) == list(range(6))
    assert all(isinstance(e, QueueEvent) and e.at > 0 for e in first)

    q.produce(types[0](1, flag="bad"))
    (err,) = q.events(timeout=5)
    assert err.kind == "handler_error" and err.types == (types[0],) and err.items == 1
    assert isinstance(err.error, ValueError)

    owners = q.partition_owners()
    stuck = next(t for t in types if owners[q.partitions_of(t)[0]] == 0)
    gate = make_gate()
    recs[stuck].gate = gate
    q.produce(stuck(2))
    seen: list[QueueEvent] = []
    wait_until(lambda: seen.extend(q.events()) or any(e.kind == "assigned" for e in seen), timeout=10)
    gate.set()
    kinds = [e.kind for e in seen]
    assert kinds[:2] == ["slow_call", "failover"], kinds
    failover = seen[1]
    assert failover.task == 0 and failover.partitions
    lost = next(e for e in seen if e.kind == "lost")
    assigned = next(e for e in seen if e.kind == "assigned")
    assert lost.task == 0 and set(lost.partitions) == set(failover.partitions) == set(assigned.partitions)
    assert kinds.index("lost") < kinds.index("assigned")


def test_events_wait_for_the_first_and_a_full_queue_drops_the_oldest(qname: str) -> None:
    q = new_queue(qname, threads=ThreadPolicy.fixed(1), partitions=PartitionPolicy.fixed(1), event_queue_size=3)
    (t,) = make_types(1, prefix="EW")
    q.add_handler(t, Recorder(fail_if=lambda batch: True))
    assert [e.kind for e in q.events()] == ["assigned"]
    got: list[QueueEvent] = []
    waiter = threading.Thread(target=lambda: got.extend(q.events(timeout=10)))
    waiter.start()
    time.sleep(0.05)  # the waiter is (very likely) inside its wait; either way it must return the event
    q.produce(t(0))
    waiter.join(10)
    assert [e.kind for e in got] == ["handler_error"]
    for i in range(5):
        q.produce(t(i))
        wait_until(lambda i=i: q.stats().handler_errors == i + 2)
    assert q.stats().events_dropped == 2
    assert [e.kind for e in q.events(max_events=2)] == ["handler_error"] * 2
    assert len(q.events()) == 1 and q.events() == []


def test_events_need_an_event_queue(qname: str) -> None:
    q = new_queue(qname)
    with pytest.raises(ConfigError, match="event_queue_size"):
        q.events()
