"""The input layer: every way events enter drainpipe goes through here.

* Records (:mod:`.records`): the canonical event batch (:data:`EVENT_SCHEMA`), one set of validation rules for
  every format, and rejects with reasons (:class:`ReadStats`, :class:`DeadLetter`).
* Files: :func:`expand_inputs` (paths and globs), :func:`detect_format` (by suffix: JSON Lines, CSV, OTLP JSON
  trace files, access logs, each optionally gzipped, and Parquet).
* Telemetry (:mod:`.otlp`, :mod:`.accesslog`): OpenTelemetry spans and access-log lines become the same events,
  mapped as :mod:`.spans` says, their endpoints normalized by :mod:`.endpoints`; what reading needs beyond the
  bytes travels as :class:`~.options.InputOptions`.
* Parts (:mod:`.parts`): :func:`plan_parts` cuts a file into parts from a :class:`Position` on, :func:`read_part`
  reads one anywhere (in process, in a worker process, in a Spark task) into validated columnar batches, with the
  rejects' file line numbers; :func:`head_of`, :func:`node_of`, :func:`prefix_hasher` and :func:`file_identity`
  say what a file is, the same for every engine.
* Bodies: :func:`validate_records` and :func:`validate_json_lines` validate what an HTTP client sent.

Formats plug in at two points: :func:`detect_format` names a file's format, and :func:`records.read_blocks`
(whole files) / :func:`read_part` (ranges) read it.
"""

from __future__ import annotations

from pathlib import Path

from .parts import (
    HEAD_BYTES,
    Part,
    RejectList,
    file_identity,
    growable,
    head_of,
    node_of,
    plan_parts,
    prefix_hasher,
    read_part,
    whole_file,
)
from .position import Position
from .records import (
    REQUESTS_KEY,
    batch_from_ipc,
    detect_format,
    expand_inputs,
    join_events,
    read_events,
    request_rows,
    use_serial_json_reader,
    validate_json_lines,
    with_exits,
)
from .rejects import DeadLetter, ReadStats, Sink, jsonable
from .schema import EVENT_SCHEMA, FIELDS, LATENCY_MAX_MS, TS_MAX, TS_MIN
from .validation import validate_records, validate_tuples

__all__ = [
    "EVENT_SCHEMA",
    "FIELDS",
    "TS_MIN",
    "TS_MAX",
    "LATENCY_MAX_MS",
    "ReadStats",
    "DeadLetter",
    "Sink",
    "RejectList",
    "Part",
    "Position",
    "HEAD_BYTES",
    "growable",
    "head_of",
    "node_of",
    "prefix_hasher",
    "detect_format",
    "expand_inputs",
    "file_identity",
    "plan_parts",
    "whole_file",
    "read_part",
    "read_events",
    "validate_records",
    "validate_json_lines",
    "validate_tuples",
    "REQUESTS_KEY",
    "with_exits",
    "request_rows",
    "batch_from_ipc",
    "join_events",
    "jsonable",
    "use_serial_json_reader",
    "default_dead_letter",
]


def default_dead_letter(store_url: str) -> str:
    """``<store file without suffix>.rejected.jsonl`` beside a DuckDB store file, else (server stores, in-memory
    stores) ``drainpipe.rejected.jsonl`` in the working directory."""
    if store_url.startswith("duckdb:///") and ":memory:" not in store_url:
        path = store_url[len("duckdb:///") :].partition("?")[0]  # without the DuckDB options
        return str(Path(path).with_suffix("")) + ".rejected.jsonl"
    return "drainpipe.rejected.jsonl"
