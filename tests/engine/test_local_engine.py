"""The local engine end to end: files in, store out, checked against an independent DuckDB SQL computation."""

from __future__ import annotations

import json
import math

import duckdb
import pytest

from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.engine import EngineOptions
from drainpipe.pipeline.generator import generate_events, write_events
from drainpipe.pipeline.run import run_local
from drainpipe.pipeline.store import open_store

# small queues and short periods, so a test run exercises flushes, L1 splits and rebalancing
OPTS = EngineOptions(l1_flush_s=0.05, l2_flush_s=0.1, rebalance_interval_ms=20, chunk_rows=512)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("events")
    events = d / "events.jsonl"
    write_events(generate_events(60_000, services=8, endpoints_per_service=5, duration_s=900, seed=3), events)
    bad = [
        '{"ts": 1, "service": ""}',
        "not json",
        '{"ts": "yesterday", "service": "a", "latency_ms": 1}',
        '{"ts": 1763719200000, "service": "x", "latency_ms": -1}',
        "[1,2]",
        '{"service": "a", "latency_ms": 1}',
    ]
    lines = events.read_text().splitlines()
    for i, b in enumerate(bad):
        lines.insert(1000 * (i + 1), b)
    mixed = d / "mixed.jsonl"
    mixed.write_text("\n".join(lines) + "\n")
    half1, half2 = d / "h1.jsonl", d / "h2.jsonl"
    half1.write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    half2.write_text("\n".join(lines[len(lines) // 2 :]) + "\n")
    return {"mixed": mixed, "h1": half1, "h2": half2, "bad": len(bad), "good": 60_000}


def run(paths, db, tmp_path):
    return run_local(
        [str(p) for p in paths],
        definitions=default_definitions(),
        store_url=f"duckdb:///{db}",
        dead_letter=str(tmp_path / "rejects.jsonl"),
        options=OPTS,
    )


def values(db):
    s = open_store(f"duckdb:///{db}")
    try:
        return {r[:5]: r[5] for r in s.query()}, s.query_topn("top_slow_statements")
    finally:
        s.close()


def test_counts_reconcile_and_rejects_go_to_the_dead_letter(data, tmp_path):
    summary = run([data["mixed"]], tmp_path / "a.duckdb", tmp_path)
    assert summary.read == summary.accepted + summary.rejected
    assert (summary.accepted, summary.rejected) == (data["good"], data["bad"])
    assert summary.dropped == 0 and summary.handler_errors == 0
    rejects = [json.loads(x) for x in (tmp_path / "rejects.jsonl").read_text().splitlines()]
    assert len(rejects) == data["bad"] and all(r["reason"] for r in rejects)


def test_matches_independent_sql(data, tmp_path):
    db = tmp_path / "b.duckdb"
    run([data["mixed"]], db, tmp_path)
    got, _ = values(db)
    con = duckdb.connect()
    con.execute(f"""CREATE TABLE e AS SELECT * FROM read_json('{data["mixed"]}', format='newline_delimited',
        ignore_errors=true, columns={{ts:'BIGINT', service:'VARCHAR', instance:'VARCHAR', endpoint:'VARCHAR',
        latency_ms:'DOUBLE', status:'BOOLEAN', db_statement:'VARCHAR'}})
        WHERE service IS NOT NULL AND service <> '' AND latency_ms >= 0 AND ts > 0""")
    assert con.execute("SELECT count(*) FROM e").fetchone()[0] == data["good"]
    bucket = "strftime(to_timestamp(ts // {w} * {w} / 1000) AT TIME ZONE 'UTC', '%Y-%m-%dT%H:%M:%SZ')"
    checked = 0
    for gran, w, minutes in (("minute", 60_000, 1), ("hour", 3_600_000, 60), ("day", 86_400_000, 1440)):
        b = bucket.format(w=w)
        rows = con.execute(f"""SELECT service, {b}, count(*), avg(latency_ms), 100.0 * avg(status::INT),
            round((sum(CASE WHEN status AND latency_ms <= 500 THEN 1 ELSE 0 END)
                 + sum(CASE WHEN status AND latency_ms > 500 AND latency_ms <= 2000 THEN 1 ELSE 0 END) / 2.0)
                 / count(*), 4),
            sum(CASE WHEN NOT status THEN 1 ELSE 0 END)
            FROM e GROUP BY ALL""").fetchall()
        for svc, tb, n, avg, sla, apdex, errors in rows:
            assert got[("service_cpm", svc, gran, tb, "")] == pytest.approx(n / minutes, rel=1e-12)
            assert got[("service_resp_time", svc, gran, tb, "")] == pytest.approx(avg, rel=1e-9)
            assert got[("service_sla", svc, gran, tb, "")] == pytest.approx(sla, rel=1e-12)
            assert got[("service_apdex", svc, gran, tb, "")] == pytest.approx(apdex, abs=1e-12)
            if errors:
                assert got[("service_error_count", svc, gran, tb, "")] == errors
            checked += 1
        # percentiles: bucket b = floor(latency/10); value = 10 * b of the r-th smallest, r = ceil(p/100*n)
        pct = con.execute(f"""SELECT endpoint_e, {b}, p, 10 * b FROM (
            SELECT service || '/' || endpoint AS endpoint_e, ts, floor(latency_ms / 10)::BIGINT AS b,
                   row_number() OVER (PARTITION BY service, endpoint, ts // {w} ORDER BY latency_ms) AS rk,
                   count(*) OVER (PARTITION BY service, endpoint, ts // {w}) AS n
            FROM e WHERE endpoint <> '') x, (VALUES (50), (75), (90), (95), (99)) ps(p)
            WHERE rk = ceil(p / 100.0 * n)""").fetchall()
        for ent, tb, p, v in pct:
            assert got[("endpoint_percentile", ent, gran, tb, f"p{p}")] == v
    assert checked > 100


def test_rerun_changes_nothing_and_halves_equal_the_whole(data, tmp_path):
    whole, halves = tmp_path / "whole.duckdb", tmp_path / "halves.duckdb"
    run([data["mixed"]], whole, tmp_path)
    first = values(whole)
    again = run([data["mixed"]], whole, tmp_path)
    assert again.unchanged_files == 1 and again.read == 0 and again.complete
    assert values(whole) == first
    run([data["h1"]], halves, tmp_path)
    run([data["h2"]], halves, tmp_path)
    got, top = values(halves)
    want, want_top = first
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert math.isclose(got[k], v, rel_tol=1e-12), k  # float sums may differ in the last ulp
    assert top == want_top


def test_l1_rebalances_and_splits_while_running(data, tmp_path):
    summary = run([data["mixed"]], tmp_path / "c.duckdb", tmp_path)
    l1 = next(s for n, s in summary.queues.items() if n.endswith("-L1"))
    assert l1.dispatched > 0 and l1.dropped_full == 0
    assert sum(s.dropped_full for s in summary.queues.values()) == 0
