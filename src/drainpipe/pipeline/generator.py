"""Synthetic request events (a skewed workload) and writing event batches to files.

:func:`generate_events` yields canonical :data:`~drainpipe.inputs.EVENT_SCHEMA` batches, built
with numpy a block of 65536 events at a time:

* ``service`` ``svc-00``, ``svc-01``, ... chosen with Zipf weights ``1 / rank**skew`` (``svc-00`` hottest);
* ``endpoint`` ``/api/e00``, ... Zipf(``skew``) within the service (the same names in every service);
* ``instance`` ``svc-00-i0``, ... uniform within the service;
* ``latency_ms`` lognormal around a per-(service, endpoint) median, rounded to 0.001 ms; events that
  carry a ``db_statement`` are slower by a per-statement factor;
* ``status`` false with probability ``error_rate``;
* ``db_statement`` on ~30% of events, one of a handful of SQL strings per service;
* ``ts`` in arrival order, as a live service or an access log produces them: event i ends at
  ``start_ms + i * duration_s * 1000 / n`` plus up to 2 s of jitter (so the file is nearly, not strictly, sorted),
  and the events span ``[start_ms, start_ms + duration_s * 1000)``.

The output is a pure function of the arguments other than ``batch_rows`` (which only changes how the rows
are cut into batches).

:func:`write_events` streams batches to ``.jsonl``/``.json``/``.ndjson``/``.csv`` (each optionally ``.gz``)
or ``.parquet``, in a form :func:`~drainpipe.inputs.read_events` reads back to identical batches.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from drainpipe.errors import InputError, UsageError
from drainpipe.inputs import EVENT_SCHEMA, format_of

__all__ = ["DEFAULT_START_MS", "generate_events", "write_events"]

#: 2026-11-21T10:00:00Z
DEFAULT_START_MS = 1_795_255_200_000

_BLOCK = 65536  # generation unit; fixed so the output does not depend on batch_rows
_LATENCY_SIGMA = 0.5  # spread of one endpoint's latency (lognormal sigma)
_DB_SHARE = 0.3
_STATEMENTS = (
    "SELECT * FROM {t} WHERE id = ?",
    "SELECT id, status FROM {t} WHERE owner_id = ? ORDER BY created_at DESC LIMIT 50",
    "UPDATE {t} SET status = ?, updated_at = now() WHERE id = ?",
    "INSERT INTO {t} (id, owner_id, payload) VALUES (?, ?, ?)",
    "SELECT count(*) FROM {t} JOIN {t}_items USING (id) WHERE created_at > ?",
)
_STATEMENT_FACTOR = np.array([1.0, 1.6, 1.3, 1.1, 3.0])


@dataclass(frozen=True)
class _Workload:
    """The fixed shape of a workload: names, Zipf CDFs, latency medians, SQL strings."""

    services: pa.Array  # S names
    service_zipf: Sampler
    endpoints: pa.Array  # E names
    endpoint_zipf: Sampler
    instances: pa.Array  # S * I names, service-major
    statements: pa.Array  # S * K strings, service-major, plus a final ""
    median_ms: np.ndarray  # S * E latency medians, service-major
    n_instances: int


class Sampler:
    """Exact inverse-CDF sampling of ranks 0..n-1 with Zipf weights ``1 / (rank + 1)**skew``, vectorised:
    a guide table gives each uniform draw a starting rank, a few vector steps finish the search."""

    _GUIDE = 4096

    def __init__(self, n: int, skew: float) -> None:
        weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** skew
        self.cdf = np.cumsum(weights / weights.sum())
        self.cdf[-1] = np.inf  # every u < 1 lands in range despite rounding
        edges = np.arange(self._GUIDE, dtype=np.float64) / self._GUIDE
        self.guide = np.searchsorted(self.cdf, edges, side="right").astype(np.int32)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        u = rng.random(n)
        rank = self.guide[(u * self._GUIDE).astype(np.intp)]
        while (step := u >= self.cdf[rank]).any():
            rank += step
        return rank


def _workload(services: int, endpoints: int, instances: int, skew: float, seed: int) -> _Workload:
    if min(services, endpoints, instances) < 1:
        raise ValueError("services, endpoints_per_service and instances_per_service must be >= 1")
    width = max(2, len(str(services - 1)))
    svc = [f"svc-{s:0{width}d}" for s in range(services)]
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,)))
    return _Workload(
        services=pa.array(svc, pa.string()),
        service_zipf=Sampler(services, skew),
        endpoints=pa.array([f"/api/e{e:02d}" for e in range(endpoints)], pa.string()),
        endpoint_zipf=Sampler(endpoints, skew),
        instances=pa.array([f"{s}-i{i}" for s in svc for i in range(instances)], pa.string()),
        statements=pa.array(
            [q.format(t=s.replace("-", "_") + "_orders") for s in svc for q in _STATEMENTS] + [""], pa.string()
        ),
        median_ms=np.exp(rng.normal(np.log(40.0), 1.0, services * endpoints)),
        n_instances=instances,
    )


def _with_validity(arr: pa.Array, valid: np.ndarray) -> pa.Array:
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(arr.type, len(arr), [bitmap, *arr.buffers()[1:]])


_JITTER_MS = 2000


def _block(
    w: _Workload,
    rng: np.random.Generator,
    n: int,
    first: int,
    total: int,
    start_ms: int,
    span_ms: int,
    error_rate: float,
) -> pa.RecordBatch:
    svc = w.service_zipf.sample(rng, n)
    ep = w.endpoint_zipf.sample(rng, n)
    inst = svc * w.n_instances + rng.integers(0, w.n_instances, n, dtype=np.int32)
    # arrival order: event i at i * span / total, jittered, clipped into the span
    base = (np.arange(first, first + n, dtype=np.int64) * span_ms) // max(1, total)
    jitter = rng.integers(0, _JITTER_MS + 1, n, dtype=np.int64) if span_ms > _JITTER_MS else 0
    ts = start_ms + np.minimum(base + jitter, span_ms - 1)
    latency = w.median_ms[svc * len(w.endpoints) + ep] * np.exp(_LATENCY_SIGMA * rng.standard_normal(n))
    status = rng.random(n) >= error_rate
    has_db = rng.random(n) < _DB_SHARE
    stmt = rng.integers(0, len(_STATEMENTS), n, dtype=np.int32)
    latency = np.round(np.where(has_db, latency * _STATEMENT_FACTOR[stmt], latency), 3)
    # the final "" entry stands in for the absent statements, which the validity bitmap then nulls
    statements = w.statements.take(np.where(has_db, svc * len(_STATEMENTS) + stmt, len(w.statements) - 1))
    arrays = [
        pa.array(ts, pa.int64()),
        w.services.take(svc),
        w.instances.take(inst),
        w.endpoints.take(ep),
        pa.array(latency, pa.float64()),
        pa.array(status, pa.bool_()),
        _with_validity(statements, has_db),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=EVENT_SCHEMA)


def _rechunk(batches: Iterable[pa.RecordBatch], size: int) -> Iterator[pa.RecordBatch]:
    """Re-cut a stream of batches into batches of exactly ``size`` rows (the last may be shorter)."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        pending.append(batch)
        rows += batch.num_rows
        if rows < size:
            continue
        merged = pending[0] if len(pending) == 1 else pa.concat_batches(pending)
        cut = rows - rows % size
        for start in range(0, cut, size):
            yield merged.slice(start, size)
        pending = [merged.slice(cut)] if cut < rows else []
        rows -= cut
    if rows:
        yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)


def generate_events(
    n: int,
    *,
    services: int = 20,
    endpoints_per_service: int = 10,
    instances_per_service: int = 3,
    skew: float = 1.1,
    seed: int = 42,
    start_ms: int = DEFAULT_START_MS,
    duration_s: int = 3600,
    error_rate: float = 0.02,
    batch_rows: int = 65536,
) -> Iterator[pa.RecordBatch]:
    """Yield ``n`` synthetic events (see the module docstring) in batches of ``batch_rows`` rows (the last
    batch may be shorter). Deterministic for ``seed`` (a non-negative int)."""
    if n < 0 or batch_rows < 1 or duration_s <= 0 or not 0.0 <= error_rate <= 1.0 or skew < 0:
        raise ValueError("need n >= 0, batch_rows >= 1, duration_s > 0, 0 <= error_rate <= 1, skew >= 0")
    w = _workload(services, endpoints_per_service, instances_per_service, skew, seed)

    def blocks() -> Iterator[pa.RecordBatch]:
        for b, start in enumerate(range(0, n, _BLOCK)):
            rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1, b)))
            block = _block(w, rng, _BLOCK, start, n, start_ms, int(duration_s * 1000), error_rate)
            yield block if n - start >= _BLOCK else block.slice(0, n - start)

    return _rechunk(blocks(), batch_rows)


# --------------------------------------------------------------------------------------------------
# writing


def _canonical(batch: pa.RecordBatch) -> pa.RecordBatch:
    if batch.schema.equals(EVENT_SCHEMA):
        return batch
    arrays = [batch.column(f.name).cast(f.type) for f in EVENT_SCHEMA]
    return pa.RecordBatch.from_arrays(arrays, schema=EVENT_SCHEMA)


def write_events(batches: Iterable[pa.RecordBatch], path: str | os.PathLike[str]) -> int:
    """Write event batches to ``path`` (format by suffix, as for reading); returns the rows written.

    Streams: memory stays bounded by one batch (one 1M-row row group for Parquet). Batches must carry
    the :data:`EVENT_SCHEMA` columns (they are cast to it). JSON Lines omit an absent ``db_statement``;
    CSV has a header row and writes null as an empty cell."""
    path = os.fspath(path)
    try:
        fmt, gzipped = format_of(path)
    except InputError:
        raise UsageError(
            f"unsupported output format: {path!r} (expected .jsonl, .json, .ndjson or .csv, optionally .gz, "
            "or .parquet)"
        ) from None
    return fmt.write((_canonical(b) for b in batches), path, gzipped)
