"""The interface every input format implements (:class:`Format`), and what the text formats share: opening a file
(gzip, a BOM), counting its lines and bytes, and reading a line-decoded format in blocks."""

from __future__ import annotations

import gzip
import io
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO, ClassVar

import numpy as np
import pyarrow as pa

from ... import native
from ...errors import InputError, UsageError
from ..batches import EventBatch
from ..options import InputOptions
from ..part import Blocks, Part
from ..position import Position
from ..rejects import Sink

__all__ = [
    "Format",
    "LineFormat",
    "LineDecoder",
    "CountedLines",
    "BOM",
    "LINE_BLOCK_BYTES",
    "open_text_source",
    "open_text_sink",
    "line_blocks",
    "split_lines",
    "line_ends",
    "line_parts",
    "open_planned",
    "line_ranges",
    "nth_newline",
    "LINE_PART_BLOCKS",
    "READ_BYTES",
]

BOM = b"\xef\xbb\xbf"


class Format:
    """One input format: its name and suffixes, what its files are (can they grow, can they be cut into parts),
    how a file is planned into parts and how a part is read. Subclasses are stateless singletons in the registry
    (:mod:`drainpipe.inputs.formats`); every method is thread-safe.

    ``read`` is a generator of every block of a part (:data:`~drainpipe.inputs.part.Blocks`): the accepted rows
    (None when there are none) and the position after the block, returning where it read to. Counts and rejects go
    to the sink; it never raises for a bad record, and :class:`~drainpipe.inputs.part.PartReader` maps the errors of
    an unreadable file to one :class:`~drainpipe.errors.InputError`."""

    #: the name parts and the books carry (``Part.fmt``)
    name: ClassVar[str]
    #: file suffixes (lower case, after removing ``.gz``), longest first where one ends another
    suffixes: ClassVar[tuple[str, ...]]
    #: whether ``<suffix>.gz`` files of this format are read
    gzip: ClassVar[bool] = True
    #: whether a file's progress unit is rows (Parquet), not bytes and lines
    by_rows: ClassVar[bool] = False
    #: relative processing cost of an uncompressed byte (Spark task placement only orders and places by it)
    cost_per_byte: ClassVar[float] = 1.0

    def growable(self, gzipped: bool) -> bool:
        """Whether a file can grow between runs (a log): read to its last complete line, resumed there. Compressed
        files are immutable."""
        return not gzipped

    def splits(self, gzipped: bool) -> bool:
        """Whether a file is cut into parts that are read apart (worker processes, Spark tasks); else one part reads
        it whole."""
        return False

    def cost(self, gzipped: bool) -> float:
        """The relative cost of one byte of such a file (a gzip byte stands for about five)."""
        return self.cost_per_byte * (5.0 if gzipped else 1.0)

    def check(self, path: str, options: InputOptions) -> None:
        """Refuse, with one line, a file that cannot be read with ``options`` (before anything is read)."""

    def whole(self, path: str, gzipped: bool, batch_rows: int, start: Position, options: InputOptions,
              nbytes: int) -> Part:  # fmt: skip
        """The part that reads ``path`` sequentially from ``start`` (a resume position: where an earlier part ended) to
        its end."""
        self.check(path, options)
        first = start.offset // batch_rows if self.by_rows else 0  # a file counted in rows resumes at a block
        return Part(path, self.name, gzipped, batch_rows, first=first, start=start.offset, lineno=start.lines,
                    nbytes=nbytes, by_rows=self.by_rows, options=options)  # fmt: skip

    def plan(self, path: str, gzipped: bool, batch_rows: int, workers: int, start: Position, hasher: Any,
             options: InputOptions, nbytes: int) -> Iterator[Part]:  # fmt: skip
        """The parts of one file from ``start`` on, in file order: its :meth:`ranges` when it :meth:`splits`, else
        one whole part."""
        if not self.splits(gzipped):
            return iter([self.whole(path, gzipped, batch_rows, start, options, nbytes)])
        self.check(path, options)
        return self.ranges(path, batch_rows, workers, start, hasher, options)

    def ranges(self, path: str, batch_rows: int, workers: int, start: Position, hasher: Any,
               options: InputOptions) -> Iterator[Part]:  # fmt: skip
        """The range parts of an uncompressed file that :meth:`splits`, lazily: ``hasher`` is a hashlib object fed
        the bytes before ``start``; the planner feeds it the rest, and each part records the digest of the file
        before its end (``Part.prefix``)."""
        raise NotImplementedError

    def read(self, part: Part, sink: Sink, dictionaries: bool) -> Blocks:
        raise NotImplementedError

    def write(self, batches: Iterable[pa.RecordBatch], path: str, gzipped: bool) -> int:
        """Write canonical event batches to ``path``; the rows written. Formats drainpipe only reads refuse."""
        raise UsageError(f"cannot write {self.name} files: {path!r} (write .jsonl, .csv, optionally .gz, or .parquet)")

    def __repr__(self) -> str:
        return f"<format {self.name}>"


#: a line format's decoder: a block of whole lines (a view of a range part's bytes, which it must not keep; else
#: bytes), their count, and the line number before the first -> its events and ``(line, raw bytes, reason)`` rejects
LineDecoder = Callable[[bytes | memoryview, int, int], tuple[EventBatch, list[tuple[int, Any, str]]]]

#: a block of an OTLP JSON file ends after ``batch_rows`` lines or once it holds this many bytes: an OTLP line is a
#: whole export (hundreds of spans, often), so 65,536 lines could be tens of millions of events in one batch
#: (a 400 MB file of 1.3M spans had taken 955 MB of memory in one block). 16 MB of OTLP JSON is ~50k spans.
LINE_BLOCK_BYTES = 16 << 20
#: line formats (JSON Lines, access logs): most blocks per part
LINE_PART_BLOCKS = 4
#: bytes the text formats read from a file at a time
READ_BYTES = 8 << 20


class LineFormat(Format):
    """A format read in blocks of whole lines through a decoder (access logs, OTLP JSON files): blocks of
    ``batch_rows`` lines, or fewer once a block holds :attr:`block_bytes` (None: no byte cap). An uncompressed file
    is cut into byte ranges of whole lines for the workers as JSON Lines are (:func:`line_parts`); the blocks of a
    range part are numbered ahead, so there a byte cap becomes a smaller line count per block, taken from the
    lengths of the lines at the start of the range."""

    #: bytes after which a block ends early (None: blocks are cut by lines only)
    block_bytes: ClassVar[int | None] = None

    def decoder(self, options: InputOptions) -> LineDecoder:
        raise NotImplementedError

    def splits(self, gzipped: bool) -> bool:
        return not gzipped

    def ranges(self, path: str, batch_rows: int, workers: int, start: Position, hasher: Any,
               options: InputOptions) -> Iterator[Part]:  # fmt: skip
        return line_parts(self.name, path, batch_rows, workers, start, hasher, options, self.block_bytes)

    def read(self, part: Part, sink: Sink, dictionaries: bool) -> Blocks:
        decode = self.decoder(part.options)
        with open_text_source(part.path, part.gzipped) as f:
            offset = f.tell()  # after a BOM
            if part.start > offset:
                f.seek(part.start)
                offset = part.start
            limit = None if part.whole else part.end - offset
            growable = part.whole and self.growable(part.gzipped)
            lineno, index = part.lineno, part.first
            cap = self.block_bytes if part.whole else None  # (a range part's blocks are lines only: see above)
            for block, count in line_blocks(f, growable, part.batch_rows, cap, limit):
                batch, rejects = decode(block, count, lineno)
                offset += len(block)
                lineno += count
                sink.stats.add_accepted(batch.num_rows)
                for reason, n in batch.warnings:
                    sink.stats.add_warning(reason, n)
                for line, raw, reason in rejects:
                    sink.reject(line, raw, reason)
                yield index, batch if batch.num_rows else None, Position(offset, lineno)
                index += 1
            return Position(offset, lineno)


def line_blocks(
    f: BinaryIO, growable: bool, lines: int, max_bytes: int | None = None, limit: int | None = None
) -> Iterator[tuple[bytes | memoryview, int]]:
    """``(bytes, line count)`` of consecutive blocks of ``lines`` whole lines of ``f`` from where it stands (the
    last block may have fewer; a block ends early after the first line that brings it to ``max_bytes``, a line
    never split). ``limit``: read no more than that many bytes (a range part, read in one piece: its blocks are
    views of it, not copies, which were a tenth of an OTLP worker's time). A last line without a newline is a line
    of its own, unless ``growable``: then it may still be being written, and is left unread."""
    data, begin, eof, left = b"", 0, False, limit
    while True:
        # the end of the block's `lines` lines, found in C (a range part: no numpy pass over its bytes, which took a
        # third of a log worker's time), or how many whole lines there are so far
        end, count = nth_newline(data, begin, len(data), lines)
        cut = end - begin if end >= 0 else -1
        if max_bytes is not None and count:  # the line that brings the block to max_bytes ends it
            cap, scope = begin + max_bytes - 1, end if end >= 0 else len(data)
            over = data.find(b"\n", cap, scope) if cap < scope else -1
            if over >= 0:
                cut, count = over + 1 - begin, nth_newline(data, begin, over + 1, lines)[1]
        if cut < 0 and eof:
            if begin >= len(data):
                return
            if growable:
                if not count:
                    return
                cut = data.rfind(b"\n", begin) + 1 - begin
            else:
                cut = len(data) - begin
        if cut < 0:
            chunk = f.read(READ_BYTES if left is None else left)  # a range part is read in one piece
            if left is not None:
                left -= len(chunk)
                eof = left <= 0
            if chunk:
                data, begin = (data[begin:] + chunk if begin < len(data) else chunk), 0
            else:
                eof = True
            continue
        block = memoryview(data)[begin : begin + cut] if limit is not None else data[begin : begin + cut]
        begin += cut
        yield block, count + (block[-1:] != b"\n")


def split_lines(data: bytes) -> list[bytes]:
    """A block's lines, each with its newline (as iterating a binary file cuts them)."""
    parts = data.split(b"\n")
    last = parts.pop()
    return [p + b"\n" for p in parts] + ([last] if last else [])


#: up to this many lines, :func:`line_ends` finds them one by one
_FIND_LINES = 256


def line_ends(data: bytes, begin: int, count: int) -> np.ndarray:
    """The offsets (from ``begin``) of the first ``count`` ``\\n`` bytes of ``data`` at or after ``begin`` (fewer
    at its end), looking through a window that grows until it holds them. A few lines (long ones: OTLP exports)
    are found one ``find`` (memchr) at a time instead: a window's compare would pass over each byte several
    times."""
    if count <= _FIND_LINES:
        found: list[int] = []
        at = begin
        while len(found) < count:
            at = data.find(b"\n", at)
            if at < 0:
                break
            found.append(at - begin)
            at += 1
        return np.array(found, np.int64)
    buf = np.frombuffer(data, dtype=np.uint8)
    window = max(1 << 16, 256 * count)
    while True:
        stop = min(len(buf), begin + window)
        ends = np.flatnonzero(buf[begin:stop] == 10)
        if len(ends) >= count or stop == len(buf):
            return ends[:count]
        window *= 4


def open_planned(path: str) -> tuple[io.BufferedReader, int]:
    """A file to plan into parts, opened for reading, and its size. :class:`InputError` (one line) if it cannot
    be read."""
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise InputError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    return f, os.fstat(f.fileno()).st_size


def line_parts(fmt: str, path: str, batch_rows: int, workers: int, start: Position, hasher: Any,
               options: InputOptions, block_bytes: int | None = None) -> Iterator[Part]:  # fmt: skip
    """Byte ranges of whole lines of an uncompressed file of the line format named ``fmt``: about three parts per
    worker and at most :data:`LINE_PART_BLOCKS` blocks each; lazy (the newline scan keeps just ahead of the
    consumer). Parts end at the file's last newline: a last line without one is still being written and waits for
    a later run. ``hasher``: a hashlib object already fed the bytes before ``start``; the scan feeds it the rest,
    and each part records the digest of everything before its end (``Part.prefix``). ``block_bytes``: blocks of
    fewer lines than ``batch_rows`` where that many of the first MB's lines would hold more bytes."""
    f, size = open_planned(path)
    with f:
        if size <= start.offset:
            return
        # at most LINE_PART_BLOCKS blocks per part, fewer when that leaves under three parts per worker
        f.seek(start.offset)
        sample = f.read(1 << 20)
        lines_in_sample = max(1, sample.count(b"\n"))
        if block_bytes is not None:
            batch_rows = max(1, min(batch_rows, block_bytes * lines_in_sample // max(1, len(sample))))
        estimate = (size - start.offset) * lines_in_sample / max(1, len(sample)) / batch_rows
        lines_per_part = batch_rows * max(1, min(LINE_PART_BLOCKS, int(estimate // (3 * max(1, workers)))))
        pos = start.offset
        if pos == 0 and sample[:3] == BOM:
            pos = len(BOM)
            if hasher is not None:
                hasher.update(BOM)
        first, lineno = 0, start.lines
        for begin, end, lines, digest in line_ranges(f, pos, size, lines_per_part, hasher):
            blocks = -(-lines // batch_rows)
            yield Part(path, fmt, False, batch_rows, first, blocks, begin, end, lineno, lines, end - begin, digest,
                       options=options)  # fmt: skip
            first += blocks
            lineno += lines


#: bytes :func:`line_ranges` reads at a time
_SCAN_BYTES = 8 << 20


def line_ranges(
    f: io.BufferedReader, pos: int, size: int, lines: int, hasher: Any
) -> Iterator[tuple[int, int, int, str]]:
    """``(start, end, line count, digest)`` of consecutive ranges of ``lines`` complete lines (the last range may
    have fewer) of ``f`` from ``pos`` to its last newline before ``size``; ``digest`` is ``hasher``'s hex digest
    of everything before ``end`` ("" without a hasher).

    One sequential pass through a reused buffer, the newlines counted and a range's last one found by
    :func:`nth_newline`. Plain reads, not a memory map: faulting in a map's pages cost more than the hashing itself
    and left them in this process's RSS."""
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
        tail = buf.rfind(b"\n", 0, got) + 1  # the bytes after the last newline wait for the next read
        if not tail:
            carry += view[:got]
            offset += got
            continue
        if hasher is not None and carry:
            hasher.update(carry)
        carry = b""
        counted = hashed = 0
        while True:
            cut, found = nth_newline(buf, counted, tail, need)
            if cut < 0:
                need -= found
                break
            digest = ""
            if hasher is not None:
                hasher.update(view[hashed:cut])
                hashed = cut
                digest = hasher.copy().hexdigest()
            yield begin, offset + cut, lines, digest
            begin, counted, need = offset + cut, cut, lines
        last_end = offset + tail
        if hasher is not None:
            hasher.update(view[hashed:tail])
        carry = bytes(view[tail:got])
        offset += got
    if need < lines:  # the rest of the complete lines; a last line without a newline waits for a later run
        yield begin, last_end, lines - need, hasher.copy().hexdigest() if hasher is not None else ""


def nth_newline(data: bytes | bytearray, start: int, stop: int, n: int) -> tuple[int, int]:
    """In ``data[start:stop]``: ``(offset after its n-th newline, n)`` if it holds ``n`` (>= 1), else ``(-1, the
    newlines it holds)``. The C pass (``native.lines``, 64 bytes at a time), else numpy (Spark executors' zip)."""
    lines = native.lines
    if lines is not None:
        return lines.nth(data, start, stop, n)
    at = np.flatnonzero(np.frombuffer(data, np.uint8, stop)[start:] == 10)
    return (start + int(at[n - 1]) + 1, n) if len(at) >= n else (-1, len(at))


class CountedLines:
    """The raw lines of a text file, counted in bytes and lines. For a growable file a last line without a newline
    is held back: it may still be being written."""

    def __init__(self, f: BinaryIO, offset: int, growable: bool) -> None:
        self._f = f
        self.offset = offset
        self.count = 0
        self.growable = growable

    def __iter__(self) -> Iterator[bytes]:
        for raw in self._f:
            if self.growable and not raw.endswith(b"\n"):
                return
            self.offset += len(raw)
            self.count += 1
            yield raw


def open_text_sink(path: str, gzipped: bool) -> BinaryIO:
    """A file to write, gzip-compressed (level 6) when ``gzipped``."""
    f: Any = gzip.open(path, "wb", compresslevel=6) if gzipped else open(path, "wb", buffering=1 << 20)
    return f


def open_text_source(path: str, gzipped: bool) -> BinaryIO:
    """Binary line source (split on ``\\n`` only), with a leading UTF-8 BOM skipped."""
    f: Any = gzip.open(path, "rb") if gzipped else open(path, "rb", buffering=1 << 20)
    if f.peek(3)[:3] == BOM:
        f.read(3)
    return f
