"""The Spark engine computes what the local engine computes, row for row, on a skewed input with bad records."""

from __future__ import annotations

import os
from datetime import UTC
from pathlib import Path

import pytest
from spark_testlib import SPARK, assert_same_partials, assert_same_results, local_reference, skewed_inputs

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


def test_metric_states_streamed_to_the_driver_equal_the_local_engine(
    spark, inputs, reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large input's merged states reach the driver one partition at a time (when its tasks emitted more state
    rows than STREAM_METRICS_ABOVE_ROWS, too many to come with the first action); forced here on the small input,
    the store is the local engine's."""
    from drainpipe.spark import engine

    monkeypatch.setattr(engine, "STREAM_METRICS_ABOVE_BYTES", 0)
    monkeypatch.setattr(engine, "STREAM_METRICS_ABOVE_ROWS", 0)
    url = f"duckdb:///{tmp_path}/spark.duckdb"
    summary = run_batch(inputs, store_url=url, spark=spark, dead_letter=str(tmp_path / "d.jsonl"),
                        options=JobOptions(driver_merge_rows=0))  # fmt: skip
    assert "metric merge" not in summary["stage_s"]  # (the collected merge's stage: not taken)
    assert_same_results(reference["default"][0], url, DEFAULT_DEFINITIONS)


@pytest.mark.parametrize("kept_by", ["rdd", "dataframe"])
def test_every_way_the_metric_states_reach_the_driver_gives_the_same_partials(
    spark, inputs, monkeypatch: pytest.MonkeyPatch, kept_by: str
) -> None:
    """Tasks whose states are few send them with the first action; the others' are collected by a second one, or
    merged by Spark when they are many; a stream's micro-batch after a small one collects all in one action. Each
    way with the states of an RDD job (a classic session's file job) and of a DataFrame's (Spark Connect's, the
    Kafka micro-batches')."""
    from drainpipe.inputs import plan_parts
    from drainpipe.spark import engine
    from drainpipe.spark.engine import aggregate_splits
    from drainpipe.spark.splits import plan_splits

    if kept_by == "dataframe":  # the file job as under Spark Connect, which has no RDDs
        monkeypatch.setattr(engine, "is_connect", lambda session: True)
    splits = plan_splits([part for path in inputs for part in plan_parts(path, 2_000, workers=2)])
    first = aggregate_splits(spark, splits, DEFAULT_DEFINITIONS)
    assert first.metric_merge == "first action" and first.state_rows > 0
    # a budget of the total: the task over the average holds its states back, the second action collects them
    # one short of it: the task under the average still sends its states with the first action, and Spark merges
    # them with the others'
    ways = [("collected", JobOptions(driver_merge_rows=first.state_rows)), ("spark", JobOptions(driver_merge_rows=0)),
            ("spark", JobOptions(driver_merge_rows=first.state_rows - 1)),
            ("one action", JobOptions(driver_merge=True))]  # fmt: skip
    for how, options in ways:
        other = aggregate_splits(spark, splits, DEFAULT_DEFINITIONS, options)
        assert other.metric_merge == how
        assert (other.stats.read, other.state_rows) == (first.stats.read, first.state_rows)
        assert_same_partials(first.partials, other.partials)
    # the top-N rows of many tasks are merged by a Spark stage before the driver's merge
    monkeypatch.setattr(engine, "DRIVER_TOPN_MERGE_TASKS", 0)
    for options in (JobOptions(), JobOptions(driver_merge_rows=0)):
        other = aggregate_splits(spark, splits, DEFAULT_DEFINITIONS, options)
        assert (other.stats.read, other.state_rows) == (first.stats.read, first.state_rows)
        assert_same_partials(first.partials, other.partials)


def test_rerun_is_idempotent_and_parts_add_up(spark, inputs, reference, tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path}/spark.duckdb"
    first = run_batch(inputs[:1], store_url=url, spark=spark, dead_letter=str(tmp_path / "a.jsonl"))
    rest = run_batch(inputs, store_url=url, spark=spark, dead_letter=str(tmp_path / "b.jsonl"))
    assert rest["unchanged_files"] == 1 and first["unchanged_files"] == 0
    assert first["read"] + rest["read"] == reference["default"][1]["read"]  # a stored file is not read again
    again = run_batch(inputs, store_url=url, spark=spark, dead_letter=str(tmp_path / "c.jsonl"))
    assert again["read"] == 0 and again["unchanged_files"] == len(inputs) and again["metrics_rows"] == 0
    assert_same_results(reference["default"][0], url, DEFAULT_DEFINITIONS)


def test_the_value_rows_a_run_reports_are_the_rows_it_stores(spark, tmp_path: Path) -> None:
    """``metrics_rows`` counts the metric value rows a run updates over minute, hour and day buckets (each label of
    a percentile): into a fresh store, the rows it then holds. Three days of events: every granularity has several
    buckets an entity's rows fall in."""
    import duckdb

    from drainpipe.pipeline.generator import generate_events, write_events

    path = tmp_path / "days.jsonl"
    write_events(generate_events(6_000, seed=3, services=4, duration_s=3 * 86_400), path)
    store = tmp_path / "days.duckdb"
    summary = run_batch([str(path)], store_url=f"duckdb:///{store}", spark=spark, dead_letter=str(tmp_path / "d.jsonl"))
    with duckdb.connect(str(store), read_only=True) as db:
        stored, days = db.execute("SELECT count(*), count(DISTINCT time_bucket) FILTER (WHERE granularity = 'day') "
                                  "FROM metric_values").fetchone()  # fmt: skip
    assert days >= 3 and summary["metrics_rows"] == stored, (summary["metrics_rows"], stored)


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


def test_spark_guard_keeps_the_first_entities_by_name_and_folds_the_rest(spark, tmp_path: Path) -> None:
    """Per scope and minute at most max_entities entities (the first by name) plus __overflow__, which holds the
    states of the rest: counts, histograms and min/max totals unchanged; the folds counted in the summary. Both
    the streamed store write and the collected merge apply it."""
    import json
    from collections import Counter, defaultdict

    from drainpipe.inputs import plan_parts
    from drainpipe.pipeline.cardinality import OVERFLOW
    from drainpipe.pipeline.run import RunSummary
    from drainpipe.pipeline.store import open_store
    from drainpipe.spark.engine import aggregate_splits
    from drainpipe.spark.splits import plan_splits

    base = 1_790_000_000_000 // 600_000 * 600_000
    path = tmp_path / "ids.jsonl"
    events = []
    for minute in range(3):
        for i in range(300 + 100 * minute):  # 300, 400, 500 distinct endpoints (each a user id) per minute
            events.append({"ts": base + minute * 60_000 + i, "service": "api", "endpoint": f"/u/{i:04d}",
                           "latency_ms": float(i % 97), "status": i % 7 != 0,
                           "db_statement": f"select {i}" if i % 3 == 0 else None})  # fmt: skip
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    limit = 120
    definitions = Definitions(
        (
            MetricDef("endpoint_cpm", "endpoint", "cpm"),
            MetricDef("service_cpm", "service", "cpm"),
            MetricDef("endpoint_max", "endpoint", "max", field="latency_ms"),
            MetricDef("endpoint_p", "endpoint", "percentile", precision_ms=10.0),
        ),
        (TopNDef("top_statements", "endpoint", "db_statement", 2),),
        max_entities=limit,
    )
    url = f"duckdb:///{tmp_path / 's.duckdb'}"
    summary = run_batch([str(path)], definitions=definitions, store_url=url, spark=spark,
                        dead_letter=str(tmp_path / "d.jsonl"))  # fmt: skip
    assert summary["accepted"] == len(events)
    store = open_store(url)
    try:
        rows = {m: store.query(metric=m, granularity="minute") for m in ("endpoint_cpm", "service_cpm", "endpoint_max")}
        top = store.query_topn("top_statements")
    finally:
        store.close()
    kept: dict[int, set[str]] = defaultdict(set)
    for _m, entity, _g, bucket, _l, _v in rows["endpoint_cpm"]:
        kept[bucket].add(entity)
    for minute in range(3):  # the first `limit` names of the minute, and __overflow__ for the rest
        names = sorted(f"api//u/{i:04d}" for i in range(300 + 100 * minute))
        assert {e for e in kept[_iso(base + minute * 60_000)] if e != OVERFLOW} == set(names[:limit])
    assert sum(v for *_, v in rows["endpoint_cpm"]) == len(events) == sum(v for *_, v in rows["service_cpm"])
    assert max(v for *_, v in rows["endpoint_max"]) == 96.0
    overflow = {b: v for _m, e, _g, b, _l, v in rows["endpoint_cpm"] if e == OVERFLOW}
    assert overflow == {_iso(base): 180, _iso(base + 60_000): 280, _iso(base + 120_000): 380}
    assert summary["overflow"]["endpoint"] == 3 * (180 + 280 + 380)  # merged rows of three metrics folded
    assert summary["overflow"]["topn:endpoint"] > 0 and "service" not in summary["overflow"]
    lines = RunSummary.from_totals(summary, store=url, dead_letter=None, engine="spark").lines()
    assert any(line.startswith("too many entities") and "endpoint 2,520" in line for line in lines)
    statements = Counter(e for _m, e, *_ in top)
    assert len(set(statements) - {OVERFLOW}) == limit and statements[OVERFLOW] == 2

    parts = list(plan_parts(str(path), 4096, workers=2))
    # merged by Spark, collected in one piece
    collected = aggregate_splits(spark, plan_splits(parts), definitions, JobOptions(driver_merge_rows=0))
    cpm = next(p for p in collected.partials if p.name == "endpoint_cpm")
    assert cpm.table.num_rows == 3 * (limit + 1)
    assert collected.overflow == summary["overflow"]
    # merged on the driver (few state rows), after looking or in the job's one action (a stream's micro-batches):
    # the same guard, by name, the same partials
    for options in (JobOptions(), JobOptions(driver_merge=True)):
        on_driver = aggregate_splits(spark, plan_splits(parts), definitions, options)
        assert on_driver.overflow == collected.overflow
        for mine, theirs in zip(on_driver.partials, collected.partials, strict=True):
            keys = [(k, "ascending") for k in mine.key_columns]
            theirs_table = theirs.table.select(mine.table.column_names).sort_by(keys)
            assert mine.table.sort_by(keys).equals(theirs_table), (mine.name, options)


def _iso(ms: int) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_spark_guard_bounds_entities_that_no_single_task_exceeds(spark, tmp_path: Path) -> None:
    """Each task sees 100 endpoints per minute, below the limit of 150; together they are 200: the tasks' bound
    (summed over tasks) must still bring the guard in."""
    import json

    from drainpipe.pipeline.cardinality import OVERFLOW
    from drainpipe.pipeline.store import open_store

    base = 1_790_000_000_000 // 600_000 * 600_000
    paths = []
    for half in range(2):
        path = tmp_path / f"half{half}.jsonl"
        path.write_text("".join(json.dumps({"ts": base + i, "service": "api", "endpoint": f"/{half}/{i:03d}",
                                            "latency_ms": 1.0, "status": True}) + "\n" for i in range(100)))  # fmt: skip
        paths.append(str(path))
    definitions = Definitions((MetricDef("endpoint_cpm", "endpoint", "cpm"),), (), max_entities=150)
    url = f"duckdb:///{tmp_path / 's.duckdb'}"
    summary = run_batch(paths, definitions=definitions, store_url=url, spark=spark,
                        dead_letter=str(tmp_path / "d.jsonl"))  # fmt: skip
    assert summary["splits"] == 2
    store = open_store(url)
    try:
        rows = store.query(metric="endpoint_cpm", granularity="minute")
    finally:
        store.close()
    assert len(rows) == 151 and dict((e, v) for _m, e, _g, _b, _l, v in rows)[OVERFLOW] == 50
    assert summary["overflow"] == {"endpoint": 50}


def test_a_micro_batch_reads_its_records_in_one_job(spark, tmp_path: Path) -> None:
    """A micro-batch (here a frame of messages as Spark's Kafka source gives them) is one Spark job when its states
    merge on the driver: the records are read once, with no job for the batch's offset ranges before it. Run again,
    it finds its messages applied; a partition the store has never seen is read from its first message."""
    import json

    from drainpipe.pipeline import open_store
    from drainpipe.spark import KafkaTopics
    from drainpipe.spark.kafka import ingest_messages

    base = 1_790_000_000_000
    rows = [("t", p, 40 + o, json.dumps({"ts": base + o, "service": "api", "endpoint": "/x", "latency_ms": 1.0,
                                         "status": True}).encode()) for p in range(2) for o in range(50)]  # fmt: skip
    frame = spark.createDataFrame(rows, "topic string, partition int, offset long, value binary")
    tracker = spark.sparkContext.statusTracker()
    store = open_store(f"duckdb:///{tmp_path / 's.duckdb'}")
    try:
        for accepted in (100, 0):
            before = set(tracker.getJobIdsForGroup())
            summary = ingest_messages(spark, frame, KafkaTopics("-", ("t",), "c"), DEFAULT_DEFINITIONS, store, None,
                                      JobOptions(driver_merge=True))  # fmt: skip
            assert len(set(tracker.getJobIdsForGroup()) - before) == 1
            assert summary["accepted"] == accepted, summary
        ends = {(r.part, r.end) for r in store.progress("kafka")}
    finally:
        store.close()
    assert ends == {("c/t/0", 90), ("c/t/1", 90)}


def test_a_one_job_process_runs_its_jvm_without_c2_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """``short_lived_jvm`` adds ``-XX:TieredStopAtLevel=1`` to the launcher's options once; a level the user set
    there stays."""
    from drainpipe.spark import short_lived_jvm

    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-Xss4m")
    short_lived_jvm()
    short_lived_jvm()
    assert os.environ["SPARK_SUBMIT_OPTS"] == "-Xss4m -XX:TieredStopAtLevel=1"
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=4")
    short_lived_jvm()
    assert os.environ["SPARK_SUBMIT_OPTS"] == "-XX:TieredStopAtLevel=4"


def test_local_workers_import_pyspark_installed_and_drainpipe_from_the_shipped_zip(spark) -> None:
    """A local session on this interpreter starts drainpipe.spark.daemon: its workers import pyspark from the
    install (with its bytecode), not from Spark's pyspark.zip, and drainpipe still from the zip the job ships."""

    def files(batches):  # type: ignore[no-untyped-def]  (defined here: shipped by value, not by this module's name)
        import pyarrow as pa
        import pyspark.worker

        import drainpipe.spark.tasks

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"files": [f"{pyspark.worker.__file__} {drainpipe.spark.tasks.__file__}"]})

    rows = spark.range(0, 2, 1, numPartitions=2).mapInArrow(files, "files string").toArrow()
    for worker, tasks in (line.split(" ") for line in rows.column("files").to_pylist()):
        assert ".zip" not in worker and worker.endswith("pyspark/worker.py"), worker
        assert "drainpipe-tasks-" in tasks and ".zip/" in tasks, tasks
