"""`drainpipe run` tells the truth: the exit status and one line for each way data can fail to reach the store,
files that grow are read once, and rejected records are never destroyed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pytest

from drainpipe.cli import EXIT_NOT_STORED, EXIT_USER, main
from drainpipe.pipeline.store import open_store
from testlib import T0


def line(i: int, service: str = "svc") -> str:
    return json.dumps({"ts": T0 + i * 1000, "service": service, "latency_ms": 1.0 + i % 7}) + "\n"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["run", "-q", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def stored_events(url: str) -> int:
    """Events in the store, by the minute cpm (= count per minute) of every service."""
    store = open_store(url)
    try:
        return round(sum(row[5] for row in store.query(metric="service_cpm", granularity="minute")))
    finally:
        store.close()


# ------------------------------------------------------------------------------------------------ exit statuses


def test_a_definition_that_conflicts_with_the_store_is_refused_before_reading(tmp_path, capsys) -> None:
    data = tmp_path / "e.jsonl"
    data.write_text("".join(line(i) for i in range(100)))
    url = f"duckdb:///{tmp_path}/s.duckdb"
    assert run(capsys, "--input", str(data), "--store", url)[0] == 0
    toml = tmp_path / "m.toml"
    toml.write_text('[[metric]]\nname = "service_cpm"\nscope = "service"\nfunction = "count"\n')
    more = tmp_path / "more.jsonl"
    more.write_text("".join(line(i) for i in range(100, 150)))
    code, out, err = run(capsys, "--input", str(more), "--store", url, "--metrics", str(toml))
    assert code == EXIT_USER and out == "" and err.count("\n") == 1
    assert "'service_cpm' is stored with a different definition" in err and "Traceback" not in err
    assert stored_events(url) == 100  # nothing of the refused run


def test_a_store_that_refuses_the_writes_exits_1_saying_what_was_not_stored(tmp_path, capsys) -> None:
    url = f"duckdb:///{tmp_path}/s.duckdb"
    open_store(url).close()
    with duckdb.connect(str(tmp_path / "s.duckdb")) as con:  # a real constraint the store's writes violate
        con.execute("DROP TABLE metric_values")
        con.execute("""CREATE TABLE metric_values (metric VARCHAR NOT NULL, entity VARCHAR NOT NULL,
            granularity VARCHAR NOT NULL, time_bucket TIMESTAMPTZ NOT NULL, label VARCHAR NOT NULL,
            value DOUBLE PRECISION NOT NULL CHECK (value < 0))""")
    data = tmp_path / "e.jsonl"
    data.write_text("".join(line(i) for i in range(500)))
    code, out, err = run(capsys, "--input", str(data), "--store", url)
    assert code == EXIT_NOT_STORED and "read 500 = accepted 500" in out
    assert err.startswith("drainpipe: error: not stored: 500 of 500 accepted events (") and err.count("\n") == 1
    assert "CHECK constraint" in err or "Constraint" in err


def test_an_unreadable_file_stops_the_run_with_exit_2_and_the_count_of_what_was_stored(tmp_path, capsys) -> None:
    good, bad = tmp_path / "a.jsonl", tmp_path / "b.parquet"
    good.write_text("".join(line(i) for i in range(40)))
    bad.write_bytes(b"PAR1 this is not parquet PAR1")
    url = f"duckdb:///{tmp_path}/s.duckdb"
    code, out, err = run(capsys, "--input", str(good), str(bad), "--store", url)
    assert code == EXIT_USER and err.count("\n") == 1 and "cannot read" in err
    assert stored_events(url) == 40


# ------------------------------------------------------------------------------------------------ growing files


def test_a_file_that_grows_is_read_once_and_a_partial_last_line_waits(tmp_path, capsys) -> None:
    log = tmp_path / "app.jsonl"
    url = f"duckdb:///{tmp_path}/s.duckdb"
    log.write_text("".join(line(i) for i in range(10_000)))
    assert run(capsys, "--input", str(log), "--store", url)[0] == 0
    with open(log, "a") as f:
        f.write("".join(line(i) for i in range(10_000, 20_000)))
        f.write(line(20_000)[:-9])  # the writer is in the middle of a line
    code, out, _ = run(capsys, "--input", str(log), "--store", url)
    assert code == 0 and "read 10,000 = accepted 10,000" in out and "partial line" in out
    assert stored_events(url) == 20_000
    with open(log, "a") as f:
        f.write(line(20_000)[-9:])  # the line is complete now
    code, out, _ = run(capsys, "--input", str(log), "--store", url)
    assert code == 0 and "read 1 = accepted 1" in out and stored_events(url) == 20_001
    code, out, _ = run(capsys, "--input", str(log), "--store", url)
    assert code == 0 and "nothing new" in out and stored_events(url) == 20_001


def test_a_rotated_log_is_not_counted_again_and_its_successor_is_new(tmp_path, capsys) -> None:
    url = f"duckdb:///{tmp_path}/s.duckdb"
    log = tmp_path / "app.log.jsonl"
    log.write_text("".join(line(i) for i in range(3_000)))
    assert run(capsys, "--input", str(log), "--store", url)[0] == 0
    os.rename(log, tmp_path / "app.log.1.jsonl")  # rotation: the old file under a new name, a new file
    log.write_text("".join(line(i, "other") for i in range(500)))
    code, out, _ = run(capsys, "--input", str(tmp_path / "app.log*.jsonl"), "--store", url)
    assert code == 0 and "read 500 = accepted 500" in out
    assert stored_events(url) == 3_500


def test_a_csv_that_grows_is_read_once(tmp_path, capsys) -> None:
    url = f"duckdb:///{tmp_path}/s.duckdb"
    csv = tmp_path / "e.csv"
    rows = lambda a, b: "".join(f"{T0 + i * 1000},svc,,,1.5,true,\n" for i in range(a, b))
    csv.write_text("ts,service,instance,endpoint,latency_ms,status,db_statement\n" + rows(0, 100))
    assert run(capsys, "--input", str(csv), "--store", url)[0] == 0
    with open(csv, "a") as f:
        f.write(rows(100, 250))
    code, out, _ = run(capsys, "--input", str(csv), "--store", url)
    assert code == 0 and "read 150 = accepted 150" in out and stored_events(url) == 250


def test_a_file_whose_applied_part_changed_in_place_is_refused(tmp_path, capsys) -> None:
    url = f"duckdb:///{tmp_path}/s.duckdb"
    log = tmp_path / "app.jsonl"
    log.write_text("".join(line(i) for i in range(1_000)))
    assert run(capsys, "--input", str(log), "--store", url)[0] == 0
    with open(log, "r+") as f:  # rewritten in place: same inode, other content
        f.truncate(0)
        f.write("".join(line(i, "rewritten") for i in range(1_200)))
    code, out, err = run(capsys, "--input", str(log), "--store", url)
    assert code == EXIT_USER and out == "" and err.count("\n") == 1 and "changed" in err
    assert stored_events(url) == 1_000


def test_a_growing_file_an_earlier_release_applied_with_sha256_digests_is_resumed_once(tmp_path, capsys) -> None:
    """Stores written before the prefix digests became XXH3-128 hold SHA-256 ones: those files are checked, and
    continued, with SHA-256 (a wrong algorithm would refuse them as rewritten, or re-read them)."""
    import hashlib

    url = f"duckdb:///{tmp_path}/s.duckdb"
    log = tmp_path / "app.jsonl"
    log.write_text("".join(line(i) for i in range(1_000)))
    assert run(capsys, "--input", str(log), "--store", url)[0] == 0
    data = log.read_bytes()
    with duckdb.connect(str(tmp_path / "s.duckdb")) as con:  # the earlier release's digests
        ends = [end for (end,) in con.execute("SELECT end_offset FROM source_progress").fetchall()]
        assert ends and all(len(p) == 32 for (p,) in con.execute("SELECT prefix FROM source_progress").fetchall())
        for end in set(ends):
            con.execute("UPDATE source_progress SET prefix = ? WHERE end_offset = ?",
                        [hashlib.sha256(data[:end]).hexdigest(), end])  # fmt: skip
    with open(log, "a") as f:
        f.write("".join(line(i) for i in range(1_000, 1_300)))
    code, out, _ = run(capsys, "--input", str(log), "--store", url)
    assert code == 0 and "read 300 = accepted 300" in out and stored_events(url) == 1_300
    data = log.read_bytes()
    with duckdb.connect(str(tmp_path / "s.duckdb")) as con:  # continued with SHA-256
        rows = con.execute("SELECT end_offset, prefix FROM source_progress").fetchall()
    assert rows and all(prefix == hashlib.sha256(data[:end]).hexdigest() for end, prefix in rows)
    with open(log, "r+") as f:  # and a rewrite in place is still refused
        f.write(line(0, "rewritten"))
    code, out, err = run(capsys, "--input", str(log), "--store", url)
    assert code == EXIT_USER and "changed" in err and stored_events(url) == 1_300


def test_the_same_bytes_under_another_name_are_the_same_input(tmp_path, capsys) -> None:
    url = f"duckdb:///{tmp_path}/s.duckdb"
    a = tmp_path / "a.jsonl"
    a.write_text("".join(line(i) for i in range(700)))
    (tmp_path / "b.jsonl").write_bytes(a.read_bytes())
    code, out, _ = run(capsys, "--input", str(a), str(tmp_path / "b.jsonl"), "--store", url)
    assert code == 0 and stored_events(url) == 700


# ------------------------------------------------------------------------------------------------ dead letter


def test_rejected_records_of_earlier_runs_are_never_destroyed(tmp_path, capsys) -> None:
    url = f"duckdb:///{tmp_path}/s.duckdb"
    dead = tmp_path / "s.rejected.jsonl"
    first = tmp_path / "first.jsonl"
    first.write_text(line(1) + "not json\n" + "[1]\n")
    code, out, _ = run(capsys, "--input", str(first), "--store", url)
    assert code == 0 and f"rejects appended to {dead}" in out
    second = tmp_path / "second.jsonl"
    second.write_text(line(2) + '{"ts": 1}\n')
    assert run(capsys, "--input", str(second), "--store", url)[0] == 0
    records = [json.loads(x) for x in Path(dead).read_text().splitlines()]
    assert [(Path(r["source"]).name, r["line"], r["reason"]) for r in records] == [
        ("first.jsonl", 2, "invalid JSON"),
        ("first.jsonl", 3, "not an object"),
        ("second.jsonl", 2, "missing field: service"),
    ]
