"""CSV (inputs/formats/csv_format.py): cells typed like JSON values, the header row, quoting, gzip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drainpipe import native
from drainpipe.errors import InputError
from drainpipe.inputs import FIELDS, read_events
from drainpipe.inputs.formats import csv_format
from testlib import CSV_HEADER, T0, read, read_csv, reasons, row, write_bytes

# ----------------------------------------------------------------------------------------------- CSV


def test_csv_valid_rows_and_empty_cells(tmp_path):
    text = (
        f"{CSV_HEADER}\n"
        f"{T0},svc,i1,/x,2.5,false,SELECT 1\n"
        f"{T0},svc,,,3,,\n"
        f"2026-11-21T10:00:00Z,svc,,,1e2,1,\n"
        f'{T0},"s,v ""c""",,,0,0,"multi\nline"\n'
    )
    r = read_csv(tmp_path, text)
    assert r.rows == [
        row(instance="i1", endpoint="/x", latency_ms=2.5, status=False, db_statement="SELECT 1"),
        row(latency_ms=3.0),
        row(latency_ms=100.0),
        row(service='s,v "c"', latency_ms=0.0, status=False, db_statement="multi\nline"),
    ]


def test_csv_columns_in_any_order_unknown_ignored_missing_optional(tmp_path):
    r = read_csv(tmp_path, f"extra,latency_ms,service,ts\nzzz,1.5,svc,{T0}\n")
    assert r.rows == [row()]


@pytest.mark.parametrize(
    "cells, reason",
    [
        (f"{T0},svc,,,1.5,true", "wrong number of columns"),
        (f"{T0},svc,,,1.5,true,,extra", "wrong number of columns"),
        (",svc,,,1.5,true,", "missing field: ts"),
        ("1.5,svc,,,1.5,true,", "bad timestamp: ts"),
        (f"0{T0},svc,,,1.5,true,", "bad timestamp: ts"),  # not JSON integer syntax
        (f"{10**40},svc,,,1.5,true,", "out of range: ts"),
        (f"{'9' * 5000},svc,,,1.5,true,", "out of range: ts"),
        ("yesterday,svc,,,1.5,true,", "bad timestamp: ts"),
        (f"{T0},,,,1.5,true,", "missing field: service"),
        (f"{T0},svc,,,,true,", "missing field: latency_ms"),
        (f"{T0},svc,,,abc,true,", "bad type: latency_ms"),
        (f"{T0},svc,,,nan,true,", "bad type: latency_ms"),
        (f"{T0},svc,,,inf,true,", "bad type: latency_ms"),
        (f"{T0},svc,,, 1.5,true,", "bad type: latency_ms"),
        (f"{T0},svc,,,-1,true,", "out of range: latency_ms"),
        (f"{T0},svc,,,1e999,true,", "out of range: latency_ms"),
        (f"{T0},svc,,,1.5,yes,", "bad value: status"),
        (f"{T0},svc,,,1.5,True,", "bad value: status"),
        (f"{T0},svc,,,1.5,2,", "bad value: status"),
        (f"{T0},svc,,,1.5,1.0,", "bad value: status"),
    ],
)
def test_csv_rejects(tmp_path, cells, reason):
    r = read_csv(tmp_path, f"{CSV_HEADER}\n{T0},svc,,,1.5,true,\n{cells}\n")
    assert reasons(r) == [reason]
    assert r.rejects[0]["line"] == 3 and r.rejects[0]["raw"] == cells
    assert r.rows == [row()]


def test_csv_header_missing_a_required_column_is_one_clear_error(tmp_path):
    with pytest.raises(InputError, match=r"header row lacks the column\(s\) service \("):
        read_csv(tmp_path, "ts,latency_ms\n1,2\n3,4\n")


def test_csv_without_a_header_row_is_one_clear_error_naming_the_missing_columns(tmp_path):
    """A CSV whose first line is data: refused, not read with its first record taken for the header."""
    with pytest.raises(InputError, match=r"lacks the column\(s\) ts, service, latency_ms") as info:
        read_csv(tmp_path, f"{T0},svc,,,1.5,true,\n{T0},svc,,,2.5,true,\n")
    assert "\n" not in str(info.value)


def test_csv_header_only_blank_lines_non_utf8_and_bad_quotes(tmp_path):
    data = (
        f"\n{CSV_HEADER}\n\n   \n{T0},svc,,,1.5,true,\n".encode()
        + f"{T0},caf\xe9,,,1.5,true,\r\n".encode("latin-1")
        + f'{T0},svc,,,1.5,true,"open\n'.encode()
    )
    r = read_csv(tmp_path, data)
    assert r.rows == [row()]
    assert [(x["line"], x["reason"]) for x in r.rejects] == [(6, "not UTF-8"), (7, "bad CSV row")]
    assert r.rejects[0]["raw"] == f"{T0},caf\\xe9,,,1.5,true,"
    assert read_csv(tmp_path, f"{CSV_HEADER}\n").stats.read == 0


def test_csv_header_not_utf8_is_an_input_error(tmp_path):
    path = write_bytes(tmp_path, "in.csv", b"ts,serv\xffice\n1,2\n")
    with pytest.raises(InputError, match="bad CSV header"):
        list(read_events([str(path)]))


def test_csv_gz(tmp_path):
    r = read_csv(tmp_path, f"{CSV_HEADER}\n{T0},svc,,,1.5,true,\n", name="in.csv.gz")
    assert r.rows == [row()]


@pytest.mark.parametrize("ending", ["", "\n"])
def test_a_gzipped_csv_read_to_its_end_is_positioned_after_every_line(tmp_path, ending):
    """A gzipped file does not grow: a last record without a newline is read, and counted as a line of the
    position the read ends at."""
    from drainpipe.inputs import ReadStats, RejectList, Sink, read_part, whole_file

    path = write_bytes(
        tmp_path, "in.csv.gz", f"{CSV_HEADER}\n{T0},svc,,,1.5,true,\n{T0},svc,,,2,true,{ending}".encode()
    )
    reader = read_part(whole_file(str(path), 65536), Sink("x", ReadStats(), RejectList()))
    assert sum(b.num_rows for b in reader) == 2
    assert reader.snapshot().lines == 3


# ----------------------------------------------------------------------------------------------- columns


_CELLS = {
    "ts": ["", str(T0), "-5", "0", f"0{T0}", "2026-11-21T10:00:00Z", "1.5", "9" * 19, "9" * 25, "x", f'"{T0}"', "-0"],
    "service": ["svc", "", '"a,b"', '"x ""y"""', '"multi\nline"', "caf\u00e9", "  "],
    "instance": ["", "i-1", '""', '"a\r\nb"'],
    "endpoint": ["", "GET /x", '"GET /a,b"'],
    "latency_ms": ["1.5", "", "2", "1e2", "-1", "1e999", "abc", " 1.5", "0.1", "-0", "1E+2", "01", '"7"', "2."],
    "status": ["", "true", "false", "1", "0", "yes", "True", "1.0", '"true"', '"0"'],
    "db_statement": ["", "SELECT 1", '"SELECT ""x"""'],
    "trace_id": ["", "4bf92f3577b34da6a3ce929d0e0e4736", "00000000000000000000000000000000", "xyz"],
    "extra": ["", "anything", '"q,""r"""'],
}
_BROKEN = ['1,ab"c,x', '"open', "   ", "", "a,b", '"x"y,1,2,3,4,5,6', "\udcff"]


#: a valid cell of each column: records of these but one odd cell are rejected, if at all, for that cell
_VALID = {"ts": str(T0), "service": "svc", "instance": "i-1", "endpoint": "GET /x", "latency_ms": "1.5",
          "status": "true", "db_statement": "", "trace_id": "", "extra": ""}  # fmt: skip


@st.composite
def _csv_texts(draw) -> bytes:
    optional = ["instance", "endpoint", "status", "db_statement"]
    names = [name for name in FIELDS if name not in optional or draw(st.integers(0, 4))]  # optional ones absent
    names += [name for name in ("trace_id", "extra") if draw(st.booleans())]  # a trace id, an unknown column
    if draw(st.integers(0, 5)) == 0:
        names.append(draw(st.sampled_from(names)))  # a duplicate: the first column of a name wins
    header = draw(st.permutations(names))
    lines = [",".join(header)]
    for _ in range(draw(st.integers(0, 14))):
        if draw(st.integers(0, 9)) == 0:
            lines.append(draw(st.sampled_from(_BROKEN)))
        else:
            odd = draw(st.sampled_from([None, *header]))  # one column of any cell, the others valid
            lines.append(",".join(draw(st.sampled_from(_CELLS[name])) if odd in (None, name) else _VALID[name]
                                  for name in header))  # fmt: skip
    ending = draw(st.sampled_from(["\n", "\r\n"]))
    text = ending.join(lines) + draw(st.sampled_from([ending, ""]))
    return text.encode("utf-8", "surrogateescape")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_csv_texts(), st.sampled_from([1, 2, 3, 65536]))
def test_csv_in_columns_reads_as_the_reference(tmp_path_factory, data: bytes, batch_rows: int):
    """Random records (quoted fields with commas, escaped quotes and newlines, CRLF, odd values, stray quotes,
    blank and whitespace lines, wrong widths, bytes that are not UTF-8), in blocks of 1..65,536 records: the
    columnar path gives the reference's rows, rejects, reasons and line numbers."""
    tmp = tmp_path_factory.mktemp("csv")
    path = write_bytes(tmp, "in.csv", data)
    results = []
    # the C passes; the numpy record scan and pyarrow's cells (Spark executors); the reference
    for off in ((), ("csvscan",), ("columnar",)):
        with native.disabled(*off):
            try:
                r = read([path], tmp, batch_rows=batch_rows)
            except InputError as e:
                r = str(e)
        # (a batch has a trace id column when one of its rows has a trace id: the others' None depends on the cut)
        rows = lambda r: [{k: v for k, v in row.items() if k != "trace_id" or v is not None} for row in r.rows]
        results.append(r if isinstance(r, str) else (rows(r), r.rejects))
    assert results[0] == results[2] and results[1] == results[2]
    if not isinstance(results[2], str):  # as the workers read it: planned ranges, strings kept dictionary-encoded
        encoded, rejects = _read_as_workers(str(path), batch_rows)
        assert encoded == results[2][0]
        assert rejects == [(r["line"], r["reason"]) for r in results[2][1]]


def test_a_cell_past_the_csv_modules_default_limit_reads_alike_on_every_path(tmp_path):
    """A statement of 131,073 characters: the C and pyarrow passes read it, the reference (the csv module, 131,072
    at most by default) rejected the record as a bad CSV row. Every path reads it now."""
    long = "x" * 131_073
    path = write_bytes(
        tmp_path, "in.csv", f"ts,service,latency_ms,db_statement\n1795255200000,svc,1.5,{long}\n".encode()
    )
    for off in ((), ("csvscan",), ("columnar",)):
        with native.disabled(*off):
            r = read([path], tmp_path)
        assert r.rejects == [] and [row["db_statement"] for row in r.rows] == [long], off


def _read_as_workers(path: str, batch_rows: int) -> tuple[list[dict], list[tuple[int, str]]]:
    """The rows (trace ids as above) and ``(line, reason)`` rejects of a file read as the workers read it: cut into
    parts (ranges the C cell pass reads straight out of their bytes), string columns maybe dictionary-encoded."""
    from drainpipe.inputs import ReadStats, RejectList, Sink, plan_parts, read_part

    rejects = RejectList()
    out = []
    batches = [b for part in plan_parts(path, batch_rows, workers=2)
               for b in read_part(part, Sink(path, ReadStats(), rejects), dictionaries=True)]  # fmt: skip
    for batch in batches:
        for name in ("service", "instance", "endpoint"):
            assert batch.rows.schema.field(name).type in (pa.string(), pa.dictionary(pa.int32(), pa.string()))
        out += [{k: v for k, v in row.items() if k != "trace_id" or v is not None} for row in batch.rows.to_pylist()]
    return out, [(line, reason) for line, _, reason in rejects.rows]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_csv_texts(), st.sampled_from([1, 2, 5]), st.sampled_from([1, 7, 64]), st.booleans())
def test_the_blocks_are_the_same_whatever_the_read_buffer_holds(tmp_path_factory, data: bytes, batch_rows: int,
                                                                 buffer: int, c_cells: bool):  # fmt: skip
    """The record blocks are read through one reused buffer, the unread rest moved to its start and the buffer grown
    when a block does not fit: with a buffer of a few bytes (every record straddling reads) the planner cuts the
    parts it cuts with 8 MB, and the parts read to the same rows and rejects (without the C cell pass too, when a
    range is read through the record blocks with its byte limit)."""
    from drainpipe.inputs import plan_parts
    from drainpipe.inputs.parts import prefix_hasher

    tmp = tmp_path_factory.mktemp("plan")
    path = str(write_bytes(tmp, "in.csv", data))
    try:  # the reference, a record at a time
        with native.disabled("columnar"):
            reference = read([Path(path)], tmp, batch_rows=batch_rows)
    except InputError:
        reference = None

    def plan_and_read() -> tuple:
        try:
            return list(plan_parts(path, batch_rows, workers=2, hasher=prefix_hasher(path, 0))), _read_as_workers(
                path, batch_rows
            )
        except InputError as e:
            return (str(e),)

    saved = csv_format.READ_BYTES
    try:
        with native.disabled(*(() if c_cells else ("csvscan",))):
            whole = plan_and_read()
            if reference is not None:
                rows = [{k: v for k, v in r.items() if k != "trace_id" or v is not None} for r in reference.rows]
                assert whole[1] == (rows, [(r["line"], r["reason"]) for r in reference.rejects])
            csv_format.READ_BYTES = buffer
            assert plan_and_read() == whole
    finally:
        csv_format.READ_BYTES = saved


@settings(max_examples=300, deadline=None)
@given(_csv_texts(), st.integers(1, 6), st.booleans())
def test_the_c_record_scan_equals_numpys(data: bytes, records: int, final: bool):
    """The C scanner and the numpy fallback agree on where well-formed records end and how many lines they hold;
    a malformed record numpy sees, C sees too (C, reading record by record, may see one sooner: a stray quote
    numpy's parity count takes for an open field still waiting for its end; either way the reference reads from
    there)."""
    assert native.csvscan is not None
    c = csv_format._scan(data, 0, records, final)
    with native.disabled("csvscan"):
        py = csv_format._scan(data, 0, records, final)
    assert c[2] or not py[2]
    if not c[2]:
        assert c[0].tolist() == py[0].tolist() and c[1] == py[1]


def _scan_by_bytes(data: bytes, begin: int, records: int, final: bool) -> tuple[list[int], int, bool]:
    """The oracle of the C record scan: the strict reader's states, one byte at a time (field start, unquoted,
    quoted, a quote inside quotes, a carriage return outside quotes); (ends, newlines before the last, malformed)."""
    start, unquoted, quoted, quote_in_quoted, carriage = range(5)
    state, ends, i = start, [], begin
    while i < len(data) and len(ends) < records:
        c = data[i : i + 1]
        i += 1
        if state == quoted:
            state = quote_in_quoted if c == b'"' else quoted
        elif state == carriage and c != b"\n":
            return ends, _lines(data, begin, ends), True
        elif c == b'"':
            if state == unquoted:
                return ends, _lines(data, begin, ends), True  # a quote inside an unquoted field
            state = quoted
        elif c == b",":
            state = start
        elif c == b"\r":
            state = carriage
        elif c == b"\n":
            ends.append(i)
            state = start
        elif state == quote_in_quoted:
            return ends, _lines(data, begin, ends), True  # text after a closing quote
        else:
            state = unquoted
    malformed = final and len(ends) < records and state in (quoted, carriage)
    return ends, _lines(data, begin, ends), malformed


def _lines(data: bytes, begin: int, ends: list[int]) -> int:
    return data.count(b"\n", begin, ends[-1]) if ends else 0


_SCAN_BYTES = [b'"', b'""', b",", b"\r", b"\n", b"\r\n", b"a", b"b1", b" ", b"x" * 40, b'"' + b"q\n" * 20 + b'"']


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_SCAN_BYTES), max_size=120), st.data(), st.sampled_from([0, 1, 2, 5, 10_000]),
       st.booleans())  # fmt: skip
def test_the_c_record_scan_equals_the_readers_states(pieces: list[bytes], choose, records: int, final: bool):
    """The C record scan (64-byte masks, a padded tail) gives exactly the byte-at-a-time reader's record ends,
    newline count and verdict, from any start, across 64-byte boundaries."""
    assert native.csvscan is not None
    scanner = native.csvscan.scan
    data = b"a" * choose.draw(st.integers(0, 130)) + b"".join(pieces)  # (moves what follows across a boundary)
    begin = choose.draw(st.integers(0, len(data)))
    raw, lines, malformed = scanner(data, begin, records, final)
    assert (np.frombuffer(raw, np.int64).tolist(), lines, malformed) == _scan_by_bytes(data, begin, records, final)


def test_the_c_record_scan_at_every_byte_around_a_64_byte_boundary():
    """Each rule of the scan (a quote inside and after a field, escaped quotes, text after a closing quote, a bare
    carriage return, quoted newlines) placed at every offset around the first 64-byte boundary: the reader's
    verdict, ends and newlines."""
    snippets = [b'"ab"c\n', b'"a""b"\n', b"a\rb\n", b"a\r\n", b'"q\nq"\n', b'a"b\n', b'"",x\n', b'"a"\r\nb\n', b'"\r"']
    assert native.csvscan is not None
    scanner = native.csvscan.scan
    for snippet in snippets:
        for pad in range(50, 70):
            for tail in (b"", b"z,1\n"):
                data = b"p" * (pad - 1) + b"\n" + snippet + tail
                for final in (False, True):
                    raw, lines, malformed = scanner(data, 0, 10_000, final)
                    got = (np.frombuffer(raw, np.int64).tolist(), lines, malformed)
                    assert got == _scan_by_bytes(data, 0, 10_000, final), (data, final)


def test_csv_columns_take_the_clean_blocks():
    """The fast path is a real path: a clean block is read in columns, not by the reference."""
    from drainpipe.inputs import ReadStats, Sink

    text = f"{T0},svc,,GET /x,1.5,true,\n".encode() * 5
    typed = csv_format._csv_typer(list(FIELDS))
    ends = np.arange(1, 6) * (len(text) // 5)
    out = csv_format._fast_block(text, ends, list(FIELDS), 1, Sink("x", ReadStats(), None), typed, len(FIELDS))
    assert out is not None and out.num_rows == 5
    # and by the C pass: quoted cells with escapes and newlines, CRLF, a last record without a newline
    block = f'{T0},"a ""b""","x\r\ny",GET /x,-0,1,"SELECT ""t"""\r\n{T0},svc,,,1e2,,'.encode()
    raw = csv_format._scanned_cells(block, list(FIELDS), 2)
    assert raw is not None and raw.to_pylist()[0] | {"trace_id": None} == {
        "ts": T0, "service": 'a "b"', "instance": "x\r\ny", "endpoint": "GET /x", "latency_ms": -0.0, "status": True,
        "db_statement": 'SELECT "t"', "trace_id": None}  # fmt: skip
    assert raw.column("instance").null_count == 1 and raw.column("status").to_pylist() == [True, None]


def test_csv_parts_are_ranges_of_whole_records_and_a_stray_quote_ends_them(tmp_path):
    """A CSV is cut into ranges at newlines outside quotes (a quoted newline is never a cut); after a record that
    is not well-formed the rest of the file is one whole part; either way the parts read as the whole file does."""
    from drainpipe.inputs import ReadStats, RejectList, Sink, plan_parts, read_part, whole_file

    def records(n: int, stray_at: int | None) -> str:
        out = [CSV_HEADER]
        for i in range(n):
            endpoint = f'"GET /a,{i}\nb"' if i % 5 == 0 else f"/e{i % 3}"
            # rejected (typed in columns, flagged by validation): its line counts the quoted newlines before it
            latency = "-1" if i % 97 == 0 else "1.5"
            out.append('1ab"c,svc,,,1,true,' if i == stray_at else f"{T0 + i},svc,,{endpoint},{latency},true,")
        return "\n".join(out) + "\n"

    def read_all(parts) -> tuple[list, list]:
        rows, rejects = [], RejectList()
        for part in parts:
            rows += [r for b in read_part(part, Sink("x", ReadStats(), rejects)) for r in b.rows.to_pylist()]
        return rows, rejects.rows

    for stray in (None, 1_234):
        path = write_bytes(tmp_path, f"in-{stray}.csv", records(3_000, stray).encode())
        parts = list(plan_parts(str(path), 100, workers=4))
        whole = read_all([whole_file(str(path), 100)])
        assert read_all(parts) == whole and len(whole[0]) == 3_000 - (stray is not None) - 31
        assert len(whole[1]) == 31 + (stray is not None)
        if stray is None:
            assert len(parts) > 3 and not any(p.whole for p in parts)
        else:
            assert parts[-1].whole and len(parts) > 1 and [r[2] for r in whole[1]].count("bad timestamp: ts") == 1
        assert [p.first for p in parts] == sorted({p.first for p in parts})
