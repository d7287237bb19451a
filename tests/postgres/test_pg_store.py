"""The PostgreSQL store against a real server: values equal to the DuckDB store's, surviving a server restart,
and serving into it. (The store semantics suite, tests/pipeline/test_store.py, runs against both backends.)"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from drainpipe.errors import StoreError, StoreUnavailable
from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS, Definitions, MetricDef, TopNDef
from drainpipe.pipeline.engine import EngineOptions, LocalEngine
from drainpipe.pipeline.generator import generate_events
from drainpipe.pipeline.partials import split_partial
from drainpipe.pipeline.store import SourceProgress, Store, open_store
from testlib import T0, event_batch, ingest, metric_chunks, same_values, store_events, wait_until

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]


events = store_events


EVENTS = events(3000, seed=3)


@pytest.fixture(scope="module")
def reference() -> Store:
    """The DuckDB store holding EVENTS: what PostgreSQL must equal."""
    s = open_store("duckdb:///:memory:")
    ingest(s, EVENTS, "all")
    yield s
    s.close()


def test_open_store_dispatches_to_postgres(pg_url: str) -> None:
    from drainpipe.pipeline.store import PostgresStore

    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        assert isinstance(store, PostgresStore) and isinstance(store, Store)
        assert "***" in repr(store) and "drainpipe:drainpipe" not in repr(store)


def test_bad_urls_and_unreachable_server() -> None:
    with pytest.raises(StoreError, match="no database name"):
        open_store("postgresql://u:p@127.0.0.1:55432/")
    with pytest.raises(StoreError, match="cannot open postgresql store") as info:
        open_store("postgresql://u:secret@127.0.0.1:1/db")
    assert "secret" not in str(info.value) and "\n" not in str(info.value)


def test_two_halves_equal_the_whole(pg_url: str, reference: Store) -> None:
    with open_store(pg_url) as halves:  # type: ignore[attr-defined]
        ingest(halves, EVENTS.slice(0, 1234), "first")
    with open_store(pg_url) as halves:  # type: ignore[attr-defined]  # a new connection later: states persisted
        ingest(halves, EVENTS.slice(1234), "second")
        assert ingest(halves, EVENTS.slice(0, 1234), "first").applied == 0  # re-running a half is a no-op
        assert same_values(halves.query(), reference.query())
        assert halves.query_topn("top_slow_statements") == reference.query_topn("top_slow_statements")


def test_pieces_queries_and_filters(pg_url: str, reference: Store) -> None:
    definitions = Definitions(
        (MetricDef("c", "endpoint", "count"), MetricDef("p", "instance", "percentile", precision_ms=10)),
        (TopNDef("slow", "service", "db_statement", 3),),
    )
    duck = open_store("duckdb:///:memory:")
    ingest(duck, EVENTS, "batch-1", definitions)
    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        # the local engine's chunks, in two transactions; the second carries the batch's progress rows
        pieces = [q for p in aggregate_batch(EVENTS, definitions) for q in split_partial(p, 97)]
        progress = [SourceProgress("file", "batch-1", name, len(EVENTS)) for name in definitions.names]
        store.merge(pieces[:5])
        assert store.merge(pieces[5:], progress=progress).applied == len(pieces) - 5
        assert store.merge(pieces[5:], progress=progress).skipped == len(pieces) - 5  # a retry: nothing twice
        assert store.query() == duck.query()
        for kwargs in (
            {"metric": "p", "granularity": "hour"},
            {"entity": "alpha/a"},
            {"start": "2026-11-21T10:05:00Z", "end": "2026-11-21T11:07:00+00:00"},
        ):
            assert store.query(**kwargs) == duck.query(**kwargs)
        assert store.query_topn("slow") == duck.query_topn("slow")
        assert store.query_topn("slow", entity="beta", start=T0) == duck.query_topn("slow", entity="beta", start=T0)
        with pytest.raises(StoreError, match="unknown granularity"):
            store.query(granularity="week")
    duck.close()


SCRIPT = ROOT / "scripts" / "postgres.sh"


def _pg_script(action: str) -> None:
    subprocess.run([str(SCRIPT), action], check=True, capture_output=True, timeout=120)


def _script_runs_the_server() -> bool:
    """True when the test server is the one scripts/postgres.sh manages (so the test may stop and start it)."""
    try:
        return subprocess.run([str(SCRIPT), "status"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def test_lost_connection_is_store_unavailable_then_reconnects(pg_url: str) -> None:
    import psycopg

    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        ingest(store, EVENTS.slice(0, 500), "a")
        # kill our session from another connection: the next call fails as "unavailable", the one after reconnects
        pid = store.backend.connection.info.backend_pid  # type: ignore[attr-defined]
        with psycopg.connect(os.environ["DRAINPIPE_TEST_PG"], autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        with pytest.raises(StoreUnavailable):
            ingest(store, EVENTS.slice(500, 500), "b")
        assert ingest(store, EVENTS.slice(500, 500), "b").applied == 17
        assert store.reconnects == 1  # type: ignore[attr-defined]


@pytest.mark.exclusive  # stops the PostgreSQL every test shares
def test_server_restart_mid_run_loses_nothing(pg_url: str) -> None:
    """The engine writes to PostgreSQL; the server stops (fast) mid-run and starts again ~1.5 s later. Writes fail
    with StoreUnavailable, are retried with backoff while BLOCKING back-pressure holds the data, and the final
    values equal an uninterrupted run (into DuckDB: the same semantics)."""
    if not _script_runs_the_server():
        pytest.skip("the test server is not scripts/postgres.sh's: cannot stop and start it")
    batches = list(
        generate_events(240_000, services=12, endpoints_per_service=4, duration_s=600, seed=11, batch_rows=4000)
    )
    opts = EngineOptions(l1_flush_s=0.05, l2_flush_s=0.1, rebalance_interval_ms=50, store_retry_s=(0.05, 0.4))

    timers: list[threading.Timer] = []

    def run(store: Store, outage: bool) -> LocalEngine:
        engine = LocalEngine(DEFAULT_DEFINITIONS, store, opts, name=f"pg-restart-{outage}")
        stopped = threading.Event()
        for i, batch in enumerate(batches):
            if outage and i == len(batches) // 3:
                _pg_script("stop")
                stopped.set()
                timer = threading.Timer(1.5, _pg_script, args=("start",))
                timers.append(timer)
                timer.start()
            engine.ingest(batch)
            if outage and stopped.is_set():
                time.sleep(0.03)  # spread the rest of the input over the outage and the recovery
        engine.close()
        return engine

    try:
        with open_store(pg_url) as pg:  # type: ignore[attr-defined]
            engine = run(pg, outage=True)
            assert engine.counters.store_retries > 0, "the outage was not noticed: no write failed"
            assert engine.counters.store_errors == 0
            assert pg.reconnects >= 1  # type: ignore[attr-defined]
            got, got_topn = pg.query(), pg.query_topn("top_slow_statements")
    finally:
        for timer in timers:
            timer.join()
        if not _script_runs_the_server():
            _pg_script("start")
    duck = open_store("duckdb:///:memory:")
    run(duck, outage=False)
    assert same_values(got, duck.query())
    assert got_topn == duck.query_topn("top_slow_statements")
    total = sum(r[5] for r in got if r[0] == "service_cpm" and r[2] == "minute")
    assert total == sum(b.num_rows for b in batches)
    duck.close()


def test_serve_into_postgres_counts_every_accepted_event(pg_url: str) -> None:
    """HTTP ingest into a live engine writing to PostgreSQL: after a graceful shutdown the store holds exactly the
    events the server answered as accepted."""
    import json
    import urllib.request

    from drainpipe.pipeline.definitions import default_definitions
    from drainpipe.server.http import IngestServer
    from drainpipe.server.service import IngestService, serve_engine_options

    service = IngestService(
        default_definitions(),
        open_store(pg_url),
        store_url="pg",
        engine_options=serve_engine_options(l2_flush_s=0.2),
        name="pg-serve",
    )
    server = IngestServer(service, "127.0.0.1", 0).start()
    accepted = 0
    try:
        for _i, batch in enumerate(generate_events(12_000, services=5, seed=5, batch_rows=2000)):
            body = json.dumps(batch.to_pylist()).encode()
            req = urllib.request.Request(
                server.url + "/v1/events", data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=30) as r:
                accepted += json.loads(r.read())["accepted"]
    finally:
        summary = server.shutdown_all()
    assert accepted == 12_000 and summary["dropped"] == 0 and summary["store_errors"] == 0
    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        assert sum(r[5] for r in store.query(metric="service_cpm", granularity="minute")) == accepted
        # a server store can lose a COMMIT's acknowledgement: the log position committed with the states (the
        # books) makes a retry a no-op
        assert store.progress("log")


@pytest.mark.exclusive  # stops the PostgreSQL every test shares
def test_serve_rides_out_a_postgres_outage_in_the_log_then_catches_up_exactly(pg_url: str, tmp_path) -> None:
    """End to end over HTTP: clients keep posting while PostgreSQL is stopped and started again. While it is down
    the server keeps accepting into its write-ahead log, on disk, far beyond what the old in-memory cap (128 merged
    flushes) allowed, while the engine holds no more than two checkpoints of states; at the log's byte budget it
    answers 503 + Retry-After. After the restart it catches up, the log's segments are released, and the store
    holds exactly the events the server answered as accepted. Not vacuous: refusals were seen, and events were
    accepted before, during and after the outage."""
    import json
    import urllib.error
    import urllib.request

    from drainpipe.pipeline.definitions import default_definitions
    from drainpipe.server.http import IngestServer
    from drainpipe.server.service import IngestService, ServiceOptions, serve_engine_options
    from drainpipe.server.wal import WriteAheadLog

    if not _script_runs_the_server():
        pytest.skip("the test server is not scripts/postgres.sh's: cannot stop and start it")
    budget = 16 << 20  # the engine's lag may use half (admission), the rest is for the outage
    wal = WriteAheadLog(tmp_path / "wal", max_bytes=budget, segment_bytes=512 << 10)
    service = IngestService(
        default_definitions(),
        open_store(pg_url),
        log=wal,
        store_url="pg",
        name="pg-outage",
        options=ServiceOptions(admit_wait_s=0.1, sample_interval_s=0.25, top_refresh_s=0.5, checkpoint_s=0.2),
        engine_options=serve_engine_options(l1_flush_s=0.1, l2_flush_s=0.2, store_retry_s=(0.05, 0.3)),
    )
    server = IngestServer(service, "127.0.0.1", 0).start()
    n_defs = len(default_definitions().metrics) + len(default_definitions().topns)

    phase = ["before"]  # the phase a request *started* in
    accepted = {"before": 0, "outage": 0, "after": 0}
    refused: dict[int, int] = {}
    problems: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    max_backlog = [0]
    batches = [
        b.to_pylist()
        for b in generate_events(
            400 * 64, services=6, seed=21, batch_rows=400, start_ms=int(time.time() * 1000) - 60_000, duration_s=60
        )
    ]

    def client(k: int) -> None:
        i = k
        while not stop.is_set():
            records = batches[i % len(batches)]
            i += 3
            started_in = phase[0]
            req = urllib.request.Request(
                server.url + "/v1/events",
                data=json.dumps(records).encode(),
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    n = json.loads(r.read())["accepted"]
                with lock:
                    accepted[started_in] += n
            except urllib.error.HTTPError as exc:
                body = exc.read()
                with lock:
                    refused[exc.code] = refused.get(exc.code, 0) + 1
                    if exc.code not in (429, 503) or not exc.headers.get("Retry-After"):
                        problems.append(f"{exc.code} {exc.headers.get('Retry-After')!r} {body[:200]!r}")
                    if exc.code == 503:
                        reasons.add(json.loads(body)["error"].split(" (")[0])
                stop.wait(0.02)  # a client's backoff; the test never waits on it

    def until(what: str, predicate, timeout: float = 60.0) -> None:
        """Wait for ``predicate``, watching the persist backlog and the clients' problems meanwhile."""

        def watched() -> bool:
            max_backlog[0] = max(max_backlog[0], service.engine.persist.stats().total_used())
            assert not problems, problems
            return predicate()

        wait_until(watched, timeout, interval=0.01, what=what)

    reasons: set[str] = set()
    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(3)]
    pg_stopped = False
    try:
        for t in threads:
            t.start()
        until(
            "events accepted and persisted before the outage",
            lambda: accepted["before"] >= 8_000 and service.engine.counters.persisted_batches > 0,
        )
        phase[0] = "outage"
        _pg_script("stop")
        pg_stopped = True
        until("503 once the log is at its budget", lambda: refused.get(503, 0) >= 3)
        assert reasons == {"write-ahead log full"}, reasons
        until("the engine to notice the outage", lambda: not service.store.available)
        log_at_budget = wal.size
        backlog_during_outage = service.engine.persist.stats().total_used()
        phase[0] = "after"
        _pg_script("start")
        pg_stopped = False
        until("events accepted after the restart", lambda: accepted["after"] >= 8_000, timeout=90)
        stop.set()
        for t in threads:
            t.join(60)
        until("the store to catch up", lambda: service.feeder.committed == wal.end, timeout=90)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        if pg_stopped or not _script_runs_the_server():
            _pg_script("start")
        summary = server.shutdown_all()
    total = sum(accepted.values())
    assert not problems, problems
    assert refused.get(503, 0) > 0 and accepted["before"] > 0 and accepted["after"] > 0, (accepted, refused)
    # the outage was ridden out on disk: tens of thousands of events (the old cap refused after 128 flushes, a
    # few thousand events at this rate), up to the budget
    assert accepted["outage"] >= 20_000 and log_at_budget >= budget - (256 << 10), (accepted, log_at_budget)
    # and not in memory, whatever the outage's length: the feeder stops at two outstanding checkpoints, the second
    # at most STRETCH checkpoint intervals after the first (one L2 flush per definition each: with checkpoints L2
    # flushes only when one asks), and the stages hand on at most three flushes per definition around each one
    from drainpipe.pipeline.driver import STRETCH

    bound = (STRETCH + 3) * n_defs
    assert backlog_during_outage <= bound and max_backlog[0] <= bound, (max_backlog, bound)
    assert summary["accepted"] == total and summary["dropped"] == 0 and summary["store_errors"] == 0, summary
    assert summary["store_retries"] > 0 and summary["refused_503"] == refused.get(503, 0)
    assert summary["in_log"] == 0 and len(list((tmp_path / "wal").glob("*.wal"))) == 1  # segments released
    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        assert sum(r[5] for r in store.query(metric="service_cpm", granularity="minute")) == total


def test_a_long_merge_never_scans_a_stored_table(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Spark job's whole output is one merge_chunks transaction, whose rows autovacuum cannot see, and the stored
    tables grow in it. Each write batch must reach the stored rows of its keys by index: planned as if the tables
    were small (a staging table emptied by DELETE looked 20x its size), a merge hashed the keys and scanned a whole
    table per batch, which is quadratic. Counted by the server for this transaction (pg_stat_xact_user_tables)."""
    import drainpipe.pipeline.store.merge as merge_module

    monkeypatch.setattr(merge_module, "WRITE_ROWS", 30_000)
    definitions = DEFAULT_DEFINITIONS
    topn = definitions.topns[0]
    tables = ("metric_state", "metric_values")  # (top-N rows are few: a scan of them may be the better plan)
    counts: list[dict[str, tuple[int, int]]] = []

    def statements(first: int, n: int) -> list:
        events = event_batch([(T0 + (j % 2) * 60_000, f"s{j % 40}", "", "/", float(j % 900), True, f"select {j % 25}")
                              for j in range(first, first + n)])  # fmt: skip
        return [p for p in aggregate_batch(events, definitions) if p.name == topn.name]

    with open_store(pg_url) as store:

        def chunks():
            for k in range(10):
                yield from metric_chunks(k * 3_000, 3_000, 2, definitions)
                yield from statements(k * 3_000, 3_000)
                if k in (0, 9):  # inside the transaction: after the first chunks (none written), after nine batches
                    rows = store.backend.fetchall(  # type: ignore[attr-defined]
                        "SELECT relname, seq_scan, n_tup_ins + n_tup_upd FROM pg_stat_xact_user_tables "
                        "WHERE relname = ANY(?) AND schemaname = current_schema()", (list(tables),))  # fmt: skip
                    counts.append({r[0]: (r[1], r[2]) for r in rows})

        store.merge_chunks(definitions.all, chunks())
        assert len(store.query(metric="endpoint_cpm", granularity="minute")) == 30_000
        assert len(store.query_topn(topn.name)) > 0
    before, after = counts
    for table in tables:  # (the counts are the session's not yet reported: the store's opening may be in them)
        assert after[table][0] == before[table][0] and after[table][1] > before[table][1], counts


def test_a_nul_character_in_a_name_or_statement_is_stored_as_a_replacement_character(pg_url: str) -> None:
    """The input accepts a NUL in a service, endpoint or statement; PostgreSQL's text holds none and COPY would refuse
    the row for good (every later write of the store with it). It is stored as U+FFFD, and the store writes on."""
    rows = [
        {"ts": T0 + 1_000, "service": "a\x00b", "instance": None, "endpoint": "/x\x00", "latency_ms": 5.0},
        {"ts": T0 + 2_000, "service": "c", "instance": None, "endpoint": "", "latency_ms": 900.0,
         "db_statement": "SELECT \x00"},
    ]  # fmt: skip
    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        ingest(store, event_batch(rows), "nul")
        ingest(store, event_batch([{**rows[0], "ts": T0 + 3_000, "service": "d"}]), "after")  # the store writes on
        services = {row[1] for row in store.query()}
        assert {"a\ufffdb", "c", "d"} <= services and not any("\x00" in s for s in services)
        statements = [row for row in store.query_topn("top_slow_statements") if "SELECT" in str(row)]
        assert statements and all("\x00" not in str(row) and "\ufffd" in str(row) for row in statements)


def test_an_entity_longer_than_an_index_entry_is_stored_by_its_start_and_a_digest(pg_url: str) -> None:
    """PostgreSQL's unique indexes hold 2,704 bytes an entry; a raw endpoint of 3,000 characters made every write
    fail at every retry (reported as unavailable: the writer stalled for good). An entity past 1,024 bytes is
    stored as its start and a digest of the whole: two such entities that differ only at the end stay apart."""
    import random
    import string

    from drainpipe.pipeline.store.postgres_store import ENTITY_BYTES, bounded_entity

    rng = random.Random(1)
    start = "/" + "".join(rng.choice(string.ascii_letters) for _ in range(3000))
    first, second = start + "/a", start + "/b"
    rows = [{"ts": T0 + i, "service": "svc", "endpoint": e, "latency_ms": 5.0} for i, e in enumerate((first, second))]
    with open_store(pg_url) as store:  # type: ignore[attr-defined]
        ingest(store, event_batch(rows), "long")
        ingest(store, event_batch([{**rows[0], "endpoint": "/short"}]), "after")  # the store writes on
        entities = {row[1] for row in store.query() if row[1].startswith("svc//")}
    assert entities == {bounded_entity("svc/" + first), bounded_entity("svc/" + second), "svc//short"}
    assert all(len(e.encode()) <= ENTITY_BYTES for e in entities)
