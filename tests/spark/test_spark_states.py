"""How a Spark job's states reach the driver (:mod:`drainpipe.spark.states`), where Spark's retries could lose them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from spark_testlib import skewed_inputs

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return skewed_inputs(tmp_path_factory.mktemp("inputs"), events=24_000)


def test_a_task_retried_from_its_cached_partition_still_brings_its_first_rows(inputs) -> None:
    """An RDD job's first rows come with its tasks' results (an accumulator). A task attempt that cached its
    partition and failed after is retried from the cache, without running the task function: that group's rows
    never arrive (SPARK-41497). The job notices and runs the group again: the same counts and partials as a job
    without the failure."""
    done = subprocess.run([sys.executable, str(HERE / "retry_child.py"), inputs[0]], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["read"][0] > 0 and result["read"][0] == result["read"][1], result
    assert result["same_partials"] and result["tasks"][0] == result["tasks"][1] == 2, result
