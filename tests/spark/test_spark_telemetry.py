"""Access logs and OTLP JSON trace files through Spark: the same store and the same dead letter as the local
engine (tests/engine/test_telemetry_files.py checks the local engine against the fixtures)."""

from __future__ import annotations

import sys
from pathlib import Path

from spark_testlib import SPARK

from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.run import run_local
from drainpipe.spark import run_batch
from testlib import assert_same_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from test_telemetry_files import telemetry_inputs

pytestmark = SPARK


def test_spark_reads_access_logs_and_otlp_files_as_the_local_engine_does(spark, tmp_path: Path) -> None:
    paths, _ = telemetry_inputs(tmp_path)
    local, remote = f"duckdb:///{tmp_path / 'local.duckdb'}", f"duckdb:///{tmp_path / 'spark.duckdb'}"
    summary = run_local(paths, definitions=default_definitions(), store_url=local,
                        dead_letter=str(tmp_path / "local.jsonl"), service="web")  # fmt: skip
    result = run_batch(paths, definitions=default_definitions(), store_url=remote, spark=spark,
                       dead_letter=str(tmp_path / "spark.jsonl"), service="web")  # fmt: skip
    assert (result["read"], result["accepted"], result["rejected"]) == (
        summary.read,
        summary.accepted,
        summary.rejected,
    )
    assert_same_results(local, remote, default_definitions())
    assert (tmp_path / "spark.jsonl").read_bytes() == (tmp_path / "local.jsonl").read_bytes()
