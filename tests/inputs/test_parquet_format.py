"""Parquet (inputs/formats/parquet_format.py): columnar validation, row numbers, dictionary-encoded strings, parts
by row group."""

from __future__ import annotations

import datetime as dt
import gzip

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drainpipe.errors import InputError
from drainpipe.inputs import read_events
from drainpipe.inputs.rejects import DeadLetter, ReadStats
from drainpipe.inputs.schema import EVENT_SCHEMA
from testlib import T0, ms, read, reasons, rec, row, write_bytes, write_parquet

# ------------------------------------------------------------------------------------------- Parquet


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


def test_a_rejected_row_holding_a_value_python_has_no_type_for_is_dead_lettered_as_text(tmp_path):
    """Epoch milliseconds in a seconds column (year 58,000), a date past Python's: the dead letter's ``raw`` took the
    row through to_pylist, whose OverflowError escaped as a traceback (drainpipe run exited 70). Such values go
    as text; the other columns as before."""
    table = pa.table(
        {
            "ts": pa.array([T0 // 1000, 1795255200000, T0 // 1000], pa.timestamp("s")),
            "service": ["a", "a", None],
            "latency_ms": [1.0, 1.0, 1.0],
            "db_statement": pa.array([None, None, (1 << 31) - 1], pa.date32()),
        }
    )
    r = read([write_parquet(tmp_path, table)], tmp_path)
    assert len(r.rows) == 1 and [x["line"] for x in r.rejects] == [2, 3]
    assert (
        r.rejects[0]["raw"]["ts"].startswith("<value out of range: 1795255200000")
        and r.rejects[0]["raw"]["service"] == "a"
    )
    assert (
        r.rejects[1]["raw"]["service"] is None
        and r.rejects[1]["raw"]["db_statement"] == "<value out of range: 2147483647>"
    )


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
    # an optional field's odd value (an integer instance, a statement that is not UTF-8) is dropped with a warning
    assert r.rows == [row(service="a", latency_ms=1.0, db_statement="q"), row(service="a", latency_ms=1.0,
                      status=False), row(service="a", latency_ms=1.0)]  # fmt: skip
    assert [(x["line"], x["reason"]) for x in r.rejects] == [(3, "out of range: ts"), (4, "bad value: status")]
    assert r.stats.warnings == {"bad instance": 1, "bad db_statement": 1}


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
                      for b in parts.read_part(part, sink, dictionaries=keep)]  # fmt: skip
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
        ts = [t for part in plan for b in parts.read_part(part, sink) for t in b.rows.column("ts").to_pylist()]
    assert ts == list(range(T0 + skip * batch_rows, T0 + rows))


def _events_table(begin: int, size: int) -> pa.Table:
    return pa.table(
        {
            "ts": pa.array(range(T0 + begin, T0 + begin + size), pa.int64()),
            "service": pa.array(["s"] * size),
            "latency_ms": pa.array([1.0] * size),
        }
    )
