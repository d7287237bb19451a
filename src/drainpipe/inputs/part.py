"""A part of an input file (a run of its blocks), and reading one: :class:`Part` is the plan, plain picklable data
that any process can read; :class:`PartReader` the read, the file source's :class:`~.source.SourcePart`, which gives
the part's batches and knows its position.

A part's blocks are numbered within the file (``first`` is the part's first block), so that every engine, and
every cut of the same file into parts, names a block alike. A reader's :meth:`~PartReader.snapshot` is where the
file is read to after the last block it gave (its resume state): an engine that applied a part's blocks up to
one records that position (its snapshot), whatever the format (bytes and lines of a text file, rows of Parquet).
"""

from __future__ import annotations

import zlib
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..errors import InputError
from .batches import EventBatch
from .options import InputOptions
from .position import Position
from .source import SourcePart

__all__ = ["Part", "PartReader", "RejectList", "Blocks"]

#: what a format's reader gives: ``(block index, accepted rows or None, position after the block)`` for every block
#: of the part, and at its end the position it read to
Blocks = Generator[tuple[int, EventBatch | None, Position], None, Position]


@dataclass(frozen=True)
class Part:
    """Blocks ``first .. first + blocks - 1`` of one file (``blocks == -1``: every block from the part's start to
    the end of the file, read sequentially). Byte-range parts (JSON Lines) give the byte range, the lines before it
    and in it, and (when planned with a hasher) the digest (:func:`~.parts.prefix_hasher`) of every byte of the file
    before ``end``. ``fmt`` names the file's format in the registry (:func:`drainpipe.inputs.formats.format_named`).
    """

    path: str
    fmt: str
    gzipped: bool
    batch_rows: int
    first: int = 0
    blocks: int = -1
    start: int = 0  # byte range: offset of the first line; whole text file: where reading resumes
    end: int = 0  # byte range: offset after the last line
    lineno: int = 0  # lines (rows, for a file counted in rows) before the first one
    lines: int = 0  # byte range: lines in the part
    nbytes: int = 0  # bytes of the file this part stands for (progress, placement weights)
    prefix: str = ""  # byte range: hex digest of the file's bytes before ``end`` ("" if not planned so)
    rows: int = 0  # a file counted in rows: rows in the whole file
    by_rows: bool = False  # the file's progress unit is rows (Parquet), not bytes
    options: InputOptions = InputOptions()  # access logs' service, the span mapping, the endpoint rules

    @property
    def whole(self) -> bool:
        return self.blocks < 0

    @property
    def start_offset(self) -> int:
        """Where the part starts, in the file's progress unit: a byte offset (text) or a row (Parquet)."""
        return self.lineno if self.by_rows else self.start

    @property
    def end_position(self) -> Position | None:
        """Where the part ends (None for a whole-file part: known once it has been read, as
        :meth:`PartReader.snapshot`)."""
        if self.whole:
            return None
        if self.by_rows:
            rows = min(self.rows, (self.first + self.blocks) * self.batch_rows)
            return Position(rows, rows)
        return Position(self.end, self.lineno + self.lines)


class PartReader(SourcePart):
    """The reader of one planned part (the file source's :class:`SourcePart`): :meth:`next_batch` gives the event
    batch of each block of the part with accepted rows (:attr:`index` is that block's index within the file); the
    rejects go to the sink the format's reader was given. :meth:`snapshot` is where the file is read to after the
    last block given (after the whole part once it ended). A file that cannot be read (missing, corrupt gzip or
    Parquet, I/O error) raises :class:`InputError`; batches already given stay valid.

    One reader is read once, by one thread."""

    def __init__(self, part: Part, blocks: Blocks) -> None:
        self.part = part
        self.index = -1  # the block of the last batch given
        self._position = Position(part.start_offset, part.lineno)
        self._blocks: Blocks | None = blocks

    def next_batch(self) -> EventBatch | None:
        try:
            while self._blocks is not None:
                try:
                    index, batch, self._position = next(self._blocks)
                except StopIteration as stop:
                    self._position, self._blocks = stop.value, None
                    return None
                if batch is not None:
                    self.index = index
                    return batch
            return None
        except (OSError, EOFError, zlib.error, pa.ArrowException) as e:
            raise InputError(f"cannot read {self.part.path!r}: {e}") from e

    def snapshot(self) -> Position:
        return self._position

    def close(self) -> None:
        if self._blocks is not None:
            self._blocks.close()
            self._blocks = None


class RejectList:
    """A reject sink that keeps ``(line, raw, reason)`` in memory (worker processes and Spark tasks send their
    rejects back; the caller writes them to the dead letter in order)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, Any, str]] = []

    def write(self, source: str, line: int, raw: Any, reason: str) -> None:
        self.rows.append((line, raw, reason))
