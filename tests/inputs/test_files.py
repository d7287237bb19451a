"""Files as a user names them (inputs/files.py, the format registry) and the dead letter (inputs/rejects.py)."""

from __future__ import annotations

import json
import threading

import pytest

from drainpipe.errors import InputError
from drainpipe.inputs import detect_format, expand_inputs, read_events
from drainpipe.inputs.rejects import DeadLetter
from testlib import rec, write_bytes

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
