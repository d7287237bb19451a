"""The Spark job's units that need no JVM: how file splits are dealt to tasks, and how metric states travel packed
(tasks -> JVM -> driver) and are laid out as rows again for a merge in Spark."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS, MetricDef
from drainpipe.pipeline.generator import generate_events
from drainpipe.pipeline.partials import MetricPartial, TopNPartial
from drainpipe.spark import rows as rows_module
from drainpipe.spark.daemon import installed_copies, without_installed_copies
from drainpipe.spark.engine import task_groups
from drainpipe.spark.rows import (
    METRIC,
    PACK_ROWS,
    STATE_ROWS,
    TOPN,
    packed_rows,
    partial_rows,
    unpack_rows,
    unpacked_partials,
)
from drainpipe.spark.splits import Split


def _splits(weights: list[int]) -> list[Split]:
    return [Split(i, part=None, weight=w) for i, w in enumerate(weights)]  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=60), st.integers(1, 12))
def test_task_groups_cut_the_plan_into_even_runs_heaviest_first(weights: list[int], tasks: int) -> None:
    splits = _splits(weights)
    groups = task_groups(splits, tasks)
    assert len(groups) == min(tasks, len(splits)) and all(groups)
    for group in groups:  # a task reads consecutive parts, in plan order
        assert [s.index for s in group] == list(range(group[0].index, group[0].index + len(group)))
    assert sorted(s.index for g in groups for s in g) == list(range(len(splits)))  # each split in exactly one task
    loads = [sum(s.weight for s in g) for g in groups]
    assert loads == sorted(loads, reverse=True)  # Spark schedules partition 0 first
    assert max(loads) <= sum(weights) / len(groups) + max(weights)  # no run beyond its share and one split


def test_task_groups_of_equal_splits_are_even() -> None:
    groups = task_groups(_splits([100] * 16), 4)
    assert [[s.index for s in g] for g in groups] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert [[s.index for s in g] for g in task_groups(_splits([5]), 8)] == [[0]]


@pytest.fixture(scope="module")
def partials() -> list[tuple[int, MetricPartial]]:
    batch = pa.Table.from_batches(list(generate_events(20_000, services=5, seed=7)))
    out = []
    for index, partial in enumerate(aggregate_batch(batch, DEFAULT_DEFINITIONS)):
        if isinstance(partial, MetricPartial) and partial.table.num_rows:
            out.append((index, partial))
    return out


def test_packed_metric_states_come_back_as_they_were(partials: list[tuple[int, MetricPartial]]) -> None:
    rows = pa.Table.from_batches([b for i, p in partials for b in packed_rows(i, p)])
    assert rows.schema == STATE_ROWS and pc.all(pc.equal(rows.column("kind"), METRIC)).as_py()
    assert rows.num_rows == len(partials)  # one blob each: none of these reaches PACK_ROWS states
    back = unpacked_partials(rows, DEFAULT_DEFINITIONS)
    for index, partial in partials:
        (only,) = back[index]
        assert only.table.equals(partial.table) and type(only) is type(partial) and only.granularity == "minute"


def test_unpacked_rows_are_one_state_row_each_and_other_rows_pass(partials: list[tuple[int, MetricPartial]]) -> None:
    index, partial = max(partials, key=lambda p: p[1].table.num_rows)
    topn = next(i for i, d in enumerate(DEFAULT_DEFINITIONS.all) if not isinstance(d, MetricDef))
    other = pa.RecordBatch.from_pylist([{"kind": TOPN, "d": topn, "entity": "e", "key": "k"}], schema=STATE_ROWS)
    out = pa.Table.from_batches(list(unpack_rows(iter([*packed_rows(index, partial), other]))))
    states = out.filter(pc.equal(out.column("kind"), METRIC))
    assert states.num_rows == partial.table.num_rows and pc.all(pc.equal(states.column("d"), index)).as_py()
    for name in partial.table.column_names:
        assert states.column(name).equals(partial.table.column(name)), name
    if "b" not in partial.table.column_names:
        assert pc.all(pc.equal(states.column("b"), -1)).as_py()
    assert out.filter(pc.equal(out.column("kind"), TOPN)).to_pylist()[0]["key"] == "k"


def test_many_states_are_cut_into_blobs_of_pack_rows_and_batches_of_bounded_bytes(
    partials: list[tuple[int, MetricPartial]], monkeypatch: pytest.MonkeyPatch
) -> None:
    index, partial = partials[0]
    repeats = PACK_ROWS // partial.table.num_rows + 2
    big = type(partial)(pa.concat_tables([partial.table] * repeats), "minute")  # (keys repeat: a packing test)
    blobs = -(-big.table.num_rows // PACK_ROWS)
    (rows,) = packed_rows(index, big)
    assert rows.num_rows == blobs >= 2
    (back,) = unpacked_partials(pa.Table.from_batches([rows]), DEFAULT_DEFINITIONS).values()
    assert pa.concat_tables(p.table for p in back).equals(big.table)
    # a binary column's offsets are 32-bit: a batch ends once its blobs pass PACK_BATCH_BYTES (here: each blob)
    monkeypatch.setattr(rows_module, "PACK_BATCH_BYTES", 1)
    batches = list(packed_rows(index, big))
    assert [b.num_rows for b in batches] == [1] * blobs
    (back,) = unpacked_partials(pa.Table.from_batches(batches), DEFAULT_DEFINITIONS).values()
    assert pa.concat_tables(p.table for p in back).equals(big.table)


def test_top_n_states_travel_as_rows() -> None:
    batch = pa.Table.from_batches(list(generate_events(2_000, services=3, seed=1)))
    topns = [(i, p) for i, p in enumerate(aggregate_batch(batch, DEFAULT_DEFINITIONS)) if isinstance(p, TopNPartial)]
    i, topn = next((i, p) for i, p in topns if p.table.num_rows)
    rows = partial_rows(i, topn)
    assert rows.num_rows == topn.table.num_rows and rows.column("ipc").null_count == rows.num_rows
    assert pc.all(pc.equal(rows.column("kind"), TOPN)).as_py()


def test_the_local_daemon_drops_only_zips_of_an_installed_pyspark(tmp_path) -> None:  # type: ignore[no-untyped-def]
    site = tmp_path / "site"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    zips = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    assert installed_copies([*zips, str(site)]) == zips[:1]  # py4j is not installed beside it
    (site / "py4j").mkdir()
    (site / "py4j" / "__init__.py").write_text("")
    assert installed_copies([*zips, str(site)]) == zips
    assert installed_copies(zips) == []  # the install is not on the path: the zips are all there is
    assert installed_copies(["/opt/spark/python/lib/pyspark.zip", str(site)]) == []


def test_the_local_daemon_keeps_the_zips_when_another_pyspark_comes_first(tmp_path) -> None:  # type: ignore[no-untyped-def]
    site = tmp_path / "site"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    for package in ("pyspark", "py4j"):
        (site / package).mkdir(exist_ok=True)
        (site / package / "__init__.py").write_text("")
    zips = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    assert without_installed_copies([*zips, str(site)]) == [str(site)]
    other = tmp_path / "other"
    (other / "pyspark").mkdir(parents=True)
    (other / "pyspark" / "__init__.py").write_text("")  # another pyspark, earlier on the path than the install
    path = [*zips, str(other), str(site)]
    assert without_installed_copies(path) == path
