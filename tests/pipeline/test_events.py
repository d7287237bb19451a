"""Input events: validation rules (docs/pipeline.md "Input events"), formats, dead letter, inputs."""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import io
import json
import math
import threading
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drainpipe.errors import InputError, Rejected
from drainpipe.inputs import detect_format, expand_inputs, read_events
from drainpipe.inputs.formats.csv_format import NUMBER_RE
from drainpipe.inputs.rejects import DeadLetter, ReadStats
from drainpipe.inputs.schema import EVENT_SCHEMA, FIELDS, LATENCY_MAX_MS, TS_MAX, TS_MIN
from drainpipe.inputs.validation import check_fields, validate_values
from testlib import T0

BASE = {"ts": T0, "service": "svc", "latency_ms": 1.5}
CSV_HEADER = ",".join(FIELDS)
HYPO = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@dataclass
class Result:
    rows: list[dict]
    stats: ReadStats
    rejects: list[dict]
    batches: list[pa.RecordBatch]


def check_canonical(batch: pa.RecordBatch) -> None:
    """Every accepted batch satisfies the canonical contract."""
    assert batch.schema.equals(EVENT_SCHEMA)
    batch.validate(full=True)
    for name in FIELDS[:-1]:
        assert batch.column(name).null_count == 0, name
    for row in batch.to_pylist():
        assert TS_MIN <= row["ts"] <= TS_MAX
        assert row["service"]
        assert math.isfinite(row["latency_ms"]) and row["latency_ms"] >= 0
        assert row["db_statement"] != ""


def read(paths: list[Path], tmp_path: Path, batch_rows: int = 65536) -> Result:
    stats = ReadStats()
    dl_path = tmp_path / "out.rejected.jsonl"
    dl_path.unlink(missing_ok=True)  # the dead letter appends: one file per read here
    with DeadLetter(dl_path) as dl:
        batches = [
            e.rows for e in read_events([str(p) for p in paths], batch_rows=batch_rows, dead_letter=dl, stats=stats)
        ]
    rejects = [json.loads(line) for line in dl_path.read_text(encoding="ascii").split("\n")[:-1]]
    assert stats.read == stats.accepted + stats.rejected
    assert sum(b.num_rows for b in batches) == stats.accepted
    assert len(rejects) == stats.rejected == sum(stats.reasons.values())
    for b in batches:
        assert 0 < b.num_rows <= batch_rows
        check_canonical(b)
    rows = pa.Table.from_batches(batches, schema=EVENT_SCHEMA).to_pylist()
    return Result(rows, stats, rejects, batches)


def write_bytes(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.lower().endswith(".gz") else data)
    return path


def read_jsonl(tmp_path: Path, lines: list[str | bytes], name: str = "in.jsonl", **kw) -> Result:
    data = b"".join((x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass")) + b"\n" for x in lines)
    return read([write_bytes(tmp_path, name, data)], tmp_path, **kw)


def read_csv(tmp_path: Path, text: str | bytes, name: str = "in.csv") -> Result:
    data = text if isinstance(text, bytes) else text.encode()
    return read([write_bytes(tmp_path, name, data)], tmp_path)


def rec(**changes) -> str:
    record = dict(BASE, **changes)
    for key in [k for k, v in changes.items() if v is ...]:
        del record[key]
    return json.dumps(record)


def reasons(result: Result) -> list[str]:
    return [r["reason"] for r in result.rejects]


def row(**values) -> dict:
    full = {"ts": T0, "service": "svc", "instance": "", "endpoint": "", "latency_ms": 1.5, "status": True,
            "db_statement": None}  # fmt: skip
    full.update(values)
    return full


# ---------------------------------------------------------------------------------------------- JSON


def test_valid_record_all_fields(tmp_path):
    line = json.dumps({"ts": T0 + 7, "service": "a", "instance": "a-1", "endpoint": "/x", "latency_ms": 2.25,
                       "status": False, "db_statement": "SELECT 1", "extra": {"ignored": [1, 2]}})  # fmt: skip
    r = read_jsonl(tmp_path, [line])
    assert r.rows == [row(ts=T0 + 7, service="a", instance="a-1", endpoint="/x", latency_ms=2.25, status=False,
                          db_statement="SELECT 1")]  # fmt: skip
    assert (r.stats.read, r.stats.accepted, r.stats.rejected) == (1, 1, 0)


def test_defaults_and_nulls_for_optional_fields(tmp_path):
    r = read_jsonl(
        tmp_path,
        [rec(), rec(instance=None, endpoint=None, status=None, db_statement=None), rec(db_statement="")],
    )
    assert r.rows == [row(), row(), row()]


@pytest.mark.parametrize(
    "value, expected",
    [
        (True, True), (False, False), (1, True), (0, False), ("true", True), ("false", False), (None, True),
    ],
)  # fmt: skip
def test_status_accepted_spellings(tmp_path, value, expected):
    assert read_jsonl(tmp_path, [rec(status=value)]).rows == [row(status=expected)]


def test_latency_int_becomes_float_and_zero_is_valid(tmp_path):
    r = read_jsonl(tmp_path, [rec(latency_ms=5), rec(latency_ms=0), rec(latency_ms=1e12), rec(latency_ms=10**12)])
    assert [x["latency_ms"] for x in r.rows] == [5.0, 0.0, 1e12, 1e12]
    assert all(type(x["latency_ms"]) is float for x in r.rows)


@pytest.mark.parametrize("value", [1e308, 1e12 * (1 + 1e-15), 10**12 + 1, 10**400])
def test_absurd_latencies_are_out_of_range_in_every_format(tmp_path, value):
    """Above LATENCY_MAX_MS (1e12 ms) a latency is rejected, so no sum, average or percentile overflows."""
    assert read_jsonl(tmp_path, [rec(latency_ms=value)]).stats.reasons == {"out of range: latency_ms": 1}
    if isinstance(value, float):
        table = pa.table({"ts": [T0], "service": ["s"], "latency_ms": [value]})
        pq.write_table(table, tmp_path / "big.parquet")
        stats = ReadStats()
        assert list(read_events(str(tmp_path / "big.parquet"), stats=stats)) == []
        assert stats.reasons == {"out of range: latency_ms": 1}


def ms(*args, tz=dt.UTC) -> int:
    return (dt.datetime(*args, tzinfo=tz) - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(milliseconds=1)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2026-11-21T10:00:00Z", T0),
        ("2026-11-21T10:00:00", T0),  # no offset = UTC
        ("2026-11-21 10:00:00z", T0),
        ("2026-11-21T11:00:00+01:00", T0),
        ("2026-11-21T11:30:00+0130", T0),
        ("2026-11-21T05:00:00-05", T0),
        ("2026-11-21T10:00Z", T0),
        ("2026-11-21T10:00:00.123456789Z", T0 + 123),  # sub-ms digits truncated
        ("2026-11-21T10:00:00.5Z", T0 + 500),
        ("2026-11-21", ms(2026, 11, 21)),
        ("1969-12-31T23:59:59.999Z", -1),
        ("0001-01-01T00:00:00Z", TS_MIN),
        ("9999-12-31T23:59:59.999Z", TS_MAX),
        ("2024-02-29T00:00:00Z", ms(2024, 2, 29)),
    ],
)
def test_iso_timestamps(tmp_path, text, expected):
    assert read_jsonl(tmp_path, [rec(ts=text)]).rows == [row(ts=expected)]


def test_int_timestamp_bounds(tmp_path):
    r = read_jsonl(tmp_path, [rec(ts=TS_MIN), rec(ts=TS_MAX), rec(ts=0), rec(ts=-1)])
    assert [x["ts"] for x in r.rows] == [TS_MIN, TS_MAX, 0, -1]


@pytest.mark.parametrize(
    "line, reason",
    [
        # structure
        ('{"ts": 1', "invalid JSON"),  # truncated
        ('{"ts": 1795255200000, "service": "svc", "latency_ms": 1.5', "invalid JSON"),
        ("{'ts': 1}", "invalid JSON"),  # single quotes
        (rec() + " x", "invalid JSON"),  # trailing characters
        (rec() + rec(), "invalid JSON"),  # two objects on a line
        ("{} {}", "invalid JSON"),
        ('{"ts": 1,}', "invalid JSON"),
        ("[" * 100_000, "invalid JSON"),  # deep nesting: RecursionError, not a crash
        ("\x0b" + rec(), "invalid JSON"),  # not JSON whitespace
        ("[1, 2]", "not an object"),
        ('"text"', "not an object"),
        ("42", "not an object"),
        ("null", "not an object"),
        # NaN / Infinity are not JSON
        (rec().replace("1.5", "NaN"), "invalid JSON"),
        (rec().replace("1.5", "Infinity"), "invalid JSON"),
        (rec().replace("1.5", "-Infinity"), "invalid JSON"),
        # ts
        (rec(ts=...), "missing field: ts"),
        (rec(ts=None), "missing field: ts"),
        (rec(ts=True), "bad type: ts"),  # bool is not an int
        (rec(ts=1.5), "bad type: ts"),
        (rec(ts=1e30), "bad type: ts"),
        (rec(ts=[1]), "bad type: ts"),
        (rec(ts=10**40), "out of range: ts"),
        (rec(ts=-(10**40)), "out of range: ts"),
        (rec(ts=TS_MAX + 1), "out of range: ts"),
        (rec(ts=TS_MIN - 1), "out of range: ts"),
        (rec(ts="yesterday"), "bad timestamp: ts"),
        (rec(ts="1795255200000"), "bad timestamp: ts"),  # a JSON string must be ISO-8601
        (rec(ts="2026-02-30T00:00:00Z"), "bad timestamp: ts"),
        (rec(ts="2026-11-21T24:00:00Z"), "bad timestamp: ts"),
        (rec(ts="2026-11-21T10:00:60Z"), "bad timestamp: ts"),
        (rec(ts="2026-11-21T10:00:00+25:00"), "bad timestamp: ts"),
        (rec(ts="0000-01-01T00:00:00Z"), "bad timestamp: ts"),
        (rec(ts="2026-11-21T10:00:00Z "), "bad timestamp: ts"),
        (rec(ts="２０２６-11-21"), "bad timestamp: ts"),  # non-ASCII digits
        (rec(ts="0001-01-01T00:00:00+01:00"), "out of range: ts"),
        # service
        (rec(service=...), "missing field: service"),
        (rec(service=None), "missing field: service"),
        (rec(service=""), "bad value: service"),
        (rec(service=5), "bad type: service"),
        (rec(service=["a"]), "bad type: service"),
        (rec().replace('"svc"', '"\\ud800"'), "bad value: service"),  # lone surrogate
        # instance / endpoint
        (rec(instance=5), "bad type: instance"),
        (rec(endpoint=[]), "bad type: endpoint"),
        (rec(endpoint=False), "bad type: endpoint"),
        # latency_ms
        (rec(latency_ms=...), "missing field: latency_ms"),
        (rec(latency_ms=None), "missing field: latency_ms"),
        (rec(latency_ms="5"), "bad type: latency_ms"),  # in JSON a number, not a string
        (rec(latency_ms=True), "bad type: latency_ms"),  # bool is not a number
        (rec(latency_ms={}), "bad type: latency_ms"),
        (rec(latency_ms=-1), "out of range: latency_ms"),
        (rec(latency_ms=-0.001), "out of range: latency_ms"),
        (rec().replace("1.5", "1e400"), "out of range: latency_ms"),  # parses to inf
        (rec(latency_ms=10**400), "out of range: latency_ms"),  # int too big for a float
        # status
        (rec(status=2), "bad value: status"),
        (rec(status=-1), "bad value: status"),
        (rec(status=1.0), "bad value: status"),
        (rec(status="TRUE"), "bad value: status"),
        (rec(status="yes"), "bad value: status"),
        (rec(status="1"), "bad value: status"),
        (rec(status={}), "bad value: status"),
        # db_statement
        (rec(db_statement=5), "bad type: db_statement"),
        (rec(db_statement=["x"]), "bad type: db_statement"),
        # the first failing field (in schema order) is the reason
        (rec(ts="x", service=None, latency_ms=-1), "bad timestamp: ts"),
        (rec(latency_ms=-1, status=9), "out of range: latency_ms"),
    ],
)
def test_json_rejects(tmp_path, line, reason):
    r = read_jsonl(tmp_path, [rec(), line, rec()])
    assert reasons(r) == [reason]
    assert r.rows == [row(), row()]
    assert (r.stats.read, r.stats.accepted, r.stats.rejected) == (3, 2, 1)
    assert r.stats.reasons == {reason: 1}


def test_non_utf8_line_rejected_and_reading_goes_on(tmp_path):
    bad = b'{"ts": 1795255200000, "service": "caf\xe9", "latency_ms": 1}'
    r = read_jsonl(tmp_path, [rec(), bad, b"\xff\xfe\x00", rec()])
    assert reasons(r) == ["not UTF-8", "not UTF-8"]
    assert r.rejects[0]["raw"] == '{"ts": 1795255200000, "service": "caf\\xe9", "latency_ms": 1}'
    assert r.rejects[1]["raw"] == "\\xff\\xfe\x00"  # NUL is valid UTF-8, kept as is
    assert len(r.rows) == 2


def test_blank_lines_are_skipped_not_counted_but_keep_line_numbers(tmp_path):
    r = read_jsonl(tmp_path, ["", rec(), "   ", "\t\r", rec(ts="bad"), ""])
    assert (r.stats.read, r.stats.accepted, r.stats.rejected) == (2, 1, 1)
    assert r.rejects == [
        {"source": str(tmp_path / "in.jsonl"), "line": 5, "raw": rec(ts="bad"), "reason": "bad timestamp: ts"}
    ]


def test_crlf_line_endings_and_bom(tmp_path):
    data = b"\xef\xbb\xbf" + (rec() + "\r\n" + rec(ts="x") + "\r\n").encode()
    r = read([write_bytes(tmp_path, "in.jsonl", data)], tmp_path)
    assert r.rows == [row()]
    assert r.rejects[0]["raw"] == rec(ts="x") and r.rejects[0]["line"] == 2


def test_last_line_without_newline_waits_in_a_growable_file_and_is_read_in_gzip(tmp_path):
    data = (rec() + "\n" + rec()[:-5]).encode()
    r = read([write_bytes(tmp_path, "in.jsonl", data)], tmp_path)
    assert reasons(r) == [] and len(r.rows) == 1  # a log's partial last line is still being written
    r = read([write_bytes(tmp_path, "in.jsonl.gz", data)], tmp_path)  # a gzip file is complete: read it all
    assert reasons(r) == ["invalid JSON"] and len(r.rows) == 1


@pytest.mark.parametrize("name", ["empty.jsonl", "empty.jsonl.gz", "empty.csv", "empty.csv.gz", "blank.ndjson"])
def test_empty_files(tmp_path, name):
    data = b"\n \n" if name.startswith("blank") else b""
    r = read([write_bytes(tmp_path, name, data)], tmp_path)
    assert r.batches == [] and r.stats == ReadStats()


@pytest.mark.parametrize("name", ["in.jsonl", "in.jsonl.gz", "in.json", "in.ndjson", "in.NDJSON.GZ"])
def test_jsonl_suffixes(tmp_path, name):
    r = read_jsonl(tmp_path, [rec(), rec(service="b")], name=name)
    assert [x["service"] for x in r.rows] == ["svc", "b"]


def test_batch_rows_bounds_batches(tmp_path):
    lines = [rec(ts=T0 + i) if i % 4 else rec(ts=None) for i in range(23)]
    r = read_jsonl(tmp_path, lines, batch_rows=5)
    assert max(b.num_rows for b in r.batches) <= 5
    assert [x["ts"] for x in r.rows] == [T0 + i for i in range(23) if i % 4]
    assert r.stats.rejected == 6


def test_stats_accumulate_over_files_and_summary(tmp_path):
    a = write_bytes(tmp_path, "a.jsonl", (rec() + "\nnope\n").encode())
    b = write_bytes(tmp_path, "b.jsonl", (rec(ts=None) + "\n" + rec() + "\n").encode())
    r = read([a, b], tmp_path)
    assert (r.stats.read, r.stats.accepted, r.stats.rejected) == (4, 2, 2)
    assert [(x["source"], x["line"]) for x in r.rejects] == [(str(a), 2), (str(b), 1)]
    assert r.stats.summary() == "read 4 = accepted 2 + rejected 2 (invalid JSON: 1, missing field: ts: 1)"
    merged = ReadStats()
    merged.merge(r.stats)
    merged.merge(r.stats)
    assert (merged.read, merged.accepted, merged.rejected, merged.reasons["invalid JSON"]) == (8, 4, 4, 2)


def test_stats_and_dead_letter_are_optional(tmp_path):
    path = write_bytes(tmp_path, "a.jsonl", (rec() + "\nnope\n").encode())
    assert sum(b.num_rows for b in read_events(str(path))) == 1


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


# ------------------------------------------------------------------------------------------- Parquet


def write_parquet(tmp_path: Path, table: pa.Table, name: str = "in.parquet", **kw) -> Path:
    path = tmp_path / name
    pq.write_table(table, path, **kw)
    return path


def test_parquet_clean_typed_and_lossless_casts(tmp_path):
    table = pa.table(
        {
            "ts": pa.array(
                [dt.datetime(2026, 11, 21, 10), dt.datetime(2026, 11, 21, 10, 0, 0, 1500)], pa.timestamp("us", tz="UTC")
            ),  # fmt: skip
            "service": pa.array(["a", "b"]).dictionary_encode(),
            "latency_ms": pa.array([3, 4], pa.int32()),
            "status": pa.array([None, 0], pa.int8()),
            "db_statement": pa.array(["", "SELECT 1"], pa.large_string()),
            "other": pa.array([1, 2]),
        }
    )
    r = read([write_parquet(tmp_path, table)], tmp_path)
    assert r.rows == [row(service="a", latency_ms=3.0), row(ts=T0 + 1, service="b", latency_ms=4.0, status=False,
                                                            db_statement="SELECT 1")]  # fmt: skip


@pytest.mark.parametrize(
    "ts, expected",
    [
        (pa.array([T0], pa.int64()), T0),
        (pa.array([T0], pa.uint64()), T0),
        (pa.array([T0 // 1000], pa.timestamp("s")), T0),
        (pa.array([T0], pa.timestamp("ms", tz="Europe/Berlin")), T0),  # values are UTC whatever the tz
        (pa.array([T0 * 1_000_000 - 1], pa.timestamp("ns")), T0 - 1),  # floored
        (pa.array([-1], pa.timestamp("us")), -1),
        (pa.array([dt.date(2026, 11, 21)], pa.date32()), ms(2026, 11, 21)),
        (pa.array(["2026-11-21T11:00:00+01:00"]), T0),
        (pa.array([b"2026-11-21T10:00:00Z"], pa.binary()), T0),
    ],
)
def test_parquet_timestamp_types(tmp_path, ts, expected):
    table = pa.table({"ts": ts, "service": ["s"], "latency_ms": [1.5]})
    assert read([write_parquet(tmp_path, table)], tmp_path).rows == [row(ts=expected, service="s")]


def test_parquet_rejects_with_reasons_and_row_objects(tmp_path):
    nan, inf = float("nan"), float("inf")
    table = pa.table(
        {
            "ts": pa.array([T0, None, T0, T0, 2**62, T0, T0, T0, T0], pa.int64()),
            "service": ["a", "a", None, "", "a", "a", "a", "a", "a"],
            "latency_ms": [1.0, 1.0, 1.0, 1.0, 1.0, -1.0, nan, None, inf],
            "status": pa.array([True, True, True, True, True, True, True, True, None]),
            "junk": list("abcdefghi"),
        }
    )
    r = read([write_parquet(tmp_path, table)], tmp_path)
    assert r.rows == [row(service="a", latency_ms=1.0)]
    got = [(x["line"], x["reason"]) for x in r.rejects]
    assert got == [
        (2, "missing field: ts"),
        (3, "missing field: service"),
        (4, "bad value: service"),
        (5, "out of range: ts"),
        (6, "out of range: latency_ms"),
        (7, "out of range: latency_ms"),
        (8, "missing field: latency_ms"),
        (9, "out of range: latency_ms"),
    ]
    assert r.rejects[0]["raw"] == {"ts": None, "service": "a", "latency_ms": 1.0, "status": True}
    assert r.rejects[5]["raw"]["latency_ms"] == "nan" and r.rejects[7]["raw"]["latency_ms"] == "inf"


def test_parquet_wrong_types_and_bad_values(tmp_path):
    table = pa.table(
        {
            "ts": pa.array([T0, T0, 2**64 - 1, T0, T0], pa.uint64()),
            "service": ["a", "a", "a", "a", "a"],
            "instance": pa.array([None, 1, None, None, None], pa.int64()),
            "latency_ms": [1.0, 1.0, 1.0, 1.0, 1.0],
            "status": pa.array(["true", "false", "true", "yes", None]),
            "db_statement": pa.array([b"q", None, None, None, b"\xff"], pa.binary()),
        }
    )
    r = read([write_parquet(tmp_path, table)], tmp_path)
    assert r.rows == [row(service="a", latency_ms=1.0, db_statement="q")]
    assert [(x["line"], x["reason"]) for x in r.rejects] == [
        (2, "bad type: instance"),
        (3, "out of range: ts"),
        (4, "bad value: status"),
        (5, "not UTF-8"),
    ]
    assert r.rejects[3]["raw"]["db_statement"] == "\\xff"


def test_parquet_missing_required_columns_and_string_ts_rules(tmp_path):
    table = pa.table({"ts": ["2026-11-21T10:00:00Z", "1795255200000", None], "service": ["a", "b", "c"]})
    r = read([write_parquet(tmp_path, table)], tmp_path)
    assert reasons(r) == ["missing field: latency_ms", "bad timestamp: ts", "missing field: ts"]


def test_parquet_in_row_groups_with_batch_rows(tmp_path):
    n = 1000
    table = pa.table({"ts": pa.array(range(n), pa.int64()), "service": ["s"] * n,
                      "latency_ms": [float(i % 7) - 1 for i in range(n)]})  # fmt: skip
    r = read([write_parquet(tmp_path, table, row_group_size=128)], tmp_path, batch_rows=100)
    assert [x["ts"] for x in r.rows] == [i for i in range(n) if i % 7]
    assert [x["line"] for x in r.rejects] == [i + 1 for i in range(n) if not i % 7]  # 1-based rows


def test_parquet_all_rows_rejected_yields_nothing(tmp_path):
    table = pa.table({"ts": pa.array([None, None], pa.int64()), "service": ["s", "s"], "latency_ms": [1.0, 1.0]})
    r = read([write_parquet(tmp_path, table)], tmp_path)
    assert r.batches == [] and r.stats.rejected == 2


def test_corrupt_files_are_input_errors(tmp_path):
    bad_parquet = write_bytes(tmp_path, "x.parquet", b"PAR1 not really")
    truncated_gz = tmp_path / "t.jsonl.gz"
    truncated_gz.write_bytes(gzip.compress((rec() + "\n").encode() * 1000)[:-30])
    for path in (bad_parquet, truncated_gz):
        with pytest.raises(InputError, match="cannot read"):
            list(read_events([str(path)]))


# ------------------------------------------------------------------------- one core, three formats

ISO_TEXT = st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30)).map(
    lambda d: d.isoformat(timespec="milliseconds") + "Z"
)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
TS_VALUES = st.one_of(
    st.none(), st.integers(TS_MIN - 5, TS_MAX + 5), st.integers(-(10**30), 10**30), ISO_TEXT,
    TEXT.filter(lambda s: s and not s.lstrip("-").isdigit()),  # a CSV cell "" is null, "12" an int
)  # fmt: skip
LATENCY_VALUES = st.one_of(
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(10**3), 10**400),
    TEXT.filter(lambda s: s and not NUMBER_RE.fullmatch(s)),  # a CSV cell "" is null, "1.5" a number
)
STATUS_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-1, 2), st.sampled_from(["true", "false", "yes"]))
RECORDS = st.fixed_dictionaries(
    {"ts": TS_VALUES, "service": st.one_of(st.none(), TEXT.filter(bool)), "latency_ms": LATENCY_VALUES},
    optional={
        "instance": st.one_of(st.none(), TEXT),
        "endpoint": st.one_of(st.none(), TEXT),
        "status": STATUS_VALUES,
        "db_statement": st.one_of(st.none(), TEXT),
    },  # fmt: skip
)


def csv_cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def outcome(result: Result) -> tuple[list, list]:
    return result.rows, [(x["line"], x["reason"]) for x in result.rejects]


@HYPO
@given(st.lists(RECORDS, max_size=12))
def test_json_and_csv_agree(tmp_path, records):
    """A record means the same in JSON and in CSV: the same rows accepted, the same reasons."""
    json_result = read_jsonl(tmp_path, [json.dumps(r, ensure_ascii=False) for r in records])
    buf = io.StringIO()
    writer = csv.writer(buf)  # default "\r\n" terminator: fields holding \r or \n get quoted
    writer.writerow(["line", *FIELDS])
    for i, r in enumerate(records):
        writer.writerow([str(i + 1), *(csv_cell(r.get(name)) for name in FIELDS)])
    csv_result = read_csv(tmp_path, buf.getvalue())
    assert json_result.rows == csv_result.rows
    # CSV line numbers differ (header; quoted newlines): compare reasons in order
    assert [x["reason"] for x in json_result.rejects] == [x["reason"] for x in csv_result.rejects]


PARQUET_RECORDS = st.fixed_dictionaries(
    {
        "ts": st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
        "service": st.one_of(st.none(), TEXT),
        "instance": st.one_of(st.none(), TEXT),
        "latency_ms": st.one_of(st.none(), st.floats(allow_nan=False)),
        "status": st.one_of(st.none(), st.booleans()),
        "db_statement": st.one_of(st.none(), TEXT),
    }
)


@HYPO
@given(st.lists(PARQUET_RECORDS, max_size=12))
def test_json_and_parquet_agree(tmp_path, records):
    """The columnar core gives the same rows and reasons as the row core."""
    json_lines = [json.dumps(r, ensure_ascii=False).replace("Infinity", "1e999") for r in records]
    json_result = read_jsonl(tmp_path, json_lines)
    schema = pa.schema([("ts", pa.int64()), ("service", pa.string()), ("instance", pa.string()),
                        ("latency_ms", pa.float64()), ("status", pa.bool_()), ("db_statement", pa.string())])  # fmt: skip
    parquet_result = read([write_parquet(tmp_path, pa.Table.from_pylist(records, schema=schema))], tmp_path)
    assert json_result.rows == parquet_result.rows
    assert [(x["line"], x["reason"]) for x in json_result.rejects] == [
        (x["line"], x["reason"]) for x in parquet_result.rejects
    ]


ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), TEXT,
    st.sampled_from(["", "true", "false", "2026-11-21T10:00:00Z", "\ud800", "caf\u00e9"]),
    st.lists(st.integers(), max_size=2),
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.tuples(*[ANY_VALUE] * 7))
def test_fast_path_agrees_with_field_checks(values):
    def run(fn):
        try:
            return fn(*values)
        except Rejected as r:
            return r.reason

    assert run(validate_values) == run(check_fields)


JSONISH_LINE = st.one_of(
    RECORDS.map(json.dumps),
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), TEXT),
        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
        max_leaves=8,
    ).map(json.dumps),
    RECORDS.map(json.dumps).flatmap(lambda s: st.integers(0, len(s)).map(lambda k: s[:k])),  # truncated
    st.text(max_size=30).map(lambda s: s.replace("\n", " ")),
    st.binary(max_size=30).map(lambda b: b.replace(b"\n", b" ")),
)


@HYPO
@given(st.lists(JSONISH_LINE, max_size=15))
def test_arbitrary_lines_never_crash_and_counts_reconcile(tmp_path, lines):
    result = read_jsonl(tmp_path, lines, batch_rows=4)
    encoded = [x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass") for x in lines]
    if encoded and encoded[0].startswith(b"\xef\xbb\xbf"):
        encoded[0] = encoded[0][3:]  # a UTF-8 byte order mark opening the file is skipped
    non_blank = sum(1 for x in encoded if x.strip(b" \t\r\n"))
    assert result.stats.read == non_blank
    assert all(isinstance(x["reason"], str) and x["reason"] for x in result.rejects)


# ---------------------------------------------------------------------------------------- dead letter


def test_dead_letter_is_thread_safe_and_appends(tmp_path):
    path = tmp_path / "dl.jsonl"
    with DeadLetter(path) as dl:
        threads = [
            threading.Thread(target=lambda t=t: [dl.write("src", i, f"raw {t} \n \"{i}\"", "r") for i in range(300)])
            for t in range(4)
        ]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    records = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(records) == dl.count == 1200
    assert sorted(r["raw"] for r in records) == sorted(f'raw {t} \n "{i}"' for t in range(4) for i in range(300))
    with DeadLetter(path) as again:
        again.write("src", 1, "x", "r")
    assert len(path.read_text().splitlines()) == 1201  # appended: rejects of earlier runs are never destroyed
    (tmp_path / "new.jsonl").unlink(missing_ok=True)
    with DeadLetter(tmp_path / "new.jsonl"):
        pass
    assert (tmp_path / "new.jsonl").read_text() == ""  # created even when nothing is rejected
    with pytest.raises(RuntimeError, match="not open"):
        dl.write("src", 1, "x", "r")


# ------------------------------------------------------------------------------------------- inputs


def test_expand_inputs_globs_sorted_deduplicated(tmp_path):
    for name in ["b.jsonl", "a.jsonl", "c.csv", "sub/d.jsonl"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("")
    got = expand_inputs([f"{tmp_path}/*.jsonl", str(tmp_path / "a.jsonl"), f"{tmp_path}/./c.csv",
                         f"{tmp_path}/**/*.jsonl"])  # fmt: skip
    assert got == [str(tmp_path / n) for n in ["a.jsonl", "b.jsonl", "c.csv", "sub/d.jsonl"]]


def test_expand_inputs_errors(tmp_path):
    with pytest.raises(InputError, match=r"^no input files match '.*/x/\*\.jsonl'$"):
        expand_inputs([f"{tmp_path}/x/*.jsonl"])
    with pytest.raises(InputError, match=r"^no such input file: '.*missing\.jsonl'$"):
        expand_inputs([str(tmp_path / "missing.jsonl")])
    with pytest.raises(InputError, match="is a directory"):
        expand_inputs([str(tmp_path)])
    with pytest.raises(InputError, match="no input files given"):
        expand_inputs([])
    assert issubclass(InputError, ValueError)


def test_read_events_checks_paths_at_call_time(tmp_path):
    good = write_bytes(tmp_path, "a.jsonl", (rec() + "\n").encode())
    with pytest.raises(InputError, match=r"unsupported input format: '.*a\.txt'"):
        read_events([str(good), str(tmp_path / "a.txt")])
    with pytest.raises(InputError, match="no such input file"):
        read_events([str(good), str(tmp_path / "gone.csv")])


@pytest.mark.parametrize(
    "name, expected",
    [
        ("a.jsonl", ("jsonl", False)), ("a.JSON.gz", ("jsonl", True)), ("a.ndjson", ("jsonl", False)),
        ("a.csv.gz", ("csv", True)), ("dir.v2/a.parquet", ("parquet", False)),
    ],
)  # fmt: skip
def test_detect_format(name, expected):
    assert detect_format(name) == expected


@pytest.mark.parametrize("name", ["a.parquet.gz", "a.gz", "a", "a.tsv", "a.jsonl.bz2"])
def test_detect_format_rejects(name):
    with pytest.raises(InputError):
        detect_format(name)


# ------------------------------------------------------------------- JSON Lines columnar fast path

CLEAN_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)
EXTRA_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
              CLEAN_TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(CLEAN_TEXT, inner, max_size=3)),
    max_leaves=6,
)  # fmt: skip
CLEAN_RECORDS = st.fixed_dictionaries(
    {"ts": st.integers(TS_MIN, TS_MAX), "service": CLEAN_TEXT.filter(bool),
     "latency_ms": st.one_of(st.floats(0, LATENCY_MAX_MS), st.integers(0, int(LATENCY_MAX_MS)))},
    optional={"instance": st.one_of(st.none(), CLEAN_TEXT), "endpoint": st.one_of(st.none(), CLEAN_TEXT),
              "status": st.one_of(st.none(), st.booleans()), "db_statement": st.one_of(st.none(), CLEAN_TEXT),
              "extra": EXTRA_VALUE, "nested": st.dictionaries(CLEAN_TEXT, EXTRA_VALUE, max_size=2)},
)  # fmt: skip


def dump(record: dict, ascii_only: bool, compact: bool) -> str:
    return json.dumps(record, ensure_ascii=ascii_only, separators=(",", ":") if compact else None)


CLEAN_LINE = st.builds(dump, CLEAN_RECORDS, st.booleans(), st.booleans())
_OK = '"ts":1795255200000,"service":"svc","latency_ms":1.5'
DIRTY_LINES = [
    "", "   ", "\t\r", "null", "[1]", "42", '"x"', "{}", "{'ts': 1}", "{" + _OK + ",}", "{ts:1}",
    "{" + _OK + "} x", "{" + _OK + "}{" + _OK + "}", "{" + _OK + "}\r{" + _OK + "}", "{" + _OK + ",",
    "  {" + _OK + "}", "{" + _OK + "}  ", "{" + _OK + "}\r", "{" + _OK + "\x0b}",
    "{" + _OK + ',"x":NaN}', "{" + _OK + ',"x":Infinity}', "{" + _OK + ',"x":-Infinity}', '{"x":"NaN",' + _OK + "}",
    '{"ts":1795255200000,"service":"svc","latency_ms":NaN}', "{" + _OK + ',"x":' + "[" * 1500 + "]" * 1500 + "}",
    "{" + _OK + ',"x":1' + "0" * 5000 + "}", "{" + _OK + ',"x":' + "[" * 300 + "]" * 300 + "}",
    "{" + _OK + ',"ts":1795255200001}', "{" + _OK + ',"\\u0073ervice":"b"}', "{" + _OK + ',"x":1,"x":2}',
    "{" + _OK + ',"x":"\\ud800"}', "{" + _OK + ',"instance":"\\udc00"}', "{" + _OK + ',"x":"a\tb"}',
    "{" + _OK + ',"x":"\\q"}', "{" + _OK + ',"x":01}', "{" + _OK + ',"x":1.}', "{" + _OK + ',"x":tru}',
    "{" + _OK + ',"x":"caf\u00e9","y":"\\u00e9\\ud83d\\ude00"}', "{" + _OK + ',"status":1}', "{" + _OK + ',"status":0}',
    "{" + _OK + ',"status":"true"}', "{" + _OK + ',"status":2}', "{" + _OK + ',"instance":5}', "{" + _OK + ',"endpoint":[]}',
    '{"ts":"2026-11-21T10:00:00Z","service":"svc","latency_ms":1.5}', '{"ts":1.0,"service":"svc","latency_ms":1.5}',
    '{"ts":1e3,"service":"svc","latency_ms":1.5}', '{"ts":99999999999999999999,"service":"svc","latency_ms":1.5}',
    '{"ts":253402300800000,"service":"svc","latency_ms":1.5}', '{"ts":-0,"service":"svc","latency_ms":-0.0}',
    '{"ts":1,"service":"","latency_ms":1.5}', '{"ts":1,"service":null,"latency_ms":1.5}', '{"ts":1,"latency_ms":1.5}',
    '{"ts":1,"service":"svc","latency_ms":-1}', '{"ts":1,"service":"svc","latency_ms":1e400}',
    '{"ts":1,"service":"svc","latency_ms":"5"}', '{"ts":1,"service":"svc","latency_ms":true}',
    '{"ts":1,"service":"svc","latency_ms":1' + "0" * 400 + "}", '{"ts":1,"service":"svc","latency_ms":1e-400}',
    "{" + _OK + ',"db_statement":""}', "{" + _OK + ',"db_statement":5}', "{" + _OK + ',"x":/*c*/1}',
    b"{" + _OK.encode() + b',"x":"caf\xe9"}', b"\xff\xfe", "{\n", "}",
    "{" + _OK + "}\x00 x }", "{" + _OK + ',"x":"a\x00b"}', "{" + _OK + ',"x":1}\x00{"ts":1}', "{" + _OK + ',"x":"\x7f"}',
]  # fmt: skip
#: Lines pyarrow.json reads without complaint (some of them as several rows) but strict JSON rejects.
LENIENT_IN_PYARROW = [
    "{" + _OK + "}{" + _OK + "}", "{" + _OK + "}\r{" + _OK + "}", "{" + _OK + ',"x":NaN}', "{" + _OK + ',"x":Infinity}',
    "{" + _OK + ',"x":-Infinity}', '{"ts":1795255200000,"service":"svc","latency_ms":NaN}',
    "{" + _OK + ',"x":' + "[" * 1500 + "]" * 1500 + "}", "{" + _OK + ',"x":1' + "0" * 5000 + "}",
    b"{" + _OK.encode() + b',"x":"caf\xe9"}', "null", "{\n",
]  # fmt: skip
MIXED_LINE = st.one_of(CLEAN_LINE, CLEAN_LINE, st.sampled_from(DIRTY_LINES))


def read_both_paths(tmp_path: Path, data: bytes, name: str, batch_rows: int) -> tuple[Result, Result]:
    import drainpipe.inputs.formats.jsonl_format as events

    path = write_bytes(tmp_path, name, data)
    results = []
    for fast in (True, False):
        events._JSONL_FAST_PATH = fast
        try:
            results.append(read([path], tmp_path, batch_rows=batch_rows))
        finally:
            events._JSONL_FAST_PATH = True
    return results[0], results[1]


def assert_same(fast: Result, slow: Result) -> None:
    assert [b.schema for b in fast.batches] == [b.schema for b in slow.batches]
    assert [b.to_pylist() for b in fast.batches] == [b.to_pylist() for b in slow.batches]
    assert [b.equals(s) for b, s in zip(fast.batches, slow.batches)] == [True] * len(slow.batches)
    assert fast.stats == slow.stats
    assert fast.rejects == slow.rejects


@HYPO
@given(
    st.lists(MIXED_LINE, max_size=24),
    st.integers(1, 8),
    st.sampled_from(["in.jsonl", "in.ndjson.gz"]),
    st.sampled_from([b"\n", b"\r\n"]),
    st.booleans(),
)
def test_fast_path_equals_per_line_path(tmp_path, lines, batch_rows, name, ending, final_newline):
    """Columnar fast path on or off: identical batches, stats and dead-letter records (mixed clean/dirty)."""
    encoded = [x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass") for x in lines]
    data = ending.join(encoded) + (ending if final_newline and encoded else b"")
    assert_same(*read_both_paths(tmp_path, data, name, batch_rows))


@HYPO
@given(st.lists(CLEAN_LINE.filter(lambda s: "NaN" not in s and "Infinity" not in s), min_size=1, max_size=30))
def test_fast_path_taken_for_clean_blocks(lines):
    """A clean block really takes the fast path, with the per-line result (the bytes ``NaN``/``Infinity``
    anywhere, even inside a string, conservatively send a block to the per-line path)."""
    from drainpipe.inputs.formats.jsonl_format import fast_jsonl_block, json_rows
    from drainpipe.inputs.validation import rows_to_batch

    chunk = [x.encode() + b"\n" for x in lines]
    fast = fast_jsonl_block(chunk)
    assert fast is not None and fast[1] == []
    batch = fast[0]
    rejects: list = []
    expected = rows_to_batch(json_rows(enumerate(chunk, 1), lambda *a: rejects.append(a)))
    assert rejects == [] and batch.equals(expected) and batch.schema.equals(EVENT_SCHEMA)


@pytest.mark.parametrize("line", DIRTY_LINES)
def test_fast_path_declines_dirty_lines(tmp_path, line):
    """Each dirty line sends its block to the per-line path, with the per-line outcome."""
    from drainpipe.inputs.formats.jsonl_format import fast_jsonl_block

    raw = line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")
    clean = rec().encode()
    if line in LENIENT_IN_PYARROW:
        assert fast_jsonl_block([clean + b"\n", raw + b"\n", clean + b"\n"]) is None
    assert_same(*read_both_paths(tmp_path, clean + b"\n" + raw + b"\n" + clean + b"\n", "in.jsonl", 65536))


def test_fast_path_generated_events_round_trip(tmp_path):
    from drainpipe.pipeline.generator import generate_events, write_events

    path = tmp_path / "gen.jsonl"
    write_events(generate_events(3000, batch_rows=1000), path)
    expected = pa.Table.from_batches(list(generate_events(3000, batch_rows=1000)))
    fast, slow = read_both_paths(tmp_path, path.read_bytes(), "gen.jsonl", 1024)
    assert_same(fast, slow)
    assert pa.Table.from_batches(fast.batches).equals(expected)


def test_fast_path_value_rejects_get_per_line_reasons(tmp_path):
    """Rows the columnar checks reject stay on the fast path, with the per-line reason, raw text and line."""
    from drainpipe.inputs.formats.jsonl_format import fast_jsonl_block

    lines = [rec(), rec(service=""), rec(latency_ms=-1), rec(ts=TS_MAX + 1), "{}", rec(service=None), rec()]
    chunk = [x.encode() + b"\n" for x in lines]
    fast = fast_jsonl_block(chunk, 10)
    assert fast is not None
    batch, rejects = fast
    assert batch.to_pylist() == [row(), row()]
    assert [(line, reason) for line, _, reason in rejects] == [
        (12, "bad value: service"), (13, "out of range: latency_ms"), (14, "out of range: ts"),
        (15, "missing field: ts"), (16, "missing field: service"),
    ]  # fmt: skip
    assert_same(*read_both_paths(tmp_path, b"".join(chunk), "in.jsonl", 65536))


@HYPO
@given(st.lists(MIXED_LINE, max_size=24), st.integers(1, 8), st.sampled_from([b"\n", b"\r\n"]), st.booleans())
def test_read_range_equals_per_line_path(lines, batch_rows, ending, final_newline):
    """JsonlBlocks.read_range (the workers' reader: scanner straight out of the part's bytes, else the block cut
    out) gives the per-line path's blocks, rows, rejects and line numbers."""
    import drainpipe.inputs.formats.jsonl_format as events
    from drainpipe.inputs import RejectList, Sink
    from drainpipe.inputs.formats.jsonl_format import JsonlBlocks

    encoded = [x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass") for x in lines]
    data = ending.join(encoded) + (ending if final_newline and encoded else b"")

    def blocks(fast: bool) -> tuple[list, list, ReadStats]:
        stats, rejects, out = ReadStats(), RejectList(), []
        reader, begin, lineno = JsonlBlocks(), 0, 0
        events._JSONL_FAST_PATH = fast
        try:
            while begin < len(data):
                begin, n, batch = reader.read_range(data, begin, batch_rows, lineno, Sink("x", stats, rejects),
                                                    data.isascii())  # fmt: skip
                lineno += n
                out.append((lineno, None if batch is None else batch.to_pylist()))
        finally:
            events._JSONL_FAST_PATH = True
        return out, rejects.rows, stats

    fast, slow = blocks(True), blocks(False)
    assert fast[0] == slow[0] and fast[1] == slow[1] and fast[2] == slow[2]


@HYPO
@given(st.lists(MIXED_LINE, max_size=24), st.sampled_from([b"\n", b"\r\n"]), st.booleans())
def test_ndjson_bodies_fast_path_equals_per_line_path(lines, ending, final_newline):
    """An HTTP body of JSON Lines (validate_json_lines) gives the same batch, rejects and counts with the
    columnar fast path as line by line."""
    import drainpipe.inputs.formats.jsonl_format as events
    from drainpipe.inputs import validate_json_lines

    encoded = [x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass") for x in lines]
    data = ending.join(encoded) + (ending if final_newline and encoded else b"")
    results = []
    for fast in (True, False):
        events._JSONL_FAST_PATH = fast
        try:
            stats = ReadStats()
            batch, rejects = validate_json_lines(data, stats)
        finally:
            events._JSONL_FAST_PATH = True
        results.append((batch, rejects, stats))
    (fast_batch, fast_rejects, fast_stats), (batch, rejects, stats) = results
    assert fast_batch.equals(batch) and fast_batch.schema.equals(EVENT_SCHEMA)
    assert fast_rejects == rejects and fast_stats == stats


def test_ndjson_body_value_rejects_on_the_fast_path():
    """A body of canonical-typed lines with bad values stays on the fast path and reports each line's reason."""
    from drainpipe.inputs import validate_json_lines

    body = "\n".join([rec(), rec(service=""), rec(latency_ms=-1), rec(), rec(ts=TS_MAX + 1)]).encode() + b"\n"
    stats = ReadStats()
    batch, rejects = validate_json_lines(body, stats)
    assert batch.to_pylist() == [row(), row()]
    assert rejects == [(2, "bad value: service"), (3, "out of range: latency_ms"), (5, "out of range: ts")]
    assert (stats.accepted, stats.rejected) == (2, 3)


@HYPO
@given(
    st.lists(MIXED_LINE, max_size=20),
    st.integers(1, 8),
    st.integers(1, 64),
    st.booleans(),
    st.booleans(),
)
def test_whole_file_reads_cut_blocks_as_lines_do(lines, batch_rows, read_bytes, growable, final_newline):
    """The whole-file reader (read_jsonl_stream: chunks of the file, blocks through read_range) against a reference
    that splits the bytes into lines and validates each block line by line: the same block indexes, rows, rejects,
    bytes and lines consumed, with chunks down to one byte (lines and blocks spanning chunks) and a growable file's
    unfinished last line left unread."""
    import drainpipe.inputs.formats.jsonl_format as events
    from drainpipe.inputs import RejectList, Sink
    from drainpipe.inputs.formats.jsonl_format import JsonlBlocks, read_jsonl_stream

    encoded = [x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass") for x in lines]
    data = b"\n".join(encoded) + (b"\n" if final_newline and encoded else b"")
    raw = data.split(b"\n")
    last = raw.pop()
    whole = [line + b"\n" for line in raw] + ([last] if last and not growable else [])

    want_stats, want_rejects, want = ReadStats(), RejectList(), []
    events._JSONL_FAST_PATH = False
    try:
        reader = JsonlBlocks()
        for index, k in enumerate(range(0, len(whole), batch_rows)):
            batch = reader.read(whole[k : k + batch_rows], k, Sink("x", want_stats, want_rejects))
            if batch is not None:
                want.append((index, batch.to_pylist()))
    finally:
        events._JSONL_FAST_PATH = True

    stats, rejects = ReadStats(), RejectList()
    old = events._READ_BYTES
    events._READ_BYTES = read_bytes
    try:
        stream = read_jsonl_stream(io.BytesIO(data), growable, batch_rows, Sink("x", stats, rejects))
        got, consumed, count = [], 0, 0
        for index, batch, consumed_now, count_now in stream:
            consumed, count = consumed_now, count_now  # after the last block: the whole read
            if batch is not None:
                got.append((index, batch.to_pylist()))
    finally:
        events._READ_BYTES = old
    assert got == want
    assert rejects.rows == want_rejects.rows and stats == want_stats
    assert (consumed, count) == (sum(map(len, whole)), len(whole))


@pytest.mark.parametrize("batch_rows", [7, 100, 4096])
def test_parquet_strings_read_as_dictionaries_give_the_same_rows_and_rejects(tmp_path, monkeypatch, batch_rows):
    """The workers' reader reads string columns stored with a dictionary as dictionary arrays: the same rows and
    rejects as reading them as plain strings (and as the whole-file reader), across row groups with their own
    dictionaries, nulls, empty values, a column whose dictionary overflows into plain pages mid-chunk, and blocks
    that cross row groups. Kept dictionary-encoded in the batches (``dictionaries=True``, the workers' way), the
    values are still the same: kept where validation changes none (empty services flagged through the
    dictionary), decoded where it does (an instance to fill, an empty statement to null)."""
    from drainpipe.inputs import parts
    from drainpipe.inputs.formats import parquet_format
    from drainpipe.inputs.rejects import Sink

    n = 3_000
    table = pa.table(
        {
            "ts": pa.array([T0 + i for i in range(n)], pa.int64()),
            "service": [None if i % 97 == 0 else "" if i % 89 == 0 else f"s{i % 5}" for i in range(n)],
            "instance": [None if i == 2_500 else f"i{i % 3}" for i in range(n)],
            "endpoint": [f"/e/{i}" for i in range(n)],  # high cardinality: falls back to plain pages
            "latency_ms": [float(i % 11) for i in range(n)],
            "db_statement": [None if i % 2 else "" if i == 10 else f"q{i % 4}" for i in range(n)],
        }
    )
    path = write_parquet(tmp_path, table, row_group_size=700, dictionary_pagesize_limit=256)
    stored = pq.ParquetFile(path).metadata.row_group(0)
    assert all(stored.column(i).has_dictionary_page for i in (1, 2, 3))
    assert pa.types.is_dictionary(parquet_format.open_parquet(str(path)).schema_arrow.field("service").type)

    kept: set[str] = set()

    def both_paths(keep: bool = False) -> tuple:
        whole = read([path], tmp_path, batch_rows=batch_rows)
        stats = ReadStats()
        with DeadLetter(tmp_path / "parts.jsonl") as dl:
            sink = Sink(str(path), stats, dl)
            blocks = [b.rows for part in parts.plan_parts(str(path), batch_rows, workers=3)
                      for _, b in parts.read_part(part, sink, dictionaries=keep)]  # fmt: skip
        kept.update(f.name for b in blocks for f in b.schema if pa.types.is_dictionary(f.type))
        assert all(b.schema.names == EVENT_SCHEMA.names for b in blocks)
        rows = [row for b in blocks for row in b.to_pylist()]
        rejected = (tmp_path / "parts.jsonl").read_text().splitlines()
        (tmp_path / "parts.jsonl").unlink()
        return whole.rows, whole.rejects, rows, stats.rejected, rejected

    dictionary = both_paths()
    assert not kept
    assert both_paths(keep=True) == dictionary
    assert {"service", "instance", "db_statement"} <= kept if batch_rows < 2_000 else "service" in kept
    plain = pq.ParquetFile
    monkeypatch.setattr(parquet_format, "open_parquet", plain)
    assert both_paths() == dictionary
    assert dictionary[0] == dictionary[2] and len(dictionary[1]) == dictionary[3] > 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    groups=st.lists(st.integers(1, 90), min_size=1, max_size=9),
    batch_rows=st.integers(1, 40),
    workers=st.integers(1, 5),
    resume=st.integers(0, 400),
)
def test_parquet_parts_cover_every_block_once_and_divide_among_the_workers(
    tmp_path, groups, batch_rows, workers, resume
):
    """The plan's parts are contiguous block ranges from the resume point to the end, none over PARQUET_PART_BLOCKS,
    read back as the whole file's rows; and they divide among the workers (the last round is cut finer), unless
    the last round has fewer blocks than workers."""
    from drainpipe.inputs import Position, Sink, parts
    from drainpipe.inputs.formats import parquet_format

    rows = sum(groups)
    path = tmp_path / "groups.parquet"
    with pq.ParquetWriter(path, _events_table(0, 1).schema) as writer:
        begin = 0
        for size in groups:  # one row group each
            writer.write_table(_events_table(begin, size))
            begin += size
    blocks = -(-rows // batch_rows)
    skip = min(blocks, resume // batch_rows)  # a resume point ends a block
    plan = list(parts.plan_parts(str(path), batch_rows, workers=workers, start=Position(skip * batch_rows)))
    assert [(p.first, p.blocks) for p in plan] == [(p.first, p.blocks) for p in plan if p.blocks > 0]
    assert [p.first for p in plan] == [skip, *(p.first + p.blocks for p in plan[:-1])][: len(plan)]
    assert sum(p.blocks for p in plan) == blocks - skip
    assert all(p.blocks <= parquet_format.PARQUET_PART_BLOCKS for p in plan)
    rest = len(plan) % workers  # a last round shorter than the workers only when it ran out of blocks to cut
    assert rest == 0 or all(p.blocks == 1 for p in plan[-rest:])
    stats = ReadStats()
    with DeadLetter(tmp_path / "dl.jsonl") as dl:
        sink = Sink(str(path), stats, dl)
        ts = [t for part in plan for _, b in parts.read_part(part, sink) for t in b.rows.column("ts").to_pylist()]
    assert ts == list(range(T0 + skip * batch_rows, T0 + rows))


def _events_table(begin: int, size: int) -> pa.Table:
    return pa.table(
        {
            "ts": pa.array(range(T0 + begin, T0 + begin + size), pa.int64()),
            "service": pa.array(["s"] * size),
            "latency_ms": pa.array([1.0] * size),
        }
    )
