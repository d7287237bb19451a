"""The dead letter holds each rejected record once: across a rewind (the same writer rejects it again), a restart (a
new writer on the file), and another process appending to the same file meanwhile (records are held until a flush,
as the driver flushes before each commit); its records are the format the
release before wrote, and a file written by that release is read."""

from __future__ import annotations

import json
import os
from pathlib import Path

from drainpipe.inputs import DeadLetter


def _records(path: Path) -> list[tuple]:
    return [(r["source"], r["line"], json.dumps(r["raw"]), r["reason"]) for r in map(json.loads, path.open())]


def test_a_record_rejected_again_is_held_once(tmp_path: Path) -> None:
    path = tmp_path / "dl.jsonl"
    with DeadLetter(path) as dl:
        dl.write("a.jsonl", 2, "not json", "invalid JSON")
        dl.write("a.jsonl", 2, "not json", "invalid JSON")  # a rewind reads it again
        dl.write("a.parquet", 7, {"ts": float("nan"), "reason": 1}, "bad value: ts")
        assert (dl.count, dl.repeated) == (2, 1)
    with DeadLetter(path) as again:  # a restart: a new writer on the file
        again.write("a.parquet", 7, {"ts": float("nan"), "reason": 1}, "bad value: ts")
        again.write("a.jsonl", 2, "not json", "another wording of the reason")  # the same record
        again.write("a.jsonl", 3, "not json", "invalid JSON")  # the same text on another line: another record
        assert (again.count, again.repeated) == (1, 2)
    assert [r[:2] for r in _records(path)] == [("a.jsonl", 2), ("a.parquet", 7), ("a.jsonl", 3)]


def test_what_another_process_appends_meanwhile_is_not_written_twice(tmp_path: Path) -> None:
    path = tmp_path / "dl.jsonl"
    with DeadLetter(path) as mine, DeadLetter(path) as theirs:
        theirs.write("topic/0", 41, "x", "invalid JSON")  # a member that then died; this one re-reads offset 41
        theirs.flush()
        mine.write("topic/0", 41, "x", "invalid JSON")
        mine.write("topic/0", 42, "y", "invalid JSON")
        mine.flush()  # (the driver flushes before each commit)
        theirs.write("topic/0", 42, "y", "invalid JSON")
        theirs.flush()
        assert mine.repeated == theirs.repeated == 1 and mine.count == theirs.count == 1
    assert [r[1] for r in _records(path)] == [41, 42]


def test_a_half_written_last_line_of_another_writer_is_read_once_it_is_whole(tmp_path: Path) -> None:
    path = tmp_path / "dl.jsonl"
    record = '{"source": "s", "line": 1, "raw": "r", "reason": "why"}\n'
    path.write_text(record[:20])
    with DeadLetter(path) as dl:
        with open(path, "a") as other:
            other.write(record[20:])
        dl.write("s", 1, "r", "why")
        dl.flush()
        assert dl.repeated == 1 and dl.count == 0


def test_records_are_written_as_the_release_before_wrote_them(tmp_path: Path) -> None:
    path = tmp_path / "dl.jsonl"
    old = {"source": "f.csv", "line": 3, "raw": "a,b", "reason": "bad type: ts"}
    path.write_text(json.dumps(old) + "\n")  # the release before: json.dumps of the record, keys in this order
    with DeadLetter(path) as dl:
        dl.write("f.csv", 3, "a,b", "bad type: ts")
        dl.write("f.csv", 4, "c,d", "bad type: ts")
    lines = path.read_text().splitlines()
    assert lines == [json.dumps(old), json.dumps({**old, "line": 4, "raw": "c,d"})]
    assert os.stat(path).st_size == sum(len(x) + 1 for x in lines)


def test_records_a_full_disk_refused_are_written_when_read_again(tmp_path: Path, monkeypatch) -> None:
    """The flush before a commit fails (ENOSPC): the commit fails, the input is read again, and its rejects must be
    written then, not skipped as already held."""
    import errno

    from drainpipe.inputs import rejects

    path = tmp_path / "dl.jsonl"
    with DeadLetter(path) as dl:
        dl.write("a.jsonl", 2, "not json", "invalid JSON")
        real = os.write
        monkeypatch.setattr(rejects.os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
        try:
            dl.flush()
        except OSError:
            pass
        else:
            raise AssertionError("the flush must fail")
        monkeypatch.setattr(rejects.os, "write", real)
        dl.write("a.jsonl", 2, "not json", "invalid JSON")  # read again after the failed commit
    assert [r[:2] for r in _records(path)] == [("a.jsonl", 2)]


def test_a_file_truncated_under_a_writer_gets_its_held_records_once(tmp_path: Path) -> None:
    path = tmp_path / "dl.jsonl"
    with DeadLetter(path) as dl:
        dl.write("a.jsonl", 1, "x", "r")
        dl.flush()
        dl.write("a.jsonl", 2, "y", "r")
        path.write_text("")  # an operator empties the file
        dl.flush()
        dl.write("a.jsonl", 2, "y", "r")  # read again (a rewind)
        dl.flush()
    assert [r[1] for r in _records(path)] == [2]


def test_a_line_a_crashed_writer_left_unfinished_is_ended_before_ours(tmp_path: Path) -> None:
    path = tmp_path / "dl.jsonl"
    path.write_text('{"source": "s", "line": 1, "raw": "r", "reason": "why"}\n{"source": "s", "li')
    with DeadLetter(path) as dl:
        dl.write("s", 3, "z", "why")
        dl.flush()
    with DeadLetter(path) as again:
        again.write("s", 1, "r", "why")
        again.write("s", 3, "z", "why")
        again.flush()
        assert again.repeated == 2
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[2])["line"] == 3  # the unfinished line stays, ended; ours whole
