"""Shared test factories: the times tests start from, event batches (the store suites run DuckDB and PostgreSQL on
the same data), and waiting for a condition. One home, so that no test file defines its own."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS, Definitions
from drainpipe.pipeline.store import MergeReport, Store, open_store

T0 = 1_795_255_200_000  # 2026-11-21T10:00:00Z
MIDNIGHT = 1_790_035_200_000  # 2026-09-22T00:00:00Z: a day boundary, for bucket and retention edges
COLUMNS = ("ts", "service", "instance", "endpoint", "latency_ms", "status", "db_statement")
AVG_METRICS = {"service_resp_time", "instance_resp_time", "endpoint_resp_time"}


def store_events(n: int, seed: int) -> pa.RecordBatch:
    """Events over ~2 days (so minute, hour and day buckets all have several keys), with empty instance/endpoint
    values and null statements mixed in."""
    rng = np.random.default_rng(seed)
    services = np.array(["alpha", "beta", "gamma"], dtype=object)
    names = np.array(["", "a", "b", "c"], dtype=object)
    statements = np.array(["select 1", "select 2", "update t"], dtype=object)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(T0 - 3_600_000 * 20 + rng.integers(0, 2 * 86_400_000, n), pa.int64()),
            pa.array(services[rng.integers(0, 3, n)], pa.string()),
            pa.array(names[rng.integers(0, 4, n)], pa.string()),
            pa.array(names[rng.integers(0, 4, n)], pa.string()),
            pa.array(np.round(rng.exponential(400, n), 2), pa.float64()),
            pa.array(rng.random(n) < 0.9),
            pa.array(statements[rng.integers(0, 3, n)], pa.string(), mask=rng.random(n) < 0.5),
        ],
        names=list(COLUMNS),
    )


def metric_chunks(first: int, n: int, minutes: int, definitions: Definitions = DEFAULT_DEFINITIONS) -> list:
    """The metric partials of ``n`` events, each its own endpoint (``/u/<first + i>``) of service ``api``, spread
    over ``minutes`` minutes from T0: output rows that grow with the input, as a large Spark job's do."""
    from drainpipe.inputs import EVENT_SCHEMA

    i = np.arange(first, first + n)
    batch = pa.table({"ts": T0 + (i % minutes) * 60_000, "service": ["api"] * n, "instance": [""] * n,
                      "endpoint": [f"/u/{j}" for j in i], "latency_ms": (i % 900) + 0.5, "status": np.ones(n, bool),
                      "db_statement": pa.nulls(n, pa.string())}, schema=EVENT_SCHEMA)  # fmt: skip
    metrics = {d.name for d in definitions.metrics}
    return [p for p in aggregate_batch(batch, definitions) if p.name in metrics]


def ingest(
    store: Store, events: pa.RecordBatch, source: str | None, definitions: Definitions = DEFAULT_DEFINITIONS
) -> MergeReport:
    """Aggregate one batch and merge it into ``store`` (one transaction)."""
    return store.merge(aggregate_batch(events, definitions, source=source))


def same_values(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> bool:
    """Equal rows; averages (float sums) may differ in the last ulps with the order of additions."""
    return len(a) == len(b) and all(
        x[:5] == y[:5] and (x[5] == y[5] or (x[0] in AVG_METRICS and math.isclose(x[5], y[5], rel_tol=1e-9)))
        for x, y in zip(a, b)
    )


#: functions whose values are float sums: the only ones allowed to differ, in the last ulps
FLOAT_SUM_FUNCTIONS = frozenset({"sum", "avg"})


def stored(store_url: str, definitions: Definitions) -> tuple[list[tuple], dict[str, list[tuple]]]:
    """Every metric value row and every top-N's rows of a store."""
    store = open_store(store_url)
    try:
        return store.query(), {t.name: store.query_topn(t.name) for t in definitions.topns}
    finally:
        store.close()


def assert_same_results(expected_url: str, actual_url: str, definitions: Definitions) -> int:
    """Row for row equality of two stores: keys and labels exactly, values exactly except float sums
    (``sum``/``avg``), which may differ by a few ulps (relative 1e-12) because the additions happen in
    another order. Returns the number of values that differ at all."""
    expected_rows, expected_topn = stored(expected_url, definitions)
    actual_rows, actual_topn = stored(actual_url, definitions)
    assert expected_rows, "the reference store is empty"
    assert len(actual_rows) == len(expected_rows)
    functions = {m.name: m.function for m in definitions.metrics}
    inexact = 0
    for want, got in zip(expected_rows, actual_rows):
        assert got[:5] == want[:5]
        if got[5] != want[5]:
            inexact += 1
            assert functions[want[0]] in FLOAT_SUM_FUNCTIONS, (want, got)
            assert math.isclose(got[5], want[5], rel_tol=1e-12, abs_tol=0.0), (want, got)
    assert actual_topn == expected_topn
    return inexact


def wait_until(pred: Callable[[], Any], timeout: float = 5.0, interval: float = 0.002) -> Any:
    """Poll ``pred`` (for state that has no event of its own: stats, a page, a store) until it returns something
    true, and return that; :class:`AssertionError` with the last value after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s; last value {last!r}")
        time.sleep(interval)
