"""`drainpipe run` exactly once, whatever happens: kill -9 at any moment (between two checkpoints, inside a
checkpoint's transaction, during the final commit, at random), then run the same input again: the store equals an
uninterrupted run's, row for row, and the dead letter holds each rejected record once. Each kill also takes down the run's worker processes (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import gzip
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drainpipe.inputs import default_dead_letter
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS
from drainpipe.pipeline.generator import generate_events, write_events
from procs import alive, children_of
from testlib import assert_same_results, wait_until

HERE = Path(__file__).resolve().parent
FLUSH_S = "0.05"  # a checkpoint every 50 ms of work: several per run


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    d = tmp_path_factory.mktemp("kill-inputs")
    # large enough (> 8 MB) for the worker processes; read last (inputs run in name order), so that the workers are
    # alive, waiting for it, at every checkpoint of the files before (a run lets them go after its last big file)
    jsonl = d / "z-big.jsonl"
    write_events(generate_events(120_000, services=30, endpoints_per_service=8, seed=5), jsonl)
    with open(jsonl, "ab") as f:
        f.write(b'{"ts": 1, "service": ""}\nnot json\n')  # two rejects
    parquet = d / "more.parquet"
    write_events(generate_events(60_000, services=12, seed=6), parquet)
    small = d / "small.csv.gz"
    write_events(generate_events(5_000, services=4, seed=7), small)
    return [str(jsonl), str(parquet), str(small)]


def _child(url: str, inputs: list[str], workers: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(HERE / "run_child.py"), url, FLUSH_S, str(workers), *extra, *inputs],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE)  # fmt: skip


def run_clean(url: str, inputs: list[str], workers: int) -> list[str]:
    child = _child(url, inputs, workers)
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0 and out.splitlines()[-1] == "done", err[-3000:]
    return out.splitlines()


def kill_at(url: str, inputs: list[str], workers: int, marker: str | None, after_s: float = 0.0,
            *extra: str) -> list[int]:  # fmt: skip
    """Start a run, SIGKILL it when ``marker`` is printed (or after ``after_s``); the worker processes it had."""
    child = _child(url, inputs, workers, *extra)
    assert child.stdout is not None
    workers_seen: list[int] = []
    deadline = time.monotonic() + after_s
    if marker is None:
        while time.monotonic() < deadline and child.poll() is None:
            workers_seen = children_of(child.pid) or workers_seen
            time.sleep(0.01)
    else:
        for line in child.stdout:
            workers_seen = children_of(child.pid) or workers_seen
            if line.strip() == marker:
                break
        else:
            pytest.fail(f"the run ended before {marker!r}: {child.stderr.read()[-2000:] if child.stderr else ''}")
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    child.stdout.close()
    if child.stderr:
        child.stderr.close()
    return workers_seen


@pytest.fixture(scope="module")
def reference(inputs: list[str], tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    """An uninterrupted run's store, and how many checkpoints it committed."""
    url = f"duckdb:///{tmp_path_factory.mktemp('reference')}/clean.duckdb"
    lines = run_clean(url, inputs, 2)
    return url, sum(1 for line in lines if line.startswith("committed"))


def _rerun_equals_reference(url: str, inputs: list[str], reference: tuple[str, int], workers: int) -> None:
    run_clean(url, inputs, workers)
    assert_same_results(reference[0], url, DEFAULT_DEFINITIONS)
    # the two rejects, each once, however often the kills made the runs read them again
    dead = Path(default_dead_letter(url)).read_text().splitlines()
    assert sorted((json.loads(r)["line"], json.loads(r)["reason"]) for r in dead) == [
        (120_001, "bad value: service"), (120_002, "invalid JSON")], dead  # fmt: skip


def _no_orphans(pids: list[int]) -> None:
    wait_until(lambda: not alive(pids), timeout=10, interval=0.05, what="the workers to end with their killed parent")


def test_the_reference_run_checkpoints_several_times(reference) -> None:
    assert reference[1] >= 3


@pytest.mark.parametrize("workers", [2, 0])
def test_kill_between_two_periodic_checkpoints(inputs, reference, tmp_path, workers) -> None:
    url = f"duckdb:///{tmp_path}/s.duckdb"
    seen = kill_at(url, inputs, workers, "committed 1")
    if workers:
        assert seen, "the run had no worker processes to check"
        _no_orphans(seen)
    _rerun_equals_reference(url, inputs, reference, workers)


def test_kill_inside_a_checkpoint_transaction(inputs, reference, tmp_path) -> None:
    url = f"duckdb:///{tmp_path}/s.duckdb"
    kill_at(url, inputs, 2, "in-txn 2", 0.0, "--slow-commit")  # before its COMMIT: the store keeps checkpoint 1
    _rerun_equals_reference(url, inputs, reference, 2)


def test_kill_during_the_final_commit(inputs, reference, tmp_path) -> None:
    url = f"duckdb:///{tmp_path}/s.duckdb"
    # by what it records, not by number: a slowed run may checkpoint fewer times than the reference did
    kill_at(url, inputs, 2, "in-txn final", 0.0, "--slow-commit")
    _rerun_equals_reference(url, inputs, reference, 2)


def test_kill_at_random_moments_and_again_during_the_rerun(inputs, reference, tmp_path) -> None:
    rng = random.Random(11)
    url = f"duckdb:///{tmp_path}/s.duckdb"
    for _ in range(3):  # three kills in a row, each at a random moment of a (re)run
        kill_at(url, inputs, 2, None, rng.uniform(0.5, 3.0))
    _rerun_equals_reference(url, inputs, reference, 2)


def test_workers_die_with_a_parent_stopped_by_sigterm(inputs, tmp_path) -> None:
    child = _child(f"duckdb:///{tmp_path}/t.duckdb", inputs[:1], 2)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "start"
    workers = wait_until(lambda: children_of(child.pid), timeout=30, interval=0.01, what="the run's workers")
    child.send_signal(signal.SIGTERM)
    child.wait(timeout=60)
    child.stdout.close()
    if child.stderr:
        child.stderr.close()
    _no_orphans(workers)


def test_a_truncated_gzip_commits_nothing_of_that_file(tmp_path, capsys) -> None:
    from drainpipe.cli import main

    good = tmp_path / "a-good.jsonl"  # read first (inputs run in name order)
    write_events(generate_events(3_000, services=3, seed=1), good)
    whole = gzip.compress(b"".join(generate_line(i) for i in range(200_000)))
    bad = tmp_path / "b-bad.jsonl.gz"
    bad.write_bytes(whole[: len(whole) // 2])  # cut mid-stream: unreadable after ~100k lines
    url = f"duckdb:///{tmp_path}/s.duckdb"
    code = main(["run", "-q", "--input", str(good), str(bad), "--store", url])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "not stored" in err and "0 events of this file were stored" in err
    from drainpipe.pipeline.store import open_store

    store = open_store(url)
    try:
        counted = sum(row[5] for row in store.query(metric="service_cpm", granularity="minute"))  # cpm = count
    finally:
        store.close()
    assert counted == 3_000  # the good file, nothing of the bad one


def generate_line(i: int) -> bytes:
    return b'{"ts": %d, "service": "s%d", "latency_ms": 1.0}\n' % (1_795_255_200_000 + i, i % 7)
