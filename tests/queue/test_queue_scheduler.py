"""Dedicated and shared drain schedulers: thread names, daemon threads, thread reduction, shared pools
(docs/api.md Config "Shared schedulers")."""

from __future__ import annotations

import logging
import threading

from queue_testlib import A, Recorder, config, new_queue, pool_threads, queue_threads

from drainpipe import BatchQueue, BatchQueueManager, DrainBalancer, PartitionPolicy, ThreadPolicy, processes


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("drainpipe")]


def test_dedicated_scheduler_threads_are_named_and_daemon(qname):
    rec = Recorder()
    q = new_queue(qname, threads=ThreadPolicy.fixed(3), partitions=PartitionPolicy.fixed(3), consumer=rec)
    threads = pool_threads(qname)
    assert sorted(t.name for t in threads) == [f"drainpipe-{qname}-{i}" for i in range(3)]
    assert all(t.daemon for t in threads)
    assert all(t.daemon for t in queue_threads(qname))
    assert q.task_count == 3
    q.produce_many(range(100))
    assert rec.wait_items(100)
    assert set(rec.threads) <= {t.name for t in threads}
    q.shutdown()
    assert pool_threads(qname) == []  # joined by the time shutdown returns


def test_io_bound_and_cpu_policies_start_the_resolved_thread_count(qname, monkeypatch):

    monkeypatch.setattr(processes, "usable_cpus", lambda: 4)
    q1 = new_queue(qname + "_io", threads=ThreadPolicy.io_bound(2), partitions=PartitionPolicy.fixed(2))
    q2 = new_queue(qname + "_cpu", threads=ThreadPolicy.cpu_cores(0.5), partitions=PartitionPolicy.fixed(8))
    assert len(pool_threads(qname + "_io")) == 2 and q1.task_count == 2
    assert len(pool_threads(qname + "_cpu")) == 2 and q2.task_count == 2


def test_threads_reduced_to_partition_count_with_warning(qname, caplog):
    caplog.set_level(logging.WARNING)
    q = new_queue(qname, threads=ThreadPolicy.fixed(4), partitions=PartitionPolicy.fixed(2))
    assert q.task_count == 2
    assert q.partition_count == 2
    assert q.assigned_partitions == ((0,), (1,))
    assert sorted(t.name for t in pool_threads(qname)) == [f"drainpipe-{qname}-0", f"drainpipe-{qname}-1"]
    warns = _warnings(caplog)
    assert len(warns) == 1 and qname in warns[0]


def test_no_reduction_warning_when_partitions_suffice(qname, caplog):
    caplog.set_level(logging.WARNING)
    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.thread_multiply(3))
    assert q.task_count == 2 and q.partition_count == 6
    assert sorted(p for t in q.assigned_partitions for p in t) == list(range(6))
    q2 = new_queue(qname + "_ad", threads=ThreadPolicy.fixed(3), partitions=PartitionPolicy.adaptive())
    assert q2.task_count == 3 and q2.partition_count == 3
    assert _warnings(caplog) == []


def test_shared_scheduler_is_shared_first_policy_wins_and_stops_with_last_queue(qname, caplog):
    caplog.set_level(logging.WARNING)
    pool = f"{qname}_pool"
    shared = (pool, ThreadPolicy.fixed(2))
    recs = [Recorder(f"c{i}") for i in range(3)]
    q1 = new_queue(
        qname + "_1",
        shared_scheduler=shared,
        consumer=recs[0],
        balancer=DrainBalancer.throughput_weighted(),
        rebalance_interval_ms=5,
        partitions=PartitionPolicy.fixed(4),
    )
    q2 = new_queue(qname + "_2", shared_scheduler=shared, consumer=recs[1])
    assert sorted(t.name for t in pool_threads(pool)) == [f"drainpipe-{pool}-0", f"drainpipe-{pool}-1"]
    assert all(t.daemon for t in pool_threads(pool))
    assert _warnings(caplog) == []
    # a different policy for the same pool: warning, the first policy stays
    q3 = new_queue(qname + "_3", shared_scheduler=(pool, ThreadPolicy.fixed(5)), consumer=recs[2])
    warns = _warnings(caplog)
    assert len(warns) == 1 and pool in warns[0]
    assert len(pool_threads(pool)) == 2
    # no dedicated pool threads for shared-scheduler queues
    for q in (q1, q2, q3):
        assert pool_threads(q.name) == []
        assert q.task_count == 1  # exactly one drain task ...
        assert q.rebalancing_enabled is False  # ... and never rebalances
    assert q1.assigned_partitions == ((0, 1, 2, 3),)

    pool_names = {t.name for t in pool_threads(pool)}
    for q in (q1, q2, q3):
        q.produce_many(range(50))
    for rec in recs:
        assert rec.wait_items(50)
        assert set(rec.threads) <= pool_names  # every queue drains on the shared threads

    BatchQueueManager.shutdown(q1.name)
    assert len(pool_threads(pool)) == 2  # still referenced by q2 and q3
    q2.produce_many(range(50, 60))
    assert recs[1].wait_items(60)
    BatchQueueManager.shutdown(q2.name)
    assert len(pool_threads(pool)) == 2
    BatchQueueManager.shutdown(q3.name)
    assert pool_threads(pool) == []  # stopped with its last queue
    assert recs[1].items == list(range(60))


def test_shared_scheduler_recreated_after_last_queue_left(qname, caplog):
    caplog.set_level(logging.WARNING)
    pool = f"{qname}_pool"
    q = BatchQueue(qname, config(shared_scheduler=(pool, ThreadPolicy.fixed(1))))
    q.shutdown()
    assert pool_threads(pool) == []
    rec = Recorder()
    q2 = new_queue(qname + "_b", shared_scheduler=(pool, ThreadPolicy.fixed(3)), consumer=rec)
    assert len(pool_threads(pool)) == 3  # a fresh pool: the new first policy wins, no warning
    assert _warnings(caplog) == []
    q2.produce(1)
    assert rec.wait_items(1)


def test_dedicated_queue_handlers_run_on_queue_threads(qname):
    rec = Recorder("A")
    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(2))
    q.add_handler(A, rec)
    q.produce(A(1))
    assert rec.wait_items(1)
    assert rec.threads[0].startswith(f"drainpipe-{qname}-")
    assert threading.current_thread().name not in rec.threads
