"""Parts: how every engine cuts an input file into pieces of work, and how a piece is read.

One scheme for every engine (the in-process reader, the local engine's worker processes, Spark tasks):

* A file is read as consecutive **blocks**: ``batch_rows`` lines of JSON Lines or CSV records, or one
  ``iter_batches(batch_size=batch_rows)`` batch of Parquet. Block ``j`` of a file always holds the same input
  rows, whoever reads it and however the file is cut into parts.
* A **part** (:class:`Part`) is a run of consecutive blocks of one file: a byte range of whole lines for JSON Lines,
  a range of blocks for Parquet, or the whole file (CSV, whose quoted fields may span lines, and gzip, which
  cannot be entered in the middle). :func:`plan_parts` cuts a file; :func:`read_part` reads one part, anywhere
  (parts are plain picklable data).
* A file's **identity** is a fingerprint of its content (:func:`file_identity`), and block ``j``'s **source id**
  is ``f"{identity}:{batch_rows}:{j}"`` (:func:`source_id`). Stores record source ids, so the same file run
  through any engine, or cut differently, is counted once.

Reading a part gives ``(block index, canonical batch)`` for each block with accepted rows; the rejects go to the
part's :class:`~drainpipe.inputs.records.Sink` with file line numbers (1-based physical lines for JSON Lines and
CSV, 0-based rows for Parquet), the same whichever part and engine read them.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError
from . import records
from .records import BOM, JsonlBlocks, Sink, detect_format, parquet_batch, parquet_columns

__all__ = [
    "Part",
    "RejectList",
    "PENDING",
    "file_identity",
    "source_prefix",
    "source_id",
    "plan_parts",
    "whole_file",
    "read_part",
]

#: JSON Lines: most blocks per part
JSONL_PART_BLOCKS = 4
#: Parquet: most blocks per part (a row group with more is cut into near-equal parts)
PARQUET_PART_BLOCKS = 16
#: the identity of parts planned before the file's fingerprint is known (see :meth:`Part.identified`)
PENDING = "*"


def file_identity(path: str, digest: str | None = None) -> str:
    """A content fingerprint: the same bytes anywhere give the same identity (96 bits of SHA-256, hex).

    ``digest``: the file's SHA-256 hex digest if already known (the JSON Lines planner computes it in its scan)."""
    if digest is None:
        try:
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError as exc:
            raise InputError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    return digest[:24]


def source_prefix(identity: str, batch_rows: int) -> str:
    """What every source id of the file ``identity`` read in blocks of ``batch_rows`` starts with."""
    return f"{identity}:{batch_rows}:"


def source_id(identity: str, batch_rows: int, block: int) -> str:
    """The source id of block ``block`` of the file ``identity`` read in blocks of ``batch_rows``."""
    return f"{source_prefix(identity, batch_rows)}{block}"


@dataclass(frozen=True)
class Part:
    """Blocks ``first .. first + blocks - 1`` of one file (``blocks == -1``: every block from ``first`` to the end
    of the file, read sequentially). JSON Lines byte-range parts also give the byte range and the lines before it.
    """

    path: str
    fmt: str  # jsonl | csv | parquet
    gzipped: bool
    batch_rows: int
    first: int = 0
    blocks: int = -1
    start: int = 0  # jsonl range: byte offset of the first line
    end: int = 0  # jsonl range: byte offset after the last line
    lineno: int = 0  # jsonl range: lines before the first one
    nbytes: int = 0  # bytes of the file this part stands for (progress, placement weights)
    identity: str = PENDING

    @property
    def whole(self) -> bool:
        return self.blocks < 0

    def source(self, block: int) -> str:
        return source_id(self.identity, self.batch_rows, block)

    def identified(self, identity: str) -> Part:
        return replace(self, identity=identity)


class RejectList:
    """A reject sink that keeps ``(line, raw, reason)`` in memory (worker processes and Spark tasks send their
    rejects back; the caller writes them to the dead letter in order)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, Any, str]] = []

    def write(self, source: str, line: int, raw: Any, reason: str) -> None:
        self.rows.append((line, raw, reason))


# ------------------------------------------------------------------------------------------------ planning


def whole_file(path: str, batch_rows: int, identity: str = PENDING) -> Part:
    """The part that reads all of ``path`` sequentially."""
    fmt, gzipped = detect_format(path)
    return Part(path, fmt, gzipped, batch_rows, nbytes=_size(path), identity=identity)


def plan_parts(
    path: str, batch_rows: int, *, workers: int = 2, identity: str = PENDING, hasher: Any = None
) -> Iterator[Part]:
    """The parts of one file, in file order: byte ranges of JSON Lines and block ranges of Parquet (about three
    parts per worker, at most :data:`JSONL_PART_BLOCKS` / :data:`PARQUET_PART_BLOCKS` blocks each), else the whole
    file. Lazy for JSON Lines: the newline scan keeps just ahead of the consumer.

    ``hasher`` (JSON Lines only): a hashlib object fed every byte of the file, in order, by the end of the
    iteration (the fingerprint without a second pass). Raises :class:`InputError` for an unreadable file."""
    fmt, gzipped = detect_format(path)
    if gzipped or fmt == "csv":
        return iter([whole_file(path, batch_rows, identity)])
    if fmt == "parquet":
        return iter(_parquet_parts(path, batch_rows, identity))
    return _jsonl_parts(path, batch_rows, workers, identity, hasher)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError as exc:
        raise InputError(f"cannot read {path!r}: {exc.strerror or exc}") from None


def _parquet_parts(path: str, batch_rows: int, identity: str) -> list[Part]:
    try:
        md = pq.ParquetFile(path).metadata
    except (OSError, pa.ArrowException) as e:
        raise InputError(f"cannot read {path!r}: {e}") from e
    sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
    total = sum(sizes)
    nbytes = _size(path)
    blocks = -(-total // batch_rows)
    # per row group: the blocks that start in it (a part starts at a row group's first block boundary, so a
    # reader decodes at most one batch it does not use)
    ranges: list[tuple[int, int]] = []
    start = 0
    for rows in sizes:
        first, stop = -(-start // batch_rows), min(blocks, -(-(start + rows) // batch_rows))
        if stop > first:
            ranges.append((first, stop))
        start += rows
    parts = []
    for first, stop in ranges:
        pieces = -(-(stop - first) // PARQUET_PART_BLOCKS)
        bounds = np.linspace(first, stop, pieces + 1).round().astype(int)
        for a, b in zip(bounds[:-1], bounds[1:]):
            parts.append(
                Part(
                    path,
                    "parquet",
                    False,
                    batch_rows,
                    int(a),
                    int(b - a),
                    nbytes=nbytes * int(b - a) // max(1, blocks),
                    identity=identity,
                )
            )
    if not parts:  # no rows: one empty part, so the file still has a part
        parts.append(Part(path, "parquet", False, batch_rows, 0, 0, nbytes=nbytes, identity=identity))
    return parts


def _jsonl_parts(path: str, batch_rows: int, workers: int, identity: str, hasher: Any) -> Iterator[Part]:
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise InputError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        # at most JSONL_PART_BLOCKS blocks per part, fewer when that leaves under three parts per worker
        sample = f.read(1 << 20)
        estimate = size * max(1, sample.count(b"\n")) / max(1, len(sample)) / batch_rows
        lines_per_part = batch_rows * max(1, min(JSONL_PART_BLOCKS, int(estimate // (3 * max(1, workers)))))
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            buf = np.frombuffer(mm, dtype=np.uint8)
            window = buf[:0]
            try:
                pos = len(BOM) if bytes(buf[:3]) == BOM else 0
                if hasher is not None:
                    hasher.update(buf[:pos])
                first, lineno = 0, 0
                step = 8 << 20
                while pos < size:
                    need, scan, end = lines_per_part, pos, size
                    while scan < size:
                        window = buf[scan : scan + step]
                        count = int(np.count_nonzero(window == 10))
                        if count >= need:
                            end = scan + int(np.flatnonzero(window == 10)[need - 1]) + 1
                            need = 0
                        else:
                            need -= count
                        if not need:
                            break
                        scan += len(window)
                    if hasher is not None:
                        hasher.update(buf[pos:end])
                    if hasattr(mm, "madvise"):  # scanned (and hashed) pages leave this process's RSS
                        page = pos - pos % mmap.PAGESIZE
                        mm.madvise(mmap.MADV_DONTNEED, page, end - page)
                    lines = lines_per_part - need + (1 if need and buf[size - 1] != 10 else 0)
                    blocks = -(-lines // batch_rows)
                    yield Part(path, "jsonl", False, batch_rows, first, blocks, pos, end, lineno, end - pos, identity)
                    first += blocks
                    lineno += lines
                    pos = end
            finally:
                del buf, window  # no view of the map may outlive it


# ------------------------------------------------------------------------------------------------ reading


def read_part(part: Part, sink: Sink) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(block index, canonical batch)`` for each block of ``part`` with accepted rows; counts and rejects go to
    ``sink``. A file that cannot be read (missing, corrupt gzip or Parquet, I/O error) raises
    :class:`InputError` while iterating; batches already yielded stay valid."""
    try:
        if part.whole:
            yield from records.read_blocks(part.path, part.fmt, part.gzipped, part.batch_rows, sink)
        elif part.fmt == "parquet":
            yield from _parquet_blocks(part, sink)
        else:
            yield from _jsonl_blocks(part, sink)
    except (OSError, EOFError, zlib.error, pa.ArrowException) as e:
        raise InputError(f"cannot read {part.path!r}: {e}") from e


def _jsonl_blocks(part: Part, sink: Sink) -> Iterator[tuple[int, pa.RecordBatch]]:
    with open(part.path, "rb") as f:
        f.seek(part.start)
        data = f.read(part.end - part.start)
    newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    reader = JsonlBlocks()
    lineno, begin = part.lineno, 0
    for k in range(part.blocks):
        last = (k + 1) * part.batch_rows - 1
        stop = int(newlines[last]) + 1 if last < len(newlines) else len(data)
        block = data[begin:stop]
        if not block:
            break
        ends = newlines[k * part.batch_rows : last + 1] - begin
        lines = _Lines(block, len(ends) + (block[-1] != 10))
        batch = reader.read(cast(Sequence[bytes], lines), lineno, sink, block, ends)
        lineno += len(lines)
        begin = stop
        if batch is not None:
            yield part.first + k, batch


class _Lines:
    """The lines of a block (cut after each ``\\n``, as iterating a binary file does), split only when a line
    is asked for: the columnar fast path needs just the count."""

    def __init__(self, data: bytes, count: int) -> None:
        self.data, self.count = data, count
        self._lines: list[bytes] | None = None

    def __len__(self) -> int:
        return self.count

    def _split(self) -> list[bytes]:
        if self._lines is None:
            parts = self.data.split(b"\n")
            last = parts.pop()
            self._lines = [p + b"\n" for p in parts] + ([last] if last else [])
            assert len(self._lines) == self.count
        return self._lines

    def __getitem__(self, i: int) -> bytes:
        return self._split()[i]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._split())


def _parquet_blocks(part: Part, sink: Sink) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Blocks ``first ..`` of ``iter_batches(batch_size=batch_rows)`` over the whole file, same rows.

    ``iter_batches`` batches run across row groups, so the reader starts at the row group holding the part's first
    row and re-cuts the stream at the same row offsets."""
    if part.blocks == 0:
        return
    pf = pq.ParquetFile(part.path)
    size = part.batch_rows
    begin = part.first * size
    starts = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)])
    group = int(np.searchsorted(starts, begin, side="right")) - 1
    skip = begin - int(starts[group])
    stream = pf.iter_batches(
        batch_size=size, row_groups=list(range(group, pf.num_row_groups)), columns=parquet_columns(pf)
    )
    pending: list[pa.RecordBatch] = []
    held = 0
    index, offset, stop = part.first, begin, part.first + part.blocks

    def take(rows: int) -> pa.RecordBatch:
        nonlocal pending, held
        held -= rows
        if len(pending) == 1 and pending[0].num_rows == rows:
            return pending.pop()
        table = pa.Table.from_batches(pending)
        rest = table.slice(rows)
        pending = rest.to_batches() if rest.num_rows else []
        return table.slice(0, rows).combine_chunks().to_batches()[0]

    def validated(batch: pa.RecordBatch) -> pa.RecordBatch | None:
        nonlocal offset
        canonical = parquet_batch(batch, offset, sink)
        offset += batch.num_rows
        return canonical

    for raw in stream:
        if skip:
            if raw.num_rows <= skip:
                skip -= raw.num_rows
                continue
            raw, skip = raw.slice(skip), 0
        pending.append(raw)
        held += raw.num_rows
        while held >= size and index < stop:
            canonical = validated(take(size))
            if canonical is not None:
                yield index, canonical
            index += 1
        if index >= stop:
            return
    if held and index < stop:  # the file's last, short block
        canonical = validated(take(held))
        if canonical is not None:
            yield index, canonical
