"""Metric stores: transactional, idempotent upsert-merge of states, and the query side.

The contract (tables, merge, idempotency) is written at the top of :mod:`.sql`, where it is implemented once for
every SQL backend. The modules, each with one job:

=================== =================================================================================================
``protocol``        :class:`Store`, the protocol engines and servers write through, and its records
                    (:class:`SourceProgress`, :class:`MergeReport`, :class:`PurgeReport`)
``sql``             :class:`SqlStore`: schema, migrations, purge, merge, queries, over a few backend primitives
``ledger``          :class:`~.ledger.Ledger`: which (source, name) pairs are applied, counting pieces of a source
``duckdb_store``    :class:`DuckDBStore`, the embedded backend, and its URL form
``postgres_store``  :class:`PostgresStore`, the server backend (psycopg 3; several writing processes)
``urls``            :func:`open_store` and :func:`is_new_store`: a store URL to a store
=================== =================================================================================================
"""

from __future__ import annotations

from .duckdb_store import DuckDBStore, duckdb_path
from .postgres_store import PostgresStore
from .protocol import DEFAULT_STORE_URL, MergeReport, PurgeReport, SourceProgress, Store
from .sql import SqlStore
from .urls import is_new_store, open_store

__all__ = [
    "DEFAULT_STORE_URL",
    "MergeReport",
    "PurgeReport",
    "SourceProgress",
    "Store",
    "SqlStore",
    "DuckDBStore",
    "PostgresStore",
    "duckdb_path",
    "is_new_store",
    "open_store",
]
