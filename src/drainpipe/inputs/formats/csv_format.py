"""CSV with a header row (``.csv``, optionally gzipped): records typed like JSON values, then validated by the same
scalar rules. An uncompressed file is cut into ranges of whole records for the worker processes and Spark tasks
(each reads the header again); a growing file is resumed after its last applied record, its header read again.

Blocks of records are read in columns when that provably gives what the per-record reference (Python's ``csv``
module, strict) gives: a block is cut at the newlines outside quotes (an even count of quote characters before
them), every record of it must be well-formed (RFC 4180: quoted fields with ``""`` escapes, unquoted fields without
quotes or carriage returns), and pyarrow's CSV reader must return one row per non-blank record. The cells are then
typed in columns (integer ``ts`` text, JSON-number ``latency_ms`` text, the four ``status`` spellings); any row
whose cells take another form, and any row the columnar validation flags, gets its fate and reason from the
reference. A block that is not so read goes to the reference whole; after a record that is not well-formed the
rest of the file does (a stray quote can move every record boundary after it)."""

from __future__ import annotations

import csv
import functools
import io
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from operator import itemgetter
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ... import native
from ...errors import InputError, Rejected
from ..batches import EventBatch
from ..options import InputOptions
from ..part import Blocks, Part
from ..position import Position
from ..rejects import Sink
from ..scanned import RAW_SCHEMA, raw_batch
from ..schema import EVENT_SCHEMA, FIELDS, TRACE_ID
from ..validation import (
    plain_strings,
    rows_to_batch,
    settle_trace_ids,
    validate_columns,
    validate_values,
    warning_counts,
)
from .base import (
    BOM,
    LINE_PART_BLOCKS,
    READ_BYTES,
    CountedLines,
    Format,
    open_planned,
    open_text_sink,
    open_text_source,
)

__all__ = ["Csv", "NUMBER_RE"]


class Csv(Format):
    name = "csv"
    suffixes = (".csv",)
    cost_per_byte = 1.2

    def splits(self, gzipped: bool) -> bool:
        return not gzipped

    def ranges(self, path: str, batch_rows: int, workers: int, start: Position, hasher: Any,
               options: InputOptions) -> Iterator[Part]:  # fmt: skip
        """Ranges of whole records (:func:`_csv_parts`)."""
        return _csv_parts(path, batch_rows, workers, start, hasher, options)

    def read(self, part: Part, sink: Sink, dictionaries: bool) -> Blocks:
        """Blocks of ``batch_rows`` records, numbered from the part's first block."""
        with open_text_source(part.path, part.gzipped) as f:
            lines = CountedLines(f, f.tell(), not part.gzipped)
            start = Position(part.start, part.lineno)
            limit = None if part.whole else part.end - part.start
            for index, batch in enumerate(_read_csv(f, lines, part.batch_rows, sink, part.path, start, limit,
                                                    dictionaries)):  # fmt: skip
                position = Position(lines.offset, lines.count)
                yield part.first + index, EventBatch.of(batch) if batch.num_rows else None, position
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
    cells_of = itemgetter(*(index.get(name, len(header)) for name in (*FIELDS, TRACE_ID)))

    def typed(cells: list[str]) -> tuple:
        ts, service, instance, endpoint, latency, status, db_statement, trace_id = cells_of(cells + [""])
        return (
            _csv_int(ts),
            service or None,
            instance or None,
            endpoint or None,
            _csv_number(latency),
            _CSV_STATUS.get(status, status),
            db_statement or None,
            trace_id or None,  # (an optional column: empty or absent = none)
        )

    return typed


#: the longest cell the reference reads, as long as the C and pyarrow passes read (the csv module's default,
#: 131,072 characters, made it reject a record those accept, so the result depended on the path)
_CELL_LIMIT = (1 << 31) - 1


def _csv_reader(lines: Iterable[str]) -> Any:
    """``csv.reader`` as every reference read of a record uses it: strict (malformed quoting rejects the record),
    cells of any length (the limit is the csv module's, process-wide: only ever raised here)."""
    if csv.field_size_limit() < _CELL_LIMIT:
        csv.field_size_limit(_CELL_LIMIT)
    return csv.reader(lines, strict=True)


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


def _csv_row(cells: list[str] | None, bad: bool, typed: Callable[[list[str]], tuple], width: int,
             warnings: Counter[str]) -> tuple:  # fmt: skip
    """One record's row (its warnings added to ``warnings``), or ``Rejected``."""
    if bad:
        raise Rejected("not UTF-8")
    if cells is None:
        raise Rejected("bad CSV row")
    if len(cells) != width:
        raise Rejected("wrong number of columns")
    return validate_values(*typed(cells), warnings=warnings)


def _read_csv(f: BinaryIO, lines: CountedLines, batch_rows: int, sink: Sink, path: str, start: Position,
              limit: int | None = None, dictionaries: bool = False) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """The accepted rows of each block of ``batch_rows`` records (an empty batch for a block without any: the
    position still moves), from ``start`` (after the header) to the end of the file, or ``limit`` bytes for a
    range part; ``lines`` is kept at the position after the last block given. ``dictionaries``: string columns
    the C pass gives dictionary-encoded may stay so (:func:`~..validation.validate_columns`)."""
    tracker = _LineTracker(lines)
    reader = _csv_reader(tracker.lines())
    header = _csv_header(reader, tracker, path)
    if header is None:
        return
    if start.offset > lines.offset:  # resume after what an earlier run applied; the header is read again
        f.seek(start.offset)
        lines.offset, lines.count = start.offset, start.lines
    else:
        f.seek(lines.offset)
    typed, width = _csv_typer(header), len(header)
    csvscan = native.csvscan if native.enabled("columnar") else None
    if limit is not None and csvscan is not None:  # a planned range: the C cell pass cuts it
        yield from _read_range(f.read(limit), lines, batch_rows, sink, header, typed, dictionaries)
        return
    growable = lines.growable and limit is None
    columnar = native.enabled("columnar")
    for view, ends, nlines, well_formed in _record_blocks(f, growable, batch_rows, limit, check=limit is None):
        block = bytes(view)
        if not well_formed and limit is None:
            f.seek(lines.offset)  # a stray quote: the reference reads the rest of the file from here
            yield from _reference_rest(CountedLines(f, lines.offset, growable), lines, batch_rows, sink, typed, width)
            return
        # (a range part's records were checked well-formed when it was planned)
        batch = _fast_block(block, ends, header, lines.count, sink, typed, width, dictionaries) if columnar else None
        if batch is None:
            batch = _reference_block(block, lines.count, sink, typed, width)
        lines.offset += len(block)
        lines.count += nlines
        yield batch


def _csv_parts(path: str, batch_rows: int, workers: int, start: Position, hasher: Any,
               options: InputOptions) -> Iterator[Part]:  # fmt: skip
    """Ranges of whole records from ``start`` (after the header), about three parts per worker and at most
    ``LINE_PART_BLOCKS`` blocks each, cut at newlines outside quotes and ending at the file's last newline (as JSON
    Lines: a line still being written waits). Every record of a range is checked well-formed here, in the planner,
    so the ranges are the reference's record boundaries; from a block that is not, the rest of the file is one
    whole part, read sequentially. ``hasher``: fed the bytes before ``start``; the scan feeds it the rest and each
    range records the digest of the file before its end (``Part.prefix``)."""
    f, size = open_planned(path)
    with f:
        if size <= start.offset:
            return
        head = CountedLines(f, 3 if f.read(3) == BOM else 0, True)
        f.seek(head.offset)
        tracker = _LineTracker(head)
        if _csv_header(_csv_reader(tracker.lines()), tracker, path) is None:
            return
        pos, lineno = (start.offset, start.lines) if start.offset > head.offset else (head.offset, head.count)
        if hasher is not None and pos > start.offset:
            f.seek(start.offset)
            hasher.update(f.read(pos - start.offset))
        f.seek(pos)
        sample = f.read(1 << 20)
        estimate = (size - pos) * max(1, sample.count(b"\n")) / max(1, len(sample)) / batch_rows
        per_part = batch_rows * max(1, min(LINE_PART_BLOCKS, int(estimate // (3 * max(1, workers)))))
        f.seek(pos)
        first = 0
        # Scanned a block at a time, as the readers do (asking the scan for a whole part's records at once rescanned
        # and copied its growing buffer), and grouped into parts of ``per_part`` records.
        part: list[tuple[int, int, int]] = []  # (bytes, records, lines) of the blocks of the part being cut

        def cut() -> Part:
            nonlocal first, pos, lineno
            nbytes, nlines = sum(b for b, _, _ in part), sum(n for _, _, n in part)
            digest = hasher.copy().hexdigest() if hasher is not None else ""
            blocks = -(-sum(r for _, r, _ in part) // batch_rows)
            done = Part(path, Csv.name, False, batch_rows, first, blocks, pos, pos + nbytes, lineno, nlines, nbytes,
                        digest, options=options)  # fmt: skip
            first, pos, lineno = first + blocks, pos + nbytes, lineno + nlines
            part.clear()
            return done

        for block, ends, nlines, well_formed in _record_blocks(f, True, batch_rows):
            records = len(ends)
            if not well_formed:
                if part:
                    yield cut()
                yield Part(path, Csv.name, False, batch_rows, first=first, start=pos, lineno=lineno, nbytes=size - pos,
                           options=options)  # fmt: skip
                return
            if hasher is not None:
                hasher.update(block)
            part.append((len(block), records, nlines))
            if len(part) * batch_rows >= per_part or records < batch_rows:  # full, or a short block ends a part
                yield cut()
        if part:
            yield cut()


def _reference_rows(source: CountedLines, lineno: int, sink: Sink, typed: Callable[[list[str]], tuple],
                    width: int) -> Iterator[tuple]:  # fmt: skip
    """The reference: each accepted record's row from where ``source`` stands (its first line is line ``lineno +
    1``), rejects to ``sink``."""
    source.count = 0
    tracker = _LineTracker(source)
    tracker.lineno = lineno
    for first, raw, bad, cells in _csv_records(_csv_reader(tracker.lines()), tracker):
        try:
            yield _csv_row(cells, bad, typed, width, sink.stats.warnings)  # (every row given is accepted)
        except Rejected as r:
            sink.reject(first, raw, r.reason)


def _read_range(data: bytes, lines: CountedLines, batch_rows: int, sink: Sink, header: list[str],
                typed: Callable[[list[str]], tuple], dictionaries: bool) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """The blocks of a planned range (``data``, its records checked well-formed by the planner), as
    :func:`_read_csv` gives them (where the C pass is on). The C cell pass reads each block straight out of ``data``
    and finds where it ends on the way: no record scan and no copy of the block (they were a sixth of a worker's
    time). A block it declines is cut by the record scan and read as any block is."""
    csvscan = native.csvscan
    assert csvscan is not None
    fields, width = _column_fields(tuple(header)), len(header)
    utf8 = data.isascii() or _is_utf8(data)  # (else each block is checked, and those that are not go elsewhere)
    begin = 0
    while begin < len(data):
        scanned = csvscan.columns(data, fields, batch_rows, begin) if utf8 else None
        if scanned is not None and (scanned[1] == batch_rows or scanned[0] == len(data)):
            end, rows, nlines, columns = scanned
            source = functools.partial(_block_records, data, begin, end, rows)
            batch = _validated(raw_batch(rows, columns), source, None, lines.count, sink, typed, width, dictionaries)
            if batch is None:  # (never expected, as in _read_csv) the reference reads the block
                batch = _reference_block(data[begin:end], lines.count, sink, typed, width)
        else:
            ends, nlines, _ = _scan(data, begin, batch_rows, True)
            end = int(ends[-1]) if len(ends) == batch_rows else len(data)
            block = data[begin:end]
            nlines += end == len(data) and not block.endswith(b"\n")  # a last record without a newline
            batch = _fast_block(block, ends - begin, header, lines.count, sink, typed, width, dictionaries)
            if batch is None:
                batch = _reference_block(block, lines.count, sink, typed, width)
        lines.offset += end - begin
        lines.count += nlines
        begin = end
        yield batch


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _block_records(data: bytes, begin: int, end: int, rows: int) -> tuple[bytes, np.ndarray]:
    """The block ``data[begin:end]`` of ``rows`` well-formed records and their ends (for the rows the reference
    reads again: rarely asked for)."""
    block = data[begin:end]
    ends, _, _ = _scan(block, 0, rows, True)
    return block, ends


def _reference_rest(source: CountedLines, lines: CountedLines, batch_rows: int, sink: Sink,
                    typed: Callable[[list[str]], tuple], width: int) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """The reference from where ``source`` stands to the end of the file, in batches of ``batch_rows`` accepted
    rows; ``lines`` follows."""
    base = lines.count
    rows: list[tuple] = []
    for row in _reference_rows(source, base, sink, typed, width):
        rows.append(row)
        if len(rows) == batch_rows:
            lines.offset, lines.count = source.offset, base + source.count
            sink.stats.add_accepted(len(rows))
            yield rows_to_batch(rows)
            rows = []
    lines.offset, lines.count = source.offset, base + source.count
    if rows:
        sink.stats.add_accepted(len(rows))
        yield rows_to_batch(rows)


def _reference_block(block: bytes, lineno: int, sink: Sink, typed: Callable[[list[str]], tuple],
                     width: int) -> pa.RecordBatch:  # fmt: skip
    """One block of whole records by the reference (its first line is line ``lineno + 1``)."""
    rows = list(_reference_rows(CountedLines(io.BytesIO(block), 0, False), lineno, sink, typed, width))
    sink.stats.add_accepted(len(rows))
    return rows_to_batch(rows)


def _record_blocks(f: BinaryIO, growable: bool, records: int, limit: int | None = None,
                   check: bool = True) -> Iterator[tuple[memoryview, np.ndarray, int, bool]]:  # fmt: skip
    """``(bytes, record ends, lines, well formed)`` of consecutive blocks of ``records`` records of ``f`` from where
    it stands, cut after the newlines outside quotes (``record ends``: the offsets after them in the block). A block
    that is not ``well formed`` holds a record that is not, and ends the blocks: from its start only the reference
    knows where records end. At the end of a growable file, a last line without a newline is left unread (the
    reference rejects a record its end of file leaves in quotes). ``limit``: read no more bytes; ``check=False``:
    the records are known to be well-formed (a range its planner checked).

    The file is read through one reused buffer, and ``bytes`` is a view of it, valid until the next block: the
    planner only hashes and counts a block, and copies of the blocks and of a growing buffer were a tenth of its CPU.
    (Every file given here, plain or gzip, is a buffered reader, which has ``readinto``.)"""
    buf = bytearray(READ_BYTES)  # (grown when a block needs more)
    view = memoryview(buf)
    filled = begin = 0
    eof, left = False, limit
    while True:
        ends, lines, malformed = _scan(view[:filled], begin, records, eof and not growable)
        if malformed and check:
            if len(ends):
                yield view[begin : int(ends[-1])], ends - begin, lines, True
                begin = int(ends[-1])
            yield view[begin:filled], np.empty(0, np.int64), 0, False
            return
        if len(ends) == records:
            cut = int(ends[-1])
            yield view[begin:cut], ends - begin, lines, True
            begin = cut
            continue
        if not eof:  # the rest to the buffer's start, then read after it (into a larger buffer if it is full)
            rest = filled - begin
            if rest == len(buf):  # (a new buffer: the old one may still be viewed by the caller)
                buf = bytearray(2 * len(buf))
                buf[:rest] = view[begin:filled]
                view = memoryview(buf)
            elif begin:
                view[:rest] = view[begin:filled]  # (a memoryview copy is a memmove: the two may overlap)
            filled, begin = rest, 0
            room = view[filled:] if left is None else view[filled : filled + left]
            got = f.readinto(room) if len(room) else 0  # type: ignore[attr-defined]
            if left is not None:
                left -= got
            filled += got
            eof = not got
            continue
        if begin >= filled:
            return
        if not growable:  # the rest is the last records (the last one maybe without a newline)
            block = view[begin:filled]
            yield block, ends - begin, lines + (block[-1] != _NEWLINE), True
            return
        cut = buf.rfind(b"\n", begin, filled) + 1  # a line without a newline may still be being written
        done = int(ends[-1]) if len(ends) else begin
        if done > begin:
            yield view[begin:done], ends - begin, lines, True
        if cut > done:  # complete lines, but a record its end leaves open: the reference rejects it
            yield view[done:cut], np.empty(0, np.int64), 0, not check
        return


_NEWLINE = ord("\n")


def _scan(data: bytes | memoryview, begin: int, records: int, final: bool) -> tuple[np.ndarray, int, bool]:
    """The ends (offsets after them) of up to ``records`` records of ``data`` from ``begin``, the newlines before
    the last end, and whether a record is not well-formed (``final``: ``data`` ends the file, its last record
    included). The C scanner gives the ends of the well-formed records before a malformed one; this fallback, none."""
    csvscan = native.csvscan
    if csvscan is not None:
        raw, lines, malformed = csvscan.scan(data, begin, records, final)
        return np.frombuffer(raw, np.int64), lines, malformed
    buf = np.frombuffer(data, np.uint8)[begin:]
    newlines = np.flatnonzero(buf == 10)
    quotes = np.flatnonzero(buf == 34)
    ends = newlines[np.searchsorted(quotes, newlines) % 2 == 0][:records] + 1
    checked = len(buf) if final and len(ends) < records else (int(ends[-1]) if len(ends) else 0)
    if not _well_formed(bytes(buf[:checked])):
        return np.empty(0, np.int64), 0, True
    lines = int(np.searchsorted(newlines, ends[-1])) if len(ends) else 0
    return ends + begin, lines, False


def _records(block: bytes, ends: np.ndarray) -> pa.Array:
    """The records of a block (``ends``: the offset after each) as binary strings; a last record without a newline
    too."""
    offsets = np.concatenate(([0], ends, [len(block)] if not len(ends) or ends[-1] != len(block) else []))
    return pa.BinaryArray.from_buffers(pa.binary(), len(offsets) - 1, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                                       pa.py_buffer(block)])  # fmt: skip


def _well_formed(block: bytes) -> bool:
    """Whether every record of a block (cut after newlines outside quotes) is well-formed, RFC 4180 as Python's
    strict reader takes it: quoted fields with ``""`` escapes, unquoted fields without quotes or carriage returns.
    In numpy over the quote positions, alternately opening and closing: an opening quote starts a field (the block's
    first byte, or after a comma or a newline) or is the second of an escaped ``""`` (right after a closing quote); a
    closing quote ends its field (a comma, a newline, a carriage return, the block's end follow) or is the first of
    an escaped ``""``; a carriage return outside quotes is followed by a newline; the block does not end inside
    quotes."""
    buf = np.frombuffer(block, np.uint8)
    quotes = np.flatnonzero(buf == 34)
    if len(quotes) % 2:
        return False
    returns = np.flatnonzero(buf == 13)
    if len(returns):
        outside = np.searchsorted(quotes, returns) % 2 == 0
        following = np.append(buf, 0)[returns + 1]
        if np.any(outside & (following != 10)):
            return False
    if not len(quotes):
        return True
    padded = np.concatenate(([10], buf, [44]))  # a record start before the block, a delimiter after it
    before, after = padded[quotes[0::2]], padded[quotes[1::2] + 2]
    opens = (before == 44) | (before == 10) | (before == 34)
    closes = (after == 44) | (after == 10) | (after == 13) | (after == 34)
    return bool(opens.all() and closes.all())


def _lines_before(block: bytes, ends: np.ndarray, record: int) -> int:
    """Lines of ``block`` before its record ``record`` (a reject's line number: rejects are few)."""
    return block.count(b"\n", 0, int(ends[record - 1]) if record else 0)


_INT_TS = r"^-?(?:0|[1-9][0-9]{0,17})$"  # JSON integer text that fits int64 (longer: the reference decides)
_NUMBER = "^" + NUMBER_RE.pattern + "$"


def _plain_integers(cells: pa.Array) -> pa.Array:
    """Which cells are ASCII digits without a leading zero, at most 18 of them: a subset of :data:`_INT_TS` that
    takes a few plain kernels instead of a regex (the regex runs where a cell is not so)."""
    length = pc.binary_length(cells)
    return pc.and_(pc.and_(pc.ascii_is_decimal(cells), pc.less_equal(length, 18)),
                   pc.or_(pc.invert(pc.starts_with(cells, "0")), pc.equal(length, 1)))  # fmt: skip


def _plain_decimals(cells: pa.Array) -> pa.Array:
    """Which cells are ``digits`` or ``digits.digits`` without a leading zero (``0`` and ``0.5`` are fine): a subset
    of :data:`_NUMBER` in plain kernels (no sign, no exponent: those take the regex)."""
    digits = pc.ascii_is_decimal(pc.replace_substring(cells, ".", "", max_replacements=1))
    edges = pc.or_(pc.starts_with(cells, "."), pc.ends_with(cells, "."))
    zero = pc.and_(pc.starts_with(cells, "0"), pc.invert(pc.or_(pc.equal(cells, "0"), pc.starts_with(cells, "0."))))
    return pc.and_(digits, pc.invert(pc.or_(edges, zero)))


def _all_or_empty(plain: pa.Array, cells: pa.Array) -> bool:
    """Whether every cell is plain or empty (then the regex has nothing more to say)."""
    return bool(pc.all(pc.or_(plain, pc.equal(cells, ""))).as_py())


@functools.cache
def _status_spellings() -> tuple[pa.Array, pa.Array]:
    """The ``status`` cells the columns type, and their values. Built on first use, not at import: pyarrow's first
    conversion of Python values imports pandas, which ``drainpipe run`` hides once it starts (``processes``)."""
    return pa.array(["true", "1", "false", "0", ""]), pa.array([True, True, False, False, None])


def _arrow_cells(block: bytes, records: pa.Array, header: list[str],
                 width: int) -> tuple[pa.RecordBatch, np.ndarray, np.ndarray] | None:  # fmt: skip
    """A well-formed block's cells by pyarrow's CSV reader, typed by compute kernels: ``(raw batch, the record of
    each row, the rows whose cells the kernels did not type)``, or None to read the block through the reference."""
    names = [f"c{i}" for i in range(width)]
    try:
        table = pacsv.read_csv(
            pa.py_buffer(block),
            read_options=pacsv.ReadOptions(column_names=names, use_threads=False, block_size=len(block) + 1),
            parse_options=pacsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=True),
            convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()),
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False),
        )  # fmt: skip
    except (pa.ArrowInvalid, UnicodeDecodeError):
        return None  # a row of another width, a whitespace-only line, bytes that are not UTF-8: the reference
    if table.num_rows == len(records):
        kept = np.arange(len(records))  # no blank records: row i is record i
    else:
        blank = pc.match_substring_regex(records, r"^[ \t\r\n\f\v]*$").to_numpy(zero_copy_only=False)
        if table.num_rows != int((~blank).sum()):
            return None
        kept = np.flatnonzero(~blank)
    index: dict[str, int] = {}
    for i, name in enumerate(header):
        index.setdefault(name, i)
    n = table.num_rows
    empty = pa.repeat(pa.scalar("", pa.string()), n)

    def cells(name: str) -> pa.Array:
        return table.column(index[name]).combine_chunks() if name in index else empty

    def nulled(arr: pa.Array) -> pa.Array:
        return pc.if_else(pc.equal(arr, ""), pa.scalar(None, pa.string()), arr)

    ts, latency, status = cells("ts"), cells("latency_ms"), cells("status")
    ts_ok = _plain_integers(ts)
    if not _all_or_empty(ts_ok, ts):
        ts_ok = pc.match_substring_regex(ts, _INT_TS)
    lat_ok = _plain_decimals(latency)
    if not _all_or_empty(lat_ok, latency):
        lat_ok = pc.match_substring_regex(latency, _NUMBER)
    spellings, values = _status_spellings()
    status_at = pc.index_in(status, value_set=spellings)
    odd = ~(
        (pc.or_(ts_ok, pc.equal(ts, "")).to_numpy(zero_copy_only=False))
        & (pc.or_(lat_ok, pc.equal(latency, "")).to_numpy(zero_copy_only=False))
        & status_at.is_valid().to_numpy(zero_copy_only=False)
    )
    batch = pa.RecordBatch.from_arrays(
        [
            pc.cast(pc.if_else(ts_ok, ts, pa.scalar(None, pa.string())), pa.int64()),
            nulled(cells("service")),
            nulled(cells("instance")),
            nulled(cells("endpoint")),
            pc.cast(pc.if_else(lat_ok, latency, pa.scalar(None, pa.string())), pa.float64()),
            values.take(pc.fill_null(status_at, 4)),
            nulled(cells("db_statement")),
            *([nulled(cells(TRACE_ID))] if TRACE_ID in index else []),
        ],
        names=[*FIELDS, *([TRACE_ID] if TRACE_ID in index else [])],
    )
    return batch, kept, odd


@functools.cache
def _column_fields(header: tuple[str, ...]) -> bytes:
    """Per CSV column, the event field the C pass fills from it (its index in :data:`RAW_SCHEMA`), or 255 (no field,
    or a later duplicate: the first column of a name wins, as in :func:`_csv_typer`)."""
    at = {name: i for i, name in enumerate(RAW_SCHEMA.names)}
    seen: set[str] = set()
    fields = []
    for name in header:
        fields.append(at[name] if name in at and name not in seen else 255)
        seen.add(name)
    return bytes(fields)


def _scanned_cells(block: bytes, header: list[str], records: int) -> pa.RecordBatch | None:
    """The ``records`` records of a well-formed block typed by the C pass (``native.csvscan``: exactly what the
    reference types them to, or None where it might not), as a raw batch; None without the C pass, for bytes that
    are not UTF-8, or where it declines."""
    csvscan = native.csvscan
    if csvscan is None or not (block.isascii() or _is_utf8(block)):
        return None
    scanned = csvscan.columns(block, _column_fields(tuple(header)), records, 0)
    if scanned is None or scanned[:2] != (len(block), records):
        return None
    return raw_batch(records, scanned[3])


def _fast_block(block: bytes, ends: np.ndarray, header: list[str], lineno: int, sink: Sink,
                typed: Callable[[list[str]], tuple], width: int,
                dictionaries: bool = False) -> pa.RecordBatch | None:  # fmt: skip
    """A well-formed block in columns (see the module docstring), or None to read it through the reference.
    ``dictionaries``: :func:`~..validation.validate_columns`'s ``keep_dictionaries``."""
    records = len(ends) + (not len(ends) or int(ends[-1]) != len(block))  # (a last record without a newline)
    batch = _scanned_cells(block, header, records)
    if batch is not None:
        return _validated(batch, lambda: (block, ends), None, lineno, sink, typed, width, dictionaries)
    cells = _arrow_cells(block, _records(block, ends), header, width)
    if cells is None:
        return None
    batch, kept, odd = cells
    return _validated(batch, lambda: (block, ends), (kept, odd), lineno, sink, typed, width, dictionaries)


def _validated(batch: pa.RecordBatch, source: Callable[[], tuple[bytes, np.ndarray]],
               typing: tuple[np.ndarray, np.ndarray] | None, lineno: int, sink: Sink,
               typed: Callable[[list[str]], tuple], width: int,
               dictionaries: bool) -> pa.RecordBatch | None:  # fmt: skip
    """A block's raw batch validated, the rows the columns typed otherwise (``typing``: the record of each row and
    the rows not typed; None: row i is record i, every row typed) or flagged read again by the reference, which
    gives their fate and reason. ``source()``: the block's bytes and record ends, asked for only then. None when the
    reference does not read such a row as one record (never expected): the caller reads the block through it."""
    kept, odd = typing if typing is not None else (np.arange(batch.num_rows), np.zeros(batch.num_rows, bool))
    canonical, flagged, warned = validate_columns(batch, dictionaries)
    bad = odd | (flagged[0] if flagged is not None else False)
    if not bad.any():
        sink.stats.add_accepted(batch.num_rows)
        sink.stats.warnings.update(warning_counts(warned))
        return canonical
    # the rows typed otherwise or flagged: the reference gives their fate and reason, and types those it accepts
    block, ends = source()
    records = _records(block, ends)
    accepted: list[tuple] = []
    at: list[int] = []
    warnings = warning_counts(warned, ~bad)  # the rows read again count theirs there
    for i in np.flatnonzero(bad).tolist():
        record = int(kept[i])
        raw = records[record].as_py()
        try:
            accepted.append(_csv_row(next(_csv_reader(io.StringIO(raw.decode("utf-8")))), False, typed,
                                     width, warnings))  # fmt: skip
            at.append(i)
        except Rejected as r:
            sink.reject(lineno + 1 + _lines_before(block, ends, record), raw, r.reason)
        except (csv.Error, StopIteration, UnicodeDecodeError):
            return None  # (never expected for a well-formed block): the reference reads it whole
    out = canonical.filter(pa.array(~bad))
    if accepted:  # back in record order
        order = np.argsort(np.concatenate((np.flatnonzero(~bad), at)), kind="stable")
        both = settle_trace_ids(plain_strings(out), rows_to_batch(accepted))
        out = pa.Table.from_batches(both).combine_chunks().to_batches()[0].take(order)
    (out,) = settle_trace_ids(out)  # (a trace id column whose rows all went to the reference or were rejected)
    sink.stats.add_accepted(out.num_rows)
    sink.stats.warnings.update(warnings)
    return out
