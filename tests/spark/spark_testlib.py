"""Helpers of the Spark tests: skewed inputs with bad records, the local reference, exact comparison."""

from __future__ import annotations

import gzip
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from drainpipe.pipeline.definitions import Definitions
from drainpipe.pipeline.generator import generate_events, write_events
from testlib import FLOAT_SUM_FUNCTIONS, assert_same_results, stored  # noqa: F401  (re-exported)

BAD_JSON_LINES = [
    b'{"ts": 1795255200000, "service": "", "latency_ms": 3}',  # bad value: service
    b"not json at all",  # invalid JSON
    b'{"ts": "2026-11-21T10:00:00Z", "service": "x", "latency_ms": -1}',  # out of range: latency_ms
    b"[1, 2, 3]",  # not an object
    b'{"ts": 1795255200000, "service": "x", "latency_ms": "7"}',  # bad type: latency_ms
    b'{"ts": 1795255200000, "service": "x", "latency_ms": 1, "status": "yes"}',  # bad value: status
    b'{"ts": 1795255200000, "service": "caf\xe9", "latency_ms": 1}',  # not UTF-8
    b'{"service": "x", "latency_ms": 1}',  # missing field: ts
    b'{"ts": 1795255200000, "service": "x", "latency_ms": NaN}',  # invalid JSON
]


def skewed_inputs(directory: Path, events: int = 40_000, seed: int = 11) -> list[str]:
    """JSON Lines (with bad lines, blank lines and a CRLF line), gzipped CSV (with a bad row) and Parquet
    (with bad rows) of a Zipf(1.3)-skewed workload; returns the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    common = dict(services=12, endpoints_per_service=6, instances_per_service=3, skew=1.3, duration_s=5400)
    jsonl = directory / "events.jsonl"
    write_events(generate_events(events, seed=seed, **common), jsonl)
    lines = jsonl.read_bytes().splitlines(keepends=True)
    step = max(1, len(lines) // (len(BAD_JSON_LINES) + 1))
    for i, bad in enumerate(BAD_JSON_LINES):
        lines.insert((i + 1) * step, bad + b"\n")
    lines.insert(7, b"\n")
    lines.insert(3 * step + 5, b"   \n")
    lines[11] = lines[11].rstrip(b"\n") + b"\r\n"
    jsonl.write_bytes(b"".join(lines))

    csv_path = directory / "events.csv.gz"
    write_events(generate_events(events // 8, seed=seed + 1, **common), directory / "plain.csv")
    text = (directory / "plain.csv").read_bytes().splitlines(keepends=True)
    text.insert(5, b"1795255200000,svc-00,,,-5,true,\n")  # out of range: latency_ms
    with gzip.open(csv_path, "wb") as f:
        f.write(b"".join(text))
    os.remove(directory / "plain.csv")

    parquet_path = directory / "events.parquet"
    table = pa.Table.from_batches(list(generate_events(events // 4, seed=seed + 2, **common)))
    schema = pa.schema([f.with_nullable(True) for f in table.schema])
    table = table.cast(schema)
    bad = pa.table(
        {
            "ts": pa.array([1_795_255_200_000, 1_795_255_260_000], pa.int64()),
            "service": pa.array(["svc-01", None], pa.string()),
            "instance": pa.array(["", ""], pa.string()),
            "endpoint": pa.array(["", ""], pa.string()),
            "latency_ms": pa.array([-3.0, 4.0], pa.float64()),
            "status": pa.array([True, True]),
            "db_statement": pa.array([None, None], pa.string()),
        },
        schema=schema,
    )
    pq.write_table(pa.concat_tables([table.slice(0, 100), bad, table.slice(100)]), parquet_path, row_group_size=2_000)
    return [str(jsonl), str(csv_path), str(parquet_path)]


def local_reference(paths: Sequence[str], definitions: Definitions, store_url: str, dead_letter: str) -> dict[str, Any]:
    """The local engine over ``paths`` (``drainpipe.pipeline.run.run_local``): counts of its summary."""
    from drainpipe.pipeline.run import run_local

    summary = run_local(list(paths), definitions=definitions, store_url=store_url, dead_letter=dead_letter)
    assert summary.dropped == 0
    return {"read": summary.read, "accepted": summary.accepted, "rejected": summary.rejected}


def _spark_unavailable() -> str | None:
    from drainpipe.errors import SparkSetupError
    from drainpipe.spark import check_java, check_pyspark

    try:
        check_pyspark()
        check_java()
    except SparkSetupError as exc:  # pragma: no cover - depends on the machine
        return str(exc)
    return None


_REASON = _spark_unavailable()
#: every Spark test module: ``pytestmark = SPARK``
SPARK = [
    pytest.mark.spark,
    pytest.mark.skipif(_REASON is not None, reason=f"Spark unavailable: {_REASON}"),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


def assert_same_partials(expected: Sequence[Any], actual: Sequence[Any]) -> None:
    """Finalized rows of two lists of partials (one per definition) equal; float sums up to 1e-12 relative."""
    from drainpipe.pipeline.values import finalize

    assert len(expected) == len(actual)
    for want_partial, got_partial in zip(expected, actual):
        float_sum = getattr(want_partial.definition, "function", None) in FLOAT_SUM_FUNCTIONS
        want, got = finalize(want_partial), finalize(got_partial)
        assert len(want) == len(got), want_partial.name
        for w, g in zip(want, got):
            assert w[:-1] == g[:-1]
            assert w[-1] == g[-1] or (float_sum and math.isclose(w[-1], g[-1], rel_tol=1e-12)), (w, g)
