"""A stuck handler holds no one else hostage: a moved partition waits only for its own old owner, the control thread
never blocks on a fence (control calls about other types return at once), requests about the stuck type wait their
turn, and the stuck call is reported (slow_handler_ms). Never two concurrent calls, never a lost item."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from queue_testlib import A, B, C, Recorder, first_call_blocks, make_types, new_queue

from drainpipe import BufferStrategy, PartitionPolicy, ThreadPolicy
from testlib import wait_until


class Scripted:
    """A balancer that plays back plans: each ``assign`` returns the next, or None when there are none left."""

    def __init__(self) -> None:
        self.plans: list[list[int]] = []

    def assign(self, throughput, current_owner, task_count, spread=None):
        return self.plans.pop(0) if self.plans else None


def _setup(qname: str, **kw):
    balancer = Scripted()
    q = new_queue(qname, threads=ThreadPolicy.fixed(3), partitions=PartitionPolicy.fixed(6), balancer=balancer,
                  strategy=BufferStrategy.IF_POSSIBLE, buffer_size=1000, **kw)  # fmt: skip
    stuck, healthy = Recorder("a"), Recorder("b")
    gate = first_call_blocks(stuck)
    q.add_handler(A, stuck)
    q.add_handler(B, healthy)
    (pa,), (pb,) = q.partitions_of(A), q.partitions_of(B)
    owner = q.partition_owners()
    assert owner[pa] != owner[pb]
    third = ({0, 1, 2} - {owner[pa], owner[pb]}).pop()
    q.produce(A(0))
    assert stuck.entered.wait(2)  # A's handler is now stuck in consume on its owner's thread
    return q, balancer, stuck, healthy, gate, pa, pb, third


def test_a_move_waits_only_for_its_own_old_owner(qname: str) -> None:
    q, balancer, stuck, healthy, gate, pa, pb, third = _setup(qname)
    owner = q.partition_owners()
    stuck_owner = owner[pa]
    plan = list(owner)
    plan[pa] = plan[pb] = third  # one rebalance moves the stuck partition and the healthy one
    balancer.plans.append(plan)
    with pytest.raises(TimeoutError):  # the rebalance as a whole waits for the stuck owner...
        q.rebalance_now(timeout=0.2)
    # ... but the healthy partition was assigned at once, and its items flow (none dropped: IF_POSSIBLE)
    owner = q.partition_owners()
    assert owner[pb] == third
    assert owner[pa] == -1
    t0 = time.monotonic()
    assert all(q.produce(B(i)) for i in range(100))
    assert healthy.wait_items(100, timeout=0.5), len(healthy.items)
    assert time.monotonic() - t0 < 0.5
    assert q.stats().dropped_full == 0
    # control calls about other types do not wait behind the stuck fence (a removal waits only for the owner of
    # the type's partition: one owned by the stuck task would rightly wait)
    t0 = time.monotonic()
    others = make_types(4, "Other")
    for t in others:
        q.add_handler(t, Recorder(t.__name__), timeout=1)
    owner = q.partition_owners()
    free = [t for t in others if owner[q.partitions_of(t)[0]] not in (-1, stuck_owner)]
    assert free
    for t in free:
        assert q.remove_handler(t, timeout=1)
    assert time.monotonic() - t0 < 0.1
    assert q.stats().rebalance_state == "fencing"
    gate.set()  # the stuck call ends: its partition reaches its new owner, and everything is delivered
    assert wait_until(lambda: q.partition_owners()[pa] == third, 2)
    assert q.stats().rebalance_state == "stable"
    q.produce(A(1))
    assert stuck.wait_items(2)
    assert sorted(stuck.ids) == [0, 1] and sorted(healthy.ids) == list(range(100))
    assert stuck.overlaps == healthy.overlaps == 0
    assert q.stats().rebalances == 1


def test_requests_about_the_stuck_type_wait_their_turn_in_order(qname: str) -> None:
    q, _, stuck, _, gate, _, _, _ = _setup(qname)
    withdrawn = Recorder("a2")
    with pytest.raises(TimeoutError, match="still running"):  # removal waits for the stuck call (its fence)
        q.remove_handler(A, timeout=0.2)
    with pytest.raises(TimeoutError, match="withdrawn, nothing changed"):  # behind it: withdrawn
        q.add_handler(A, withdrawn, timeout=0.1)
    t0 = time.monotonic()
    rc = Recorder("c")
    q.add_handler(C, rc, timeout=1)  # another type: at once
    assert time.monotonic() - t0 < 0.1
    again = Recorder("a3")
    done = []
    waiter = threading.Thread(target=lambda: done.append(q.add_handler(A, again, timeout=5)))
    waiter.start()
    time.sleep(0.1)
    assert not done and A not in q.handler_types()  # queued behind the removal
    gate.set()
    waiter.join(5)
    assert done == [None]
    assert A in q.handler_types()  # removal, then the new add: A's items reach the new handler only
    q.produce(A(5))
    q.produce(C(6))
    assert again.wait_items(1) and rc.wait_items(1)
    assert again.ids == [5] and stuck.ids == [0] and withdrawn.ids == []
    assert stuck.overlaps == again.overlaps == 0


def test_a_slow_handler_call_is_reported(qname: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="drainpipe.control")
    q, _, stuck, _, gate, pa, _, _ = _setup(qname, slow_handler_ms=50)
    assert wait_until(lambda: len(q.stats().slow_calls) == 1, 2)
    call = q.stats().slow_calls[0]
    assert (call.type_name, call.task, call.method) == ("A", q.partition_owners()[pa], "consume")
    assert call.seconds >= 0.05
    time.sleep(0.2)
    assert q.stats().slow_calls[0].seconds > call.seconds  # the seconds so far, growing
    logged = [r for r in caplog.records if "has been in consume" in r.getMessage()]
    assert len(logged) == 1 and "A" in logged[0].getMessage()  # logged once, not on every check
    gate.set()
    assert wait_until(lambda: q.stats().slow_calls == (), 2)
