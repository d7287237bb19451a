"""Skew: per-type work placed with salting + LPT spreads a Zipf-hot type over the partitions; Spark's hash
placement puts it in one giant task. Same results either way."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from spark_testlib import SPARK, assert_same_partials

from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS, Definitions, MetricDef, TopNDef
from drainpipe.pipeline.generator import generate_events
from drainpipe.spark import JobOptions
from drainpipe.spark.engine import per_type_stage
from drainpipe.spark.rows import columns_used, fill_unused, topn_only_filter
from drainpipe.spark.skew import hash_placement, plan_placement, sample_weights

pytestmark = SPARK
PARTITIONS = 8


def zipf(n: int, s: float) -> dict[str, float]:
    return {f"t{k:03d}": 1000.0 / k**s for k in range(1, n + 1)}


@pytest.mark.parametrize("types, skew", [(20, 1.1), (200, 1.1), (5, 2.0), (1, 0.0)])
def test_plan_placement_balances_zipf_weights(types: int, skew: float) -> None:
    weights = zipf(types, skew)
    plan = plan_placement(weights, PARTITIONS)
    assert plan.expected_ratio <= 1.2, plan.loads
    assert sum(plan.loads) == pytest.approx(sum(weights.values()))
    hottest = max(weights, key=weights.get)  # type: ignore[arg-type]
    assert len(plan.bins[hottest]) > 1  # split into salted sub-groups
    assert all(0 <= b < PARTITIONS for bins in plan.bins.values() for b in bins)


@pytest.fixture(scope="module")
def events_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """300k events, 16 services under Zipf(1.3): the hottest service carries ~40% of them."""
    path = tmp_path_factory.mktemp("skew") / "events.parquet"
    table = pa.Table.from_batches(list(generate_events(300_000, services=16, skew=1.3, seed=3, duration_s=1800)))
    pq.write_table(table, path, row_group_size=50_000)
    return str(path)


def test_placement_evens_out_task_times(spark, events_path: str) -> None:
    events = spark.read.parquet(events_path)
    options = JobOptions(partitions=PARTITIONS)
    weights = sample_weights(events, "service", fraction=0.02)
    placed_plan = plan_placement(weights, PARTITIONS)
    assert placed_plan.salted.get("svc-00", 0) >= 3
    best: dict[str, dict] = {}
    # task times, wall and CPU, of tasks of tens of milliseconds vary between runs on a shared machine (the CPU
    # ratio once came out 2.16 in a full run of tests/spark): a run that misses gets a retry
    for _attempt in range(3):
        hashed = per_type_stage(spark, events, DEFAULT_DEFINITIONS, hash_placement(PARTITIONS), options)
        placed = per_type_stage(spark, events, DEFAULT_DEFINITIONS, placed_plan, options)
        best = {
            f"{plan}_{measure}": result.spread(measure)["per-type"]
            for plan, result in (("hash", hashed), ("placed", placed))
            for measure in ("events", "cpu", "seconds")
        }
        if (best["placed_seconds"]["ratio"] <= 2.0 and best["placed_seconds"]["ratio"] < best["hash_seconds"]["ratio"]
                and best["placed_cpu"]["ratio"] <= 2.0):  # fmt: skip
            break
    print("per-type task spread (max/median):", {k: round(v["ratio"], 2) for k, v in best.items()})
    assert best["placed_events"]["tasks"] == best["hash_events"]["tasks"] == PARTITIONS
    # events per task: deterministic given the (seeded) sample
    assert best["placed_events"]["ratio"] <= 1.35 and best["hash_events"]["ratio"] >= 2.5
    # CPU seconds per task: what each task did, unaffected by other processes on the machine
    assert best["placed_cpu"]["ratio"] <= 2.0 < best["hash_cpu"]["ratio"], best
    assert best["placed_cpu"]["max_s"] < best["hash_cpu"]["max_s"], best
    # wall seconds per task: what the stage waits for (noisy on a shared machine, hence only the ordering)
    assert best["placed_seconds"]["ratio"] < best["hash_seconds"]["ratio"], best
    assert_same_partials(hashed.partials, placed.partials)


@pytest.mark.parametrize(
    "definitions",
    [
        DEFAULT_DEFINITIONS,
        Definitions(DEFAULT_DEFINITIONS.metrics[:1], ()),
        Definitions((), DEFAULT_DEFINITIONS.topns),
        Definitions(
            (MetricDef("m", "endpoint", "max", field="latency_ms", where="status == false and instance != 'x'"),),
            (TopNDef("t", "instance", "endpoint", 2),),
        ),
    ],
)
def test_pruned_columns_give_the_same_states(definitions: Definitions) -> None:
    """The per-type stage ships only ``columns_used`` (and for top-N only the rows with a key): same states."""
    batch = pa.Table.from_batches(list(generate_events(20_000, services=5, seed=9)))
    keep = list(columns_used(definitions))
    pruned = batch.select(keep)
    keys = topn_only_filter(definitions)
    if keys:
        mask = None
        for key in keys:
            has = pc.fill_null(pc.not_equal(pruned.column(key), ""), False)
            mask = has if mask is None else pc.or_(mask, has)
        pruned = pruned.filter(mask)
    assert_same_partials(aggregate_batch(batch, definitions), aggregate_batch(fill_unused(pruned), definitions))
