"""Parts: how every engine cuts an input file into pieces of work, how a piece is read, and what a file is.

One scheme for every engine (the in-process reader, the local engine's worker processes, Spark tasks):

* A file is read as consecutive **blocks**: ``batch_rows`` lines of JSON Lines, ``batch_rows`` CSV records, or
  one ``iter_batches(batch_size=batch_rows)`` batch of Parquet.
* A **part** (:class:`Part`) is a run of consecutive blocks of one file: a byte range of whole lines for JSON Lines,
  a range of blocks for Parquet, or the whole file (CSV, whose quoted fields may span lines, and gzip, which
  cannot be entered in the middle). :func:`plan_parts` cuts a file from a :class:`Position` on; :func:`read_part`
  reads one part, anywhere (parts are plain picklable data). Parts end where they say
  (:attr:`Part.end_position`), so an engine that applied parts up to one records how far the file is applied.
* What a file **is**: uncompressed JSON Lines and CSV can grow (logs: :func:`growable`); they are read up to
  their last complete line, found again by a fingerprint of their head (:func:`head_of`) and checked by a hash
  of the part already applied (:func:`prefix_hasher`). Compressed files and Parquet are immutable, named by a
  hash of their content (:func:`file_identity`). :mod:`drainpipe.pipeline.progress` keeps the books.

Reading a part gives ``(block index, canonical batch)`` for each block with accepted rows; the rejects go to the
part's :class:`~drainpipe.inputs.records.Sink` with file line numbers (1-based physical lines for JSON Lines and
CSV, 1-based rows for Parquet), the same whichever part and engine read them.
"""

from __future__ import annotations

import hashlib
import io
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError
from . import records
from .options import InputOptions
from .position import Position
from .records import BOM, JsonlBlocks, detect_format, parquet_batch, parquet_columns
from .rejects import Sink
from .schema import EVENT_SCHEMA

__all__ = [
    "Part",
    "Position",
    "RejectList",
    "HEAD_BYTES",
    "growable",
    "file_identity",
    "head_of",
    "node_of",
    "prefix_hasher",
    "plan_parts",
    "whole_file",
    "read_part",
]

#: JSON Lines: most blocks per part
JSONL_PART_BLOCKS = 4
#: Parquet: most blocks per part (a row group with more is cut into near-equal parts)
PARQUET_PART_BLOCKS = 16
#: a growable file's head fingerprint covers its first complete lines within this many bytes
HEAD_BYTES = 4096


def growable(fmt: str, gzipped: bool) -> bool:
    """Whether files of this kind can grow between runs (uncompressed JSON Lines and CSV, e.g. logs): they are read
    up to their last complete line and resumed there; compressed files and Parquet are immutable."""
    return fmt in ("jsonl", "csv", "otlp", "access") and not gzipped


def file_identity(path: str, digest: str | None = None) -> str:
    """A content fingerprint: the same bytes anywhere give the same identity (96 bits of SHA-256, hex).

    ``digest``: the file's SHA-256 hex digest if already known."""
    if digest is None:
        try:
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError as exc:
            raise InputError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    return digest[:24]


def head_of(path: str) -> str:
    """The fingerprint a file is looked up by: for a growable file, SHA-256 of its complete lines within the first
    :data:`HEAD_BYTES` bytes (appending to the file does not change it once it is that long); for an immutable
    one, its content identity. Raises :class:`InputError` if the file cannot be read."""
    fmt, gzipped = detect_format(path)
    if not growable(fmt, gzipped):
        return file_identity(path)
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError as exc:
        raise InputError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    cut = head.rfind(b"\n")
    return hashlib.sha256(head[: cut + 1] if cut >= 0 else head).hexdigest()[:24]


def node_of(path: str) -> str:
    """``"<device>:<inode>"``: which file this is on its filesystem (a file rewritten in place keeps it, a rotated
    log's new file gets a new one)."""
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"


def prefix_hasher(path: str, end: int) -> Any:
    """A SHA-256 object fed the first ``end`` bytes of ``path`` (fewer if the file is shorter)."""
    hasher = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            left = end
            while left > 0:
                chunk = f.read(min(left, 8 << 20))
                if not chunk:
                    break
                hasher.update(chunk)
                left -= len(chunk)
    except OSError as exc:
        raise InputError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    return hasher


@dataclass(frozen=True)
class Part:
    """Blocks ``first .. first + blocks - 1`` of one file (``blocks == -1``: every block from the part's start to
    the end of the file, read sequentially). Byte-range parts (JSON Lines) give the byte range, the lines before it
    and in it, and (when planned with a hasher) the SHA-256 of every byte of the file before ``end``.
    """

    path: str
    fmt: str  # jsonl | csv | parquet | otlp | access
    gzipped: bool
    batch_rows: int
    first: int = 0
    blocks: int = -1
    start: int = 0  # jsonl range: byte offset of the first line; whole text file: where reading resumes
    end: int = 0  # jsonl range: byte offset after the last line
    lineno: int = 0  # lines before the first one
    lines: int = 0  # jsonl range: lines in the part
    nbytes: int = 0  # bytes of the file this part stands for (progress, placement weights)
    prefix: str = ""  # jsonl range: SHA-256 hex digest of the file's bytes before ``end`` ("" if not planned so)
    rows: int = 0  # parquet: rows in the whole file
    options: InputOptions = InputOptions()  # access logs' service, the span mapping, the endpoint rules

    @property
    def whole(self) -> bool:
        return self.blocks < 0

    @property
    def start_offset(self) -> int:
        """Where the part starts, in the file's progress unit: a byte offset (text) or a row (Parquet)."""
        return self.lineno if self.fmt == "parquet" else self.start

    @property
    def end_position(self) -> Position | None:
        """Where the part ends (None for a whole-file part: known once it has been read, as ``Sink.end``)."""
        if self.whole:
            return None
        if self.fmt == "parquet":
            rows = min(self.rows, (self.first + self.blocks) * self.batch_rows)
            return Position(rows, rows)
        return Position(self.end, self.lineno + self.lines)


class RejectList:
    """A reject sink that keeps ``(line, raw, reason)`` in memory (worker processes and Spark tasks send their
    rejects back; the caller writes them to the dead letter in order)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, Any, str]] = []

    def write(self, source: str, line: int, raw: Any, reason: str) -> None:
        self.rows.append((line, raw, reason))


# ------------------------------------------------------------------------------------------------ planning


def whole_file(
    path: str, batch_rows: int, start: Position = Position(), options: InputOptions = InputOptions()
) -> Part:
    """The part that reads ``path`` sequentially from ``start`` (a growable text file's resume point) to its end."""
    fmt, gzipped = detect_format(path)
    if fmt == "access" and not options.service:
        raise InputError(f"{path!r} is an access log: say which service it belongs to with --service NAME")
    return Part(path, fmt, gzipped, batch_rows, start=start.offset, lineno=start.lines, nbytes=_size(path),
                options=options)  # fmt: skip


def plan_parts(
    path: str,
    batch_rows: int,
    *,
    workers: int = 2,
    start: Position = Position(),
    hasher: Any = None,
    options: InputOptions = InputOptions(),
) -> Iterator[Part]:
    """The parts of one file from ``start`` on, in file order: byte ranges of JSON Lines and block ranges of Parquet
    (about three parts per worker, at most :data:`JSONL_PART_BLOCKS` / :data:`PARQUET_PART_BLOCKS` blocks each),
    else the whole file. Lazy for JSON Lines: the newline scan keeps just ahead of the consumer.

    JSON Lines parts end at the file's last newline: a last line without one is still being written (a growing log)
    and waits for a later run. ``hasher`` (JSON Lines): a hashlib object already fed the bytes before ``start``;
    the scan feeds it the rest, and each part records the digest of everything before its end (``Part.prefix``).
    Raises :class:`InputError` for an unreadable file."""
    fmt, gzipped = detect_format(path)
    if gzipped or fmt in ("csv", "otlp", "access"):
        return iter([whole_file(path, batch_rows, start, options)])
    if fmt == "parquet":
        return iter(_parquet_parts(path, batch_rows, start.offset, workers))
    return _jsonl_parts(path, batch_rows, workers, start, hasher)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError as exc:
        raise InputError(f"cannot read {path!r}: {exc.strerror or exc}") from None


def _parquet_parts(path: str, batch_rows: int, start_row: int, workers: int) -> list[Part]:
    try:
        md = pq.ParquetFile(path).metadata
    except (OSError, pa.ArrowException) as e:
        raise InputError(f"cannot read {path!r}: {e}") from e
    sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
    total = sum(sizes)
    nbytes = _size(path)
    blocks = -(-total // batch_rows)
    skip = -(-start_row // batch_rows)  # blocks an earlier run applied (a resume point ends a block, or the file)
    # per row group: the blocks that start in it (a part starts at a row group's first block boundary, so a
    # reader decodes at most one batch it does not use)
    ranges: list[tuple[int, int]] = []
    begin = 0
    for rows in sizes:
        first, stop = max(skip, -(-begin // batch_rows)), min(blocks, -(-(begin + rows) // batch_rows))
        if stop > first:
            ranges.append((first, stop))
        begin += rows
    pieces: list[tuple[int, int]] = []
    for first, stop in ranges:
        pieces.extend(_cut(first, stop, -(-(stop - first) // PARQUET_PART_BLOCKS)))
    return [
        Part(
            path,
            "parquet",
            False,
            batch_rows,
            a,
            b - a,
            lineno=a * batch_rows,
            nbytes=nbytes * (b - a) // max(1, blocks),
            rows=total,
        )  # fmt: skip
        for a, b in _even_tail(pieces, workers)
    ]


def _cut(first: int, stop: int, pieces: int) -> list[tuple[int, int]]:
    """Blocks ``first .. stop`` in ``pieces`` near-equal ranges (fewer when there are fewer blocks)."""
    bounds = np.linspace(first, stop, min(pieces, stop - first) + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _even_tail(ranges: list[tuple[int, int]], workers: int) -> list[tuple[int, int]]:
    """``ranges`` (contiguous, in order) with the last round cut finer, so that the workers finish together: when
    they do not divide among the workers, the ``len % workers`` last ones are re-cut into ``workers`` near-equal
    pieces. Five row groups on two workers had left one worker idle for the whole last part (~0.27 s of a 2 s run);
    a piece that starts inside a row group pays for decoding the rows before it, a fraction of what was lost."""
    tail = len(ranges) % workers if workers > 1 else 0
    if not tail:
        return ranges
    return ranges[:-tail] + _cut(ranges[-tail][0], ranges[-1][1], workers)


def _jsonl_parts(path: str, batch_rows: int, workers: int, start: Position, hasher: Any) -> Iterator[Part]:
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise InputError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size <= start.offset:
            return
        # at most JSONL_PART_BLOCKS blocks per part, fewer when that leaves under three parts per worker
        f.seek(start.offset)
        sample = f.read(1 << 20)
        estimate = (size - start.offset) * max(1, sample.count(b"\n")) / max(1, len(sample)) / batch_rows
        lines_per_part = batch_rows * max(1, min(JSONL_PART_BLOCKS, int(estimate // (3 * max(1, workers)))))
        pos = start.offset
        if pos == 0 and sample[:3] == BOM:
            pos = len(BOM)
            if hasher is not None:
                hasher.update(BOM)
        first, lineno = 0, start.lines
        for begin, end, lines, digest in _line_ranges(f, pos, size, lines_per_part, hasher):
            blocks = -(-lines // batch_rows)
            yield Part(path, "jsonl", False, batch_rows, first, blocks, begin, end, lineno, lines, end - begin, digest)
            first += blocks
            lineno += lines


#: bytes :func:`_line_ranges` reads at a time
_SCAN_BYTES = 8 << 20


def _line_ranges(
    f: io.BufferedReader, pos: int, size: int, lines: int, hasher: Any
) -> Iterator[tuple[int, int, int, str]]:
    """``(start, end, line count, digest)`` of consecutive ranges of ``lines`` complete lines (the last range may
    have fewer) of ``f`` from ``pos`` to its last newline before ``size``; ``digest`` is ``hasher``'s hex digest
    of everything before ``end`` ("" without a hasher).

    One sequential pass through a reused buffer: counting newlines (numpy: ~3x ``bytearray.count``) and locating
    one only where a range ends. Plain reads, not a memory map: faulting in a map's pages cost more
    than the hashing itself and left them in this process's RSS."""
    buf = bytearray(_SCAN_BYTES)
    view = memoryview(buf)
    f.seek(pos)
    begin, need, offset = pos, lines, pos
    last_end = pos  # the end of the last complete line
    carry = b""  # bytes after the last newline so far, not yet hashed: a line still incomplete
    while offset < size:
        got = f.readinto(view[: min(len(buf), size - offset)])
        if not got:
            break
        newline = np.frombuffer(buf, np.uint8, got) == 10
        left = int(np.count_nonzero(newline))
        if not left:
            carry += view[:got]
            offset += got
            continue
        if hasher is not None and carry:
            hasher.update(carry)
        carry = b""
        counted = hashed = 0
        while left >= need:
            cut = counted + int(np.flatnonzero(newline[counted:])[need - 1]) + 1
            digest = ""
            if hasher is not None:
                hasher.update(view[hashed:cut])
                hashed = cut
                digest = hasher.copy().hexdigest()
            yield begin, offset + cut, lines, digest
            begin, counted, left, need = offset + cut, cut, left - need, lines
        need -= left
        tail = buf.rfind(b"\n", 0, got) + 1
        last_end = offset + tail
        if hasher is not None:
            hasher.update(view[hashed:tail])
        carry = bytes(view[tail:got])
        offset += got
    if need < lines:  # the rest of the complete lines; a last line without a newline waits for a later run
        yield begin, last_end, lines - need, hasher.copy().hexdigest() if hasher is not None else ""


# ------------------------------------------------------------------------------------------------ reading


def read_part(part: Part, sink: Sink, *, dictionaries: bool = False) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(block index, canonical batch)`` for each block of ``part`` with accepted rows; counts and rejects go to
    ``sink``. A whole growable file is read from ``part.start`` to its last complete line, and ``sink.end`` says
    where that is. A file that cannot be read (missing, corrupt gzip or Parquet, I/O error) raises
    :class:`InputError` while iterating; batches already yielded stay valid.

    ``dictionaries``: Parquet string columns stored with a dictionary may stay dictionary-encoded in the batches
    (:func:`~drainpipe.inputs.records.parquet_batch`'s ``keep_dictionaries``), for a reader that only aggregates
    them; the rows are the same."""
    try:
        if part.fmt in ("otlp", "access"):
            yield from records.read_line_blocks(part.path, part.gzipped, part.batch_rows, sink, _decoder(part),
                                                part.start, part.lineno)  # fmt: skip
        elif part.whole:
            yield from records.read_blocks(part.path, part.fmt, part.gzipped, part.batch_rows, sink,
                                           part.start, part.lineno)  # fmt: skip
        elif part.fmt == "parquet":
            yield from _parquet_blocks(part, sink, dictionaries)
        else:
            yield from _jsonl_blocks(part, sink)
    except (OSError, EOFError, zlib.error, pa.ArrowException) as e:
        raise InputError(f"cannot read {part.path!r}: {e}") from e


def _decoder(part: Part) -> records.LineDecoder:
    options = part.options
    if part.fmt == "access":
        from .accesslog import decode_access_lines

        return lambda lines, first: decode_access_lines(lines, first, options)
    from .otlp import decode_otlp_lines  # imports opentelemetry-proto: only where OTLP files are read

    return lambda lines, first: decode_otlp_lines(lines, first, options)


def _jsonl_blocks(part: Part, sink: Sink) -> Iterator[tuple[int, pa.RecordBatch]]:
    with open(part.path, "rb") as f:
        f.seek(part.start)
        data = f.read(part.end - part.start)
    reader = JsonlBlocks()
    ascii = data.isascii()
    lineno, begin = part.lineno, 0
    for k in range(part.blocks):
        if begin >= len(data):
            break
        begin, lines, batch = reader.read_range(data, begin, part.batch_rows, lineno, sink, ascii)
        lineno += lines
        if batch is not None:
            yield part.first + k, batch


def _open_parquet(path: str) -> pq.ParquetFile:
    """A Parquet file opened for the workers' blocks. Its string columns that are stored with a dictionary are read
    as dictionary arrays (validation decodes them): decoding the pages to indices and taking each batch's strings
    from the dictionary costs less than building every string from the pages (reading and decoding 5M events:
    0.118 -> 0.087 us/event of CPU). The rows are the same; the reader then ends a batch at every row group (the
    dictionary changes), which :func:`_parquet_blocks` re-cuts anyway."""
    pf = pq.ParquetFile(path)
    md = pf.metadata
    if md.num_row_groups == 0:
        return pf
    stored = {md.row_group(0).column(i).path_in_schema: md.row_group(0).column(i) for i in range(md.num_columns)}
    schema = pf.schema_arrow
    wanted = [
        name
        for name in _TEXT_COLUMNS
        if name in stored
        and stored[name].has_dictionary_page
        and schema.get_field_index(name) >= 0
        and pa.types.is_string(schema.field(name).type)
    ]
    return pq.ParquetFile(path, read_dictionary=wanted, metadata=md) if wanted else pf


_TEXT_COLUMNS = tuple(f.name for f in EVENT_SCHEMA if pa.types.is_string(f.type))


def _parquet_blocks(part: Part, sink: Sink, dictionaries: bool = False) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Blocks ``first ..`` of ``iter_batches(batch_size=batch_rows)`` over the whole file, same rows.

    ``iter_batches`` batches run across row groups, so the reader starts at the row group holding the part's first
    row and re-cuts the stream at the same row offsets."""
    if part.blocks == 0:
        return
    pf = _open_parquet(part.path)
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
        canonical = parquet_batch(batch, offset, sink, dictionaries)
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
