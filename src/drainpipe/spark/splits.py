"""Input splits: how the Spark engine cuts input files into tasks, and how a task reads its split.

A :class:`Split` is plain data (picklable, one Spark task's input):

* uncompressed JSON Lines: a byte range ``[start, end)``; the split owns every line whose first byte lies in
  the range (Hadoop's rule: a split starting mid-line skips to the next line, a line crossing ``end`` is read
  to its end), so the splits of a file hold each line exactly once;
* Parquet: a range of row groups ``[start, end)``; ``first_row`` is the file row index of its first row;
* gzipped files and CSV (quoted fields may span lines): the whole file.

Reading and validation are the local engine's, function for function (:mod:`drainpipe.pipeline.events`):
JSON Lines records go through the same line reader and ``_json_record``/``_validate_values``, CSV files
through the same CSV reader, Parquet batches through ``_validate_columns``. Rejects are collected with the
line number *within the split* (JSON Lines) and the split's physical line count, so the driver turns them into
file line numbers (prefix sums over the splits of a file) and writes a dead letter identical to the local one.

Each file has a source identity ``file://<absolute path>@<size>:<mtime_ns>`` (:func:`file_source`): the store records
it per definition, which makes re-running the same files a no-op (see :mod:`drainpipe.pipeline.store`).
"""
from __future__ import annotations

import json
import os
import urllib.parse
import zlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

# The reader internals below are the local engine's own code; they are imported, never copied.
from drainpipe.pipeline import events as _events
from drainpipe.pipeline.events import FIELDS, InputError, ReadStats, detect_format

__all__ = ["Split", "SplitResult", "file_source", "plan_splits", "read_split", "MIN_SPLIT_BYTES", "MAX_SPLIT_BYTES"]

MIN_SPLIT_BYTES = 4 << 20
MAX_SPLIT_BYTES = 128 << 20
#: estimated relative processing cost per input byte (the weights only order and place splits)
_COST_PER_BYTE = {("jsonl", False): 1.0, ("csv", False): 1.2, ("jsonl", True): 5.0, ("csv", True): 6.0, ("parquet", False): 2.0}


@dataclass(frozen=True)
class Split:
    """One task's input; ``index`` is its position in the plan (files in order, then offsets)."""

    index: int
    path: str  # as given by expand_inputs (the dead letter's ``source``)
    fmt: str  # jsonl | csv | parquet
    gzipped: bool
    start: int  # byte offset (jsonl) or first row group (parquet); 0 for whole files
    end: int  # byte end (jsonl), row group end (parquet), -1 = to the end of the file
    first_row: int  # parquet: file row index of the split's first row
    weight: int  # estimated cost, for placement
    nbytes: int  # bytes of the file this split stands for (progress)
    source: str  # the file's identity

    @property
    def whole_file(self) -> bool:
        return self.fmt != "parquet" and self.end < 0


def file_source(path: str) -> str:
    """The source identity of a file: ``file://<absolute path, URL-quoted>@<size>:<mtime_ns>``.

    Quoting keeps the store's reserved piece marker (``" ~"``) out of the identity."""
    st = os.stat(path)
    return f"file://{urllib.parse.quote(os.path.abspath(path))}@{st.st_size}:{st.st_mtime_ns}"


def plan_splits(paths: Sequence[str], parallelism: int, split_bytes: int | None = None) -> list[Split]:
    """Cut ``paths`` (already expanded and validated) into splits for about 3 tasks per core.

    ``split_bytes`` fixes the target size (else total input / (3 * parallelism), clamped to
    [:data:`MIN_SPLIT_BYTES`, :data:`MAX_SPLIT_BYTES`]). Splitting never changes results: sources are per file.
    """
    formats = [detect_format(p) for p in paths]
    sizes = [os.path.getsize(p) for p in paths]
    if split_bytes is None:
        split_bytes = min(MAX_SPLIT_BYTES, max(MIN_SPLIT_BYTES, sum(sizes) // max(1, 3 * parallelism)))
    splits: list[Split] = []

    def add(path: str, fmt: str, gz: bool, start: int, end: int, first_row: int, work: int, nbytes: int,
            source: str) -> None:
        weight = max(1, int(work * _COST_PER_BYTE[(fmt, gz)]))
        splits.append(Split(len(splits), path, fmt, gz, start, end, first_row, weight, nbytes, source))

    for path, (fmt, gz), size in zip(paths, formats, sizes):
        source = file_source(path)
        if fmt == "parquet":
            meta = pq.ParquetFile(path).metadata
            total = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)) or 1
            start = first = rows = nbytes = 0
            for g in range(meta.num_row_groups):
                group = meta.row_group(g)
                nbytes += group.total_byte_size
                rows += group.num_rows
                if nbytes >= split_bytes or g == meta.num_row_groups - 1:
                    add(path, fmt, gz, start, g + 1, first, nbytes, size * nbytes // total, source)
                    start, first, nbytes = g + 1, first + rows, 0
                    rows = 0
            if meta.num_row_groups == 0:
                add(path, fmt, gz, 0, 0, 0, 1, size, source)
        elif fmt == "jsonl" and not gz and size > split_bytes:
            for start in range(0, size, split_bytes):
                length = min(split_bytes, size - start)
                add(path, fmt, gz, start, start + length, 0, length, length, source)
        else:
            add(path, fmt, gz, 0, -1, 0, size, size, source)
    return splits


# ------------------------------------------------------------------------------------------ reading


@dataclass
class SplitResult:
    """What reading a split produced besides its batches: counts, rejects and physical lines read."""

    stats: ReadStats
    rejects: list[tuple[int, str, str]]  # (line within the split or file row, raw as JSON text, reason)
    lines: int = 0  # physical lines (JSON Lines byte-range splits only)


class _RejectList:
    """Duck-typed :class:`~drainpipe.pipeline.events.DeadLetter`: keeps rejects for the driver."""

    def __init__(self, rows: list[tuple[int, str, str]]) -> None:
        self.rows = rows

    def write(self, source: str, line: int, raw: Any, reason: str) -> None:
        self.rows.append((line, json.dumps(_events._jsonable(raw), ensure_ascii=False, allow_nan=False), reason))


class _LineRange:
    """The lines of ``[start, end)`` of an uncompressed file (see the module docstring), counted."""

    def __init__(self, path: str, start: int, end: int) -> None:
        self.path, self.start, self.end = path, start, end
        self.count = 0

    def __iter__(self) -> Iterator[bytes]:
        with open(self.path, "rb", buffering=1 << 20) as f:
            if self.start > 0:
                f.seek(self.start - 1)
                f.readline()  # the rest of the line holding byte start-1 belongs to the previous split
            elif f.read(len(_events._BOM)) != _events._BOM:
                f.seek(0)
            position = f.tell()
            while position < self.end:
                line = f.readline()
                if not line:
                    return
                position += len(line)
                self.count += 1
                yield line


def read_split(split: Split, batch_rows: int = 65_536) -> tuple[Iterator[pa.RecordBatch], SplitResult]:
    """Canonical event batches of ``split`` (lazily) and the :class:`SplitResult` they fill in as they go.

    A file that cannot be read (corrupt gzip or Parquet, I/O error) raises :class:`InputError` while
    iterating, with the local reader's message."""
    result = SplitResult(ReadStats(), [])
    sink = _events._Sink(split.path, result.stats, _RejectList(result.rejects))
    if split.fmt == "parquet":
        batches = _parquet_batches(split, batch_rows, sink)
    elif split.whole_file:
        batches = (b for _, b in _events._read_blocks(split.path, split.fmt, split.gzipped, batch_rows, sink))
    else:
        batches = _jsonl_range(split, batch_rows, sink, result)
    return _guarded(split.path, batches), result


def _guarded(path: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``events.read_events``' error policy: unreadable input is an :class:`InputError`."""
    try:
        yield from batches
    except (OSError, EOFError, zlib.error, pa.ArrowException) as exc:
        raise InputError(f"cannot read {path!r}: {exc}") from exc


def _jsonl_range(split: Split, batch_rows: int, sink: Any, result: SplitResult) -> Iterator[pa.RecordBatch]:
    lines = _LineRange(split.path, split.start, split.end)
    yield from _events._read_jsonl(iter(lines), batch_rows, sink)
    result.lines = lines.count


def _parquet_batches(split: Split, batch_rows: int, sink: Any) -> Iterator[pa.RecordBatch]:
    """``events._read_parquet_indexed`` restricted to the split's row groups (same columnar validation)."""
    if split.end <= split.start:
        return
    pf = pq.ParquetFile(split.path)
    present = [name for name in FIELDS if name in pf.schema_arrow.names]
    offset = split.first_row
    groups = list(range(split.start, split.end))
    for batch in pf.iter_batches(batch_size=batch_rows, row_groups=groups, columns=present or None):
        canonical, rejects = _events._validate_columns(batch)
        if rejects is not None:
            mask, reasons = rejects
            _events._reject_rows(batch, mask, reasons, offset, sink)
            canonical = canonical.filter(pa.array(~mask))
        offset += batch.num_rows
        if canonical.num_rows:
            sink.stats.add_accepted(canonical.num_rows)
            yield canonical


def line_offsets(splits: Sequence[Split], lines: dict[int, int]) -> dict[int, int]:
    """Per split index: the number of physical lines of its file before the split (0 for whole files)."""
    offsets: dict[int, int] = {}
    running: dict[str, int] = {}
    for split in sorted(splits, key=lambda s: (s.path, s.start)):
        if split.fmt == "jsonl" and not split.whole_file:
            offsets[split.index] = running.get(split.path, 0)
            running[split.path] = offsets[split.index] + lines.get(split.index, 0)
        else:
            offsets[split.index] = 0
    return offsets

