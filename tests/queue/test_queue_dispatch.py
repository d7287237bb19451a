"""Dispatch: single-consumer batches, handler-map grouping by exact type, unhandled types, errors, on_idle,
adaptive backoff (docs/api.md BatchQueue "Dispatch")."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from queue_testlib import A, B, Blocker, C, Recorder, SubA, first_call_blocks, make_types, new_queue

from drainpipe import PartitionPolicy, PartitionSelector, ThreadPolicy
from testlib import wait_until

# ---------------------------------------------------------------- single-consumer mode


def test_single_consumer_gets_whole_batches(qname):
    rec = Recorder("consumer")
    gate = first_call_blocks(rec)
    q = new_queue(qname, consumer=rec, partitions=PartitionPolicy.fixed(3))
    assert q.produce(Blocker(0))
    assert rec.entered.wait(5)
    items = [A(i) for i in range(5)] + [B(i) for i in range(5)] + list(range(5)) + ["x", "y"]
    for x in items:
        assert q.produce(x)
    gate.set()
    assert rec.wait_items(1 + len(items))
    # the blocked cycle had just the blocker; the next cycle took everything the task owns in one batch
    assert len(rec.batches) == 2
    assert [type(x) for x in rec.batches[0]] == [Blocker]
    second = rec.batches[1]
    assert sorted(map(repr, second)) == sorted(map(repr, items))
    # produce order within each type (one partition each) is kept
    assert [x.id for x in second if type(x) is A] == list(range(5))
    assert [x.id for x in second if type(x) is B] == list(range(5))
    assert [x for x in second if type(x) is int] == list(range(5))


def test_single_consumer_is_called_from_every_drain_task(qname):
    got = []
    lock = threading.Lock()
    names = set()

    def consumer(batch):  # must be thread-safe: several tasks may call it at once
        with lock:
            got.extend(batch)
            names.add(threading.current_thread().name)

    q = new_queue(
        qname,
        consumer=consumer,
        threads=ThreadPolicy.fixed(2),
        partitions=PartitionPolicy.fixed(2),
        partition_selector=lambda item, n: item % n,
    )
    assert q.produce_many(range(200)) == 200
    assert wait_until(lambda: len(got) == 200)
    assert sorted(got) == list(range(200))
    # partition p is owned by task p, and each task drains its own partition on its own thread
    assert names == {f"drainpipe-{qname}-0", f"drainpipe-{qname}-1"}


def test_single_consumer_wins_over_handlers(qname):
    rec = Recorder("consumer")
    handler = Recorder("handler")
    q = new_queue(qname, consumer=rec)
    q.add_handler(A, handler)
    assert q.produce_many([A(1), B(2)]) == 2
    q.shutdown()
    assert handler.items == [] and [x.id for x in rec.items] == [1, 2]


def test_plain_callable_consumer_and_handler(qname):
    got = []
    q = new_queue(qname, consumer=got.extend)
    q.produce_many([1, 2, 3])
    q.shutdown()
    assert got == [1, 2, 3]

    got_a = []
    q2 = new_queue(qname + "_2", partitions=PartitionPolicy.fixed(2))
    q2.add_handler(A, lambda batch: got_a.extend(batch))
    q2.produce_many([A(1), A(2)])
    q2.shutdown()
    assert [x.id for x in got_a] == [1, 2]


# ---------------------------------------------------------------- handler-map mode


def test_handler_map_groups_by_exact_type_one_call_per_type_per_cycle(qname):
    blk = Recorder("blocker")
    gate = first_call_blocks(blk)
    recs = {t: Recorder(t.__name__, expect_type=t) for t in (A, B, C)}
    q = new_queue(qname, partitions=PartitionPolicy.fixed(1))  # every type shares one partition
    q.add_handler(Blocker, blk)
    for t, r in recs.items():
        q.add_handler(t, r)
    assert q.produce(Blocker(0))
    assert blk.entered.wait(5)
    for i in range(6):  # interleaved types in one partition
        q.produce(A(i))
        q.produce(B(i))
        if i % 2:
            q.produce(C(i))
    gate.set()
    for t, n in ((A, 6), (B, 6), (C, 3)):
        assert recs[t].wait_items(n)
    for t, r in recs.items():
        assert len(r.batches) == 1, t  # one call with all of its items
        assert r.wrong_type == 0
    assert recs[A].ids == list(range(6))  # produce order kept
    assert recs[B].ids == list(range(6))
    assert recs[C].ids == [1, 3, 5]


def test_subclass_items_are_not_dispatched_to_base_handler(qname, caplog):
    caplog.set_level(logging.WARNING)
    rec_a = Recorder("A", expect_type=A)
    q = new_queue(qname, partitions=PartitionPolicy.fixed(2))
    q.add_handler(A, rec_a)
    assert q.produce(SubA(1)) in (True, False)
    assert q.produce(A(2))
    q.produce_many([SubA(3), A(4)])
    q.shutdown()
    assert rec_a.ids == [2, 4]
    assert rec_a.wrong_type == 0
    assert q.stats().dropped_no_handler == 2


@pytest.mark.parametrize("selector", ["type_hash", "key_hash"])
def test_unregistered_types_are_dropped_counted_and_logged_once(qname, caplog, selector):
    caplog.set_level(logging.WARNING)
    Unhandled1, Unhandled2 = make_types(2, "Unhandled")
    kw = {}
    if selector == "key_hash":
        kw["partition_selector"] = PartitionSelector.key_hash(lambda it: it.id % 3)
    rec = Recorder("A", expect_type=A)
    # one producer and one drain task: the once-per-type check itself is racy across threads
    q = new_queue(qname, partitions=PartitionPolicy.fixed(3), **kw)
    q.add_handler(A, rec)
    for i in range(10):
        q.produce(Unhandled1(i))
        q.produce(A(i))
    q.produce_many([Unhandled2(i) for i in range(5)] + [Unhandled1(99)])
    q.shutdown()
    assert rec.ids == list(range(10)) if selector == "type_hash" else sorted(rec.ids) == list(range(10))
    s = q.stats()
    assert s.dropped_no_handler == 16
    assert s.dispatched == 10
    msgs = [r.getMessage() for r in caplog.records if r.name.startswith("drainpipe")]
    assert sum("Unhandled0" in m for m in msgs) == 1
    assert sum("Unhandled1" in m for m in msgs) == 1


def test_error_handler_receives_sub_batch_and_queue_keeps_running(qname):
    errors = []
    err_event = threading.Event()

    def on_error(batch, exc):
        errors.append((list(batch), exc))
        err_event.set()

    blk = Recorder("blocker")
    gate = first_call_blocks(blk)
    rec_a = Recorder("A", fail_if=lambda batch: any(x.flag == "bad" for x in batch))
    rec_b = Recorder("B")
    q = new_queue(qname, error_handler=on_error, partitions=PartitionPolicy.fixed(1))
    q.add_handler(Blocker, blk)
    q.add_handler(A, rec_a)
    q.add_handler(B, rec_b)
    q.produce(Blocker(0))
    assert blk.entered.wait(5)
    q.produce_many([A(1), B(1), A(2, flag="bad"), B(2), A(3)])
    gate.set()
    assert err_event.wait(5)
    assert len(errors) == 1
    batch, exc = errors[0]
    assert [(type(x), x.id) for x in batch] == [(A, 1), (A, 2), (A, 3)]  # only the failing handler's items
    assert isinstance(exc, ValueError) and "on purpose" in str(exc)
    assert rec_b.wait_items(2)
    # still running: later items are delivered
    q.produce_many([A(4), B(3)])
    assert rec_a.wait_items(4) and rec_b.wait_items(3)
    q.shutdown()
    s = q.stats()
    assert s.handler_errors == 1
    assert len(errors) == 1


def test_handler_error_without_error_handler_is_logged(qname, caplog):
    caplog.set_level(logging.ERROR)
    rec = Recorder("A", fail_if=lambda batch: any(x.flag == "bad" for x in batch))
    q = new_queue(qname)
    q.add_handler(A, rec)
    q.produce(A(1, flag="bad"))
    assert rec.wait_items(1)
    assert wait_until(lambda: q.stats().handler_errors == 1)
    q.produce(A(2))
    assert rec.wait_items(2)
    q.shutdown()
    errs = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("drainpipe")]
    assert len(errs) == 1
    assert errs[0].exc_info is not None and isinstance(errs[0].exc_info[1], ValueError)


def test_error_handler_that_raises_does_not_stop_the_queue(qname, caplog):
    caplog.set_level(logging.ERROR)

    def bad_error_handler(batch, exc):
        raise RuntimeError("error handler broken")

    rec = Recorder("A", fail_if=lambda batch: batch[0].id == 1)
    q = new_queue(qname, error_handler=bad_error_handler)
    q.add_handler(A, rec)
    q.produce(A(1))
    assert rec.wait_items(1)
    q.produce(A(2))
    assert rec.wait_items(2)
    q.shutdown()
    assert q.stats().handler_errors == 1


# ---------------------------------------------------------------- on_idle


def test_consumer_on_idle_is_called_when_idle(qname):
    rec = Recorder("consumer")
    new_queue(qname, consumer=rec)
    assert rec.wait_idle(3)


def test_wake_idle_ends_the_backoff_at_once(qname):
    """A task backing off for 3 s between idle cycles runs on_idle within a fraction of that after wake_idle()."""
    rec = Recorder("consumer")
    q = new_queue(qname, consumer=rec, min_idle_ms=3_000, max_idle_ms=3_000)
    assert wait_until(lambda: rec.idle_calls >= 1, 5)  # the first idle cycle; the next is due in 3 s
    time.sleep(0.05)
    calls, t0 = rec.idle_calls, time.monotonic()
    q.wake_idle()
    assert wait_until(lambda: rec.idle_calls > calls, 1.0), "on_idle waited for the backoff"
    assert time.monotonic() - t0 < 1.0


def test_on_idle_only_for_handlers_of_partitions_the_task_owns(qname):
    """2 tasks own partitions (0,) and (1,); A and C share a partition (and so a task), B is on the other one.
    While A's task is stuck inside A.consume, B keeps getting on_idle from the other thread; C gets none."""
    rec_a, rec_b, rec_c = Recorder("A"), Recorder("B"), Recorder("C")
    gate = first_call_blocks(rec_a)
    q = new_queue(qname, threads=ThreadPolicy.fixed(2), partitions=PartitionPolicy.fixed(2))
    assert q.assigned_partitions == ((0,), (1,))
    q.add_handler(A, rec_a)
    q.add_handler(B, rec_b)
    q.add_handler(C, rec_c)
    assert rec_a.wait_idle(1) and rec_b.wait_idle(1) and rec_c.wait_idle(1)

    assert q.produce(A(0))
    assert rec_a.entered.wait(5)
    stuck_thread = rec_a.entered_thread
    # where the types live, seen through the public API: B is drained by the free task, C waits behind A
    assert q.produce(C(0))
    assert q.produce(B(0))
    assert rec_b.wait_items(1)
    assert rec_c.items == []
    assert q.stats().total_used() == 1

    a_idle, b_idle, c_idle = rec_a.idle_calls, rec_b.idle_calls, rec_c.idle_calls
    assert rec_b.wait_idle(b_idle + 5)  # the free task idles: on_idle of B only ...
    assert rec_c.idle_calls == c_idle  # ... not of C, whose owner is busy in A.consume
    assert rec_a.idle_calls == a_idle
    assert stuck_thread not in rec_b.idle_threads[b_idle:]
    gate.set()
    assert rec_c.wait_items(1)
    assert rec_c.wait_idle(c_idle + 3)  # C's owner is free again
    # dedicated schedulers run drain task i on thread i: each handler's calls come from its owner's thread only
    owner_of = {0: f"drainpipe-{qname}-0", 1: f"drainpipe-{qname}-1"}
    assert set(rec_a.idle_threads) | set(rec_a.threads) | set(rec_c.idle_threads) | set(rec_c.threads) == {stuck_thread}
    assert set(rec_b.idle_threads) | set(rec_b.threads) == set(owner_of.values()) - {stuck_thread}
    assert rec_a.overlaps == rec_b.overlaps == rec_c.overlaps == 0


# ---------------------------------------------------------------- adaptive backoff


def test_idle_backoff_doubles_up_to_max(qname):
    """Count on_idle calls over the same 0.5 s: max_idle 50 ms allows ~15, max_idle 1 ms allows hundreds."""
    slow, fast = Recorder("slow"), Recorder("fast")
    q_slow = new_queue(qname + "_slow", consumer=slow, min_idle_ms=1, max_idle_ms=50)
    q_fast = new_queue(qname + "_fast", consumer=fast, min_idle_ms=1, max_idle_ms=1)
    time.sleep(0.5)
    n_slow, n_fast = slow.idle_calls, fast.idle_calls
    # 1+2+4+8+16+32 = 63 ms of ramp, then 50 ms steps: about 7 + 9 = 16 calls; never more than ~20
    assert 6 <= n_slow <= 20, n_slow
    assert n_fast >= 60, n_fast
    assert n_fast >= 4 * n_slow
    del q_slow, q_fast


def test_idle_gaps_follow_min_times_two_to_the_k_capped(qname):
    rec = Recorder("consumer")
    new_queue(qname, consumer=rec, min_idle_ms=4, max_idle_ms=64)
    assert rec.wait_idle(9, timeout=5)
    times = rec.idle_times[:9]
    gaps_ms = [(b - a) * 1000 for a, b in zip(times, times[1:])]
    expected = [min(4 * 2**k, 64) for k in range(len(gaps_ms))]  # 4, 8, 16, 32, 64, 64, 64, 64
    for gap, want in zip(gaps_ms, expected):
        assert gap >= want * 0.9, (gaps_ms, expected)  # never shorter than the backoff
        assert gap <= want + 60, (gaps_ms, expected)  # loose upper bound (scheduling slack)


def test_data_resets_backoff_and_latency_is_bounded_by_max_idle(qname):
    got = []
    got_event = threading.Event()

    class Consumer(Recorder):
        def consume(self, batch):
            got.append((time.monotonic(), list(batch)))
            got_event.set()
            super().consume(batch)

    rec = Consumer("consumer")
    q = new_queue(qname, consumer=rec, min_idle_ms=1, max_idle_ms=200)
    # ramp 1+2+4+...+128 = 255 ms, then 200 ms steps: after 10 on_idle calls the task sleeps max_idle
    assert rec.wait_idle(10, timeout=5)
    idle_before = rec.idle_calls
    t0 = time.monotonic()
    assert q.produce("x")
    assert got_event.wait(2)
    latency_ms = (got[0][0] - t0) * 1000
    assert latency_ms <= 200 + 100, latency_ms
    # after data the backoff starts again at min_idle: 3 on_idle calls within 1+2+4 ms (+ slack), not 3 * 200 ms
    assert rec.wait_idle(idle_before + 4, timeout=2)
    after = [t for t in rec.idle_times if t > got[0][0]][:3]
    assert len(after) == 3
    assert (after[2] - got[0][0]) * 1000 < 150, after


def test_unhandled_type_logged_once_even_when_two_threads_drop_it_at_once(qname, caplog):
    """Force the interleaving two producers can hit naturally: both test membership before either adds."""
    caplog.set_level(logging.WARNING)
    (Unhandled,) = make_types(1, "Racy")
    q = new_queue(qname)
    q.add_handler(A, Recorder())
    barrier = threading.Barrier(2, timeout=0.5)

    class RacySet(set):
        def __contains__(self, item):
            found = super().__contains__(item)
            try:
                barrier.wait()  # a correct (locked) implementation lets only one thread get here at a time
            except threading.BrokenBarrierError:
                pass
            return found

    q._table._warned = RacySet()
    producers = [threading.Thread(target=q.produce, args=(Unhandled(i),)) for i in range(2)]
    for t in producers:
        t.start()
    for t in producers:
        t.join(5)
    assert q.stats().dropped_no_handler == 2
    msgs = [r.getMessage() for r in caplog.records if "Racy0" in r.getMessage()]
    assert len(msgs) == 1, msgs
