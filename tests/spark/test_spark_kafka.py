"""``drainpipe stream --bootstrap-servers`` on ``local[2]`` (in this process, on the module's session, whose JVM has
the connector): Spark's Kafka source into the store, the same values as ``drainpipe consume`` on the same topic, against
the real broker `make test` starts; poison messages in the dead letter with topic, partition and offset, as consume
writes them; a rerun from the checkpoint finds nothing new; OTLP protobuf messages. The kill of a stream between a
micro-batch's store commit and Spark's commit of it is in test_spark_cluster.py (on the standalone cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest
from spark_testlib import SPARK, assert_same_results

from drainpipe.pipeline.definitions import default_definitions
from drainpipe.spark import KafkaTopics, run_stream
from drainpipe.spark.kafka import MAX_MESSAGES
from kafka_testlib import consume, finish, new_topic, produce, produce_otlp, rejected, stored_calls

pytestmark = [*SPARK, pytest.mark.kafka, pytest.mark.usefixtures("no_member_left")]


def _stream(session: object, servers: str, topic: str, tmp_path: Path, encoding: str = "json",
            max_messages: int | None = None, batches: list | None = None) -> dict:  # fmt: skip
    return run_stream(KafkaTopics.at(servers, [topic], encoding, max_messages or MAX_MESSAGES), spark=session,
                      store_url=f"duckdb:///{tmp_path / 'stream.duckdb'}", checkpoint=str(tmp_path / "ck"),
                      dead_letter=str(tmp_path / "stream.jsonl"), trigger_once=True,
                      on_batch=None if batches is None else lambda _, summary: batches.append(summary))  # fmt: skip


def test_a_stream_from_kafka_stores_what_consume_stores(spark, servers: str, tmp_path: Path) -> None:
    """In micro-batches of at most 40 messages (of about 40 events): the first merges its states in Spark, the later
    ones (few state rows) on the driver; the store is the same."""
    topic = new_topic(servers, 3)
    calls = produce(servers, topic, 6_000, seed=3)  # with the poison messages
    reference = f"duckdb:///{tmp_path / 'consume.duckdb'}"
    # the reference member reads the topic while the stream does (each its own offsets): the test waits for one
    member = consume(servers, topic, f"g-{topic}", reference, tmp_path / "consume.jsonl", "--exit-at-end")
    batches: list[dict] = []
    summary = _stream(spark, servers, topic, tmp_path, max_messages=40, batches=batches)
    finish(member)
    assert stored_calls(reference) == calls
    assert (summary["accepted"], summary["rejected"]) == (sum(calls.values()), 4), summary
    assert summary["batches"] >= 3, summary
    merged = ["aggregate+collect" in b["stage_s"] for b in batches if b["messages"]]  # in the job's one action
    assert merged[0] is False and all(merged[1:]), batches
    assert_same_results(reference, f"duckdb:///{tmp_path / 'stream.duckdb'}", default_definitions())
    # topic/partition, offset and reason of each poison message, once
    assert rejected(tmp_path / "stream.jsonl") == rejected(tmp_path / "consume.jsonl")
    assert (tmp_path / "stream.jsonl").read_text().count("\n") == 4
    again = _stream(spark, servers, topic, tmp_path)
    assert again["read"] == 0, again


def test_otlp_protobuf_messages_stream_as_consume_reads_them(spark, servers: str, tmp_path: Path) -> None:
    """``--encoding otlp_proto`` (an export per message, as the Collector's Kafka exporter writes): the same store
    and the same reject (the message that is not an export) as ``consume``."""
    topic = new_topic(servers, 2)
    calls = produce_otlp(servers, topic)
    reference = f"duckdb:///{tmp_path / 'consume.duckdb'}"
    member = consume(servers, topic, f"g-{topic}", reference, tmp_path / "consume.jsonl", "--encoding", "otlp_proto",
                     "--exit-at-end")  # fmt: skip
    _stream(spark, servers, topic, tmp_path, "otlp_proto")  # (while the reference member reads)
    finish(member)
    assert stored_calls(reference) == +calls
    assert_same_results(reference, f"duckdb:///{tmp_path / 'stream.duckdb'}", default_definitions())
    [(_, _, reason)] = rejected(tmp_path / "stream.jsonl")
    assert rejected(tmp_path / "stream.jsonl") == rejected(tmp_path / "consume.jsonl")
    assert reason.startswith("invalid OTLP protobuf")


def test_a_definition_added_between_streams_reads_the_topic_from_its_start(spark, servers: str, tmp_path: Path) -> None:
    """A stream with one more definition, on a store that has the topic applied for the others: the new one reads
    every message, the others only those after their offsets (the exactly-once driver's policy, as ``consume`` and
    ``run`` have it), one job and one transaction per set, the new definition's first. The store then equals a
    ``consume`` of the whole topic with the larger set. (Before the driver, the stream refused such a store.)"""
    from drainpipe.pipeline import definitions_from

    metrics = tmp_path / "more.toml"
    metrics.write_text('defaults = true\n[[metric]]\nname = "endpoint_slow_calls"\nscope = "endpoint"\n'
                       'function = "count"\nwhere = "latency_ms > 250"\n')  # fmt: skip
    more = definitions_from(str(metrics))
    topic = new_topic(servers, 2)
    calls = produce(servers, topic, 3_000, seed=5, poison=False)
    store = f"duckdb:///{tmp_path / 'stream.duckdb'}"
    run_stream(KafkaTopics.at(servers, [topic]), spark=spark, store_url=store, checkpoint=str(tmp_path / "ck1"),
               dead_letter=str(tmp_path / "stream.jsonl"), trigger_once=True)  # fmt: skip
    calls += produce(servers, topic, 2_000, seed=6, poison=False)
    reference = f"duckdb:///{tmp_path / 'consume.duckdb'}"  # the whole topic, read while the second stream runs
    member = consume(servers, topic, f"g-{topic}", reference, tmp_path / "consume.jsonl", "--metrics", str(metrics),
                     "--exit-at-end")  # fmt: skip
    summary = run_stream(KafkaTopics.at(servers, [topic]), definitions=more, spark=spark, store_url=store,
                         checkpoint=str(tmp_path / "ck2"), dead_letter=str(tmp_path / "stream.jsonl"),
                         trigger_once=True)  # fmt: skip
    assert summary["accepted"] == 3_000 + 2_000, summary  # the first 3,000 for the new one alone, then 2,000 for all
    assert stored_calls(store) == calls
    finish(member)
    assert_same_results(reference, store, more)
