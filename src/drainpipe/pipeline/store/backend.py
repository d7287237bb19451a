"""The database under a store: the few primitives every SQL job of the store is written against.

A :class:`Backend` is one connection to one database (DuckDB: :mod:`.duckdb_store`; PostgreSQL:
:mod:`.postgres_store`). The store's SQL is written once, with ``?`` placeholders; a backend with another paramstyle
translates them. Everything else (schema, merge, books, queries, purge) is in the store's other modules, which take a
backend as an argument and never know which database it is, apart from the facts it declares
(:attr:`Backend.staging_ddl`, :attr:`Backend.probe_ranges`, :attr:`Backend.merges_in_database`).

Contract:

* Not thread-safe: :class:`~.sql.SqlStore` serialises every use under its lock, and every use runs inside
  :meth:`Backend.session`.
* Blocking: every primitive waits for the database.
* Errors: inside :meth:`Backend.session`, a database error leaves as :class:`~drainpipe.errors.StoreError`
  (permanent) or :class:`~drainpipe.errors.StoreUnavailable` (worth retrying: the connection was lost or refused);
  :class:`StoreError` and :class:`StoreUnavailable` raised by the store's own code pass unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import pyarrow as pa

__all__ = ["KEY_COLUMNS", "Backend", "Prepare", "sql_transaction", "stage_keys"]

#: what a backend runs on every new connection, inside its schema transaction: create what is missing and, with
#: ``migrate`` (False only for a database the backend just created), bring an older store up to date
Prepare = Callable[[bool], None]


class Backend(Protocol):
    """One connection to the store's database (see the module docstring for the contract)."""

    #: DDL of the session's staging relations (``stage_keys``), run with the schema on every new connection; empty
    #: for a backend whose :meth:`stage` keeps them otherwise
    staging_ddl: tuple[str, ...]
    #: whether a range probe (``SELECT 1 ... WHERE time_bucket BETWEEN ...``) is cheap, so that a merge asks it before
    #: staging keys to look them up (see :mod:`.merge`); False where no index serves it
    probe_ranges: bool
    #: whether the database merges staged states into the stored ones itself (:mod:`.database_merge`: the session
    #: has its staging tables, the state key a unique index); False: the store reads, merges and rewrites them
    merges_in_database: bool

    def open(self, prepare: Prepare | None) -> None:
        """Connect and run ``prepare`` (on this and every later connection); :class:`StoreError` when the database
        cannot be opened or used. ``prepare`` None: a further connection to a database a store has opened (a
        folder's, :mod:`.folder`), which makes only its session's staging relations (:attr:`staging_ddl`)."""
        ...

    def session(self, action: str) -> AbstractContextManager[None]:
        """The context every use runs in: connected (reconnecting after a lost connection), with database errors
        translated (``action`` names the use in their message)."""
        ...

    def transaction(self) -> AbstractContextManager[None]:
        """One transaction: committed when the block ends, rolled back when it raises."""
        ...

    def lock_books(self, parts: Collection[tuple[str, str]] | None = None) -> bool:
        """Called first in every transaction that writes the books: a database other processes write too takes locks
        held until the transaction ends, so that a fence and a commit of the part it fences never interleave. With
        ``parts`` ((source, part) pairs), the books of those parts: writers of other parts go on meanwhile (a
        registry of definitions shared by all of them takes no lock: it is written with ``ON CONFLICT`` and compared
        after); with None, the whole books, alone (purge). Whether it locked the whole books (every other writer
        waits for this transaction: keep it short). An embedded file has one writer process already."""
        ...

    def lock_merges(self, stripe: int | None) -> None:
        """Called (after :meth:`lock_books`, where both are taken) by every transaction that merges into the stored
        states: a database other processes write too takes a lock held until the transaction ends, so that merges
        (stored states merged with new ones, values computed from the result) never interleave; the lock of one
        stripe of the keys (:data:`~.database_merge.STRIPES`), or of all of them (None)."""
        ...

    def try_lock_merges(self) -> bool:
        """:meth:`lock_merges` of every stripe if none is held by another transaction now, without waiting: whether
        they were taken (when not, none is held)."""
        ...

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def fetch_arrow(self, sql: str, params: Sequence[Any] = ()) -> pa.Table: ...

    def insert_arrow(self, table_name: str, rows: pa.Table) -> None:
        """Append ``rows`` (columns in the table's column order) to ``table_name``."""
        ...

    def stage(self, name: str, rows: pa.Table) -> None:
        """Make ``rows`` the whole content of the session's staging relation ``name`` (``stage_keys``), which the
        statements that follow may join against."""
        ...

    def delete(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run a DELETE; the number of rows it deleted."""
        ...

    def reclaim(self, tables: Sequence[str]) -> None:
        """Make the space of deleted rows of ``tables`` reusable now; outside any transaction."""
        ...

    def size_bytes(self, tables: Sequence[str]) -> int:
        """The space the store takes: its database file, or ``tables`` with their indexes."""
        ...

    def close(self) -> None: ...


#: the columns of the staged keys (``stage_keys``), which the keyed statements join against
KEY_COLUMNS = ("name", "granularity", "entity", "time_bucket")


def stage_keys(backend: Backend, rows: pa.Table) -> None:
    """Make the distinct (name, granularity, entity, time_bucket) of ``rows`` the session's staged keys."""
    keys = list(KEY_COLUMNS)
    backend.stage("stage_keys", rows.group_by(keys, use_threads=False).aggregate([]).select(keys))


@contextmanager
def sql_transaction(execute: Callable[[str], None], begin: str = "BEGIN TRANSACTION") -> Iterator[None]:
    """A transaction through plain statements (``begin``, then COMMIT, or ROLLBACK when the block raises): what
    both backends' :meth:`Backend.transaction` is."""
    execute(begin)
    try:
        yield
    except BaseException:
        try:
            execute("ROLLBACK")
        except Exception:  # the original error says more (e.g. a lost connection)
            pass
        raise
    execute("COMMIT")
