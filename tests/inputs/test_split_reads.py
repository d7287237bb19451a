"""A Spark task's reads of its splits, outside Spark (the task functions are plain Python): an aggregating task
reads the codes the reader gives, as the local engine's workers do, with the same values."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from drainpipe.inputs import plan_parts
from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS
from drainpipe.pipeline.generator import generate_events, write_events
from drainpipe.spark import tasks
from drainpipe.spark.splits import Split, plan_splits, read_split

BLOCK = 1_000


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("splits")
    out = {}
    for fmt in ("jsonl", "csv", "parquet"):
        out[fmt] = d / f"events.{fmt}"
        write_events(generate_events(5_000, services=5, seed=7), out[fmt])
    # text that is not ASCII: the C scanner declines such a part's range; its blocks are read line by line first
    rows = pa.Table.from_batches(list(generate_events(5_000, services=5, seed=8))).to_pylist()
    out["jsonl-unicode"] = d / "unicode.jsonl"
    out["jsonl-unicode"].write_text("".join(json.dumps({**r, "service": r["service"] + "-é"}, ensure_ascii=False)
                                            + "\n" for r in rows), encoding="utf-8")  # fmt: skip
    return out


def _first_split(path: Path) -> Split:
    return plan_splits(list(plan_parts(str(path), BLOCK, workers=2)))[0]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet", "jsonl-unicode"])
def test_a_split_read_with_the_readers_codes_has_the_same_values_rejects_and_states(files, fmt) -> None:
    """``read_split(dictionaries=True)`` keeps the string columns the reader gives dictionary-encoded, with the
    same values, counts and rejects as a plain read, and the same aggregation."""
    split = _first_split(files[fmt])
    plain_reader, plain_result = read_split(split)
    coded_reader, coded_result = read_split(split, dictionaries=True)
    plain, coded = [b.rows for b in plain_reader], [b.rows for b in coded_reader]
    assert plain_result.stats.accepted == coded_result.stats.accepted > 0
    assert plain_result.rejects == coded_result.rejects
    assert any(pa.types.is_dictionary(column.type) for batch in coded for column in batch.columns)
    for a, b in zip(plain, coded, strict=True):
        assert b.schema.names == a.schema.names
        for plain_column, column in zip(a.columns, b.columns):
            decoded = column.dictionary_decode() if pa.types.is_dictionary(column.type) else column
            assert decoded.equals(plain_column)
        keys = [("entity", "ascending"), ("bucket", "ascending")]
        for x, y in zip(aggregate_batch(a, DEFAULT_DEFINITIONS), aggregate_batch(b, DEFAULT_DEFINITIONS), strict=True):
            assert x.table.sort_by(keys).equals(y.table.sort_by(keys)), x.definition.name


def test_an_aggregating_task_asks_for_the_codes_and_a_task_that_hands_events_to_spark_does_not(
    files, monkeypatch
) -> None:
    """``scan_states`` (aggregates in the task) reads with ``dictionaries``; ``scan_events`` (its events go to
    Spark's own rows) reads plain strings."""
    asked: list[bool] = []

    def recording(split: Split, *, dictionaries: bool = False):  # type: ignore[no-untyped-def]
        asked.append(dictionaries)
        return read_split(split, dictionaries=dictionaries)

    monkeypatch.setattr(tasks, "read_split", recording)
    groups = [[_first_split(files["parquet"])]]
    ids = pa.record_batch({"id": pa.array([0], pa.int64())})
    assert list(tasks.scan_states(DEFAULT_DEFINITIONS, groups)(iter([ids])))
    assert asked == [True]
    asked.clear()
    assert list(tasks.scan_events(groups)(iter([ids])))
    assert asked == [False]


def test_a_micro_batch_reader_keeps_the_scanners_codes_only_when_asked() -> None:
    """The Kafka stream's reader (``message_reader``) passes ``dictionaries`` down to the JSON scanner: with it the
    events' service column comes dictionary-encoded, without it plain, with the same values and counts."""
    from drainpipe.inputs.endpoints import EndpointRules
    from drainpipe.inputs.spans import SpanMapping
    from drainpipe.spark.kafka import MessagePlan, message_reader
    from drainpipe.spark.rows import STATE_ROWS

    batch = next(generate_events(200, services=3, seed=11))
    lines = [json.dumps(row).encode() for row in batch.to_pylist()]
    messages = pa.record_batch(
        {
            "topic": pa.array(["t"] * len(lines)),
            "partition": pa.array([0] * len(lines), pa.int32()),
            "offset": pa.array(range(len(lines)), pa.int64()),
            "value": pa.array(lines, pa.binary()),
        }
    )
    plan = MessagePlan(("t",), {}, frozenset(), True)

    def events(dictionaries: bool) -> pa.Table:
        read = message_reader(plan, "json", SpanMapping(), EndpointRules(), dictionaries=dictionaries)
        out = [item.rows for item in read(iter([messages]), STATE_ROWS) if not isinstance(item, pa.RecordBatch)]
        return pa.Table.from_batches(out)

    plain, coded = events(False), events(True)
    assert plain.num_rows == coded.num_rows == len(lines)
    assert not pa.types.is_dictionary(plain.schema.field("service").type)
    assert pa.types.is_dictionary(coded.schema.field("service").type)
    assert coded.column("service").cast(pa.string()).equals(plain.column("service"))
