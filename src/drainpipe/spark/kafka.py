"""Kafka topics as the Spark stream's input: Spark's Kafka source, each micro-batch exactly once into the store.

::

    readStream.format("kafka") --micro-batch (topic, partition, offset, value)--> foreachBatch(ingest_messages):
        offset ranges per partition (a small job) -> the store's offsets (the ``kafka`` parts, as ``consume``'s)
        --mapInArrow(decode_messages: messages past the store's offset, JSON values as one block per Arrow batch)
        --> events + REJECT/SPLIT rows --> per_type_stage (the batch engine's) --> the store, with each
        partition's next offset in the same transaction

Exactly once: Spark's checkpoint pins each micro-batch's offset ranges and runs a batch again after a crash until
its commit log has it; the store holds each partition's next offset in the transaction of the states (as a
``consume`` member's commits do, under the same part names ``<cluster id>/<topic>/<partition>``), so a batch run
again finds its messages applied and skips them. Consumer-group options do not apply: Spark tracks its offsets in
the checkpoint, not in a group.

The connector is Spark's ``spark-sql-kafka-0-10`` of the installed PySpark's version, which Spark fetches from
Maven Central itself (``spark.jars.packages``, :func:`connector_package`), driver and executors alike.

Messages are decoded by :func:`drainpipe.inputs.messages.decode_values`, as ``consume`` decodes them (``--encoding
json``: one event or NDJSON lines per message; ``otlp_proto``/``otlp_json``: an OTLP export per message, which needs
opentelemetry-proto and ptars on the executors, as OTLP files do); a tombstone or a record that does not validate
goes to the dead letter as ``{"source": "kafka:<topic>/<partition>", "line": <offset>, ...}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from drainpipe.errors import UsageError
from drainpipe.inputs import DeadLetter, Part, Position, ReadStats, jsonable
from drainpipe.inputs.endpoints import EndpointRules
from drainpipe.inputs.messages import KAFKA_SOURCE, check_encoding, decode_values, message_source, partition_part
from drainpipe.inputs.spans import SpanMapping
from drainpipe.pipeline import Definitions, Driver, PartBooks, open_books

from . import skew
from .commits import JobCommit
from .engine import JobOptions, JobResult, per_type_stage
from .rows import EVENT_ROWS, REJECT, SPLIT, events_rows, info_row, meta_rows, spark_schema
from .splits import Split

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamReader

__all__ = ["KafkaTopics", "connector_package", "decode_messages", "ingest_messages"]

#: a micro-batch of more messages than this hands its merged metric states to the driver one partition at a time
#: (as a batch run does); a smaller one collects them at once: the 64 partitions' jobs took half of a small batch
STREAM_METRICS_ABOVE = 1_000_000


@dataclass(frozen=True)
class KafkaTopics:
    """What the stream reads: ``topics`` at ``bootstrap_servers`` (of the cluster ``cluster``, its id)."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    cluster: str
    encoding: str = "json"
    max_messages: int | None = None  # per micro-batch (Spark's maxOffsetsPerTrigger); None: all there are

    @classmethod
    def at(cls, bootstrap_servers: str, topics: Sequence[str], encoding: str = "json",
           max_messages: int | None = None) -> KafkaTopics:  # fmt: skip
        """The topics, with the cluster's id asked of the brokers (confluent-kafka; a :class:`UsageError` in one
        line when it is not installed, the brokers cannot be reached or the encoding is not read here)."""
        check_encoding(encoding)
        try:
            from confluent_kafka import KafkaException
            from confluent_kafka.admin import AdminClient
        except ImportError:
            raise UsageError("a Kafka input needs confluent-kafka: pip install 'drainpipe[kafka]'") from None
        try:
            cluster = AdminClient({"bootstrap.servers": bootstrap_servers}).list_topics(timeout=30).cluster_id
        except KafkaException as exc:
            raise UsageError(f"cannot reach Kafka at {bootstrap_servers}: {exc}") from None
        return cls(bootstrap_servers, tuple(topics), cluster or "kafka", encoding, max_messages)

    def reader(self, session: SparkSession) -> DataStreamReader:
        """Spark's Kafka source over the topics, from their earliest offsets on a first start."""
        reader = (
            session.readStream.format("kafka")
            .option("kafka.bootstrap.servers", self.bootstrap_servers)
            .option("subscribe", ",".join(self.topics))
            .option("startingOffsets", "earliest")
            .option("failOnDataLoss", "false")  # retention deleted messages no one read: counted by nobody (docs)
        )
        return reader.option("maxOffsetsPerTrigger", str(self.max_messages)) if self.max_messages else reader


def connector_package() -> str:
    """The Maven coordinate of the installed PySpark's Kafka connector (for ``spark.jars.packages``)."""
    import pyspark

    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def _topic_split(index: int, topic: str, partition: int) -> Split:
    """A split standing for one topic partition of a micro-batch: its path is the dead letter's source."""
    return Split(index, Part(message_source(topic, partition), "kafka", False, 0), 1)


def decode_messages(
    ranges: Mapping[tuple[str, int], tuple[int, int, int]], encoding: str, spans: SpanMapping,
    endpoints: EndpointRules,
) -> Any:  # fmt: skip
    """The ``mapInArrow`` function over a micro-batch's messages (``topic, partition, offset, value``): for each
    partition in ``ranges`` (``(split index, first offset, end offset)``: the offsets to read, not yet in the store
    for the definitions this job aggregates), its messages in that range decoded (``encoding``) into events (EVENT
    rows), their rejects (REJECT rows, ``line`` the offset) and counts (SPLIT rows). Plain data only: it runs in the
    executors."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        stats, first = ReadStats(), None  # the task's counts, on one SPLIT row (the report sums them)
        for batch in batches:
            topics = batch.column("topic").to_pylist()
            partitions = batch.column("partition").to_pylist()
            offsets = batch.column("offset").to_pylist()
            values = batch.column("value").to_pylist()
            keep = []
            for i, key in enumerate(zip(topics, partitions)):
                read = ranges.get(key)
                if read is not None and read[1] <= offsets[i] < read[2]:
                    keep.append(i)
            if not keep:
                continue
            first = ranges[(topics[keep[0]], partitions[keep[0]])][0] if first is None else first
            decoded, rejects = decode_values([values[i] for i in keep], encoding, spans, endpoints)
            events = decoded.rows
            stats.add_accepted(events.num_rows)
            for reason, n in decoded.warnings:
                stats.add_warning(reason, n)
            if rejects:
                for _, _, reason in rejects:
                    stats.add_rejected(reason)
                kept = [keep[k] for k, _, _ in rejects]
                yield meta_rows(
                    EVENT_ROWS, REJECT, [ranges[(topics[i], partitions[i])][0] for i in kept],
                    line=[offsets[i] for i in kept],
                    raw=[json.dumps(jsonable(raw), ensure_ascii=False) for _, raw, _ in rejects],
                    reason=[reason for _, _, reason in rejects],
                )  # fmt: skip
            if events.num_rows:
                yield events_rows(decoded)
        if first is not None:
            yield info_row(EVENT_ROWS, SPLIT, first, {"read": stats.read, "accepted": stats.accepted, "rejected":
                           stats.rejected, "reasons": dict(stats.reasons), "warnings": dict(stats.warnings),
                           "end": None, "nbytes": 0})  # fmt: skip

    return run


def ingest_messages(
    spark: SparkSession,
    frame: DataFrame,
    source: KafkaTopics,
    definitions: Definitions,
    store: Any,
    dead_letter: DeadLetter | None,
    options: JobOptions = JobOptions(),
) -> dict[str, Any]:
    """One micro-batch of messages into the store, exactly once (see the module docstring): the counts.

    On the exactly-once driver (:class:`~drainpipe.pipeline.Driver`), as every source: each partition's messages
    not yet applied are cut where the definitions that need them change (a definition added since reads what the
    others have), and each set of definitions is one job and one transaction, the fewest first."""
    from pyspark.sql import functions as F

    store.register(definitions.all)
    commits = JobCommit(store)
    driver = Driver(definitions, commits, dead_letter=dead_letter)
    ranges = frame.groupBy("topic", "partition").agg(F.max("offset").alias("last"), F.count("*").alias("n")).collect()
    groups: dict[frozenset[str], list[tuple[str, int, PartBooks, int, int]]] = {}
    for row in sorted(ranges, key=lambda r: (r.topic, r.partition)):
        held = open_books(store, KAFKA_SOURCE, partition_part(source.cluster, row.topic, row.partition),
                          definitions.names)  # fmt: skip
        start, end = held.start.offset, row.last + 1
        if start >= end:
            continue  # this micro-batch was applied before a crash: Spark runs it again
        driver.hold((row.topic, row.partition), held)
        cuts = sorted({start, end} | {p.offset for p in held.applied.values() if start < p.offset < end})
        for lo, hi in zip(cuts, cuts[1:]):
            if names := driver.wanted(held, lo):
                groups.setdefault(names, []).append((row.topic, row.partition, held, lo, hi))
    summary: dict[str, Any] = {"read": 0, "accepted": 0, "rejected": 0, "reasons": {}, "warnings": {}, "applied": 0}
    stats = ReadStats()
    messages = sum(row.n for row in ranges)
    partitions = max(1, int(spark.conf.get("spark.sql.shuffle.partitions") or 8))
    job = replace(options, stream_metrics=messages > STREAM_METRICS_ABOVE)
    for names, items in driver.in_order(groups):
        selected = definitions.select(sorted(names))
        splits = [_topic_split(i, topic, partition) for i, (topic, partition, _, _, _) in enumerate(items)]
        read = {(topic, partition): (i, lo, hi) for i, (topic, partition, _, lo, hi) in enumerate(items)}
        decode = decode_messages(read, source.encoding, definitions.spans, definitions.endpoints)
        events = frame.select("topic", "partition", "offset", "value").mapInArrow(decode, spark_schema(EVENT_ROWS))
        result: JobResult = per_type_stage(spark, events, selected, skew.hash_placement(partitions), job, splits)
        if dead_letter is not None:
            for path, offset, raw, reason in result.rejects:
                dead_letter.write(path, offset, raw, reason)
        for _, _, held, _, hi in items:
            held.advance(names, Position(hi))
        try:
            commits.stage(selected.all, result.all_partials())
            driver.fed(result.stats.accepted)
            driver.checkpoint(wait=True)  # the dead letter flushed, then the partitions' books with the states
        finally:
            if result.release is not None:
                result.release()
        stats.merge(result.stats)
        summary["applied"] += commits.report.applied
    summary.update(read=stats.read, accepted=stats.accepted, rejected=stats.rejected, reasons=dict(stats.reasons),
                   warnings=dict(stats.warnings))  # fmt: skip
    return summary
