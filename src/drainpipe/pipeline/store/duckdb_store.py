"""The embedded store: a DuckDB database file (or ``:memory:``), its backend, and its URL form.

One connection, used by one process: the write lock is the store's own (:class:`~.sql.SqlStore`), and nothing is
ever retried: every DuckDB error is :class:`~drainpipe.errors.StoreError`.
"""

from __future__ import annotations

import functools
import os
import re
import urllib.parse
from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pyarrow as pa

from ...errors import StoreError, first_line
from .backend import Prepare, sql_transaction
from .sql import SqlStore

#: DuckDB options a store sets unless its URL says otherwise. No table of a store has a meaningful row order (every
#: read sorts), and without it DuckDB inserts a merge's rows in parallel and writes them to the file at commit
#: instead of through the log: a 622k-row merge and close took 0.56 s instead of 0.86 s.
_DUCKDB_DEFAULTS = {"preserve_insertion_order": "false"}


#: the name a statement over a staged relation reads it by (:func:`_over`)
_STAGED_NAME = "_drainpipe_staged"


def _over(connection: Any, sql: str, _drainpipe_staged: pa.Table, fetch: str = "") -> Any:
    """Run ``sql``, which reads ``_drainpipe_staged``, and fetch its result (``fetch``: "" nothing, "rows", "arrow").
    DuckDB's replacement scan binds that name to this frame's argument of that name, for this statement only: no
    catalog entry, so nothing of it is kept until the transaction commits. (Unlike a query over a relation,
    ``DuckDBPyRelation.query``, whose failure inside a transaction reaches the caller as "Current transaction is
    aborted", an error here is DuckDB's own: an out-of-memory under the store's ``memory_limit`` says so.)"""
    if fetch == "arrow":
        return connection.sql(sql).to_arrow_table()
    result = connection.execute(sql)
    return result.fetchall() if fetch == "rows" else None


class DuckDBBackend:
    """A DuckDB database file (or ``:memory:``) as a :class:`~.backend.Backend`."""

    # Arrow tables reach DuckDB through relations (from_arrow) and replacement scans, never through register(): a
    # registered view is a catalog entry, and DuckDB keeps a dropped entry, with the Arrow table it holds, until the
    # transaction commits. So a long merge (a Spark job's whole output in one transaction) kept every batch it had
    # inserted or staged: 9.3 GB for 5M minute state rows. Staging into a temporary table is no better: DuckDB also
    # keeps every row version a transaction deletes until it commits. A statement that reads a staged relation runs
    # with the relation bound for that one statement (:func:`_over`).
    staging_ddl: tuple[str, ...] = ()
    probe_ranges = True
    merges_in_database = False

    def __init__(self, path: str = "drainpipe.duckdb", *, config: dict[str, str] | None = None) -> None:
        """``config``: DuckDB configuration options (``memory_limit``, ``threads``, ...), as ``duckdb.connect``
        takes them; connected by :meth:`open`."""
        import duckdb

        self.path = path
        self._duckdb = duckdb
        self._config = {**_DUCKDB_DEFAULTS, **(config or {})}
        self._staged: dict[str, pa.Table] = {}
        self._replacement_scans = True  # (read at open: see _binds_by_name)
        #: the DuckDB connection (None until opened); for tests and tools that look at the database themselves
        self.connection: Any = None

    def __repr__(self) -> str:
        return f"DuckDBBackend({self.path!r})"

    def open(self, prepare: Prepare | None) -> None:
        duckdb = self._duckdb
        fresh = self.path == ":memory:" or not os.path.exists(self.path)  # nothing to migrate in a new database
        try:
            self.connection = duckdb.connect(self.path, config=self._config)
        except duckdb.Error as exc:
            raise StoreError(f"cannot open duckdb store {self.path!r}: {first_line(exc)}") from None
        try:
            self._replacement_scans = self._binds_by_name()
            if prepare is not None:
                prepare(not fresh)
            else:
                for statement in self.staging_ddl:
                    self.execute(statement)
        except duckdb.Error as exc:
            self.connection.close()
            raise StoreError(f"cannot use duckdb store {self.path!r}: {first_line(exc)}") from None

    def _binds_by_name(self) -> bool:
        """Whether DuckDB binds a Python object by its name here (its replacement scan): on unless the URL turned
        ``enable_external_access`` or ``python_enable_replacements`` off (the latter a setting since DuckDB 1.1;
        before, always on)."""
        for name in ("enable_external_access", "python_enable_replacements"):
            try:
                row = self.connection.execute("SELECT current_setting(?)", [name]).fetchone()
            except self._duckdb.Error:  # (not a setting of this DuckDB: on)
                continue
            if row and not row[0]:
                return False
        return True

    @contextmanager
    def session(self, action: str) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except self._duckdb.Error as exc:
            raise StoreError(f"store {action} failed: {first_line(exc)}") from exc

    def transaction(self) -> AbstractContextManager[None]:
        return sql_transaction(self.execute)

    def lock_books(self, parts: Collection[tuple[str, str]] | None = None) -> bool:
        return False  # one writing process per file; the store's lock serialises its threads

    def lock_merges(self, stripe: int | None) -> None:
        pass

    def try_lock_merges(self) -> bool:
        return True

    def stage(self, name: str, rows: pa.Table) -> None:
        self._staged[name] = rows

    def _over_staged(self, sql: str, params: Sequence[Any], fetch: str) -> tuple[bool, Any]:
        """``(True, its result)`` for ``sql`` run over the staged relation it reads (``fetch``: :func:`_over`'s);
        ``(False, None)`` when it reads none."""
        for name, rows in self._staged.items():
            if re.search(rf"\b{re.escape(name)}\b", sql):
                if params:
                    raise ValueError("a statement over a staged relation takes no parameters")
                if self._replacement_scans:
                    return True, _over(
                        self.connection, re.sub(rf"\b{re.escape(name)}\b", _STAGED_NAME, sql), rows, fetch
                    )
                # DuckDB binds no Python object by name here (the URL's options): a query over the relation instead
                # (a delete's failure inside a transaction may then read "Current transaction is aborted")
                relation = self.connection.from_arrow(rows).query(name, sql)
                if fetch == "arrow":
                    return True, relation.to_arrow_table()
                return True, relation.fetchall() if fetch == "rows" else None
        return False, None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        if not self._over_staged(sql, params, "")[0]:
            self.connection.execute(sql, list(params))

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        staged, rows = self._over_staged(sql, params, "rows")
        return rows if staged else self.connection.execute(sql, list(params)).fetchall()

    def fetch_arrow(self, sql: str, params: Sequence[Any] = ()) -> pa.Table:
        staged, table = self._over_staged(sql, params, "arrow")
        return table if staged else self.connection.sql(sql, params=list(params)).to_arrow_table()

    def insert_arrow(self, table_name: str, rows: pa.Table) -> None:
        if rows.num_rows:
            self.connection.from_arrow(rows).insert_into(table_name)

    def delete(self, sql: str, params: Sequence[Any] = ()) -> int:
        row = self.connection.execute(sql, list(params)).fetchone()
        return int(row[0]) if row else 0

    def reclaim(self, tables: Sequence[str]) -> None:
        self.connection.execute("CHECKPOINT")  # deleted row groups' blocks become free for reuse in the file

    def size_bytes(self, tables: Sequence[str]) -> int:
        if self.path == ":memory:":
            row = self.connection.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()
            return int(row[0] or 0) if row else 0
        return sum(os.path.getsize(p) for p in (self.path, self.path + ".wal") if os.path.exists(p))

    def close(self) -> None:
        self.connection.close()


class DuckDBStore(SqlStore):
    """A store in an embedded DuckDB database file (or ``:memory:``)."""

    def __init__(self, path: str = "drainpipe.duckdb", *, config: dict[str, str] | None = None) -> None:
        """``config``: DuckDB configuration options (``memory_limit``, ``threads``, ...), as ``duckdb.connect``
        takes them."""
        self.path = path
        super().__init__(DuckDBBackend(path, config=config))

    def __repr__(self) -> str:
        return f"DuckDBStore({self.path!r})"


def duckdb_path(url: str) -> str:
    """The file (or ``:memory:``) a ``duckdb:///...`` store URL names; :class:`StoreError` for a bad one."""
    rest = url.strip().partition("://")[2].partition("?")[0]  # the options: duckdb_config
    if not rest.startswith("/"):
        raise StoreError(
            f"bad store URL {url!r}: a duckdb URL has no host; use duckdb:///relative.duckdb or duckdb:////abs/path.duckdb"
        )
    path = urllib.parse.unquote(rest[1:])
    if not path or path.endswith("/"):
        raise StoreError(f"bad store URL {url!r}: no database file after duckdb:///")
    if path == ":memory:":
        return path
    parent = os.path.dirname(path)
    if parent and not os.path.isdir(parent):
        hint = ""
        if not os.path.isabs(path) and os.path.isdir(os.path.dirname("/" + path)):
            hint = f"; for the absolute path /{path} use four slashes: duckdb:////{path}"
        raise StoreError(f"cannot open duckdb store {path!r}: directory {parent!r} does not exist{hint}")
    return path


def duckdb_config(url: str) -> dict[str, str]:
    """``duckdb:///file.duckdb?memory_limit=1GB&threads=2``: DuckDB configuration options, given to
    ``duckdb.connect`` as they are (DuckDB checks them: an unknown one fails the open)."""
    query = url.partition("?")[2]
    try:
        return dict(urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
    except ValueError:
        raise StoreError(f"bad store URL {url!r}: options are ?name=value&name=value") from None


#: DuckDB's allocator in a long-running live process (``serve``, ``consume``), unless the store URL sets these options
#: itself: its background threads return freed memory to the system, and it keeps at most 4 MB freed before it does
#: (128 MB by default). A memory profile of a saturated ``serve`` (memray, at its peak) found 61 MB in DuckDB's
#: allocator and 15 MB in its Arrow results; with these, ``serve``'s peak PSS was 280-284 MB against 288-302 at 0.99x
#: the spans per CPU second; ``consume`` of 5M one-event messages peaked at 362-383 MB against 379-397 (medians 374.5
#: and 384 over 8 runs in turns) in 0.90x and 0.96x the CPU time (two sets of 4). docs/performance.md, "The fast path
#: kept under back-pressure, one receive buffer" and "DuckDB's allocator in `consume`, and replays fed late in tests".
#: ``drainpipe run`` keeps DuckDB's defaults: a run ends, and its peak is its batches'.
LIVE_DUCKDB_OPTIONS = {"allocator_background_threads": "true", "allocator_flush_threshold": "4MB"}


@functools.cache
def _duckdb_settings() -> frozenset[str]:
    """The configuration options the installed DuckDB knows (asked once a process, of an in-memory database)."""
    import duckdb

    with duckdb.connect(":memory:") as con:
        return frozenset(name for (name,) in con.execute("SELECT name FROM duckdb_settings()").fetchall())


def live_store_url(url: str) -> str:
    """``url`` with :data:`LIVE_DUCKDB_OPTIONS` for a DuckDB store (those the URL does not set, and only those the
    installed DuckDB knows: ``allocator_background_threads`` came with DuckDB 1.1, and the project accepts 1.0, whose
    open would refuse it); any other store URL as it is. Raises :class:`~drainpipe.errors.StoreError` for a DuckDB
    URL whose options do not parse."""
    if not url.strip().lower().startswith("duckdb:"):
        return url
    given, known = duckdb_config(url), _duckdb_settings()
    extra = "&".join(f"{k}={v}" for k, v in LIVE_DUCKDB_OPTIONS.items() if k not in given and k in known)
    if not extra:
        return url
    return f"{url}{'&' if '?' in url else '?'}{extra}"
