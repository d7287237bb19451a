"""Streaming: a stream killed mid-way and restarted from its checkpoint ends exactly where an uninterrupted
stream ends (exactly once into the store)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from spark_testlib import SPARK, assert_same_results, skewed_inputs

from drainpipe.inputs import head_of, node_of
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS
from drainpipe.pipeline.store import open_store
from drainpipe.spark import run_stream

pytestmark = SPARK
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def stream_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four files: two JSON Lines halves of a skewed workload with bad lines, gzipped CSV, Parquet."""
    source = tmp_path_factory.mktemp("source")
    jsonl, csv_gz, parquet = skewed_inputs(source, events=16_000)
    directory = tmp_path_factory.mktemp("incoming")
    lines = Path(jsonl).read_bytes().splitlines(keepends=True)
    half = len(lines) // 2
    (directory / "part-0.jsonl").write_bytes(b"".join(lines[:half]))
    (directory / "part-1.jsonl").write_bytes(b"".join(lines[half:]))
    os.replace(csv_gz, directory / "part-2.csv.gz")
    os.replace(parquet, directory / "part-3.parquet")
    return directory


def test_killed_stream_restarts_to_the_same_values(spark, stream_dir: Path, tmp_path: Path) -> None:
    files = sorted(str(p) for p in stream_dir.iterdir())
    # the uninterrupted run (one micro-batch of everything)
    whole_url = f"duckdb:///{tmp_path}/whole.duckdb"
    whole = run_stream(
        str(stream_dir),
        store_url=whole_url,
        checkpoint=str(tmp_path / "whole-ckpt"),
        spark=spark,
        dead_letter=str(tmp_path / "whole.rejected.jsonl"),
        trigger_once=True,
    )
    assert whole["batches"] == 1 and whole["files"] == 4
    assert whole["read"] == whole["accepted"] + whole["rejected"] and whole["rejected"] >= 12

    # a run of one file per micro-batch, killed (SIGKILL) right after micro-batch 1 was stored, before its
    # checkpoint commit
    url = f"duckdb:///{tmp_path}/killed.duckdb"
    checkpoint = str(tmp_path / "ckpt")
    child = subprocess.run(
        [
            sys.executable,
            str(HERE / "stream_child.py"),
            str(stream_dir),
            url,
            checkpoint,
            str(tmp_path / "rejected.jsonl"),
            "1",
        ],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == -9, child.stdout + child.stderr[-3000:]
    assert "batch 1 stored" in child.stdout
    store = open_store(url)
    try:
        applied = [bool(store.file_progress(head_of(str(f)), node_of(str(f)))) for f in files]
    finally:
        store.close()
    assert sum(applied) == 2, applied  # mid-stream: two files stored, two not

    # restart from the checkpoint: batch 1 runs again (its file is already stored: skipped), then the rest
    resumed = run_stream(
        str(stream_dir),
        store_url=url,
        checkpoint=checkpoint,
        spark=spark,
        dead_letter=str(tmp_path / "rejected.jsonl"),
        trigger_once=True,
        max_files_per_trigger=1,
    )
    assert resumed["batches"] == 3 and resumed["unchanged_files"] == 1 and resumed["files"] == 3
    assert_same_results(whole_url, url, DEFAULT_DEFINITIONS)
