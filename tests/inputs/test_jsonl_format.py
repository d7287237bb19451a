"""JSON Lines (inputs/formats/jsonl_format.py): the rules on JSON values, line handling, and the columnar fast paths
(the C scanner, pyarrow.json) held equal to the per-line path."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drainpipe import native
from drainpipe.inputs import read_events
from drainpipe.inputs.rejects import ReadStats
from drainpipe.inputs.schema import EVENT_SCHEMA, LATENCY_MAX_MS, TRACE_ID, TS_MAX, TS_MIN, batch_schema
from testlib import T0, Result, ms, read, read_jsonl, reasons, rec, row, write_bytes

HYPO = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


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


@pytest.mark.parametrize(
    "line, warning",
    [
        (rec(instance=5), "bad instance"),
        (rec(instance={"a": 1}), "bad instance"),
        (rec().replace('"svc"', '"svc", "instance": "\\udc00"'), "bad instance"),  # lone surrogate
        (rec(endpoint=[]), "bad endpoint"),
        (rec(endpoint=False), "bad endpoint"),
        (rec(db_statement=5), "bad db_statement"),
        (rec(db_statement=["x"]), "bad db_statement"),
    ],
)
def test_an_odd_optional_field_is_dropped_with_a_warning(tmp_path, line, warning):
    """An optional field that is odd never costs its event: the field takes its default, the event is counted, and
    a warning names the field (a required field checked after it still rejects, without a warning)."""
    r = read_jsonl(tmp_path, [rec(), line, rec(), line.replace('"latency_ms": 1.5', '"latency_ms": -1')])
    assert r.rows == [row(), row(), row()]
    assert (r.stats.read, r.stats.accepted, r.stats.rejected) == (4, 3, 1)
    assert reasons(r) == ["out of range: latency_ms"] and r.stats.warnings == {warning: 1}


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
              "trace_id": st.one_of(st.none(), st.binary(min_size=16, max_size=16).filter(any).map(bytes.hex),
                                    st.binary(min_size=16, max_size=16).filter(any).map(lambda b: b.hex().upper()),
                                    st.binary(min_size=8, max_size=8).filter(any).map(bytes.hex),  # 64-bit: padded
                                    st.uuids().map(str)),  # (a UUID's digits: never all zero)
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
    "{" + _OK + ',"trace_id":"' + "0" * 32 + '"}', "{" + _OK + ',"trace_id":"' + "g" * 32 + '"}',
    "{" + _OK + ',"trace_id":"abc"}', "{" + _OK + ',"trace_id":' + "1" * 32 + "}", "{" + _OK + ',"trace_id":true}',
    "{" + _OK + ',"trace_id":"' + "a" * 31 + '\u00e9"}', "{" + _OK + ',"trace_id":"' + "ab" * 16 + '"}',
    "{" + _OK + ',"trace_id":"000000066dea322d"}', "{" + _OK + ',"trace_id":"' + "0" * 16 + '"}',
    "{" + _OK + ',"trace_id":"4bf92f35-77b3-4da6-a3ce-929d0e0e4736"}', "{" + _OK + ',"trace_id":""}',
    "{" + _OK + ',"trace_id":"4bf92f3577b34da6-a3ce-929d0e0e4736-"}', "{" + _OK + ',"trace_id":[]}',
    "{" + _OK + ',"trace_id":"' + "a" * 15 + ' "}', "{" + _OK + ',"trace_id":"\\u0034bf92f3577b34da6"}',
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
    path = write_bytes(tmp_path, name, data)
    results = []
    for fast in (True, False):
        with native.disabled(*(() if fast else ("columnar",))):
            results.append(read([path], tmp_path, batch_rows=batch_rows))
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
    assert rejects == [] and batch.equals(expected)
    traced = any('"trace_id": "' in x or '"trace_id":"' in x for x in lines)
    assert batch.schema.equals(batch_schema([TRACE_ID]) if traced else EVENT_SCHEMA)


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
    batch, rejects, warnings = fast
    assert warnings == {}
    assert batch.to_pylist() == [row(), row()]
    assert [(line, reason) for line, _, reason in rejects] == [
        (12, "bad value: service"), (13, "out of range: latency_ms"), (14, "out of range: ts"),
        (15, "missing field: ts"), (16, "missing field: service"),
    ]  # fmt: skip
    assert_same(*read_both_paths(tmp_path, b"".join(chunk), "in.jsonl", 65536))


@HYPO
@given(st.lists(MIXED_LINE, max_size=24), st.integers(1, 8), st.sampled_from([b"\n", b"\r\n"]), st.booleans(),
       st.booleans())  # fmt: skip
def test_read_range_equals_per_line_path(lines, batch_rows, ending, final_newline, dictionaries):
    """JsonlBlocks.read_range (the workers' reader: scanner straight out of the part's bytes, else the block cut
    out; the scanner's strings kept dictionary-encoded or not) gives the per-line path's blocks, rows, rejects and
    line numbers."""
    from drainpipe.inputs import RejectList, Sink
    from drainpipe.inputs.formats.jsonl_format import JsonlBlocks

    encoded = [x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass") for x in lines]
    data = ending.join(encoded) + (ending if final_newline and encoded else b"")

    def blocks(fast: bool) -> tuple[list, list, ReadStats]:
        stats, rejects, out = ReadStats(), RejectList(), []
        reader, begin, lineno = JsonlBlocks(dictionaries and fast), 0, 0
        with native.disabled(*(() if fast else ("columnar",))):
            while begin < len(data):
                begin, n, batch = reader.read_range(data, begin, batch_rows, lineno, Sink("x", stats, rejects),
                                                    data.isascii())  # fmt: skip
                lineno += n
                out.append((lineno, None if batch is None else batch.to_pylist()))
        return out, rejects.rows, stats

    fast, slow = blocks(True), blocks(False)
    assert fast[0] == slow[0] and fast[1] == slow[1] and fast[2] == slow[2]


@HYPO
@given(st.lists(MIXED_LINE, max_size=24), st.sampled_from([b"\n", b"\r\n"]), st.booleans())
def test_ndjson_bodies_fast_path_equals_per_line_path(lines, ending, final_newline):
    """An HTTP body of JSON Lines (validate_json_lines) gives the same batch, rejects and counts with the
    columnar fast path (the C scanner, and pyarrow alone as where it is not built) as line by line."""
    from drainpipe.inputs import validate_json_lines

    encoded = [x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass") for x in lines]
    data = ending.join(encoded) + (ending if final_newline and encoded else b"")
    results = []
    for off in ((), ("jsonscan",), ("columnar",)):
        with native.disabled(*off):
            stats = ReadStats()
            batch, rejects = validate_json_lines(data, stats)
        results.append((batch, rejects, stats))
    *fast, (batch, rejects, stats) = results
    for fast_batch, fast_rejects, fast_stats in fast:
        assert fast_batch.equals(batch) and fast_batch.schema.equals(batch.schema)
        assert fast_rejects == rejects and fast_stats == stats
    assert batch.schema.equals(EVENT_SCHEMA) or batch.schema.equals(batch_schema([TRACE_ID]))


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
    with native.disabled("columnar"):
        reader = JsonlBlocks()
        for index, k in enumerate(range(0, len(whole), batch_rows)):
            batch = reader.read(whole[k : k + batch_rows], k, Sink("x", want_stats, want_rejects))
            if batch is not None:
                want.append((index, batch.to_pylist()))

    stats, rejects = ReadStats(), RejectList()
    old = events.READ_BYTES
    events.READ_BYTES = read_bytes
    try:
        stream = read_jsonl_stream(io.BytesIO(data), growable, batch_rows, Sink("x", stats, rejects))
        got, consumed, count = [], 0, 0
        for index, batch, consumed_now, count_now in stream:
            consumed, count = consumed_now, count_now  # after the last block: the whole read
            if batch is not None:
                got.append((index, batch.to_pylist()))
    finally:
        events.READ_BYTES = old
    assert got == want
    assert rejects.rows == want_rejects.rows and stats == want_stats
    assert (consumed, count) == (sum(map(len, whole)), len(whole))


@given(
    st.lists(
        st.tuples(st.sampled_from(["svc-a", "svc-b", "", None, 7]), st.sampled_from(["i-1", "i-2", "", 7, None])),
        min_size=1,
        max_size=40,
    ),
    st.integers(0, 3),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_messages_read_for_aggregation_keep_the_scanners_codes_and_the_same_values(fields, bad) -> None:
    """JSON message values read with ``dictionaries`` (what an aggregating Spark task asks for) give the same
    events, rejects and warnings as a plain read, string columns dictionary-encoded where the scanner gave them so;
    odd values still reject (an empty or non-text service, a line that is not JSON) or warn (a non-text instance:
    the field is dropped, the event kept) the same way."""
    from drainpipe.inputs.messages import json_values
    from drainpipe.pipeline.aggregate import aggregate_batch
    from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS

    values: list[bytes | None] = [
        rec(service=s, instance=inst, endpoint=f"/e{i % 3}", ts=T0 + i * 1_000).encode()
        for i, (s, inst) in enumerate(fields)
    ]
    values[:bad] = [b"{not json"] * min(bad, len(values))
    plain, plain_rejects = json_values(values)
    coded, coded_rejects = json_values(values, dictionaries=True)
    assert plain_rejects == coded_rejects
    assert plain.warnings == coded.warnings
    assert coded.rows.schema.names == plain.rows.schema.names
    for column, plain_column in zip(coded.rows.columns, plain.rows.columns):
        decoded = column.dictionary_decode() if pa.types.is_dictionary(column.type) else column
        assert decoded.equals(plain_column)
    canonical = not bad and all(s in ("svc-a", "svc-b") and (i is None or isinstance(i, str)) for s, i in fields)
    if native.jsonscan is not None and canonical:  # (a block of canonical types is the scanner's)
        assert any(pa.types.is_dictionary(c.type) for c in coded.rows.columns)
    if any(isinstance(i, int) for _, i in fields[bad:]) and all(s in ("svc-a", "svc-b") for s, _ in fields[bad:]):
        assert coded.warnings  # (a non-text instance: warned, its event kept)
    for a, b in zip(aggregate_batch(plain.rows, DEFAULT_DEFINITIONS), aggregate_batch(coded.rows, DEFAULT_DEFINITIONS)):
        keys = [("entity", "ascending"), ("bucket", "ascending")]
        assert a.table.sort_by(keys).equals(b.table.sort_by(keys)), a.definition.name
