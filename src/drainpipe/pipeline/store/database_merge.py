"""The upsert-merge done by the database server (PostgreSQL): a writer's states merged at its commit, or queued
while another merge runs and folded after it; the server merges.

Why: the merge of :mod:`.merge` reads the stored states of every key into the writer, merges them there and
rewrites them, under a lock that keeps two writers of one database from interleaving. A writer with little CPU (a
``consume`` member on a machine of its own, capped at a fraction of a core) then held the lock for as long as its
Python took, and four such members did less than one. Then the writer staged its states and held the lock for the
server's statements only; but with messages spread round robin every member brings every key, so the server merged
each key once per member, one member at a time, and four members did 1.6 times one. Now a writer that finds a merge
running queues its states, and one fold merges what every writer queued::

    writer (its own work)       its parts' books lock (one transaction)      merge lock of a stripe (one statement)
    ─────────────────────       ───────────────────────────────────────      ──────────────────────────────────────
    partials merged, rolled ──> fences checked; then, when no merge runs ──> (any writer, after its commit) fold,
    up; COPY into the session's (every merge lock free): its staged          when the stripe's lock is free: every
    staging tables (a            states merged, with every row of the        committed row of the stripe taken off
    percentile key's bins        queue, in one pass (merge_with_queue);      the queue (any writer's) and merged;
    packed in one row)           else they are queued (merge_queue);         a held stripe is left to its holder,
                                 progress recorded; COMMIT: exactly once     which looks again after its commit
                                 is this commit

    a merge: a key's rows added up (one commit's as they are), then states: INSERT ... ON CONFLICT DO UPDATE (add
    counts and sums, LEAST / GREATEST for min / max, histograms added bin by bin); values: computed from the merged
    states the upsert RETURNs (every finalizer in SQL, percentiles by a running sum over the bins); top-N: stored
    and new rows ranked together

The merge is a function of the server (:data:`MERGE_FUNCTION`, created with the schema): a writer calls it in one
statement, and a fold (:func:`fold_now`) takes its stripe's lock, merges and commits inside that statement. A
writer with little CPU (a ``consume`` member at a cap of 0.15 of a core is descheduled for tens of milliseconds at a
time) therefore never holds a merge lock while it waits for its CPU: when the fold was some fifteen statements sent
one after the other, four capped members held the locks mostly between statements, and PostgreSQL stayed at one
core of the two (``docs/performance.md``, "Members and servers on one PostgreSQL store").

A lone writer's states never go through the queue (a copy in, a delete, a copy out, each written to the log: a lone
member did 26% less when every writer queued). While one writer merges, the others commit (their parts' books are
not its) and go on: no writer waits for another's merge lock. A writer whose fold finds a stripe's lock held leaves
the stripe to the holder, which looks at the queue again after its commit (:meth:`~.sql.SqlStore.merge`); so the
next fold takes all that queued meanwhile, and a key costs the server one upsert and one computation of its values
per fold, not per writer. The queue is folded in :data:`STRIPES` stripes of entities, each under a lock of its own (a
key's values are computed from its merged state, so two merges of one key must not interleave; every key of an
entity, minute, hour and day, is in its entity's stripe), one stripe a statement, each writer starting from a stripe
of its own (picked at random): writers mostly fold different stripes at once, on as many of the server's cores. A
fold that fails after the commit is not retried (:class:`~.sql.SqlStore`): the states are committed, and the next
fold, by any writer, takes them.

A percentile key's histogram is one row (``b`` = :data:`PACKED`, ``n`` its count, ``bins`` and ``counts`` arrays in
b order), not a row per bin as in DuckDB: bins were 85% of the rows a merge wrote, and the per-row cost (an index
entry, a tuple, a values look-up) is what the server spends its time on. A store written before is packed when
opened (:func:`pack_stored_bins`). The metric statements read no stored table except through the upserts' unique
indexes (:data:`STATE_KEY_INDEX`, :data:`VALUE_KEY_INDEX`), so their cost is the staged rows', whatever the store's
size.

Every state is mergeable by one of those operations (:data:`~drainpipe.pipeline.partials.STATE_COLUMNS`), and the
values are computed exactly as :func:`~drainpipe.pipeline.values.finalize_table` computes them: the same integer
arithmetic for apdex and percentile ranks, the same float64 operations for the rest, strings ranked by their bytes
(``COLLATE "C"``, as Arrow sorts). ``tests/postgres/test_database_merge.py`` holds the two merges equal.

A backend that merges this way declares :attr:`~.backend.Backend.merges_in_database`, creates :data:`QUEUE_DDL` and
:data:`STAGING_DDL` with its session, and has the two unique indexes and the packed columns. Functions over such a
backend, called inside the store's session (and, but for :func:`vacuum_queue`, :func:`fold_now` and
:func:`queued_stripes`, a transaction under the lock each names); blocking; database errors propagate.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..buckets import GRANULARITY_MS
from ..definitions import Definition, MetricDef
from ..grouping import table_groups
from ..partials import MetricPartial, TopNPartial
from ..state_table import STATE_TABLE_SCHEMA, to_state_table, to_topn_table, with_key
from ..values import APDEX_INT64_N, PERCENTILE_LABELS, PERCENTILES, bucket_column
from .backend import Backend

__all__ = [
    "MERGE_FUNCTION",
    "MERGE_FUNCTION_DDL",
    "LOCK_SPACE",
    "MERGE_LOCK",
    "PACKED",
    "QUEUE_DDL",
    "QUEUED_TOPN",
    "QUEUE_TABLES",
    "STRIPES",
    "VACUUM_ROWS",
    "STAGING_DDL",
    "STATE_KEY_INDEX",
    "VALUE_KEY_INDEX",
    "define_merge_function",
    "define_queued",
    "fold",
    "fold_now",
    "merge_staged",
    "merge_with_queue",
    "pack_stored_bins",
    "queue_staged",
    "queued_stripes",
    "stage",
    "until_due",
    "vacuum_queue",
]

log = logging.getLogger("drainpipe.store")

#: the ``b`` of a state row that is not one bin: a scalar state's, and a percentile key's packed histogram's
PACKED = -1

#: the session's staging tables (temporary: each writer's own), created with its connection
STAGING_DDL = (
    """CREATE TEMPORARY TABLE IF NOT EXISTS stage_state (
        metric VARCHAR NOT NULL, entity VARCHAR NOT NULL, granularity VARCHAR NOT NULL,
        time_bucket TIMESTAMPTZ NOT NULL, b BIGINT NOT NULL, n BIGINT, v DOUBLE PRECISION, ok BIGINT, tol BIGINT,
        bins BIGINT[], counts BIGINT[])""",
    """CREATE TEMPORARY TABLE IF NOT EXISTS stage_topn (
        name VARCHAR NOT NULL, entity VARCHAR NOT NULL, time_bucket TIMESTAMPTZ NOT NULL, key VARCHAR NOT NULL,
        latency_ms DOUBLE PRECISION NOT NULL)""",
    """CREATE TEMPORARY TABLE IF NOT EXISTS fold_rows (
        metric VARCHAR NOT NULL, entity VARCHAR NOT NULL, granularity VARCHAR NOT NULL,
        time_bucket TIMESTAMPTZ NOT NULL, b BIGINT NOT NULL, n BIGINT, v DOUBLE PRECISION, ok BIGINT, tol BIGINT,
        bins BIGINT[], counts BIGINT[], key VARCHAR, tx BIGINT NOT NULL)""",
    """CREATE TEMPORARY TABLE IF NOT EXISTS stage_defs (
        name VARCHAR NOT NULL, fn VARCHAR NOT NULL, precision_ms DOUBLE PRECISION, keep INTEGER,
        bounds DOUBLE PRECISION[])""",
)
#: the queue every writer appends its committed states to, and how each definition's states merge (shared tables)
QUEUE_DDL = (
    """CREATE TABLE IF NOT EXISTS merge_queue (
        metric VARCHAR NOT NULL, entity VARCHAR NOT NULL, granularity VARCHAR NOT NULL,
        time_bucket TIMESTAMPTZ NOT NULL, b BIGINT NOT NULL, n BIGINT, v DOUBLE PRECISION, ok BIGINT, tol BIGINT,
        bins BIGINT[], counts BIGINT[], key VARCHAR)""",
    # one row per stripe a commit queued rows for, with when: where a writer looks for what has waited long enough
    # (a few rows a commit, not a scan of the queue's)
    """CREATE TABLE IF NOT EXISTS merge_marks (
        stripe INTEGER NOT NULL, queued_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp())""",
    """CREATE TABLE IF NOT EXISTS merge_defs (
        name VARCHAR PRIMARY KEY, fn VARCHAR NOT NULL, precision_ms DOUBLE PRECISION, keep INTEGER,
        bounds DOUBLE PRECISION[])""",
)
QUEUE_TABLES = ("merge_queue", "merge_marks", "merge_defs")
#: the memory a fold's sorts and hash tables may take (per operation), instead of the server's default
FOLD_WORK_MEM = "64MB"
#: the queue is folded in this many stripes (a power of two), each under a lock of its own, so that folds of two
#: stripes run at once on two cores; a stripe is a set of entities (by a hash of the name), so every key of an
#: entity (its minute, hour and day states, its top-N) is in one stripe, and a fold of it merges them all at once
STRIPES = 4
#: the first key of every advisory lock of a store: a hash of its schema's name, so that stores in two schemas of one
#: database do not share locks (a server's advisory locks are a database's)
LOCK_SPACE = "hashtext(coalesce(current_schema(), ''))"
#: the second key of the first of the stripes' merge locks ("fold" + stripe), taken by every merge into the stored
#: states (see :meth:`~.postgres_store.PostgresBackend.lock_merges`)
MERGE_LOCK = 0x666F6C64
#: the queued rows a writer folds between two vacuums of the queue (:func:`vacuum_queue`)
VACUUM_ROWS = 100_000
#: the ``granularity`` of a queued top-N row (its latency in ``v``, its key in ``key``)
QUEUED_TOPN = "#topn"
#: the state key, unique: what the states' upsert's ON CONFLICT names
_STATE_KEY = "metric, granularity, entity, time_bucket, b"
STATE_KEY_INDEX = f"CREATE UNIQUE INDEX IF NOT EXISTS metric_state_unique ON metric_state ({_STATE_KEY})"
#: the value key, unique: what the values' upsert's ON CONFLICT names
_VALUE_KEY = "metric, granularity, entity, time_bucket, label"
VALUE_KEY_INDEX = f"CREATE UNIQUE INDEX IF NOT EXISTS metric_values_unique ON metric_values ({_VALUE_KEY})"

_STATE_COLUMNS = ("metric", "entity", "granularity", "time_bucket", "b", "n", "v", "ok", "tol", "bins", "counts")
_TOPN_COLUMNS = ("name", "entity", "time_bucket", "key", "latency_ms")
_QUEUE_COLUMNS = (*_STATE_COLUMNS, "key")
_MINUTES = " ".join(f"WHEN '{g}' THEN {ms // 60_000}.0::float8" for g, ms in GRANULARITY_MS.items())

# Each statement upserts states and hands the merged rows (RETURNING: the row as updated) straight to the values'
# upsert: no second look-up of the states, no delete of the old values (a key's labels never change, so replacing
# each value row is the whole of it), and a value that did not change is not written again (two thirds of the
# percentiles, when four members merge the same minutes).
_UPSERT_VALUES = (
    f"ON CONFLICT ({_VALUE_KEY}) DO UPDATE SET value = excluded.value WHERE o.value IS DISTINCT FROM excluded.value"
)

# values.finalize_table in SQL: the same operations on the same types (integer division for apdex, float64 else)
_MERGE_STATES = f"""
WITH s AS (
    INSERT INTO metric_state AS t ({", ".join(_STATE_COLUMNS)})
    SELECT {", ".join(_STATE_COLUMNS)} FROM stage_state WHERE bins IS NULL
    ON CONFLICT ({_STATE_KEY}) DO UPDATE SET
        n = t.n + excluded.n, ok = t.ok + excluded.ok, tol = t.tol + excluded.tol,
        v = CASE WHEN excluded.metric = ANY(?) THEN LEAST(t.v, excluded.v)
                 WHEN excluded.metric = ANY(?) THEN GREATEST(t.v, excluded.v)
                 ELSE t.v + excluded.v END
    RETURNING t.metric, t.entity, t.granularity, t.time_bucket, t.n, t.v, t.ok, t.tol
)
INSERT INTO metric_values AS o (metric, entity, granularity, time_bucket, label, value)
SELECT s.metric, s.entity, s.granularity, s.time_bucket, '',
    CASE d.fn
        WHEN 'count' THEN s.n::float8
        WHEN 'cpm' THEN s.n::float8 / (CASE s.granularity {_MINUTES} END)
        WHEN 'avg' THEN s.v / s.n::float8
        WHEN 'sla' THEN (100 * s.ok::numeric)::float8 / s.n::float8
        WHEN 'apdex' THEN (CASE WHEN s.n <= {APDEX_INT64_N}
            THEN ((2 * s.ok + s.tol) * 10000 + s.n) / (2 * s.n)
            ELSE div((2 * s.ok + s.tol)::numeric * 10000 + s.n, 2 * s.n) END)::float8 / 10000.0::float8
        ELSE s.v END
FROM s JOIN stage_defs d ON d.name = s.metric
{_UPSERT_VALUES}"""

# A key's histograms added bin by bin (both in b order; the sum too). Tried and dropped: appending while short and
# adding only past a bound (it saved the aggregate per key and cost as much again in the percentiles' longer
# sorts); both steps as PL/pgSQL functions, one pass over the arrays each (faster alone, 15% slower in the upsert).
# Then values._percentiles in SQL: per key, the rank r = ceil(p * count / 100) of each percentile in integers, and
# the first bin (in b order) whose running count reaches it; one aggregate per key over its bins, one value row per
# percentile.
_PERCENTILE_BINS = ", ".join(
    f"min(r.b) FILTER (WHERE r.running >= ({p} * s.n + 99) / 100) AS {label}"
    for p, label in zip(PERCENTILES, PERCENTILE_LABELS)
)
_PERCENTILE_ROWS = ", ".join(f"('{label}', q.{label})" for label in PERCENTILE_LABELS)
_MERGE_BINS = f"""
WITH s AS (
    INSERT INTO metric_state AS t ({", ".join(_STATE_COLUMNS)})
    SELECT {", ".join(_STATE_COLUMNS)} FROM stage_state WHERE bins IS NOT NULL
    ON CONFLICT ({_STATE_KEY}) DO UPDATE SET n = t.n + excluded.n, (bins, counts) = (
        SELECT array_agg(m.b ORDER BY m.b), array_agg(m.c ORDER BY m.b) FROM (
            SELECT u.b, sum(u.c)::bigint AS c FROM (
                SELECT * FROM unnest(t.bins, t.counts) UNION ALL SELECT * FROM unnest(excluded.bins, excluded.counts)
            ) AS u (b, c) GROUP BY u.b
        ) AS m)
    RETURNING t.metric, t.entity, t.granularity, t.time_bucket, t.n, t.bins, t.counts
)
INSERT INTO metric_values AS o (metric, entity, granularity, time_bucket, label, value)
SELECT s.metric, s.entity, s.granularity, s.time_bucket, p.label, p.b::float8 * d.precision_ms
FROM s JOIN stage_defs d ON d.name = s.metric
    CROSS JOIN LATERAL (
        SELECT {_PERCENTILE_BINS}
        FROM (
            SELECT u.b, (sum(u.c) OVER (ORDER BY u.b ROWS UNBOUNDED PRECEDING))::bigint AS running
            FROM unnest(s.bins, s.counts) AS u (b, c)
        ) AS r
    ) AS q
    CROSS JOIN LATERAL (VALUES {_PERCENTILE_ROWS}) AS p (label, b)
{_UPSERT_VALUES}"""

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


# A stripe of the queue taken whole: one DELETE, the rows one snapshot holds, so a commit's rows of the stripe are
# folded together (a query may see one stripe of a commit before another), into the
# session's fold_rows with the transaction that queued each row (its xmin); the stripe's marks deleted in the same
# statement, so with the same snapshot: the marks of exactly the commits taken.
_STRIPE_OF = f"hashtext(entity) & {STRIPES - 1}"
_TAKE = f"""
WITH q AS (DELETE FROM merge_queue {{}} RETURNING {", ".join(_QUEUE_COLUMNS)}, xmin::text::bigint),
m AS (DELETE FROM merge_marks {{}})
INSERT INTO fold_rows SELECT * FROM q"""
_TAKE_ALL = _TAKE.format("", "")
_TAKE_STRIPE = _TAKE.format(f"WHERE {_STRIPE_OF} = ?", "WHERE stripe = ?")
_TAKEN = f"""SELECT count(*), count(DISTINCT tx),
    count(*) FILTER (WHERE bins IS NULL AND granularity <> '{QUEUED_TOPN}'),
    count(*) FILTER (WHERE bins IS NOT NULL), count(*) FILTER (WHERE granularity = '{QUEUED_TOPN}') FROM fold_rows"""
# The rows of one commit have a key each: staged as they are.
_STAGE_ONE = (
    f"""INSERT INTO stage_state ({", ".join(_STATE_COLUMNS)}) SELECT {", ".join(_STATE_COLUMNS)} FROM fold_rows
    WHERE granularity <> '{QUEUED_TOPN}'""",
)
# The rows of several commits added up per key: scalar states by their operation (sum, or LEAST / GREATEST for min /
# max), histograms bin by bin (a key queued once keeps its arrays).
_STAGE_MANY = (
    f"""INSERT INTO stage_state ({", ".join(_STATE_COLUMNS)})
    SELECT r.metric, r.entity, r.granularity, r.time_bucket, r.b, sum(r.n)::bigint,
        CASE min(d.fn) WHEN 'min' THEN min(r.v) WHEN 'max' THEN max(r.v) ELSE sum(r.v) END,
        sum(r.ok)::bigint, sum(r.tol)::bigint, NULL, NULL
    FROM fold_rows r JOIN merge_defs d ON d.name = r.metric
    WHERE r.bins IS NULL AND r.granularity <> '{QUEUED_TOPN}'
    GROUP BY r.metric, r.entity, r.granularity, r.time_bucket, r.b""",
    f"""INSERT INTO stage_state ({", ".join(_STATE_COLUMNS)})
    SELECT metric, entity, granularity, time_bucket, {PACKED}, n, NULL, NULL, NULL, bins, counts FROM (
        SELECT metric, entity, granularity, time_bucket, sum(n)::bigint AS n, count(*) AS k,
            min(bins) AS bins, min(counts) AS counts
        FROM fold_rows WHERE bins IS NOT NULL GROUP BY metric, entity, granularity, time_bucket
    ) AS one WHERE k = 1""",
    # a key queued more than once gets a number, and its bins are added up by (number, bin): integers to sort, not
    # the key's four columns (a fold of four members' checkpoints sorted 150,000 bins: 240 ms by key, ~40 by number)
    f"""WITH many AS (
        SELECT metric, entity, granularity, time_bucket, row_number() OVER () AS id
        FROM fold_rows WHERE bins IS NOT NULL
        GROUP BY metric, entity, granularity, time_bucket HAVING count(*) > 1
    ), added AS (
        SELECT k.id, u.bin, sum(u.c)::bigint AS c
        FROM fold_rows r JOIN many k USING (metric, entity, granularity, time_bucket)
            CROSS JOIN LATERAL unnest(r.bins, r.counts) AS u (bin, c)
        WHERE r.bins IS NOT NULL
        GROUP BY k.id, u.bin
    ), h AS (
        SELECT id, sum(c)::bigint AS n, array_agg(bin ORDER BY bin) AS bins, array_agg(c ORDER BY bin) AS counts
        FROM added GROUP BY id
    )
    INSERT INTO stage_state ({", ".join(_STATE_COLUMNS)})
    SELECT k.metric, k.entity, k.granularity, k.time_bucket, {PACKED}, h.n, NULL, NULL, NULL, h.bins, h.counts
    FROM h JOIN many k USING (id)""",
)
_STAGE_TOPN = f"""INSERT INTO stage_topn ({", ".join(_TOPN_COLUMNS)})
    SELECT metric, entity, time_bucket, key, v FROM fold_rows WHERE granularity = '{QUEUED_TOPN}'"""


# The merge as one function of the server: a writer calls it once (a statement), and everything under the merge lock
# runs there, without a word from the writer in between. Each statement is EXECUTEd, so planned at every call as when
# the client sent it (the staged tables' sizes vary by orders of magnitude between calls; a cached generic plan would
# not follow them). Arguments: the stripe (NULL: every stripe), whether to take the queue's committed rows, whether
# to merge the session's staged rows (stage_state, stage_topn, stage_defs, as :func:`stage` left them), whether to
# take the stripe's merge lock first (when it is held: -1, nothing done). The number of queued rows merged.
MERGE_FUNCTION = "drainpipe_merge"


def _quoted(sql: str) -> str:
    assert "$q$" not in sql
    return f"$q${sql}$q$"


def _statements(statements: Sequence[str]) -> str:
    return " ".join(f"EXECUTE {_quoted(statement)};" for statement in statements)


# the staged rows as one more commit's in the fold (transaction 0: no writer's xmin)
_STAGED_INTO_FOLD = (
    f"INSERT INTO fold_rows ({', '.join(_STATE_COLUMNS)}, tx) SELECT {', '.join(_STATE_COLUMNS)}, 0 FROM stage_state",
    "INSERT INTO fold_rows (metric, entity, granularity, time_bucket, b, v, key, tx) SELECT name, entity,"
    f" '{QUEUED_TOPN}', time_bucket, {PACKED}, latency_ms, key, 0 FROM stage_topn",
)
_TAKE_STRIPE_ARG = _TAKE_STRIPE.replace("?", "$1")
_MERGE_STATES_ARGS = _MERGE_STATES.replace("ANY(?)", "ANY($1)", 1).replace("ANY(?)", "ANY($2)", 1)

_MERGE_BODY = f"""
DECLARE
    queued bigint := 0; taken bigint; commits bigint; scalars bigint; bins bigint; tops bigint;
    mins text[]; maxs text[];
BEGIN
    IF try_lock THEN
        IF stripe IS NULL THEN
            RAISE EXCEPTION 'drainpipe_merge: try_lock takes a stripe';
        END IF;
        IF NOT pg_try_advisory_xact_lock({LOCK_SPACE}, {MERGE_LOCK} + stripe) THEN
            RETURN -1;
        END IF;
    END IF;
    EXECUTE 'TRUNCATE fold_rows';
    IF take_queue THEN
        IF stripe IS NULL THEN
            EXECUTE {_quoted(_TAKE_ALL)};
        ELSE
            EXECUTE {_quoted(_TAKE_STRIPE_ARG)} USING stripe;
        END IF;
        EXECUTE 'SELECT count(*) FROM fold_rows' INTO queued;
    END IF;
    IF NOT (merge_staged AND queued = 0) THEN
        IF merge_staged THEN
            {_statements(_STAGED_INTO_FOLD)}
        END IF;
        EXECUTE 'TRUNCATE stage_state, stage_topn, stage_defs';
        EXECUTE {_quoted(_TAKEN)} INTO taken, commits, scalars, bins, tops;
        IF taken = 0 THEN
            RETURN queued;
        END IF;
        EXECUTE 'INSERT INTO stage_defs SELECT name, fn, precision_ms, keep, bounds FROM merge_defs';
        -- room to add the rows up in memory, by hashing (at the default 4 MB a fold of four members' checkpoints
        -- sorted on disk, and took twice as long; the planner, with no statistics of the temporary table, sorted
        -- even so): the scalar states hashed, the histograms' arrays need sorts
        PERFORM set_config('work_mem', '{FOLD_WORK_MEM}', true);
        IF commits = 1 THEN
            PERFORM set_config('enable_sort', 'on', true);
            {_statements(_STAGE_ONE)}
        ELSE
            PERFORM set_config('enable_sort', 'off', true);
            {_statements(_STAGE_MANY[:1])}
            PERFORM set_config('enable_sort', 'on', true);
            {_statements(_STAGE_MANY[1:])}
        END IF;
        IF tops > 0 THEN
            EXECUTE {_quoted(_STAGE_TOPN)};
        END IF;
    END IF;
    -- no JIT compilation (it cost more than these statements take: their estimates grow with a Spark job's
    -- batches); the top-N rows' keys looked up by the index, as in a cached table (the planner's default is a
    -- spinning disk)
    PERFORM set_config('jit', 'off', true);
    PERFORM set_config('random_page_cost', '1.1', true);
    EXECUTE 'SELECT coalesce(array_agg(name ORDER BY name) FILTER (WHERE fn = ''min''), ''{{}}''),'
        ' coalesce(array_agg(name ORDER BY name) FILTER (WHERE fn = ''max''), ''{{}}'') FROM stage_defs'
        INTO mins, maxs;
    EXECUTE 'SELECT count(*) FILTER (WHERE bins IS NULL), count(*) FILTER (WHERE bins IS NOT NULL) FROM stage_state'
        INTO scalars, bins;
    IF scalars > 0 THEN
        EXECUTE {_quoted(_MERGE_STATES_ARGS)} USING mins, maxs;
    END IF;
    IF bins > 0 THEN
        EXECUTE {_quoted(_MERGE_BINS)};
    END IF;
    EXECUTE 'SELECT count(*) FROM stage_topn' INTO tops;
    IF tops > 0 THEN
        EXECUTE {_quoted(_MERGE_TOPN)};
    END IF;
    RETURN queued;
END"""
#: the DDL of the merge function (created with the schema when missing or different: :func:`define_merge_function`)
MERGE_FUNCTION_DDL = (
    f"CREATE OR REPLACE FUNCTION {MERGE_FUNCTION}(stripe integer, take_queue boolean, merge_staged boolean,"
    f" try_lock boolean) RETURNS bigint LANGUAGE plpgsql AS $fn${_MERGE_BODY}$fn$"
)


def define_merge_function(backend: Backend) -> None:
    """Create (or replace) the merge function in the store's schema unless it is there as this version has it. In
    the schema transaction."""
    found = backend.fetchall(
        "SELECT prosrc FROM pg_proc WHERE proname = ? AND pronamespace = current_schema()::regnamespace",
        (MERGE_FUNCTION,),
    )
    if not found or found[0][0] != _MERGE_BODY:
        backend.execute(MERGE_FUNCTION_DDL)


# The percentile states of a store written before they were packed (a row per bin) become a row per key; run once,
# when the columns are added (the same transaction as the schema: an open cut halfway leaves the columns absent).
# A percentile metric is one the registry signs as such, or one with a row that is not at b = PACKED (only bins
# are): every row of it is a bin, a bin at b = PACKED (a negative latency) included. Then the CHECK: a writer of an
# earlier version on the same database would write a row per bin again, which this merge cannot read; it fails on
# the constraint instead, with nothing written.
_PERCENTILE_METRICS = f"""(SELECT name FROM definitions WHERE signature LIKE '%"function": "percentile"%'
    UNION SELECT DISTINCT metric FROM metric_state WHERE b <> {PACKED})"""
_PACK_BINS = (
    "ALTER TABLE metric_state ADD COLUMN bins BIGINT[], ADD COLUMN counts BIGINT[]",
    f"""CREATE TEMPORARY TABLE packed_bins ON COMMIT DROP AS
    SELECT metric, entity, granularity, time_bucket, sum(n)::bigint AS n, array_agg(b ORDER BY b) AS bins,
        array_agg(n ORDER BY b) AS counts
    FROM metric_state WHERE metric IN {_PERCENTILE_METRICS} GROUP BY metric, entity, granularity, time_bucket""",
    "DELETE FROM metric_state WHERE metric IN (SELECT DISTINCT metric FROM packed_bins)",
    f"""INSERT INTO metric_state (metric, entity, granularity, time_bucket, b, n, bins, counts)
    SELECT metric, entity, granularity, time_bucket, {PACKED}, n, bins, counts FROM packed_bins""",
    f"ALTER TABLE metric_state ADD CONSTRAINT metric_state_packed CHECK (b = {PACKED})",
)


def pack_stored_bins(backend: Backend, label: str) -> None:
    """Add the packed histogram columns to ``metric_state`` if missing, packing the bins stored before (a store
    written by a version that kept a row per bin), and forbid rows per bin from then on. In the schema
    transaction."""
    found = backend.fetchall(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = 'metric_state' AND column_name = 'bins'"
    )
    if found:
        return
    for statement in _PACK_BINS:
        backend.execute(statement)
    packed = backend.fetchall("SELECT count(*) FROM metric_state WHERE bins IS NOT NULL")[0][0]
    if packed:
        log.warning("%s: migrated metric_state: %d percentile keys' bins packed, a row each (bins, counts)", label,
                    packed)  # fmt: skip


def _packed(partial: MetricPartial) -> pa.Table:
    """A percentile partial's states, a row per key (``b`` = :data:`PACKED`, ``n`` its count) with its bins and
    their counts in b order, as PostgreSQL array literals (what COPY reads)."""
    table = partial.table
    ids, _ = table_groups(table, ("entity", "bucket"))
    b = table.column("b").to_numpy()
    order = np.lexsort((b, ids))
    ids, b, n = ids[order], b[order], table.column("n").to_numpy()[order]
    starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    offsets = pa.array(np.concatenate((starts, [len(ids)])), pa.int32())
    first = pa.array(order[starts])
    rows = len(starts)
    columns: dict[str, Any] = {
        "entity": table.column("entity").take(first),
        "time_bucket": bucket_column(table.column("bucket").to_numpy()[order[starts]], stored=True),
        "b": pa.array(np.full(rows, PACKED, dtype=np.int64)),
        "n": pa.array(np.add.reduceat(n, starts).astype(np.int64)),
    }
    for field in STATE_TABLE_SCHEMA.names[4:]:
        columns[field] = pa.nulls(rows, STATE_TABLE_SCHEMA.field(field).type)
    columns["bins"] = _array_literals(pa.ListArray.from_arrays(offsets, pa.array(b)))
    columns["counts"] = _array_literals(pa.ListArray.from_arrays(offsets, pa.array(n)))
    return pa.table(columns)


def _array_literals(lists: pa.ListArray) -> pa.Array:
    """Each list of integers as a PostgreSQL array literal (``{1,2,3}``)."""
    joined = pc.binary_join(pc.cast(lists, pa.list_(pa.string())), ",")
    return pc.binary_join_element_wise("{", joined, "}", "")


def _state_rows(partial: MetricPartial) -> pa.Table:
    """What a partial stages: its packed histograms, or its states with no bins."""
    if partial.definition.function == "percentile":
        table = _packed(partial)
    else:
        table = to_state_table(partial)
        table = table.append_column("bins", pa.nulls(table.num_rows, pa.string()))
        table = table.append_column("counts", pa.nulls(table.num_rows, pa.string()))
    return with_key(table, partial.name, partial.granularity)


def _definition_rows(definitions: Iterable[Definition]) -> list[Any]:
    """The (name, fn, precision_ms, keep, bounds) of each definition, flat, in name order: what the merge statements
    join a state's metric against."""
    rows: list[Any] = []
    for d in sorted(set(definitions), key=lambda d: d.name):
        if isinstance(d, MetricDef):
            rows += [d.name, d.function, d.precision_ms, None, None]
        else:
            rows += [d.name, "topn", None, d.n, [float(b) for b in d.latency_buckets_ms]]
    return rows


def _insert_definitions(backend: Backend, table: str, rows: list[Any], conflict: str = "") -> None:
    if rows:
        values = ", ".join(["(?, ?, ?::float8, ?::integer, ?::float8[])"] * (len(rows) // 5))
        backend.execute(f"INSERT INTO {table} VALUES {values}{conflict}", rows)


def _topn_rows(topns: Sequence[TopNPartial]) -> pa.Table | None:
    tops = [to_topn_table(t) for t in topns if t.table.num_rows]
    return pa.concat_tables(tops).select(list(_TOPN_COLUMNS)) if tops else None


def stage(backend: Backend, metrics: Sequence[MetricPartial], topns: Sequence[TopNPartial]) -> None:
    """Make ``metrics`` (unique keys per partial, and one partial per definition and granularity) and ``topns`` the
    session's staged rows, replacing what was staged before. Touches no shared table: may run before the lock."""
    backend.execute("TRUNCATE stage_state, stage_topn, stage_defs")
    _insert_definitions(backend, "stage_defs", _definition_rows(p.definition for p in (*metrics, *topns)))
    states = [_state_rows(p) for p in metrics if p.table.num_rows]
    if states:
        backend.insert_arrow("stage_state", pa.concat_tables(states).select(list(_STATE_COLUMNS)))
    tops = _topn_rows(topns)
    if tops is not None:
        backend.insert_arrow("stage_topn", tops)


def merge_staged(backend: Backend) -> None:
    """Merge what :func:`stage` staged into the stored states, values and top-N rows. Under the merge lock."""
    _merge(backend, None, queue=False, staged=True)


# ----------------------------------------------------------------------------- the queue: many writers, one merge


def queue_staged(backend: Backend) -> None:
    """Append what :func:`stage` staged to the shared queue, where it waits for the next :func:`fold` (a copy inside
    the server). Under the books lock: the rows are this transaction's until it commits (with the writer's progress
    rows), and a fold takes only committed rows."""
    backend.execute(
        f"INSERT INTO merge_queue ({', '.join(_STATE_COLUMNS)}) SELECT {', '.join(_STATE_COLUMNS)} FROM stage_state"
    )
    backend.execute(
        "INSERT INTO merge_queue (metric, entity, granularity, time_bucket, b, v, key) "
        f"SELECT name, entity, '{QUEUED_TOPN}', time_bucket, {PACKED}, latency_ms, key FROM stage_topn"
    )
    backend.execute(
        f"INSERT INTO merge_marks (stripe) SELECT {_STRIPE_OF} FROM stage_state UNION"
        f" SELECT {_STRIPE_OF} FROM stage_topn"
    )


def define_queued(backend: Backend, definitions: Iterable[Definition]) -> None:
    """Record how the queued states of ``definitions`` merge (for any writer's fold). Under the books lock, after
    the registry checked them (a name's definition never changes while states of it are stored)."""
    wanted = _definition_rows(definitions)
    names = wanted[::5]
    if not names:
        return
    # only the rows that are new or differ: an upsert locks the row it meets even when it leaves it as it is, and
    # every writer's commit would then wait for the transaction of any writer merging at its commit
    marks = ", ".join("?" * len(names))
    known = {_hashable(row) for row in backend.fetchall(f"SELECT * FROM merge_defs WHERE name IN ({marks})", names)}
    rows = [v for i in range(0, len(wanted), 5) if _hashable(wanted[i : i + 5]) not in known for v in wanted[i : i + 5]]
    _insert_definitions(
        backend,
        "merge_defs",
        rows,
        " ON CONFLICT (name) DO UPDATE SET fn = excluded.fn, precision_ms = excluded.precision_ms,"
        " keep = excluded.keep, bounds = excluded.bounds WHERE (merge_defs.fn, merge_defs.precision_ms,"
        " merge_defs.keep, merge_defs.bounds) IS DISTINCT FROM (excluded.fn, excluded.precision_ms, excluded.keep,"
        " excluded.bounds)",  # (a row that did not change is not written again at every commit)
    )


def _hashable(row: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(tuple(v) if isinstance(v, list) else v for v in row)


def fold(backend: Backend, stripe: int | None) -> int:
    """Merge every committed row of the queue's ``stripe`` (of :data:`STRIPES`; None: every stripe), whichever writer
    queued it, into the stored states, values and top-N rows, and take the rows off the queue: in the caller's
    transaction, under the stripe's merge lock (every stripe's for None); the number of queued rows folded. The rows
    of one key (one per commit that queued it since the last fold) are added up first, so a key costs the server one
    upsert and one computation of its values per fold, however many writers brought it."""
    return _merge(backend, stripe, queue=True, staged=False) or 0


def fold_now(backend: Backend, stripe: int) -> int | None:
    """:func:`fold` of ``stripe`` in a transaction of its own (called outside any other), if no other transaction
    holds the stripe's merge lock: the number of queued rows folded, or None (held: nothing done). One statement:
    the server takes the lock, folds and commits with no word from this process in between, so a writer with little
    CPU (a process at a cap, descheduled for tens of milliseconds at a time) never holds the lock while it waits
    for its CPU."""
    return _merge(backend, stripe, queue=True, staged=False, try_lock=True)


def merge_with_queue(backend: Backend) -> int:
    """Merge what :func:`stage` staged and every committed row of the queue, in one pass, into the stored states,
    values and top-N rows: in a writer's own transaction, under every merge lock, after :func:`define_queued`; the
    number of queued rows folded. What a writer that finds no merge running does at its commit instead of queueing
    its states: a lone writer never copies its states through the queue, and writers that commit while it merges
    queue theirs for the fold after."""
    return _merge(backend, None, queue=True, staged=True) or 0


def _merge(backend: Backend, stripe: int | None, *, queue: bool, staged: bool, try_lock: bool = False) -> int | None:
    """One call of the server's merge function (:data:`MERGE_FUNCTION_DDL`)."""
    folded = backend.fetchall(f"SELECT {MERGE_FUNCTION}(?::integer, ?, ?, ?)", (stripe, queue, staged, try_lock))
    return None if folded[0][0] < 0 else int(folded[0][0])


def vacuum_queue(backend: Backend) -> None:
    """Make the space of folded rows reusable (outside a transaction; skipped while another writer does it). Each
    fold deletes what it took; until a vacuum, the queue's pages keep growing and every fold scans them all, and the
    server's autovacuum comes round once a minute."""
    # (truncating would lock out the writers)
    backend.execute("VACUUM (SKIP_LOCKED, TRUNCATE false) merge_queue, merge_marks")


def queued_stripes(backend: Backend, waited_s: float | None = None) -> list[int]:
    """The stripes (:data:`STRIPES`) whose queue holds committed rows no fold has taken yet, in order (a scan of
    the queue); with ``waited_s``, those that a commit queued rows for at least that long ago, by the server's clock
    (from the commits' marks: a look at a few rows)."""
    if waited_s is None:
        rows = backend.fetchall(f"SELECT DISTINCT {_STRIPE_OF} AS s FROM merge_queue ORDER BY s")
    else:
        rows = backend.fetchall(
            "SELECT stripe FROM merge_marks GROUP BY stripe"
            " HAVING min(queued_at) <= clock_timestamp() - make_interval(secs => ?::float8) ORDER BY stripe",
            (waited_s,),
        )
    return [int(row[0]) for row in rows]


def until_due(backend: Backend, waited_s: float) -> float | None:
    """Seconds until the oldest queued commit no fold has taken yet has waited ``waited_s`` (by the server's clock;
    at most 0 when one has), or None when the queue holds none."""
    rows = backend.fetchall(
        "SELECT extract(epoch FROM min(queued_at) + make_interval(secs => ?::float8) - clock_timestamp())::float8"
        " FROM merge_marks",
        (waited_s,),
    )
    return None if rows[0][0] is None else float(rows[0][0])
