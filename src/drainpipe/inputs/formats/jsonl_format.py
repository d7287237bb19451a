"""JSON Lines (``.jsonl``, ``.json``, ``.ndjson``, optionally gzipped): parsed and validated a block of
``batch_rows`` lines at a time, and the HTTP bodies of the same encoding.

A block goes through a columnar fast path and the columnar core (:func:`fast_jsonl_block`) when that provably
gives the per-line result (every line a strict JSON object with canonically typed known fields; value rejects then
get their reasons from the per-line core); any other block is validated line by line, so the result never depends
on which path ran. The fast path is the C scanner (``native.jsonscan``: one pass from bytes to Arrow buffers, for
flat objects of the known fields with unescaped values) and, for blocks it declines or where it is not built (the
pure-Python code Spark executors import), ``pyarrow.json``. :mod:`drainpipe.native` says which tiers are on
(``columnar`` off: every block line by line; ``threads`` off: ``pyarrow.json`` on the calling thread).

Uncompressed files are cut into byte ranges of whole lines for the workers (:meth:`JsonLines.plan`: the parent
only counts newlines, and hashes the bytes for exactly once); a part is read with the same block reader as a whole
file, so both number and validate blocks alike.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from ... import native
from ...errors import Rejected
from ..batches import EventBatch
from ..options import InputOptions
from ..part import Blocks, Part
from ..position import Position
from ..rejects import ReadStats, Sink
from ..scanned import RAW_SCHEMA, raw_batch
from ..schema import TRACE_ID
from ..validation import counted, counted_batch, rows_to_batch, validate_columns, validate_values, warning_counts
from .base import READ_BYTES, Format, line_ends, line_parts, open_text_sink, open_text_source, split_lines

__all__ = [
    "JsonLines",
    "JsonlBlocks",
    "read_jsonl_stream",
    "fast_jsonl_block",
    "json_rows",
    "scanned",
    "scan_range",
    "validate_json_lines",
]

_JSON_WS = b" \t\r\n"


class JsonLines(Format):
    name = "jsonl"
    suffixes = (".jsonl", ".json", ".ndjson")
    cost_per_byte = 1.0

    def splits(self, gzipped: bool) -> bool:
        return not gzipped

    def ranges(self, path: str, batch_rows: int, workers: int, start: Position, hasher: Any,
               options: InputOptions) -> Iterator[Part]:  # fmt: skip
        """Byte ranges of whole lines (:func:`~.base.line_parts`)."""
        return line_parts(self.name, path, batch_rows, workers, start, hasher, options)

    def read(self, part: Part, sink: Sink, dictionaries: bool) -> Blocks:
        with open_text_source(part.path, part.gzipped) as f:
            offset = f.tell()  # after a BOM
            if part.start > offset:
                f.seek(part.start)
                offset = part.start
            limit = None if part.whole else part.end - offset
            growable = part.whole and self.growable(part.gzipped)
            end = Position(offset, part.lineno)
            for index, batch, consumed, lines in read_jsonl_stream(f, growable, part.batch_rows, sink, part.lineno,
                                                                   limit, dictionaries):  # fmt: skip
                end = Position(offset + consumed, part.lineno + lines)
                yield part.first + index, None if batch is None else EventBatch.of(batch), end
            return end

    def write(self, batches: Iterable[pa.RecordBatch], path: str, gzipped: bool) -> int:
        rows = 0
        with open_text_sink(path, gzipped) as f:
            for batch in batches:
                if batch.num_rows:
                    f.write(_string_data(_json_lines(batch)))
                    rows += batch.num_rows
        return rows


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_scan_json = json.JSONDecoder(parse_constant=_reject_constant).scan_once  # type: ignore[attr-defined]


def _json_record(line: bytes, warnings: Counter[str] | None) -> tuple:
    """One stripped, non-blank JSON line -> canonical row tuple (its warnings added to ``warnings``), or
    ``Rejected``."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise Rejected("not UTF-8") from None
    try:
        obj, end = _scan_json(text, 0)
    except (ValueError, StopIteration, RecursionError):
        raise Rejected("invalid JSON") from None
    if end != len(text):
        raise Rejected("invalid JSON")
    if type(obj) is not dict:
        raise Rejected("not an object")
    get = obj.get
    return validate_values(
        get("ts"), get("service"), get("instance"), get("endpoint"),
        get("latency_ms"), get("status"), get("db_statement"), get(TRACE_ID), warnings=warnings,
    )  # fmt: skip


def read_jsonl_stream(
    f: BinaryIO,
    growable: bool,
    batch_rows: int,
    sink: Sink,
    lineno: int = 0,
    limit: int | None = None,
    dictionaries: bool = False,
) -> Iterator[tuple[int, pa.RecordBatch | None, int, int]]:
    """``(block index, accepted rows or None, bytes consumed, lines consumed)`` per block of ``batch_rows`` lines of
    ``f`` (the first line read is line ``lineno + 1``), consumed counts being from where ``f`` stood. ``limit``:
    read no more than that many bytes (a range part, read in one piece); else the file is read to its end in large
    chunks. Each block goes through :meth:`JsonlBlocks.read_range`. For a growable file a last line without a
    newline is left unread: it may still be being written. ``dictionaries``: see :class:`JsonlBlocks`."""
    reader = JsonlBlocks(dictionaries)
    data, begin, index, consumed, count, eof, ascii = b"", 0, 0, 0, 0, False, True
    left = limit
    while True:
        while not eof and data.count(b"\n", begin) < batch_rows:  # a whole block, or the rest of the file
            chunk = f.read(READ_BYTES if left is None else left)  # a range part is read in one piece
            if left is not None:
                left -= len(chunk)
                eof = left <= 0
            if chunk:  # (no copy of the first chunk: a range part is one)
                data, begin = (data[begin:] + chunk if begin < len(data) else chunk), 0
            else:
                eof = True
            if eof and growable:
                data = data[: data.rfind(b"\n") + 1]
            ascii = data.isascii()
        if begin >= len(data):
            return
        end, n, batch = reader.read_range(data, begin, batch_rows, lineno, sink, ascii)
        consumed, count, lineno, begin = consumed + end - begin, count + n, lineno + n, end
        yield index, batch, consumed, count
        index += 1


class JsonlBlocks:
    """Validates consecutive blocks of raw JSON lines (fast columnar path when provably equal, else per line).

    After a block the fast path declines, the next blocks go straight line by line (doubling backoff): that
    only saves failed attempts; the result of a block never depends on the path, its rows never do.

    ``dictionaries``: the string columns the C scanner gives dictionary-encoded stay so where validation changes
    none of their values (for a reader that only aggregates them; see :func:`~..validation.validate_columns`)."""

    def __init__(self, dictionaries: bool = False) -> None:
        self.skip = self.backoff = 0
        self.dictionaries = dictionaries

    def read(
        self,
        chunk: Sequence[bytes],
        lineno: int,
        sink: Sink,
        data: bytes | None = None,
        newlines: np.ndarray | None = None,
        scan: bool = True,
    ) -> pa.RecordBatch | None:
        """The accepted rows of ``chunk`` (its first line is line ``lineno + 1``; ``data`` = the joined chunk
        and ``newlines`` = the offsets of its ``\\n`` bytes, if the caller has them) as a canonical batch, None
        if there are none; rejects go to ``sink``. ``scan=False``: the C scanner already declined these lines."""
        fast = None
        if not self.skip and native.enabled("columnar"):
            fast = fast_jsonl_block(chunk, lineno, data, newlines, scan, dictionaries=self.dictionaries)
            self._tried(fast is not None)
        elif self.skip:
            self.skip -= 1
        if fast is not None:
            return _accepted(*fast, sink)
        rows = json_rows(enumerate(chunk, lineno + 1), sink.reject, sink.stats.warnings)
        if rows:
            sink.stats.add_accepted(len(rows))
            return rows_to_batch(rows)
        return None

    def read_range(
        self, data: bytes, begin: int, count: int, lineno: int, sink: Sink, ascii: bool = False
    ) -> tuple[int, int, pa.RecordBatch | None]:
        """The block of the next ``count`` lines of ``data`` from offset ``begin`` (fewer at its end; the first
        is line ``lineno + 1``): ``(end offset, lines, accepted rows or None)``, rejects to ``sink``.
        ``ascii``: the caller knows ``data`` is ASCII.

        The C scanner reads a block straight out of ``data`` and finds its end on the way; a block it declines
        is cut out and read by :meth:`read`, with the same result."""
        tried = ascii and not self.skip and native.jsonscan is not None and native.enabled("columnar")
        if tried:
            scanned = scan_range(data, begin, count)
            if scanned is not None:
                end, n, batch = scanned
                fast = _fast_result(batch, _LazyLines(data, begin, end, n), lineno, self.dictionaries)
                if fast is not None:
                    self._tried(True)
                    return end, n, _accepted(*fast, sink)
        ends = line_ends(data, begin, count)
        stop = begin + int(ends[-1]) + 1 if len(ends) == count else len(data)
        block = data[begin:stop]
        lines = _LazyLines(block, 0, len(block), len(ends) + (block[-1] != _NL))
        return stop, len(lines), self.read(lines, lineno, sink, block, ends, scan=not tried)

    def _tried(self, fast: bool) -> None:
        self.backoff = 0 if fast else min(2 * self.backoff or 1, _JSONL_MAX_BACKOFF)
        self.skip = self.backoff


def _accepted(
    batch: pa.RecordBatch, rejects: list[tuple[int, bytes, str]], warnings: Counter[str], sink: Sink
) -> pa.RecordBatch | None:
    for reject in rejects:
        sink.reject(*reject)
    for reason, n in warnings.items():
        sink.stats.add_warning(reason, n)
    if batch.num_rows:
        sink.stats.add_accepted(batch.num_rows)
        return batch
    return None


class _LazyLines(Sequence[bytes]):
    """The ``count`` lines of ``data[begin:end]`` (cut after each ``\\n``, as iterating a binary file does), split
    only when a line is asked for: the columnar paths need just the count, and a line only for a reject."""

    def __init__(self, data: bytes, begin: int, end: int, count: int) -> None:
        self.data, self.begin, self.end, self.n = data, begin, end, count
        self._lines: list[bytes] | None = None

    def __len__(self) -> int:
        return self.n

    def _split(self) -> list[bytes]:
        if self._lines is None:
            self._lines = split_lines(self.data[self.begin : self.end])
            assert len(self._lines) == self.n
        return self._lines

    def __getitem__(self, i: Any) -> Any:
        return self._split()[i]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._split())


#: Most blocks skipped after a declined one (doubling per decline in a row): bounds what failed attempts cost
#: on files whose blocks all need the per-line path (e.g. ``status`` written as 0/1 or ISO ``ts`` strings).
_JSONL_MAX_BACKOFF = 16
_ARROW_JSON_PARSE = pajson.ParseOptions(explicit_schema=RAW_SCHEMA, unexpected_field_behavior="ignore")
#: the same, refusing fields outside the schema (:func:`_arrow_known_fields_only`)
_ARROW_JSON_PARSE_KNOWN = pajson.ParseOptions(explicit_schema=RAW_SCHEMA, unexpected_field_behavior="error")
_ARROW_JSON_READ_THREADS = pajson.ReadOptions(use_threads=True, block_size=1 << 20)
#: the same on one thread, with blocks large enough that a block of lines comes back as one chunk (the ``threads``
#: tier off: worker and parser processes, where the processes are the parallelism and pyarrow's threads waste CPU)
_ARROW_JSON_READ_SERIAL = pajson.ReadOptions(use_threads=False, block_size=32 << 20)


def _arrow_json_read() -> pajson.ReadOptions:
    return _ARROW_JSON_READ_THREADS if native.enabled("threads") else _ARROW_JSON_READ_SERIAL


_MAX_NESTING = 200  # a line with fewer brackets than this cannot reach Python's recursion limit


def _int_digits_limit() -> int:
    """Longest integer literal :func:`json.loads` converts (Python >= 3.11 caps ``int()``)."""
    limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0
    return limit or (1 << 62)


_OPEN, _CLOSE, _BRACKET, _CR, _NL = ord("{"), ord("}"), ord("["), ord("\r"), ord("\n")


def fast_jsonl_block(
    chunk: Sequence[bytes],
    lineno: int = 0,
    data: bytes | None = None,
    newlines: np.ndarray | None = None,
    scan: bool = True,
    *,
    dictionaries: bool = False,
) -> tuple[pa.RecordBatch, list[tuple[int, bytes, str]], Counter[str]] | None:
    """A block of raw JSON lines (the first is line ``lineno + 1``) -> ``(canonical batch of the accepted
    rows, (line, raw, reason) per rejected line, the accepted rows' warnings)`` via the C scanner
    (:func:`scanned`) or else ``pyarrow.json`` (:func:`_arrow_parsed`) and the columnar core, or None when this
    cannot be proven to equal what the per-line path (:func:`json_rows`) gives for the block. The scanner accepts a
    strict subset of what follows.

    Only a block in which every line is one strict-JSON object whose known fields have the canonical JSON
    types takes this path; the rows the columnar checks reject get their reasons from the per-line path.
    Anything else returns None and the caller reads the block line by line, so rejects, reasons and line
    numbers never depend on the path:

    * pyarrow is more lenient than :func:`json.loads` in a few ways, all excluded: ``NaN`` and
      ``Infinity`` tokens, unbounded nesting and huge integers (long lines; in unknown fields: a block
      without unknown fields is parsed refusing them and needs no more guards, see
      :func:`_arrow_known_fields_only`; else any block containing ``NaN``/``Infinity`` bytes or
      bracket-heavy lines declines), bytes that are not UTF-8, objects spanning lines or
      several objects on one line (every line must start with ``{`` and end with ``}``, and pyarrow must
      return exactly one row per line);
    * pyarrow raises for everything else strict JSON rejects, and for any value of another JSON type than
      the canonical column's (an ISO string or float ``ts``, ``status`` 0/1/"true", a number for a string,
      numbers beyond int64/double, duplicate keys), which the per-line path may accept or reject;
    * a row the columnar checks (:func:`validate_columns`) flag that the per-line path accepts (never
      expected) sends the block back too."""
    n = len(chunk)
    if data is None:
        data = b"".join(chunk)
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return None
    batch = scanned(data, n) if scan else None
    if batch is None:
        batch = _arrow_parsed(data, n, newlines)
        if batch is None:
            return None
    return _fast_result(batch, chunk, lineno, dictionaries)


def _fast_result(
    batch: pa.RecordBatch, chunk: Sequence[bytes], lineno: int, dictionaries: bool = False
) -> tuple[pa.RecordBatch, list[tuple[int, bytes, str]], Counter[str]] | None:
    """A raw batch a fast path read from the lines ``chunk`` (the first is line ``lineno + 1``) -> ``(canonical
    batch of the accepted rows, (line, raw, reason) per rejected line, the accepted rows' warnings)``, or None when
    a row the columnar checks flag is one the per-line path accepts (never expected: the caller then reads the
    block line by line). ``dictionaries``: :func:`~..validation.validate_columns`'s ``keep_dictionaries``."""
    canonical, flagged, warned = validate_columns(batch, dictionaries)
    warnings = warning_counts(warned)  # (of the rows not flagged: the per-line path rejects every flagged one)
    if flagged is None:
        return canonical, [], warnings
    # Rows the columnar checks reject are strict-JSON objects of canonical types: the per-line path gives
    # their reasons (and must reject every one of them, or the whole block goes back to it).
    mask = flagged[0]
    rejects: list[tuple[int, bytes, str]] = []
    bad = np.flatnonzero(mask).tolist()
    accepted = json_rows(((lineno + 1 + i, chunk[i]) for i in bad), lambda *reject: rejects.append(reject))
    if accepted or len(rejects) != len(bad):
        return None
    return canonical.filter(pa.array(~mask)), rejects, warnings


def scanned(data: bytes, n: int) -> pa.RecordBatch | None:
    """The ``n`` lines of UTF-8 ``data`` as a raw batch of :data:`RAW_SCHEMA` by the C scanner, or None
    when a line is outside its strict subset of JSON (``_jsonscan.c`` lists it: flat objects of the known
    fields with canonically typed, unescaped values) or the scanner is not built or is off."""
    scanned = scan_range(data, 0, n)
    return scanned[2] if scanned is not None and scanned[:2] == (len(data), n) else None


def scan_range(data: bytes, begin: int, count: int) -> tuple[int, int, pa.RecordBatch] | None:
    """Up to ``count`` lines of UTF-8 ``data`` from offset ``begin`` by the C scanner: ``(end offset, lines,
    raw batch)``, or None (see :func:`scanned`)."""
    jsonscan = native.jsonscan
    scanned = jsonscan.scan(data, count, begin) if jsonscan is not None else None
    if scanned is None:
        return None
    end, n, columns = scanned
    return end, n, raw_batch(n, columns)


def _arrow_parsed(data: bytes, n: int, newlines: np.ndarray | None) -> pa.RecordBatch | None:
    """The ``n`` lines of UTF-8 ``data`` as a raw batch parsed by ``pyarrow.json``, or None where that could
    differ from the per-line path (see :func:`fast_jsonl_block`)."""
    lines = _one_object_per_line(data, n, newlines)
    if lines is None:
        return None
    buf, starts, ends = lines
    if int((ends - starts).max()) >= _int_digits_limit():  # a shorter line holds no integer int() refuses
        return None
    table = _arrow_known_fields_only(data)
    if table is None:
        if b"NaN" in data or b"Infinity" in data:
            return None
        if data.count(b"{") + data.count(b"[") - n >= _MAX_NESTING - 1:  # else no line has _MAX_NESTING brackets
            brackets = np.cumsum((buf == _OPEN) | (buf == _BRACKET), dtype=np.int64)
            if np.any(brackets[ends - 1] - brackets[starts] + 1 >= _MAX_NESTING):
                return None
        try:
            table = pajson.read_json(
                pa.BufferReader(data), read_options=_arrow_json_read(), parse_options=_ARROW_JSON_PARSE
            )
        except Exception:
            return None
    if table.num_rows != n or table.schema != RAW_SCHEMA:
        return None
    table = table.combine_chunks()
    return pa.RecordBatch.from_arrays([col.chunk(0) if col.num_chunks else pa.array([], col.type)
                                       for col in table.columns], schema=RAW_SCHEMA)  # fmt: skip


def _arrow_known_fields_only(data: bytes) -> pa.Table | None:
    """``data`` parsed by pyarrow when no object has a field outside the schema, else None (also for anything
    else pyarrow refuses).

    Without unknown fields every value pyarrow accepts has its column's scalar type, so the byte-level guards
    for unknown fields are moot: no nesting, no integer beyond int64, and a ``NaN`` / ``Infinity`` token can
    only be a ``latency_ms`` value, seen as a non-finite value in the column (such a table is refused here:
    the caller's other path declines it). Saves those guards' passes over the bytes on the usual input."""
    try:
        table = pajson.read_json(
            pa.BufferReader(data), read_options=_arrow_json_read(), parse_options=_ARROW_JSON_PARSE_KNOWN
        )
    except Exception:
        return None
    latency = table.column("latency_ms")
    if latency.null_count < len(latency) and not pc.all(pc.is_finite(latency)).as_py():
        return None
    return table


def _one_object_per_line(
    data: bytes, n: int, newlines: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(bytes, line starts, line ends)`` as numpy arrays when every one of the ``n`` lines in ``data``
    starts with ``{`` and ends with ``}`` (before an optional ``\\r`` and the ``\\n``), so no line is blank
    and no object can continue on the next line; else None. ``newlines``: the offsets of the ``\\n`` bytes,
    if known."""
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == _NL) if newlines is None else newlines
    if buf[-1] != _NL:
        ends = np.append(ends, len(buf))  # last line without a line ending
    if len(ends) != n:
        return None
    starts = np.empty(n, dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts
    if lengths.min() < 2 or np.any(buf[starts] != _OPEN):
        return None
    last = ends - 1
    cr = buf[last] == _CR
    if cr.any():
        last = np.where(cr, last - 1, last)
    if not np.all(buf[last] == _CLOSE):
        return None
    return buf, starts, ends


def validate_json_lines(
    data: bytes, stats: ReadStats | None = None, *, dictionaries: bool = False
) -> tuple[pa.RecordBatch, list[tuple[int, str]]]:
    """A JSON Lines (NDJSON) body -> a canonical batch of its valid records and ``(line number, reason)`` per
    rejected line (1-based; blank lines are skipped and not counted), parsed strictly as in files, through the
    same columnar fast path where it provably gives the same result. ``stats`` (optional) counts them as a read
    would, warnings too. ``dictionaries``: :class:`JsonlBlocks`'s flag, for a caller that only aggregates."""
    if data and native.enabled("columnar"):
        n = data.count(b"\n") + (not data.endswith(b"\n"))
        fast = fast_jsonl_block(_LazyLines(data, 0, len(data), n), 0, data, dictionaries=dictionaries)
        if fast is not None:
            batch, rejected, noted = fast
            return counted_batch(batch, [(line, reason) for line, _, reason in rejected], stats, noted)
    rejects: list[tuple[int, str]] = []
    warnings: Counter[str] = Counter()
    rows = json_rows(enumerate(data.split(b"\n"), 1), lambda lineno, _raw, reason: rejects.append((lineno, reason)),
                     warnings)  # fmt: skip
    return counted(rows, rejects, stats, warnings)


def json_rows(
    numbered: Iterable[tuple[int, bytes]],
    reject: Callable[[int, bytes, str], None],
    warnings: Counter[str] | None = None,
) -> list[tuple]:
    """Validated rows of numbered JSON lines; blank lines are skipped, every other line is a row or a reject. The
    rows' warnings are added to ``warnings``."""
    rows: list[tuple] = []
    for lineno, raw in numbered:
        line = raw.strip(_JSON_WS)
        if not line:
            continue
        try:
            rows.append(_json_record(line, warnings))
        except Rejected as r:
            reject(lineno, raw, r.reason)
    return rows


# ------------------------------------------------------------------------------------------------ planning


# ------------------------------------------------------------------------------------------------ writing


def _json_string(arr: pa.Array) -> pa.Array:
    """Strings -> JSON string literals (quoted, escaped); nulls stay null."""
    if pc.any(pc.match_substring_regex(arr, r'[\x00-\x1f"\\]')).as_py():
        arr = pc.replace_substring(arr, "\\", "\\\\")
        arr = pc.replace_substring(arr, '"', '\\"')
        for code in range(0x20):
            char = chr(code)
            if pc.any(pc.match_substring(arr, char)).as_py():
                arr = pc.replace_substring(arr, char, f"\\u{code:04x}")
    return pc.binary_join_element_wise('"', arr, '"', "")


def _json_lines(batch: pa.RecordBatch) -> pa.Array:
    """One JSON object per row, each ending in a newline; absent db_statement is omitted."""
    latency = batch.column("latency_ms")
    if not pc.all(pc.is_finite(latency)).as_py():
        raise ValueError("latency_ms must be finite to be written as JSON")
    db = pc.binary_join_element_wise(',"db_statement":', _json_string(batch.column("db_statement")), "")
    parts = [
        '{"ts":', batch.column("ts").cast(pa.string()),
        ',"service":', _json_string(batch.column("service")),
        ',"instance":', _json_string(batch.column("instance")),
        ',"endpoint":', _json_string(batch.column("endpoint")),
        ',"latency_ms":', latency.cast(pa.string()),
        ',"status":', batch.column("status").cast(pa.string()),
        pc.fill_null(db, ""), "}\n",
    ]  # fmt: skip
    return pc.binary_join_element_wise(*parts, "")


def _string_data(arr: pa.Array) -> memoryview:
    """The concatenated UTF-8 bytes of a string array, without copying."""
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4)
    return memoryview(arr.buffers()[2])[offsets[0] : offsets[-1]]
