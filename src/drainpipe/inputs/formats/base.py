"""The interface every input format implements (:class:`Format`), and what the text formats share: opening a file
(gzip, a BOM), counting its lines and bytes, and reading a line-decoded format in blocks."""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO, ClassVar

import pyarrow as pa

from ...errors import UsageError
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
        """The parts of one file from ``start`` on, in file order (default: one whole part)."""
        return iter([self.whole(path, gzipped, batch_rows, start, options, nbytes)])

    def read(self, part: Part, sink: Sink, dictionaries: bool) -> Blocks:
        raise NotImplementedError

    def write(self, batches: Iterable[pa.RecordBatch], path: str, gzipped: bool) -> int:
        """Write canonical event batches to ``path``; the rows written. Formats drainpipe only reads refuse."""
        raise UsageError(f"cannot write {self.name} files: {path!r} (write .jsonl, .csv, optionally .gz, or .parquet)")

    def __repr__(self) -> str:
        return f"<format {self.name}>"


#: decodes a block of lines (the first is line ``first_line + 1``) -> (EventBatch, (line, raw, reason) rejects)
LineDecoder = Callable[[Sequence[bytes], int], tuple[EventBatch, list[tuple[int, Any, str]]]]

#: a block of a line-decoded file ends after ``batch_rows`` lines or once it holds this many bytes: an OTLP line is
#: a whole export (hundreds of spans, often), so 65,536 lines could be tens of millions of events in one batch
#: (a 400 MB file of 1.3M spans had taken 955 MB of memory in one block). 16 MB of OTLP JSON is ~50k spans.
LINE_BLOCK_BYTES = 16 << 20


class LineFormat(Format):
    """A format read line by line through a decoder (access logs, OTLP JSON files): blocks of ``batch_rows`` lines
    or :data:`LINE_BLOCK_BYTES`, whichever ends first."""

    def decoder(self, options: InputOptions) -> LineDecoder:
        raise NotImplementedError

    def read(self, part: Part, sink: Sink, dictionaries: bool) -> Blocks:
        decode = self.decoder(part.options)
        with open_text_source(part.path, part.gzipped) as f:
            lines = CountedLines(f, f.tell(), not part.gzipped)
            if part.start > lines.offset:
                f.seek(part.start)
                lines.offset = part.start
            lineno, index = part.lineno, 0
            for chunk in _line_chunks(iter(lines), part.batch_rows, LINE_BLOCK_BYTES):
                batch, rejects = decode(chunk, lineno)
                lineno += len(chunk)
                sink.stats.add_accepted(batch.num_rows)
                for line, raw, reason in rejects:
                    sink.reject(line, raw, reason)
                yield index, batch if batch.num_rows else None, Position(lines.offset, lines.count + part.lineno)
                index += 1
            return Position(lines.offset, lines.count + part.lineno)


def _line_chunks(source: Iterator[bytes], lines: int, max_bytes: int) -> Iterator[list[bytes]]:
    """``source``'s lines in lists of ``lines`` lines, each cut short once it holds ``max_bytes`` (a line is never
    split: one longer than ``max_bytes`` is a list of its own)."""
    chunk: list[bytes] = []
    size = 0
    for raw in source:
        chunk.append(raw)
        size += len(raw)
        if len(chunk) >= lines or size >= max_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


class CountedLines:
    """The raw lines of a text file, counted in bytes and lines. For a growable file a last line without a newline
    is held back: it may still be being written."""

    def __init__(self, f: BinaryIO, offset: int, growable: bool) -> None:
        self._f = f
        self.offset = offset
        self.count = 0
        self._growable = growable

    def __iter__(self) -> Iterator[bytes]:
        for raw in self._f:
            if self._growable and not raw.endswith(b"\n"):
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
