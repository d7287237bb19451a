"""The rebalance listener: each task hears the partitions (and types) it loses and gains, a partition's on_revoked
before its on_assigned, revoked only once the old owner has left its cycle; a failing listener does not stop the
rebalance."""

from __future__ import annotations

import threading

import pytest
from queue_testlib import Recorder, make_types, new_queue

from drainpipe import DrainBalancer, PartitionPolicy, ThreadPolicy


class Log:
    def __init__(self, q_box: list, fail: bool = False) -> None:
        self.events: list[tuple[str, int, tuple[int, ...], tuple[type, ...]]] = []
        self.q_box = q_box
        self.fail = fail
        self.lock = threading.Lock()

    def on_revoked(self, task, partitions, types):
        q = self.q_box[0]
        # the old owner has left its cycle and does not own these any more
        assert all(q._parts.owner[p] == -1 for p in partitions)
        with self.lock:
            self.events.append(("revoked", task, partitions, types))
        if self.fail:
            raise RuntimeError("listener bug")

    def on_assigned(self, task, partitions, types):
        q = self.q_box[0]
        assert all(q._parts.owner[p] == task for p in partitions)
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
    owner_before = list(q._parts.owner)
    # load: the types on task 0's partitions are hot
    hot = [t for t in types if owner_before[q._table.home[t][0]] == 0]
    for i in range(3000):
        q.produce(hot[i % len(hot)](i))
    for t in types:
        q.produce(t(-1))
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
        assert set(tps) == {t for t in types if q._table.home[t][0] in partitions}
    assert all(r.overlaps == 0 for r in recs)
