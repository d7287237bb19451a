"""time_bucket is a real timestamp column (TIMESTAMP WITH TIME ZONE) on DuckDB and PostgreSQL: SQL range queries
work on it natively, the store's API still speaks ISO-8601 text, and a store written when the column was ISO text is
migrated on open, once, with its states still merging."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pyarrow as pa
import pytest

from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.store import SqlStore, open_store
from drainpipe.pipeline.store.schema import column_types as column_types_of
from testlib import MIDNIGHT as T0
from testlib import event_batch

TIME_TABLES = ("metric_state", "metric_values", "topn_values")


@pytest.fixture(params=["duckdb", "postgresql"])
def url(request, tmp_path) -> Iterator[str]:
    if request.param == "duckdb":
        yield f"duckdb:///{tmp_path / 'time.duckdb'}"
    else:
        yield request.getfixturevalue("pg_url")


def traffic(minutes: int = 5) -> pa.RecordBatch:
    return event_batch({"ts": T0 + m * 60_000 + 5_000, "instance": "i", "endpoint": "/e", "latency_ms": 10.0 * m,
                        "db_statement": "select 1"} for m in range(minutes))  # fmt: skip


def merge(store) -> None:
    store.merge(aggregate_batch(traffic(), default_definitions()))


def column_types(store: SqlStore) -> set[str]:
    types = column_types_of(store.backend)
    return {types.get((t, "time_bucket"), "") for t in TIME_TABLES}


def test_time_bucket_is_a_timestamp_and_the_api_still_speaks_iso(url: str) -> None:
    with open_store(url) as store:
        merge(store)
        assert column_types(store) == {"TIMESTAMP WITH TIME ZONE"}
        # native range queries: a timestamp literal with an offset, and interval arithmetic
        (n,) = store.backend.fetchall(
            "SELECT count(*) FROM metric_values WHERE metric = 'service_cpm' AND granularity = 'minute' "
            "AND time_bucket >= CAST('2026-09-22 02:02:00+02' AS TIMESTAMPTZ) - INTERVAL '1 minute'"
        )[0]
        assert n == 4  # 00:01 .. 00:04 UTC
        # what Grafana's $__timeFilter(time_bucket) expands to for the PostgreSQL data source
        (n,) = store.backend.fetchall(
            "SELECT count(*) FROM metric_values WHERE metric = 'service_cpm' AND granularity = 'minute' "
            "AND time_bucket BETWEEN '2026-09-22T00:01:00Z' AND '2026-09-22T00:03:00Z'"
        )[0]
        assert n == 3
        rows = store.query("service_cpm", granularity="minute", start="2026-09-22T00:03:00Z")
        assert [r[3] for r in rows] == ["2026-09-22T00:03:00Z", "2026-09-22T00:04:00Z"]
        assert store.query("service_cpm", granularity="hour")[0][3] == "2026-09-22T00:00:00Z"
        assert store.query_topn("top_slow_statements")[0][2] == "2026-09-22T00:00:00Z"
        assert store.query("service_cpm", granularity="minute", end=T0 + 60_000)[-1][3] == "2026-09-22T00:01:00Z"


def downgrade(store: SqlStore) -> None:
    """Turn time_bucket back into the earlier version's ISO text, as that version wrote it."""
    pg = type(store).__name__ == "PostgresStore"
    iso = (
        "to_char(time_bucket AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"
        if pg
        else "strftime(CAST(time_bucket AS TIMESTAMP), '%Y-%m-%dT%H:%M:%SZ')"
    )
    for table in TIME_TABLES:
        store.backend.execute(f"ALTER TABLE {table} ALTER COLUMN time_bucket TYPE VARCHAR USING {iso}")


def test_a_store_with_text_buckets_is_migrated_once_on_open(url: str, caplog) -> None:
    with open_store(url) as store:
        merge(store)
        before = store.query(), store.query_topn("top_slow_statements")
        downgrade(store)
        assert column_types(store) == {"CHARACTER VARYING" if "postgres" in url else "VARCHAR"}
        assert store.backend.fetchall("SELECT min(time_bucket) FROM metric_values")[0][0] == "2026-09-22T00:00:00Z"
    with caplog.at_level(logging.WARNING, logger="drainpipe.store"):
        with open_store(url) as store:
            assert column_types(store) == {"TIMESTAMP WITH TIME ZONE"}
            assert (store.query(), store.query_topn("top_slow_statements")) == before
            merge(store)  # the migrated states merge with new ones: every count doubles
            cpm = {r[3]: r[5] for r in store.query("service_cpm", granularity="minute")}
            assert cpm == {r[3]: 2 * r[5] for r in before[0] if r[0] == "service_cpm" and r[2] == "minute"}
            assert len(store.query()) == len(before[0])
    migrated = [r.getMessage() for r in caplog.records if "time_bucket" in r.getMessage()]
    assert len(migrated) == 3 and all("TIMESTAMP WITH TIME ZONE" in m for m in migrated), migrated
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="drainpipe.store"), open_store(url) as store:
        assert len(store.query()) == len(before[0])
    assert not [r for r in caplog.records if "migrated" in r.getMessage()]  # once
