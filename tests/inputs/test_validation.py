"""The validation rules (inputs/validation.py): one scalar and one columnar core, the same reasons in every format,
and no input that crashes a reader."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drainpipe.errors import Rejected
from drainpipe.inputs.formats.csv_format import NUMBER_RE
from drainpipe.inputs.schema import FIELDS, TRACE_ID, TS_MAX, TS_MIN
from drainpipe.inputs.validation import check_fields, validate_columns, validate_values, warning_counts
from testlib import Result, read, read_csv, read_jsonl, write_parquet

T0 = 1_790_000_000_000
HYPO = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


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


def _json_line(record: dict) -> str:
    """A record as a JSON line, an infinite latency written as ``1e999`` (JSON has no Infinity; ``1e999`` parses to
    it). Only that value: a string that says "Infinity" stays as it is (replacing the word everywhere had turned a
    service named "Infinity" into "1e999", which hypothesis found)."""
    latency = record["latency_ms"]
    if latency is None or not math.isinf(latency):
        return json.dumps(record, ensure_ascii=False)
    line = json.dumps({**record, "latency_ms": None}, ensure_ascii=False)
    return line.replace('"latency_ms": null', f'"latency_ms": {"-" if latency < 0 else ""}1e999')


@HYPO
@given(st.lists(PARQUET_RECORDS, max_size=12))
def test_json_and_parquet_agree(tmp_path, records):
    """The columnar core gives the same rows and reasons as the row core."""
    json_lines = [_json_line(r) for r in records]
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


# ------------------------------------------------------------------------- odd optional fields: dropped, warned

HEXISH = st.text(st.sampled_from("0123456789abcdefABCDEF-g \u00e9"), max_size=40)
TRACE_TEXT = st.one_of(
    st.none(),
    HEXISH,
    st.binary(min_size=16, max_size=16).map(bytes.hex),
    st.binary(min_size=8, max_size=8).map(bytes.hex),
    st.uuids().map(str),
    st.sampled_from(["0" * 32, "0" * 16, "00000000-0000-0000-0000-000000000000", "", "abc"]),
    TEXT,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(TRACE_TEXT, st.booleans()), max_size=20))
def test_trace_id_cores_agree(cells):
    """The scalar and the columnar cores keep, pad and drop the same trace ids, with the same warnings (of accepted
    rows only: a row rejected for another field counts none)."""
    warnings: Counter = Counter()
    want = []
    for trace, ok in cells:
        try:
            row = validate_values(T0, "s", "", "", 1.0 if ok else -1.0, True, None, trace, warnings=warnings)
        except Rejected:
            continue
        want.append(row[7] if len(row) > 7 else None)
    batch = pa.RecordBatch.from_pydict({
        "ts": [T0] * len(cells), "service": ["s"] * len(cells),
        "latency_ms": [1.0 if ok else -1.0 for _, ok in cells], TRACE_ID: pa.array([t for t, _ in cells], pa.string()),
    })  # fmt: skip
    canonical, rejected, warned = validate_columns(batch)
    if rejected is not None:
        canonical = canonical.filter(pa.array(~rejected[0]))
    got = canonical.column(TRACE_ID).to_pylist() if TRACE_ID in canonical.schema.names else [None] * len(want)
    assert got == want and warning_counts(warned) == warnings
    assert (TRACE_ID in canonical.schema.names) == any(t is not None for t in want)  # no column without an id


@pytest.mark.parametrize("name", ["instance", "endpoint", "db_statement"])
@pytest.mark.parametrize(
    "values, arrow",
    [([5, None, 7], pa.int64()), ([True, False, None], pa.bool_()), ([1.5, None, 2.5], pa.float64()),
     ([b"ok", b"\xff", None], pa.binary())],
)  # fmt: skip
def test_odd_optional_fields_cores_agree(name, values, arrow):
    """An optional field of another type (or bytes that are not UTF-8) is dropped with a warning by both cores, and
    the event kept; its default takes its place."""
    warnings: Counter = Counter()
    want = []
    for value in values:
        if isinstance(value, bytes):  # a scalar record holds text: what a reader decodes of the bytes, or no text
            try:
                value = value.decode()
            except UnicodeDecodeError:
                value = 0
        fields = {"instance": None, "endpoint": None, "db_statement": None, name: value}
        want.append(validate_values(T0, "s", fields["instance"], fields["endpoint"], 1.0, True,
                                    fields["db_statement"], warnings=warnings))  # fmt: skip
    batch = pa.RecordBatch.from_pydict({"ts": [T0] * 3, "service": ["s"] * 3, "latency_ms": [1.0] * 3,
                                        name: pa.array(values, arrow)})  # fmt: skip
    canonical, rejected, warned = validate_columns(batch)
    assert rejected is None and [tuple(r.values()) for r in canonical.to_pylist()] == want
    assert (
        warning_counts(warned)
        == warnings
        == {f"bad {name}": sum(v is not None for v in values) - (arrow == pa.binary())}
    )
