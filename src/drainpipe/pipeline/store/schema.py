"""The store's tables, and the migrations that bring a store written by an earlier version up to them.

Tables (portable SQL: the same statements serve DuckDB and PostgreSQL)::

    metric_state    (metric, entity, granularity, time_bucket, b, n, v, ok, tol)  a row per key (and bin b)
    metric_values   (metric, entity, granularity, time_bucket, label, value)       a row per key and label
    topn_values     (name, entity, time_bucket, rank, key, latency_ms)             a row per key and rank
    source_progress (source, part, name, end_offset, end_lines, head, node, path, prefix, applied_at)
                                                                                   key (source, part, name)
    definitions     (name, signature)                                              primary key (name)

``metric_state`` holds the mergeable states in the fixed columns of
:data:`~drainpipe.pipeline.state_table.STATE_TABLE_SCHEMA` (one row per percentile bin ``b``, ``b = -1`` otherwise;
PostgreSQL keeps a percentile key's bins in one row instead, :mod:`.database_merge`);
``metric_values`` the finalized values (what queries read); for a top-N the ranked rows are the state. The merge
(:mod:`.merge`) keeps the first three unique per key. They have no primary key in DuckDB, whose index upkeep made
merges ~10x slower; a PostgreSQL store indexes them on (metric|name, granularity, entity, time_bucket).
``source_progress`` is the store's books (:mod:`.books`), ``definitions`` its registry (:mod:`.registry`).

``time_bucket`` is the bucket start, an instant: ``TIMESTAMP WITH TIME ZONE`` in both databases (so SQL users and
Grafana range-query and chart it natively); the store's API speaks ISO-8601 text (:mod:`.queries`).

Migrations run when a store that existed before is opened, each once, each first checking whether it is needed (one
catalog query answers for all), so that an open interrupted halfway is finished by the next:

* ``file_progress`` (before sources were partitioned) becomes ``source_progress`` rows;
* ``time_bucket`` stored as ISO-8601 text becomes a timestamp;
* ``applied_sources`` (ids of applied input batches, which writers stopped passing when exactly once moved to the
  books) is dropped.

Runs in the backend's schema transaction (:meth:`~.backend.Backend.open`); blocking; database errors propagate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .backend import Backend

__all__ = ["TABLES", "TIME_TABLES", "column_types", "create"]

log = logging.getLogger("drainpipe.store")

_DDL = (
    """CREATE TABLE IF NOT EXISTS metric_state (
        metric VARCHAR NOT NULL, entity VARCHAR NOT NULL, granularity VARCHAR NOT NULL,
        time_bucket TIMESTAMPTZ NOT NULL, b BIGINT NOT NULL,
        n BIGINT, v DOUBLE PRECISION, ok BIGINT, tol BIGINT)""",
    """CREATE TABLE IF NOT EXISTS metric_values (
        metric VARCHAR NOT NULL, entity VARCHAR NOT NULL, granularity VARCHAR NOT NULL,
        time_bucket TIMESTAMPTZ NOT NULL, label VARCHAR NOT NULL, value DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS topn_values (
        name VARCHAR NOT NULL, entity VARCHAR NOT NULL, time_bucket TIMESTAMPTZ NOT NULL, rank INTEGER NOT NULL,
        key VARCHAR NOT NULL, latency_ms DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS definitions (name VARCHAR PRIMARY KEY, signature VARCHAR NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS source_progress (
        source VARCHAR NOT NULL, part VARCHAR NOT NULL, name VARCHAR NOT NULL, end_offset BIGINT NOT NULL,
        end_lines BIGINT NOT NULL, head VARCHAR NOT NULL, node VARCHAR NOT NULL, path VARCHAR NOT NULL,
        prefix VARCHAR NOT NULL, applied_at BIGINT, PRIMARY KEY (source, part, name))""",
)
#: every table of a store (what its size and a reclaim cover)
TABLES = ("metric_state", "metric_values", "topn_values", "source_progress", "definitions")
#: the tables whose time_bucket is a timestamp (the staged keys are temporary: created with the type)
TIME_TABLES = ("metric_state", "metric_values", "topn_values")


def create(backend: Backend, *, migrate: bool, clock: Callable[[], int], label: str) -> None:
    """Create what is missing (the session's staging relations included); ``migrate``: bring an older store's tables
    up to date (False: the store was just created, and the catalog query, ~20 ms in DuckDB, is not needed).
    ``clock``: the record time of rows a migration writes; ``label``: the store, in the migrations' log lines."""
    for statement in _DDL + backend.staging_ddl:
        backend.execute(statement)
    if migrate:
        types = column_types(backend)  # one catalog query for every check: each costs milliseconds
        _migrate_progress(backend, types, clock, label)
        _migrate_time(backend, types, label)
        _drop_applied_sources(backend, types, label)


def column_types(backend: Backend) -> dict[tuple[str, str], str]:
    """(table, column) -> SQL type (upper case, as information_schema names it) of the columns migrations look at."""
    return {
        (str(table), str(column)): str(kind).upper()
        for table, column, kind in backend.fetchall(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND column_name IN ('time_bucket', 'applied_at', 'fid', 'root')"
        )
    }


def _migrate_time(backend: Backend, types: dict[tuple[str, str], str], label: str) -> None:
    """A store written before ``time_bucket`` was a timestamp holds it as ISO-8601 text: each such table is converted
    in place, once (the text is UTC with a ``Z``, so the cast is exact). Table by table, each checked first."""
    for table in TIME_TABLES:
        kind = types.get((table, "time_bucket"), "")
        if kind and kind != "TIMESTAMP WITH TIME ZONE":
            backend.execute(
                f"ALTER TABLE {table} ALTER COLUMN time_bucket TYPE TIMESTAMPTZ USING CAST(time_bucket AS TIMESTAMPTZ)"
            )
            log.warning("%s: migrated %s: time_bucket %s -> TIMESTAMP WITH TIME ZONE", label, table, kind.lower())


def _migrate_progress(
    backend: Backend, types: dict[tuple[str, str], str], clock: Callable[[], int], label: str
) -> None:
    """A store written before the partitioned-source layer kept its progress in ``file_progress`` (fid, name, head,
    node, path, end_offset, end_lines, prefix[, applied_at]): input files under their identity, and the serve log as
    a row whose fid, head and node are all the log's key. Its rows become ``source_progress`` rows (``"file"`` and
    the fid; ``"log"`` and the key), positions unchanged, and the old table is dropped. The copy skips rows already
    there, so a migration interrupted between copy and drop is finished by the next open."""
    if ("file_progress", "fid") not in types:
        return
    applied_at = "applied_at" if ("file_progress", "applied_at") in types else str(clock())
    backend.execute(
        "INSERT INTO source_progress "
        "SELECT CASE WHEN fid = node THEN 'log' ELSE 'file' END, fid, name, end_offset, end_lines, "
        "CASE WHEN fid = node THEN '' ELSE head END, CASE WHEN fid = node THEN '' ELSE node END, path, prefix, "
        f"{applied_at} FROM file_progress ON CONFLICT DO NOTHING"
    )
    backend.execute("DROP TABLE file_progress")
    log.warning("%s: migrated file_progress into source_progress (files and the serve log as sources)", label)


def _drop_applied_sources(backend: Backend, types: dict[tuple[str, str], str], label: str) -> None:
    """``applied_sources`` recorded the input-batch ids that partials carried, for a deduplication that no writer
    used: every one commits ``source_progress`` rows with its states instead and passed no ids (the table is empty in
    the release fixtures, ``tests/fixtures/release-bd20262``). This version reads nothing in it, so the table goes,
    with its index on PostgreSQL."""
    if ("applied_sources", "root") in types:
        backend.execute("DROP TABLE applied_sources")
        log.warning("%s: dropped applied_sources (exactly once is the books in source_progress)", label)
