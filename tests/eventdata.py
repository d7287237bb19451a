"""Test event batches shared by the store suites (DuckDB and PostgreSQL run the same cases on the same data)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS, Definitions
from drainpipe.pipeline.functions import aggregate_batch
from drainpipe.pipeline.store import MergeReport, Store

T0 = 1_795_255_200_000  # 2026-11-21T10:00:00Z
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
