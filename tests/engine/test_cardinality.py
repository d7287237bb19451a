"""The cardinality guard: 100,000 distinct endpoints (one per user id, no rule to fold them) keep at most
max_entities endpoint entities per minute; the rest fold into __overflow__ with nothing lost from the totals, and
the fold is counted in the summary. Hypothesis holds the guard to its invariants on arbitrary partials."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.cardinality import OVERFLOW, EntityGuard
from drainpipe.pipeline.definitions import DefinitionError, default_definitions, parse_definitions
from drainpipe.pipeline.grouping import distinct_pairs
from drainpipe.pipeline.run import run_local
from drainpipe.pipeline.store import open_store
from drainpipe.pipeline.values import finalize

BASE_MS = 1_790_000_000_000 // 60_000 * 60_000


def test_100k_distinct_endpoints_fold_beyond_max_entities(tmp_path: Path) -> None:
    path = tmp_path / "ids.jsonl"
    n = 100_000
    with path.open("w") as f:
        for i in range(n):  # two minutes, every event its own endpoint (the endpoint carries the user id raw)
            f.write(json.dumps({"ts": BASE_MS + i * 120_000 // n, "service": "api", "endpoint": f"user-{i}",
                                "latency_ms": float(i % 100), "status": i % 10 != 0}) + "\n")  # fmt: skip
    definitions = parse_definitions(
        "max_entities = 5000\n" + "\n".join(
            f'[[metric]]\nname = "{s}_cpm"\nscope = "{s}"\nfunction = "cpm"' for s in ("service", "endpoint")))  # fmt: skip
    assert definitions.max_entities == 5000
    url = f"duckdb:///{tmp_path / 's.duckdb'}"
    summary = run_local([str(path)], definitions=definitions, store_url=url, dead_letter=str(tmp_path / "d.jsonl"),
                        workers=0)  # fmt: skip
    assert summary.complete and summary.accepted == n
    assert summary.overflow["endpoint"] > 0 and "service" not in summary.overflow
    assert any("__overflow__" in line for line in summary.lines())
    store = open_store(url)
    try:
        rows = store.query(metric="endpoint_cpm", granularity="minute")
        service = store.query(metric="service_cpm", granularity="minute")
    finally:
        store.close()
    per_minute = Counter(bucket for _m, _e, _g, bucket, _l, _v in rows)
    assert len(per_minute) == 2 and all(k <= 5000 + 1 for k in per_minute.values())  # kept + __overflow__
    assert sum(v for *_, v in rows) == n == sum(v for *_, v in service)  # nothing lost from the totals
    overflow = sum(v for _m, e, _g, _b, _l, v in rows if e == OVERFLOW)
    assert overflow == n - 2 * 5000


def test_max_entities_is_validated() -> None:
    try:
        parse_definitions('max_entities = 0\n[[metric]]\nname = "a"\nscope = "service"\nfunction = "cpm"')
    except DefinitionError as exc:
        assert "max_entities" in str(exc)
    else:
        raise AssertionError("accepted max_entities = 0")


events = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 30), st.floats(0, 1000, allow_nan=False)), min_size=1, max_size=200
)


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(events, min_size=1, max_size=4), limit=st.integers(1, 12))
def test_the_guard_bounds_entities_and_keeps_totals(batches, limit) -> None:
    definitions = default_definitions()
    guard = EntityGuard(limit)
    kept: dict = {}
    total: Counter = Counter()
    for batch in batches:
        table = pa.RecordBatch.from_pylist(
            [{"ts": BASE_MS + m * 60_000, "service": "s", "instance": "", "endpoint": f"e{e}", "latency_ms": lat,
              "status": True, "db_statement": None} for m, e, lat in batch])  # fmt: skip
        for partial in guard.apply(aggregate_batch(table, definitions)):
            if partial.name != "endpoint_cpm":
                continue
            for _m, entity, _g, bucket, _l, value in finalize(partial):
                kept.setdefault(bucket, set()).add(entity)
                total[bucket] += value
        for m, _, _ in batch:
            total[("want", m)] += 1
    for entities in kept.values():  # per minute: at most `limit` entities plus __overflow__
        assert len(entities - {OVERFLOW}) <= limit
    assert sum(v for k, v in total.items() if not isinstance(k, tuple)) == sum(
        v for k, v in total.items() if isinstance(k, tuple)
    )  # every event counted once, kept or folded


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(events, min_size=1, max_size=4), limit=st.integers(1, 6), horizon=st.integers(1, 40))
def test_the_guard_folds_a_batchs_partials_as_it_folds_each_alone(batches, limit, horizon) -> None:
    """apply() looks once at the columns a scope's metrics share: it must fold exactly what looking at every partial
    on its own folds (a guard given them one call each), buckets forgotten past the horizon included."""
    definitions = default_definitions()
    together, alone = EntityGuard(limit, horizon), EntityGuard(limit, horizon)
    for batch in batches:
        table = pa.RecordBatch.from_pylist(
            [{"ts": BASE_MS + m * 60_000, "service": f"s{e % 3}", "instance": f"i{e % 5}", "endpoint": f"e{e}",
              "latency_ms": lat, "status": e % 2 == 0, "db_statement": None} for m, e, lat in batch])  # fmt: skip
        partials = aggregate_batch(table, definitions)
        got = together.apply(partials)
        want = [alone.apply([p])[0] for p in partials]
        for g, w in zip(got, want):
            assert g.table.equals(w.table), g.name
    assert together.folded == alone.folded


def test_a_partial_sharing_columns_with_one_that_folded_nothing_is_looked_at_again_after_a_bucket_is_forgotten():
    """P and Q share their columns (two metrics of one batch), R between them is another batch's: P forgets its
    first bucket past the horizon, R admits another entity there, so Q must fold what it brings to that bucket, as
    looking at Q alone does."""
    definitions = default_definitions()

    def partials(endpoint: str, minutes: range) -> list:
        table = pa.RecordBatch.from_pylist(
            [{"ts": BASE_MS + m * 60_000, "service": "s", "instance": "", "endpoint": endpoint, "latency_ms": 5.0,
              "status": True, "db_statement": None} for m in minutes])  # fmt: skip
        return [p for p in aggregate_batch(table, definitions) if p.name in ("endpoint_cpm", "endpoint_sla")]

    p, q = partials("/a", range(3))
    (r, _) = partials("/b", range(1))
    together, alone = EntityGuard(1, horizon=2), EntityGuard(1, horizon=2)
    got = together.apply([p, r, q])
    want = [alone.apply([x])[0] for x in (p, r, q)]
    assert got[2].table.equals(want[2].table) and OVERFLOW in got[2].table.column("entity").to_pylist()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 9)), max_size=60),
    st.sampled_from([60_000, 600_000, 86_400_000 * 400, 1]),
    st.integers(-(2**40), 2**40),
)
def test_the_guards_pairs_are_npuniques(rows: list[tuple[int, int]], unit: int, base: int) -> None:
    """The distinct (bucket, entity code) pairs the guard admits, by its table of seen pairs or by np.unique (far
    apart buckets, or buckets that are not whole minutes), are np.unique's: the same pairs in the same order."""
    buckets = np.array([base * 60_000 + k * unit for k, _ in rows], np.int64)
    codes = np.array([c for _, c in rows], np.int64)
    got = distinct_pairs(buckets, codes, 10)
    want = np.divmod(np.unique(buckets * 10 + codes), 10)
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
