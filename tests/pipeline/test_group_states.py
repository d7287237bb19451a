"""The C aggregation kernel (``native/_groupstates.c``) against the numpy path it replaces where it is not built or
is off (``native.disabled("groupstates")``).

Both must give the same partial states bit for bit: the same groups in the same order, the same counts, sums,
extremes and histogram bins, for every function, scope, filter and weighting, with plain and dictionary-encoded
strings. A Spark executor unlike the build runs the numpy path and the local engine the kernel, and the two engines
are held to identical results elsewhere; this test is where a difference would show first."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe import native
from drainpipe.inputs import WEIGHT, EventBatch
from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS, Definitions, MetricDef, TopNDef

if native.groupstates is None:
    pytest.skip("the aggregation kernel is not built", allow_module_level=True)
_groupstates = native.groupstates

T0 = 1_790_000_000_000
DEFINITIONS = Definitions(
    (
        *DEFAULT_DEFINITIONS.metrics,
        MetricDef("instance_count_slow", "instance", "count", where="latency_ms >= 10"),
        MetricDef("endpoint_sum", "endpoint", "sum", field="latency_ms"),
        MetricDef("endpoint_ts_sum", "endpoint", "sum", field="ts"),
        MetricDef("instance_min", "instance", "min", field="latency_ms"),
        MetricDef("endpoint_max_ok", "endpoint", "max", field="latency_ms", where="status == true"),
        MetricDef("service_min_ts", "service", "min", field="ts"),
        MetricDef("endpoint_apdex_tiny", "endpoint", "apdex", threshold_ms=0.5, where='service != "b"'),
        MetricDef("service_percentile_fine", "service", "percentile", precision_ms=0.001),
        MetricDef("endpoint_percentile_coarse", "endpoint", "percentile", precision_ms=1000),
    ),
    (TopNDef("top_slow_statements", "service", "db_statement", 2),),
)

# times: mostly within a few minutes, some far apart (the kernel's groups then hash instead of a dense table), some
# before 1970 (floor division of negative times)
_ts = st.one_of(
    st.integers(T0, T0 + 5 * 60_000),
    st.integers(-62_135_596_800_000, 253_402_300_799_999),
    st.integers(-120_001, 120_001),
)
_latency = st.one_of(
    st.sampled_from([0.0, -0.0, 0.5, 2.0, 499.999, 500.0, 500.001, 2000.0, 2000.5, 1e12]),
    st.floats(0, 1e12, allow_nan=False, allow_infinity=False),
)
_event = st.tuples(
    _ts,
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(["", "", "i1", "i2"]),
    st.sampled_from(["", "/x", "/y", "/z/{id}"]),
    _latency,
    st.booleans(),
    st.sampled_from([None, None, "SELECT 1", "SELECT 2"]),
    st.sampled_from([None, 0, 1, 1, 3, 1 << 32]),
)


def _batch(events: list[tuple[Any, ...]], encoded: bool, weighted: bool) -> EventBatch:
    columns = list(zip(*events)) if events else [[] for _ in range(8)]
    arrays: list[pa.Array] = [
        pa.array(columns[0], pa.int64()),
        *(pa.array(c, pa.string()) for c in columns[1:4]),
        pa.array(columns[4], pa.float64()),
        pa.array(columns[5], pa.bool_()),
        pa.array(columns[6], pa.string()),
    ]
    names = ["ts", "service", "instance", "endpoint", "latency_ms", "status", "db_statement"]
    if encoded:  # as the C scanners and Parquet give them
        arrays[1:4] = [pc.dictionary_encode(a) for a in arrays[1:4]]
    if weighted:
        arrays.append(pa.array([1 if w is None else w for w in columns[7]], pa.int64()))
        names.append(WEIGHT)
    return EventBatch.of(pa.RecordBatch.from_arrays(arrays, names=names))


def _tables(batch: EventBatch, kernel: bool) -> list[pa.Table]:
    with native.disabled(*(() if kernel else ("groupstates",))):
        return [p.table for p in aggregate_batch(batch, DEFINITIONS)]


@settings(max_examples=150, deadline=None)
@given(st.lists(_event, max_size=80), st.booleans(), st.booleans())
def test_the_kernel_gives_the_numpy_paths_states_bit_for_bit(events: list[tuple[Any, ...]], encoded: bool,
                                                             weighted: bool) -> None:  # fmt: skip
    batch = _batch(events, encoded, weighted)
    expected = _tables(batch, False)
    got = _tables(batch, True)
    for definition, want, have in zip(DEFINITIONS.all, expected, got):
        assert have.schema == want.schema, definition.name
        for name in want.schema.names:  # bit for bit: -0.0 is not 0.0 here
            a, b = want.column(name).to_pylist(), have.column(name).to_pylist()
            if pa.types.is_floating(want.schema.field(name).type):
                a, b = [np.float64(x).tobytes() for x in a], [np.float64(x).tobytes() for x in b]
            assert a == b, (definition.name, name)


def test_a_batch_in_time_order_takes_the_dense_table_and_one_spread_over_centuries_the_hash() -> None:
    rng = np.random.default_rng(3)
    n = 5000
    services = rng.integers(0, 3, n).astype(np.int32)
    subs = rng.integers(0, 5, n).astype(np.int32)
    for ts in (T0 + np.sort(rng.integers(0, 600_000, n)), rng.integers(-(10**13), 10**13, n)):
        gid, first = (np.frombuffer(b, np.int64) for b in _groupstates.groups(services, subs, 2, ts, 60_000))
        keys = np.stack([services, subs, np.floor_divide(ts, 60_000)], axis=1)
        counted = subs != 2
        distinct = np.unique(keys[counted], axis=0)  # sorted: the ids' order
        assert (gid[~counted] == -1).all()
        assert len(first) == len(distinct)
        assert (keys[first] == distinct).all()
        lookup = {tuple(k): i for i, k in enumerate(distinct.tolist())}
        assert gid[counted].tolist() == [lookup[tuple(k)] for k in keys[counted].tolist()]


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(("groups", "precision"), [(3000, 10.0), (20, 0.1)])
def test_many_groups_over_many_bins_are_counted_group_by_group_as_numpy_counts_them(
    weighted: bool, groups: int, precision: float
) -> None:
    """Groups x bins beyond the dense table (~3,000 endpoint minutes x 600 bins, a few bins each; 20 groups x
    60,000 bins, hundreds each, in any order): the kernel counts group by group, and gives numpy's (group, bin, n)
    exactly, in order."""
    rng = np.random.default_rng(11)
    n = 8000
    gid = rng.integers(-1, groups, n).astype(np.int64)  # (-1: a row the metric does not count)
    latency = rng.gamma(2.0, 400.0, n).clip(0, 5990)
    weights = rng.integers(1, 1 << 20, n).astype(np.float64) if weighted else None
    bins = latency.max() // precision + 1
    assert groups * bins > max(65536, 4 * n) >= bins  # beyond the dense table, within a row of counters
    got = _groupstates.histogram(gid, groups, latency, weights, precision)
    assert got is not None
    group, b, count = (np.frombuffer(a, np.int64) for a in got)
    rows = gid >= 0
    keys = gid[rows] * 100_000 + np.floor(latency[rows] / precision).astype(np.int64)
    distinct, inverse = np.unique(keys, return_inverse=True)
    want = np.bincount(inverse, weights=None if weights is None else weights[rows]).astype(np.int64)
    assert group.tolist() == (distinct // 100_000).tolist() and b.tolist() == (distinct % 100_000).tolist()
    assert count.tolist() == want.tolist()


def test_the_kernel_refuses_arrays_that_do_not_fit_in_one_line() -> None:
    gid = np.array([0, 1, 2], np.int64)
    values = np.ones(3)
    with pytest.raises(ValueError, match="not below size"):
        _groupstates.states(_groupstates.COUNT, gid, 2, None, None, None, 0.0)
    with pytest.raises(ValueError, match="expected 24 bytes"):
        _groupstates.states(_groupstates.SUM, gid, 3, np.ones(2), None, None, 0.0)
    with pytest.raises(ValueError, match="needs values and status"):
        _groupstates.states(_groupstates.SLA, gid, 3, values, None, None, 0.0)
    with pytest.raises(ValueError, match="not below size"):
        _groupstates.histogram(gid, 1, values, None, 1.0)
    with pytest.raises(ValueError, match="precision"):
        _groupstates.histogram(gid, 3, values, None, 0.0)
    with pytest.raises(ValueError, match="negative code"):
        _groupstates.groups(np.array([-1], np.int32), None, -1, np.zeros(1, np.int64), 60_000)
    with pytest.raises(ValueError, match="int32"):
        _groupstates.groups(np.zeros(3, np.int8), None, -1, np.zeros(3, np.int64), 60_000)


@pytest.mark.parametrize("latencies", [[0.0, -0.0], [-0.0, 0.0], [0.0, -0.0, 0.0], [1.0, -0.0, 0.0, -0.0]])
def test_ties_of_signed_zeros_keep_the_row_numpy_keeps(latencies: list[float]) -> None:
    """numpy's minimum and maximum take the later of two equal values, so 0.0 then -0.0 is -0.0: a kernel that keeps
    the first would store another bit pattern for the same minimum."""
    events = [(T0, "a", "i1", "/x", latency, True, None, None) for latency in latencies]
    batch = _batch(events, False, False)
    expected, got = _tables(batch, False), _tables(batch, True)
    for definition, want, have in zip(DEFINITIONS.all, expected, got):
        if definition.name in ("instance_min", "endpoint_max_ok"):
            bits = [np.float64(v).tobytes() for v in want.column("v").to_pylist()]
            assert [np.float64(v).tobytes() for v in have.column("v").to_pylist()] == bits, definition.name
