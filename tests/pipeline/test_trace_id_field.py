"""The optional ``trace_id`` of an event (for exemplars): the same events with valid, malformed and absent trace ids,
written as JSON Lines, CSV (read in columns and by the per-record reference) and Parquet (hex text and the 16 bytes),
give the same accepted rows and the same rejects with the same reasons in every format."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import drainpipe.inputs.formats.csv_format as csv_format
from drainpipe.inputs.schema import TRACE_ID
from testlib import read, read_jsonl, write_bytes, write_parquet

T0 = 1_790_000_000_000
TRACE = st.one_of(
    st.none(),
    st.binary(min_size=16, max_size=16).filter(any).map(bytes.hex),
    st.binary(min_size=16, max_size=16).filter(any).map(lambda b: b.hex().upper()),
    st.sampled_from(["0" * 32, "g" * 32, "abc", "a" * 33, "a" * 31 + "\u00e9", " " + "a" * 31]),
)
EVENTS = st.lists(st.tuples(st.integers(0, 10**6), st.floats(0, 1e4), TRACE), max_size=25)


def _records(events: list[tuple]) -> list[dict]:
    out = []
    for i, (offset, latency, trace) in enumerate(events):
        record = {"ts": T0 + offset, "service": f"s{i % 3}", "endpoint": "/e", "latency_ms": latency}
        if trace is not None:
            record[TRACE_ID] = trace
        out.append(record)
    return out


def _csv(records: list[dict]) -> bytes:
    text = io.StringIO()
    writer = csv.DictWriter(text, ["ts", "service", "endpoint", "latency_ms", TRACE_ID], lineterminator="\n")
    writer.writeheader()
    for r in records:
        writer.writerow({**r, "latency_ms": repr(r["latency_ms"])})
    return text.getvalue().encode()


def _outcome(result) -> tuple[list, list]:
    rows = [{**r, TRACE_ID: r.get(TRACE_ID)} for r in result.rows]  # (a batch without the column: no trace ids)
    return rows, [(x["line"], x["reason"]) for x in result.rejects]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(EVENTS)
def test_every_format_keeps_and_checks_trace_ids_alike(tmp_path: Path, events: list[tuple]) -> None:
    records = _records(events)
    want = _outcome(read_jsonl(tmp_path, [json.dumps(r) for r in records]))
    for columns in (True, False):  # the CSV block in columns, and the per-record reference
        csv_format._COLUMNS = columns
        try:
            got = _outcome(read([write_bytes(tmp_path, "in.csv", _csv(records))], tmp_path))
        finally:
            csv_format._COLUMNS = True
        rows, rejects = got
        assert rows == want[0] and [r[1] for r in rejects] == [r[1] for r in want[1]], columns
    # Parquet: the hex text, and (valid ids only: bytes cannot be malformed text) the 16 bytes themselves
    table = pa.table({"ts": [r["ts"] for r in records], "service": [r["service"] for r in records],
                      "endpoint": ["/e"] * len(records), "latency_ms": [r["latency_ms"] for r in records],
                      TRACE_ID: pa.array([r.get(TRACE_ID) for r in records], pa.string())})  # fmt: skip
    rows, rejects = _outcome(read([write_parquet(tmp_path, table)], tmp_path))
    assert rows == want[0] and [r[1] for r in rejects] == [r[1] for r in want[1]]
    valid = [r for r in records if _valid(r.get(TRACE_ID))]
    raw = pa.table({"ts": [r["ts"] for r in valid], "service": [r["service"] for r in valid],
                    "endpoint": ["/e"] * len(valid), "latency_ms": [r["latency_ms"] for r in valid],
                    TRACE_ID: pa.array([bytes.fromhex(r[TRACE_ID]) if TRACE_ID in r else None for r in valid],
                                       pa.binary(16))})  # fmt: skip
    rows, rejects = _outcome(read([write_parquet(tmp_path, raw, "raw.parquet")], tmp_path))
    assert rows == [r for r in want[0]] and rejects == []


def _valid(trace: str | None) -> bool:
    if trace is None:
        return True
    try:
        return len(trace) == 32 and trace.isascii() and bytes.fromhex(trace) != bytes(16) and " " not in trace
    except ValueError:
        return False


@pytest.mark.parametrize(
    "trace, reason", [("0" * 32, "bad value: trace_id"), ("xyz", "bad value: trace_id"), (12, "bad value: trace_id")]
)
def test_a_malformed_trace_id_rejects_its_event(tmp_path: Path, trace, reason) -> None:
    line = json.dumps({"ts": T0, "service": "s", "latency_ms": 1.0, TRACE_ID: trace})
    result = read_jsonl(tmp_path, [line, json.dumps({"ts": T0, "service": "s", "latency_ms": 2.0})])
    assert [x["reason"] for x in result.rejects] == [reason] and len(result.rows) == 1
    assert TRACE_ID not in result.batches[0].schema.names  # the accepted event has none: no column
