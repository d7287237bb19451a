"""Retention: a simulated month of minute traffic into a store that purges daily on a fake clock stays flat in rows,
progress rows and bytes, on DuckDB and PostgreSQL; what is kept is exactly what the retention says; durations and
the ``[retention]`` table are parsed strictly."""

from __future__ import annotations

import pyarrow as pa
import pytest

from drainpipe.errors import DefinitionError
from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import default_definitions, parse_definitions
from drainpipe.pipeline.retention import Retention, parse_duration, parse_retention_flag
from drainpipe.pipeline.store import SourceProgress, SqlStore, open_store
from testlib import MIDNIGHT as T0
from testlib import event_batch, wait_until

DAY = 86_400_000
TABLES = ("metric_state", "metric_values", "topn_values", "source_progress")
SHORT = Retention(minute=DAY, hour=3 * DAY, day=7 * DAY, topn=DAY)


#: a busy minute every STRIDE minutes of the day. Flatness is a property of the days (each adds what the purge takes),
#: not of how many minutes a day has: the windows, the rows of each busy minute and the checks are the same, and with
#: the purge removed the rows still grow every day. Every minute of the day took 24 s on PostgreSQL (its merges and
#: VACUUMs scale with the rows), every fifth 6 s
STRIDE = 5
#: the events of a day: two services in each busy minute
EVENTS_PER_DAY = 1440 // STRIDE * 2


def day_of_traffic(day: int) -> pa.RecordBatch:
    """Two services, an event each per busy minute of the day (every STRIDE-th), every tenth with a statement."""
    start = T0 + day * DAY
    return event_batch(
        {"ts": start + i * STRIDE * 60_000 + s * 1000, "service": f"svc{s}", "instance": "i", "endpoint": f"/e{i % 4}",
         "latency_ms": float(i % 300), "status": i % 17 != 0, "db_statement": f"select {i % 5}" if i % 10 == 0 else None}
        for i in range(1440 // STRIDE) for s in range(2)
    )  # fmt: skip


def counts(store: SqlStore) -> dict[str, int]:
    return {t: store.backend.fetchall(f"SELECT count(*) FROM {t}")[0][0] for t in TABLES}


def simulate_month(store: SqlStore, days: int = 30) -> list[tuple[dict[str, int], int]]:
    """Per simulated day: merge its traffic (with its file's progress rows) at the day's end, purge, and
    reclaim; the row counts and store size after each day."""
    definitions = default_definitions()
    now = [T0]
    store.clock = lambda: now[0]
    out = []
    for day in range(days):
        now[0] = T0 + (day + 1) * DAY  # the end of the day: its traffic has all arrived
        partials = aggregate_batch(day_of_traffic(day), definitions)
        progress = [SourceProgress("file", f"fid-{day}", d.name, -1, EVENTS_PER_DAY, f"head-{day}", f"node-{day}",
                                   f"/logs/{day}.jsonl")
                    for d in definitions.all]  # fmt: skip
        store.merge(partials, progress=progress)
        store.purge(SHORT)
        store.reclaim()
        out.append((counts(store), store.size_bytes()))
    return out


def check_flat(history: list[tuple[dict[str, int], int]]) -> None:
    # from day 8 on, every retention window is full: each day adds what the purge takes
    steady = [c for c, _ in history[8:]]
    assert all(c == steady[0] for c in steady), steady
    assert steady[0]["source_progress"] <= 8 * 17  # 8 days of progress rows
    assert history[-1][0]["metric_values"] < history[7][0]["metric_values"] * 2
    sizes = [size for _, size in history]
    # bytes flat too: deleted rows' space is reused (DuckDB's file alternates as blocks are freed and refilled)
    assert max(sizes[15:]) <= max(sizes[8:15]) * 1.25, sizes


def month_stays_flat(url: str, days: int = 30) -> None:
    store = open_store(url)
    try:
        check_flat(simulate_month(store, days))
        assert_kept_as_retention_says(store, T0 + days * DAY)
    finally:
        store.close()


def test_a_month_of_minute_traffic_stays_flat_on_duckdb(tmp_path) -> None:
    month_stays_flat(f"duckdb:///{tmp_path / 'month.duckdb'}")


@pytest.mark.postgres
def test_a_month_of_minute_traffic_stays_flat_on_postgres(pg_url: str) -> None:
    month_stays_flat(pg_url, days=16)  # (its VACUUMs are slow; 8 days past the full windows show it flat)


def assert_kept_as_retention_says(store: SqlStore, now: int) -> None:
    for granularity, keep in (("minute", SHORT.minute), ("hour", SHORT.hour), ("day", SHORT.day)):
        rows = store.query(metric="service_cpm", granularity=granularity)
        oldest = min(bucket for *_, bucket, _l, _v in rows)
        assert keep is not None
        assert oldest >= _iso(now - keep), (granularity, oldest)
    assert min(r[2] for r in store.query_topn("top_slow_statements")) >= _iso(now - DAY)


def _iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_without_purge_the_same_month_grows(tmp_path) -> None:
    """The control: the same traffic without purging grows every day (the flat test measures something)."""
    store = open_store(f"duckdb:///{tmp_path / 'grow.duckdb'}")
    try:
        store.purge = lambda retention, now_ms=None: None  # type: ignore[method-assign,assignment,misc,return-value]
        history = simulate_month(store, days=12)
        values = [c["metric_values"] for c, _ in history]
        assert all(b > a for a, b in zip(values, values[1:]))
        assert history[-1][0]["source_progress"] == 12 * 17
    finally:
        store.close()


def test_forever_keeps_everything_and_the_books() -> None:
    r = Retention(minute=None)
    assert "minute" not in r.metric_cutoffs(T0) and r.books_cutoff(T0) is None
    assert Retention().books_cutoff(T0) == T0 - 800 * DAY  # the longest retention
    assert Retention().describe() == "minute 7d, hour 90d, day 800d, topn 7d"


def test_durations_and_the_retention_table_are_parsed_strictly() -> None:
    assert parse_duration("36h") == 36 * 3_600_000 and parse_duration("2w") == 14 * DAY
    assert parse_duration("forever") is None
    for bad in ("7", "7y", "-1d", "0d", 7, "", "7 days"):
        with pytest.raises(DefinitionError, match="expected a duration"):
            parse_duration(bad)
    definitions = parse_definitions(
        '[retention]\nminute = "2d"\nday = "forever"\n[[metric]]\nname = "c"\nscope = "service"\nfunction = "cpm"'
    )
    assert definitions.retention == Retention(minute=2 * DAY, day=None)
    with pytest.raises(DefinitionError, match="unknown retention 'second'"):
        parse_definitions('[retention]\nsecond = "2d"\n[[metric]]\nname = "c"\nscope = "service"\nfunction = "cpm"')
    assert parse_retention_flag("hour=30d") == ("hour", 30 * DAY)
    assert Retention().with_flags(["hour=30d", "day=forever"]) == Retention(hour=30 * DAY, day=None)
    from drainpipe.cli import build_parser

    for command in ("serve", "compact"):  # one --retention option, shared
        assert build_parser().parse_args([command, "--retention", "minute=1d"]).retention == ["minute=1d"]
    with pytest.raises(DefinitionError, match="GRANULARITY=DURATION"):
        parse_retention_flag("30d")


@pytest.mark.clock_at("2026-10-22T00:00:00Z")  # a month after the day of traffic: its minutes are past retention
def test_serve_purges_at_start_and_on_its_schedule(tmp_path) -> None:
    """A serving engine over a store holding old minutes purges them at start (and says so in its stats)."""
    from drainpipe.server.service import IngestService, ServiceOptions

    url = f"duckdb:///{tmp_path / 'serve.duckdb'}"
    store = open_store(url)
    store.merge(aggregate_batch(day_of_traffic(0), default_definitions()))
    before = counts(store)["metric_values"]
    service = IngestService(default_definitions(), store, options=ServiceOptions(purge_every_s=0.05))
    try:
        # (the view is sampled once a second)
        stats = wait_until(lambda: (s := service.stats_view()["store"])["purges"] >= 2 and s, timeout=15, interval=0.1)
        assert stats["purges"] >= 2 and stats["purged_rows"] > 0 and stats["retention"].startswith("minute 7d")
    finally:
        service.close()
    store = open_store(url)
    try:
        after = counts(store)
        assert after["metric_values"] < before and after["topn_values"] == 0  # the day's minutes are a month old
    finally:
        store.close()
