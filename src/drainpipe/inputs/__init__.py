"""The input layer: every way events enter drainpipe goes through here.

============== =================================================================================================
``schema``     the canonical event batch (:data:`EVENT_SCHEMA`, and the optional columns: weights, trace ids)
``validation`` the validation rules, scalar and columnar cores
``rejects``    counts (:class:`ReadStats`), the reject sink, the dead letter (:class:`DeadLetter`)
``batches``    the request-row mark of a batch (requests, then exit rows), joining and shipping batches
``source``     the partitioned-source shape of every input (:class:`Source`, :class:`SourcePart`)
``formats``    one module per file format and the registry that detects it (:func:`format_of`)
``part``       a planned range of a file (:class:`Part`) and the reader of one (:class:`PartReader`)
``parts``      planning a file into parts and reading one, for every engine; what a file is
``position``   a place in a part (a file, the log, a topic partition)
``files``      the file connector: paths and globs, files as a source (:class:`FileSource`), :func:`read_events`
``otlp``       OTLP trace exports into events (HTTP, gRPC and files share it)
``span_columns`` an export's wire bytes into the columns the span mapping reads
``spans``      which spans are requests, which attributes give each field
``sampling``   a sampled span's adjusted count, from the threshold in its trace state
``endpoints``  endpoint normalization
``log_formats`` access-log formats (nginx ``log_format``, Apache ``LogFormat``) compiled for the readers
``options``    what reading needs beyond the bytes (:class:`~.options.InputOptions`)
============== =================================================================================================

HTTP bodies are validated by :func:`validate_records` and :func:`validate_json_lines`, by the same rules as files.
"""

from __future__ import annotations

from pathlib import Path

from .batches import EventBatch
from .files import FileSource, expand_inputs, read_events
from .formats import FORMATS, Format, detect_format, format_of, growable
from .formats.jsonl_format import validate_json_lines
from .formats.otlp_format import decode_exports
from .log_formats import DEFAULT_LOG_FORMAT, LogFormat, parse_log_format
from .options import InputOptions
from .part import Part, PartReader, RejectList
from .parts import HEAD_BYTES, file_identity, head_of, node_of, plan_parts, prefix_hasher, read_part, whole_file
from .position import Position
from .rejects import DeadLetter, ReadStats, Sink, jsonable
from .schema import (
    EVENT_SCHEMA,
    FIELDS,
    LATENCY_MAX_MS,
    OPTIONAL_FIELDS,
    TRACE_ID,
    TS_MAX,
    TS_MIN,
    WEIGHT,
    WEIGHT_MAX,
    batch_schema,
)
from .source import Source, SourcePart
from .validation import validate_records, validate_tuples

__all__ = [
    "EVENT_SCHEMA",
    "OPTIONAL_FIELDS",
    "TRACE_ID",
    "batch_schema",
    "WEIGHT",
    "WEIGHT_MAX",
    "FIELDS",
    "TS_MIN",
    "TS_MAX",
    "LATENCY_MAX_MS",
    "ReadStats",
    "DeadLetter",
    "Sink",
    "RejectList",
    "Source",
    "SourcePart",
    "FileSource",
    "Part",
    "PartReader",
    "Format",
    "FORMATS",
    "format_of",
    "EventBatch",
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
    "decode_exports",
    "InputOptions",
    "validate_tuples",
    "jsonable",
    "default_dead_letter",
    "LogFormat",
    "DEFAULT_LOG_FORMAT",
    "parse_log_format",
    "log_format_of",
]


def log_format_of(text: str | None) -> LogFormat:
    """The access-log format ``--log-format`` names: :data:`DEFAULT_LOG_FORMAT` for none, else the compiled nginx or
    Apache format string. :class:`~drainpipe.errors.InputError` (one line) for one drainpipe cannot use."""
    return parse_log_format(text) if text else DEFAULT_LOG_FORMAT


def default_dead_letter(store_url: str) -> str:
    """``<store file without suffix>.rejected.jsonl`` beside a DuckDB store file, else (server stores, in-memory
    stores) ``drainpipe.rejected.jsonl`` in the working directory."""
    if store_url.startswith("duckdb:///") and ":memory:" not in store_url:
        path = store_url[len("duckdb:///") :].partition("?")[0]  # without the DuckDB options
        return str(Path(path).with_suffix("")) + ".rejected.jsonl"
    return "drainpipe.rejected.jsonl"
