"""Synthetic workload generator and event writer: shape, determinism, and write -> read round trips."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import math
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drainpipe.inputs import (
    EVENT_SCHEMA,
    LATENCY_MAX_MS,
    TS_MAX,
    TS_MIN,
    DeadLetter,
    EventBatch,
    ReadStats,
    read_events,
)
from drainpipe.pipeline.generator import DEFAULT_START_MS, Sampler, generate_events, write_events

FORMATS = ["jsonl", "jsonl.gz", "json", "ndjson", "csv", "csv.gz", "parquet"]


def table(batches) -> pa.Table:
    """Generated batches, or read event batches, as one table."""
    return pa.Table.from_batches([b.rows if isinstance(b, EventBatch) else b for b in batches], schema=EVENT_SCHEMA)


@pytest.fixture(scope="module")
def sample() -> pa.Table:
    return table(generate_events(200_000))


def test_default_start_is_the_documented_instant():
    assert DEFAULT_START_MS == dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC).timestamp() * 1000


def test_schema_batches_and_canonical_values():
    batches = list(generate_events(100_000, batch_rows=30_000))
    assert [b.num_rows for b in batches] == [30_000, 30_000, 30_000, 10_000]
    for b in batches:
        assert b.schema.equals(EVENT_SCHEMA)
        b.validate(full=True)
    t = table(batches)
    for name in EVENT_SCHEMA.names[:-1]:
        assert t.column(name).null_count == 0
    latency = t.column("latency_ms").to_numpy()
    assert np.isfinite(latency).all() and (latency > 0).all()
    assert (np.round(latency, 3) == latency).all()


def test_zero_events_and_bad_arguments():
    assert list(generate_events(0)) == []
    for kwargs in [{"n": -1}, {"n": 1, "batch_rows": 0}, {"n": 1, "error_rate": 1.5}, {"n": 1, "services": 0},
                   {"n": 1, "duration_s": 0}]:  # fmt: skip
        with pytest.raises(ValueError):
            list(generate_events(**kwargs))


def test_deterministic_for_a_seed_and_different_for_another():
    assert table(generate_events(5000, seed=7)).equals(table(generate_events(5000, seed=7)))
    assert not table(generate_events(5000, seed=7)).equals(table(generate_events(5000, seed=8)))


def test_batch_rows_do_not_change_the_events():
    whole = table(generate_events(150_000))
    assert table(generate_events(150_000, batch_rows=7777)).equals(whole)
    assert table(generate_events(150_000, batch_rows=1_000_000)).equals(whole)


def test_events_arrive_in_time_order_with_jitter():
    ts = table(generate_events(150_000, duration_s=600)).column("ts").to_numpy()
    assert ts.min() >= DEFAULT_START_MS and ts.max() < DEFAULT_START_MS + 600_000
    # nearly sorted: no event is more than the 2 s jitter out of order
    assert (np.maximum.accumulate(ts) - ts).max() <= 2000
    assert not (np.diff(ts) >= 0).all()


def test_services_are_zipf_and_names_follow_the_pattern(sample):
    counts = Counter(sample.column("service").to_pylist())
    assert set(counts) == {f"svc-{i:02d}" for i in range(20)}
    weights = 1 / np.arange(1, 21) ** 1.1
    expected = weights / weights.sum()
    observed = np.array([counts[f"svc-{i:02d}"] for i in range(20)]) / len(sample)
    assert np.abs(observed - expected).max() < 0.005
    wide = table(generate_events(2000, services=150))
    assert set(wide.column("service").to_pylist()) <= {f"svc-{i:03d}" for i in range(150)}


def test_endpoints_zipf_instances_uniform_within_service(sample):
    rows = sample.select(["service", "instance", "endpoint"]).to_pylist()
    svc0 = [r for r in rows if r["service"] == "svc-00"]
    endpoints = Counter(r["endpoint"] for r in svc0)
    assert set(endpoints) <= {f"/api/e{i:02d}" for i in range(10)}
    assert endpoints["/api/e00"] > endpoints["/api/e01"] > endpoints["/api/e05"]
    instances = Counter(r["instance"] for r in svc0)
    assert set(instances) == {"svc-00-i0", "svc-00-i1", "svc-00-i2"}
    assert max(instances.values()) / min(instances.values()) < 1.1
    assert all(r["instance"].startswith(r["service"] + "-i") for r in rows)


def test_status_db_statement_and_time_spread(sample):
    n = len(sample)
    errors = n - sum(sample.column("status").to_pylist())
    assert abs(errors / n - 0.02) < 0.003
    statements = sample.column("db_statement")
    assert abs(1 - statements.null_count / n - 0.3) < 0.01
    per_service: dict[str, set] = {}
    for r in sample.select(["service", "db_statement"]).to_pylist():
        if r["db_statement"] is not None:
            per_service.setdefault(r["service"], set()).add(r["db_statement"])
            assert r["service"].replace("-", "_") in r["db_statement"]
    assert all(2 <= len(v) <= 5 for v in per_service.values())
    ts = sample.column("ts").to_numpy()
    assert ts.min() >= DEFAULT_START_MS and ts.max() < DEFAULT_START_MS + 3_600_000
    bins = np.bincount((ts - DEFAULT_START_MS) // 600_000, minlength=6)
    assert bins.min() / bins.max() > 0.95


def test_latency_scale_differs_per_endpoint(sample):
    rows = sample.select(["service", "endpoint", "latency_ms", "db_statement"]).to_pylist()
    medians = {}
    for key in [("svc-00", "/api/e00"), ("svc-00", "/api/e01"), ("svc-01", "/api/e00")]:
        values = [r["latency_ms"] for r in rows if (r["service"], r["endpoint"]) == key and r["db_statement"] is None]
        medians[key] = float(np.median(values))
    assert len({round(math.log(m), 1) for m in medians.values()}) == 3


def test_arguments_shape_the_workload():
    t = table(generate_events(20_000, services=3, endpoints_per_service=2, instances_per_service=1, error_rate=0.5,
                              start_ms=0, duration_s=10))  # fmt: skip
    assert set(t.column("service").to_pylist()) == {"svc-00", "svc-01", "svc-02"}
    assert set(t.column("endpoint").to_pylist()) == {"/api/e00", "/api/e01"}
    assert set(t.column("instance").to_pylist()) == {"svc-00-i0", "svc-01-i0", "svc-02-i0"}
    assert abs(sum(t.column("status").to_pylist()) / 20_000 - 0.5) < 0.02
    assert t.column("ts").to_numpy().max() < 10_000


@pytest.mark.parametrize("n, skew", [(1, 1.1), (20, 0.0), (20, 1.1), (7, 3.0), (1000, 1.5)])
def test_sampler_is_exact_inverse_cdf(n, skew):
    sampler = Sampler(n, skew)
    got = sampler.sample(np.random.default_rng(3), 50_000)
    u = np.random.default_rng(3).random(50_000)
    weights = 1 / np.arange(1, n + 1) ** skew
    cdf = np.cumsum(weights / weights.sum())
    assert (got == np.minimum(np.searchsorted(cdf, u, side="right"), n - 1)).all()


# ----------------------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("suffix", FORMATS)
def test_generate_write_read_round_trip(tmp_path, suffix):
    events = table(generate_events(20_000, batch_rows=4096))
    path = tmp_path / f"events.{suffix}"
    assert write_events(generate_events(20_000, batch_rows=4096), path) == 20_000
    stats = ReadStats()
    with DeadLetter(tmp_path / "rejected.jsonl") as dl:
        back = table(read_events([str(path)], batch_rows=5000, dead_letter=dl, stats=stats))
    assert (stats.read, stats.accepted, stats.rejected) == (20_000, 20_000, 0)
    assert back.equals(events)


def test_written_files_look_as_documented(tmp_path):
    batch = next(generate_events(50))
    write_events([batch], tmp_path / "e.jsonl.gz")
    lines = gzip.decompress((tmp_path / "e.jsonl.gz").read_bytes()).decode().split("\n")
    assert lines[-1] == "" and len(lines) == 51
    first = [json.loads(x) for x in lines[:-1]]
    assert first == [{k: v for k, v in r.items() if not (k == "db_statement" and v is None)}
                     for r in batch.to_pylist()]  # fmt: skip
    write_events([batch], tmp_path / "e.csv")
    assert (tmp_path / "e.csv").read_text().split("\n")[
        0
    ] == '"ts","service","instance","endpoint","latency_ms","status","db_statement"'


def test_write_empty_and_errors(tmp_path):
    for suffix in FORMATS:
        assert write_events([], tmp_path / f"empty.{suffix}") == 0
        assert list(read_events([str(tmp_path / f"empty.{suffix}")])) == []
    with pytest.raises(ValueError, match="unsupported output format: '.*e.txt'"):
        write_events([], tmp_path / "e.txt")
    bad = pa.RecordBatch.from_pylist([{"ts": 0, "service": "s", "instance": "", "endpoint": "",
                                       "latency_ms": math.inf, "status": True, "db_statement": None}],
                                     schema=EVENT_SCHEMA)  # fmt: skip
    with pytest.raises(ValueError, match="finite"):
        write_events([bad], tmp_path / "bad.jsonl")


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
EVENTS = st.lists(
    st.fixed_dictionaries(
        {
            "ts": st.integers(TS_MIN, TS_MAX),
            "service": TEXT.filter(bool),
            "instance": TEXT,
            "endpoint": TEXT,
            "latency_ms": st.floats(min_value=0, max_value=LATENCY_MAX_MS),
            "status": st.booleans(),
            "db_statement": st.one_of(st.none(), TEXT),
        }
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(EVENTS)
def test_any_canonical_events_survive_every_format(tmp_path, events):
    """Escaping, quoting and number formatting are lossless (db_statement "" reads back as null)."""
    batch = pa.RecordBatch.from_pylist(events, schema=EVENT_SCHEMA)
    expected = [dict(e, db_statement=e["db_statement"] or None) for e in events]
    for suffix in ["jsonl", "csv", "parquet"]:
        path = tmp_path / f"e.{suffix}"
        write_events([batch], path)
        stats = ReadStats()
        back = table(read_events([str(path)], stats=stats)).to_pylist()
        assert stats.rejected == 0, (suffix, stats.reasons)
        assert back == expected, suffix
