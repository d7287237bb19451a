"""Metric functions as mergeable states: hand-computed cases, merge properties, and a DuckDB SQL cross-check."""

from __future__ import annotations

import math
import pickle
from collections.abc import Sequence
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS, Definitions, MetricDef, TopNDef
from drainpipe.pipeline.partials import (
    MetricAccumulator,
    MetricPartial,
    TopNPartial,
    merge,
    normalize,
    partial_type,
    rollup,
    split_partial,
)
from drainpipe.pipeline.state_table import from_state_table, from_topn_table, to_state_table, to_topn_table
from drainpipe.pipeline.times import iso_from_ms, ms_from_iso
from drainpipe.pipeline.values import finalize, finalize_table
from testlib import T0, event_batch

MIN = 60_000
COLUMNS = ("ts", "service", "instance", "endpoint", "latency_ms", "status", "db_statement")


def event(ts: int = T0, service: str = "svc", instance: str = "", endpoint: str = "", latency: float = 1.0,
          ok: bool = True, db: str | None = None) -> tuple[Any, ...]:  # fmt: skip
    return (ts, service, instance, endpoint, float(latency), ok, db)


batch = event_batch  # (events as tuples of COLUMNS)


def rows(
    metric: MetricDef | TopNDef, events: Sequence[tuple[Any, ...]], granularity: str = "minute"
) -> list[tuple[Any, ...]]:
    (partial,) = aggregate_batch(batch(events), _single(metric))
    if granularity != "minute":
        partial = rollup(partial, granularity)  # type: ignore[arg-type]
    return finalize(partial)


def values(
    metric: MetricDef, events: Sequence[tuple[Any, ...]], granularity: str = "minute"
) -> dict[tuple[str, str, str], float]:
    return {(r[1], r[3], r[4]): r[5] for r in rows(metric, events, granularity)}


def _single(definition: MetricDef | TopNDef) -> Definitions:
    return Definitions((definition,)) if isinstance(definition, MetricDef) else Definitions((), (definition,))


def close_rows(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]], float_metrics: set[str]) -> bool:
    """Equal rows; values of float-sum metrics may differ in the last ulps (summation order)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x[:-1] != y[:-1]:
            return False
        if x[0] in float_metrics:
            if not math.isclose(x[-1], y[-1], rel_tol=1e-12, abs_tol=1e-12):
                return False
        elif x[-1] != y[-1]:
            return False
    return True


FLOAT_METRICS = {"service_resp_time", "instance_resp_time", "endpoint_resp_time", "service_sum"}

# ------------------------------------------------------------------------------------------ hand-computed


def test_count_cpm_and_buckets() -> None:
    events = [event(T0), event(T0 + 59_999), event(T0 + MIN), event(T0, service="other", ok=False)]
    count = MetricDef("c", "service", "count")
    assert values(count, events) == {
        ("svc", "2026-11-21T10:00:00Z", ""): 2.0,
        ("svc", "2026-11-21T10:01:00Z", ""): 1.0,
        ("other", "2026-11-21T10:00:00Z", ""): 1.0,
    }
    cpm = MetricDef("m", "service", "cpm")
    assert values(cpm, events, "hour") == {
        ("svc", "2026-11-21T10:00:00Z", ""): 3 / 60,
        ("other", "2026-11-21T10:00:00Z", ""): 1 / 60,
    }
    assert values(cpm, events, "day") == {
        ("svc", "2026-11-21T00:00:00Z", ""): 3 / 1440,
        ("other", "2026-11-21T00:00:00Z", ""): 1 / 1440,
    }
    assert rows(cpm, events[:1]) == [("m", "svc", "minute", "2026-11-21T10:00:00Z", "", 1.0)]


def test_sum_avg_min_max() -> None:
    events = [event(latency=1.5), event(latency=2.0), event(latency=10.25), event(T0 + MIN, latency=7)]
    key = ("svc", "2026-11-21T10:00:00Z", "")
    assert values(MetricDef("s", "service", "sum", field="latency_ms"), events)[key] == 13.75
    assert values(MetricDef("a", "service", "avg", field="latency_ms"), events)[key] == 13.75 / 3
    assert values(MetricDef("a", "service", "avg", field="latency_ms"), events, "hour") == {
        ("svc", "2026-11-21T10:00:00Z", ""): 20.75 / 4  # from the events, not an average of minute averages
    }
    assert values(MetricDef("lo", "service", "min", field="latency_ms"), events)[key] == 1.5
    assert values(MetricDef("hi", "service", "max", field="latency_ms"), events, "day") == {
        ("svc", "2026-11-21T00:00:00Z", ""): 10.25
    }
    assert values(MetricDef("t", "service", "max", field="ts"), events)[key] == float(T0)


def test_sla_with_failures() -> None:
    events = [event(ok=True), event(ok=False), event(ok=True), event(ok=True), event(T0 + MIN, ok=False)]
    assert values(MetricDef("s", "service", "sla"), events) == {
        ("svc", "2026-11-21T10:00:00Z", ""): 75.0,
        ("svc", "2026-11-21T10:01:00Z", ""): 0.0,
    }
    assert (
        values(MetricDef("s", "service", "sla"), [event()] * 3 + [event(ok=False)] * 4, "hour")[
            ("svc", "2026-11-21T10:00:00Z", "")
        ]
        == 100 * 3 / 7
    )


def test_apdex_boundaries() -> None:
    apdex = MetricDef("a", "service", "apdex", threshold_ms=100)
    # t and 4t are inclusive upper bounds; failures are frustrated whatever their latency
    cases = [
        (100, True, 1.0),
        (100.0001, True, 0.5),
        (400, True, 0.5),
        (400.0001, True, 0.0),
        (0, False, 0.0),
        (0, True, 1.0),
    ]
    for latency, ok, expected in cases:
        assert values(apdex, [event(latency=latency, ok=ok)]) == {("svc", "2026-11-21T10:00:00Z", ""): expected}
    mixed = [event(latency=50), event(latency=150), event(latency=1000), event(latency=10, ok=False)]
    assert values(apdex, mixed)[("svc", "2026-11-21T10:00:00Z", "")] == (1 + 0.5) / 4
    # rounded to 4 decimals: 1/3 -> 0.3333, 2/3 -> 0.6667, and a tie (1/32 = 0.03125) rounds half up
    assert values(apdex, [event(latency=50)] + [event(ok=False)] * 2)[("svc", "2026-11-21T10:00:00Z", "")] == 0.3333
    assert values(apdex, [event(latency=50)] * 2 + [event(ok=False)])[("svc", "2026-11-21T10:00:00Z", "")] == 0.6667
    tie = [event(latency=150)] + [event(ok=False)] * 15
    assert values(apdex, tie)[("svc", "2026-11-21T10:00:00Z", "")] == 0.0313


def _percentiles(latencies: Sequence[float], precision: float = 10) -> list[float]:
    metric = MetricDef("p", "service", "percentile", precision_ms=precision)
    found = rows(metric, [event(latency=x) for x in latencies])
    assert [r[4] for r in found] == ["p50", "p75", "p90", "p95", "p99"]
    return [r[5] for r in found]


def test_percentile_ranks() -> None:
    assert _percentiles([7]) == [0.0] * 5  # one event: every rank is 1; bucket 0 -> value 0
    assert _percentiles([15]) == [10.0] * 5  # floor(15 / 10) = 1 -> 10
    # 4 events: ranks ceil(2)=2, ceil(3)=3, ceil(3.6)=4, ceil(3.8)=4, ceil(3.96)=4
    assert _percentiles([5, 25, 35, 45]) == [20.0, 30.0, 40.0, 40.0, 40.0]
    # 20 events 0..190: exact products: r = 10, 15, 18, 19 and ceil(19.8) = 20
    assert _percentiles([10.0 * i for i in range(20)]) == [90.0, 140.0, 170.0, 180.0, 190.0]
    # 100 events: r = p exactly
    assert _percentiles([float(i) for i in range(1, 101)], precision=1) == [50.0, 75.0, 90.0, 95.0, 99.0]
    # bucket boundaries: 9.999 is in bucket 0, 10 in bucket 1; order of input does not matter
    assert _percentiles([10, 9.999]) == [0.0, 10.0, 10.0, 10.0, 10.0]
    # 3 events, bins 1, 0, 2: ranks 2, 3, 3, 3, 3
    assert _percentiles([2.5, 0.1, 7.4], precision=2.5) == [2.5, 5.0, 5.0, 5.0, 5.0]


def test_percentile_hour_from_histograms() -> None:
    metric = MetricDef("p", "service", "percentile", precision_ms=10)
    events = [event(T0, latency=5)] * 3 + [event(T0 + MIN, latency=95)] * 2
    assert values(metric, events, "hour") == {
        ("svc", "2026-11-21T10:00:00Z", "p50"): 0.0,
        ("svc", "2026-11-21T10:00:00Z", "p75"): 90.0,
        ("svc", "2026-11-21T10:00:00Z", "p90"): 90.0,
        ("svc", "2026-11-21T10:00:00Z", "p95"): 90.0,
        ("svc", "2026-11-21T10:00:00Z", "p99"): 90.0,
    }


def test_scopes_and_empty_scope_rows() -> None:
    events = [
        event(instance="i1", endpoint="/a"),
        event(instance="", endpoint="/a"),
        event(instance="i1", endpoint=""),
        event(service="b", instance="i1", endpoint="/a"),
    ]
    assert values(MetricDef("s", "service", "count"), events) == {
        ("svc", "2026-11-21T10:00:00Z", ""): 3.0,
        ("b", "2026-11-21T10:00:00Z", ""): 1.0,
    }
    assert values(MetricDef("i", "instance", "count"), events) == {
        ("svc/i1", "2026-11-21T10:00:00Z", ""): 2.0,
        ("b/i1", "2026-11-21T10:00:00Z", ""): 1.0,
    }
    assert values(MetricDef("e", "endpoint", "count"), events) == {
        ("svc//a", "2026-11-21T10:00:00Z", ""): 2.0,
        ("b//a", "2026-11-21T10:00:00Z", ""): 1.0,
    }
    only_empty = [event(instance="", endpoint="")]
    for scope in ("instance", "endpoint"):
        for function, extra in (("count", {}), ("percentile", {"precision_ms": 10})):
            assert rows(MetricDef("x", scope, function, **extra), only_empty) == []


def test_where_filter_and_entities_without_matches() -> None:
    errors = MetricDef("e", "service", "count", where="status == false")
    events = [event(ok=False), event(ok=True), event(service="fine"), event(T0 + MIN, ok=False, latency=3)]
    assert values(errors, events) == {
        ("svc", "2026-11-21T10:00:00Z", ""): 1.0,
        ("svc", "2026-11-21T10:01:00Z", ""): 1.0,
    }
    slow = MetricDef("s", "endpoint", "avg", field="latency_ms", where="latency_ms > 2 and status == false")
    assert values(slow, [event(endpoint="/e", latency=1, ok=False), event(endpoint="/e", latency=5, ok=False)]) == {
        ("svc//e", "2026-11-21T10:00:00Z", ""): 5.0
    }


def test_topn_order_ties_and_skips() -> None:
    topn = TopNDef("t", "service", "db_statement", 3)
    events = [
        event(T0, latency=5, db="b"),
        event(T0 + 1, latency=5, db="a"),  # tie on latency: statement asc
        event(T0 + 2, latency=9, db="z"),
        event(T0 + 3, latency=1, db="c"),  # 4th: dropped
        event(T0 + 4, latency=99),  # no statement: skipped
        event(T0 + 5, latency=98, db=""),  # empty statement: skipped
        event(T0 + 9 * MIN + 59_999, latency=2, db="late"),  # same 10-minute bucket
        event(T0 + 10 * MIN, latency=3, db="next"),  # next bucket
        event(T0, service="other", latency=1, db="o", instance="i"),
    ]
    assert rows(topn, events) == [
        ("t", "other", "2026-11-21T10:00:00Z", 1, "o", 1.0),
        ("t", "svc", "2026-11-21T10:00:00Z", 1, "z", 9.0),
        ("t", "svc", "2026-11-21T10:00:00Z", 2, "a", 5.0),
        ("t", "svc", "2026-11-21T10:00:00Z", 3, "b", 5.0),
        ("t", "svc", "2026-11-21T10:10:00Z", 1, "next", 3.0),
    ]


def test_topn_with_many_ties_keeps_the_smallest_keys() -> None:
    topn = TopNDef("t", "service", "db_statement", 2)
    events = [event(T0 + i, latency=7, db=f"s{i:03d}") for i in range(50, 0, -1)] + [event(latency=1, db="fast")]
    assert [r[4] for r in rows(topn, events)] == ["s001", "s002"]


# ------------------------------------------------------------------------------------------ types, merge, rollup


def test_each_definition_has_its_own_partial_class() -> None:
    partials = aggregate_batch(batch([event()]), DEFAULT_DEFINITIONS)
    classes = [type(p) for p in partials]
    assert len(set(classes)) == len(DEFAULT_DEFINITIONS) == 17
    assert classes == [partial_type(d) for d in DEFAULT_DEFINITIONS.all]
    assert type(partials[0]).__name__ == "ServiceCpmPartial"
    assert issubclass(classes[0], MetricPartial) and issubclass(classes[-1], TopNPartial)
    assert partial_type(MetricDef("service_cpm", "service", "cpm")) is classes[0]  # equal definitions share it
    assert partial_type(MetricDef("service_cpm", "service", "count")) is not classes[0]


def test_partials_pickle_by_definition() -> None:
    partials = aggregate_batch(batch([event(db="q")]), DEFAULT_DEFINITIONS)
    for partial in [*partials, rollup(partials[0], "hour")]:  # type: ignore[arg-type]
        copy = pickle.loads(pickle.dumps(partial))
        assert type(copy) is type(partial)
        assert getattr(copy, "granularity", None) == getattr(partial, "granularity", None)
        assert finalize(copy) == finalize(partial)


def test_merge_rejects_mixed_inputs() -> None:
    a, b = aggregate_batch(
        batch([event()]), Definitions((MetricDef("a", "service", "cpm"), MetricDef("b", "service", "cpm")))
    )
    with pytest.raises(ValueError, match="cannot merge"):
        merge([a, b])
    with pytest.raises(ValueError, match="cannot merge"):
        merge([a, rollup(a, "hour")])
    with pytest.raises(ValueError, match="at least one"):
        merge([])
    with pytest.raises(ValueError, match="cannot roll"):
        rollup(rollup(a, "day"), "hour")


def test_accumulator() -> None:
    metric = MetricDef("p", "endpoint", "percentile", precision_ms=10)
    accumulator = MetricAccumulator(metric, compact_rows=2)
    assert len(accumulator) == 0 and accumulator.drain() is None
    for i in range(5):
        (partial,) = aggregate_batch(
            batch([event(endpoint="/e", latency=i * 10), event(endpoint="/f")]), _single(metric)
        )
        accumulator.add(partial)
    assert len(accumulator) == 2  # two (entity, bucket) keys
    drained = accumulator.drain()
    assert drained is not None
    assert {(r[1], r[4]): r[5] for r in finalize(drained)}[("svc//e", "p50")] == 20.0
    assert len(accumulator) == 0
    with pytest.raises(TypeError):
        accumulator.add(aggregate_batch(batch([event()]), DEFAULT_DEFINITIONS)[0])
    with pytest.raises(ValueError):
        accumulator.add(rollup(partial, "hour"))  # type: ignore[arg-type]


def test_split_partial_pieces() -> None:
    events = [event(T0 + i * 1_000, endpoint=f"/e{i % 7}", latency=i, db=f"q{i % 3}") for i in range(200)]
    for partial in aggregate_batch(batch(events), DEFAULT_DEFINITIONS):
        pieces = split_partial(partial, 4)
        k = len(pieces)
        assert sum(p.table.num_rows for p in pieces) == partial.table.num_rows
        assert all(p.table.num_rows <= 4 for p in pieces) and all(type(p) is type(partial) for p in pieces)
        assert k == -(-partial.table.num_rows // 4) or k == 1
        assert finalize(merge(pieces)) == finalize(partial)
        assert [p.table for p in split_partial(partial, 4)] == [p.table for p in pieces]  # deterministic
    with pytest.raises(ValueError):
        split_partial(partial, 0)


def test_empty_batch_gives_empty_partials() -> None:
    partials = aggregate_batch(batch([]), DEFAULT_DEFINITIONS)
    assert len(partials) == 17  # one per definition, in their order, even when the batch brings nothing to it
    assert [p.name for p in partials] == list(DEFAULT_DEFINITIONS.names)
    assert all(p.table.num_rows == 0 for p in partials)
    assert all(finalize(p) == [] for p in partials)
    assert all(finalize(merge([p, p])) == [] for p in partials)


def test_state_encoding_round_trip() -> None:
    events = [
        event(
            T0 + i * 7_000, instance=f"i{i % 3}", endpoint=f"/e{i % 2}", latency=i * 3.5, ok=i % 5 > 0, db=f"q{i % 4}"
        )
        for i in range(40)
    ]
    for partial in aggregate_batch(batch(events), DEFAULT_DEFINITIONS):
        if isinstance(partial, MetricPartial):
            copy = from_state_table(partial.definition, "minute", to_state_table(partial))
        else:
            copy = from_topn_table(partial.definition, to_topn_table(partial))  # type: ignore[arg-type]
        assert finalize(copy) == finalize(partial)


def test_iso_round_trip() -> None:
    ms = np.array([0, T0, T0 + 86_400_000, -60_000], dtype=np.int64)
    text = iso_from_ms(ms).to_pylist()
    assert text == ["1970-01-01T00:00:00Z", "2026-11-21T10:00:00Z", "2026-11-22T10:00:00Z", "1969-12-31T23:59:00Z"]
    assert ms_from_iso(pa.array(text)).tolist() == ms.tolist()


def test_finalize_table_columns() -> None:
    partials = aggregate_batch(batch([event(db="q")]), DEFAULT_DEFINITIONS)
    assert finalize_table(partials[0]).column_names == [
        "metric",
        "entity",
        "granularity",
        "time_bucket",
        "label",
        "value",
    ]
    assert finalize_table(partials[-1]).column_names == ["name", "entity", "time_bucket", "rank", "key", "latency_ms"]


# ------------------------------------------------------------------------------------------ properties

_SERVICES = ["a", "b", "c/d"]
_NAMES = ["", "x", "y"]
_STATEMENTS = [None, "", "s1", "s2", "s3"]

event_strategy = st.builds(
    event,
    ts=st.integers(T0 - 30 * MIN, T0 + 90 * MIN),
    service=st.sampled_from(_SERVICES),
    instance=st.sampled_from(_NAMES),
    endpoint=st.sampled_from(_NAMES),
    latency=st.one_of(st.sampled_from([0.0, 10.0, 500.0, 2000.0, 2000.5]), st.floats(0, 5000, allow_nan=False)),
    ok=st.booleans(),
    db=st.sampled_from(_STATEMENTS),
)
# every function and scope, a filter, and a top-N small enough to truncate
SMALL_TOPN = Definitions(
    (
        MetricDef("service_cpm", "service", "cpm"),
        MetricDef("instance_count", "instance", "count", where="latency_ms >= 10"),
        MetricDef("endpoint_resp_time", "endpoint", "avg", field="latency_ms"),
        MetricDef("service_sum", "service", "sum", field="latency_ms"),
        MetricDef("instance_min", "instance", "min", field="latency_ms"),
        MetricDef("endpoint_max", "endpoint", "max", field="latency_ms", where="status == true"),
        MetricDef("endpoint_sla", "endpoint", "sla"),
        MetricDef("service_apdex", "service", "apdex", threshold_ms=500),
        MetricDef("instance_percentile", "instance", "percentile", precision_ms=10),
    ),
    (TopNDef("top_slow_statements", "service", "db_statement", 2),),
)


def _all_rows(partials: Sequence[Any]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for partial in partials:
        if isinstance(partial, MetricPartial):
            for granularity in ("minute", "hour", "day"):
                out += finalize(rollup(partial, granularity))
        else:
            out += finalize(partial)
    return out


def _aggregate_split(events: list[tuple[Any, ...]], cuts: list[int]) -> list[Any]:
    bounds = [0, *sorted(set(c % (len(events) + 1) for c in cuts)), len(events)]
    per_batch = [aggregate_batch(batch(events[a:b]), SMALL_TOPN) for a, b in zip(bounds, bounds[1:])]
    return [merge(group) for group in zip(*per_batch)]


@settings(max_examples=30, deadline=None)
@given(st.lists(event_strategy, max_size=60), st.lists(st.integers(0, 1000), max_size=5))
def test_any_split_into_batches_equals_one_batch(events: list[tuple[Any, ...]], cuts: list[int]) -> None:
    whole = _all_rows(aggregate_batch(batch(events), SMALL_TOPN))
    split = _all_rows(_aggregate_split(events, cuts))
    assert close_rows(whole, split, FLOAT_METRICS)


def _dictionary_encoded(column: pa.Array, repeat: int) -> pa.Array:
    """``column`` dictionary-encoded with each value ``repeat`` times in the dictionary (a reader's dictionaries may
    repeat values: the codes alone do not identify a value), rows spread over the copies."""
    encoded = pc.dictionary_encode(column)
    values = pa.concat_arrays([encoded.dictionary] * repeat)
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    spread = codes + len(encoded.dictionary) * (np.arange(len(codes)) % repeat)
    return pa.DictionaryArray.from_arrays(pa.array(spread, pa.int32()), values)


@settings(max_examples=40, deadline=None)
@given(st.lists(event_strategy, max_size=60), st.integers(1, 3))
def test_dictionary_encoded_text_columns_aggregate_as_plain_ones(events: list[tuple[Any, ...]], repeat: int) -> None:
    """The workers hand aggregate_batch Parquet's dictionary-encoded strings as they are read: the same partial states
    as plain strings, with dictionaries that repeat values."""
    plain = batch(events)
    columns = [
        _dictionary_encoded(plain.column(name), repeat) if name in ("service", "instance", "endpoint") else column
        for name, column in zip(plain.schema.names, plain.columns)
    ]
    encoded = pa.RecordBatch.from_arrays(columns, names=plain.schema.names)
    expected = aggregate_batch(plain, SMALL_TOPN)
    got = aggregate_batch(encoded, SMALL_TOPN)
    assert [p.table.to_pylist() for p in got] == [p.table.to_pylist() for p in expected]


@settings(max_examples=20, deadline=None)
@given(st.lists(st.lists(event_strategy, max_size=25), min_size=3, max_size=3), st.permutations([0, 1, 2]))
def test_merge_is_associative_and_commutative(groups: list[list[tuple[Any, ...]]], order: list[int]) -> None:
    parts = [aggregate_batch(batch(g), SMALL_TOPN) for g in groups]
    for a, b, c in zip(*parts):
        left = merge([merge([a, b]), c])
        right = merge([a, merge([b, c])])
        shuffled = merge([[a, b, c][i] for i in order])
        expected = _all_rows([left])
        assert close_rows(expected, _all_rows([right]), FLOAT_METRICS)
        assert close_rows(expected, _all_rows([shuffled]), FLOAT_METRICS)
        if a.name not in FLOAT_METRICS:
            assert expected == _all_rows([right]) == _all_rows([shuffled])  # exact for integer states


@settings(max_examples=20, deadline=None)
@given(st.lists(st.lists(event_strategy, max_size=25), min_size=2, max_size=3))
def test_every_partial_is_normal_so_merging_one_returns_it(groups: list[list[tuple[Any, ...]]]) -> None:
    """merge([p]) returns p unhashed, which is only right if every partial made here already has unique keys (top-N:
    sorted, n per key): aggregate_batch, merge and rollup outputs are fixed points of normalize. Rows gathered from
    several partials are not, and normalize combines them like merge does."""
    parts = [aggregate_batch(batch(g), SMALL_TOPN) for g in groups]
    for same in zip(*parts):
        merged = merge(same)
        made = [*same, merged] + [rollup(p, "hour") for p in (*same, merged) if isinstance(p, MetricPartial)]
        for p in made:
            assert merge([p]) is p
            again = normalize(p)
            assert again.table.num_rows == p.table.num_rows
            assert sorted(finalize(again)) == sorted(finalize(p))
        table, first = pa.concat_tables([p.table for p in same]), same[0]
        gathered = type(first)(table, first.granularity) if isinstance(first, MetricPartial) else type(first)(table)
        assert sorted(finalize(normalize(gathered))) == sorted(finalize(merged))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3), st.sampled_from([1.0, 2.0, 3.0, 4.5]), st.sampled_from(["a", "b", "c", "d", None])
        ),
        max_size=80,
    ),
    st.integers(1, 4),
)
def test_topn_matches_brute_force(picks: list[tuple[int, float, str | None]], n: int) -> None:
    events = [
        event(T0 + slot * 10 * MIN + i, service="s", latency=lat, db=db) for i, (slot, lat, db) in enumerate(picks)
    ]
    topn = TopNDef("t", "service", "db_statement", n)
    expected = []
    for slot in range(4):
        ranked = sorted(((-lat, db) for s, lat, db in picks if s == slot and db), key=lambda x: (x[0], x[1]))[:n]
        bucket = iso_from_ms(np.array([T0 + slot * 10 * MIN])).to_pylist()[0]
        expected += [("t", "s", bucket, rank, db, -neg) for rank, (neg, db) in enumerate(ranked, 1)]
    assert rows(topn, events) == expected


# ------------------------------------------------------------------------------------------ SQL cross-check


def _generated(n: int, seed: int) -> pa.RecordBatch:
    rng = np.random.default_rng(seed)
    services = np.array(["alpha", "beta", "gamma", "delta"], dtype=object)
    names = np.array(["", "n1", "n2", "n3", "n4"], dtype=object)
    statements = np.array(["select 1", "select 2", "update x", "insert y"], dtype=object)
    latency = np.where(rng.random(n) < 0.1, rng.integers(0, 4000, n) * 0.5, np.round(rng.exponential(300, n), 3))
    db = pa.array(statements[rng.integers(0, 4, n)], pa.string(), mask=rng.random(n) < 0.5)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(T0 - 3_600_000 * 12 + rng.integers(0, 2 * 86_400_000, n), pa.int64()),
            pa.array(services[rng.integers(0, 4, n)], pa.string()),
            pa.array(names[rng.integers(0, 5, n)], pa.string()),
            pa.array(names[rng.integers(0, 5, n)], pa.string()),
            pa.array(latency, pa.float64()),
            pa.array(rng.random(n) < 0.9),
            db,
        ],
        names=list(COLUMNS),
    )


_ENTITY = {
    "service": "service",
    "instance": "service || '/' || instance",
    "endpoint": "service || '/' || endpoint",
}
_MS = {"minute": 60_000, "hour": 3_600_000, "day": 86_400_000}


def _sql_metric(metric: MetricDef, granularity: str) -> str:
    entity = _ENTITY[metric.scope]
    bucket = f"strftime(make_timestamp((ts - ts % {_MS[granularity]}) * 1000), '%Y-%m-%dT%H:%M:%SZ')"
    where = [] if metric.scope == "service" else [f"{metric.scope} <> ''"]
    if metric.where:
        where.append(metric.where.replace("==", "="))
    source = f"SELECT *, {entity} AS entity, {bucket} AS bucket FROM events" + (
        f" WHERE {' AND '.join(where)}" if where else ""
    )
    minutes = _MS[granularity] // 60_000
    head = f"SELECT '{metric.name}', entity, '{granularity}', bucket"
    t = metric.threshold_ms or 0
    satisfied = f"count(*) FILTER (WHERE status AND latency_ms <= {t})"
    tolerating = f"count(*) FILTER (WHERE status AND latency_ms > {t} AND latency_ms <= {4 * t})"
    single = {
        "count": "count(*)::DOUBLE",
        "cpm": f"count(*) / {minutes}.0",
        "avg": "avg(latency_ms)",
        "sla": "100 * count(*) FILTER (WHERE status) / count(*)::DOUBLE",
        # (satisfied + tolerating / 2) / n rounded half-up to 4 decimals, in integers
        "apdex": f"(((2 * {satisfied} + {tolerating}) * 10000 + count(*)) // (2 * count(*))) / 10000.0",
    }
    if metric.function in single:
        return f"{head}, '', {single[metric.function]} FROM ({source}) GROUP BY ALL"
    p = metric.precision_ms
    ranked = (
        f"SELECT entity, bucket, floor(latency_ms / {p})::BIGINT AS b, row_number() OVER (PARTITION BY entity, bucket ORDER BY latency_ms) AS r, "
        f"count(*) OVER (PARTITION BY entity, bucket) AS c FROM ({source})"
    )
    return f"{head}, 'p' || p::VARCHAR, {p} * b::DOUBLE FROM ({ranked}) JOIN (SELECT unnest([50, 75, 90, 95, 99]) AS p) ON r = (p * c + 99) // 100"


def test_default_metrics_match_duckdb_sql() -> None:
    events = _generated(4000, seed=7)
    con = duckdb.connect()
    con.register("events", pa.Table.from_batches([events]))
    halves = [events.slice(0, 1500), events.slice(1500)]
    partials = [merge(group) for group in zip(*(aggregate_batch(h, DEFAULT_DEFINITIONS) for h in halves))]
    for partial in partials:
        if not isinstance(partial, MetricPartial):
            continue
        for granularity in ("minute", "hour", "day"):
            ours = finalize(rollup(partial, granularity))
            sql = sorted(con.execute(_sql_metric(partial.definition, granularity)).fetchall())
            assert len(ours) == len(sql) > 0, partial.name
            assert close_rows(ours, sql, FLOAT_METRICS), partial.name  # exact but for averages' last ulps
    topn = [p for p in partials if isinstance(p, TopNPartial)][0]
    sql = con.execute(
        "SELECT 'top_slow_statements', service, strftime(make_timestamp((ts - ts % 600000) * 1000), '%Y-%m-%dT%H:%M:%SZ') AS b, r, db_statement, latency_ms FROM ("
        "SELECT *, row_number() OVER (PARTITION BY service, ts - ts % 600000 ORDER BY latency_ms DESC, db_statement) AS r "
        "FROM events WHERE db_statement IS NOT NULL AND db_statement <> '') WHERE r <= 10 ORDER BY ALL"
    ).fetchall()
    assert finalize(topn) == sorted(sql)
