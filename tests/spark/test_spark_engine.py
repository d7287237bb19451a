"""The Spark engine computes what the local engine computes, row for row, on a skewed input with bad records."""

from __future__ import annotations

from pathlib import Path

import pytest
from spark_testlib import SPARK, assert_same_results, local_reference, skewed_inputs

from drainpipe.errors import SparkSetupError
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS, Definitions, MetricDef, TopNDef
from drainpipe.spark import JobOptions, check_java, run_batch

pytestmark = SPARK

#: every function and merge operation the default set lacks (sum, min, max, count, where filters)
OTHER_DEFINITIONS = Definitions(
    (
        MetricDef("instance_latency_sum", "instance", "sum", field="latency_ms"),
        MetricDef("endpoint_min", "endpoint", "min", field="latency_ms"),
        MetricDef("service_max", "service", "max", field="latency_ms"),
        MetricDef("service_slow_ok", "service", "count", where="latency_ms > 200 and status == true"),
        MetricDef("endpoint_cpm_errors", "endpoint", "cpm", where="status == false"),
        MetricDef("instance_p", "instance", "percentile", precision_ms=2.5),
    ),
    (TopNDef("top_instance_endpoints", "instance", "endpoint", 3),),
)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return skewed_inputs(tmp_path_factory.mktemp("inputs"), events=24_000)


@pytest.fixture(scope="module")
def reference(inputs: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The local engine's results for both definition sets: store URL, counts, dead letter bytes."""
    out = {}
    for name, definitions in (("default", DEFAULT_DEFINITIONS), ("other", OTHER_DEFINITIONS)):
        directory = tmp_path_factory.mktemp(f"local-{name}")
        url = f"duckdb:///{directory}/local.duckdb"
        counts = local_reference(inputs, definitions, url, str(directory / "rejected.jsonl"))
        out[name] = (url, counts, (directory / "rejected.jsonl").read_bytes())
    return out


@pytest.mark.parametrize("definition_set, per_type", [("default", "map"), ("default", "placed"), ("other", "map")])
def test_spark_equals_local_engine(
    spark, inputs, reference, tmp_path: Path, definition_set: str, per_type: str
) -> None:
    definitions = DEFAULT_DEFINITIONS if definition_set == "default" else OTHER_DEFINITIONS
    local_url, local_counts, local_dead_letter = reference[definition_set]
    url = f"duckdb:///{tmp_path}/spark.duckdb"
    dead_letter = tmp_path / "rejected.jsonl"
    # small blocks: the JSON Lines file is cut into byte ranges of whole blocks, Parquet into block ranges
    summary = run_batch(
        inputs,
        definitions=definitions,
        store_url=url,
        dead_letter=str(dead_letter),
        spark=spark,
        options=JobOptions(per_type=per_type, batch_rows=2_000),
    )
    assert summary["read"] == summary["accepted"] + summary["rejected"]
    assert {k: summary[k] for k in ("read", "accepted", "rejected")} == local_counts
    assert summary["rejected"] >= 12 and summary["dropped"] == 0
    assert summary["splits"] > 6
    assert dead_letter.read_bytes() == local_dead_letter  # same records, reasons, line numbers and order
    assert_same_results(local_url, url, definitions)
    if per_type == "placed":
        assert summary["placement"]["salted"], "the hot service should have been split"


def test_rerun_is_idempotent_and_parts_add_up(spark, inputs, reference, tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path}/spark.duckdb"
    first = run_batch(inputs[:1], store_url=url, spark=spark, dead_letter=str(tmp_path / "a.jsonl"))
    rest = run_batch(inputs, store_url=url, spark=spark, dead_letter=str(tmp_path / "b.jsonl"))
    assert rest["unchanged_files"] == 1 and first["unchanged_files"] == 0
    assert first["read"] + rest["read"] == reference["default"][1]["read"]  # a stored file is not read again
    again = run_batch(inputs, store_url=url, spark=spark, dead_letter=str(tmp_path / "c.jsonl"))
    assert again["read"] == 0 and again["unchanged_files"] == len(inputs) and again["metrics_rows"] == 0
    assert_same_results(reference["default"][0], url, DEFAULT_DEFINITIONS)


def test_check_java_reports_a_missing_java_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SparkSetupError) as error:
        check_java()
    assert "no Java found" in str(error.value) and "\n" not in str(error.value)
    old = tmp_path / "jdk8" / "bin"
    old.mkdir(parents=True)
    (old / "java").write_text("#!/bin/sh\necho 'openjdk version \"1.8.0_392\"' >&2\n")
    (old / "java").chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk8"))
    with pytest.raises(SparkSetupError, match="too old"):
        check_java()
