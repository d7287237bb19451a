"""Shared test factories: the times tests start from, event batches (the store suites run DuckDB and PostgreSQL on
the same data), and waiting for a condition. One home, so that no test file defines its own."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import math
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from drainpipe.errors import StoreUnavailable
from drainpipe.inputs import DeadLetter, ReadStats, read_events
from drainpipe.inputs.schema import EVENT_SCHEMA, FIELDS, TRACE_ID, TS_MAX, TS_MIN, batch_schema
from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS, Definitions
from drainpipe.pipeline.store import MergeReport, SourceProgress, Store, open_store

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
    store: Store, events: pa.RecordBatch, part: str | None, definitions: Definitions = DEFAULT_DEFINITIONS
) -> MergeReport:
    """Aggregate one batch and merge it into ``store`` (one transaction). With ``part``, exactly once, as an engine's
    checkpoint makes it: the merge carries a progress row per definition of source ``"test"`` and that part, so a
    second ingest of the same part finds its rows in the store's books and writes nothing."""
    progress = [] if part is None else [SourceProgress("test", part, name, 1) for name in definitions.names]
    return store.merge(aggregate_batch(events, definitions), progress=progress)


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


class Outage:
    """A store whose merges fail as unavailable (as a lost PostgreSQL connection's do) while ``down`` is set;
    everything else passes through. An embedded DuckDB store cannot go away by itself."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.down = threading.Event()

    def merge(self, partials: Any, **kwargs: Any) -> MergeReport:
        if self.down.is_set():
            raise StoreUnavailable("injected outage")
        return self.store.merge(partials, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def wait_until(pred: Callable[[], Any], timeout: float = 5.0, interval: float = 0.002, *, what: str = "") -> Any:
    """Poll ``pred`` (for state that has no event of its own: stats, a page, a store) until it returns something
    true, and return that; :class:`AssertionError` with the last value (and ``what`` was awaited) after ``timeout``
    seconds. A ``pred`` that asks another process (HTTP, a query) polls at a coarser ``interval``."""
    deadline = time.monotonic() + timeout
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout} s{' waiting for ' + what if what else ''}; last value {last!r}"
            )
        time.sleep(interval)


# ------------------------------------------------------------------------------------------ input files


BASE = {"ts": T0, "service": "svc", "latency_ms": 1.5}
CSV_HEADER = ",".join(FIELDS)


@dataclass
class Result:
    rows: list[dict]
    stats: ReadStats
    rejects: list[dict]
    batches: list[pa.RecordBatch]


def check_canonical(batch: pa.RecordBatch) -> None:
    """Every accepted batch satisfies the canonical contract (the trace id column only when a record had one)."""
    assert batch.schema.equals(EVENT_SCHEMA) or (
        batch.schema.equals(batch_schema([TRACE_ID])) and batch.column(TRACE_ID).null_count < batch.num_rows
    )
    batch.validate(full=True)
    for name in FIELDS[:-1]:
        assert batch.column(name).null_count == 0, name
    for row in batch.to_pylist():
        assert TS_MIN <= row["ts"] <= TS_MAX
        assert row["service"]
        assert math.isfinite(row["latency_ms"]) and row["latency_ms"] >= 0
        assert row["db_statement"] != ""


def read(paths: list[Path], tmp_path: Path, batch_rows: int = 65536) -> Result:
    """Read ``paths`` (``read_events``) with a dead letter and stats, checking every batch's canonical contract."""
    stats = ReadStats()
    dl_path = tmp_path / "out.rejected.jsonl"
    dl_path.unlink(missing_ok=True)  # the dead letter appends: one file per read here
    with DeadLetter(dl_path) as dl:
        batches = [
            e.rows for e in read_events([str(p) for p in paths], batch_rows=batch_rows, dead_letter=dl, stats=stats)
        ]
    rejects = [json.loads(line) for line in dl_path.read_text(encoding="ascii").split("\n")[:-1]]
    assert stats.read == stats.accepted + stats.rejected
    assert sum(b.num_rows for b in batches) == stats.accepted
    assert len(rejects) == stats.rejected == sum(stats.reasons.values())
    for b in batches:
        assert 0 < b.num_rows <= batch_rows
        check_canonical(b)
    rows = [row for b in batches for row in b.to_pylist()]
    return Result(rows, stats, rejects, batches)


def write_bytes(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.lower().endswith(".gz") else data)
    return path


def read_jsonl(tmp_path: Path, lines: list[str | bytes], name: str = "in.jsonl", **kw) -> Result:
    data = b"".join((x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass")) + b"\n" for x in lines)
    return read([write_bytes(tmp_path, name, data)], tmp_path, **kw)


def read_csv(tmp_path: Path, text: str | bytes, name: str = "in.csv") -> Result:
    data = text if isinstance(text, bytes) else text.encode()
    return read([write_bytes(tmp_path, name, data)], tmp_path)


def rec(**changes) -> str:
    record = dict(BASE, **changes)
    for key in [k for k, v in changes.items() if v is ...]:
        del record[key]
    return json.dumps(record)


def reasons(result: Result) -> list[str]:
    return [r["reason"] for r in result.rejects]


def row(**values) -> dict:
    """One event as a dict of the canonical columns: ``values`` over defaults (T0, service ``svc``, 1.5 ms, ok)."""
    full = {"ts": T0, "service": "svc", "instance": "", "endpoint": "", "latency_ms": 1.5, "status": True,
            "db_statement": None}  # fmt: skip
    full.update(values)
    return full


def event_batch(events: Iterable[dict | tuple], schema: pa.Schema = EVENT_SCHEMA) -> pa.RecordBatch:
    """A record batch of events, each a dict (missing columns take :func:`row`'s defaults) or a tuple of the
    columns in :data:`COLUMNS`' order (then any extra columns of ``schema``)."""
    records = [row(**e) if isinstance(e, dict) else dict(zip(schema.names, e)) for e in events]
    return pa.RecordBatch.from_pylist(records, schema=schema)


def ms(*args, tz=dt.UTC) -> int:
    return (dt.datetime(*args, tzinfo=tz) - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(milliseconds=1)


def write_parquet(tmp_path: Path, table: pa.Table, name: str = "in.parquet", **kw) -> Path:
    path = tmp_path / name
    pq.write_table(table, path, **kw)
    return path


#: the trace states the telemetry fixtures give their request spans in turn: unsampled, sampled at 1/2 and 1/4, a
#: malformed threshold (counts 1, with a warning) and a probability of about 2/3 (1.49998: rounded per span)
TRACE_STATES = ("", "ot=th:8", "vendor=x,ot=th:c", "ot=th:zz", "ot=th:5555;rv:0123456789abcd")


def adjusted_count(trace_state: str, span_id: bytes) -> int:
    """What a span with this trace state and id counts, written out again in Python integers (an independent
    reference for :mod:`drainpipe.inputs.sampling` on the fixtures' trace states, which it parses simply: one
    ``th`` or none, the valid or obviously malformed kinds above)."""
    th = next((part[3:] for member in trace_state.split(",") if member.startswith("ot=")
               for part in member[3:].split(";") if part.startswith("th:")), None)  # fmt: skip
    if th is None or not all(c in "0123456789abcdef" for c in th):
        return 1
    d = (1 << 56) - (int(th, 16) << 4 * (14 - len(th)))
    q, r = divmod(1 << 56, d)
    m64 = (1 << 64) - 1
    z = (int.from_bytes(span_id, "little") + 0x9E3779B97F4A7C15) & m64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m64
    z ^= z >> 31
    return q + ((z >> 8) < (r << 56) // d)


# ------------------------------------------------------------------------------------------ small volumes


@contextmanager
def small_volume(path: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` MB mounted at ``path`` (created) for the block (the tests run as root, as CI does)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill_to(filler: Path, free: int) -> None:
    """Grow or shrink ``filler`` until its file system has about ``free`` bytes free (written: tmpfs allocates on
    write, not on truncate)."""
    have = filler.stat().st_size if filler.exists() else 0
    size = max(0, have + free_bytes(filler.parent) - free)
    with open(filler, "ab") as f:
        f.truncate(size)
    if size > have:
        with open(filler, "r+b") as f:
            f.seek(have)
            f.write(b"\0" * (size - have))
