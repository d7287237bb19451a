"""The RED metrics' counting (drainpipe.server.red) against a plain per-event reference: calls per (service, endpoint,
status), histogram buckets with Prometheus' ``le`` semantics, latency sums, and the series bound with its overflow."""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from drainpipe.inputs import EventBatch
from drainpipe.pipeline import aggregate_batch, default_definitions
from drainpipe.server.red import RedMetrics, distinct_codes
from testlib import event_batch

BOUNDS = (5.0, 10.0, 50.0, 100.0)
DEFINITIONS = default_definitions()
OVER = "__overflow__"

event = st.tuples(
    st.sampled_from(["a", "b", "c", "d"]),
    st.sampled_from(["/x", "/y", ""]),
    st.sampled_from([0.0, 1.5, 5.0, 7.0, 10.0, 10.5, 50.0, 99.0, 100.0, 250.0]),
    st.booleans(),
)


def batch(events: list[tuple[str, str, float, bool]], exits: int = 0) -> EventBatch:
    rows = [{"ts": 0, "service": s, "endpoint": e, "latency_ms": lat, "status": ok} for s, e, lat, ok in events]
    # statement rows of CLIENT spans follow the requests, as the inputs give them
    rows += [{"ts": 0, "service": "a", "endpoint": "/x", "latency_ms": 1.0, "db_statement": "select"}] * exits
    return EventBatch(event_batch(rows), len(events))


def scrape(red: RedMetrics) -> dict[tuple, float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(red)
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(event, max_size=40), max_size=6), st.integers(1, 9), st.booleans())
def test_counts_equal_a_per_event_reference(batches: list[list], max_series: int, aggregated: bool) -> None:
    """Observed alone, or with the request columns an aggregation of the batch made (as the engine observes)."""
    red = RedMetrics(BOUNDS, max_series)
    kept: list[tuple[str, str]] = []
    calls: Counter = Counter()
    hist: dict[tuple, list[int]] = defaultdict(lambda: [0] * (len(BOUNDS) + 1))
    sums: Counter = Counter()
    overflow = 0
    for events in batches:
        b = batch(events, exits=len(events) % 3)
        if aggregated:
            aggregate_batch(b, DEFINITIONS, lambda columns, b=b: red.observe(b, columns))
        else:
            red.observe(b)
        for s, e, lat, ok in events:  # the reference, event by event: first come, first kept
            if (s, e) not in kept and len(kept) < max_series:
                kept.append((s, e))
            key = (s, e) if (s, e) in kept else (OVER, OVER)
            overflow += key == (OVER, OVER)
            calls[(*key, "ok" if ok else "error")] += 1
            hist[key][bisect.bisect_left(BOUNDS, lat)] += 1
            sums[key] += lat
    got = scrape(red)
    for (s, e, status), n in calls.items():
        labels = (("endpoint", e), ("service", s), ("status", status))
        assert got[("drainpipe_calls_total", labels)] == n
    assert sum(v for (name, _), v in got.items() if name == "drainpipe_calls_total") == sum(calls.values())
    for (s, e), counts in hist.items():
        cumulative = 0
        for le, c in zip([*(str(b / 1000) for b in BOUNDS), "+Inf"], counts):
            cumulative += c
            assert got[("drainpipe_call_duration_seconds_bucket", (("endpoint", e), ("le", le), ("service", s)))] == (
                cumulative
            )
        labels = (("endpoint", e), ("service", s))
        assert got[("drainpipe_call_duration_seconds_count", labels)] == sum(counts)
        assert abs(got[("drainpipe_call_duration_seconds_sum", labels)] - sums[(s, e)] / 1000) < 1e-9
    assert got[("drainpipe_calls_overflow_total", ())] == overflow
    assert red.series <= max_series + 1


def test_series_stay_bounded_under_100k_distinct_endpoints() -> None:
    red = RedMetrics(BOUNDS, 1000)
    for chunk in range(10):
        red.observe(batch([("api", f"/u/{chunk * 10_000 + i}", 12.0, True) for i in range(10_000)]))
    assert red.series == 1001
    got = scrape(red)
    assert got[("drainpipe_calls_overflow_total", ())] == 99_000
    assert got[("drainpipe_calls_total", (("endpoint", OVER), ("service", OVER), ("status", "ok")))] == 99_000
    assert sum(v for (name, _), v in got.items() if name == "drainpipe_calls_total") == 100_000


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=200), st.sampled_from([301, 1 << 20]))
def test_distinct_codes_are_numpys_unique(codes: list[int], space: int) -> None:
    """Counted (a small code space) or sorted (a large one), the series of a batch are numpy's unique ones: the
    distinct codes, each one's first row (which orders the admission of new series), each row's index."""
    array = np.array(codes, np.int64)
    got = distinct_codes(array, space)
    want = np.unique(array, return_index=True, return_inverse=True)
    for g, w in zip(got, want, strict=True):
        assert g.tolist() == w.tolist()
