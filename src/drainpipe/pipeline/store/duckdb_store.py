"""The embedded store: a DuckDB database file (or ``:memory:``), and its URL form."""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ...errors import StoreError, first_line
from .sql import SqlStore

_DUCKDB_DEFAULTS = {"preserve_insertion_order": "false"}


class DuckDBStore(SqlStore):
    """A store in an embedded DuckDB database file (or ``:memory:``)."""

    def __init__(self, path: str = "drainpipe.duckdb", *, config: dict[str, str] | None = None) -> None:
        """``config``: DuckDB configuration options (``memory_limit``, ``threads``, ...), as ``duckdb.connect``
        takes them."""
        super().__init__()
        import duckdb

        self.path = path
        self._duckdb = duckdb
        fresh = path == ":memory:" or not os.path.exists(path)  # nothing to migrate in a new database
        try:
            self._con = duckdb.connect(path, config={**_DUCKDB_DEFAULTS, **(config or {})})
        except duckdb.Error as exc:
            raise StoreError(f"cannot open duckdb store {path!r}: {first_line(exc)}") from None
        self._staged: dict[str, pa.Table] = {}
        try:
            self._create_schema(migrate=not fresh)
        except duckdb.Error as exc:
            self._con.close()
            raise StoreError(f"cannot use duckdb store {path!r}: {first_line(exc)}") from None

    def __repr__(self) -> str:
        return f"DuckDBStore({self.path!r})"

    def _backend_errors(self) -> tuple[type[BaseException], ...]:
        return (self._duckdb.Error,)

    # Arrow tables reach DuckDB through relations (from_arrow), never through register(): a registered view is a
    # catalog entry, and DuckDB keeps a dropped entry, with the Arrow table it holds, until the transaction commits.
    # So a long merge (a Spark job's whole output in one transaction) kept every batch it had inserted or staged:
    # 9.3 GB for 5M minute state rows. Staging into a temporary table is no better: DuckDB also keeps every row
    # version a transaction deletes until it commits. A statement that reads a staged relation runs as a query
    # over it instead (DuckDBPyRelation.query binds the name for that one statement).
    _STAGING_DDL = ()

    def _stage(self, name: str, rows: pa.Table) -> None:
        self._staged[name] = rows

    def _over_staged(self, sql: str, params: Sequence[Any]) -> Any:
        """``sql`` run as a query over the staged relation it reads (a DELETE runs at once; a SELECT gives a relation
        to fetch), or None when it reads none."""
        for name, rows in self._staged.items():
            if re.search(rf"\b{name}\b", sql):
                if params:
                    raise ValueError("a statement over a staged relation takes no parameters")
                return self._con.from_arrow(rows).query(name, sql)
        return None

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        if self._over_staged(sql, params) is None:
            self._con.execute(sql, list(params))

    def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        staged = self._over_staged(sql, params)
        return staged.fetchall() if staged is not None else self._con.execute(sql, list(params)).fetchall()

    def _fetch_arrow(self, sql: str, params: Sequence[Any] = ()) -> pa.Table:
        staged = self._over_staged(sql, params)
        return (staged if staged is not None else self._con.sql(sql, params=list(params))).to_arrow_table()

    def _insert_arrow(self, table_name: str, rows: pa.Table) -> None:
        if rows.num_rows:
            self._con.from_arrow(rows).insert_into(table_name)

    def _delete(self, sql: str, params: Sequence[Any] = ()) -> int:
        row = self._con.execute(sql, list(params)).fetchone()
        return int(row[0]) if row else 0

    def _reclaim(self) -> None:
        self._con.execute("CHECKPOINT")  # deleted row groups' blocks become free for reuse in the file

    def _size_bytes(self) -> int:
        if self.path == ":memory:":
            row = self._con.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()
            return int(row[0] or 0) if row else 0
        return sum(os.path.getsize(p) for p in (self.path, self.path + ".wal") if os.path.exists(p))

    def _close(self) -> None:
        self._con.close()


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
