"""The input formats and their registry: one module per format, each a :class:`~.base.Format` (its name and
suffixes, whether its files grow or split, how a file is planned into parts and a part read).

================== ==========================================================================================
``base``           the :class:`~.base.Format` interface; text files (gzip, BOM, counted lines); line formats
``jsonl_format``   JSON Lines: the C scanner, ``pyarrow.json`` and the per-line path; byte-range parts
``csv_format``     CSV with a header row, read whole
``parquet_format`` Parquet, validated columnar; parts by row group
``access_format``  nginx and Apache access logs (``--service``)
``otlp_format``    OTLP JSON trace files
================== ==========================================================================================

:func:`format_of` detects a file's format by its suffix; nothing outside this package compares format names.
"""

from __future__ import annotations

import os

from ...errors import InputError
from .access_format import AccessLog
from .base import Format
from .csv_format import Csv
from .jsonl_format import JsonLines
from .otlp_format import OtlpJson
from .parquet_format import Parquet

__all__ = ["Format", "FORMATS", "format_of", "format_named", "detect_format", "growable"]

#: every format, in the order suffixes are tried (OTLP's ``.otlp.jsonl`` before JSON Lines' ``.jsonl``)
FORMATS: tuple[Format, ...] = (OtlpJson(), JsonLines(), Csv(), Parquet(), AccessLog())
_BY_NAME = {f.name: f for f in FORMATS}


def format_of(path: str | os.PathLike[str]) -> tuple[Format, bool]:
    """``(format, gzipped)`` of a path by its suffix (case-insensitive; ``.gz`` where the format allows it).
    :class:`InputError` for any other suffix (``.parquet.gz`` included)."""
    name = os.fspath(path).lower()
    gzipped = name.endswith(".gz")
    stem = name[:-3] if gzipped else name
    for fmt in FORMATS:
        if stem.endswith(fmt.suffixes) and (fmt.gzip or not gzipped):
            return fmt, gzipped
    raise InputError(
        f"unsupported input format: {os.fspath(path)!r} (expected .jsonl, .json, .ndjson, .csv, .otlp.jsonl "
        "or .log, optionally .gz, or .parquet)"
    )


def format_named(name: str) -> Format:
    """The format a part or the books name (``Part.fmt``)."""
    return _BY_NAME[name]


def detect_format(path: str | os.PathLike[str]) -> tuple[str, bool]:
    """``(format name, gzipped)`` of a path (:func:`format_of`)."""
    fmt, gzipped = format_of(path)
    return fmt.name, gzipped


def growable(fmt: str, gzipped: bool) -> bool:
    """Whether files of the named format can grow between runs (see :meth:`Format.growable`)."""
    return format_named(fmt).growable(gzipped)
