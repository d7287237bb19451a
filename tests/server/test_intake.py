"""The group intake: requests' work run on one thread, the group's bodies decoded in one pass, their events logged a
group at a time; a request's own error fails that request only, a log append that fails fails its whole group, and
nothing is logged twice or lost."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from drainpipe.errors import BadBody, LogFull
from drainpipe.inputs import EventBatch
from drainpipe.server.bodies import Decoded
from drainpipe.server.intake import Body, GroupIntake
from testlib import event_batch, row


def _batch(tag: int, rows: int) -> EventBatch:
    """``rows`` requests of service ``s<tag>``."""
    return EventBatch.of(event_batch([row(service=f"s{tag}", ts=1_700_000_000_000 + i) for i in range(rows)]))


class _Log:
    """An append that can be held (to let a group build up behind it) and made to fail."""

    def __init__(self) -> None:
        self.records: list[EventBatch] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail: BaseException | None = None

    def append(self, *batches: EventBatch) -> int:
        self.entered.set()
        self.gate.wait(10)
        if self.fail is not None:
            raise self.fail
        self.records += batches
        return len(self.records)


def _services(batches: list[EventBatch]) -> list[str]:
    return sorted(s for b in batches for s in b.rows.column("service").to_pylist())


def _submit_all(intake: GroupIntake, works: list, results: dict) -> list[threading.Thread]:
    def one(i: int) -> None:
        try:
            results[i] = intake.submit(works[i], 100)
        except BaseException as exc:  # the test reads it
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(works))]
    for t in threads:
        t.start()
    return threads


def _wait_queued(intake: GroupIntake, n: int) -> None:
    """Until ``n`` requests wait behind the append in progress (the queue's length, read without taking any)."""
    deadline = time.monotonic() + 10
    while intake._queue.qsize() < n:
        assert time.monotonic() < deadline, "the requests did not queue"
        time.sleep(0.001)


@pytest.fixture
def served() -> Iterator[tuple[GroupIntake, _Log]]:
    log = _Log()
    intake = GroupIntake(log.append)
    try:
        yield intake, log
    finally:
        intake.close()


def _join(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(10)
        assert not t.is_alive(), "a request still waits"


def _behind_an_append(intake: GroupIntake, log: _Log, works: list, *, fail: BaseException | None = None) -> dict:
    """Submit ``works`` while a first request's append is held, so that they wait as one group; then let the append
    go on (failing with ``fail``, the held one too). Each request's result or exception, by index."""
    results: dict = {}
    log.gate.clear()
    first = _submit_all(intake, [lambda: (_batch(99, 1), [])], {})
    assert log.entered.wait(10)
    threads = _submit_all(intake, works, results)
    _wait_queued(intake, len(works))
    log.fail = fail
    log.gate.set()
    _join(first + threads)
    return results


def test_requests_waiting_behind_an_append_are_logged_as_one_record_each_getting_its_own_result(served) -> None:
    intake, log = served
    works = [(lambda i=i: (_batch(i, i + 1), [(0, f"reason {i}")])) for i in range(10)]
    results = _behind_an_append(intake, log, works)
    assert len(log.records) == 2  # the first alone, then the ten as one record
    for i in range(10):
        assert results[i] == (i + 1, [(0, f"reason {i}")], ())  # (accepted, rejects, warnings)
    assert _services(log.records[1:]) == _services([_batch(i, i + 1) for i in range(10)])


def test_a_bad_body_fails_its_own_request_and_the_rest_of_its_group_is_logged(served) -> None:
    intake, log = served

    def bad() -> tuple[EventBatch, list]:
        raise BadBody(400, "malformed protobuf")

    results = _behind_an_append(intake, log, [lambda: (_batch(1, 2), []), bad, lambda: (_batch(3, 4), [])])
    assert isinstance(results[1], BadBody) and results[1].status == 400
    assert results[0].accepted == 2 and results[2].accepted == 4
    assert _services(log.records[1:]) == ["s1"] * 2 + ["s3"] * 4


def test_an_append_that_fails_fails_every_request_of_its_group_and_logs_none_of_it(served) -> None:
    intake, log = served
    works = [(lambda i=i: (_batch(i, 1), [])) for i in range(5)]
    results = _behind_an_append(intake, log, works, fail=LogFull("write-ahead log full"))
    assert log.records == []  # the first one failed too (it was appending when the log filled)
    errors = [results[i] for i in range(5)]
    assert all(isinstance(e, LogFull) for e in errors)
    assert len({id(e) for e in errors}) == 5  # one instance each: raised in five threads
    log.fail = None
    decoded = intake.submit(lambda: (_batch(7, 3), []))  # the next group is logged
    assert decoded.accepted == 3 and _services(log.records) == ["s7"] * 3


def test_close_serves_what_was_queued_then_refuses() -> None:
    log = _Log()
    intake = GroupIntake(log.append)
    log.gate.clear()
    results: dict = {}
    works = [(lambda i=i: (_batch(i, 1), [])) for i in range(4)]
    threads = _submit_all(intake, works[:1], results)
    assert log.entered.wait(10)
    more: dict = {}
    threads += _submit_all(intake, works[1:], more)
    _wait_queued(intake, 3)  # queued before the close
    closer = threading.Thread(target=intake.close)
    closer.start()
    log.gate.set()
    _join([*threads, closer])
    assert sorted(r.accepted for r in [*results.values(), *more.values()]) == [1, 1, 1, 1]
    assert len(_services(log.records)) == 4
    with pytest.raises(LogFull):
        intake.submit(lambda: (_batch(9, 1), []))


def test_an_empty_batch_is_answered_without_a_log_record(served) -> None:
    intake, log = served
    decoded = intake.submit(lambda: (EventBatch.of(_batch(1, 1).rows.slice(0, 0)), [(0, "bad span")]))
    assert decoded == (0, [(0, "bad span")], ()) and log.records == []


def test_the_batches_joined_keep_every_row(served) -> None:
    intake, log = served
    _join(_submit_all(intake, [(lambda i=i: (_batch(i % 3, 50), [])) for i in range(40)], {}))
    assert sum(b.num_rows for b in log.records) == 40 * 50


def test_serve_now_answers_each_once_with_the_append_s_error_and_no_result(served) -> None:
    """The caller's own group: a failed append is an error with no result (the caller must not answer 200), a work's
    own error fails that one only, and every request is answered exactly once, before serve_now returns."""
    intake, log = served
    answers: dict = {}

    def bad() -> tuple[EventBatch, list]:
        raise BadBody(400, "malformed protobuf")

    def then_of(i: int) -> Any:
        return lambda result, error: answers.setdefault(i, []).append((result, error))

    log.fail = LogFull("write-ahead log full")
    intake.serve_now([(lambda: (_batch(0, 1), []), 1, then_of(0)), (bad, 1, then_of(1)),
                      (lambda: (_batch(2, 1), []), 1, then_of(2))])  # fmt: skip
    assert sorted(answers) == [0, 1, 2] and all(len(a) == 1 for a in answers.values())
    assert [(r, type(e)) for i in (0, 2) for r, e in answers[i]] == [(None, LogFull)] * 2
    assert isinstance(answers[1][0][1], BadBody) and log.records == []
    log.fail = None
    answers.clear()
    intake.serve_now([(lambda: (_batch(3, 2), []), 1, then_of(3))])
    assert answers[3] == [((2, [], ()), None)] and _services(log.records) == ["s3"] * 2


def test_serve_now_runs_on_the_calling_thread_beside_the_intake_thread_s_groups(served) -> None:
    """A group served by its caller while the intake thread logs another: both logged, nothing twice or lost, and
    each ``then`` called on the caller's thread."""
    intake, log = served
    log.gate.clear()
    held: dict = {}
    threads = _submit_all(intake, [lambda: (_batch(1, 3), [])], held)
    assert log.entered.wait(10)  # the intake thread is inside its append
    seen: list = []
    caller = threading.Thread(
        target=intake.serve_now,
        args=([(lambda: (_batch(2, 4), []), 1, lambda r, e: seen.append((r, e, threading.current_thread().name)))],),
        name="the-loop",
    )
    caller.start()
    log.gate.set()
    _join([*threads, caller])
    assert held[0].accepted == 3 and seen == [((4, [], ()), None, "the-loop")]
    assert _services(log.records) == ["s1"] * 3 + ["s2"] * 4


def test_serve_now_after_close_refuses_each_and_a_failing_answer_is_logged(served, caplog) -> None:
    intake, log = served

    def broken(result, error) -> None:
        raise RuntimeError("a bug in the caller's answer")

    intake.serve_now([(lambda: (_batch(1, 1), []), 1, broken)])  # logged; the answer's bug is the caller's
    assert sum(b.num_rows for b in log.records) == 1 and "answering a request failed" in caplog.text
    intake.close()
    answers: list = []
    intake.serve_now([(lambda: (_batch(2, 1), []), 1, lambda r, e: answers.append((r, e)))])
    assert len(answers) == 1 and answers[0][0] is None and isinstance(answers[0][1], LogFull)
    assert sum(b.num_rows for b in log.records) == 1


def test_the_bodies_of_a_group_are_decoded_in_one_call_beside_the_other_work_and_each_gets_its_own_outcome() -> None:
    """Bodies go to ``decode_group`` together, once a group; a body it answers with an error fails that request
    only; the other work of the group runs as before; one record holds the events of both."""
    log, calls = _Log(), []

    def decode_group(bodies: list[Body]) -> tuple[list[EventBatch], list]:
        calls.append([b.data for b in bodies])
        outcomes: list = [BadBody(400, "bad") if b.data == b"bad" else Decoded(int(b.data), [], ()) for b in bodies]
        return [_batch(5, sum(o.accepted for o in outcomes if isinstance(o, Decoded)))], outcomes

    intake = GroupIntake(log.append, decode_group=decode_group)
    try:
        works = [Body(b"2", False), lambda: (_batch(1, 3), []), Body(b"bad", False), Body(b"4", False)]
        results = _behind_an_append(intake, log, works)
    finally:
        intake.close()
    assert calls == [[b"2", b"bad", b"4"]]  # one call for the three bodies
    assert results[0] == (2, [], ()) and results[1] == (3, [], ()) and results[3] == (4, [], ())
    assert isinstance(results[2], BadBody) and results[2].status == 400
    assert len(log.records) == 2 and _services(log.records[1:]) == ["s1"] * 3 + ["s5"] * 6


def test_a_pass_that_fails_fails_its_bodies_requests_only_and_the_rest_of_the_group_is_logged() -> None:
    """decode_group raising (a bug, out of memory) is the bodies' error: the group's other work still runs and is
    logged, and the intake serves on."""
    log = _Log()

    def broken(bodies: list[Body]) -> tuple[list[EventBatch], list]:
        raise MemoryError("the pass")

    intake = GroupIntake(log.append, decode_group=broken)
    try:
        results = _behind_an_append(intake, log, [Body(b"x", False), lambda: (_batch(1, 3), []), Body(b"y", False)])
        assert isinstance(results[0], MemoryError) and isinstance(results[2], MemoryError)
        assert results[0] is not results[2] and results[1] == (3, [], ())
        assert _services(log.records[1:]) == ["s1"] * 3
        assert intake.submit(lambda: (_batch(2, 1), [])).accepted == 1  # it serves on
    finally:
        intake.close()


def test_a_group_past_the_record_bound_is_logged_as_several_records_in_one_append(monkeypatch) -> None:
    """A group's events join into one record up to RECORD_BYTES (the log takes at most 1 GiB a record; Arrow 2 GiB
    of text a column): past it, several records, in order, in one append call (one group commit: all or none)."""
    from drainpipe.server import intake as intake_module

    one = _batch(0, 100).buffer_bytes
    monkeypatch.setattr(intake_module, "RECORD_BYTES", 2 * one)
    calls: list[int] = []
    log = _Log()
    plain = log.append

    def append(*batches: EventBatch) -> int:
        calls.append(len(batches))
        return plain(*batches)

    intake = GroupIntake(append)
    try:
        results = _behind_an_append(intake, log, [lambda i=i: (_batch(i, 100), []) for i in range(5)])
    finally:
        intake.close()
    assert calls == [1, 3]  # the five requests' group: records of 2, 2 and 1 batches, one call
    assert [b.num_rows for b in log.records[1:]] == [200, 200, 100]
    assert _services(log.records[1:]) == sorted(f"s{i}" for i in range(5) for _ in range(100))
    assert all(results[i] == (100, [], ()) for i in range(5))
