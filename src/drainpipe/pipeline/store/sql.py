"""The SQL core of every store: schema, migrations, purge, the idempotent upsert-merge of states, and queries.

Contract (``docs/pipeline.md``, "Output (storage)"): rows are upserts keyed by
(metric, entity, granularity, time_bucket, label); states are merged, not overwritten, so two halves of the
input ingested one after the other give the same values as the whole; and running the pipeline twice over
the same input gives the same values.

Tables (portable SQL: the same statements serve DuckDB and, through :class:`SqlStore`, PostgreSQL)::

    metric_state    (metric, entity, granularity, time_bucket, b, n, v, ok, tol)  a row per key and bin b
    metric_values   (metric, entity, granularity, time_bucket, label, value)       a row per key and label
    topn_values     (name, entity, time_bucket, rank, key, latency_ms)             a row per key and rank
    applied_sources (root, source, name, applied_at)                               primary key (source, name)
    source_progress (source, part, name, end_offset, end_lines, head, node, path, prefix, applied_at)
                                                                                   key (source, part, name)
    definitions     (name, signature)                                              primary key (name)

The merge keeps the first three unique (a key's rows are deleted and re-inserted in one transaction, under
the store's lock). They have no primary key in DuckDB, whose index upkeep made merges ~10x slower; a
PostgreSQL store should index them on (metric|name, granularity, entity, time_bucket).

``time_bucket`` is the bucket start, an instant: ``TIMESTAMP WITH TIME ZONE`` in both databases (so SQL users and
Grafana range-query and chart it natively). The store's API speaks ISO-8601 text (``2026-11-21T10:05:00Z``) as
before: :meth:`Store.query` converts on the way out, bounds are converted on the way in. A store written before the
column was a timestamp (ISO text) is migrated when it is opened, once, table by table (:meth:`SqlStore._migrate_time`).
``metric_state`` holds the mergeable states in the fixed columns of
:data:`~drainpipe.pipeline.state_table.STATE_TABLE_SCHEMA` (one row per percentile bin ``b``, ``b = -1``
otherwise); ``metric_values`` the finalized values (what :meth:`Store.query` reads); for a top-N the ranked
rows are the state.

Merge (:meth:`SqlStore.merge`), one transaction per call, so a failure leaves nothing half-written:

1. every definition's :func:`~drainpipe.pipeline.definitions.signature` is checked against (or recorded in)
   ``definitions``: states of a name computed differently are never merged (:class:`StoreError`);
2. idempotency, see below;
3. the partials are merged per (name, granularity) in memory, and merged minute states are rolled up to hour
   and day (:func:`~drainpipe.pipeline.partials.rollup`); definitions are written in batches of rows;
4. the keys (name, granularity, entity, time_bucket) are staged, the stored states for them read, merged
   with the new ones by :func:`~drainpipe.pipeline.partials.merge` (the one merge implementation, in
   Python, so every SQL backend shares it), and the keys' state and value rows replaced; likewise the top-N
   rows (a handful of statements per call, whatever the number of metrics);
5. the applied (source, name) pairs are recorded.

Idempotency. Merging states is not idempotent by itself (merging a count twice doubles it). So every
partial carries ``sources``: the identities of the input batches it contains (``aggregate_batch(...,
source=...)``, united by ``merge``). A source identity must name one batch of input content, e.g.
``"<file fingerprint>:<batch rows>:<batch index>"``; equal identities must mean equal events, and
``" ~"`` is reserved. The store records (source, name) pairs in ``applied_sources`` in the same transaction
as the states; a source is *applied* for a name when it is recorded, or when all pieces of it are.

* Pieces: a partial may only be cut with :func:`~drainpipe.pipeline.partials.split_partial`, which names
  piece i of k of source ``s`` ``"s ~i/k"`` (deterministically). ``s`` counts as applied once all k pieces
  are, whatever merge calls carried them.
* A partial whose every source is already applied (earlier, or by an earlier partial of the same call) is
  skipped: re-running the same input changes nothing. Two *different* partials of one call carrying the same
  source are refused (:class:`StoreError`): that is a partial cut without ``split_partial``.
* A partial whose sources are only partly applied (say, after a crash between two transactions, a rerun
  merged piece 1 of s, already stored, with new input) cannot be split apart and raises :class:`StoreError`.
  Engines avoid it by asking :meth:`Store.is_applied` (per batch) or :meth:`Store.unapplied` (per partial or
  piece) before the partials of a batch are merged with others.
* A partial without sources is always merged (no deduplication possible).

The ledger (``applied_sources``, ``source_progress``) records when each entry was written (``applied_at``, epoch ms
of the store's :attr:`SqlStore.clock`), so that :meth:`SqlStore.purge` can prune it with the data it vouches for
(:mod:`drainpipe.pipeline.retention`). A store written before that column existed gains it when opened, once,
with the time of opening for the entries it holds.

``applied_sources`` is keyed by (source, name). Writers in several processes (a server store) take a
transaction-scoped lock first (:meth:`SqlStore._lock_writes`), so a second writer of the same pair waits, then
finds it applied and skips it; were the lock missing, the key would still make it fail rather than double-count.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ...errors import Fenced, StoreError, first_line
from ..buckets import GRANULARITIES
from ..clock import now_ms
from ..definitions import Definition, signature
from ..partials import MetricPartial, Partial, TopNPartial, merge, rollup, source_root
from ..retention import Retention
from ..state_table import from_state_table, from_topn_table, to_state_table, to_topn_table
from ..times import instant, iso_from_ms, ms_from_bucket
from ..values import TOPN_COLUMNS, VALUE_COLUMNS, finalize_table
from .ledger import Ledger
from .protocol import MergeReport, PurgeReport, SourceProgress

log = logging.getLogger("drainpipe.store")


#: state rows written per batch of statements within one merge transaction
_WRITE_ROWS = 400_000

_SCHEMA = (
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
    """CREATE TABLE IF NOT EXISTS applied_sources (
        root VARCHAR NOT NULL, source VARCHAR NOT NULL, name VARCHAR NOT NULL, applied_at BIGINT,
        PRIMARY KEY (source, name))""",
    """CREATE TABLE IF NOT EXISTS definitions (name VARCHAR PRIMARY KEY, signature VARCHAR NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS source_progress (
        source VARCHAR NOT NULL, part VARCHAR NOT NULL, name VARCHAR NOT NULL, end_offset BIGINT NOT NULL,
        end_lines BIGINT NOT NULL, head VARCHAR NOT NULL, node VARCHAR NOT NULL, path VARCHAR NOT NULL,
        prefix VARCHAR NOT NULL, applied_at BIGINT, PRIMARY KEY (source, part, name))""",
)
#: the ledger's tables: entries that record applied input, pruned by retention with the data they vouch for
LEDGER_TABLES = ("applied_sources", "source_progress")
#: the ``source_progress`` name of a part's fencing token (:meth:`SqlStore.fence`); no definition is named so
#: (definition names are identifiers)
FENCE = "#fence"
#: the session's staging relations, which the merge's statements join against (see SqlStore._stage)
_STAGING = (
    """CREATE TEMPORARY TABLE IF NOT EXISTS stage_keys (
        name VARCHAR NOT NULL, granularity VARCHAR NOT NULL, entity VARCHAR NOT NULL,
        time_bucket TIMESTAMPTZ NOT NULL)""",
    "CREATE TEMPORARY TABLE IF NOT EXISTS stage_sources (root VARCHAR NOT NULL)",
)
_STAGED = (
    "EXISTS (SELECT 1 FROM stage_keys k WHERE k.name = t.metric AND k.granularity = t.granularity"
    " AND k.entity = t.entity AND k.time_bucket = t.time_bucket)"
)
_STAGED_TOPN = (
    "EXISTS (SELECT 1 FROM stage_keys k WHERE k.name = t.name AND k.entity = t.entity"
    " AND k.time_bucket = t.time_bucket)"
)


class SqlStore:
    """The store logic on top of a few backend primitives (subclasses: DuckDB here, PostgreSQL later).

    Backends implement :meth:`_execute`, :meth:`_fetchall`, :meth:`_fetch_arrow`, :meth:`_insert_arrow`,
    :meth:`_close` and :meth:`_backend_errors` (and may override :meth:`_transaction`). The SQL text here uses
    ``?`` placeholders; a backend with another paramstyle translates them in its primitives. All SQL
    statements and the merge logic live here, once.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._closed = False
        #: the time (epoch ms) the ledger records and purges measure against: drainpipe's clock
        #: (:func:`~drainpipe.pipeline.clock.now_ms`) unless a caller hands in its own, as tests do
        self.clock: Callable[[], int] = now_ms

    # ----------------------------------------------------------------------------- backend primitives

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        raise NotImplementedError

    def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _fetch_arrow(self, sql: str, params: Sequence[Any] = ()) -> pa.Table:
        raise NotImplementedError

    def _insert_arrow(self, table_name: str, rows: pa.Table) -> None:
        """Append ``rows`` (columns in the table's column order) to ``table_name``."""
        raise NotImplementedError

    #: DDL of the staging relations (:meth:`_stage`); a backend that stages otherwise has none
    _STAGING_DDL: tuple[str, ...] = _STAGING

    def _stage(self, name: str, rows: pa.Table) -> None:
        """Make ``rows`` the whole content of the session's staging relation ``name`` (``stage_keys``,
        ``stage_sources``). Here: a temporary table, emptied and refilled. Emptied by TRUNCATE, not DELETE: in a
        long transaction (PostgreSQL) deleted rows stay in the table's pages until it ends, and the planner, which
        sizes a table by its pages, took 15,000 staged keys for 350,000 and hashed them against a whole table."""
        self._execute(f"TRUNCATE {name}")
        self._insert_arrow(name, rows)

    #: how a transaction starts (a server backend pins its isolation level here)
    _BEGIN = "BEGIN TRANSACTION"

    def _lock_writes(self) -> None:
        """Called first in every writing transaction: a backend that other processes write too takes a lock here
        that is held until the transaction ends, so that merges (read stored states, merge, replace) never
        interleave. An embedded file has one writer process already."""

    @contextmanager
    def _write_transaction(self) -> Iterator[None]:
        with self._transaction():
            self._lock_writes()
            yield

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._execute(self._BEGIN)
        try:
            yield
        except BaseException:
            try:
                self._execute("ROLLBACK")
            except Exception:  # the original error says more (e.g. a lost connection)
                pass
            raise
        self._execute("COMMIT")

    def _close(self) -> None:
        raise NotImplementedError

    def _delete(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run a DELETE; the number of rows it deleted."""
        raise NotImplementedError

    def _reclaim(self) -> None:
        raise NotImplementedError

    def _size_bytes(self) -> int:
        raise NotImplementedError

    def _backend_errors(self) -> tuple[type[BaseException], ...]:
        return ()

    # ----------------------------------------------------------------------------- lifecycle

    def _create_schema(self, migrate: bool = True) -> None:
        """Create what is missing; ``migrate``: bring an older store's tables up to date (False: the store was just
        created, and the catalog query, ~20 ms in DuckDB, is not needed)."""
        for statement in _SCHEMA + self._STAGING_DDL:
            self._execute(statement)
        if migrate:
            types = self._column_types()  # one catalog query for every check: each costs milliseconds
            self._migrate_progress(types)
            self._migrate_ledger(types)
            self._migrate_time(types)

    def _column_types(self) -> dict[tuple[str, str], str]:
        """(table, column) -> SQL type (upper case, as information_schema names it) of the columns migrations
        look at."""
        return {
            (str(table), str(column)): str(kind).upper()
            for table, column, kind in self._fetchall(
                "SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND column_name IN ('time_bucket', 'applied_at', 'fid')"
            )
        }

    def _migrate_time(self, types: dict[tuple[str, str], str]) -> None:
        """A store written before ``time_bucket`` was a timestamp holds it as ISO-8601 text: each such table is
        converted in place, once (the text is UTC with a ``Z``, so the cast is exact). Table by table, each check
        first, so an interrupted migration is finished by the next open. ``types``: (table, column) -> SQL type,
        upper case, as information_schema names it."""
        for table in _TIME_TABLES:
            kind = types.get((table, "time_bucket"), "")
            if kind and kind != "TIMESTAMP WITH TIME ZONE":
                self._execute(
                    f"ALTER TABLE {table} ALTER COLUMN time_bucket TYPE TIMESTAMPTZ "
                    "USING CAST(time_bucket AS TIMESTAMPTZ)"
                )
                log.warning("%s: migrated %s: time_bucket %s -> TIMESTAMP WITH TIME ZONE", self, table, kind.lower())

    def _migrate_progress(self, types: dict[tuple[str, str], str]) -> None:
        """A store written before the partitioned-source layer kept its progress in ``file_progress`` (fid, name,
        head, node, path, end_offset, end_lines, prefix[, applied_at]): input files under their identity, and the
        serve log as a row whose fid, head and node are all the log's key. Its rows become ``source_progress``
        rows (``"file"`` and the fid; ``"log"`` and the key), positions unchanged, and the old table is dropped.
        The copy skips rows already there, so a migration interrupted between copy and drop is finished by the
        next open."""
        if ("file_progress", "fid") not in types:
            return
        applied_at = "applied_at" if ("file_progress", "applied_at") in types else str(self.clock())
        self._execute(
            "INSERT INTO source_progress "
            "SELECT CASE WHEN fid = node THEN 'log' ELSE 'file' END, fid, name, end_offset, end_lines, "
            "CASE WHEN fid = node THEN '' ELSE head END, CASE WHEN fid = node THEN '' ELSE node END, path, prefix, "
            f"{applied_at} FROM file_progress ON CONFLICT DO NOTHING"
        )
        self._execute("DROP TABLE file_progress")
        log.warning("%s: migrated file_progress into source_progress (files and the serve log as sources)", self)

    def _migrate_ledger(self, types: dict[tuple[str, str], str]) -> None:
        """A store written before the ledger had ``applied_at`` gains the column, once, with the time of opening for
        the entries it holds (they were written no later: pruning them by it is safe, only later than could be)."""
        for table in ("applied_sources",):
            if (table, "applied_at") not in types:
                self._execute(f"ALTER TABLE {table} ADD COLUMN applied_at BIGINT")
                self._execute(f"UPDATE {table} SET applied_at = ? WHERE applied_at IS NULL", (self.clock(),))
                log.warning("%s: migrated %s: added applied_at (the ledger's record time, for retention)", self, table)

    # ----------------------------------------------------------------------------- retention

    def purge(self, retention: Retention, now_ms: int | None = None) -> PurgeReport:
        """Delete, in one transaction, the rows older than ``retention`` allows at ``now_ms`` (default: the store's
        clock): metric rows per granularity by bucket start, top-N rows, and ledger entries recorded before its
        ledger cut-off (see :mod:`drainpipe.pipeline.retention`). Thread-safe; blocks other writers meanwhile."""
        now = self.clock() if now_ms is None else now_ms
        deleted: dict[str, int] = defaultdict(int)
        with self._guard("purge"), self._write_transaction():
            for granularity, cutoff in retention.metric_cutoffs(now).items():
                for table in ("metric_state", "metric_values"):
                    deleted[table] += self._delete(
                        f"DELETE FROM {table} WHERE granularity = ? AND time_bucket < ?",
                        (granularity, instant(cutoff)),
                    )
            topn = retention.topn_cutoff(now)
            if topn is not None:
                deleted["topn_values"] += self._delete(
                    "DELETE FROM topn_values WHERE time_bucket < ?", (instant(topn),)
                )
            ledger = retention.ledger_cutoff(now)
            if ledger is not None:
                for table in LEDGER_TABLES:
                    deleted[table] += self._delete(f"DELETE FROM {table} WHERE applied_at < ?", (ledger,))
        return PurgeReport(now, dict(deleted))

    def reclaim(self) -> None:
        """Make the space of deleted rows reusable now (DuckDB: a checkpoint; PostgreSQL: VACUUM) rather than when
        the database gets round to it. Outside any transaction; blocks writers meanwhile."""
        with self._guard("reclaim"):
            self._reclaim()

    def size_bytes(self) -> int:
        """The space the store takes: its database file, or its tables with their indexes."""
        with self._guard("measure"):
            return self._size_bytes()

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._close()

    def __enter__(self) -> SqlStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _guard(self, action: str) -> Iterator[None]:
        with self._lock:
            if self._closed:
                raise StoreError(f"cannot {action}: the store is closed")
            try:
                yield
            except StoreError:
                raise
            except self._backend_errors() as exc:
                raise StoreError(f"store {action} failed: {first_line(exc)}") from exc

    # ----------------------------------------------------------------------------- merge

    def merge(
        self,
        partials: Iterable[Partial],
        *,
        rollup: bool = True,
        progress: Sequence[SourceProgress] = (),
        fences: Sequence[SourceProgress] = (),
    ) -> MergeReport:
        parts = list(partials)
        for part in parts:
            if not isinstance(part, (MetricPartial, TopNPartial)):
                raise TypeError(f"not a partial: {part!r}")
            if rollup and isinstance(part, MetricPartial) and part.granularity != "minute":
                raise ValueError(
                    f"{part.name!r}: {part.granularity} states given to merge(rollup=True), which derives hour and "
                    "day from minute states itself; pass minute states only, or all granularities with rollup=False"
                )
        with self._guard("merge"), self._write_transaction():
            self._check_fences(fences)
            self._check_definitions({p.definition for p in parts})
            if progress and self._progress_recorded(progress):
                return MergeReport(applied=0, skipped=len(parts))
            fresh, pairs = self._fresh(parts)
            grouped: dict[tuple[Definition, str], list[Partial]] = defaultdict(list)
            for part in fresh:
                grouped[(part.definition, getattr(part, "granularity", ""))].append(part)
            self._write_groups(grouped.values(), rollup)
            self._record(pairs)
            # the tokens are recorded again with the progress: their record time moves on with it, so a retention
            # purge of the ledger never takes the token of a part that is still being written
            self._record_progress([*progress, *(SourceProgress(f.source, f.part, FENCE, f.end) for f in fences)])
        return MergeReport(applied=len(fresh), skipped=len(parts) - len(fresh))

    def merge_chunks(
        self, definitions: Iterable[Definition], chunks: Iterable[Partial], *, progress: Sequence[SourceProgress] = ()
    ) -> MergeReport:
        with self._guard("merge"), self._write_transaction():
            self._check_definitions(set(definitions))
            if progress and self._progress_recorded(progress):
                return MergeReport(applied=0, skipped=0)
            count = 0
            pending: list[Partial] = []
            rows = 0
            for chunk in chunks:
                if not isinstance(chunk, (MetricPartial, TopNPartial)) or chunk.sources:
                    raise TypeError(f"merge_chunks takes partials without sources, not {chunk!r}")
                count += 1
                pending.append(chunk)
                rows += chunk.table.num_rows
                if rows >= _WRITE_ROWS:
                    self._write_chunks(pending)
                    pending, rows = [], 0
            self._write_chunks(pending)
            self._record_progress(progress)
        return MergeReport(applied=count, skipped=0)

    def _write_chunks(self, chunks: list[Partial]) -> None:
        """Write a batch of chunks into the states already stored (earlier chunks of this transaction included);
        chunks of one definition may share keys."""
        grouped: dict[Definition, list[Partial]] = defaultdict(list)
        for chunk in chunks:
            if chunk.table.num_rows:
                grouped[chunk.definition].append(chunk)
        self._write_groups(grouped.values(), True)

    def _write_groups(self, groups: Iterable[list[Partial]], rollup: bool) -> None:
        """Each group (partials of one definition and granularity) merged first and, with ``rollup``, rolled up once
        (merging is associative: the roll-up of the merge is the merge of the roll-ups); written into the stored
        states in batches of about _WRITE_ROWS state rows, so memory holds a batch, not every state of the
        transaction, and statements stay few."""
        metrics: list[MetricPartial] = []
        topns: list[TopNPartial] = []
        for group in groups:
            for m in self._granular(merge(group), rollup):
                if isinstance(m, MetricPartial):
                    metrics.append(m)
                elif isinstance(m, TopNPartial):
                    topns.append(m)
            if sum(m.table.num_rows for m in metrics) >= _WRITE_ROWS:
                self._merge_metrics([m for m in metrics if m.table.num_rows])
                metrics = []
        if any(m.table.num_rows for m in metrics):
            self._merge_metrics([m for m in metrics if m.table.num_rows])
        if any(t.table.num_rows for t in topns):
            self._merge_topns([t for t in topns if t.table.num_rows])

    # ----------------------------------------------------------------------------- fencing

    def fence(self, source: str, part: str) -> int:
        """Issue ``part``'s next fencing token (one transaction; the first is 1): from now on a merge carrying an
        older one for it raises :class:`~drainpipe.errors.Fenced`. A new owner of a part (a member given a Kafka
        partition) takes one before it reads the part's progress: a commit of the old owner lands before that
        read, and is seen, or after it, and is refused. The token is a ``source_progress`` row of the part named
        :data:`FENCE`, recorded again by every merge that carries it: it is pruned with the part's progress, never
        while the part is being written."""
        with self._guard("fence"), self._write_transaction():
            token = self._fence_of(source, part) + 1
            self._record_progress([SourceProgress(source, part, FENCE, token)])
        return token

    def fence_token(self, source: str, part: str) -> int:
        """``part``'s latest fencing token (0: none issued)."""
        with self._guard("read a fence"):
            return self._fence_of(source, part)

    def _fence_of(self, source: str, part: str) -> int:
        rows = self._fetchall(
            "SELECT end_offset FROM source_progress WHERE source = ? AND part = ? AND name = ?", (source, part, FENCE)
        )
        return int(rows[0][0]) if rows else 0

    def _check_fences(self, fences: Sequence[SourceProgress]) -> None:
        """Refuse the transaction (before it writes anything) when a part's token has moved past the one given.
        Write transactions run one at a time (:meth:`_lock_writes`), so the check holds until the commit."""
        for fence in fences:
            now = self._fence_of(fence.source, fence.part)
            if now != fence.end:
                raise Fenced(f"{fence.source} part {fence.part!r} is fenced: token {fence.end}, the store's is {now} "
                             "(another owner took it over)")  # fmt: skip

    def _progress_recorded(self, progress: Sequence[SourceProgress]) -> bool:
        """Whether the store already has every row of ``progress`` at or past its position: the transaction that
        brought them committed (a retry after a COMMIT whose acknowledgement was lost finds this, and skips)."""
        stored: dict[tuple[str, str, str], int] = {}
        for (source, part), _ in self._by_part(progress).items():
            for name, end in self._fetchall(
                "SELECT name, end_offset FROM source_progress WHERE source = ? AND part = ?", (source, part)
            ):
                stored[(source, part, name)] = end
        for row in progress:
            end = stored.get((row.source, row.part, row.name))
            if end is None or (end != -1 and (row.end == -1 or end < row.end)):
                return False
        return True

    @staticmethod
    def _by_part(progress: Sequence[SourceProgress]) -> dict[tuple[str, str], dict[str, SourceProgress]]:
        """The rows per (source, part), the last of a (source, part, name) holding, as one replace after another."""
        by_part: dict[tuple[str, str], dict[str, SourceProgress]] = defaultdict(dict)
        for row in progress:
            by_part[(row.source, row.part)][row.name] = row
        return by_part

    def _record_progress(self, progress: Sequence[SourceProgress]) -> None:
        """Replace the rows of ``progress`` (a part's row per definition): two statements per part, not two per row
        (a checkpoint of 17 definitions spent 25 ms on 34 statements)."""
        now = self.clock()
        for (source, part), named in self._by_part(progress).items():
            rows = list(named.values())
            self._execute(
                f"DELETE FROM source_progress WHERE source = ? AND part = ? AND name IN ({', '.join('?' * len(rows))})",
                (source, part, *(row.name for row in rows)),
            )
            self._execute(
                f"INSERT INTO source_progress VALUES {', '.join(['(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)'] * len(rows))}",
                [v for r in rows for v in (r.source, r.part, r.name, r.end, r.lines, r.head, r.node, r.path, r.prefix,
                                           now)],
            )  # fmt: skip

    def register(self, definitions: Iterable[Definition]) -> None:
        with self._guard("register definitions"), self._write_transaction():
            self._check_definitions(set(definitions))

    def progress(
        self, source: str, *, part: str | None = None, head: str | None = None, node: str | None = None
    ) -> list[SourceProgress]:
        where, params = ["source = ?"], [source]
        if part is not None:
            where.append("part = ?")
            params.append(part)
        if head is not None or node is not None:
            where.append("(head = ? OR node = ?)")
            params += [head or "", node or ""]
        with self._guard("read"):
            rows = self._fetchall(
                "SELECT source, part, name, end_offset, end_lines, head, node, path, prefix FROM source_progress "
                f"WHERE {' AND '.join(where)} ORDER BY part, name",
                params,
            )
        return [SourceProgress(*row) for row in rows]

    @staticmethod
    def _granular(part: Partial, with_rollup: bool) -> list[Partial]:
        if isinstance(part, MetricPartial) and with_rollup and part.granularity == "minute":
            return [part, rollup(part, "hour"), rollup(part, "day")]
        return [part]

    def _check_definitions(self, definitions: set[Definition]) -> None:
        if not definitions:
            return
        wanted = {d.name: signature(d) for d in definitions}
        if len(wanted) != len(definitions):
            raise StoreError("one merge holds two different definitions with the same name")
        names = sorted(wanted)
        marks = ", ".join("?" * len(names))
        stored = dict(self._fetchall(f"SELECT name, signature FROM definitions WHERE name IN ({marks})", names))
        missing = [name for name in names if name not in stored]
        if missing:
            # under the write lock no one else registers now; ON CONFLICT still makes a writer that does not take
            # it (an older version) lose nothing: the row it wrote is compared below like any other. One statement:
            # a fresh store registers every definition at once.
            self._execute(
                f"INSERT INTO definitions VALUES {', '.join(['(?, ?)'] * len(missing))} ON CONFLICT (name) DO NOTHING",
                [value for name in missing for value in (name, wanted[name])],
            )
            stored = dict(self._fetchall(f"SELECT name, signature FROM definitions WHERE name IN ({marks})", names))
        for name in names:
            if stored[name] != wanted[name]:
                raise StoreError(
                    f"{name!r} is stored with a different definition ({stored[name]}); use another store or name"
                )

    def _fresh(self, parts: list[Partial]) -> tuple[list[Partial], set[tuple[str, str]]]:
        """The partials not applied yet, and the (source, name) pairs they bring (see the module docstring).

        ``stored`` answers for earlier calls; ``call`` for this one, per granularity, since a call may carry
        a source's minute, hour and day states (``rollup=False``) and they are not duplicates of each other.
        """
        stored = self._ledger({source for p in parts for source in p.sources})
        call = Ledger(())
        first: dict[tuple[str, str], Partial] = {}
        fresh: list[Partial] = []
        pairs: set[tuple[str, str]] = set()
        for part in parts:
            state = stored.state(part.sources, part.name)
            if state == "new":
                channel = f"{part.name}@{getattr(part, 'granularity', '')}"
                state = call.state(part.sources, channel)
                if state == "applied" and any(
                    first.get((source, channel)) is None or not first[(source, channel)].table.equals(part.table)
                    for source in part.sources
                ):
                    raise StoreError(
                        f"{part.name!r}: two different partials carry source {sorted(part.sources)[0]!r}; cut "
                        "partials only with functions.split_partial, which gives each piece its own source"
                    )
            if state == "applied":
                continue
            if state == "partly":
                raise StoreError(
                    f"{part.name!r}: states mix input already applied and new input (sources "
                    f"{', '.join(sorted(part.sources)[:3])}); ask Store.unapplied() before merging them with others"
                )
            for source in part.sources:
                call.add(source, channel)
                first[(source, channel)] = part
                pairs.add((source, part.name))
            fresh.append(part)
        return fresh, pairs

    def _ledger(self, sources: set[str]) -> Ledger:
        """The recorded (source, name) pairs that bear on ``sources`` (everything under their roots)."""
        if not sources:
            return Ledger(())
        roots = sorted({source_root(s) for s in sources})
        self._stage("stage_sources", pa.table({"root": roots}, schema=_ROOT_SCHEMA))
        rows = self._fetchall("SELECT a.source, a.name FROM applied_sources a JOIN stage_sources s ON a.root = s.root")
        return Ledger(rows)

    def _record(self, pairs: set[tuple[str, str]]) -> None:
        if pairs:
            ordered = sorted(pairs)
            self._insert_arrow(
                "applied_sources",
                pa.table(
                    {
                        "root": [source_root(s) for s, _ in ordered],
                        "source": [s for s, _ in ordered],
                        "name": [n for _, n in ordered],
                        "applied_at": [self.clock()] * len(ordered),
                    },
                    schema=_APPLIED_SCHEMA,
                ),
            )

    def _stage_keys(self, keys: pa.Table) -> None:
        """Replace the staged keys by the distinct (name, granularity, entity, time_bucket) rows of ``keys``."""
        distinct = keys.group_by(list(_KEY_COLUMNS), use_threads=False).aggregate([]).select(list(_KEY_COLUMNS))
        self._stage("stage_keys", distinct)

    def _in_range(self, table: str, name_column: str, names: Iterable[str], new_rows: pa.Table) -> bool:
        """Whether ``table`` holds any row of ``names`` within the time buckets that ``new_rows`` span. When it holds
        none, no new key can be stored yet, and staging the keys to look them up is skipped: a run into a new store,
        or over the next hour of input (minute keys of new time), writes without a join."""
        lo, hi = pc.min_max(new_rows.column("time_bucket")).values()
        names = sorted(set(names))
        found = self._fetchall(
            f"SELECT 1 FROM {table} WHERE time_bucket BETWEEN ? AND ? "
            f"AND {name_column} IN ({', '.join('?' * len(names))}) LIMIT 1",
            (lo.as_py(), hi.as_py(), *names),
        )
        return bool(found)

    def _merge_metrics(self, parts: list[MetricPartial]) -> None:
        """Merge stored states into the new ones for every key of ``parts``; replace their state and value rows."""
        new_states = pa.concat_tables(_with_key(to_state_table(p), p.name, p.granularity) for p in parts)
        combined = parts
        if self._in_range("metric_state", "metric", (p.name for p in parts), new_states):
            self._stage_keys(new_states)
            stored = self._fetch_arrow(f"SELECT {', '.join(_STATE_COLUMNS)} FROM metric_state t WHERE {_STAGED}")
            combined = [
                merge([part, from_state_table(part.definition, part.granularity, found)]) if found.num_rows else part
                for part, found in zip(parts, _split(stored, "metric", [(p.name, p.granularity) for p in parts]))
            ]
            if stored.num_rows:  # a key has value rows only with state rows: none stored, none to delete
                self._execute(f"DELETE FROM metric_state t WHERE {_STAGED}")
                self._execute(f"DELETE FROM metric_values t WHERE {_STAGED}")
                new_states = pa.concat_tables(_with_key(to_state_table(c), c.name, c.granularity) for c in combined)
        self._insert_arrow("metric_state", new_states.select(list(_STATE_COLUMNS)))
        self._insert_arrow(
            "metric_values",
            pa.concat_tables(finalize_table(c, stored=True) for c in combined).select(list(VALUE_COLUMNS)),
        )

    def _merge_topns(self, parts: list[TopNPartial]) -> None:
        """Merge stored top-N rows into the new ones for every key of ``parts``; replace their rows."""
        new_rows = pa.concat_tables(_with_key(to_topn_table(p), p.name, _TOPN_GRANULARITY) for p in parts)
        if self._in_range("topn_values", "name", (p.name for p in parts), new_rows):
            self._stage_keys(new_rows)
            stored = self._fetch_arrow(f"SELECT {', '.join(TOPN_COLUMNS)} FROM topn_values t WHERE {_STAGED_TOPN}")
            if stored.num_rows:
                combined = [
                    merge([part, from_topn_table(part.definition, found)]) if found.num_rows else part
                    for part, found in zip(parts, _split(stored, "name", [(p.name, None) for p in parts]))
                ]
                self._execute(f"DELETE FROM topn_values t WHERE {_STAGED_TOPN}")
                new_rows = pa.concat_tables(to_topn_table(c) for c in combined)
        self._insert_arrow("topn_values", new_rows.select(list(TOPN_COLUMNS)))

    # ----------------------------------------------------------------------------- reads

    def applied(self, source: str) -> frozenset[str]:
        with self._guard("read"):
            ledger = self._ledger({source})
        return frozenset(name for name in ledger.names if ledger.applied(source, name))

    def is_applied(self, source: str, names: Iterable[str] | None = None) -> bool:
        with self._guard("read"):
            if names is None:
                names = [name for (name,) in self._fetchall("SELECT name FROM definitions")]
            ledger = self._ledger({source})
        names = list(names)
        return bool(names) and all(ledger.applied(source, name) for name in names)

    def has_sources(self, prefix: str) -> bool:
        pattern = _like_prefix(prefix)
        with self._guard("read"):
            return bool(
                self._fetchall("SELECT 1 FROM applied_sources WHERE root LIKE ? ESCAPE '\\' LIMIT 1", [pattern])
            )

    def unapplied(self, partials: Iterable[Partial]) -> list[Partial]:
        parts = list(partials)
        with self._guard("read"):
            ledger = self._ledger({source for p in parts for source in p.sources})
        out = []
        for part in parts:
            state = ledger.state(part.sources, part.name)
            if state == "partly":
                raise StoreError(
                    f"{part.name!r}: partial mixes applied and new sources ({', '.join(sorted(part.sources)[:3])})"
                )
            if state == "new":
                out.append(part)
        return out

    def query(
        self,
        metric: str | None = None,
        entity: str | None = None,
        granularity: str | None = None,
        start: Any = None,
        end: Any = None,
        entity_prefix: str | None = None,
    ) -> list[tuple[str, str, str, str, str, float]]:
        if granularity is not None and granularity not in GRANULARITIES:
            raise StoreError(f"unknown granularity {granularity!r} (expected one of {', '.join(GRANULARITIES)})")
        where, params = _filters(
            [("metric = ?", metric), ("entity = ?", entity), ("granularity = ?", granularity),
             ("entity LIKE ? ESCAPE '\\'", None if entity_prefix is None else _like_prefix(entity_prefix))],
            start, end,
        )  # fmt: skip
        sql = f"SELECT {', '.join(VALUE_COLUMNS)} FROM metric_values{where} ORDER BY {', '.join(VALUE_COLUMNS[:5])}"
        with self._guard("query"):
            return _rows(self._fetch_arrow(sql, params))

    def query_topn(
        self, name: str, entity: str | None = None, start: Any = None, end: Any = None,
        entity_prefix: str | None = None,
    ) -> list[tuple[str, str, str, int, str, float]]:  # fmt: skip
        where, params = _filters(
            [("name = ?", name), ("entity = ?", entity),
             ("entity LIKE ? ESCAPE '\\'", None if entity_prefix is None else _like_prefix(entity_prefix))],
            start, end,
        )  # fmt: skip
        sql = f"SELECT {', '.join(TOPN_COLUMNS)} FROM topn_values{where} ORDER BY name, entity, time_bucket, rank"
        with self._guard("query"):
            return _rows(self._fetch_arrow(sql, params))

    def stored_names(self) -> dict[str, str]:
        with self._guard("query"):
            rows = self._fetchall("SELECT name, signature FROM definitions ORDER BY name")
        return {name: json.loads(sig).get("kind", "metric") for name, sig in rows}


_ROOT_SCHEMA = pa.schema([("root", pa.string())])
_APPLIED_SCHEMA = pa.schema(
    [("root", pa.string()), ("source", pa.string()), ("name", pa.string()), ("applied_at", pa.int64())]
)


_KEY_COLUMNS = ("name", "granularity", "entity", "time_bucket")
#: the tables whose time_bucket is a timestamp (stage_keys is temporary: created with the type)
_TIME_TABLES = ("metric_state", "metric_values", "topn_values")


def _like_prefix(prefix: str) -> str:
    """A LIKE pattern (with ``ESCAPE '\\'``) matching the strings that start with ``prefix``."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    """Stored rows as tuples, with time_bucket as ISO-8601 text (the API's form, whatever the column type)."""
    if table.num_rows == 0:
        return []
    i = table.column_names.index("time_bucket")
    table = table.set_column(i, "time_bucket", iso_from_ms(ms_from_bucket(table.column(i))))
    return list(zip(*(column.to_pylist() for column in table.columns)))


_STATE_COLUMNS = ("metric", "entity", "granularity", "time_bucket", "b", "n", "v", "ok", "tol")
_TOPN_GRANULARITY = "topn"  # a label for the staged keys only (top-N rows have no granularity column)


def _with_key(table: pa.Table, name: str, granularity: str) -> pa.Table:
    """``table`` with constant ``name``/``metric`` and ``granularity`` columns added."""
    rows = table.num_rows
    for column, value in (("name", name), ("metric", name), ("granularity", granularity)):
        if column not in table.column_names:
            table = table.append_column(column, pa.repeat(pa.scalar(value, pa.string()), rows))
    return table


def _split(stored: pa.Table, name_column: str, keys: list[tuple[str, str | None]]) -> list[pa.Table]:
    """The rows of ``stored`` per (name, granularity) key (granularity None: any)."""
    out = []
    names = stored.column(name_column)
    for name, granularity in keys:
        mask = pc.equal(names, name)
        if granularity is not None:
            mask = pc.and_(mask, pc.equal(stored.column("granularity"), granularity))
        out.append(stored.filter(mask))
    return out


def _filters(equal: list[tuple[str, Any]], start: Any, end: Any) -> tuple[str, list[Any]]:
    clauses = [(sql, value) for sql, value in equal if value is not None]
    if start is not None:
        clauses.append(("time_bucket >= ?", instant(start)))
    if end is not None:
        clauses.append(("time_bucket <= ?", instant(end)))
    if not clauses:
        return "", []
    return " WHERE " + " AND ".join(sql for sql, _ in clauses), [value for _, value in clauses]


#: DuckDB options a store sets unless its URL says otherwise. No table of a store has a meaningful row order (every
