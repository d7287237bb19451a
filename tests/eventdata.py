"""Test event batches shared by the store suites (DuckDB and PostgreSQL run the same cases on the same data)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

T0 = 1_795_255_200_000  # 2026-11-21T10:00:00Z
COLUMNS = ("ts", "service", "instance", "endpoint", "latency_ms", "status", "db_statement")


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
