"""Access logs and OTLP JSON trace files through Spark: the same store and the same dead letter as the local
engine (tests/engine/test_telemetry_files.py checks the local engine against the fixtures)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from spark_testlib import SPARK

from drainpipe.pipeline import parallel
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.run import run_local
from drainpipe.spark import JobOptions, run_batch
from testlib import assert_same_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from test_telemetry_files import DEFINITIONS, telemetry_inputs

pytestmark = SPARK


def test_spark_reads_access_logs_and_otlp_files_as_the_local_engine_does(spark, tmp_path: Path) -> None:
    paths, _ = telemetry_inputs(tmp_path)
    local, remote = f"duckdb:///{tmp_path / 'local.duckdb'}", f"duckdb:///{tmp_path / 'spark.duckdb'}"
    summary = run_local(paths, definitions=DEFINITIONS, store_url=local,
                        dead_letter=str(tmp_path / "local.jsonl"), service="web")  # fmt: skip
    result = run_batch(paths, definitions=DEFINITIONS, store_url=remote, spark=spark,
                       dead_letter=str(tmp_path / "spark.jsonl"), service="web")  # fmt: skip
    assert (result["read"], result["accepted"], result["rejected"]) == (
        summary.read,
        summary.accepted,
        summary.rejected,
    )
    # odd trace and span ids (test_telemetry_files.ODD_TRACE_IDS, telemetry_files.otlp_file) cost no event on the
    # executors either (their native tier, the same C passes as the local engine's)
    assert result["warnings"] == summary.warnings and summary.warnings["bad trace_id"] > 1
    assert_same_results(local, remote, DEFINITIONS)  # the exemplars top-N too (the spans' trace ids)
    assert (tmp_path / "spark.jsonl").read_bytes() == (tmp_path / "local.jsonl").read_bytes()
    # with the per-type stage, the trace ids (and weights) cross its shuffle
    placed = f"duckdb:///{tmp_path / 'placed.duckdb'}"
    run_batch(paths, definitions=DEFINITIONS, store_url=placed, spark=spark, service="web",
              dead_letter=str(tmp_path / "placed.jsonl"), options=JobOptions(per_type="placed"))  # fmt: skip
    assert_same_results(local, placed, DEFINITIONS)


def test_spark_reads_custom_log_formats_and_quoted_csv_as_the_local_engine_does(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A custom nginx format (upstream times, a host name) and a CSV with quoted commas, quotes and newlines, cut
    into parts: the executors read them without drainpipe's C scanner (pyarrow's path), the local engine with it,
    and the stores and dead letters are the same."""
    import random

    from drainpipe.inputs import parse_log_format

    rng = random.Random(3)
    fmt = '$remote_addr [$time_local] "$request" $status $upstream_response_time $request_time $hostname'
    lines = []
    for i in range(3_000):
        rt = rng.choice(["-", f"{rng.randrange(1, 900) / 1000:.3f}"])
        up = rng.choice(["-", "0.010, 0.020 : 0.005", f"{rng.randrange(1, 900) / 1000:.3f}"])
        lines.append(f'10.0.0.{i % 7} [21/Nov/2026:10:{i // 60 % 60:02d}:{i % 60:02d} +0100] '
                     f'"GET /users/{rng.randrange(50)}?x={i} HTTP/1.1" {rng.choice([200, 404, 503])} {up} {rt} '
                     f'host{i % 3}')  # fmt: skip
    lines[17] = "garbage"
    log = tmp_path / "custom.log"
    log.write_text("\n".join(lines) + "\n")
    csv_lines = ["ts,service,instance,endpoint,latency_ms,status,db_statement"]
    for i in range(5_000):
        endpoint = f'"GET /a,{i % 9}\n""x"""' if i % 4 == 0 else f"/e{i % 5}"
        csv_lines.append(f"{1_795_255_200_000 + i * 997},svc{i % 3},,{endpoint},{rng.random() * 900:.3f},true,")
    csv_lines[40] = "bad,svc,,,1,true,"
    big = tmp_path / "quoted.csv"
    big.write_text("\n".join(csv_lines) + "\n")
    paths = [str(log), str(big)]
    local, remote = f"duckdb:///{tmp_path / 'local.duckdb'}", f"duckdb:///{tmp_path / 'spark.duckdb'}"
    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)  # small files go to the workers too
    summary = run_local(paths, definitions=default_definitions(), store_url=local, batch_rows=700,
                        dead_letter=str(tmp_path / "local.jsonl"), service="web", log_format=parse_log_format(fmt),
                        workers=2)  # fmt: skip
    result = run_batch(paths, definitions=default_definitions(), store_url=remote, spark=spark,
                       dead_letter=str(tmp_path / "spark.jsonl"), service="web", log_format=parse_log_format(fmt),
                       options=JobOptions(batch_rows=700))  # fmt: skip
    assert result["splits"] > 2  # both files cut into parts
    assert (result["read"], result["accepted"], result["rejected"]) == (
        summary.read,
        summary.accepted,
        summary.rejected,
    )
    assert summary.rejected >= 2
    assert_same_results(local, remote, default_definitions())
    assert (tmp_path / "spark.jsonl").read_bytes() == (tmp_path / "local.jsonl").read_bytes()
