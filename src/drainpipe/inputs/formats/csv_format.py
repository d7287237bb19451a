"""CSV with a header row (``.csv``, optionally gzipped): records typed like JSON values, then validated by the same
scalar rules. Quoted fields may span lines, so a file is read whole, sequentially (never cut into parts); a growing
file is resumed after its last applied record, its header read again."""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterable, Iterator
from operator import itemgetter
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.csv as pacsv

from ...errors import InputError, Rejected
from ..batches import EventBatch
from ..part import Blocks, Part
from ..position import Position
from ..rejects import Sink
from ..schema import EVENT_SCHEMA, FIELDS
from ..validation import rows_to_batch, validate_values
from .base import CountedLines, Format, open_text_sink, open_text_source

__all__ = ["Csv", "NUMBER_RE"]


class Csv(Format):
    name = "csv"
    suffixes = (".csv",)
    cost_per_byte = 1.2

    def read(self, part: Part, sink: Sink, dictionaries: bool) -> Blocks:
        """Blocks of ``batch_rows`` accepted records, numbered as they come."""
        with open_text_source(part.path, part.gzipped) as f:
            lines = CountedLines(f, f.tell(), not part.gzipped)
            start = Position(part.start, part.lineno)
            for index, batch in enumerate(_read_csv(f, lines, part.batch_rows, sink, part.path, start)):
                yield index, EventBatch.of(batch), Position(lines.offset, lines.count)
            return Position(lines.offset, lines.count)

    def write(self, batches: Iterable[pa.RecordBatch], path: str, gzipped: bool) -> int:
        rows = 0
        with open_text_sink(path, gzipped) as f, pacsv.CSVWriter(f, EVENT_SCHEMA) as writer:
            for batch in batches:
                writer.write_batch(batch)
                rows += batch.num_rows
        return rows


NUMBER_RE = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?", re.ASCII)
_TOO_BIG = 10**20  # stands for an integer cell too long to convert: certainly out of range
_CSV_STATUS: dict[str, Any] = {"": None, "true": True, "false": False, "1": True, "0": False}


def _csv_int(cell: str) -> Any:
    """A ``ts`` cell: ASCII integer text -> int, other text stays a string (ISO-8601), empty -> None."""
    digits = cell[1:] if cell[:1] == "-" else cell
    if digits.isdigit() and digits.isascii() and (digits[0] != "0" or digits == "0"):  # JSON integer syntax
        return int(cell) if len(digits) <= 19 else _TOO_BIG
    return cell or None


def _csv_number(cell: str) -> Any:
    """A ``latency_ms`` cell: JSON number text -> float, other text stays a string, empty -> None."""
    if NUMBER_RE.fullmatch(cell):
        return float(cell)  # like JSON's float(int): beyond float range -> inf -> out of range
    return cell or None


def _csv_typer(header: list[str]) -> Callable[[list[str]], tuple]:
    """For one header: a function typing a row's cells like JSON values, in :data:`FIELDS` order.

    Empty cell (or absent column) = null; ``ts`` integer text -> int; ``latency_ms`` JSON number text ->
    number; ``status`` "0"/"1" -> 0/1 (so false/true) and "true"/"false" stay the accepted strings;
    everything else stays a string and meets the same checks as in JSON."""
    index: dict[str, int] = {}
    for i, name in enumerate(header):
        index.setdefault(name, i)  # the first of duplicate columns wins
    cells_of = itemgetter(*(index.get(name, len(header)) for name in FIELDS))

    def typed(cells: list[str]) -> tuple:
        ts, service, instance, endpoint, latency, status, db_statement = cells_of(cells + [""])
        return (
            _csv_int(ts),
            service or None,
            instance or None,
            endpoint or None,
            _csv_number(latency),
            _CSV_STATUS.get(status, status),
            db_statement or None,
        )

    return typed


class _LineTracker:
    """Feeds decoded lines to ``csv.reader`` and remembers the raw bytes of the current record.

    Lines that are not UTF-8 are decoded with ``surrogateescape`` (so parsing goes on) and flag the
    record as ``bad``."""

    def __init__(self, f: Iterable[bytes]) -> None:
        self._f = f
        self.lineno = 0
        self.pending: list[bytes] = []
        self.bad = False

    def lines(self) -> Iterator[str]:
        for raw in self._f:
            self.lineno += 1
            self.pending.append(raw)
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError:
                self.bad = True
                yield raw.decode("utf-8", "surrogateescape")

    def take(self) -> tuple[int, bytes, bool]:
        """(first line number, raw bytes, had non-UTF-8 bytes) of the record just parsed."""
        first = self.lineno - len(self.pending) + 1
        raw, bad = b"".join(self.pending), self.bad
        self.pending, self.bad = [], False
        return first, raw, bad


#: the columns a CSV header must name (the required fields): without them the first row is data, not a header
_CSV_REQUIRED = ("ts", "service", "latency_ms")


def _csv_header(reader: Iterator[list[str]], tracker: _LineTracker, path: str) -> list[str] | None:
    """The header row (names stripped; blank lines before it skipped), or None for an empty file.

    A first row that does not name every required column is refused (:class:`InputError`): a CSV without a header
    row would otherwise lose its first record to it."""
    while True:
        try:
            header = next(reader)
        except StopIteration:
            return None
        except csv.Error as e:
            raise InputError(f"bad CSV header in {path!r}: {e}") from None
        _, raw, bad = tracker.take()
        if bad:
            raise InputError(f"bad CSV header in {path!r}: not UTF-8")
        if raw.strip():
            names = [name.strip() for name in header]
            missing = [name for name in _CSV_REQUIRED if name not in names]
            if missing:
                raise InputError(
                    f"{path!r}: the CSV header row lacks the column(s) {', '.join(missing)} (a CSV input starts "
                    f"with a header row naming its columns, e.g. {','.join(FIELDS)})"
                )
            return names


def _csv_records(reader: Iterator[list[str]], tracker: _LineTracker) -> Iterator[tuple[int, bytes, bool, list | None]]:
    """(first line, raw bytes, had non-UTF-8, cells or None on a CSV syntax error) per non-blank record."""
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error:
            cells = None
        first, raw, bad = tracker.take()
        if raw.strip():
            yield first, raw, bad, cells


def _csv_row(cells: list[str] | None, bad: bool, typed: Callable[[list[str]], tuple], width: int) -> tuple:
    if bad:
        raise Rejected("not UTF-8")
    if cells is None:
        raise Rejected("bad CSV row")
    if len(cells) != width:
        raise Rejected("wrong number of columns")
    return validate_values(*typed(cells))


def _read_csv(f: BinaryIO, lines: CountedLines, batch_rows: int, sink: Sink, path: str,
              start: Position) -> Iterator[pa.RecordBatch]:  # fmt: skip
    tracker = _LineTracker(lines)
    reader = csv.reader(tracker.lines(), strict=True)  # strict: malformed quoting rejects the record
    header = _csv_header(reader, tracker, path)
    if header is None:
        return
    if start.offset > lines.offset:  # resume after what an earlier run applied; the header is read again
        f.seek(start.offset)
        lines.offset, lines.count = start.offset, start.lines
        tracker.lineno = start.lines
    typed, width = _csv_typer(header), len(header)
    rows: list[tuple] = []
    for first, raw, bad, cells in _csv_records(reader, tracker):
        try:
            rows.append(_csv_row(cells, bad, typed, width))
        except Rejected as r:
            sink.reject(first, raw, r.reason)
            continue
        if len(rows) == batch_rows:
            sink.stats.add_accepted(len(rows))
            yield rows_to_batch(rows)
            rows = []
    if rows:
        sink.stats.add_accepted(len(rows))
        yield rows_to_batch(rows)
