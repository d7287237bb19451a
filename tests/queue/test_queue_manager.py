"""BatchQueueManager: the process-wide registry (docs/api.md Manager)."""

from __future__ import annotations

import threading
import warnings

import pytest
from queue_testlib import Recorder, config, pool_threads, queue_threads

from drainpipe import BatchQueue, BatchQueueManager, BufferStrategy, PartitionPolicy, ThreadPolicy
from drainpipe.errors import ConfigError
from testlib import wait_until


def _all_drainpipe_threads():
    return {t for t in threading.enumerate() if t.name.startswith("drainpipe-")}


def test_create_get_and_name_taken(qname):
    rec = Recorder()
    q = BatchQueueManager.create(qname, config(consumer=rec))
    assert isinstance(q, BatchQueue)
    assert q.name == qname and q.is_running
    assert BatchQueueManager.get(qname) is q
    threads_before = _all_drainpipe_threads()
    with pytest.raises(RuntimeError):
        BatchQueueManager.create(qname, config(threads=ThreadPolicy.fixed(4), partitions=PartitionPolicy.fixed(4)))
    assert _all_drainpipe_threads() == threads_before  # the new queue was not started
    assert len(pool_threads(qname)) == 1
    assert BatchQueueManager.get(qname) is q  # the original stays registered and working
    assert q.produce(1)
    assert rec.wait_items(1)


def test_name_taken_with_shared_scheduler_does_not_take_a_reference(qname):
    pool = qname + "_pool"
    q = BatchQueueManager.create(qname, config(shared_scheduler=(pool, ThreadPolicy.fixed(1))))
    with pytest.raises(RuntimeError):
        BatchQueueManager.create(qname, config(shared_scheduler=(pool, ThreadPolicy.fixed(1))))
    assert len(pool_threads(pool)) == 1
    BatchQueueManager.shutdown(qname)
    assert pool_threads(pool) == []  # the failed create left no reference behind
    assert not q.is_running


@pytest.mark.parametrize("method", ["get_or_create", "create_if_absent"])
def test_get_or_create_returns_the_existing_queue_and_warns_when_asked_for_another_size(qname, method):
    fn = getattr(BatchQueueManager, method)
    q = fn(qname, config(buffer_size=7))
    assert BatchQueueManager.get(qname) is q and q.is_running
    threads_before = _all_drainpipe_threads()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same sizing: no warning
        assert fn(qname, config(buffer_size=7)) is q
    with pytest.warns(RuntimeWarning, match=r"another threads, partitions, buffer_size: .*buffer_size=7"):
        again = fn(qname, config(buffer_size=99, threads=ThreadPolicy.fixed(3), partitions=PartitionPolicy.fixed(3)))
    assert again is q
    assert again.config.buffer_size == 7
    assert again.stats().buffer_size == 7
    assert again.task_count == 1
    assert _all_drainpipe_threads() == threads_before
    with pytest.warns(RuntimeWarning, match="strategy"):
        fn(qname, config(buffer_size=7, strategy=BufferStrategy.IF_POSSIBLE))


@pytest.mark.parametrize("first_consumer", [True, False])
def test_get_or_create_refuses_the_other_dispatch_mode(qname, first_consumer):
    got: list = []
    with_consumer, with_handlers = config(consumer=got.extend), config()
    q = BatchQueueManager.get_or_create(qname, with_consumer if first_consumer else with_handlers)
    with pytest.raises(ConfigError, match="exists with a consumer; it was asked for with handlers"
                       if first_consumer else "exists with handlers; it was asked for with a consumer"):  # fmt: skip
        BatchQueueManager.get_or_create(qname, with_handlers if first_consumer else with_consumer)
    assert BatchQueueManager.get(qname) is q and q.is_running  # nothing changed


def test_create_if_absent_is_an_alias_of_get_or_create(qname):
    a = BatchQueueManager.create_if_absent(qname, config())
    b = BatchQueueManager.get_or_create(qname, config())
    assert a is b


def test_get_unknown_is_none_and_shutdown_unknown_is_noop(qname):
    assert BatchQueueManager.get(qname) is None
    BatchQueueManager.shutdown(qname)
    assert BatchQueueManager.get(qname) is None


def test_shutdown_removes_then_shuts_down(qname):
    rec = Recorder()
    q = BatchQueueManager.create(qname, config(consumer=rec))
    q.produce_many(range(10))
    BatchQueueManager.shutdown(qname)
    assert BatchQueueManager.get(qname) is None
    assert not q.is_running
    assert rec.items == list(range(10))  # shut down (and drained) when shutdown returns
    assert pool_threads(qname) == []
    q2 = BatchQueueManager.create(qname, config())  # the name is free again
    assert q2 is not q and q2.is_running


def test_shutdown_removes_before_shutting_down(qname):
    """While the queue shuts down (a handler holds it up) the name is already free."""
    gate = threading.Event()
    entered = threading.Event()

    def consumer(batch):
        entered.set()
        gate.wait(10)

    q = BatchQueueManager.create(qname, config(consumer=consumer, shutdown_timeout_ms=0))
    q.produce(1)
    assert entered.wait(5)
    t = threading.Thread(target=BatchQueueManager.shutdown, args=(qname,), daemon=True)
    t.start()
    assert wait_until(lambda: BatchQueueManager.get(qname) is None)
    assert t.is_alive()
    gate.set()
    t.join(5)
    assert not t.is_alive() and not q.is_running


def test_shutdown_all_stops_every_queue_and_shared_scheduler(qname):
    pool = qname + "_pool"
    recs = [Recorder() for _ in range(3)]
    qs = [
        BatchQueueManager.create(
            qname + "_a", config(consumer=recs[0], threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(2))
        ),
        BatchQueueManager.create(
            qname + "_b", config(consumer=recs[1], shared_scheduler=(pool, ThreadPolicy.fixed(2)))
        ),
        BatchQueueManager.create(
            qname + "_c", config(consumer=recs[2], shared_scheduler=(pool, ThreadPolicy.fixed(2)))
        ),
    ]
    for q in qs:
        q.produce_many(range(5))
    BatchQueueManager.shutdown_all()
    for q, rec in zip(qs, recs):
        assert not q.is_running
        assert rec.items == list(range(5))
        assert BatchQueueManager.get(q.name) is None
    assert pool_threads(pool) == []
    assert pool_threads(qname + "_a") == []
    assert wait_until(lambda: queue_threads(qname + "_a") == [], timeout=2)
    BatchQueueManager.shutdown_all()  # idempotent on an empty registry


def test_concurrent_get_or_create_returns_one_queue(qname):
    results = []
    barrier = threading.Barrier(8)

    def worker():
        barrier.wait()
        results.append(
            BatchQueueManager.get_or_create(
                qname, config(threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(2))
            )
        )

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert len(results) == 8 and len({id(q) for q in results}) == 1
    assert len(pool_threads(qname)) == 2


def test_concurrent_create_exactly_one_wins(qname):
    wins, losses = [], []
    barrier = threading.Barrier(6)

    def worker():
        barrier.wait()
        try:
            wins.append(BatchQueueManager.create(qname, config()))
        except RuntimeError:
            losses.append(1)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert len(wins) == 1 and len(losses) == 5
    assert len(pool_threads(qname)) == 1
