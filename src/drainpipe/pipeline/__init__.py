"""The drainpipe metrics pipeline: metric definitions, mergeable states, the local engine, stores and rendering.

This is the pipeline's public face: the server, the Spark engine and the CLI import from here. The names are
imported on first use (PEP 562), so that a Spark executor, which imports drainpipe from a zip without the C
extensions, loads only the pure-Python modules it uses (never the engine and its queues).

====================== ===========================================================================================
``definitions``        metric and top-N definitions (the built-in set, TOML files) and their signatures
``buckets``            the fixed vocabulary of granularities and percentiles
``times``              time conversions: bucket starts, ISO-8601 text, user-given bounds
``clock``              drainpipe's one notion of "now" (the wall clock, or one a test or ``DRAINPIPE_CLOCK`` sets)
``partials``           the mergeable state types: merge, roll-up, pieces of a source
``grouping``           dense group ids and per-group reduction (numpy)
``strings``            string columns' codes and gathers, by a kernel that keeps the GIL
``aggregate``          an event batch -> one partial per definition
``values``             states -> value rows (finalize)
``state_table``        the stores' encoding of states
``definitions_file``   definitions written back as metrics TOML (``drainpipe definitions``)
``store``              the store protocol and its DuckDB and PostgreSQL backends (a package)
``progress``           exactly once: how far each part of a source is applied, where to resume; what a file is
``driver``             exactly once for every source: the policy, checkpoints, queued commits, rollback
``engine``             the local engine: L1 and L2 on queues, persistence, checkpoints
``parallel``           reading and aggregating file parts in worker processes
``run``                ``drainpipe run``: inputs -> engine -> store, exactly once
``cardinality``        the entity guard (``max_entities``; ``__overflow__``)
``retention``          how long rows are kept, and the cut-offs a purge uses
``alerts``             alert rules and their evaluation over stored metrics
``remote_write``       the stored per-minute metrics sent to a Prometheus remote-write receiver, once each
``prompb``             remote-write's protobuf messages
``rendering``          query results as a table or JSON
``generator``          the synthetic skewed workload
====================== ===========================================================================================
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers: the names as if imported eagerly
    from .aggregate import RequestColumns, aggregate_batch, request_columns
    from .alerts import AlertRule, complete_buckets, evaluate, rule_fields
    from .buckets import GRANULARITIES, GRANULARITY_MS, PERCENTILE_LABELS, PERCENTILES, TOPN_BUCKET_MS
    from .cardinality import OVERFLOW, EntityGuard
    from .clock import CLOCK_ENV, now_ms, set_clock, using_clock
    from .definitions import (
        DEFAULT_DEFINITIONS,
        EXEMPLARS,
        Definition,
        Definitions,
        MetricDef,
        TopNDef,
        default_definitions,
        definitions_from,
        with_exemplars,
    )
    from .definitions_file import definitions_toml
    from .driver import Commit, Driver, Sink
    from .engine import EngineOptions, LocalEngine
    from .generator import generate_events, write_events
    from .grouping import numpy_column, upper_classes
    from .partials import (
        STATE_COLUMNS,
        MetricAccumulator,
        MetricPartial,
        Partial,
        TopNPartial,
        fold_entities,
        merge,
        normalize,
        partial_type,
        rollup,
        split_partial,
    )
    from .progress import InputFile, PartBooks, books_from, open_books, resolve
    from .remote_write import RemoteWriter, send_stored
    from .remote_write_flags import RemoteWriteOptions, add_remote_write_options, remote_write_options
    from .rendering import render
    from .retention import Retention
    from .run import RunSummary, run_local
    from .state_table import STATE_TABLE_SCHEMA, from_state_table, from_topn_table, to_state_table, to_topn_table
    from .store import (
        DEFAULT_STORE_URL,
        LIVE_DUCKDB_OPTIONS,
        DuckDBStore,
        MergeReport,
        PostgresStore,
        PurgeReport,
        SourceProgress,
        SqlStore,
        Store,
        duckdb_config,
        duckdb_path,
        is_new_store,
        live_store_url,
        open_store,
    )
    from .strings import string_values
    from .times import iso_from_ms, ms_from_bucket, parse_time, parse_time_ms
    from .values import TOPN_COLUMNS, VALUE_COLUMNS, finalize, finalize_table

#: public name -> the module of this package that defines it
_HOMES = {
    **dict.fromkeys(["RequestColumns", "aggregate_batch", "request_columns"], "aggregate"),
    **dict.fromkeys(["AlertRule", "complete_buckets", "evaluate", "rule_fields"], "alerts"),
    **dict.fromkeys(
        ["GRANULARITIES", "GRANULARITY_MS", "PERCENTILE_LABELS", "PERCENTILES", "TOPN_BUCKET_MS"], "buckets"
    ),
    **dict.fromkeys(["OVERFLOW", "EntityGuard"], "cardinality"),
    **dict.fromkeys(["CLOCK_ENV", "now_ms", "set_clock", "using_clock"], "clock"),
    **dict.fromkeys(
        [
            "DEFAULT_DEFINITIONS",
            "EXEMPLARS",
            "Definition",
            "Definitions",
            "MetricDef",
            "TopNDef",
            "default_definitions",
            "definitions_from",
            "with_exemplars",
        ],
        "definitions",
    ),
    **dict.fromkeys(["definitions_toml"], "definitions_file"),
    **dict.fromkeys(["EngineOptions", "LocalEngine"], "engine"),
    **dict.fromkeys(["TOPN_COLUMNS", "VALUE_COLUMNS", "finalize", "finalize_table"], "values"),
    **dict.fromkeys(["generate_events", "write_events"], "generator"),
    **dict.fromkeys(
        [
            "STATE_COLUMNS",
            "MetricAccumulator",
            "MetricPartial",
            "Partial",
            "TopNPartial",
            "fold_entities",
            "merge",
            "normalize",
            "partial_type",
            "rollup",
            "split_partial",
        ],
        "partials",
    ),
    **dict.fromkeys(["InputFile", "PartBooks", "books_from", "open_books", "resolve"], "progress"),
    **dict.fromkeys(["Commit", "Driver", "Sink"], "driver"),
    **dict.fromkeys(["string_values"], "strings"),
    **dict.fromkeys(["numpy_column", "upper_classes"], "grouping"),
    **dict.fromkeys(["render"], "rendering"),
    **dict.fromkeys(["Retention"], "retention"),
    **dict.fromkeys(["RemoteWriter", "send_stored"], "remote_write"),
    **dict.fromkeys(["RemoteWriteOptions", "add_remote_write_options", "remote_write_options"], "remote_write_flags"),
    **dict.fromkeys(["RunSummary", "run_local"], "run"),
    **dict.fromkeys(
        ["STATE_TABLE_SCHEMA", "from_state_table", "from_topn_table", "to_state_table", "to_topn_table"], "state_table"
    ),
    **dict.fromkeys(
        [
            "DEFAULT_STORE_URL",
            "LIVE_DUCKDB_OPTIONS",
            "DuckDBStore",
            "SourceProgress",
            "MergeReport",
            "PostgresStore",
            "PurgeReport",
            "SqlStore",
            "Store",
            "duckdb_config",
            "duckdb_path",
            "is_new_store",
            "live_store_url",
            "open_store",
        ],
        "store",
    ),
    **dict.fromkeys(["iso_from_ms", "ms_from_bucket", "parse_time", "parse_time_ms"], "times"),
}
__all__ = [
    "AlertRule",
    "CLOCK_ENV",
    "now_ms",
    "set_clock",
    "using_clock",
    "Commit",
    "Driver",
    "DEFAULT_DEFINITIONS",
    "DEFAULT_STORE_URL",
    "Definition",
    "Definitions",
    "EXEMPLARS",
    "DuckDBStore",
    "EngineOptions",
    "EntityGuard",
    "SourceProgress",
    "GRANULARITIES",
    "GRANULARITY_MS",
    "InputFile",
    "LocalEngine",
    "PartBooks",
    "Sink",
    "MergeReport",
    "MetricAccumulator",
    "MetricDef",
    "MetricPartial",
    "OVERFLOW",
    "string_values",
    "numpy_column",
    "upper_classes",
    "PERCENTILES",
    "PERCENTILE_LABELS",
    "Partial",
    "PostgresStore",
    "PurgeReport",
    "Retention",
    "RemoteWriteOptions",
    "RemoteWriter",
    "add_remote_write_options",
    "remote_write_options",
    "send_stored",
    "RunSummary",
    "STATE_COLUMNS",
    "STATE_TABLE_SCHEMA",
    "SqlStore",
    "Store",
    "TOPN_BUCKET_MS",
    "TOPN_COLUMNS",
    "TopNDef",
    "TopNPartial",
    "VALUE_COLUMNS",
    "aggregate_batch",
    "request_columns",
    "RequestColumns",
    "definitions_toml",
    "complete_buckets",
    "default_definitions",
    "definitions_from",
    "with_exemplars",
    "duckdb_config",
    "duckdb_path",
    "evaluate",
    "finalize",
    "finalize_table",
    "fold_entities",
    "from_state_table",
    "from_topn_table",
    "generate_events",
    "is_new_store",
    "iso_from_ms",
    "live_store_url",
    "LIVE_DUCKDB_OPTIONS",
    "merge",
    "ms_from_bucket",
    "normalize",
    "books_from",
    "open_books",
    "open_store",
    "parse_time",
    "parse_time_ms",
    "partial_type",
    "render",
    "resolve",
    "rollup",
    "rule_fields",
    "run_local",
    "split_partial",
    "to_state_table",
    "to_topn_table",
    "write_events",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
