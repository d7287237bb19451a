"""The upsert-merge done by the database server (PostgreSQL): the writer stages its new states, the server merges.

Why: the merge of :mod:`.merge` reads the stored states of every key into the writer, merges them there and
rewrites them, under the write lock that keeps two writers of one database from interleaving
(:meth:`~.backend.Backend.lock_writes`). A writer with little CPU (a ``consume`` member on a machine of its own,
capped at a fraction of a core) then holds the lock for as long as its Python takes, and every other writer waits:
four such members did less than one. Here the writer's share is done before the lock, and the lock is held for the
server's statements only::

    writer, before the lock              the lock                                     (one transaction)
    ───────────────────────              ──────────────────────────────────────────
    partials merged, rolled up   ──>     states:  INSERT ... ON CONFLICT DO UPDATE (add counts and sums,
    COPY into the session's              LEAST / GREATEST for min / max)
    staging tables: new states,          values:  DELETE the keys' value rows, INSERT them again, computed
    their keys, top-N rows, and          from the merged states (every finalizer in SQL, percentiles by a
    what each definition is              running sum over the key's bins)
                                         top-N:   stored and new rows of a key ranked together, the first n
                                                  kept (per latency class)

Every state is mergeable by one of those operations (:data:`~drainpipe.pipeline.partials.STATE_COLUMNS`), and the
values are computed exactly as :func:`~drainpipe.pipeline.values.finalize_table` computes them: the same integer
arithmetic for apdex and percentile ranks, the same float64 operations for the rest, strings ranked by their bytes
(``COLLATE "C"``, as Arrow sorts). ``tests/postgres/test_database_merge.py`` holds the two merges equal.

A backend that merges this way declares :attr:`~.backend.Backend.merges_in_database` and creates
:data:`STAGING_DDL` with its session; the unique index on the state key (:data:`STATE_KEY_INDEX`) is what
``ON CONFLICT`` needs. Functions over such a backend, called inside the store's session and writing transaction;
blocking; database errors propagate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ..buckets import GRANULARITY_MS
from ..definitions import MetricDef
from ..partials import MetricPartial, TopNPartial
from ..state_table import to_state_table, to_topn_table, with_key
from ..values import PERCENTILE_LABELS, PERCENTILES
from .backend import Backend, stage_keys

__all__ = ["STAGING_DDL", "STATE_KEY_INDEX", "merge_staged", "stage"]

#: the session's staging tables (temporary: each writer's own), created with its connection
STAGING_DDL = (
    """CREATE TEMPORARY TABLE IF NOT EXISTS stage_state (
        metric VARCHAR NOT NULL, entity VARCHAR NOT NULL, granularity VARCHAR NOT NULL,
        time_bucket TIMESTAMPTZ NOT NULL, b BIGINT NOT NULL, n BIGINT, v DOUBLE PRECISION, ok BIGINT, tol BIGINT)""",
    """CREATE TEMPORARY TABLE IF NOT EXISTS stage_topn (
        name VARCHAR NOT NULL, entity VARCHAR NOT NULL, time_bucket TIMESTAMPTZ NOT NULL, key VARCHAR NOT NULL,
        latency_ms DOUBLE PRECISION NOT NULL)""",
    """CREATE TEMPORARY TABLE IF NOT EXISTS stage_defs (
        name VARCHAR NOT NULL, fn VARCHAR NOT NULL, precision_ms DOUBLE PRECISION, keep INTEGER,
        bounds DOUBLE PRECISION[])""",
)
#: the state key, unique: what the upsert's ON CONFLICT names
_STATE_KEY = "metric, granularity, entity, time_bucket, b"
STATE_KEY_INDEX = f"CREATE UNIQUE INDEX IF NOT EXISTS metric_state_unique ON metric_state ({_STATE_KEY})"

_STATE_COLUMNS = ("metric", "entity", "granularity", "time_bucket", "b", "n", "v", "ok", "tol")
_TOPN_COLUMNS = ("name", "entity", "time_bucket", "key", "latency_ms")
_JOIN_KEYS = (
    "s.metric = k.name AND s.granularity = k.granularity AND s.entity = k.entity AND s.time_bucket = k.time_bucket"
)
_KEY = "s.metric, s.granularity, s.entity, s.time_bucket"
_MINUTES = " ".join(f"WHEN '{g}' THEN {ms // 60_000}.0::float8" for g, ms in GRANULARITY_MS.items())

_UPSERT_STATES = f"""
INSERT INTO metric_state AS t ({", ".join(_STATE_COLUMNS)})
SELECT {", ".join(_STATE_COLUMNS)} FROM stage_state
ON CONFLICT ({_STATE_KEY}) DO UPDATE SET
    n = t.n + excluded.n, ok = t.ok + excluded.ok, tol = t.tol + excluded.tol,
    v = CASE WHEN excluded.metric = ANY(?) THEN LEAST(t.v, excluded.v)
             WHEN excluded.metric = ANY(?) THEN GREATEST(t.v, excluded.v)
             ELSE t.v + excluded.v END"""

_DELETE_VALUES = (
    "DELETE FROM metric_values t USING stage_keys k WHERE t.metric = k.name AND t.granularity = k.granularity"
    " AND t.entity = k.entity AND t.time_bucket = k.time_bucket"
)

# values.finalize_table in SQL: the same operations on the same types (integer division for apdex, float64 else).
# The joins run in the order written (join_collapse_limit, :func:`merge_staged`): the staged keys with their
# definitions (a hash join of two small tables), then each key's stored states by the unique index.
_INSERT_VALUES = f"""
INSERT INTO metric_values (metric, entity, granularity, time_bucket, label, value)
SELECT s.metric, s.entity, s.granularity, s.time_bucket, '',
    CASE d.fn
        WHEN 'count' THEN s.n::float8
        WHEN 'cpm' THEN s.n::float8 / (CASE s.granularity {_MINUTES} END)
        WHEN 'avg' THEN s.v / s.n::float8
        WHEN 'sla' THEN (100 * s.ok)::float8 / s.n::float8
        WHEN 'apdex' THEN (((2 * s.ok + s.tol) * 10000 + s.n) / (2 * s.n))::float8 / 10000.0::float8
        ELSE s.v END
FROM stage_keys k JOIN stage_defs d ON d.name = k.name AND d.fn <> 'percentile' JOIN metric_state s ON {_JOIN_KEYS}"""

# values._percentiles in SQL: per key, the rank r = ceil(p * count / 100) of each percentile in integers, and the
# first bin (in b order) whose running count reaches it; one aggregate per key (its bins come in key order from the
# window), one value row per percentile
_PERCENTILE_BINS = ", ".join(
    f"min(c.b) FILTER (WHERE c.running >= ({p} * c.total + 99) / 100) AS {label}"
    for p, label in zip(PERCENTILES, PERCENTILE_LABELS)
)
_PERCENTILE_ROWS = ", ".join(f"('{label}', g.{label})" for label in PERCENTILE_LABELS)
_INSERT_PERCENTILES = f"""
INSERT INTO metric_values (metric, entity, granularity, time_bucket, label, value)
SELECT g.metric, g.entity, g.granularity, g.time_bucket, p.label, p.b::float8 * g.precision_ms
FROM (
    SELECT c.metric, c.granularity, c.entity, c.time_bucket, min(c.precision_ms) AS precision_ms, {_PERCENTILE_BINS}
    FROM (
        SELECT {_KEY}, s.b, d.precision_ms,
            (sum(s.n) OVER (PARTITION BY {_KEY} ORDER BY s.b ROWS UNBOUNDED PRECEDING))::bigint AS running,
            (sum(s.n) OVER (PARTITION BY {_KEY}))::bigint AS total
        FROM stage_keys k JOIN stage_defs d ON d.name = k.name AND d.fn = 'percentile'
            JOIN metric_state s ON {_JOIN_KEYS}
    ) c
    GROUP BY c.metric, c.granularity, c.entity, c.time_bucket
) g CROSS JOIN LATERAL (VALUES {_PERCENTILE_ROWS}) AS p (label, b)"""

# partials.keep_top and values._topn_value_table in SQL: a key's stored and new rows ranked by latency (descending)
# then key (bytes), the first n kept per latency class (the number of bounds below the latency), ranked again
_MERGE_TOPN = """
WITH old AS (
    DELETE FROM topn_values t USING (SELECT DISTINCT name, entity, time_bucket FROM stage_topn) k
    WHERE t.name = k.name AND t.entity = k.entity AND t.time_bucket = k.time_bucket
    RETURNING t.name, t.entity, t.time_bucket, t.key, t.latency_ms
), classed AS (
    SELECT r.*, d.keep, (SELECT count(*) FROM unnest(d.bounds) AS x (bound) WHERE x.bound < r.latency_ms) AS class
    FROM (SELECT * FROM old UNION ALL SELECT name, entity, time_bucket, key, latency_ms FROM stage_topn) r
    JOIN stage_defs d ON d.name = r.name
), kept AS (
    SELECT name, entity, time_bucket, key, latency_ms, row_number() OVER (
        PARTITION BY name, entity, time_bucket, class ORDER BY latency_ms DESC, key COLLATE "C") AS position, keep
    FROM classed
)
INSERT INTO topn_values (name, entity, time_bucket, rank, key, latency_ms)
SELECT name, entity, time_bucket,
    row_number() OVER (PARTITION BY name, entity, time_bucket ORDER BY latency_ms DESC, key COLLATE "C"), key,
    latency_ms
FROM kept WHERE position <= keep"""


def stage(backend: Backend, metrics: Sequence[MetricPartial], topns: Sequence[TopNPartial]) -> None:
    """Make ``metrics`` (unique keys per partial, and one partial per definition and granularity) and ``topns`` the
    session's staged rows, replacing what was staged before. Touches no shared table: may run before the lock."""
    backend.execute("TRUNCATE stage_state, stage_topn, stage_defs")
    rows: list[Any] = []
    for d in sorted({p.definition for p in (*metrics, *topns)}, key=lambda d: d.name):
        if isinstance(d, MetricDef):
            rows += [d.name, d.function, d.precision_ms, None, None]
        else:
            rows += [d.name, "topn", None, d.n, [float(b) for b in d.latency_buckets_ms]]
    if rows:
        values = ", ".join(["(?, ?, ?::float8, ?::integer, ?::float8[])"] * (len(rows) // 5))
        backend.execute(f"INSERT INTO stage_defs VALUES {values}", rows)
    states = [with_key(to_state_table(p), p.name, p.granularity) for p in metrics if p.table.num_rows]
    if states:
        table = pa.concat_tables(states)
        backend.insert_arrow("stage_state", table.select(list(_STATE_COLUMNS)))
        stage_keys(backend, table)
    else:
        backend.execute("TRUNCATE stage_keys")
    tops = [to_topn_table(t) for t in topns if t.table.num_rows]
    if tops:
        backend.insert_arrow("stage_topn", pa.concat_tables(tops).select(list(_TOPN_COLUMNS)))
    backend.execute("ANALYZE stage_state, stage_keys, stage_topn")


def merge_staged(backend: Backend, metrics: Sequence[MetricPartial], topns: Sequence[TopNPartial]) -> None:
    """Merge what :func:`stage` staged (``metrics`` and ``topns``, for the definitions' merge operations) into the
    stored states, values and top-N rows. Under the write lock."""
    # the joins in the order written (see _INSERT_VALUES); the window's and the aggregates' sorts in memory (at the
    # default 4 MB, a merge of a few thousand percentile keys spilled them to disk)
    backend.execute("SET LOCAL join_collapse_limit = 1")
    backend.execute("SET LOCAL work_mem = '64MB'")
    if any(p.table.num_rows for p in metrics):
        by_function: dict[str, list[str]] = {"min": [], "max": []}
        for p in metrics:
            if p.definition.function in by_function:
                by_function[p.definition.function].append(p.name)
        backend.execute(_UPSERT_STATES, (sorted(set(by_function["min"])), sorted(set(by_function["max"]))))
        backend.execute(_DELETE_VALUES)
        backend.execute(_INSERT_VALUES)
        if any(p.definition.function == "percentile" for p in metrics):
            backend.execute(_INSERT_PERCENTILES)
    if any(t.table.num_rows for t in topns):
        backend.execute(_MERGE_TOPN)
