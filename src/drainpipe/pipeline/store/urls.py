"""Store URLs: open the store one names (``duckdb:///...``, ``postgresql://...``)."""

from __future__ import annotations

import os

from ...errors import StoreError
from .duckdb_store import DuckDBStore, duckdb_config, duckdb_path
from .postgres_store import PostgresStore
from .protocol import DEFAULT_STORE_URL, Store


def is_new_store(url: str | None) -> bool:
    """Whether opening ``url`` would create an empty store: an embedded (DuckDB) file that does not exist yet in a
    directory that does, or ``duckdb:///:memory:``. False for anything else, a bad URL included (opening it says
    what is wrong). Another process may create the file meanwhile: callers check what they assumed."""
    url = (DEFAULT_STORE_URL if url is None else url).strip()
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "duckdb":
        return False
    try:
        path = duckdb_path(url)
    except StoreError:
        return False
    return path == ":memory:" or not os.path.exists(path)


def open_store(url: str | None = None, *, must_exist: bool = False) -> Store:
    """Open (creating if needed) the store at ``url``; :class:`StoreError` for a bad URL or unusable store.

    ``must_exist``: refuse to create an embedded (DuckDB) store file that is not there ("no such store"), for
    readers such as ``drainpipe query``.

    ``duckdb:///relative/file.duckdb`` (relative to the working directory), ``duckdb:////abs/file.duckdb``,
    ``duckdb:///:memory:``, each optionally with DuckDB configuration options (``?memory_limit=1GB&threads=2``);
    ``None`` means :data:`DEFAULT_STORE_URL` (``./drainpipe.duckdb``).
    ``postgresql://user:pass@host:port/db`` is served by :class:`~.postgres_store.PostgresStore`.
    """
    url = DEFAULT_STORE_URL if url is None else url
    if not isinstance(url, str) or not url.strip():
        raise StoreError(
            f"bad store URL {url!r}: expected duckdb:///path/file.duckdb or postgresql://user:pass@host:port/db"
        )
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme:
        raise StoreError(
            f"bad store URL {url!r}: expected duckdb:///path/file.duckdb or postgresql://user:pass@host:port/db"
        )
    scheme = scheme.lower()
    if scheme == "duckdb":
        path = duckdb_path(url)
        if must_exist and path != ":memory:" and not os.path.exists(path):
            raise StoreError(f"no such store: {path!r} does not exist ({url})")
        return DuckDBStore(path, config=duckdb_config(url))
    if scheme in ("postgresql", "postgres"):
        return PostgresStore.from_url(url)
    raise StoreError(f"unknown store scheme {scheme!r} in {url!r} (expected duckdb or postgresql)")
