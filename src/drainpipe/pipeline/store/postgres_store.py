"""The PostgreSQL store (``postgresql://user:pass@host:port/db``, psycopg 3): its backend, and the store over it.

Same semantics as the DuckDB store, because it *is* the same store (:class:`~drainpipe.pipeline.store.sql.SqlStore`,
its books, registry, queries and purge); :class:`PostgresBackend` supplies the primitives (``?`` placeholders become
``%s``; Arrow rows go in with ``COPY ... FROM STDIN`` and come back as Arrow tables) plus what a server database that
several writers share needs beyond an embedded file:

* the merge done by the server (:mod:`.database_merge`, a function of the server's): a writer merges its states at
  its commit, or, while another merges, queues them with its commit, and a fold merges every writer's queued
  states, holding a stripe's merge lock for one statement of the server's, never waiting for it;
* indexes on the key columns (metric|name, granularity, entity, time_bucket; unique on the state key and on the
  value key), as :mod:`.schema` says of a server store, and a percentile key's bins in one row;
* schema creation under an advisory lock, so two processes opening one database at once do not race;
* a lost or refused connection (server restarting, network gone) raises
  :class:`~drainpipe.errors.StoreUnavailable`, which the engine retries with backoff; the next call reconnects (and
  recreates the session's temporary staging tables). A transaction cut off by the failure is rolled back by the
  server, so a retried merge starts from a clean state; if the connection died *during* COMMIT and the commit did
  land, the retry finds its progress rows in the books (:mod:`.books`) and writes nothing: nothing is counted
  twice.

Failures are sorted into two kinds, because a server must never drop what it acknowledged:

* transient, :class:`~drainpipe.errors.StoreUnavailable`, retried with backoff by the engine (and the data waits
  in the write-ahead log meanwhile): every ``psycopg.OperationalError``, which is a lost or refused connection,
  an administrator or crash shutdown, a serialization failure (SQLSTATE 40001), a deadlock (40P01), a lock not
  available (55P03), a cancelled statement, and insufficient resources (53xxx: disk full, too many connections);
* permanent, :class:`~drainpipe.errors.StoreError`: everything else (a constraint, a type mismatch, a definition
  stored with another signature). ``drainpipe serve`` then stops accepting (503, unhealthy) and keeps the data in
  its write-ahead log until it is restarted with the cause fixed.

Several processes may write one database at once (servers, ``drainpipe run``, a Spark driver, ``consume``
members): every writing transaction runs at READ COMMITTED and takes its parts' books' advisory locks before it
touches a shared table (:meth:`PostgresBackend.lock_books`); a writer that finds no merge running merges its states
at its commit, with every state queued before it; else its commit queues them, and the folds after it merge every
writer's queued states, a stripe of the keys at a time under the stripe's lock (:meth:`PostgresBackend.lock_merges`;
a stripe whose lock is held is left to its holder, which looks again after its commit), so merges of a key are
serial and each reads what the previous one committed; definitions are registered with
``INSERT ... ON CONFLICT DO NOTHING`` and compared after.

One connection per store, serialised by the store's lock (the engine writes from one persist thread).
"""

from __future__ import annotations

import hashlib
import io
import re
import urllib.parse
import zlib
from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ...errors import StoreError, StoreUnavailable, first_line
from .backend import Prepare, sql_transaction
from .database_merge import (
    LOCK_SPACE,
    MERGE_LOCK,
    QUEUE_DDL,
    QUEUE_TABLES,
    STAGING_DDL,
    STATE_KEY_INDEX,
    STRIPES,
    VALUE_KEY_INDEX,
    define_merge_function,
    pack_stored_bins,
)
from .sql import SqlStore

__all__ = ["ENTITY_BYTES", "NUL_REPLACEMENT", "PostgresBackend", "PostgresStore", "bounded_entity"]

_INDEXES = (
    STATE_KEY_INDEX,  # (the merge's ON CONFLICT; it serves every lookup the former key index served)
    "DROP INDEX IF EXISTS metric_state_key",
    # room in each page for the merge's updates: an updated state then stays on its page with no new index entry
    # (a HOT update); the upserts of four members' overlapping states took 40% less time than at 100. Set once:
    # an ALTER at every connection would rewrite the catalog row and wait for a VACUUM of the table
    *(
        f"DO $$ BEGIN IF NOT 'fillfactor=75' = ANY(coalesce((SELECT reloptions FROM pg_class"
        f" WHERE oid = '{table}'::regclass), '{{}}'))"
        f" THEN ALTER TABLE {table} SET (fillfactor = 75); END IF; END $$"
        for table in ("metric_state", "metric_values")
    ),
    VALUE_KEY_INDEX,  # (the values' upsert; it serves every lookup the former key index served)
    "DROP INDEX IF EXISTS metric_values_key",
    "CREATE INDEX IF NOT EXISTS topn_values_key ON topn_values (name, entity, time_bucket)",
)
#: the session's staging relation, which the merge's statements join against (:meth:`PostgresBackend.stage`)
_STAGING = (
    """CREATE TEMPORARY TABLE IF NOT EXISTS stage_keys (
        name VARCHAR NOT NULL, granularity VARCHAR NOT NULL, entity VARCHAR NOT NULL,
        time_bucket TIMESTAMPTZ NOT NULL)""",
)
# the advisory locks' second keys (the first: LOCK_SPACE, the schema's)
_SCHEMA_LOCK = 0x64726169  # "drai": the schema's DDL
_BOOKS_LOCK = 0x6D657267  # "merg": every writing transaction, see lock_books
_PART_LOCK = 0x626F6F6B  # "book": a part's books' lock has LOCK_SPACE # this first, a hash of the part second
#: a transaction of more parts than this takes the whole books instead (each lock is an entry of the server's shared
#: lock table, sized for 64 a transaction)
_MAX_PART_LOCKS = 32

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


class PostgresBackend:
    """A PostgreSQL database as a :class:`~.backend.Backend`: one connection, opened again when lost."""

    staging_ddl: tuple[str, ...] = QUEUE_DDL + _STAGING + STAGING_DDL
    #: the server merges queued states itself (:mod:`.database_merge`): a fold holds a merge lock for the server's
    #: statements only, never for a writer's Python
    merges_in_database = True
    #: the range probe has no index here (time_bucket is the last column of the key indexes): a probe that finds
    #: nothing would read every row of the metrics, so merges always look their keys up
    probe_ranges = False

    #: the merge's correctness rests on READ COMMITTED (each statement sees what committed before it started, so
    #: the states read after a merge lock is granted include the previous holder's); pinned here so that a
    #: server or role whose default_transaction_isolation is stricter does not take the snapshot before the lock
    _BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"

    def __init__(self, conninfo: str, *, connect_timeout: float = 5.0, display: str | None = None,
                 schema: str | None = None) -> None:  # fmt: skip
        """Connected by :meth:`open`. ``display``: the database in messages (default: ``conninfo`` without its
        password). ``schema``: the store's schema (another connection's :attr:`schema`); None: the one the first
        connection finds first on its search path."""
        import psycopg

        self._psycopg = psycopg
        self._conninfo = conninfo
        self._connect_timeout = connect_timeout
        self.display = display or _redact(conninfo)
        #: the psycopg connection (None while there is none); for tests and tools that look at the database
        self.connection: Any = None
        #: connections opened again after one was lost
        self.reconnects = 0
        self._prepare: Prepare | None = None
        #: the store's schema, pinned as every connection's whole search path from the first connection on: the
        #: tables, the merge function and the locks' key (LOCK_SPACE) never move to a schema created ahead of it
        #: on the search path while the store is written
        self.schema = schema

    def __repr__(self) -> str:
        return f"PostgresBackend({self.display!r})"

    # ----------------------------------------------------------------------------- connection

    def open(self, prepare: Prepare | None) -> None:
        self._prepare = prepare
        try:
            self._connect()
        except StoreUnavailable as exc:
            self._drop()  # (connected, then lost in the schema transaction: no connection left open behind)
            raise StoreError(f"cannot open postgresql store {self.display}: {exc}") from None
        except self._psycopg.Error as exc:
            self._drop()
            raise StoreError(f"cannot use postgresql store {self.display}: {first_line(exc)}") from None

    def _connect(self) -> None:
        psycopg = self._psycopg
        try:
            self.connection = psycopg.connect(
                self._conninfo, autocommit=True, connect_timeout=max(1, int(self._connect_timeout))
            )
        except psycopg.OperationalError as exc:
            self.connection = None
            raise StoreUnavailable(f"server unreachable: {first_line(exc)}") from exc
        # every transaction at READ COMMITTED, those of a single statement too (a fold, database_merge.fold_now: its
        # snapshot must be taken after its lock is granted, not before, as REPEATABLE READ would)
        self.connection.execute("SET default_transaction_isolation TO 'read committed'")
        if self.schema is None:
            self.schema = self.connection.execute("SELECT current_schema()").fetchone()[0]
        if self.schema is not None:  # (None: no schema on the search path, and creating the tables says so)
            self.connection.execute("SELECT set_config('search_path', quote_ident(%s), false)", [self.schema])
        # every connection: the schema (a server restored from an older dump is migrated too) and the session's
        # temporary staging table, under a lock so that processes opening one database at once do not race
        if self._prepare is None:  # (a folder's connection: the store's own made the schema)
            for statement in self.staging_ddl:
                self.execute(statement)
            return
        with self.transaction():
            self.execute(f"SELECT pg_advisory_xact_lock({LOCK_SPACE}, {_SCHEMA_LOCK})")
            self._prepare(True)
            for statement in _INDEXES:
                self.execute(statement)
            pack_stored_bins(self, self.display)
            define_merge_function(self)

    def _drop(self) -> None:
        con, self.connection = self.connection, None
        if con is not None:
            try:
                con.close()
            except Exception:
                pass

    def _connected(self) -> bool:
        con = self.connection
        return con is not None and not con.closed and not con.broken

    @contextmanager
    def session(self, action: str) -> Iterator[None]:
        """Connect if needed; a lost connection is :class:`StoreUnavailable`, another database error
        :class:`StoreError`."""
        psycopg = self._psycopg
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

    def transaction(self) -> AbstractContextManager[None]:
        return sql_transaction(self.execute, self._BEGIN)

    def lock_books(self, parts: Collection[tuple[str, str]] | None = None) -> bool:
        """Several processes (servers, ``drainpipe run``, a Spark driver, ``consume`` members) may write one
        database. A merge checks its parts' fences and records their progress; a new owner of a part issues a fence
        and then reads the part's progress. So every writing transaction takes transaction-scoped advisory locks
        first: a commit lands wholly before a fence of its part, or after it and is refused.

        A part's lock is keyed by a 32-bit hash of source and part (two parts that collide share a lock: one in
        four billion), taken in key order (no two transactions wait for each other in a cycle), with the whole
        books' lock shared; ``None`` takes the whole books' lock exclusively, as do more than
        :data:`_MAX_PART_LOCKS` parts. So writers of different parts do not wait for each other's commits, and a
        writer may merge at its commit while the others queue (:mod:`.sql`; not one that holds the whole books).
        Every key is the store's: its first half is a hash of the schema's name (:data:`LOCK_SPACE`), so stores in
        two schemas of one database never wait for each other. (A writer of a version whose keys were the
        database's does not serialise with this one at all: it must not write the same store.)"""
        keys = sorted({zlib.crc32(f"{source}\0{part}".encode()) - (1 << 31) for source, part in parts or ()})
        if parts is None or len(keys) > _MAX_PART_LOCKS:
            self.execute(f"SELECT pg_advisory_xact_lock({LOCK_SPACE}, {_BOOKS_LOCK})")
            return True
        locks = [f"pg_advisory_xact_lock({LOCK_SPACE} # {_PART_LOCK}, {key})" for key in keys]
        books = f"pg_advisory_xact_lock_shared({LOCK_SPACE}, {_BOOKS_LOCK})"
        self.execute(f"SELECT {', '.join([books, *locks])}")  # (in order)
        return False

    def lock_merges(self, stripe: int | None) -> None:
        """A merge upserts its keys' states, then computes the keys' values from the merged states (a percentile
        from its whole histogram); two interleaved merges of one key would each compute the values without the
        other's states. So every merge into the stored states (a fold of the queue, :mod:`.database_merge`) takes
        this lock: merges of a stripe of the keys are serial (all stripes' locks, in order, for ``None``). They are
        held for the server's statements only, once for every writer's queued states."""
        stripes = range(STRIPES) if stripe is None else (stripe,)
        self.execute(f"SELECT {', '.join(f'pg_advisory_xact_lock({LOCK_SPACE}, {MERGE_LOCK + s})' for s in stripes)}")

    def try_lock_merges(self) -> bool:
        """Every stripe's merge lock if no other transaction holds one (pg_try_advisory_xact_lock, in order). In a
        savepoint, rolled back when one is held: the stripes taken before it are let go (a writer that queues
        because a merge runs would otherwise hold them until its commit, and every fold would skip them)."""
        self.execute("SAVEPOINT try_merges")
        taken = bool(
            self.fetchall(
                "SELECT "
                + " AND ".join(f"pg_try_advisory_xact_lock({LOCK_SPACE}, {MERGE_LOCK + s})" for s in range(STRIPES))
            )[0][0]
        )
        self.execute("RELEASE SAVEPOINT try_merges" if taken else "ROLLBACK TO SAVEPOINT try_merges")
        return taken

    # ----------------------------------------------------------------------------- planning the keyed statements

    def stage(self, name: str, rows: pa.Table) -> None:
        """The session's temporary table ``name``, emptied and refilled. (This store's merge stages through
        :mod:`.database_merge`, which plans its own statements; this serves the protocol's ``stage_keys``.)

        Emptied by TRUNCATE, not DELETE: in a long transaction deleted rows stay in the table's pages until it ends,
        and the planner, which sizes a table by its pages, took 15,000 staged keys for 350,000."""
        self.execute(f"TRUNCATE {name}")
        self.insert_arrow(name, rows)

    # ----------------------------------------------------------------------------- primitives

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        if params:
            self.connection.execute(_pg_sql(sql), list(params))
        else:
            self.connection.execute(sql)

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cur = self.connection.execute(_pg_sql(sql), list(params)) if params else self.connection.execute(sql)
        return cur.fetchall()

    def fetch_arrow(self, sql: str, params: Sequence[Any] = ()) -> pa.Table:
        cur = self.connection.execute(_pg_sql(sql), list(params)) if params else self.connection.execute(sql)
        rows = cur.fetchall()
        columns = list(zip(*rows)) if rows else [()] * len(cur.description)
        return pa.table(
            {
                d.name: pa.array(list(values), type=_ARROW_TYPES.get(d.type_code))
                for d, values in zip(cur.description, columns)
            }
        )

    def insert_arrow(self, table_name: str, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        rows = _storable(rows)
        # Arrow's CSV writer quotes every string ("" stays an empty string) and leaves nulls unquoted and
        # empty, which is exactly what COPY's CSV format reads back; floats are written round-trip exact.
        sink = io.BytesIO()
        pacsv.write_csv(rows, sink, pacsv.WriteOptions(include_header=False))
        names = ", ".join(f'"{n}"' for n in rows.column_names)
        with (
            self.connection.cursor() as cur,
            cur.copy(f"COPY {table_name} ({names}) FROM STDIN WITH (FORMAT csv)") as copy,
        ):
            copy.write(sink.getbuffer())

    def delete(self, sql: str, params: Sequence[Any] = ()) -> int:
        cur = self.connection.execute(_pg_sql(sql), list(params)) if params else self.connection.execute(sql)
        return max(0, cur.rowcount)

    def reclaim(self, tables: Sequence[str]) -> None:
        # VACUUM runs outside a transaction (the connection is in autocommit between the store's own BEGINs)
        self.connection.execute(f"VACUUM {', '.join((*tables, *QUEUE_TABLES))}")

    def size_bytes(self, tables: Sequence[str]) -> int:
        row = self.connection.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' AND c.relname = ANY(%s)",
            ([*tables, *QUEUE_TABLES],),
        ).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self._drop()


class PostgresStore(SqlStore):
    """A store in a PostgreSQL database. Open with :meth:`from_url` (or :func:`open_store`)."""

    def __init__(self, conninfo: str, *, connect_timeout: float = 5.0, display: str | None = None) -> None:
        self._pg = PostgresBackend(conninfo, connect_timeout=connect_timeout, display=display)
        super().__init__(self._pg, twin=lambda: PostgresBackend(conninfo, connect_timeout=connect_timeout,
                                                                display=display, schema=self._pg.schema))  # fmt: skip

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

    @property
    def reconnects(self) -> int:
        """Connections opened again after one was lost."""
        return self._pg.reconnects

    def __repr__(self) -> str:
        return f"PostgresStore({self._pg.display!r})"


#: what a NUL character in a text value is stored as (U+FFFD, the replacement character)
NUL_REPLACEMENT = "\ufffd"
#: the longest entity (bytes of UTF-8) stored as it is: the unique indexes hold entries of at most 2,704 bytes
ENTITY_BYTES = 1024


def _storable(rows: pa.Table) -> pa.Table:
    """``rows`` as PostgreSQL can hold them, whatever the input accepted (a row it refuses would be refused at every
    retry, and stop every later write of the store): every NUL character in their text replaced by
    :data:`NUL_REPLACEMENT` (text holds no NUL), and an ``entity`` longer than :data:`ENTITY_BYTES` cut to its
    start and a digest of the whole (an index entry holds 2,704 bytes at most). Columns that need neither are left
    as they are (a scan each)."""
    for i, field in enumerate(rows.schema):
        if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
            continue
        column = rows.column(i)
        if pc.any(pc.match_substring(column, "\x00")).as_py():
            column = pc.replace_substring(column, "\x00", NUL_REPLACEMENT)
        if field.name == "entity" and (pc.max(pc.binary_length(column)).as_py() or 0) > ENTITY_BYTES:
            column = pa.array([bounded_entity(v) for v in column.to_pylist()], field.type)
        if column is not rows.column(i):
            rows = rows.set_column(i, field, column)
    return rows


def bounded_entity(entity: str | None) -> str | None:
    """``entity`` as a PostgreSQL store keeps it: as it is up to :data:`ENTITY_BYTES` bytes of UTF-8, else its start
    and ``~`` and 16 hex digits of the SHA-256 of the whole (distinct entities stay distinct)."""
    if entity is None:
        return None
    data = entity.encode()
    if len(data) <= ENTITY_BYTES:
        return entity
    digest = hashlib.sha256(data).hexdigest()[:16]
    return data[: ENTITY_BYTES - 17].decode(errors="ignore") + "~" + digest
