"""Metric stores: transactional upsert-merge of states, exactly once through the store's books, and the query side.

The store is one class, :class:`SqlStore`, over a backend object (DuckDB or PostgreSQL); its jobs have a module
each:

=================== =================================================================================================
``protocol``        :class:`Store`, the protocol engines and servers write through, and its records
                    (:class:`SourceProgress`, :class:`MergeReport`, :class:`PurgeReport`)
``sql``             :class:`SqlStore`: the store, composed from the modules below over a backend (its contract)
``backend``         :class:`~.backend.Backend`: the primitives a database supplies (statements, Arrow in and out,
                    transactions, the write lock, staging)
``schema``          the tables, and the migrations of stores written by earlier versions
``merge``           the upsert-merge of new states into the stored ones
``books``           how far each input is applied (``source_progress``, committed with the states) and fencing
``registry``        the definitions the stored states were computed by
``queries``         value and top-N rows, the read side
``purge``           retention: what is deleted when
``duckdb_store``    :class:`DuckDBStore` and its backend, the embedded database, and its URL form
``postgres_store``  :class:`PostgresStore` and its backend, the server database (psycopg 3; several writing processes)
``urls``            :func:`open_store` and :func:`is_new_store`: a store URL to a store
=================== =================================================================================================
"""

from __future__ import annotations

from .duckdb_store import LIVE_DUCKDB_OPTIONS, DuckDBStore, duckdb_config, duckdb_path, live_store_url
from .postgres_store import PostgresStore
from .protocol import DEFAULT_STORE_URL, MergeReport, PurgeReport, SourceProgress, Store
from .sql import SqlStore
from .urls import is_new_store, open_store

__all__ = [
    "DEFAULT_STORE_URL",
    "LIVE_DUCKDB_OPTIONS",
    "MergeReport",
    "PurgeReport",
    "SourceProgress",
    "Store",
    "SqlStore",
    "DuckDBStore",
    "PostgresStore",
    "duckdb_config",
    "duckdb_path",
    "is_new_store",
    "live_store_url",
    "open_store",
]
