"""The exactly-once driver (drainpipe.pipeline.Driver) on its own: the one policy (which definitions need which data,
and the order their groups commit in) by hypothesis, and the checkpoint, reap, throttle and rollback rules against a
sink whose commits the test completes by hand."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe.inputs import Position
from drainpipe.pipeline import Commit, Driver, PartBooks, SourceProgress, default_definitions
from drainpipe.pipeline.driver import PACE

NAMES = default_definitions().names


def books(applied: dict[str, int], part: str = "p") -> PartBooks:
    return PartBooks("src", part, {n: Position(o) for n, o in applied.items()})


def direct_names_from(b: PartBooks, offset: int) -> frozenset[str]:
    return frozenset(n for n, p in b.applied.items() if p.offset <= offset)


positions = st.dictionaries(st.sampled_from(NAMES[:5]), st.integers(0, 50), min_size=1)


@settings(max_examples=200, deadline=None)
@given(positions, st.lists(st.tuples(st.sampled_from(NAMES[:5]), st.integers(0, 60)), max_size=8),
       st.lists(st.integers(0, 70), min_size=1, max_size=10))  # fmt: skip
def test_names_from_is_the_definitions_applied_no_further_before_and_after_advances(
    applied: dict[str, int], advances: list[tuple[str, int]], offsets: list[int]
) -> None:
    b = books(applied)
    for name, to in [("", 0), *advances]:
        if name in b.applied:
            b.advance([name], Position(to))
        for offset in offsets:
            assert b.names_from(offset) == direct_names_from(b, offset)
            names, until = b.names_until(offset)  # the same answer for every offset up to until
            assert names == direct_names_from(b, offset)
            assert all(direct_names_from(b, o) == names for o in range(offset, int(min(until, 80))))
            assert until == math.inf or direct_names_from(b, int(until)) != names


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(positions, st.integers(1, 80)), min_size=1, max_size=4))
def test_groups_commit_each_parts_data_in_offset_order(parts: list[tuple[dict[str, int], int]]) -> None:
    """Cut each part where the definitions that need its data change, group the ranges by those definitions (as
    the Spark sources do), and commit the groups in the driver's order: every part's ranges come in offset order,
    so no commit advances a definition past data of its part that a later commit brings."""
    driver = Driver(default_definitions(), sink=_Sink())
    groups: dict[frozenset[str], list[tuple[int, int, int]]] = {}
    for i, (applied, end) in enumerate(parts):
        b = books(applied, f"p{i}")
        start = b.start.offset
        cuts = sorted({start, max(start, end)} | {p.offset for p in b.applied.values() if start < p.offset < end})
        for lo, hi in zip(cuts, cuts[1:]):
            if names := driver.wanted(b, lo):
                assert names == direct_names_from(b, lo)
                groups.setdefault(names, []).append((i, lo, hi))
    seen: dict[int, int] = {}
    for _, ranges in driver.in_order(groups):
        for part, lo, hi in ranges:
            assert lo >= seen.get(part, 0), (part, lo, seen)
            seen[part] = hi


class _Sink:
    """Commits the test completes itself; records every call, and what the dead letter had flushed by then."""

    def __init__(self, dead_letter: Any = None) -> None:
        self.calls: list[tuple[list[SourceProgress], int, bool, list[SourceProgress], int]] = []
        self.commits: list[Commit] = []
        self.dead_letter = dead_letter

    def checkpoint(self, progress: Sequence[SourceProgress], events: int, *, wait: bool = False,
                   rollback: bool = False, fences: Sequence[SourceProgress] = ()) -> Commit:  # fmt: skip
        flushed = self.dead_letter.flushes if self.dead_letter is not None else 0
        self.calls.append((list(progress), events, rollback, list(fences), flushed))
        commit = Commit(list(progress), events, rollback, list(fences))
        if rollback or wait:
            commit.done.set()
        self.commits.append(commit)
        return commit


class _DeadLetter:
    flushes = 0

    def flush(self) -> None:
        self.flushes += 1


class _Batch:
    def __init__(self, rows: int) -> None:
        self.num_rows = rows


def test_a_checkpoint_flushes_the_rejects_first_and_carries_the_advanced_books_and_the_tokens() -> None:
    dead = _DeadLetter()
    sink = _Sink(dead)
    fed: list[Any] = []
    driver = Driver(default_definitions(), sink, ingest=lambda b, definitions: fed.append((b, definitions)),
                    dead_letter=dead)  # fmt: skip
    a, b = books(dict.fromkeys(NAMES, 0), "a"), books(dict.fromkeys(NAMES, 0), "b")
    driver.hold("a", a, token=3)
    driver.hold("b", b)
    assert driver.checkpoint() is None  # nothing fed, nothing advanced: nothing to commit
    driver.feed(_Batch(10), driver.wanted(a, 0))
    driver.feed(_Batch(99), frozenset())  # every definition has it: skipped
    assert [d for _, d in fed] == [None]  # all definitions: the engine's own set
    a.advance(NAMES, Position(10))
    driver.checkpoint("first")
    (progress, events, rollback, fences, flushed) = sink.calls[-1]
    assert {(r.part, r.end) for r in progress} == {("a", 10)} and len(progress) == len(NAMES)
    assert (events, rollback, flushed) == (10, False, 1)  # the dead letter flushed before the commit
    assert [(f.part, f.end) for f in fences] == [("a", 3)]  # only the part held with a token
    assert driver.checkpoint() is None  # nothing new


def test_commits_are_reaped_in_order_a_fenced_one_stops_and_a_failed_one_stops_the_driver() -> None:
    sink = _Sink()
    stored: list[str] = []
    driver = Driver(default_definitions(), sink, ingest=lambda *a, **k: None, max_commits=2,
                    on_commit=stored.append)  # fmt: skip
    driver.hold("a", books(dict.fromkeys(NAMES, 0)))
    for marker in ("one", "two"):
        driver.fed(5)
        driver.checkpoint(marker)
    assert driver.behind and driver.queued == 2
    sink.commits[1].done.set()  # the second is done first: nothing is reaped before the first
    assert not driver.reap() and stored == []
    sink.commits[0].done.set()
    assert not driver.reap() and stored == ["one", "two"] and driver.stored_events == 10
    assert not driver.behind
    driver.fed(1)
    driver.checkpoint("fenced")
    driver.fed(1)
    driver.checkpoint("after")
    sink.commits[2].fenced = True
    sink.commits[2].done.set()
    sink.commits[3].done.set()
    assert driver.reap() is True and driver.fenced_commits == 1 and stored == ["one", "two"]
    driver.rollback()  # the queued one is stored (not fenced), then what was fed is dropped
    assert stored == ["one", "two", "after"] and sink.calls[-1][2] is True and driver.uncommitted == 0
    driver.fed(1)
    driver.checkpoint("broken")
    sink.commits[-1].error = "disk full"
    sink.commits[-1].done.set()
    assert not driver.drain() and driver.failed == "disk full" and stored == ["one", "two", "after"]


def test_checkpoints_are_paced_by_what_the_last_commit_took() -> None:
    """A commit that takes long (many entities and periods rewritten) spaces the next checkpoint to PACE times its
    duration, up to max_checkpoint_s; a cheap one brings back checkpoint_s. On a clock the test turns."""
    now = [100.0]
    sink = _Sink()
    driver = Driver(default_definitions(), sink, ingest=lambda *a, **k: None, checkpoint_s=2.0,
                    clock=lambda: now[0])  # fmt: skip
    driver.hold("a", books(dict.fromkeys(NAMES, 0)))

    def commit_taking(seconds: float) -> None:
        driver.fed(1)
        driver.checkpoint()
        now[0] += seconds
        sink.commits[-1].done.set()
        assert not driver.reap()

    assert driver.interval == 2.0 and not driver.due
    now[0] += 2.0
    assert driver.due
    commit_taking(1.0 / PACE)  # cheap (PACE times it is under checkpoint_s): the interval stays checkpoint_s
    assert driver.interval == 2.0
    now[0] += 2.0  # (2 s and the commit since the checkpoint)
    assert driver.due
    commit_taking(5.0 / PACE)  # a commit of a PACE-th of 5 s: the next comes 5 s after this one began
    assert abs(driver.interval - 5.0) < 1e-9
    now[0] += 4.9 - 5.0 / PACE  # 4.9 s since the checkpoint
    assert not driver.due
    now[0] += 0.2  # 5.1 s
    assert driver.due
    commit_taking(3.0)  # a commit of 3 s: capped at five intervals (max_checkpoint_s)
    assert driver.interval == driver.max_checkpoint_s == 10.0
    now[0] += 6.9
    assert not driver.due
    now[0] += 0.1
    assert driver.due
    driver.fed(1)
    driver.checkpoint()  # done 0.1 s later (the commit's own stamp), reaped 30 s later by an idle reader
    sink.commits[-1].finished = now[0] + 0.1
    sink.commits[-1].done.set()
    now[0] += 30
    assert not driver.reap() and driver.interval == 2.0
    # two commits queued: the second waits 3 s behind the first, then takes 3 / PACE s of its own
    for _ in range(2):
        driver.fed(1)
        driver.checkpoint()
    first, second = sink.commits[-2:]
    first.finished, second.finished = now[0] + 3.0, now[0] + 3.0 + 3.0 / PACE
    first.done.set()
    second.done.set()
    now[0] += 4
    assert not driver.reap() and abs(driver.last_commit_s - 3.0 / PACE) < 1e-9 and abs(driver.interval - 3.0) < 1e-9
