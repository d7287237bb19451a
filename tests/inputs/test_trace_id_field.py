"""The optional ``trace_id`` of an event (for exemplars). It never costs its event: 32 hex digits are kept, 16 are
left-padded with zeros (W3C's rule for 64-bit ids), a UUID with dashes is its 32 digits; anything else (all zeros,
empty, a number, a bool, an object, a list, a wrong length, non-hex) is dropped, the event accepted and counted with
the warning ``bad trace_id``. The same on every path: JSON Lines (the C scanner, pyarrow's reader where it is not
built, the per-line reference), CSV (in columns and by the reference), Parquet (hex text, or 8 or 16 bytes), HTTP
JSON bodies (an array, NDJSON); and the stored metrics are those of the same events without trace ids."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drainpipe import native
from drainpipe.inputs import ReadStats, validate_json_lines, validate_records
from drainpipe.inputs.schema import TRACE_ID
from drainpipe.pipeline.definitions import default_definitions, with_exemplars
from drainpipe.pipeline.run import run_local
from testlib import Result, read, read_jsonl, stored, write_bytes, write_parquet

T0 = 1_790_000_000_000
WARNING = "bad trace_id"
_HEX = "[0-9a-fA-F]"


def expected(value: Any) -> bytes | None:
    """The 16 bytes an event keeps of a trace id, by the documented rule (written out again, with regular
    expressions: independent of the code under test); None: dropped."""
    if not isinstance(value, str):
        return None
    if re.fullmatch(f"{_HEX}{{16}}", value):
        value = "0" * 16 + value
    elif re.fullmatch(f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}", value):
        value = value.replace("-", "")
    if not re.fullmatch(f"{_HEX}{{32}}", value) or int(value, 16) == 0:
        return None
    return bytes.fromhex(value)


GOOD = "4bf92f3577b34da6a3ce929d0e0e4736"
#: every shape the issue names (and a few more), as JSON values
SHAPES: list[Any] = [
    GOOD, GOOD.upper(), "4Bf92F3577b34dA6A3ce929D0e0e4736",  # 32 digits, either case
    "000000066dea322d", "A3CE929D0E0E4736",  # 64-bit ids (Zipkin/B3): padded
    "4bf92f35-77b3-4da6-a3ce-929d0e0e4736", "4BF92F35-77B3-4DA6-A3CE-929D0E0E4736",  # UUIDs: their digits
    "0" * 32, "0" * 16, "00000000-0000-0000-0000-000000000000",  # all zeros: W3C's invalid id
    "", 0, 12, 66_000_000_000_000_000, 1.5, True, False, {"id": GOOD}, [GOOD], [],  # not text
    GOOD[:31], GOOD + "a", GOOD[:15], GOOD[:17], "g" * 32, "x" * 16, GOOD[:31] + "\u00e9", " " + GOOD[:31],
    GOOD[:16] + " " * 16, "4bf92f3577b3-4da6-a3ce-929d0e0e4736-", "4bf92f35_77b3_4da6_a3ce_929d0e0e4736",
    "4bf92f35-77b3-4da6-a3ce-929d0e0e473g", "-" * 36, "0x" + GOOD[:30], "abc",
]  # fmt: skip
TEXT_SHAPES = [s for s in SHAPES if isinstance(s, str)]


def _event(latency: float, trace: Any = ...) -> dict:
    event: dict[str, Any] = {"ts": T0, "service": "svc", "endpoint": "/e", "latency_ms": latency}
    if trace is not ...:
        event[TRACE_ID] = trace
    return event


def _outcome(result: Result) -> tuple[list, int, dict]:
    """(each accepted row's trace id, rejects, warnings)."""
    return [r.get(TRACE_ID) for r in result.rows], len(result.rejects), dict(result.stats.warnings)


def _want(trace: Any) -> tuple[list, int, dict]:
    """Two accepted events (the second without a trace id), no reject, a warning when the id is dropped."""
    kept = expected(trace)
    return [kept, None], 0, ({} if kept is not None or trace is None else {WARNING: 1})


@pytest.mark.parametrize("trace", [*SHAPES, None], ids=repr)
@pytest.mark.parametrize("path", ["scanner", "pyarrow", "per-line"])
def test_json_lines_keep_or_drop_each_shape(tmp_path: Path, trace: Any, path: str) -> None:
    # pyarrow: as on Spark executors, where the C scanner is not built
    off = {"scanner": (), "pyarrow": ("jsonscan",), "per-line": ("columnar",)}[path]
    with native.disabled(*off):
        result = read_jsonl(tmp_path, [json.dumps(_event(1.0, trace)), json.dumps(_event(2.0))])
    assert _outcome(result) == _want(trace)
    assert (result.stats.read, result.stats.accepted, result.stats.rejected) == (2, 2, 0)


@pytest.mark.parametrize("trace", [*SHAPES, None], ids=repr)
def test_http_json_bodies_keep_or_drop_each_shape(trace: Any) -> None:
    events = [_event(1.0, trace), _event(2.0)]
    for body in (events, b"\n".join(json.dumps(e).encode() for e in events)):  # an array, NDJSON
        stats = ReadStats()
        batch, rejects = validate_records(body, stats) if isinstance(body, list) else validate_json_lines(body, stats)
        traces = batch.column(TRACE_ID).to_pylist() if TRACE_ID in batch.schema.names else [None, None]
        kept, _, warnings = _want(trace)
        assert (traces, rejects, dict(stats.warnings)) == (kept, [], warnings)
        assert (stats.read, stats.accepted, stats.rejected) == (2, 2, 0)


def _csv(events: list[dict]) -> bytes:
    text = io.StringIO()
    writer = csv.DictWriter(text, ["ts", "service", "endpoint", "latency_ms", TRACE_ID], lineterminator="\n")
    writer.writeheader()
    writer.writerows(events)
    return text.getvalue().encode()


@pytest.mark.parametrize("trace", [*TEXT_SHAPES, None], ids=repr)
@pytest.mark.parametrize("columns", [True, False])
def test_csv_keeps_or_drops_each_shape(tmp_path: Path, trace: str | None, columns: bool) -> None:
    """A CSV cell is text (an empty cell is none: no warning); in columns (the C pass) and by the reference."""
    with native.disabled(*(() if columns else ("columnar",))):
        result = read([write_bytes(tmp_path, "in.csv", _csv([_event(1.0, trace), _event(2.0)]))], tmp_path)
    assert _outcome(result) == _want(trace or None)


@pytest.mark.parametrize("trace", [*TEXT_SHAPES, None], ids=repr)
def test_parquet_hex_text_keeps_or_drops_each_shape(tmp_path: Path, trace: str | None) -> None:
    table = pa.table({"ts": [T0, T0], "service": ["svc", "svc"], "endpoint": ["/e", "/e"], "latency_ms": [1.0, 2.0],
                      TRACE_ID: pa.array([trace, None], pa.string())})  # fmt: skip
    assert _outcome(read([write_parquet(tmp_path, table)], tmp_path)) == _want(trace)


RAW = bytes.fromhex(GOOD)


@pytest.mark.parametrize(
    "raw, kept",
    [
        (RAW, RAW), (RAW[8:], bytes(8) + RAW[8:]),  # 16 bytes; 8 (a 64-bit id), left-padded
        (bytes(16), None), (bytes(8), None), (b"", None), (RAW[:4], None), (RAW[:12], None), (RAW + RAW[:4], None),
        (RAW[:15], None), (RAW[:9], None), (None, None),
    ],
)  # fmt: skip
@pytest.mark.parametrize("kind", ["binary", "large_binary"])
def test_parquet_bytes_keep_8_or_16_and_drop_the_rest(tmp_path: Path, raw: bytes | None, kept: bytes | None,
                                                      kind: str) -> None:  # fmt: skip
    table = pa.table({"ts": [T0, T0], "service": ["svc", "svc"], "endpoint": ["/e", "/e"], "latency_ms": [1.0, 2.0],
                      TRACE_ID: pa.array([raw, None], getattr(pa, kind)())})  # fmt: skip
    result = read([write_parquet(tmp_path, table)], tmp_path)
    warned = {} if kept is not None or raw is None else {WARNING: 1}
    assert _outcome(result) == ([kept, None], 0, warned)


@pytest.mark.parametrize("size, kept", [(16, RAW), (8, bytes(8) + RAW[:8])])
def test_parquet_fixed_size_ids(tmp_path: Path, size: int, kept: bytes) -> None:
    ids = pa.array([RAW[:size], bytes(size), None], pa.binary(size))
    table = pa.table({"ts": [T0] * 3, "service": ["svc"] * 3, "latency_ms": [1.0, 2.0, 3.0], TRACE_ID: ids})
    assert _outcome(read([write_parquet(tmp_path, table)], tmp_path)) == ([kept, None, None], 0, {WARNING: 1})


# ------------------------------------------------------------------------------------------- every format alike

TRACE = st.one_of(
    st.none(),
    st.binary(min_size=16, max_size=16).map(bytes.hex),
    st.binary(min_size=16, max_size=16).map(lambda b: b.hex().upper()),
    st.binary(min_size=8, max_size=8).map(bytes.hex),
    st.uuids().map(str),
    st.sampled_from(TEXT_SHAPES),
    st.text(st.sampled_from("0123456789abcdefABCDEFg- "), max_size=40),
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


def _rows(result: Result) -> list[dict]:
    return [{**r, TRACE_ID: r.get(TRACE_ID)} for r in result.rows]  # (a batch without the column: no trace ids)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(EVENTS)
def test_every_format_keeps_and_drops_trace_ids_alike(tmp_path: Path, events: list[tuple]) -> None:
    records = _records(events)
    want = read_jsonl(tmp_path, [json.dumps(r) for r in records])
    assert want.rejects == [] and want.stats.accepted == len(records)
    assert [r[TRACE_ID] for r in _rows(want)] == [expected(r.get(TRACE_ID)) for r in records]
    dropped = sum(1 for r in records if r.get(TRACE_ID) is not None and expected(r[TRACE_ID]) is None)
    assert dict(want.stats.warnings) == ({WARNING: dropped} if dropped else {})
    # CSV: an empty cell is no trace id (no warning)
    nonempty = [r if r.get(TRACE_ID) != "" else {k: v for k, v in r.items() if k != TRACE_ID} for r in records]
    want_csv = read_jsonl(tmp_path, [json.dumps(r) for r in nonempty])
    for columns in (True, False):  # the CSV block in columns, and the per-record reference
        with native.disabled(*(() if columns else ("columnar",))):
            rows = [{**r, "latency_ms": repr(r["latency_ms"])} for r in records]
            got = read([write_bytes(tmp_path, "in.csv", _csv(rows))], tmp_path)
        assert _rows(got) == _rows(want_csv) and got.rejects == [], columns
        assert got.stats.warnings == want_csv.stats.warnings, columns
    # Parquet: the hex text, and the ids as bytes (their 16 or 8 bytes, or hex's bytes when it is hex)
    table = pa.table({"ts": [r["ts"] for r in records], "service": [r["service"] for r in records],
                      "endpoint": ["/e"] * len(records), "latency_ms": [r["latency_ms"] for r in records],
                      TRACE_ID: pa.array([r.get(TRACE_ID) for r in records], pa.string())})  # fmt: skip
    got = read([write_parquet(tmp_path, table)], tmp_path)
    assert _rows(got) == _rows(want) and got.rejects == [] and got.stats.warnings == want.stats.warnings
    raw = [_bytes(r.get(TRACE_ID)) for r in records]
    table = table.set_column(table.schema.get_field_index(TRACE_ID), TRACE_ID, pa.array(raw, pa.binary()))
    got = read([write_parquet(tmp_path, table, "raw.parquet")], tmp_path)
    kept = [None if b is None else (bytes(8) + b if len(b) == 8 else b) if len(b) in (8, 16) and any(b) else None
            for b in raw]  # fmt: skip
    assert [r[TRACE_ID] for r in _rows(got)] == kept and got.rejects == []
    assert got.stats.warnings == ({WARNING: n} if (n := sum(b is not None and k is None for b, k in zip(raw, kept)))
                                  else {})  # fmt: skip


def _bytes(trace: str | None) -> bytes | None:
    """A trace id as the bytes a Parquet binary column would hold: hex decoded, other text as its UTF-8."""
    if trace is None:
        return None
    try:
        return bytes.fromhex(trace.replace("-", "").replace(" ", "x"))
    except ValueError:
        return trace.encode()


# ------------------------------------------------------------------------------------------- the stored metrics


def _write(tmp_path: Path, fmt: str, records: list[dict], name: str) -> Path:
    if fmt == "jsonl":
        return write_bytes(tmp_path, f"{name}.jsonl", "".join(json.dumps(r) + "\n" for r in records).encode())
    if fmt == "csv":
        text = [{**r, "latency_ms": repr(r["latency_ms"])} for r in records]
        return write_bytes(tmp_path, f"{name}.csv", _csv(text))
    table = pa.Table.from_pylist(records, schema=pa.schema([
        ("ts", pa.int64()), ("service", pa.string()), ("endpoint", pa.string()), ("latency_ms", pa.float64()),
        *([(TRACE_ID, pa.string())] if any(TRACE_ID in r for r in records) else [])]))  # fmt: skip
    path = tmp_path / f"{name}.parquet"
    pq.write_table(table, path)
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_the_stored_metrics_are_those_of_the_events_without_trace_ids(tmp_path: Path, fmt: str) -> None:
    """Every shape, on events over two services, minutes and endpoints, with exemplars on: the same stored metric
    values as the same events without any trace id (and every event counted)."""
    shapes = TEXT_SHAPES if fmt != "jsonl" else SHAPES
    traced = [{"ts": T0 + i * 7_919 % 180_000, "service": f"s{i % 2}", "endpoint": f"/e{i % 3}",
               "latency_ms": float(i * 37 % 900), TRACE_ID: shapes[i % len(shapes)]}
              for i in range(300)]  # fmt: skip
    if fmt == "csv":
        traced = [r if r[TRACE_ID] else {k: v for k, v in r.items() if k != TRACE_ID} for r in traced]
    plain = [{k: v for k, v in r.items() if k != TRACE_ID} for r in traced]
    definitions = with_exemplars(default_definitions())
    urls = []
    for name, records in (("traced", traced), ("plain", plain)):
        url = f"duckdb:///{tmp_path / name}.duckdb"
        summary = run_local([str(_write(tmp_path, fmt, records, name))], definitions=definitions, store_url=url,
                            workers=0)  # fmt: skip
        assert (summary.read, summary.accepted, summary.rejected) == (300, 300, 0)
        dropped = sum(1 for r in records if TRACE_ID in r and expected(r[TRACE_ID]) is None)
        assert summary.warnings == ({WARNING: dropped} if dropped else {})
        urls.append(url)
    assert dropped == 0 and summary.warnings == {}  # (the plain events)
    traced_rows, traced_topn = stored(urls[0], definitions)
    plain_rows, _ = stored(urls[1], definitions)
    assert traced_rows == plain_rows and len(plain_rows) > 50
    kept = {row[4] for row in traced_topn["exemplars"]}  # the stored exemplars hold the kept ids only
    assert kept and kept <= {t.hex() for r in traced if (t := expected(r.get(TRACE_ID))) is not None}


def test_kafka_messages_keep_or_drop_each_shape() -> None:
    """``consume`` (and Spark's Kafka stream) decode JSON messages as one NDJSON block: the same rule, and the
    warnings travel on the batch to the consumer's stats."""
    from drainpipe.inputs.endpoints import EndpointRules
    from drainpipe.inputs.messages import decode_values
    from drainpipe.inputs.spans import SpanMapping

    values = [json.dumps(_event(1.0, trace)).encode() for trace in SHAPES] + [None]
    batch, rejects = decode_values(values, "json", SpanMapping(), EndpointRules())
    assert rejects == [(len(SHAPES), None, "no value (a tombstone)")] and batch.num_rows == len(SHAPES)
    assert batch.trace_ids() is not None and batch.trace_ids().to_pylist() == [expected(t) for t in SHAPES]
    assert dict(batch.warnings) == {WARNING: sum(expected(t) is None for t in SHAPES)}
