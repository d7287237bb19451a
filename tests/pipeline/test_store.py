"""Stores: URLs, transactional upsert-merge made exactly once by the books (progress rows), rollups, queries."""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from drainpipe.errors import StoreError
from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS, Definitions, MetricDef, TopNDef
from drainpipe.pipeline.partials import rollup, split_partial
from drainpipe.pipeline.store import DuckDBStore, MergeReport, SourceProgress, Store, open_store
from drainpipe.pipeline.times import parse_time
from testlib import T0, ingest, metric_chunks, same_values, store_events

DAY = 86_400_000

generated = store_events


EVENTS = generated(3000, seed=3)


@pytest.fixture(params=["duckdb", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """Each store backend in turn: the semantics are the same (PostgreSQL in a fresh schema of the test server)."""
    url = "duckdb:///:memory:" if request.param == "duckdb" else request.getfixturevalue("pg_url")
    s = open_store(url)
    yield s
    s.close()


@pytest.fixture(scope="module")
def loaded() -> Iterator[Store]:
    """A store holding EVENTS, ingested in two halves; tests must not write to it."""
    s = open_store("duckdb:///:memory:")
    ingest(s, EVENTS.slice(0, 1700), "a")
    ingest(s, EVENTS.slice(1700), "b")
    yield s
    s.close()


# ------------------------------------------------------------------------------------------ URLs


def test_open_store_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    default = open_store()
    assert isinstance(default, DuckDBStore) and isinstance(default, Store)
    default.close()
    assert (tmp_path / "drainpipe.duckdb").exists()
    (tmp_path / "sub").mkdir()
    open_store("duckdb:///sub/rel.duckdb").close()
    assert (tmp_path / "sub" / "rel.duckdb").exists()
    absolute = tmp_path / "abs.duckdb"
    open_store(f"duckdb:///{absolute}").close()  # duckdb:////tmp/... is an absolute path
    assert absolute.exists()
    with open_store("duckdb:///opts.duckdb?memory_limit=300MB&threads=1") as tuned:  # DuckDB's own options
        assert isinstance(tuned, DuckDBStore) and tuned.path == "opts.duckdb"
        assert tuned.backend.fetchall("SELECT current_setting('threads')") == [(1,)]
        assert tuned.backend.fetchall("SELECT current_setting('preserve_insertion_order')") == [(False,)]
    with open_store("duckdb:///opts.duckdb?preserve_insertion_order=true") as ordered:  # the URL overrides a default
        assert ordered.backend.fetchall("SELECT current_setting('preserve_insertion_order')") == [(True,)]


def test_a_live_store_url_adds_the_allocator_options_duckdb_takes_and_keeps_those_the_url_sets(
    tmp_path: Path,
) -> None:
    """``live_store_url`` (serve and consume open their store through it): DuckDB takes its options (the store
    opens, the settings read back), an option the URL sets stays the URL's, and other URLs are left as they are."""
    from drainpipe.pipeline import LIVE_DUCKDB_OPTIONS, duckdb_config, live_store_url

    url = live_store_url(f"duckdb:///{tmp_path / 'live.duckdb'}")
    assert duckdb_config(url) == LIVE_DUCKDB_OPTIONS
    with open_store(url) as live:
        assert live.backend.fetchall("SELECT current_setting('allocator_background_threads')") == [(True,)]
    given = live_store_url("duckdb:///x.duckdb?allocator_flush_threshold=1GB&threads=1")
    assert duckdb_config(given) == {"allocator_flush_threshold": "1GB", "threads": "1",
                                    "allocator_background_threads": "true"}  # fmt: skip
    assert live_store_url("postgresql://u@h/db") == "postgresql://u@h/db"


def test_a_live_store_url_leaves_out_an_option_the_installed_duckdb_does_not_know(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DuckDB 1.0 (which the project accepts) has no ``allocator_background_threads``: an option the installed DuckDB
    does not know is left out, so the live commands still open their store (DuckDB refuses an unknown option)."""
    from drainpipe.pipeline.store import duckdb_store

    options = {**duckdb_store.LIVE_DUCKDB_OPTIONS, "no_such_option_of_duckdb": "1"}
    monkeypatch.setattr(duckdb_store, "LIVE_DUCKDB_OPTIONS", options)
    url = duckdb_store.live_store_url(f"duckdb:///{tmp_path / 'old.duckdb'}")
    assert duckdb_store.duckdb_config(url) == {k: v for k, v in options.items() if k.startswith("allocator_")}
    open_store(url).close()


def test_a_merge_out_of_memory_under_the_urls_limit_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DuckDB's out-of-memory inside a merge (the store URL's ``memory_limit`` too small for it) reaches the caller
    as DuckDB says it. The merge's deletes read the staged keys; run as a query over an Arrow relation, such a
    statement could report the failure as "Current transaction is aborted", naming no cause (not every time: the
    relation's path lost the cause in some runs and kept it in others). Which statement runs out first depends on
    the limit (and DuckDB's version), so the limits are tried upwards until a delete over the staged keys is one."""
    from drainpipe.pipeline.store.duckdb_store import DuckDBBackend  # (this module's own unit)

    failed: list[str] = []
    execute = DuckDBBackend.execute

    def recorded(self: DuckDBBackend, sql: str, params: Any = ()) -> None:
        try:
            execute(self, sql, params)
        except Exception:
            failed.append(sql)
            raise

    monkeypatch.setattr(DuckDBBackend, "execute", recorded)
    base = tmp_path / "base.duckdb"
    with open_store(f"duckdb:///{base}") as store:
        store.merge(metric_chunks(0, 20_000, 5))
    for limit_mb in range(8, 66, 2):  # (the window where a delete is the first to run out is a few MB wide)
        failed.clear()
        path = tmp_path / f"s{limit_mb}.duckdb"
        path.write_bytes(base.read_bytes())
        with open_store(f"duckdb:///{path}?memory_limit={limit_mb}MB&threads=1") as store:
            try:
                store.merge(metric_chunks(0, 20_000, 5))  # the same keys again: looked up, deleted, written
            except StoreError as exc:
                assert "Out of Memory Error" in str(exc), (limit_mb, str(exc))
                if any(sql.startswith("DELETE") and "stage_keys" in sql for sql in failed):
                    return
            else:
                break
    pytest.fail(f"no limit made a delete over the staged keys run out of memory (last failed: {failed})")


@pytest.mark.parametrize("option", ["enable_external_access=false", "python_enable_replacements=false"])
def test_a_store_that_cannot_bind_by_name_still_merges_into_stored_keys(tmp_path: Path, option: str) -> None:
    """With either option in the URL DuckDB binds no Python object by name, so the statements over the staged keys
    run as queries over a relation: a merge into keys already stored gives what it gives in a store without it."""
    plain, other = tmp_path / "plain.duckdb", tmp_path / "other.duckdb"
    for url in (f"duckdb:///{plain}", f"duckdb:///{other}?{option}"):
        with open_store(url) as store:
            for _ in range(2):  # the second merge finds every key stored: lookups and deletes over staged keys
                store.merge(metric_chunks(0, 2_000, 3))
    with open_store(f"duckdb:///{plain}") as a, open_store(f"duckdb:///{other}") as b:
        assert a.query() == b.query() != []


def test_is_new_store_only_for_an_embedded_file_not_there_yet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from drainpipe.pipeline.store import is_new_store

    monkeypatch.chdir(tmp_path)
    assert is_new_store(None) and is_new_store("duckdb:///new.duckdb?threads=1") and is_new_store("duckdb:///:memory:")
    open_store("duckdb:///new.duckdb").close()
    assert not is_new_store("duckdb:///new.duckdb") and not is_new_store(f"duckdb:///{tmp_path}/new.duckdb")
    for url in ("postgresql://u:p@127.0.0.1:1/db", "duckdb:///no/such/dir/x.duckdb", "duckdb://host/x", "x.duckdb", ""):
        assert not is_new_store(url), url  # a server, or a URL that opening refuses with its reason


def test_the_dead_letter_beside_a_store_ignores_its_options() -> None:
    from drainpipe.inputs import default_dead_letter

    assert default_dead_letter("duckdb:///data/m.duckdb?memory_limit=1.5GB") == "data/m.rejected.jsonl"
    assert default_dead_letter("duckdb:///data/m.duckdb") == "data/m.rejected.jsonl"
    assert default_dead_letter("duckdb:///:memory:?threads=1") == "drainpipe.rejected.jsonl"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite:///x.db", "unknown store scheme 'sqlite'"),
        ("drainpipe.duckdb", "bad store URL"),
        ("", "bad store URL"),
        ("duckdb://host/x.duckdb", "has no host"),
        ("duckdb:///", "no database file"),
        ("duckdb:///no/such/dir/x.duckdb", "does not exist"),
        ("duckdb:///x.duckdb?no_such_option=1", "not recognized: no_such_option"),
        ("duckdb:///x.duckdb?memory_limit", "options are [?]name=value"),
    ],
)
def test_bad_urls(url: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match=message) as info:
        open_store(url)
    assert "\n" not in str(info.value) and isinstance(info.value, ValueError)


def test_unreachable_postgresql_is_one_line_error_without_the_password() -> None:
    with pytest.raises(StoreError, match="unreachable") as info:
        open_store("postgresql://user:secret@127.0.0.1:1/db")
    assert "\n" not in str(info.value) and "secret" not in str(info.value)


def test_unusable_file(tmp_path: Path) -> None:
    path = tmp_path / "not-a-db.duckdb"
    path.write_bytes(b"this is not a duckdb file" * 100)
    with pytest.raises(StoreError, match="duckdb store"):
        open_store(f"duckdb:///{path}")


# ------------------------------------------------------------------------------------------ upsert semantics


def test_same_input_twice_gives_the_same_values(store: Store) -> None:
    assert ingest(store, EVENTS, "file.jsonl#0") == MergeReport(applied=17, skipped=0)
    first, first_topn = store.query(), store.query_topn("top_slow_statements")
    assert ingest(store, EVENTS, "file.jsonl#0") == MergeReport(applied=0, skipped=17)
    assert store.query() == first and store.query_topn("top_slow_statements") == first_topn
    assert {r.name for r in store.progress("test", part="file.jsonl#0")} == set(DEFAULT_DEFINITIONS.names)
    assert store.progress("test", part="other") == []


def test_a_retry_is_skipped_only_when_every_progress_row_is_recorded(store: Store) -> None:
    """The books decide per call: a merge whose rows are all recorded at or past its positions is a retry of a
    commit and writes nothing; one row further on (the next checkpoint of the part) or of a definition not recorded
    yet, and the call is new input, merged."""
    definitions = Definitions((MetricDef("c", "service", "count"), MetricDef("d", "endpoint", "count")))

    def rows(end: int, names: tuple[str, ...] = ("c", "d")) -> list[SourceProgress]:
        return [SourceProgress("file", "f", name, end) for name in names]

    first = EVENTS.slice(0, 1000)
    assert store.merge(aggregate_batch(first, definitions), progress=rows(1000)).applied == 2
    assert store.merge(aggregate_batch(first, definitions), progress=rows(1000)) == MergeReport(applied=0, skipped=2)
    assert store.merge(aggregate_batch(first, definitions), progress=rows(500)).skipped == 2  # behind: applied
    assert store.merge(aggregate_batch(EVENTS.slice(1000), definitions), progress=rows(3000)).applied == 2
    once = open_store("duckdb:///:memory:")
    once.merge(aggregate_batch(EVENTS, definitions))
    assert store.query() == once.query()
    assert {r.name: r.end for r in store.progress("file", part="f")} == {"c": 3000, "d": 3000}
    # a definition without a row yet: not a retry (-1, the whole of an immutable file, is past every position)
    assert store.merge(aggregate_batch(first, definitions), progress=[*rows(-1, ("c",)), *rows(3000, ("e",))]).applied
    once.close()


def test_a_commit_with_a_stale_fencing_token_writes_nothing(store: Store) -> None:
    """The Kafka members' fence (docs/pipeline.md, "Kafka"): a part's token moves on at every new owner; a merge
    carrying an older one raises Fenced and leaves the store as it was; the current one writes."""
    from drainpipe.errors import Fenced
    from drainpipe.pipeline.retention import Retention
    from drainpipe.pipeline.store import SourceProgress

    now = [T0]
    store.clock = lambda: now[0]  # type: ignore[attr-defined]  # (the record time of progress rows)
    assert store.fence_token("kafka", "c/t/0") == 0
    old = store.fence("kafka", "c/t/0")
    new = store.fence("kafka", "c/t/0")  # a new owner
    assert (old, new, store.fence_token("kafka", "c/t/0"), store.fence_token("kafka", "c/t/1")) == (1, 2, 2, 0)
    row = SourceProgress("kafka", "c/t/0", "service_cpm", 10)
    with pytest.raises(Fenced, match="fenced: token 1, the store's is 2"):
        store.merge(aggregate_batch(EVENTS, DEFAULT_DEFINITIONS), progress=[row],
                    fences=[SourceProgress("kafka", "c/t/0", "fence", old)])  # fmt: skip
    assert store.query() == [] and [r.name for r in store.progress("kafka", part="c/t/0")] == ["#fence"]
    now[0] = T0 + 3 * DAY  # three days after the fences were issued
    store.merge(aggregate_batch(EVENTS, DEFAULT_DEFINITIONS), progress=[row],
                fences=[SourceProgress("kafka", "c/t/0", "fence", new)])  # fmt: skip
    assert store.query() and {r.name: r.end for r in store.progress("kafka", part="c/t/0")}["service_cpm"] == 10
    # a purge of the books keeps the token of a part still written: every merge that carries it records it again
    store.purge(Retention(minute=DAY, hour=DAY, day=DAY, topn=DAY), now_ms=T0 + 3 * DAY + DAY // 2)
    assert store.fence_token("kafka", "c/t/0") == new
    # ... and of a part idle past every retention (a quiet partition is still owned): its owner's next merge is not
    # fenced, and the next owner's token is a new one, never one issued before
    store.purge(Retention(minute=DAY, hour=DAY, day=DAY, topn=DAY), now_ms=T0 + 30 * DAY)
    assert store.progress("kafka", part="c/t/0") and store.fence_token("kafka", "c/t/0") == new
    assert {r.name for r in store.progress("kafka", part="c/t/0")} == {"#fence"}  # the offsets went with the data
    now[0] = T0 + 30 * DAY
    store.merge(aggregate_batch(EVENTS, DEFAULT_DEFINITIONS), progress=[SourceProgress("kafka", "c/t/0", "service_cpm", 20)],
                fences=[SourceProgress("kafka", "c/t/0", "fence", new)])  # fmt: skip
    assert store.fence("kafka", "c/t/0") == new + 1


def test_two_halves_equal_the_whole(tmp_path: Path) -> None:
    whole = open_store("duckdb:///:memory:")
    ingest(whole, EVENTS, "all")
    path = tmp_path / "halves.duckdb"
    with open_store(f"duckdb:///{path}") as halves:  # type: ignore[attr-defined]
        ingest(halves, EVENTS.slice(0, 1234), "first")
    with open_store(f"duckdb:///{path}") as halves:  # a new process later: states were persisted
        ingest(halves, EVENTS.slice(1234), "second")
        ingest(halves, EVENTS.slice(0, 1234), "first")  # re-running a half is a no-op
        assert same_values(halves.query(), whole.query())
        assert halves.query_topn("top_slow_statements") == whole.query_topn("top_slow_statements")
    whole.close()


def test_without_progress_states_are_merged_each_time(store: Store) -> None:
    definitions = Definitions((MetricDef("c", "service", "count"),))
    ingest(store, EVENTS, None, definitions)
    ingest(store, EVENTS, None, definitions)
    once = open_store("duckdb:///:memory:")
    ingest(once, EVENTS, None, definitions)
    assert [r[5] for r in store.query()] == [2 * r[5] for r in once.query()]
    once.close()


def test_apdex_and_sla_of_counts_past_int64_arithmetic_are_exact(store: Store) -> None:
    """Sampled spans weigh up to 2**32 each: 110,000 of them in one key make counts whose apdex arithmetic,
    ``(2 * ok + tol) * 10_000 + n``, passes int64 (numpy wrapped it silently: a negative apdex; PostgreSQL's bigint
    raised). Both backends give the exact values."""
    from drainpipe.inputs.schema import batch_schema
    from testlib import event_batch

    weight = 1 << 32
    latencies = [100.0] * 108_990 + [1000.0] * 1_000 + [5000.0] * 10  # satisfied, tolerating, frustrated
    rows = [{"ts": T0, "service": "big", "latency_ms": lat, "status": i % 1000 != 7, "weight": weight}
            for i, lat in enumerate(latencies)]  # fmt: skip
    batch = event_batch(rows, batch_schema(("weight",)))
    definitions = Definitions(
        (MetricDef("ap", "service", "apdex", threshold_ms=500), MetricDef("sl", "service", "sla"))
    )
    ingest(store, batch, None, definitions)
    values = {r[0]: r[5] for r in store.query() if r[2] == "minute"}
    n = len(latencies) * weight
    good = [i % 1000 != 7 for i in range(len(latencies))]  # a failed request is frustrated whatever its latency
    satisfied = sum(g and lat <= 500 for g, lat in zip(good, latencies)) * weight
    tolerating = sum(g and 500 < lat <= 2000 for g, lat in zip(good, latencies)) * weight
    assert values["ap"] == ((2 * satisfied + tolerating) * 10_000 + n) // (2 * n) / 10_000.0 == 0.9944
    assert values["sl"] == float(100 * sum(good) * weight) / float(n)


def test_pieces_merged_in_several_transactions_equal_the_whole(store: Store) -> None:
    """The local engine cuts partials into chunks (split_partial) that reach the store in different merges; their
    states add up to the whole batch's, and the last merge's progress rows make its retry a no-op."""
    definitions = Definitions(
        (MetricDef("c", "endpoint", "count"), MetricDef("p", "instance", "percentile", precision_ms=10))
    )
    whole = open_store("duckdb:///:memory:")
    ingest(whole, EVENTS, None, definitions)
    pieces = [split_partial(p, 7) for p in aggregate_batch(EVENTS, definitions)]
    assert all(len(group) > 2 for group in pieces)
    store.merge([group[0] for group in pieces])
    last = [q for group in pieces for q in group[1:]]
    progress = [SourceProgress("file", "f", name, 3000) for name in definitions.names]
    assert store.merge(last, progress=progress).applied == len(last)
    assert store.merge(last, progress=progress).skipped == len(last)  # the retry of a commit whose answer was lost
    assert store.query() == whole.query()
    whole.close()


def test_explicit_granularities_without_rollup(store: Store) -> None:
    definitions = Definitions(
        (
            MetricDef("p", "service", "percentile", precision_ms=10),
            MetricDef("a", "instance", "apdex", threshold_ms=300),
        )
    )
    reference = open_store("duckdb:///:memory:")
    ingest(reference, EVENTS, "s", definitions)
    minute = aggregate_batch(EVENTS, definitions)
    with pytest.raises(ValueError, match="hour states given to merge"):
        store.merge([rollup(minute[0], "hour")])
    every = [q for p in minute for q in (p, rollup(p, "hour"), rollup(p, "day"))]
    progress = [SourceProgress("test", "s", name, 1) for name in definitions.names]
    assert store.merge(every, rollup=False, progress=progress) == MergeReport(applied=6, skipped=0)
    assert store.query() == reference.query()
    assert store.merge(every, rollup=False, progress=progress).skipped == 6
    reference.close()


def test_a_failed_merge_leaves_nothing_half_written(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    ingest(store, EVENTS.slice(0, 1000), "one")
    before, before_topn = store.query(), store.query_topn("top_slow_statements")
    calls = {"n": 0}
    backend = store.backend  # type: ignore[attr-defined]
    original_insert = backend.insert_arrow

    def failing_insert(table_name: str, rows: pa.Table) -> None:  # the merge in Python writes values by COPY
        calls["n"] += 1
        if table_name == "metric_values":
            raise RuntimeError("disk on fire")
        original_insert(table_name, rows)

    if backend.merges_in_database:
        # the database's merge at the commit runs in the server: its last write, the top-N rows' (after the states and
        # the values), fails there (a queue's failures are tests/postgres')
        with backend.session("arm a fault"):
            backend.execute("CREATE SEQUENCE fault_calls")
            backend.execute("CREATE FUNCTION disk_on_fire() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                            "PERFORM nextval('fault_calls'); RAISE EXCEPTION 'disk on fire'; END $$")  # fmt: skip
            backend.execute("CREATE TRIGGER disk_on_fire BEFORE INSERT ON topn_values FOR EACH STATEMENT "
                            "EXECUTE FUNCTION disk_on_fire()")  # fmt: skip
        with pytest.raises(StoreError, match="disk on fire"):
            ingest(store, EVENTS.slice(1000), "two")
        with backend.session("disarm the fault"):
            calls["n"] = backend.fetchall("SELECT last_value FROM fault_calls")[0][0]
            backend.execute("DROP TRIGGER disk_on_fire ON topn_values")
        assert calls["n"] == 1  # the top-N rows' write failed, after the states' and the values'
    else:
        monkeypatch.setattr(backend, "insert_arrow", failing_insert)
        with pytest.raises(RuntimeError, match="disk on fire"):
            ingest(store, EVENTS.slice(1000), "two")
        assert calls["n"] > 1  # states had been written when it failed
        monkeypatch.undo()
    assert store.query() == before and store.query_topn("top_slow_statements") == before_topn
    assert store.progress("test", part="two") == []
    assert ingest(store, EVENTS.slice(1000), "two").applied == 17  # and it can be retried


def test_a_name_with_another_definition_is_refused(store: Store) -> None:
    ingest(store, EVENTS, "x", Definitions((MetricDef("m", "service", "count"),)))
    with pytest.raises(StoreError, match="'m' is stored with a different definition"):
        ingest(store, EVENTS, "y", Definitions((MetricDef("m", "service", "cpm"),)))
    assert ingest(store, EVENTS, "y", Definitions((MetricDef("m", "service", "count"),))).applied == 1


# ------------------------------------------------------------------------------------------ rollups vs raw


def _reference(events: pa.RecordBatch, granularity: str) -> dict[tuple[str, str, str, str], float]:
    """Count, avg, sla and p50/p99 per service computed directly from the raw events in plain Python."""
    width = {"minute": 60_000, "hour": 3_600_000, "day": 86_400_000}[granularity]
    groups: dict[tuple[str, int], list[tuple[float, bool]]] = defaultdict(list)
    for row in events.to_pylist():
        groups[(row["service"], row["ts"] - row["ts"] % width)].append((row["latency_ms"], row["status"]))
    out = {}
    for (service, bucket), items in groups.items():
        iso = parse_time(bucket)
        latencies = sorted(math.floor(lat / 10) for lat, _ in items)
        n = len(items)
        out[("service_cpm", service, iso, "")] = n / (width // 60_000)
        out[("service_resp_time", service, iso, "")] = sum(lat for lat, _ in items) / n
        out[("service_sla", service, iso, "")] = 100 * sum(ok for _, ok in items) / n
        for p in (50, 99):
            out[("service_percentile", service, iso, f"p{p}")] = 10.0 * latencies[math.ceil(p * n / 100) - 1]
    return out


@pytest.mark.parametrize("granularity", ["minute", "hour", "day"])
def test_stored_rollups_equal_computing_from_raw(loaded: Store, granularity: str) -> None:
    stored = {
        (r[0], r[1], r[3], r[4]): r[5]
        for r in loaded.query(granularity=granularity)
        if r[0] in ("service_cpm", "service_resp_time", "service_sla", "service_percentile")
        and r[4] in ("", "p50", "p99")
    }
    expected = _reference(EVENTS, granularity)
    assert stored.keys() == expected.keys()
    for key, value in expected.items():
        assert math.isclose(stored[key], value, rel_tol=1e-12), key


def test_writes_in_time_order_that_touch_at_an_edge_merge_like_one(store: Store) -> None:
    """Writes of successive time ranges: the store looks keys up only when it holds rows in the new range (DuckDB
    probes the range first). Each slice starts in the minute the previous one ended in (a shared minute key), and
    the top-N's 10-minute keys and the hour and day keys are shared too; the result equals one write of all."""
    ts = EVENTS.column("ts").to_numpy()
    ordered = EVENTS.take(pa.array(ts.argsort(kind="stable")))
    edges = [0, 700, 1500, 2300, ordered.num_rows]
    for i, (a, b) in enumerate(zip(edges, edges[1:])):
        ingest(store, ordered.slice(a, b - a), f"slice-{i}")
    whole = open_store("duckdb:///:memory:")
    ingest(whole, ordered, "all")
    assert same_values(store.query(), whole.query())
    assert store.query_topn("top_slow_statements") == whole.query_topn("top_slow_statements")
    whole.close()


def test_a_write_whose_range_only_touches_the_stored_range_merges_the_shared_key(store: Store) -> None:
    """Minute states alone (rollup=False), so the stored rows and a new write share nothing but the edge minute: the
    new range begins (then ends) exactly at a stored bucket, and that key is merged, not stored twice."""
    n = EVENTS.num_rows
    ts = T0 - 4 * 60_000 + np.arange(n) * (14 * 60_000 // n)  # minutes -4 .. 9 of T0, ~200 events each
    events = EVENTS.set_column(0, "ts", pa.array(ts, pa.int64()))
    minute = (ts - T0) // 60_000

    def rows(lo: int, hi: int) -> pa.RecordBatch:
        return events.filter(pa.array((minute >= lo) & (minute <= hi)))

    def write(target: Store, events: pa.RecordBatch) -> None:
        target.merge(aggregate_batch(events, DEFAULT_DEFINITIONS), rollup=False)

    middle, later, earlier = rows(0, 5), rows(5, 9), rows(-4, 0)
    for events in (middle, later, earlier):  # later starts at middle's end, earlier ends at its start
        write(store, events)
    whole = open_store("duckdb:///:memory:")
    write(whole, pa.Table.from_batches([middle, later, earlier]).combine_chunks().to_batches()[0])
    assert same_values(store.query(), whole.query())
    assert {r[3] for r in store.query(granularity="minute")} >= {"2026-11-21T10:00:00Z", "2026-11-21T10:05:00Z"}
    whole.close()


# ------------------------------------------------------------------------------------------ queries


def test_query_filters_and_order(loaded: Store) -> None:
    store = loaded
    rows = store.query()
    assert rows == sorted(rows, key=lambda r: r[:5])
    assert {r[2] for r in rows} == {"minute", "hour", "day"}
    hour = store.query(metric="service_percentile", entity="alpha", granularity="hour")
    assert hour and all(r[0] == "service_percentile" and r[1] == "alpha" and r[2] == "hour" for r in hour)
    assert [r[4] for r in hour[:5]] == ["p50", "p75", "p90", "p95", "p99"]
    minutes = store.query(metric="service_cpm", granularity="minute")
    window = store.query(
        metric="service_cpm", granularity="minute", start="2026-11-21T10:05:00Z", end="2026-11-21T11:07:00+00:00"
    )
    assert window and window == [r for r in minutes if "2026-11-21T10:05:00Z" <= r[3] <= "2026-11-21T11:07:00Z"]
    assert (
        store.query(metric="service_cpm", granularity="minute", start=T0 + 5 * 60_000, end=T0 + 67 * 60_000) == window
    )
    edge = minutes[len(minutes) // 2][3]
    assert {r[3] for r in store.query(metric="service_cpm", start=edge, end=edge)} == {edge}  # both bounds inclusive
    assert store.query(metric="nope") == []
    endpoint = store.query(metric="endpoint_cpm", granularity="day")
    assert {r[1] for r in endpoint} == {f"{s}/{e}" for s in ("alpha", "beta", "gamma") for e in "abc"}


def test_query_errors(store: Store) -> None:
    with pytest.raises(StoreError, match="unknown granularity 'week'"):
        store.query(granularity="week")
    with pytest.raises(StoreError, match="bad time 'yesterday'"):
        store.query(start="yesterday")


def test_query_topn(store: Store) -> None:
    topn = Definitions((), (TopNDef("slow", "service", "db_statement", 3),))
    ingest(store, EVENTS.slice(0, 1500), "a", topn)
    ingest(store, EVENTS.slice(1500), "b", topn)
    rows = store.query_topn("slow")
    assert rows == sorted(rows, key=lambda r: r[:4])
    per_key: dict[tuple[str, str], list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:
        per_key[(row[1], row[2])].append(row)
    assert per_key and all([r[3] for r in ranked] == list(range(1, len(ranked) + 1)) for ranked in per_key.values())
    # the stored top 3 per (service, 10 minutes) are the 3 slowest of all events
    candidates: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
    for e in EVENTS.to_pylist():
        if e["db_statement"]:
            candidates[(e["service"], parse_time(e["ts"] - e["ts"] % 600_000))].append(
                (-e["latency_ms"], e["db_statement"])
            )
    assert per_key.keys() == candidates.keys()
    for key, ranked in per_key.items():
        assert [(-r[5], r[4]) for r in ranked] == sorted(candidates[key])[:3]
    assert store.query_topn("slow", entity="beta", start="2026-11-21T10:00:00Z") == [
        r for r in rows if r[1] == "beta" and r[2] >= "2026-11-21T10:00:00Z"
    ]


def test_closed_store(tmp_path: Path) -> None:
    store = open_store(f"duckdb:///{tmp_path / 'c.duckdb'}")
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.query()


def test_parse_time() -> None:
    assert parse_time("2026-11-21T11:05:00+01:00") == "2026-11-21T10:05:00Z"
    assert parse_time("2026-11-21") == "2026-11-21T00:00:00Z"
    assert parse_time(T0 + 999) == "2026-11-21T10:00:00Z"
    with pytest.raises(StoreError):
        parse_time(True)


def test_relative_path_is_relative_to_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with open_store("duckdb:///./rel.duckdb") as store:  # type: ignore[attr-defined]
        ingest(store, EVENTS.slice(0, 10), "s", Definitions((MetricDef("c", "service", "count"),)))
    assert os.path.exists(tmp_path / "rel.duckdb")


# ------------------------------------------------------------------------------------------ rendering


def test_render_formats() -> None:
    import csv
    import io
    import json

    from drainpipe.pipeline.rendering import render
    from drainpipe.pipeline.values import VALUE_COLUMNS

    rows = [
        ("service_cpm", "svc-00", "minute", "2026-11-21T10:00:00Z", "", 2.0),
        ("service_resp_time", "svc-01", "hour", "2026-11-21T10:00:00Z", "", 311.6333333333333),
        ("service_percentile", "a/b", "day", "2026-11-21T00:00:00Z", "p99", 1234567.5),
    ]
    table = render(rows, VALUE_COLUMNS, "table").splitlines()
    assert table[0].split() == list(VALUE_COLUMNS)
    assert table[2].endswith("        2") and table[3].endswith("311.6333") and table[4].endswith("1234567.5")
    assert len({len(line) for line in table[2:]}) == 1  # aligned
    assert render([], VALUE_COLUMNS).splitlines()[-1] == "(no rows)"
    parsed = list(csv.reader(io.StringIO(render(rows, VALUE_COLUMNS, "csv"))))
    assert parsed[0] == list(VALUE_COLUMNS) and float(parsed[2][5]) == 311.6333333333333 and parsed[1][4] == ""
    assert json.loads(render(rows, VALUE_COLUMNS, "json"))[1] == dict(zip(VALUE_COLUMNS, rows[1]))
    assert json.loads(render([], VALUE_COLUMNS, "json")) == []
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        render(rows, VALUE_COLUMNS, "xml")
