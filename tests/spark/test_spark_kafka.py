"""``drainpipe stream --bootstrap-servers``: Spark's Kafka source into the store, the same values as ``drainpipe
consume`` on the same topic, against the real broker `make test` starts. Poison messages go to the dead letter with
topic, partition and offset, as consume sends them; a stream killed between a micro-batch's store commit and Spark's
commit of it counts every event once when restarted."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from spark_testlib import SPARK, assert_same_results

from drainpipe.pipeline.definitions import default_definitions
from kafka_testlib import (
    DRAINPIPE,
    POISON,
    consume,
    finish,
    new_topic,
    produce,
    produce_otlp,
    rejected,
    stored_calls,
)

pytestmark = [*SPARK, pytest.mark.kafka, pytest.mark.usefixtures("no_member_left")]
HERE = Path(__file__).parent


def test_a_stream_from_kafka_killed_after_a_stored_micro_batch_stores_what_consume_stores(
    servers: str, tmp_path: Path
) -> None:
    """The stream (100 messages a micro-batch) kills itself (SIGKILL) right after micro-batch 0 reached the store,
    before Spark marked it committed in its checkpoint: the worst moment for exactly once. Restarted from the
    checkpoint, Spark runs batch 0 again, which finds its offsets in the store and changes nothing, then the rest.
    The store then holds what ``drainpipe consume`` stores from the same topic, and the dead letter each of its
    rejects once."""
    topic = new_topic(servers, 3)
    calls = produce(servers, topic, 6_000, seed=4)  # with the poison messages
    reference = f"duckdb:///{tmp_path / 'consume.duckdb'}"
    finish(consume(servers, topic, f"g-{topic}", reference, tmp_path / "consume.jsonl", "--exit-at-end"))
    assert stored_calls(reference) == calls
    url, dead = f"duckdb:///{tmp_path / 'stream.duckdb'}", tmp_path / "stream.jsonl"
    args = [sys.executable, str(HERE / "stream_child.py"), f"kafka://{servers}/{topic}", url, str(tmp_path / "ck"),
            str(dead)]  # fmt: skip
    killed = subprocess.run([*args, "0"], cwd=HERE, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9 and "batch 0 stored" in killed.stdout, killed.stdout + killed.stderr[-3000:]
    assert 0 < sum(stored_calls(url).values()) < sum(calls.values())
    resumed = subprocess.run([*args, "-1"], cwd=HERE, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_results(reference, url, default_definitions())
    assert Counter(reason for _, _, reason in rejected(dead)) == Counter(reason for _, reason in POISON)
    assert rejected(dead) == rejected(tmp_path / "consume.jsonl")  # the same topic/partition, offset and reason


def test_otlp_protobuf_messages_stream_as_consume_reads_them(servers: str, tmp_path: Path) -> None:
    """``--encoding otlp_proto`` (an export per message, as the Collector's Kafka exporter writes): the same store
    and the same reject (the message that is not an export) as ``consume``."""
    topic = new_topic(servers, 2)
    calls = produce_otlp(servers, topic)
    reference = f"duckdb:///{tmp_path / 'consume.duckdb'}"
    finish(consume(servers, topic, f"g-{topic}", reference, tmp_path / "consume.jsonl", "--encoding", "otlp_proto",
                   "--exit-at-end"))  # fmt: skip
    assert stored_calls(reference) == +calls
    url, dead = f"duckdb:///{tmp_path / 'stream.duckdb'}", tmp_path / "stream.jsonl"
    done = subprocess.run(
        [DRAINPIPE, "stream", "-q", "--bootstrap-servers", servers, "--topic", topic, "--encoding", "otlp_proto",
         "--store", url, "--checkpoint", str(tmp_path / "ck"), "--dead-letter", str(dead), "--trigger-once",
         "--spark-master", "local[2]"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert_same_results(reference, url, default_definitions())
    [(source, _, reason)] = rejected(dead)
    assert rejected(dead) == rejected(tmp_path / "consume.jsonl") and reason.startswith("invalid OTLP protobuf")
