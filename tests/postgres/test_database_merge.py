"""The merge PostgreSQL does itself (``database_merge``) equals the store's merge in Python (DuckDB's): generated
events in generated batches, every merge function, percentiles with ties at bin edges, top-N with equal latencies,
keys that differ by case and by non-ASCII bytes, with and without latency classes."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import Definitions, MetricDef, TopNDef
from drainpipe.pipeline.store import Store, open_store
from drainpipe.pipeline.store.database_merge import QUEUE_TABLES, QUEUED_TOPN, STRIPES
from drainpipe.pipeline.store.schema import TABLES
from testlib import T0, event_batch

pytestmark = pytest.mark.postgres

DEFINITIONS = Definitions(
    (
        MetricDef("c", "service", "count"),
        MetricDef("cpm", "instance", "cpm"),
        MetricDef("s", "endpoint", "sum", field="latency_ms"),
        MetricDef("lo", "service", "min", field="latency_ms"),
        MetricDef("hi", "instance", "max", field="latency_ms"),
        MetricDef("avg", "endpoint", "avg", field="latency_ms"),
        MetricDef("sla", "service", "sla"),
        MetricDef("apdex", "instance", "apdex", threshold_ms=100),
        MetricDef("p", "service", "percentile", precision_ms=10),
        MetricDef("p1", "endpoint", "percentile", precision_ms=1),
        MetricDef("errors", "service", "count", where="status == false"),
    ),
    (
        TopNDef("slow", "service", "db_statement", 3),
        TopNDef("slow_by_class", "service", "db_statement", 2, latency_buckets_ms=(100.0, 500.0)),
    ),
)

_EVENTS = st.lists(
    st.tuples(
        st.integers(0, 3 * 60 + 5),  # minute: across hours (and, from T0, a day)
        st.sampled_from(["alpha", "beta", "Beta"]),
        st.sampled_from(["", "i1", "i2"]),
        st.sampled_from(["/a", "/b", "/é"]),
        st.one_of(st.sampled_from([0.5, 10.0, 99.99, 100.0, 100.01, 500.0, 1234.5]), st.floats(0, 5000)),
        st.booleans(),
        st.sampled_from([None, "select 1", "select 2", "Select 1", "sélect", "update t"]),
    ),
    min_size=1,
    max_size=120,
)


@pytest.fixture
def stores(pg_url: str) -> Iterator[tuple[Store, Store]]:
    pg, duck = open_store(pg_url), open_store("duckdb:///:memory:")
    yield pg, duck
    pg.close()
    duck.close()


def _empty(*stores: Store) -> None:
    for store in stores:
        for table in (*TABLES, *(QUEUE_TABLES if store.backend.merges_in_database else ())):
            store.backend.execute(f"DELETE FROM {table}")  # type: ignore[attr-defined]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_EVENTS, st.lists(st.integers(0, 120), max_size=4), st.booleans())
@example(  # each merge operation meets a stored state in both directions (a smaller and a larger value after)
    [(0, "alpha", "i1", "/a", 50.0, True, "select 1"), (1, "alpha", "i1", "/a", 10.0, False, "select 2"),
     (2, "alpha", "i1", "/a", 500.0, True, "select 1")],
    [1, 2],
    True,
)  # fmt: skip
def test_the_database_merges_as_the_store_merges_in_python(
    stores: tuple[Store, Store], rows: list[tuple], cuts: list[int], minute_and_rollup: bool
) -> None:
    pg, duck = stores
    assert pg.backend.merges_in_database and not duck.backend.merges_in_database  # type: ignore[attr-defined]
    _empty(pg, duck)
    events = event_batch([(T0 + m * 60_000 + i, svc, inst, ep, lat, ok, st) for i, (m, svc, inst, ep, lat, ok, st)
                          in enumerate(rows)])  # fmt: skip
    bounds = sorted({0, len(rows), *(min(c, len(rows)) for c in cuts)})
    for lo, hi in zip(bounds, bounds[1:]):
        partials = aggregate_batch(events.slice(lo, hi - lo), DEFINITIONS)
        if minute_and_rollup:
            for store in (pg, duck):
                store.merge(partials)
        else:  # every granularity given, as a Spark job's output or a migration merges them
            from drainpipe.pipeline.partials import MetricPartial, rollup

            every = [q for p in partials for q in ([p, rollup(p, "hour"), rollup(p, "day")]
                                                   if isinstance(p, MetricPartial) else [p])]  # fmt: skip
            for store in (pg, duck):
                store.merge(every, rollup=False)
    assert pg.query() == duck.query()
    for topn in DEFINITIONS.topns:
        assert pg.query_topn(topn.name) == duck.query_topn(topn.name)


def test_merge_chunks_in_the_database_equals_python(
    stores: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Spark job's chunks: batches of one transaction that share keys (each merges into what the one before
    wrote)."""
    import drainpipe.pipeline.store.merge as merge_module

    pg, duck = stores
    rows = [(T0 + (i % 7) * 60_000, ["a", "b"][i % 2], "", f"/e{i % 5}", float(i % 13) * 7.5, i % 4 != 0,
             ["select 1", None, "x"][i % 3]) for i in range(600)]  # fmt: skip
    chunks = [p for k in range(0, 600, 100) for p in aggregate_batch(event_batch(rows[k : k + 100]), DEFINITIONS)]
    monkeypatch.setattr(merge_module, "WRITE_ROWS", 50)  # several batches in the one transaction
    for store in (pg, duck):
        store.merge_chunks(DEFINITIONS.all, iter(chunks))
    assert pg.query() == duck.query() and len(pg.query()) > 100
    assert pg.query_topn("slow") == duck.query_topn("slow")


def test_the_state_key_is_unique_and_the_staged_tables_are_the_sessions(stores: tuple[Store, Store]) -> None:
    pg, _ = stores
    con = pg.backend  # type: ignore[attr-defined]
    indexes = {r[0]: r[1] for r in con.fetchall("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = ? AND schemaname = current_schema()",
                                                 ("metric_state",))}  # fmt: skip
    assert "UNIQUE" in indexes["metric_state_unique"] and "metric_state_key" not in indexes
    temporary = {r[0] for r in con.fetchall("SELECT relname FROM pg_class WHERE relnamespace = pg_my_temp_schema()")}
    assert {"stage_state", "stage_topn", "stage_defs", "stage_keys"} <= temporary


def test_a_store_written_with_a_row_per_bin_is_packed_when_opened(stores: tuple[Store, Store], pg_url: str) -> None:
    """A store of the previous release kept a row per percentile bin and a non-unique index on the values' key: the
    next open packs the bins (a row per key), indexes the values' key uniquely, and merges go on from there."""
    pg, duck = stores
    _empty(pg, duck)
    rows = [(T0 + (i % 5) * 60_000, ["a", "b"][i % 2], "", f"/e{i % 3}", float(i % 37) * 3.5, i % 4 != 0, None)
            for i in range(400)]  # fmt: skip
    first, second = (
        aggregate_batch(event_batch(rows[:200]), DEFINITIONS),
        aggregate_batch(event_batch(rows[200:]), DEFINITIONS),
    )
    for store in (pg, duck):
        store.merge(first)
    con = pg.backend  # type: ignore[attr-defined]
    for statement in (  # the previous release's layout
        "ALTER TABLE metric_state DROP CONSTRAINT IF EXISTS metric_state_packed",
        "INSERT INTO metric_state (metric, entity, granularity, time_bucket, b, n) SELECT metric, entity, granularity,"
        " time_bucket, u.b, u.c FROM metric_state, unnest(bins, counts) AS u (b, c) WHERE bins IS NOT NULL",
        "DELETE FROM metric_state WHERE bins IS NOT NULL",
        "ALTER TABLE metric_state DROP COLUMN bins, DROP COLUMN counts",
        "DROP INDEX metric_values_unique",
        "CREATE INDEX metric_values_key ON metric_values (metric, granularity, entity, time_bucket)",
    ):
        con.execute(statement)
    assert con.fetchall("SELECT count(*) FROM metric_state WHERE b >= 0")[0][0] > 100
    pg.close()
    with open_store(pg_url) as reopened:
        con = reopened.backend  # type: ignore[attr-defined]
        assert con.fetchall("SELECT count(*) FROM metric_state WHERE b >= 0")[0][0] == 0
        assert reopened.query() == duck.query()
        reopened.merge(second)
        duck.merge(second)
        assert reopened.query() == duck.query()
        indexes = {r[0] for r in con.fetchall("SELECT indexname FROM pg_indexes WHERE tablename = 'metric_values'"
                                              " AND schemaname = current_schema()")}  # fmt: skip
        assert indexes == {"metric_values_unique"}
        # a writer of the previous release, which would write a row per bin again, is refused with nothing written
        with pytest.raises(Exception, match="metric_state_packed"), reopened.backend.session("x"):  # type: ignore[attr-defined]
            con.execute("INSERT INTO metric_state (metric, entity, granularity, time_bucket, b, n) "
                        "SELECT metric, entity, granularity, time_bucket, 3, 1 FROM metric_state LIMIT 1")  # fmt: skip
        assert reopened.query() == duck.query()


def _close_enough(a: list[tuple], b: list[tuple]) -> bool:
    """Equal value rows, float sums (``s``, ``avg``) up to the last ulps: the fold adds a key's queued states
    together before it adds them to the stored one, another order of the same additions."""
    return len(a) == len(b) and all(
        x[:5] == y[:5] and (x[5] == y[5] or (x[0] in ("s", "avg") and math.isclose(x[5], y[5], rel_tol=1e-9)))
        for x, y in zip(a, b)
    )


@pytest.fixture
def writers(pg_url: str) -> Iterator[tuple[list[Store], Store]]:
    """Three writers of one PostgreSQL store and a DuckDB store to hold them to; a statement counter on the states'
    upserts (a sequence: not rolled back)."""
    pgs = [open_store(pg_url) for _ in range(3)]
    con = pgs[0].backend  # type: ignore[attr-defined]
    with con.session("x"):
        con.execute("CREATE SEQUENCE upserts")
        con.execute("CREATE FUNCTION count_upsert() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN PERFORM nextval('upserts'); RETURN NULL; END $$")  # fmt: skip
        con.execute("CREATE TRIGGER count_upsert BEFORE INSERT ON metric_state FOR EACH STATEMENT "
                    "EXECUTE FUNCTION count_upsert()")  # fmt: skip
    duck = open_store("duckdb:///:memory:")
    yield pgs, duck
    for store in (*pgs, duck):
        store.close()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_EVENTS.filter(lambda rows: len(rows) >= 2), st.lists(st.floats(0, 1), min_size=1, max_size=2))
@example(  # both writers bring states of the same minute, hour and day keys
    [(0, "alpha", "i1", "/a", 50.0, True, "select 1"), (0, "alpha", "i1", "/a", 10.0, False, "select 2"),
     (1, "alpha", "i1", "/a", 500.0, True, "select 1")],
    [0.5],
)  # fmt: skip
def test_one_fold_merges_every_writers_queued_states(
    writers: tuple[list[Store], Store], rows: list[tuple], fractions: list[float]
) -> None:
    """Writers that commit while another merge holds the merge locks queue their states and return without waiting
    for it; the holder's look at the queue after its commit merges all of them, a key's states added up first (one
    upsert statement per kind of state for every writer), and the values equal the states merged one after the
    other in Python."""
    pgs, duck = writers
    _empty(*pgs, duck)
    events = event_batch([(T0 + m * 60_000 + i, svc, inst, ep, lat, ok, st) for i, (m, svc, inst, ep, lat, ok, st)
                          in enumerate(rows)])  # fmt: skip
    bounds = sorted({0, len(rows), *(min(max(1, int(f * len(rows))), len(rows) - 1) for f in fractions)})
    slices = [aggregate_batch(events.slice(lo, hi - lo), DEFINITIONS) for lo, hi in zip(bounds, bounds[1:])]
    for partials in slices:
        duck.merge(partials)
    holder = pgs[0].backend  # type: ignore[attr-defined]
    with holder.session("hold"):
        before = holder.fetchall("SELECT last_value, is_called FROM upserts")[0]
        done: list[BaseException | None] = []
        with holder.transaction():
            holder.lock_merges(None)  # as a long merge would

            def write(store: Store, partials: list) -> None:
                try:
                    store.merge(partials)
                    done.append(None)
                except BaseException as exc:  # reported below
                    done.append(exc)

            threads = [threading.Thread(target=write, args=(pgs[1 + i % 2], p)) for i, p in enumerate(slices[:2])]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 10
            while holder.fetchall("SELECT count(DISTINCT xmin::text) FROM merge_queue")[0][0] < len(threads):
                assert time.monotonic() < deadline, "the writers never queued"
                time.sleep(0.01)
            stripe = f"hashtext(entity) & {STRIPES - 1}"
            folds = holder.fetchall(  # the stripes' upsert statements, if each stripe is folded once
                f"SELECT count(DISTINCT {stripe}) FILTER (WHERE bins IS NULL AND granularity <> '{QUEUED_TOPN}')"
                f" + count(DISTINCT {stripe}) FILTER (WHERE bins IS NOT NULL) FROM merge_queue"
            )[0][0]
            for t in threads:  # (the writers do not wait for the held lock: its holder folds what they queued)
                t.join(10)
            assert done == [None] * len(threads)
        pgs[0].query()  # the holder's look at the queue after its commit
        after = holder.fetchall("SELECT last_value, is_called FROM upserts")[0]
    for partials in slices[2:]:
        pgs[0].merge(partials)
    upserts = (after[0] if after[1] else 0) - (before[0] if before[1] else 0)
    assert upserts == folds  # one fold per stripe: scalar states and histograms, once for both writers
    assert holder.fetchall("SELECT count(*) FROM merge_queue")[0][0] == 0
    assert _close_enough(pgs[0].query(), duck.query())
    for topn in DEFINITIONS.topns:
        assert pgs[0].query_topn(topn.name) == duck.query_topn(topn.name)
