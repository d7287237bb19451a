"""CSV (inputs/formats/csv_format.py): cells typed like JSON values, the header row, quoting, gzip."""

from __future__ import annotations

import pytest

from drainpipe.errors import InputError
from drainpipe.inputs import read_events
from testlib import CSV_HEADER, T0, read_csv, reasons, row, write_bytes

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
