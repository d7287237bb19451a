"""Several writers on one PostgreSQL store: concurrent merges of the same keys, servers and runs starting on a fresh
database at once, transient failures retried, and a permanent one that refuses new data but loses none.

Every test starts on a fresh schema (no tables, no definitions), so schema creation and definition registration
race for real."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from drainpipe.errors import StoreError, StoreUnavailable
from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS
from drainpipe.pipeline.engine import EngineOptions, LocalEngine
from drainpipe.pipeline.generator import generate_events, write_events
from drainpipe.pipeline.run import run_local
from drainpipe.pipeline.store import SourceProgress, database_merge, folder, open_store, sql
from drainpipe.pipeline.store.postgres_store import PostgresBackend
from serve_kill import PLACEHOLDER, body_template, start_serve
from testlib import ingest, same_values, store_events, wait_until

#: the generated files' events are of 2026-11-21 (the generator's default start) and the servers purge at start: the
#: clock stands on that day (the requests' events follow it)
pytestmark = [pytest.mark.postgres, pytest.mark.clock_at("2026-11-21T12:00:00Z")]

SHARED_SERVICES = (b"alpha", b"beta", b"gamma")


@pytest.fixture(autouse=True)
def _folds_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The look's mechanics are held with folds at once after every commit (``fold_after_s`` 0); the tests of the
    wait before a fold set it on their stores."""
    monkeypatch.setattr(sql, "FOLD_AFTER_S", 0.0)


def _reference(batches: list) -> tuple[list, list]:
    duck = open_store("duckdb:///:memory:")
    for i, batch in enumerate(batches):
        ingest(duck, batch, f"b{i}")
    try:
        return duck.query(), duck.query_topn("top_slow_statements")
    finally:
        duck.close()


def _queued(pg_url: str) -> int:
    """The rows in the merge queue (committed, not folded), read on a connection of its own."""
    with psycopg.connect(pg_url, autocommit=True) as con:
        return int(con.execute("SELECT count(*) FROM merge_queue").fetchone()[0])  # type: ignore[index]


def test_concurrent_merges_of_the_same_keys_are_exact(pg_url: str) -> None:
    """Three processes' worth of stores (one connection each) open a fresh schema at once and merge batches whose
    keys all collide (three services, the same hours and days). The result equals one store that merged every
    batch. Without the write lock two merges read the same stored state and one's addition is lost (or a key gets
    two rows); without race-free registration a writer fails on the definitions' primary key."""
    batches = [store_events(400, seed=100 + i) for i in range(12)]
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def writer(k: int) -> None:
        try:
            start.wait()
            with open_store(pg_url) as store:  # type: ignore[attr-defined]
                for i in range(k, len(batches), 3):
                    ingest(store, batches[i], f"b{i}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    want, want_topn = _reference(batches)
    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        got, got_topn = store.query(), store.query_topn("top_slow_statements")
    assert same_values(got, want)
    assert got_topn == want_topn


@pytest.mark.parametrize("fold_after_s", [0.0, 0.05])
def test_four_writers_of_the_same_keys_leave_nothing_queued_and_store_every_event_once(
    pg_url: str, fold_after_s: float
) -> None:
    """Four writers merge batches of the same keys at once, a stress of the rules the tests after this one check
    step by step: a writer that finds a merge running (or younger states queued) queues, and its folder folds in
    the background, skipping a stripe another fold holds and looking again. So once every merge call has returned,
    every queued stripe has a mark, and with no store closed or read, and no commit after, the folders fold
    everything (at once, or once it has waited); the values equal one store's."""
    batches = [store_events(150, seed=700 + i) for i in range(24)]
    errors: list[BaseException] = []
    start, merged, checked = threading.Barrier(5), threading.Barrier(5), threading.Event()

    def writer(k: int) -> None:
        try:
            with open_store(pg_url) as store:  # type: ignore[attr-defined]
                store.fold_after_s = fold_after_s
                start.wait(30)
                for i in range(k, len(batches), 4):
                    ingest(store, batches[i], f"b{i}")
                merged.wait(60)
                assert checked.wait(30)
        except BaseException as exc:
            errors.append(exc)
            merged.abort()

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    try:
        start.wait(30)
        merged.wait(120)
        marks = _marks(pg_url)  # (marks first: a fold meanwhile takes a stripe's rows with its marks)
        stripes = _queued_stripes(pg_url)
        wait_until(lambda: _queued(pg_url) == 0 and not _marks(pg_url), 30, interval=0.02,
                   what="the folders folding every commit")  # fmt: skip
    finally:
        checked.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert stripes <= marks
    want, _ = _reference(batches)
    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        assert same_values(store.query(), want)


def test_a_writer_that_queues_while_another_merges_returns_at_once_and_its_folder_folds_after_the_holder(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a writer merges at its commit (every merge lock held), another writer commits: it queues its states and
    returns without waiting; its folder finds every stripe held, looks again shortly, and folds them once the holder
    has committed: nothing stays queued."""
    batches = [store_events(300, seed=800 + i) for i in range(4)]
    with open_store(pg_url) as first, open_store(pg_url) as second:  # type: ignore[attr-defined]
        ingest(first, batches[0], "b0")  # (both registered: a registration waits for another's uncommitted one)
        ingest(second, batches[1], "b1")
        merge_with_queue = database_merge.merge_with_queue
        meanwhile: list[Any] = []

        def merge_holding_the_locks(backend: Any) -> int:
            folded = merge_with_queue(backend)  # (the queue taken: what the other writer queues now is left)
            writer = threading.Thread(target=lambda: meanwhile.append(ingest(second, batches[3], "b3")))
            writer.start()
            writer.join(30)
            assert meanwhile and meanwhile[0].applied, "the other writer waited for the merge locks"
            return folded

        monkeypatch.setattr(database_merge, "merge_with_queue", merge_holding_the_locks)
        assert ingest(first, batches[2], "b2").applied
        monkeypatch.undo()
        wait_until(lambda: _queued(pg_url) == 0, 30, interval=0.02, what="the second writer's folder")
        got = first.query()
    want, _ = _reference(batches)
    assert same_values(got, want)


def test_a_writer_whose_merge_fails_under_the_merge_locks_folds_what_another_queued_meanwhile(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer merging at its commit (every merge lock held) fails on a database error. Another writer committed
    meanwhile: it queued its states, and its folder found the stripes held. The failed writer looks at the queue on
    its way out (and the other's folder looks again), so nothing stays queued. (The error is the database's own, raised where the store's session has not
    mapped it yet.)"""
    batches = [store_events(300, seed=820 + i) for i in range(3)]
    with open_store(pg_url) as first, open_store(pg_url) as second:  # type: ignore[attr-defined]
        ingest(first, batches[0], "b0")
        ingest(second, batches[1], "b1")
        merge_with_queue = database_merge.merge_with_queue
        meanwhile: list[Any] = []

        def merge_then_fail(backend: Any) -> int:
            merge_with_queue(backend)
            writer = threading.Thread(target=lambda: meanwhile.append(ingest(second, batches[2], "b2")))
            writer.start()
            writer.join(30)
            assert meanwhile and meanwhile[0].applied, "the other writer waited for the merge locks"
            backend.execute("SELECT 1 / 0")  # (a statement that fails while the locks are held)
            return 0

        monkeypatch.setattr(database_merge, "merge_with_queue", merge_then_fail)
        with pytest.raises(StoreError, match="division by zero"):
            ingest(first, store_events(300, seed=829), "failed")
        monkeypatch.undo()
        wait_until(lambda: _queued(pg_url) == 0, 30, interval=0.02, what="nothing queued")
        got = first.query()
    want, _ = _reference(batches)
    assert same_values(got, want)


def test_a_fold_looks_again_a_bounded_number_of_times(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers that keep queueing into the stripes a fold takes would keep it folding for ever (a folder that never
    sleeps, a query or a close that never returns): a look takes each stripe again at most ``FOLD_ROUNDS`` times.
    What it leaves was queued by writers still committing, whose folders fold it."""
    calls: list[int] = []

    def fold_now(backend: Any, stripe: int) -> int | None:
        calls.append(stripe)
        return 1 if len(calls) < 50 else None  # (an unbounded look stops at 50: the lock found held)

    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        # (always more queued)
        monkeypatch.setattr(database_merge, "queued_stripes", lambda backend, waited_s=None: [0])
        monkeypatch.setattr(database_merge, "fold_now", fold_now)
        folder.fold_queue(store.backend, first=0)
        monkeypatch.undo()
    assert len(calls) == folder.FOLD_ROUNDS


def test_a_stripe_whose_fold_fails_does_not_stop_the_fold_of_the_others(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first stripe's fold fails on a database error: the other stripes are folded all the same, and the error
    is raised after them (a folder logs it and tries again; a query or a close logs it)."""
    calls: list[int] = []

    def fold_now(backend: Any, stripe: int) -> int | None:
        calls.append(stripe)
        if len(calls) == 1:
            raise psycopg.errors.DivisionByZero("injected")
        return 1

    looks = iter([[0, 1, 2, 3]])
    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        monkeypatch.setattr(database_merge, "queued_stripes", lambda backend, waited_s=None: next(looks, []))
        monkeypatch.setattr(database_merge, "fold_now", fold_now)
        with pytest.raises(StoreError, match="injected"):
            folder.fold_queue(store.backend, first=0)
        monkeypatch.undo()
    assert sorted(calls) == [0, 1, 2, 3]


def test_a_store_that_closes_waits_for_the_merge_locks_and_folds_what_it_queued(pg_url: str) -> None:
    """A writer queued its states while another transaction held the merge locks, and closes before the holder lets
    go: its close waits for the locks and folds them, so a writer that stops never leaves its own rows queued (the
    holder, a bare connection here, does not look)."""
    batches = [store_events(300, seed=840 + i) for i in range(2)]
    store = open_store(pg_url)
    store.merge(aggregate_batch(batches[0], DEFAULT_DEFINITIONS))
    holder = PostgresBackend(pg_url)
    holder.open(lambda migrate: None)
    closed: list[BaseException | None] = []

    def close() -> None:
        try:
            store.close()
            closed.append(None)
        except BaseException as exc:
            closed.append(exc)

    try:
        with holder.session("hold"):
            with holder.transaction():
                holder.lock_merges(None)
                store.merge(aggregate_batch(batches[1], DEFAULT_DEFINITIONS))  # (queued: the locks are held)
                assert _queued(pg_url) > 0
                closing = threading.Thread(target=close)
                closing.start()
                # (this database's locks only: pg_locks shows every database's)
                wait_until(lambda: holder.fetchall("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                                   "AND NOT granted AND database = (SELECT oid FROM pg_database "
                                                   "WHERE datname = current_database())")[0][0] > 0,
                           10, what="the close waiting")  # fmt: skip
            closing.join(30)
    finally:
        holder.close()
    assert closed == [None]
    assert _queued(pg_url) == 0
    with open_store(pg_url) as reader:  # type: ignore[attr-defined]
        got = reader.query()
    want, _ = _reference(batches)
    assert same_values(got, want)


def _marks(pg_url: str) -> set[int]:
    """The stripes the queue's marks name (a commit's record of the stripes it queued rows for, and when)."""
    with psycopg.connect(pg_url, autocommit=True) as con:
        return {int(row[0]) for row in con.execute("SELECT stripe FROM merge_marks").fetchall()}


def _queued_stripes(pg_url: str) -> set[int]:
    """The stripes of the rows in the queue."""
    with psycopg.connect(pg_url, autocommit=True) as con:
        rows = con.execute(f"SELECT DISTINCT hashtext(entity) & {database_merge.STRIPES - 1} FROM merge_queue")
        return {int(row[0]) for row in rows.fetchall()}


def test_a_store_in_another_schema_of_the_database_never_takes_this_stores_locks(
    pg_url: str, other_pg_url: str
) -> None:
    """Advisory locks are a database's: a store's are keyed by its schema, so a merge running in another schema's
    store (its every merge lock held) does not make this store's lone writer queue its states (for a fold only a
    writer of this store would make)."""
    batch = store_events(300, seed=860)
    holder = PostgresBackend(other_pg_url)
    try:
        with open_store(pg_url) as store, open_store(other_pg_url):  # type: ignore[attr-defined]
            holder.open(lambda migrate: None)
            with holder.session("hold"), holder.transaction():  # (a merge running in the other store)
                holder.lock_merges(None)
                store.merge(aggregate_batch(batch, DEFAULT_DEFINITIONS))
                assert _queued(pg_url) == 0  # merged at its commit: a lone writer of its own store
            assert same_values(store.query(), _reference([batch])[0])
    finally:
        holder.close()


def test_a_schema_created_ahead_on_the_search_path_does_not_move_a_store_that_reconnects(pg_url: str) -> None:
    """A store's URL puts a schema that does not exist yet ahead of the store's; once it exists, a connection the
    store opens again (after a lost one) still reads and writes the store's schema, under its locks' key."""
    store_schema = re.search(r"search_path%3D(\w+)", pg_url).group(1)  # type: ignore[union-attr]
    ahead = f"{store_schema}_ahead"
    url = pg_url.replace(f"search_path%3D{store_schema}", f"search_path%3D{ahead}%2C{store_schema}")
    batches = [store_events(300, seed=850 + i) for i in range(2)]
    with open_store(url) as store:  # type: ignore[attr-defined]
        store.merge(aggregate_batch(batches[0], DEFAULT_DEFINITIONS))
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {ahead}")
            try:
                admin.execute("SELECT pg_terminate_backend(%s)", [store.backend.connection.info.backend_pid])
                with pytest.raises(StoreUnavailable):  # (lost: the next session opens the connection again)
                    store.merge(aggregate_batch(batches[1], DEFAULT_DEFINITIONS))
                store.merge(aggregate_batch(batches[1], DEFAULT_DEFINITIONS))
                assert store.reconnects == 1
                made = admin.execute(
                    "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", [ahead]
                ).fetchone()
                assert made == (0,)  # nothing made in the schema ahead
                assert same_values(store.query(), _reference(batches)[0])
            finally:
                admin.execute(f"DROP SCHEMA {ahead} CASCADE")


def test_queued_states_wait_before_a_fold_and_a_query_sees_every_commit_meanwhile(pg_url: str) -> None:
    """Queued states wait ``fold_after_s`` before a fold in the background takes them, so that one fold adds up the
    commits of every writer meanwhile: a commit that finds younger rows queued queues its own too, even with no
    merge running, and nothing folds them; a query sees them all the same (it folds first). Then, with a short
    wait, the writers' folders fold two commits queued together once they have waited, with no commit after,
    leaving no row and no mark."""
    batches = [store_events(300, seed=870 + i) for i in range(4)]
    holder = PostgresBackend(pg_url)
    try:
        with open_store(pg_url) as first, open_store(pg_url) as second:  # type: ignore[attr-defined]
            holder.open(lambda migrate: None)  # (the schema made)
            first.fold_after_s = second.fold_after_s = 3600.0
            first.merge(aggregate_batch(batches[0], DEFAULT_DEFINITIONS))
            assert _queued(pg_url) == 0  # (a lone writer: merged at its commit)
            with holder.session("hold"), holder.transaction():  # (as a merge running meanwhile)
                holder.lock_merges(None)
                second.merge(aggregate_batch(batches[1], DEFAULT_DEFINITIONS))
            queued = _queued(pg_url)
            assert queued > 0 and _marks(pg_url) == _queued_stripes(pg_url)
            first.merge(aggregate_batch(batches[2], DEFAULT_DEFINITIONS))  # no merge runs: queued all the same
            assert _queued(pg_url) > queued
            assert same_values(second.query(), _reference(batches[:3])[0])  # (the query folds them)
            assert _queued(pg_url) == 0 and not _marks(pg_url)

        with open_store(pg_url) as third, open_store(pg_url) as fourth:  # type: ignore[attr-defined]
            third.fold_after_s = fourth.fold_after_s = 0.5
            third.merge(aggregate_batch(batches[3], DEFAULT_DEFINITIONS))  # (merged at its commit: nothing queued)
            with holder.session("hold"), holder.transaction():
                holder.lock_merges(None)
                third.merge(aggregate_batch(batches[0], DEFAULT_DEFINITIONS))
                fourth.merge(aggregate_batch(batches[1], DEFAULT_DEFINITIONS))
                with psycopg.connect(pg_url, autocommit=True) as con:  # (two commits queued, folded together)
                    assert con.execute("SELECT count(DISTINCT xmin::text) FROM merge_queue").fetchone()[0] == 2
            wait_until(lambda: _queued(pg_url) == 0 and not _marks(pg_url), 30, interval=0.02,
                       what="the folders folding what has waited")  # fmt: skip
            got = third.query()
    finally:
        holder.close()
    assert same_values(got, _reference([*batches, batches[0], batches[1]])[0])


def test_every_transaction_of_a_store_runs_at_read_committed_whatever_the_server_s_default(pg_url: str) -> None:
    """A fold is one statement, its own transaction: it must take its snapshot after its merge lock is granted (READ
    COMMITTED), or under a server whose default is stricter it would merge into states read before the previous
    holder committed. The store pins the level for every transaction of its connection."""
    strict = pg_url.replace("options=", "options=-cdefault_transaction_isolation%3Dserializable%20", 1)
    assert strict != pg_url
    with psycopg.connect(strict, autocommit=True) as con:  # (the URL does make the default stricter)
        assert con.execute("SHOW transaction_isolation").fetchone()[0] == "serializable"  # type: ignore[index]
    with open_store(strict) as store:  # type: ignore[attr-defined]
        backend = store.backend  # type: ignore[attr-defined]
        with backend.session("look"):
            assert backend.fetchall("SHOW transaction_isolation")[0][0] == "read committed"
        ingest(store, store_events(100, seed=900), "p")
        assert store.query()


def _faults(pg_url: str, *codes: str, table: str = "metric_state") -> None:
    """A trigger on ``table`` that fails the first statements that insert into it, one per code (SQLSTATE; "" lets
    that one through), then never. A sequence counts the calls: unlike a table, it is not rolled back with the failed
    transaction."""
    cases = " ".join(
        f"IF n = {i} THEN RAISE EXCEPTION 'injected fault {code}' USING ERRCODE = '{code}'; END IF;"
        for i, code in enumerate(codes, 1)
        if code
    )
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute("CREATE SEQUENCE fault_calls")
        con.execute(
            "CREATE FUNCTION inject_fault() RETURNS trigger LANGUAGE plpgsql AS $$ DECLARE n bigint; BEGIN "
            f"n := nextval('fault_calls'); {cases} RETURN NULL; END $$"
        )
        con.execute(
            f"CREATE TRIGGER inject_fault BEFORE INSERT ON {table} FOR EACH STATEMENT EXECUTE FUNCTION inject_fault()"
        )


def test_serialization_failure_and_deadlock_are_retried(pg_url: str) -> None:
    """A serialization failure (40001) and a deadlock (40P01) raised by PostgreSQL inside merges are transient: the
    engine retries them with backoff, nothing is dropped, and the values equal a store that never failed."""
    batches = [store_events(500, seed=200 + i) for i in range(6)]
    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        _faults(pg_url, "40001", "40P01")  # (a lone writer's commit merges its states)
        engine = LocalEngine(DEFAULT_DEFINITIONS, store, EngineOptions(store_retry_s=(0.01, 0.05)), name="pg-retry")
        for batch in batches:
            engine.ingest(batch)
        engine.close()
        assert engine.counters.store_retries >= 2 and engine.counters.store_errors == 0
        got = store.query()
    with psycopg.connect(pg_url, autocommit=True) as con:
        assert con.execute("SELECT last_value FROM fault_calls").fetchone()[0] >= 3  # both faults fired
    want, _ = _reference(batches)
    assert same_values(got, want)


def _queued_merge(pg_url: str, store: Any, partials: list, codes: tuple[str, ...]) -> Any:
    """``store.merge(partials)`` while another connection holds every merge lock (as another writer's merge would):
    the writer queues its states and commits; the faults (``codes``) are armed and the locks let go before the
    writer's folder looks at the queue (held back until then), so its fold meets them. The merge's report. (The
    holder is a bare connection: a store would fold the queue when it closes.)"""
    holder = PostgresBackend(pg_url)
    holder.open(lambda migrate: None)
    released = threading.Event()
    result: list = []
    look = database_merge.queued_stripes

    def held_look(backend: Any, waited_s: float | None = None) -> list[int]:
        if threading.current_thread().name.startswith("drainpipe-fold"):  # (a folder's)
            assert released.wait(10), "the holder never let go"
        return look(backend, waited_s)

    writer = threading.Thread(target=lambda: result.append(store.merge(partials)))
    database_merge.queued_stripes = held_look
    try:
        with holder.session("hold"):
            with holder.transaction():
                # as a writer merging at its commit: its part's books and every merge lock (the writer, of no part,
                # must commit meanwhile: it waits for the books of its own parts only)
                holder.lock_books({("holder", "p")})
                holder.lock_merges(None)
                writer.start()
                deadline = time.monotonic() + 10
                while not holder.fetchall("SELECT count(*) FROM merge_queue")[0][0]:
                    assert time.monotonic() < deadline, "the writer never queued"
                    time.sleep(0.01)
                _faults(pg_url, *codes)
            released.set()
            writer.join(10)
    finally:
        database_merge.queued_stripes = look
        released.set()
        holder.close()
    assert result, "the merge raised"
    return result[0]


def _fault_met(pg_url: str) -> bool:
    with psycopg.connect(pg_url, autocommit=True) as con:
        return bool(con.execute("SELECT is_called FROM fault_calls").fetchone()[0])  # type: ignore[index]


def test_a_fold_that_fails_leaves_the_merge_committed_and_the_folder_tries_again(pg_url: str) -> None:
    """A fold (the merge of the queued states) that fails after the merge's commit must not make the merge fail: a
    retried merge would queue its states again. The merge succeeds, the states wait in the queue, and the writer's
    folder tries again after a pause: the values equal a store that never failed."""
    batches = [store_events(500, seed=300 + i) for i in range(2)]
    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        store.merge(aggregate_batch(batches[0], DEFAULT_DEFINITIONS))
        report = _queued_merge(pg_url, store, aggregate_batch(batches[1], DEFAULT_DEFINITIONS), ("40001",))
        assert report.applied and not report.skipped
        wait_until(lambda: _fault_met(pg_url), 30, interval=0.02, what="the folder's fold meeting the fault")
        wait_until(lambda: _queued(pg_url) == 0, 30, interval=0.02, what="the folder trying again")
        got = store.query()
    want, _ = _reference(batches)
    assert same_values(got, want)


def test_states_left_in_the_queue_are_merged_when_the_store_is_opened(pg_url: str) -> None:
    """A writer that stops between its commit and its fold (killed, or its folds failing until it closed) leaves its
    states queued; they are committed, so the next process to open the store merges them, once."""
    batches = [store_events(300, seed=400 + i) for i in range(2)]
    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        store.merge(aggregate_batch(batches[0], DEFAULT_DEFINITIONS))
        _queued_merge(pg_url, store, aggregate_batch(batches[1], DEFAULT_DEFINITIONS), ("40001",) * 100)
    assert _queued(pg_url) > 0  # (its close tried the fold again, and failed)
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute("DROP TRIGGER inject_fault ON metric_state")
    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        got = store.query()
    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        assert store.query() == got  # merged once
    want, _ = _reference(batches)
    assert same_values(got, want)


def _count_inserts(pg_url: str, table: str) -> None:
    """A statement trigger on ``table`` that counts the statements inserting into it (sequence ``inserts_<table>``)."""
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute(f"CREATE SEQUENCE inserts_{table}")
        con.execute(f"CREATE FUNCTION count_{table}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    f"PERFORM nextval('inserts_{table}'); RETURN NULL; END $$")  # fmt: skip
        con.execute(f"CREATE TRIGGER count_{table} BEFORE INSERT ON {table} FOR EACH STATEMENT "
                    f"EXECUTE FUNCTION count_{table}()")  # fmt: skip


def _inserts(pg_url: str, table: str) -> tuple[int, int]:
    """The statements counted on ``table``, and the rows in the queue."""
    with psycopg.connect(pg_url, autocommit=True) as con:
        last, called = con.execute(f"SELECT last_value, is_called FROM inserts_{table}").fetchone()  # type: ignore[misc]
    return int(last) if called else 0, _queued(pg_url)


def test_a_writer_that_finds_no_merge_running_merges_at_its_commit_with_what_others_queued(pg_url: str) -> None:
    """A lone writer's states never go through the queue (a copy in, a delete, a copy out); a writer that finds
    states others queued (a writer that stopped with its folds failing) merges them with its own at its commit, in
    one pass, and leaves the queue empty: the values equal one store's."""
    batches = [store_events(400, seed=500 + i) for i in range(3)]
    with open_store(pg_url) as alone:  # type: ignore[attr-defined]
        _count_inserts(pg_url, "merge_queue")
        alone.merge(aggregate_batch(batches[0], DEFAULT_DEFINITIONS))
        assert _inserts(pg_url, "merge_queue") == (0, 0)  # merged at its commit
        # another writer queues while a merge runs, and stops with its folds failing: its states wait
        with open_store(pg_url) as other:  # type: ignore[attr-defined]
            _queued_merge(pg_url, other, aggregate_batch(batches[1], DEFAULT_DEFINITIONS), ("40001",) * 100)
        assert _inserts(pg_url, "merge_queue")[1] > 0
        with psycopg.connect(pg_url, autocommit=True) as con:
            con.execute("DROP TRIGGER inject_fault ON metric_state")
        alone.merge(aggregate_batch(batches[2], DEFAULT_DEFINITIONS))
        assert _inserts(pg_url, "merge_queue")[1] == 0  # taken by the merge at the commit
        got = alone.query()
    want, _ = _reference(batches)
    assert same_values(got, want)


def test_a_writer_that_fails_as_it_queues_leaves_nothing_queued(pg_url: str) -> None:
    """A writer that queues (a merge runs meanwhile) and fails before its commit (its second insert into the queue)
    leaves no row queued, no progress and the stored values as they were; retried, it is applied once."""
    batches = [store_events(300, seed=660 + i) for i in range(2)]
    progress = [SourceProgress("file", "two", d.name, -1) for d in DEFAULT_DEFINITIONS.all]
    with open_store(pg_url) as store, open_store(pg_url) as holder:  # type: ignore[attr-defined]
        store.merge(aggregate_batch(batches[0], DEFAULT_DEFINITIONS))
        before = store.query()
        _faults(pg_url, "", "P0001", table="merge_queue")  # (the first insert goes through: the states')
        errors: list[BaseException] = []

        def writer() -> None:
            try:
                store.merge(aggregate_batch(batches[1], DEFAULT_DEFINITIONS), progress=progress)
            except BaseException as exc:
                errors.append(exc)

        con = holder.backend  # type: ignore[attr-defined]
        with con.session("hold"), con.transaction():
            con.lock_merges(None)  # (as a merge at another writer's commit: the writer queues)
            thread = threading.Thread(target=writer)
            thread.start()
            thread.join(60)
        assert len(errors) == 1 and isinstance(errors[0], StoreError) and "injected fault" in str(errors[0]), errors
        assert _queued(pg_url) == 0
        assert store.query() == before and store.progress("file", part="two") == []
        assert store.merge(aggregate_batch(batches[1], DEFAULT_DEFINITIONS), progress=progress).applied
        got = store.query()
    want, _ = _reference(batches)
    assert same_values(got, want)


def _post(base: str, body: bytes) -> int:
    req = urllib.request.Request(base + "/v1/events", data=body, headers={"Content-Type": "application/x-ndjson"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _stored_events(url: str) -> tuple[int, int]:
    """Events in the store by minute and by hour states (cpm of an hour is its count / 60)."""
    with open_store(url) as store:  # type: ignore[attr-defined]
        minutes = sum(r[5] for r in store.query(metric="service_cpm", granularity="minute"))
        hours = 60 * sum(r[5] for r in store.query(metric="service_cpm", granularity="hour"))
    return int(round(minutes)), int(round(hours))


def _load(
    bases: list[str],
    seconds: float,
    per_server: int = 2,
    stop: threading.Event | None = None,
    services: tuple[bytes, ...] = SHARED_SERVICES,
    until_refused: bool = False,
) -> tuple[int, dict[int, int]]:
    """Clients posting 200-event bodies of ``services`` to every server for ``seconds`` (or until ``stop``
    is set, or ``until_refused``, until a server has refused one): (acknowledged events, count of other answers by
    status)."""
    template = body_template(200)
    if until_refused and stop is None:
        stop = threading.Event()
    acked = [0]
    other: dict[int, int] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client(base: str, c: int) -> None:
        n = 0
        while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            status = _post(base, template.replace(PLACEHOLDER, services[(c + n) % len(services)]))
            n += 1
            with lock:
                if status == 200:
                    acked[0] += 200
                else:
                    other[status] = other.get(status, 0) + 1
            if status != 200:
                if until_refused and stop is not None:
                    stop.set()
                time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(b, c)) for b in bases for c in range(per_server)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return acked[0], other


def _serve(pg_url: str, wal: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    return start_serve(pg_url, str(wal), "--parsers", "1", "--checkpoint-s", "0.3", *extra)


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(120)


def test_servers_on_one_fresh_store_store_every_acknowledged_event(pg_url: str, tmp_path: Path) -> None:
    """Three ``drainpipe serve`` processes start on a fresh database at once and take clients posting events of the
    same three services (so their checkpoints merge the same keys). After a graceful stop the store holds exactly
    the events they acknowledged, in minute and in hour states, and no server saw a store error."""
    # at once: each waits for its "listening on" line in a thread of its own (one after the other, the three starts
    # took 3.6 s, and the later ones met a store the first had set up)
    with ThreadPoolExecutor(3) as pool:
        started = list(pool.map(lambda i: _serve(pg_url, tmp_path / f"wal{i}"), range(3)))
    try:
        acked, other = _load([base for _, base in started], 4.0)
    finally:
        codes = [_stop(proc) for proc, _ in started]
    logs = "".join("".join(proc.output) for proc, _ in started)  # type: ignore[attr-defined]
    assert codes == [0, 0, 0], logs[-2000:]
    assert not other, other
    assert "store write failed" not in logs and "Traceback" not in logs, logs[-2000:]
    assert acked > 0
    assert _stored_events(pg_url) == (acked, acked)


def test_two_runs_into_one_fresh_store_merge_exactly(pg_url: str, tmp_path: Path) -> None:
    """Two ``drainpipe run`` processes, started at once on different inputs of the same services, into one fresh
    PostgreSQL store: the store equals one DuckDB store that both runs wrote, one after the other."""
    inputs = []
    for i in range(2):
        path = tmp_path / f"events{i}.jsonl"
        write_events(generate_events(60_000, services=4, seed=300 + i, duration_s=3 * 3600), path)
        inputs.append(path)
    duck = f"duckdb:///{tmp_path}/ref.duckdb"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}

    def run(path: Path, store: str) -> subprocess.Popen[str]:
        # in tmp_path: a server store's default dead letter is drainpipe.rejected.jsonl in the working directory
        return subprocess.Popen([sys.executable, "-m", "drainpipe.cli", "run", "-q", "--input", str(path),
                                 "--store", store], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=tmp_path)  # fmt: skip

    runs = [run(path, pg_url) for path in inputs]
    # the reference while they run: the local engine (what `drainpipe run` runs) in this process, one file after the
    # other (two more processes, after the runs, took 2.4 s)
    for path in inputs:
        summary = run_local([str(path)], definitions=DEFAULT_DEFINITIONS, store_url=duck)
        assert summary.complete, summary.error
    outputs = [p.communicate(timeout=300)[0] for p in runs]
    assert [p.returncode for p in runs] == [0, 0], outputs
    with open_store(duck) as ref, open_store(pg_url) as pg:  # type: ignore[attr-defined]
        assert same_values(pg.query(), ref.query())
        assert pg.query_topn("top_slow_statements") == ref.query_topn("top_slow_statements")


def test_a_permanent_store_error_refuses_keeps_the_data_and_catches_up(pg_url: str, tmp_path: Path) -> None:
    """A store write that fails for good (not "unavailable") stops the server accepting: 503 to clients, unhealthy
    in /healthz, the reason in /metrics and in one log line. Nothing acknowledged is dropped: once the cause is
    removed and the server restarted on its write-ahead log, the store holds every acknowledged event."""
    proc, base = _serve(pg_url, tmp_path / "wal")
    try:
        acked, other = _load([base], 1.0, per_server=1)
        assert acked and not other
        with psycopg.connect(pg_url, autocommit=True) as con:  # a constraint nobody can satisfy: a permanent error
            con.execute("ALTER TABLE metric_state ADD CONSTRAINT broken CHECK (n < 0) NOT VALID")
        # until it refuses (it refuses everything after: 3 s more of load added nothing)
        more, refused = _load([base], 60.0, per_server=1, until_refused=True)
        assert refused.get(503), refused  # it stopped accepting

        def failed() -> str | None:
            with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
                text = r.read().decode()
            return text if re.search(r"^drainpipe_store_failed 1(\.0)?$", text, re.M) else None

        metrics = wait_until(failed, timeout=30, interval=0.05, what="the failure in /metrics")
        assert re.search(r'^drainpipe_store_failure_info\{reason=".*broken.*"\} 1', metrics, re.M), metrics[-3000:]
        try:
            urllib.request.urlopen(base + "/healthz", timeout=10)
            healthy = True
        except urllib.error.HTTPError as exc:
            healthy = False
            assert exc.code == 503 and json.loads(exc.read())["status"] == "failed"
        assert not healthy
    finally:
        _stop(proc)
    logs = "".join(proc.output)  # type: ignore[attr-defined]
    assert "store write failed for good" in logs and "broken" in logs, logs[-2000:]
    assert _stored_events(pg_url)[0] < acked + more  # the rest waits in the log
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute("ALTER TABLE metric_state DROP CONSTRAINT broken")
    proc, base = _serve(pg_url, tmp_path / "wal")
    assert _stop(proc) == 0, "".join(proc.output)  # type: ignore[attr-defined]
    assert _stored_events(pg_url) == (acked + more, acked + more)


def test_a_spark_job_writes_while_a_server_writes(pg_url: str, tmp_path: Path) -> None:
    """``drainpipe run --engine spark`` into the PostgreSQL store that a server is writing under load, events of the
    same services (so both merge the same keys, minute, hour and day): the store holds exactly the server's
    acknowledged events plus the file's, and the statement top-N (from the file only) equals the local engine's."""
    path = tmp_path / "events.jsonl"
    write_events(generate_events(20_000, services=3, seed=400, duration_s=2 * 3600), path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    duck = f"duckdb:///{tmp_path}/ref.duckdb"
    run_local([str(path)], definitions=DEFAULT_DEFINITIONS, store_url=duck)  # the reference (no process to start)
    proc, base = _serve(pg_url, tmp_path / "wal")
    stop = threading.Event()
    result: list = []
    services = (b"svc-00", b"svc-01", b"svc-02")  # the file's
    loader = threading.Thread(target=lambda: result.append(_load([base], 600.0, 1, stop, services)))
    loader.start()
    try:
        spark = subprocess.run([sys.executable, "-m", "drainpipe.cli", "run", "-q", "--engine", "spark",
                                "--spark-master", "local[2]", "--input", str(path), "--store", pg_url],
                               env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)  # fmt: skip
    finally:
        stop.set()
        loader.join(120)
        code = _stop(proc)
    assert spark.returncode == 0, spark.stdout + spark.stderr
    assert code == 0, "".join(proc.output)  # type: ignore[attr-defined]
    acked, other = result[0]
    assert acked and not other, other
    assert _stored_events(pg_url) == (acked + 20_000, acked + 20_000)
    with open_store(pg_url) as pg, open_store(duck) as ref:  # type: ignore[attr-defined]
        assert pg.query_topn("top_slow_statements") == ref.query_topn("top_slow_statements")
