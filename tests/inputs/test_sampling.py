"""Sampled spans' adjusted counts: the trace-state parser against the OpenTelemetry Collector's own (a recorded table),
the rounding of non-power-of-two counts (whole, repeatable, unbiased), weighted batches through the log encoding and
joins, and the property that matters: a batch whose rows carry weights aggregates (every function, percentiles and
apdex included, and the live RED series) exactly as the batch with each row repeated weight times."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe.inputs import EVENT_SCHEMA, WEIGHT_MAX, EventBatch
from drainpipe.inputs.sampling import MALFORMED, OUT_OF_RANGE, adjusted_counts, parse_trace_state
from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS, Definitions, MetricDef
from drainpipe.pipeline.values import finalize
from drainpipe.server.red import RedMetrics
from testlib import event_batch

WHOLE = 1 << 56  # the threshold's scale: probability = (WHOLE - threshold) / WHOLE
TABLE = Path(__file__).parent.parent / "fixtures" / "tracestates" / "connector-v0.165.1.jsonl"


def test_the_parser_counts_as_the_collector_s_connector_does() -> None:
    """720 trace states (a stratified sample of 63,000 generated ones: refused, without a threshold, power-of-two and
    other thresholds) with the answers of the Collector's parser (``oracle.go`` beside the table)."""
    kinds = set()
    for line in TABLE.read_text().splitlines():
        case = json.loads(line)
        text, got = case["in"], parse_trace_state(case["in"])
        if "ot=" not in text:  # the connector counts 1 without parsing
            want: object = None
        elif case.get("err"):
            want = MALFORMED
        elif "denominator" in case:
            d = int(case["denominator"])
            q, r = divmod(WHOLE, d)
            want = OUT_OF_RANGE if q + (r > 0) > WEIGHT_MAX else (q, (r << 56) // d)
        else:
            want = None
        kinds.add(want if not isinstance(want, tuple) else ("whole" if want[1] == 0 else "fraction"))
        assert got == want, text
    assert kinds == {None, MALFORMED, OUT_OF_RANGE, "whole", "fraction"}


def _ids(n: int, seed: int = 1) -> pa.Array:
    rng = np.random.default_rng(seed)
    return pa.array([rng.bytes(8) for _ in range(n)], pa.binary())


def test_power_of_two_thresholds_count_whole_and_bad_ones_count_one_with_a_warning() -> None:
    states = pa.array(["ot=th:8", "ot=th:c", "", None, "ot=th:zz", "vendor=a,ot=th:0", "ot=th:ffffffffffffff",
                       "ot=rv:0123456789abcd", "ot=th:fffffff"])  # fmt: skip
    weights, warnings = adjusted_counts(states, _ids(len(states)), np.arange(len(states)))
    assert weights is not None and weights.tolist() == [2, 4, 1, 1, 1, 1, 1, 1, 1 << 28]
    assert warnings == {MALFORMED: 1, OUT_OF_RANGE: 1}
    # only the rows asked for are counted (exit rows are not requests)
    weights, warnings = adjusted_counts(states, _ids(len(states)), np.array([2, 4]))
    assert weights is None and warnings == {MALFORMED: 1}
    assert adjusted_counts(pa.array(["", ""]), _ids(2), np.arange(2)) == (None, {})


def test_other_thresholds_round_to_a_neighbour_the_same_way_every_time_and_without_bias() -> None:
    n = 40_000
    ids = _ids(n, seed=5)
    states = pa.array(["ot=th:5555"] * n)  # p = 1 - 0x5555/0x10000: 1/p = 1.49998...
    weights, _ = adjusted_counts(states, ids, np.arange(n))
    assert weights is not None and set(weights.tolist()) == {1, 2}
    again, _ = adjusted_counts(states, ids, np.arange(n))
    assert (again == weights).all()  # drawn from the span ids: a replay counts the same
    exact = WHOLE / (WHOLE - (0x5555 << 40))
    assert abs(weights.mean() - exact) < 6 * 0.5 / np.sqrt(n)  # six standard errors
    # span ids from a counter (some tracers) round without bias too: the ids are mixed first
    counter = pa.array([i.to_bytes(8, "big") for i in range(n)], pa.binary())
    weights, _ = adjusted_counts(states, counter, np.arange(n))
    assert weights is not None and abs(weights.mean() - exact) < 6 * 0.5 / np.sqrt(n)


# ---------------------------------------------------------------------------------------------- weighted batches

BASE = 1_790_000_000_000
EVERY_FUNCTION = Definitions(
    (
        *DEFAULT_DEFINITIONS.metrics,
        MetricDef("s_sum", "service", "sum", field="latency_ms"),
        MetricDef("s_min", "service", "min", field="latency_ms"),
        MetricDef("s_max", "endpoint", "max", field="latency_ms"),
        MetricDef("e_pct", "endpoint", "percentile", precision_ms=5),
    )
)

events = st.lists(
    st.tuples(
        st.integers(0, 2),  # minute
        st.integers(0, 2),  # service
        st.integers(0, 3),  # endpoint
        st.sampled_from([0.0, 1.0, 5.0, 12.5, 99.0, 250.0, 500.0, 1000.0, 4000.0]),  # latency (on bounds too)
        st.booleans(),  # ok
        st.integers(1, 9),  # weight
    ),
    min_size=1,
    max_size=60,
)


def _rows(spec: list[tuple]) -> pa.RecordBatch:
    return event_batch({"ts": BASE + m * 60_000 + 7, "service": f"s{s}", "instance": f"i{s}", "endpoint": f"/e{e}",
                        "latency_ms": lat, "status": ok} for m, s, e, lat, ok, _ in spec)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(events, st.integers(0, 3))
def test_a_weighted_batch_aggregates_as_its_rows_repeated(spec, cut) -> None:
    """The reference for weighted percentiles, apdex, sla, sums and counts: each row repeated weight times. Split
    in two (one part weighted, the other not) and joined, the batch still counts the same."""
    weights = np.array([w for *_, w in spec], np.int64)
    weighted = EventBatch.of(_rows(spec)).with_weights(weights)
    repeated = EventBatch.of(_rows([row for row in spec for _ in range(row[-1])]))
    cut = min(cut, len(spec))
    joined = EventBatch.join([EventBatch.of(_rows(spec[:cut])).with_weights(weights[:cut]),
                              EventBatch.of(_rows(spec[cut:]))])  # fmt: skip
    want = [sorted(finalize(p)) for p in aggregate_batch(repeated, EVERY_FUNCTION)]
    for batch in (weighted, EventBatch.decode(weighted.encode())):
        got = [sorted(finalize(p)) for p in aggregate_batch(batch, EVERY_FUNCTION)]
        assert _close(got, want)
    if cut == len(spec) or all(row[-1] == 1 for row in spec[cut:]):
        return
    # the unweighted part of the join weighs 1 per row, not its spec's weights
    unweighted_rest = [row for row in spec[:cut] for _ in range(row[-1])] + [(*row[:-1], 1) for row in spec[cut:]]
    want = [sorted(finalize(p)) for p in aggregate_batch(EventBatch.of(_rows(unweighted_rest)), EVERY_FUNCTION)]
    assert _close([sorted(finalize(p)) for p in aggregate_batch(joined, EVERY_FUNCTION)], want)


def _close(got: list[list[tuple]], want: list[list[tuple]]) -> bool:
    """Equal rows; a value may differ in its last bits (a weighted sum adds in another order)."""
    return len(got) == len(want) and all(
        len(a) == len(b) and all(x[:-1] == y[:-1] and x[-1] == pytest.approx(y[-1], rel=1e-12) for x, y in zip(a, b))
        for a, b in zip(got, want)
    )


@settings(max_examples=30, deadline=None)
@given(events)
def test_the_live_red_series_count_a_weighted_batch_as_its_rows_repeated(spec) -> None:
    bounds = [1.0, 12.5, 250.0, 1000.0]
    weighted, repeated = RedMetrics(bounds, 100), RedMetrics(bounds, 100)
    weighted.observe(EventBatch.of(_rows(spec)).with_weights(np.array([w for *_, w in spec], np.int64)))
    repeated.observe(EventBatch.of(_rows([row for row in spec for _ in range(row[-1])])))
    got, want = list(weighted.collect()), list(repeated.collect())
    assert [len(m.samples) for m in got] == [len(m.samples) for m in want]
    for g, w in zip(got, want):
        for a, b in zip(g.samples, w.samples):
            assert (a.name, a.labels) == (b.name, b.labels) and a.value == pytest.approx(b.value, rel=1e-12)


def test_weights_survive_the_encoding_and_a_join_with_unweighted_batches_and_exit_rows() -> None:
    rows = _rows([(0, 0, 0, 5.0, True, 1), (0, 1, 1, 7.0, False, 1)])
    exits = pa.RecordBatch.from_pylist([{"ts": BASE, "service": "s0", "instance": "", "endpoint": "",
                                         "latency_ms": 3.0, "status": True, "db_statement": "SELECT 1"}],
                                       schema=EVENT_SCHEMA)  # fmt: skip
    sampled = EventBatch.with_exits(rows, exits).with_weights(np.array([4, 2, 1], np.int64))
    sampled = EventBatch(sampled.rows, sampled.requests, ((MALFORMED, 1),))
    back = EventBatch.decode(sampled.encode())
    assert back.requests == 2 and back.weights().tolist() == [4, 2, 1]  # type: ignore[union-attr]
    plain = EventBatch.of(rows)
    assert EventBatch.decode(plain.encode()).weights() is None  # (unsampled: the encoding as it always was)
    joined = EventBatch.join([plain, sampled, EventBatch(plain.rows, 2, ((MALFORMED, 2),))])
    assert joined.requests == 6 and joined.weights().tolist() == [1, 1, 4, 2, 1, 1, 1]  # type: ignore[union-attr]
    assert joined.rows.column("db_statement").to_pylist()[-1] == "SELECT 1"  # exit rows last
    assert dict(joined.warnings) == {MALFORMED: 3}


def test_a_decoded_batch_is_encoded_as_the_bytes_it_came_from() -> None:
    """A batch that crossed a process boundary and goes on (a parser's batch into the serve log) is not encoded a
    second time: its encoding is the very bytes it was read from, for each form of the encoding; a batch made from
    it (a column added, a join) encodes its own rows, and pickling leaves the bytes behind."""
    import dataclasses
    import pickle

    rows = _rows([(0, 0, 0, 5.0, True, 1), (0, 1, 1, 7.0, False, 1)])
    exits = pa.RecordBatch.from_pylist([{"ts": BASE, "service": "s0", "instance": "", "endpoint": "",
                                         "latency_ms": 3.0, "status": True, "db_statement": "SELECT 1"}],
                                       schema=EVENT_SCHEMA)  # fmt: skip
    plain = EventBatch.of(rows)
    with_exits = EventBatch.with_exits(rows, exits)
    weighted = with_exits.with_weights(np.array([4, 2, 1], np.int64))
    for batch in (plain, with_exits, weighted):
        payload = bytes(batch.encode())
        back = EventBatch.decode(payload)
        assert back == batch and back.encode().obj is payload
        assert bytes(back.with_weights(np.array([3] * back.num_rows, np.int64)).encode()) != payload
        assert EventBatch.decode(EventBatch.join([back, back]).encode()).num_rows == 2 * batch.num_rows
        again = pickle.loads(pickle.dumps(back))
        assert again == batch and again.encoding is None and bytes(again.encode()) == payload
        warned = EventBatch.decode(payload, ((MALFORMED, 1),))
        assert warned.warnings == ((MALFORMED, 1),) and warned.encode().obj is payload
        assert dataclasses.replace(warned, warnings=()).encoding is None  # (a batch made from it: its own bytes)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=8, max_size=8), min_size=3, max_size=12), st.integers(1, 2))
def test_span_ids_are_read_where_the_rows_are(raw: list[bytes], offset: int) -> None:
    """A sliced id column (an offset into its buffers) gives each row its own id: the counts of a slice are the
    whole column's counts from the offset on. (None stands for all ones; whether any id of a draw counts 2 is up
    to the ids, so the test asks for equality, never for a 2: a random draw of six ids is all ones once in 64.)"""
    ids = pa.array(raw, pa.binary())
    states = pa.array(["ot=th:5555"] * len(raw))

    def counts(states: pa.Array, ids: pa.Array) -> list[int]:
        weights, _ = adjusted_counts(states, ids, np.arange(len(ids)))
        return [1] * len(ids) if weights is None else weights.tolist()

    whole = counts(states, ids)
    assert set(whole) <= {1, 2}
    assert counts(states.slice(offset), ids.slice(offset)) == whole[offset:]


def test_a_threshold_of_two_thirds_counts_some_spans_twice() -> None:
    """``th:5555`` keeps two spans in three: each counts 1 or 2, by its id, about half each (fixed ids, so that the
    expectation does not depend on a draw)."""
    ids = pa.array([i.to_bytes(8, "big") for i in range(0, 1 << 64, (1 << 64) // 200)][:200], pa.binary())
    weights, _ = adjusted_counts(pa.array(["ot=th:5555"] * len(ids)), ids, np.arange(len(ids)))
    assert weights is not None and set(weights.tolist()) == {1, 2}
    assert 60 <= int((weights == 2).sum()) <= 140
