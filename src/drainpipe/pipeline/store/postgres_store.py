"""The PostgreSQL store (``postgresql://user:pass@host:port/db``, psycopg 3).

Same semantics as the DuckDB store, because it *is* the same store: every SQL statement and the whole
idempotent upsert-merge live in :class:`~drainpipe.pipeline.store.sql.SqlStore`; this module only supplies the
backend primitives (``?`` placeholders become ``%s``; Arrow rows go in with ``COPY ... FROM STDIN`` and come
back as Arrow tables) plus what a server database needs beyond an embedded file:

* indexes on the key columns (metric|name, granularity, entity, time_bucket) and on ``applied_sources.root``,
  as the store module's docstring asks of a server store;
* schema creation under an advisory lock, so two processes opening one database at once do not race;
* a lost or refused connection (server restarting, network gone) raises
  :class:`~drainpipe.pipeline.engine.StoreUnavailable`, which the engine retries with backoff; the next call
  reconnects (and recreates the session's temporary staging tables). A transaction cut off by the failure is
  rolled back by the server, so a retried merge starts from a clean state; if the connection died *during*
  COMMIT and the commit did land, the retry finds its sources in ``applied_sources`` and skips them: nothing
  is counted twice.

Failures are sorted into two kinds, because a server must never drop what it acknowledged:

* transient, :class:`~drainpipe.errors.StoreUnavailable`, retried with backoff by the engine (and the data waits
  in the write-ahead log meanwhile): every ``psycopg.OperationalError``, which is a lost or refused connection,
  an administrator or crash shutdown, a serialization failure (SQLSTATE 40001), a deadlock (40P01), a lock not
  available (55P03), a cancelled statement, and insufficient resources (53xxx: disk full, too many connections);
* permanent, :class:`~drainpipe.errors.StoreError`: everything else (a constraint, a type mismatch, a definition
  stored with another signature). ``drainpipe serve`` then stops accepting (503, unhealthy) and keeps the data in
  its write-ahead log until it is restarted with the cause fixed.

Several processes may write one database at once (servers, ``drainpipe run``, a Spark driver): every writing
transaction runs at READ COMMITTED and takes one advisory lock first (:meth:`PostgresStore._lock_writes`), so
merges are serial and each reads what the previous one committed; definitions are registered with
``INSERT ... ON CONFLICT DO NOTHING`` and compared after.

One connection per store, serialised by the store's lock (the engine writes from one persist thread).
"""

from __future__ import annotations

import io
import re
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from ...errors import StoreError, StoreUnavailable, first_line
from .sql import SqlStore

__all__ = ["PostgresStore"]

_INDEXES = (
    "CREATE INDEX IF NOT EXISTS metric_state_key ON metric_state (metric, granularity, entity, time_bucket)",
    "CREATE INDEX IF NOT EXISTS metric_values_key ON metric_values (metric, granularity, entity, time_bucket)",
    "CREATE INDEX IF NOT EXISTS topn_values_key ON topn_values (name, entity, time_bucket)",
    "CREATE INDEX IF NOT EXISTS applied_sources_root ON applied_sources (root)",
)
_SCHEMA_LOCK = 0x647261696E  # pg_advisory_xact_lock key ("drain")
_WRITE_LOCK = 0x6D65726765  # pg_advisory_xact_lock key ("merge"): every writing transaction, see _lock_writes

# PostgreSQL type OIDs -> Arrow types for _fetch_arrow (anything else: inferred from the values)
_ARROW_TYPES = {
    16: pa.bool_(),
    20: pa.int64(),
    21: pa.int16(),
    23: pa.int32(),
    700: pa.float32(),
    701: pa.float64(),
    25: pa.string(),
    1043: pa.string(),
    1042: pa.string(),
    19: pa.string(),
    1184: pa.timestamp("us", tz="UTC"),  # timestamptz: psycopg gives aware datetimes, converted to UTC instants
}


def _pg_sql(sql: str) -> str:
    """``?`` placeholders -> psycopg's ``%s`` (a literal ``%`` is doubled). The store's SQL has no ``?`` in
    string literals."""
    return sql.replace("%", "%%").replace("?", "%s")


def _redact(url: str) -> str:
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


class PostgresStore(SqlStore):
    """A store in a PostgreSQL database. Open with :meth:`from_url` (or :func:`open_store`)."""

    def __init__(self, conninfo: str, *, connect_timeout: float = 5.0, display: str | None = None) -> None:
        super().__init__()
        import psycopg

        self._psycopg = psycopg
        self._conninfo = conninfo
        self._connect_timeout = connect_timeout
        self._display = display or _redact(conninfo)
        self._con: Any = None
        self.reconnects = 0
        try:
            self._connect()
        except StoreUnavailable as exc:
            raise StoreError(f"cannot open postgresql store {self._display}: {exc}") from None
        except psycopg.Error as exc:
            self._drop()
            raise StoreError(f"cannot use postgresql store {self._display}: {first_line(exc)}") from None

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> PostgresStore:
        """``postgresql://user:pass@host:port/db[?options]`` (``postgres://`` too): a libpq URI."""
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme.lower() not in ("postgresql", "postgres"):
            raise StoreError(f"bad store URL {_redact(url)!r}: expected postgresql://user:pass@host:port/db")
        if not parsed.path.strip("/"):
            raise StoreError(f"bad store URL {_redact(url)!r}: no database name (postgresql://user:pass@host:port/db)")
        try:
            _ = parsed.port  # raises for a port that is not a number
        except ValueError:
            raise StoreError(f"bad store URL {_redact(url)!r}: bad port") from None
        conninfo = urllib.parse.urlunsplit(("postgresql",) + tuple(parsed)[1:])
        return cls(conninfo, display=_redact(url), **kwargs)

    def __repr__(self) -> str:
        return f"PostgresStore({self._display!r})"

    # ----------------------------------------------------------------------------- connection

    def _connect(self) -> None:
        psycopg = self._psycopg
        try:
            self._con = psycopg.connect(
                self._conninfo, autocommit=True, connect_timeout=max(1, int(self._connect_timeout))
            )
        except psycopg.OperationalError as exc:
            self._con = None
            raise StoreUnavailable(f"server unreachable: {first_line(exc)}") from exc
        self._create_schema()

    def _drop(self) -> None:
        con, self._con = self._con, None
        if con is not None:
            try:
                con.close()
            except Exception:
                pass

    def _connected(self) -> bool:
        con = self._con
        return con is not None and not con.closed and not con.broken

    def _create_schema(self, migrate: bool = True) -> None:
        with self._transaction():
            self._execute(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})")
            super()._create_schema(migrate)
            for statement in _INDEXES:
                self._execute(statement)

    @contextmanager
    def _guard(self, action: str) -> Iterator[None]:
        """As :meth:`SqlStore._guard`, plus: connect if needed; a lost connection is :class:`StoreUnavailable`."""
        psycopg = self._psycopg
        with self._lock:
            if self._closed:
                raise StoreError(f"cannot {action}: the store is closed")
            try:
                if not self._connected():
                    self._drop()
                    self._connect()
                    self.reconnects += 1
                yield
            except (StoreError, StoreUnavailable):
                if not self._connected():
                    self._drop()
                raise
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                # connection lost, server shutting down / starting up, or a transient failure: retry later
                if not self._connected():
                    self._drop()
                raise StoreUnavailable(f"postgresql {action} failed: {first_line(exc)}") from exc
            except psycopg.Error as exc:
                raise StoreError(f"store {action} failed: {first_line(exc)}") from exc

    # ----------------------------------------------------------------------------- concurrent writers

    #: the merge's correctness rests on READ COMMITTED (each statement sees what committed before it started, so
    #: the states read after the write lock is granted include the previous holder's); pinned here so that a
    #: server or role whose default_transaction_isolation is stricter does not take the snapshot before the lock
    _BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"

    def _lock_writes(self) -> None:
        """Several processes (servers, ``drainpipe run``, a Spark driver) may write one database. A merge reads
        the stored states of its keys, merges them in Python and replaces them; two interleaved merges of one key
        would both read the old state and one's addition would be lost. So every writing transaction takes one
        transaction-scoped advisory lock first: merges into one database are serial, in commit order. Why not
        finer: every merge of minute states also rewrites the hour and day states of the same entities, which
        concurrent writers share, so per-key locks would serialize them as much, with deadlocks to handle."""
        self._execute(f"SELECT pg_advisory_xact_lock({_WRITE_LOCK})")

    # ----------------------------------------------------------------------------- planning the keyed statements

    def _stage(self, name: str, rows: pa.Table) -> None:
        """As :meth:`SqlStore._stage`; and the statements that follow, which join the staged keys with a keyed
        table, are planned for a cached table. A long merge (a Spark job's output, in one transaction) grows the
        tables, and with PostgreSQL's default random_page_cost (4.0, a spinning disk) the planner hashed each write
        batch's keys and scanned the whole table, up to ~25M rows: 7.5 s per batch at 12M rows, against 3.1 s by
        the index with 1.1 (quadratic in all: the Spark job's 10M-row write did not finish in 20 minutes). JIT
        compilation, which cost more than these statements save, is off for them too."""
        super()._stage(name, rows)
        if name == "stage_keys":
            self._execute("SET LOCAL random_page_cost = 1.1")
            self._execute("SET LOCAL jit = off")

    def _in_range(self, table: str, name_column: str, names: Iterable[str], new_rows: pa.Table) -> bool:
        """Always look the keys up. The probe of :meth:`SqlStore._in_range` has no index here (time_bucket is the
        last column of the key indexes), so a probe that finds nothing would read every row of the metrics."""
        return True

    # ----------------------------------------------------------------------------- backend primitives

    def _backend_errors(self) -> tuple[type[BaseException], ...]:
        return (self._psycopg.Error,)

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        if params:
            self._con.execute(_pg_sql(sql), list(params))
        else:
            self._con.execute(sql)

    def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cur = self._con.execute(_pg_sql(sql), list(params)) if params else self._con.execute(sql)
        return cur.fetchall()

    def _fetch_arrow(self, sql: str, params: Sequence[Any] = ()) -> pa.Table:
        cur = self._con.execute(_pg_sql(sql), list(params)) if params else self._con.execute(sql)
        rows = cur.fetchall()
        columns = list(zip(*rows)) if rows else [()] * len(cur.description)
        return pa.table(
            {
                d.name: pa.array(list(values), type=_ARROW_TYPES.get(d.type_code))
                for d, values in zip(cur.description, columns)
            }
        )

    def _insert_arrow(self, table_name: str, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        # Arrow's CSV writer quotes every string ("" stays an empty string) and leaves nulls unquoted and
        # empty, which is exactly what COPY's CSV format reads back; floats are written round-trip exact.
        sink = io.BytesIO()
        pacsv.write_csv(rows, sink, pacsv.WriteOptions(include_header=False))
        names = ", ".join(f'"{n}"' for n in rows.column_names)
        with self._con.cursor() as cur, cur.copy(f"COPY {table_name} ({names}) FROM STDIN WITH (FORMAT csv)") as copy:
            copy.write(sink.getbuffer())

    def _delete(self, sql: str, params: Sequence[Any] = ()) -> int:
        cur = self._con.execute(_pg_sql(sql), list(params)) if params else self._con.execute(sql)
        return max(0, cur.rowcount)

    def _reclaim(self) -> None:
        # VACUUM runs outside a transaction (the connection is in autocommit between the store's own BEGINs)
        self._con.execute("VACUUM metric_state, metric_values, topn_values, applied_sources, source_progress")

    def _size_bytes(self) -> int:
        row = self._con.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' AND c.relname = ANY(%s)",
            (["metric_state", "metric_values", "topn_values", "applied_sources", "source_progress", "definitions"],),
        ).fetchone()
        return int(row[0]) if row else 0

    def _close(self) -> None:
        self._drop()
