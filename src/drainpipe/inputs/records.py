"""Records: the per-format block readers (JSON Lines, CSV, Parquet), format detection, and the request-row marks.

Contract (``docs/pipeline.md``, "Input events"):

* :func:`read_events` reads JSON Lines (``.jsonl``/``.json``/``.ndjson``), CSV (``.csv``), each optionally
  ``.gz``, and Parquet (``.parquet``), and yields canonical batches. A record that fails validation is
  rejected: it is counted in :class:`ReadStats` (``read == accepted + rejected`` always; blank lines are
  neither), written to the :class:`DeadLetter` with a short reason, and reading goes on.

The rules are :mod:`.validation`'s (one set for every format); the schema is :mod:`.schema`'s, and counts and
rejects go through :mod:`.rejects`. Row formats (JSON Lines, CSV) turn each record into plain Python values (CSV
cells are typed first: see :func:`_csv_typer`) and run :func:`~.validation.validate_values`; Parquet is validated
columnar in :func:`~.validation.validate_columns`.

JSON Lines are read a block of ``batch_rows`` lines at a time. A block goes through a columnar fast path and the
columnar core (:func:`fast_jsonl_block`) when that provably gives the per-line result (every line a strict
JSON object with canonically typed known fields; value rejects then get their reasons from the per-line
core); any other block is validated line by line, so the result never depends on which path ran. The fast path
is the C scanner ``_jsonscan`` (one pass from bytes to Arrow buffers, for flat objects of the known fields with
unescaped values) and, for blocks it declines or where it is not built (the pure-Python code Spark executors
import), ``pyarrow.json``.
"""

from __future__ import annotations

import csv
import glob
import gzip
import json
import os
import re
import sys
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from ..errors import InputError, Rejected
from .position import Position
from .rejects import DeadLetter, ReadStats, Sink
from .schema import EVENT_SCHEMA, FIELDS
from .validation import counted, counted_batch, rows_to_batch, validate_columns, validate_values

try:
    from ._jsonscan import scan as _scan_block
except ImportError:  # the pure-Python code shipped to Spark executors: pyarrow's reader is the fast path there
    _scan_block = None  # type: ignore[assignment]

__all__ = [
    "detect_format",
    "expand_inputs",
    "read_events",
    "validate_json_lines",
    "REQUESTS_KEY",
    "mark_requests",
    "with_exits",
    "request_rows",
    "join_events",
]

_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet",
            ".log": "access"}  # fmt: skip
BOM = b"\xef\xbb\xbf"
_JSON_WS = b" \t\r\n"


# --------------------------------------------------------------------------------------------------
# JSON Lines


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_scan_json = json.JSONDecoder(parse_constant=_reject_constant).scan_once  # type: ignore[attr-defined]


def _json_record(line: bytes) -> tuple:
    """One stripped, non-blank JSON line -> canonical row tuple, or ``Rejected``."""
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
        get("latency_ms"), get("status"), get("db_statement"),
    )  # fmt: skip


#: bytes a whole-file JSON Lines read takes from its file at a time
_READ_BYTES = 8 << 20


def read_jsonl_stream(
    f: BinaryIO, growable: bool, batch_rows: int, sink: Sink, lineno: int = 0
) -> Generator[tuple[int, pa.RecordBatch], None, tuple[int, int]]:
    """``(block index, batch)`` per block of ``batch_rows`` lines of ``f`` that has accepted rows (the first line
    read is line ``lineno + 1``); returns the bytes and lines it consumed. The file is read in large chunks and each
    block goes through :meth:`JsonlBlocks.read_range`, as in a worker. For a growable file a last line without a
    newline is left unread: it may still be being written."""
    reader = JsonlBlocks()
    data, begin, index, consumed, count, eof, ascii = b"", 0, 0, 0, 0, False, True
    while True:
        while not eof and data.count(b"\n", begin) < batch_rows:  # a whole block, or the rest of the file
            chunk = f.read(_READ_BYTES)
            if chunk:
                data, begin = data[begin:] + chunk, 0
            else:
                eof = True
                if growable:
                    data = data[: data.rfind(b"\n") + 1]
            ascii = data.isascii()
        if begin >= len(data):
            return consumed, count
        end, n, batch = reader.read_range(data, begin, batch_rows, lineno, sink, ascii)
        consumed, count, lineno, begin = consumed + end - begin, count + n, lineno + n, end
        if batch is not None:
            yield index, batch
        index += 1


class JsonlBlocks:
    """Validates consecutive blocks of raw JSON lines (fast columnar path when provably equal, else per line).

    After a block the fast path declines, the next blocks go straight line by line (doubling backoff): that
    only saves failed attempts; the result of a block never depends on the path."""

    def __init__(self) -> None:
        self.skip = self.backoff = 0

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
        if _JSONL_FAST_PATH and not self.skip:
            fast = fast_jsonl_block(chunk, lineno, data, newlines, scan)
            self._tried(fast is not None)
        elif self.skip:
            self.skip -= 1
        if fast is not None:
            return _accepted(*fast, sink)
        rows = json_rows(enumerate(chunk, lineno + 1), sink.reject)
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
        tried = ascii and _JSONL_FAST_PATH and not self.skip and _scan_block is not None
        if tried:
            scanned = scan_range(data, begin, count)
            if scanned is not None:
                end, n, batch = scanned
                fast = _fast_result(batch, _LazyLines(data, begin, end, n), lineno)
                if fast is not None:
                    self._tried(True)
                    return end, n, _accepted(*fast, sink)
        ends = _line_ends(data, begin, count)
        stop = begin + int(ends[-1]) + 1 if len(ends) == count else len(data)
        block = data[begin:stop]
        lines = _LazyLines(block, 0, len(block), len(ends) + (block[-1] != _NL))
        return stop, len(lines), self.read(lines, lineno, sink, block, ends, scan=not tried)

    def _tried(self, fast: bool) -> None:
        self.backoff = 0 if fast else min(2 * self.backoff or 1, _JSONL_MAX_BACKOFF)
        self.skip = self.backoff


def _accepted(batch: pa.RecordBatch, rejects: list[tuple[int, bytes, str]], sink: Sink) -> pa.RecordBatch | None:
    for reject in rejects:
        sink.reject(*reject)
    if batch.num_rows:
        sink.stats.add_accepted(batch.num_rows)
        return batch
    return None


def _line_ends(data: bytes, begin: int, count: int) -> np.ndarray:
    """The offsets (from ``begin``) of the first ``count`` ``\\n`` bytes of ``data`` at or after ``begin``
    (fewer at its end), looking through a window that grows until it holds them."""
    buf = np.frombuffer(data, dtype=np.uint8)
    window = max(1 << 16, 256 * count)
    while True:
        stop = min(len(buf), begin + window)
        ends = np.flatnonzero(buf[begin:stop] == _NL)
        if len(ends) >= count or stop == len(buf):
            return ends[:count]
        window *= 4


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
            parts = self.data[self.begin : self.end].split(b"\n")
            last = parts.pop()
            self._lines = [p + b"\n" for p in parts] + ([last] if last else [])
            assert len(self._lines) == self.n
        return self._lines

    def __getitem__(self, i: Any) -> Any:
        return self._split()[i]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._split())


#: Switch for the columnar JSON Lines fast path (tests turn it off to compare with the per-line path).
_JSONL_FAST_PATH = True
#: Most blocks skipped after a declined one (doubling per decline in a row): bounds what failed attempts cost
#: on files whose blocks all need the per-line path (e.g. ``status`` written as 0/1 or ISO ``ts`` strings).
_JSONL_MAX_BACKOFF = 16
_ARROW_JSON_SCHEMA = pa.schema([pa.field(f.name, f.type) for f in EVENT_SCHEMA])  # all nullable: nulls are checked
_ARROW_JSON_PARSE = pajson.ParseOptions(explicit_schema=_ARROW_JSON_SCHEMA, unexpected_field_behavior="ignore")
#: the same, refusing fields outside the schema (:func:`_arrow_known_fields_only`)
_ARROW_JSON_PARSE_KNOWN = pajson.ParseOptions(explicit_schema=_ARROW_JSON_SCHEMA, unexpected_field_behavior="error")
_ARROW_JSON_READ = pajson.ReadOptions(use_threads=True, block_size=1 << 20)
#: the same on one thread, with blocks large enough that a block of lines comes back as one chunk (workers)
_ARROW_JSON_READ_SERIAL = pajson.ReadOptions(use_threads=False, block_size=32 << 20)


def use_serial_json_reader() -> None:
    """Parse JSON blocks on the calling thread only (worker processes: the process pool is the parallelism, and
    pyarrow's own threads would waste CPU)."""
    global _ARROW_JSON_READ
    _ARROW_JSON_READ = _ARROW_JSON_READ_SERIAL


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
) -> tuple[pa.RecordBatch, list[tuple[int, bytes, str]]] | None:
    """A block of raw JSON lines (the first is line ``lineno + 1``) -> ``(canonical batch of the accepted
    rows, (line, raw, reason) per rejected line)`` via the C scanner (:func:`scanned`) or else ``pyarrow.json``
    (:func:`_arrow_parsed`) and the columnar core, or None when this cannot be proven to equal what the per-line
    path (:func:`json_rows`) gives for the block. The scanner accepts a strict subset of what follows.

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
    return _fast_result(batch, chunk, lineno)


def _fast_result(
    batch: pa.RecordBatch, chunk: Sequence[bytes], lineno: int
) -> tuple[pa.RecordBatch, list[tuple[int, bytes, str]]] | None:
    """A raw batch a fast path read from the lines ``chunk`` (the first is line ``lineno + 1``) -> ``(canonical
    batch of the accepted rows, (line, raw, reason) per rejected line)``, or None when a row the columnar checks
    flag is one the per-line path accepts (never expected: the caller then reads the block line by line)."""
    canonical, flagged = validate_columns(batch)
    if flagged is None:
        return canonical, []
    # Rows the columnar checks reject are strict-JSON objects of canonical types: the per-line path gives
    # their reasons (and must reject every one of them, or the whole block goes back to it).
    mask = flagged[0]
    rejects: list[tuple[int, bytes, str]] = []
    bad = np.flatnonzero(mask).tolist()
    accepted = json_rows(((lineno + 1 + i, chunk[i]) for i in bad), lambda *reject: rejects.append(reject))
    if accepted or len(rejects) != len(bad):
        return None
    return canonical.filter(pa.array(~mask)), rejects


def scanned(data: bytes, n: int) -> pa.RecordBatch | None:
    """The ``n`` lines of UTF-8 ``data`` as a raw batch of :data:`_ARROW_JSON_SCHEMA` by the C scanner, or None
    when a line is outside its strict subset of JSON (``_jsonscan.c`` lists it: flat objects of the known
    fields with canonically typed, unescaped values) or the scanner is not built."""
    scanned = scan_range(data, 0, n)
    return scanned[2] if scanned is not None and scanned[:2] == (len(data), n) else None


def scan_range(data: bytes, begin: int, count: int) -> tuple[int, int, pa.RecordBatch] | None:
    """Up to ``count`` lines of UTF-8 ``data`` from offset ``begin`` by the C scanner: ``(end offset, lines,
    raw batch)``, or None (see :func:`scanned`)."""
    scanned = _scan_block(data, count, begin) if _scan_block is not None else None
    if scanned is None:
        return None
    end, n, columns = scanned
    arrays = [
        pa.Array.from_buffers(f.type, n, [None if b is None else pa.py_buffer(b) for b in buffers], null_count=nulls)
        for f, (nulls, *buffers) in zip(_ARROW_JSON_SCHEMA, columns)
    ]
    return end, n, pa.RecordBatch.from_arrays(arrays, schema=_ARROW_JSON_SCHEMA)


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
                pa.BufferReader(data), read_options=_ARROW_JSON_READ, parse_options=_ARROW_JSON_PARSE
            )
        except Exception:
            return None
    if table.num_rows != n or table.schema != _ARROW_JSON_SCHEMA:
        return None
    table = table.combine_chunks()
    return pa.RecordBatch.from_arrays([col.chunk(0) if col.num_chunks else pa.array([], col.type)
                                       for col in table.columns], schema=_ARROW_JSON_SCHEMA)  # fmt: skip


def _arrow_known_fields_only(data: bytes) -> pa.Table | None:
    """``data`` parsed by pyarrow when no object has a field outside the schema, else None (also for anything
    else pyarrow refuses).

    Without unknown fields every value pyarrow accepts has its column's scalar type, so the byte-level guards
    for unknown fields are moot: no nesting, no integer beyond int64, and a ``NaN`` / ``Infinity`` token can
    only be a ``latency_ms`` value, seen as a non-finite value in the column (such a table is refused here:
    the caller's other path declines it). Saves those guards' passes over the bytes on the usual input."""
    try:
        table = pajson.read_json(
            pa.BufferReader(data), read_options=_ARROW_JSON_READ, parse_options=_ARROW_JSON_PARSE_KNOWN
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


# --------------------------------------------------------------------------------------------------
# exit rows: events that are not requests


#: Schema metadata key of a batch whose first N rows are requests and whose other rows are *exit rows*: calls a
#: service made (a CLIENT span's database statement), which feed only the top-Ns keyed on ``db_statement``.
REQUESTS_KEY = b"drainpipe.requests"


def with_exits(requests: pa.RecordBatch, exits: pa.RecordBatch) -> pa.RecordBatch:
    """One batch: ``requests`` rows, then ``exits`` rows, marked (see :data:`REQUESTS_KEY`)."""
    if exits.num_rows == 0:
        return requests
    joined = pa.Table.from_batches([requests, exits]).combine_chunks().to_batches()[0]
    return mark_requests(joined, requests.num_rows)


def mark_requests(batch: pa.RecordBatch, requests: int) -> pa.RecordBatch:
    """``batch``, whose first ``requests`` rows are requests and the others exit rows, marked as such (unmarked
    when all of them are requests)."""
    if requests == batch.num_rows:
        return batch
    return batch.replace_schema_metadata({REQUESTS_KEY: str(requests).encode()})


def batch_from_ipc(message: bytes | memoryview | pa.Buffer, requests: int) -> pa.RecordBatch:
    """An :data:`EVENT_SCHEMA` batch from an Arrow IPC message (``batch.serialize()``) and its request row count
    (:func:`request_rows`, which another process sends beside the message: the mark is schema metadata, which the
    message does not carry). Zero-copy: the batch holds on to ``message``."""
    return mark_requests(pa.ipc.read_record_batch(pa.py_buffer(message), EVENT_SCHEMA), requests)


def request_rows(batch: pa.RecordBatch | pa.Table) -> int:
    """How many leading rows of ``batch`` are requests (all of them unless it is marked)."""
    meta = batch.schema.metadata
    if meta is None or REQUESTS_KEY not in meta:
        return batch.num_rows
    return int(meta[REQUESTS_KEY])


def join_events(batches: Sequence[pa.RecordBatch]) -> pa.RecordBatch:
    """Batches -> one batch (requests of all first, then exit rows of all, marked if there are any)."""
    if len(batches) == 1:
        return batches[0]
    heads = [b.slice(0, request_rows(b)) for b in batches]
    tails = [b.slice(request_rows(b)) for b in batches if request_rows(b) < b.num_rows]
    plain = [h.replace_schema_metadata(None) for h in heads]
    requests = pa.Table.from_batches(plain, schema=EVENT_SCHEMA).combine_chunks().to_batches()
    req = requests[0] if requests else pa.RecordBatch.from_pylist([], schema=EVENT_SCHEMA)
    if not tails:
        return req
    exits = pa.Table.from_batches([t.replace_schema_metadata(None) for t in tails], schema=EVENT_SCHEMA)
    return with_exits(req, exits.combine_chunks().to_batches()[0])


def validate_json_lines(data: bytes, stats: ReadStats | None = None) -> tuple[pa.RecordBatch, list[tuple[int, str]]]:
    """A JSON Lines (NDJSON) body -> a canonical batch of its valid records and ``(line number, reason)`` per
    rejected line (1-based; blank lines are skipped and not counted), parsed strictly as in files, through the
    same columnar fast path where it provably gives the same result."""
    if data and _JSONL_FAST_PATH:
        n = data.count(b"\n") + (not data.endswith(b"\n"))
        fast = fast_jsonl_block(_LazyLines(data, 0, len(data), n), 0, data)
        if fast is not None:
            batch, rejected = fast
            return counted_batch(batch, [(line, reason) for line, _, reason in rejected], stats)
    rejects: list[tuple[int, str]] = []
    rows = json_rows(enumerate(data.split(b"\n"), 1), lambda lineno, _raw, reason: rejects.append((lineno, reason)))
    return counted(rows, rejects, stats)


def json_rows(numbered: Iterable[tuple[int, bytes]], reject: Callable[[int, bytes, str], None]) -> list[tuple]:
    """Validated rows of numbered JSON lines; blank lines are skipped, every other line is a row or a reject."""
    rows: list[tuple] = []
    for lineno, raw in numbered:
        line = raw.strip(_JSON_WS)
        if not line:
            continue
        try:
            rows.append(_json_record(line))
        except Rejected as r:
            reject(lineno, raw, r.reason)
    return rows


# --------------------------------------------------------------------------------------------------
# CSV

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


class _CountedLines:
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


def _read_csv(f: BinaryIO, lines: _CountedLines, batch_rows: int, sink: Sink, path: str,
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


# --------------------------------------------------------------------------------------------------
# Parquet


def read_parquet_indexed(path: str, batch_rows: int, sink: Sink) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(batch index, batch)`` per ``iter_batches`` batch that has accepted rows."""
    pf = pq.ParquetFile(path)
    present = [name for name in FIELDS if name in pf.schema_arrow.names]
    offset = 0
    for index, batch in enumerate(pf.iter_batches(batch_size=batch_rows, columns=present or None)):
        canonical = parquet_batch(batch, offset, sink)
        offset += batch.num_rows
        if canonical is not None:
            yield index, canonical


def parquet_batch(
    batch: pa.RecordBatch, offset: int, sink: Sink, keep_dictionaries: bool = False
) -> pa.RecordBatch | None:
    """The accepted rows of one raw Parquet batch (its first row is file row ``offset``), None if none.

    ``keep_dictionaries``: string columns read dictionary-encoded stay so where validation changes none of their
    values (the canonical batch then has :data:`EVENT_SCHEMA`'s columns with ``dictionary<string>`` types there),
    for a consumer that groups by them (:func:`~drainpipe.pipeline.aggregate.aggregate_batch` takes the codes as
    they are instead of decoding and hashing every string again). Else every column has its EVENT_SCHEMA type."""
    canonical, rejects = validate_columns(batch, keep_dictionaries)
    if rejects is not None:
        mask, reasons = rejects
        _reject_rows(batch, mask, reasons, offset, sink)
        canonical = canonical.filter(pa.array(~mask))
    if canonical.num_rows:
        sink.stats.add_accepted(canonical.num_rows)
        return canonical
    return None


def parquet_columns(pf: pq.ParquetFile) -> list[str] | None:
    """The event columns a Parquet file has (what the reader asks for), None for none of them."""
    return [name for name in FIELDS if name in pf.schema_arrow.names] or None


def _reject_rows(batch: pa.RecordBatch, mask: np.ndarray, reasons: list[str], offset: int, sink: Sink) -> None:
    rows = batch.filter(pa.array(mask)).to_pylist()
    for index, row, reason in zip(np.flatnonzero(mask).tolist(), rows, reasons):
        sink.reject(offset + index + 1, row, reason)


# --------------------------------------------------------------------------------------------------
# inputs


def detect_format(path: str) -> tuple[str, bool]:
    """``(format, gzipped)`` for a path by suffix: ``jsonl`` (``.jsonl``, ``.json``, ``.ndjson``), ``csv``,
    ``parquet``, ``otlp`` (OTLP JSON trace files: ``.otlp.jsonl``, ``.otlp.json``) or ``access`` (web-server access
    logs: ``.log``); all but Parquet optionally ``.gz``.

    Raises :class:`InputError` for any other suffix (``.parquet.gz`` included)."""
    name = os.fspath(path).lower()
    gzipped = name.endswith(".gz")
    stem = name[:-3] if gzipped else name
    ext = os.path.splitext(stem)[1]
    fmt = "otlp" if stem.endswith((".otlp.jsonl", ".otlp.json")) else _FORMATS.get(ext)
    if fmt is None or (gzipped and fmt == "parquet"):
        raise InputError(
            f"unsupported input format: {os.fspath(path)!r} (expected .jsonl, .json, .ndjson, .csv, .otlp.jsonl "
            "or .log, optionally .gz, or .parquet)"
        )
    return fmt, gzipped


def expand_inputs(patterns: Sequence[str]) -> list[str]:
    """Files and glob patterns -> the sorted, deduplicated list of files (paths normalised).

    A glob (``*``, ``?``, ``[``; ``**`` recurses) that matches no file, a path that does not exist, or a
    directory raises :class:`InputError` with a one-line message."""
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    if not patterns:
        raise InputError("no input files given")
    found: set[str] = set()
    for pattern in map(os.fspath, patterns):
        if glob.has_magic(pattern):
            matches = [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
            if not matches:
                raise InputError(f"no input files match {pattern!r}")
            found.update(os.path.normpath(p) for p in matches)
        elif os.path.isdir(pattern):
            raise InputError(f"input {pattern!r} is a directory (use a glob such as '{pattern}/*.jsonl')")
        elif not os.path.isfile(pattern):
            raise InputError(f"no such input file: {pattern!r}")
        else:
            found.add(os.path.normpath(pattern))
    return sorted(found)


def read_events(
    paths: Sequence[str] | str,
    *,
    batch_rows: int = 65536,
    dead_letter: DeadLetter | None = None,
    stats: ReadStats | None = None,
) -> Iterator[pa.RecordBatch]:
    """Read event files (in the given order) as canonical :data:`EVENT_SCHEMA` batches.

    Each yielded batch holds at most ``batch_rows`` accepted rows and comes from one file; empty batches
    are not yielded. Rejected records go to ``stats`` and ``dead_letter`` (both optional) and reading
    goes on; ``stats`` is up to date for everything read so far each time a batch is yielded and when
    the iterator is exhausted.

    Checked at call time (before iterating): every path has a supported suffix (:func:`detect_format`)
    and exists, else :class:`InputError`. A file that cannot be read at all (corrupt gzip or Parquet,
    I/O error) raises :class:`InputError` while iterating; records already yielded stay valid."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if batch_rows < 1:
        raise ValueError("batch_rows must be >= 1")
    plan = [(os.fspath(p), *detect_format(p)) for p in paths]
    for path, _, _ in plan:
        if not os.path.isfile(path):
            raise InputError(f"no such input file: {path!r}")
    return _read_all(plan, batch_rows, stats if stats is not None else ReadStats(), dead_letter)


def _read_all(
    plan: list[tuple[str, str, bool]], batch_rows: int, stats: ReadStats, dead_letter: DeadLetter | None
) -> Iterator[pa.RecordBatch]:
    for path, fmt, gzipped in plan:
        sink = Sink(path, stats, dead_letter)
        try:
            for _, batch in read_blocks(path, fmt, gzipped, batch_rows, sink):
                yield batch
        except (OSError, EOFError, zlib.error, pa.ArrowException) as e:
            raise InputError(f"cannot read {path!r}: {e}") from e


def read_blocks(
    path: str, fmt: str, gzipped: bool, batch_rows: int, sink: Sink, start: int = 0, start_lines: int = 0
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(block index, batch)`` of one whole file in any format (CSV blocks are numbered as they come).

    An uncompressed text file (it may be growing) is read from byte ``start`` (``start_lines`` lines before it) up
    to its last complete line; ``sink.end`` says where reading stopped.
    """
    if fmt == "parquet":
        yield from read_parquet_indexed(path, batch_rows, sink)
        return
    with _open_text_source(path, gzipped) as f:
        lines = _CountedLines(f, f.tell(), not gzipped)
        if fmt == "jsonl":
            if start > lines.offset:
                f.seek(start)
                lines.offset = start
            consumed, count = yield from read_jsonl_stream(f, not gzipped, batch_rows, sink, start_lines)
            lines.offset += consumed
            lines.count = count + start_lines
        else:
            yield from enumerate(_read_csv(f, lines, batch_rows, sink, path, Position(start, start_lines)))
        sink.end = (lines.offset, lines.count)


#: decodes a block of lines (the first is line ``first_line + 1``) -> (canonical batch, (line, raw, reason) rejects)
LineDecoder = Callable[[Sequence[bytes], int], tuple[pa.RecordBatch, list[tuple[int, Any, str]]]]


#: a block of a line-decoded file ends after ``batch_rows`` lines or once it holds this many bytes: an OTLP line is
#: a whole export (hundreds of spans, often), so 65,536 lines could be tens of millions of events in one batch
#: (a 400 MB file of 1.3M spans had taken 955 MB of memory in one block). 16 MB of OTLP JSON is ~50k spans.
LINE_BLOCK_BYTES = 16 << 20


def read_line_blocks(
    path: str, gzipped: bool, batch_rows: int, sink: Sink, decode: LineDecoder, start: int = 0, start_lines: int = 0
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(block index, batch)`` of a whole line-oriented file whose lines ``decode`` turns into events (OTLP JSON
    files, access logs): blocks of ``batch_rows`` lines or :data:`LINE_BLOCK_BYTES`, whichever ends first, read as
    :func:`read_blocks` reads JSON Lines (growable, from ``start``); accepted and rejected records are counted in
    ``sink``."""
    with _open_text_source(path, gzipped) as f:
        lines = _CountedLines(f, f.tell(), not gzipped)
        if start > lines.offset:
            f.seek(start)
            lines.offset = start
        lineno, index = start_lines, 0
        for chunk in _line_chunks(iter(lines), batch_rows, LINE_BLOCK_BYTES):
            batch, rejects = decode(chunk, lineno)
            lineno += len(chunk)
            sink.stats.add_accepted(batch.num_rows)
            for line, raw, reason in rejects:
                sink.reject(line, raw, reason)
            if batch.num_rows:
                yield index, batch
            index += 1
        sink.end = (lines.offset, lines.count + start_lines)


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


def _open_text_source(path: str, gzipped: bool) -> BinaryIO:
    """Binary line source (split on ``\\n`` only), with a leading UTF-8 BOM skipped."""
    f: Any = gzip.open(path, "rb") if gzipped else open(path, "rb", buffering=1 << 20)
    if f.peek(3)[:3] == BOM:
        f.read(3)
    return f
