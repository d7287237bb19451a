"""Kafka topics as the Spark stream's input: Spark's Kafka source, each micro-batch exactly once into the store.

::

    readStream.format("kafka") (at most max_messages a micro-batch)
      --micro-batch (topic, partition, offset, value)--> foreachBatch(ingest_messages):
        the store's offsets of the topics' partitions (the ``kafka`` parts, as ``consume``'s), one query
        --mapInArrow(read_states(message_reader): per task, its messages past the store's offset decoded and
          aggregated; per partition seen, a SPLIT row with its counts and where the batch ends)
        --> merge_states (the batch engine's) --> the store, with each partition's next offset in the same
        transaction

Each record is read once: the job does not need the micro-batch's offset ranges before it runs. A partition the
store knows is read from its offset; one it has never seen, from the batch's start; the tasks report where each
partition's messages in the batch end, and the books advance to there. (Spark's micro-batch holds offset ranges
the driver cannot see through PySpark without a job; such a job read every record a second time.)

Exactly once: Spark's checkpoint pins each micro-batch's offset ranges and runs a batch again after a crash until
its commit log has it; the store holds each partition's next offset in the transaction of the states (as a
``consume`` member's commits do, under the same part names ``<cluster id>/<topic>/<partition>``), so a batch run
again finds its messages applied and skips them. Consumer-group options do not apply: Spark tracks its offsets in
the checkpoint, not in a group. A definition added since the store last saw a partition reads it from its own
offset while the others skip what they have (the driver's policy): then the batch takes one job per set of
definitions, the fewest first, each reading the batch's records again. It reads only what the batch holds: with a
reused checkpoint, the messages before its position are passed over as retention's are (a new checkpoint reads the
topic from its start).

A micro-batch reads at most :data:`MAX_MESSAGES` messages by default (Spark's ``maxOffsetsPerTrigger``), so a
first start over a large topic does not make one huge batch: a task holds one Arrow batch of messages at a time
and the states of what it has read, and a crash repeats at most one micro-batch.

The connector is Spark's ``spark-sql-kafka-0-10`` of the installed PySpark's version, which Spark fetches from
Maven Central itself (``spark.jars.packages``, :func:`connector_package`), driver and executors alike.

Messages are decoded by :func:`drainpipe.inputs.messages.decode_values`, as ``consume`` decodes them (``--encoding
json``: one event or NDJSON lines per message; ``otlp_proto``/``otlp_json``: an OTLP export per message); a
tombstone or a record that does not validate goes to the dead letter as
``{"source": "kafka:<topic>/<partition>", "line": <offset>, ...}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from drainpipe.errors import UsageError
from drainpipe.inputs import DeadLetter, EventBatch, Part, Position, ReadStats, jsonable
from drainpipe.inputs.endpoints import EndpointRules
from drainpipe.inputs.messages import KAFKA_SOURCE, check_encoding, decode_values, message_source, partition_part
from drainpipe.inputs.spans import SpanMapping
from drainpipe.pipeline import Definitions, Driver, PartBooks, SourceProgress, Store, books_from

from . import skew
from .commits import JobCommit
from .engine import JobOptions, JobResult, inline_rows, job_route, merge_states, parallelism, per_type_stage
from .rows import EVENT_ROWS, REJECT, SPLIT, STATE_ROWS, info_row, meta_rows, spark_schema
from .splits import Split
from .states import FrameStates
from .tasks import EventReader, read_events, read_states

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamReader

__all__ = ["KafkaTopics", "MessagePlan", "MAX_MESSAGES", "connector_package", "message_reader", "ingest_messages"]

#: the messages a micro-batch reads at most, unless the stream says otherwise (Spark's ``maxOffsetsPerTrigger``)
MAX_MESSAGES = 1_000_000


@dataclass(frozen=True)
class KafkaTopics:
    """What the stream reads: ``topics`` at ``bootstrap_servers`` (of the cluster ``cluster``, its id)."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    cluster: str
    encoding: str = "json"
    max_messages: int | None = MAX_MESSAGES  # per micro-batch (Spark's maxOffsetsPerTrigger); None: all there are

    @classmethod
    def at(cls, bootstrap_servers: str, topics: Sequence[str], encoding: str = "json",
           max_messages: int | None = MAX_MESSAGES) -> KafkaTopics:  # fmt: skip
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
            # a task's consumer fetches ahead, and a fetch at a partition's end waits this long for more: the
            # default 500 ms held up every micro-batch that read to the end (each of a live stream's)
            .option("kafka.fetch.max.wait.ms", "10")
            .option("failOnDataLoss", "false")  # retention deleted messages no one read: counted by nobody (docs)
        )
        return reader.option("maxOffsetsPerTrigger", str(self.max_messages)) if self.max_messages else reader


def connector_package() -> str:
    """The Maven coordinate of the installed PySpark's Kafka connector (for ``spark.jars.packages``)."""
    import pyspark

    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


#: a partition's split index (its rejects' ``d``): its topic's place in the stream's list, shifted, or its number
_PARTITION_BITS = 20


@dataclass(frozen=True)
class MessagePlan:
    """What one job reads of a micro-batch (plain data: it goes to the tasks). ``ranges``: per topic partition the
    store has books for and this job reads, the offsets ``[lo, hi)`` (``hi`` None: to the batch's end); a partition
    the store has books for but not in ``ranges`` is not read; one it has none for is read whole if ``unknown``."""

    topics: tuple[str, ...]
    ranges: Mapping[tuple[str, int], tuple[int, int | None]]
    known: frozenset[tuple[str, int]]
    unknown: bool

    def reading(self, key: tuple[str, int]) -> tuple[int, int | None] | None:
        """The offsets of partition ``key`` this job reads, or None."""
        if key in self.ranges:
            return self.ranges[key]
        return (0, None) if self.unknown and key not in self.known else None

    def split_index(self, topic: str, partition: int) -> int:
        """The split index of a partition (:class:`ValueError` past 2,048 topics or 2^20 partitions a topic)."""
        place = self.topics.index(topic)
        if partition >> _PARTITION_BITS or place >> (31 - _PARTITION_BITS):
            raise ValueError(f"kafka:{topic}/{partition}: a stream reads at most 2,048 topics of 2^20 partitions")
        return place << _PARTITION_BITS | partition


class _PartitionSplits(dict[int, Split]):
    """Every partition of the topics as a split, made when its index is first looked up (the tasks compute the
    index, :meth:`MessagePlan.split_index`, so a partition no one listed still names its rejects' source)."""

    def __init__(self, topics: tuple[str, ...]) -> None:
        super().__init__()
        self.topics = topics

    def key(self, index: int) -> tuple[str, int]:
        return self.topics[index >> _PARTITION_BITS], index & ((1 << _PARTITION_BITS) - 1)

    def __missing__(self, index: int) -> Split:
        split = self[index] = Split(index, Part(message_source(*self.key(index)), "kafka", False, 0), 1)
        return split


def _partitions(column: pa.Array, partitions: np.ndarray) -> Iterator[tuple[tuple[str, int], np.ndarray]]:
    """The rows of an Arrow batch of messages per topic partition (a task's batch is mostly one partition)."""
    topics = pc.unique(column).to_pylist()
    first, last = int(partitions.min()), int(partitions.max())
    if len(topics) == 1 and first == last:
        yield (topics[0], first), np.arange(len(partitions))
        return
    names = np.asarray(column.to_pylist(), dtype=object)
    for topic in topics:
        in_topic = names == topic
        for partition in np.unique(partitions[in_topic]).tolist():
            yield (topic, partition), np.flatnonzero(in_topic & (partitions == partition))


def message_reader(
    plan: MessagePlan, encoding: str, spans: SpanMapping, endpoints: EndpointRules, *, dictionaries: bool = False
) -> EventReader:
    """The :data:`~drainpipe.spark.tasks.EventReader` of a micro-batch's messages (``topic, partition, offset,
    value``): each partition's messages in the offsets ``plan`` reads decoded (``encoding``; ``dictionaries``:
    :func:`~drainpipe.inputs.messages.decode_values`'s flag) into events, with their rejects (``line`` the offset)
    and, per partition seen, a SPLIT row of its counts whose ``end`` is the offset after its last message in the
    task and the messages it saw there (a file's bytes and lines). Plain data only: it runs in the executors."""

    def read(batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> Iterator[EventBatch | pa.RecordBatch]:
        stats: dict[int, ReadStats] = {}
        ends: dict[int, int] = {}
        seen_messages: dict[int, int] = {}
        for batch in batches:
            if not batch.num_rows:
                continue
            offsets = batch.column("offset").to_numpy(zero_copy_only=False)
            values = batch.column("value")
            for key, rows in _partitions(batch.column("topic"), batch.column("partition").to_numpy(False)):
                d = plan.split_index(*key)
                seen = offsets[rows]
                ends[d] = max(ends.get(d, 0), int(seen.max()) + 1)
                seen_messages[d] = seen_messages.get(d, 0) + len(seen)
                span = plan.reading(key)
                if span is None:
                    continue
                lo, hi = span
                wanted = seen >= lo if hi is None else (seen >= lo) & (seen < hi)
                keep = rows[wanted]
                if not len(keep):
                    continue
                counts = stats.setdefault(d, ReadStats())
                taken = values if len(keep) == len(values) else values.take(keep)  # (keep is then every row, in order)
                decoded, rejects = decode_values(
                    taken.to_pylist(), encoding, spans, endpoints, dictionaries=dictionaries
                )
                counts.add_accepted(decoded.rows.num_rows)
                for reason, n in decoded.warnings:
                    counts.add_warning(reason, n)
                if rejects:
                    for _, _, reason in rejects:
                        counts.add_rejected(reason)
                    yield meta_rows(
                        schema, REJECT, [d] * len(rejects), line=[int(offsets[keep[k]]) for k, _, _ in rejects],
                        raw=[json.dumps(jsonable(raw), ensure_ascii=False) for _, raw, _ in rejects],
                        reason=[reason for _, _, reason in rejects],
                    )  # fmt: skip
                if decoded.rows.num_rows:
                    yield decoded
        for d, end in ends.items():
            counts = stats.get(d, ReadStats())
            yield info_row(schema, SPLIT, d, {"read": counts.read, "accepted": counts.accepted, "rejected":
                           counts.rejected, "reasons": dict(counts.reasons), "warnings": dict(counts.warnings),
                           "end": [end, seen_messages[d]], "nbytes": 0})  # fmt: skip

    return read


def _books(store: Store, source: KafkaTopics, names: Sequence[str]) -> dict[tuple[str, int], PartBooks]:
    """The books the store has for the topics' partitions (one query), per ``(topic, partition)``."""
    topics = {partition_part(source.cluster, topic, 0).removesuffix("/0"): topic for topic in source.topics}
    rows: dict[tuple[str, int], list[SourceProgress]] = {}
    for row in store.progress(KAFKA_SOURCE):
        prefix, _, number = row.part.rpartition("/")
        if (topic := topics.get(prefix)) is not None:
            rows.setdefault((topic, int(number)), []).append(row)
    return {key: books_from(KAFKA_SOURCE, found[0].part, names, found) for key, found in rows.items()}


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
    store.register(definitions.all)
    commits = JobCommit(store)
    driver = Driver(definitions, commits, dead_letter=dead_letter)
    known = _books(store, source, definitions.names)
    groups: dict[frozenset[str], dict[tuple[str, int], tuple[int, int | None]]] = {}
    for key, held in sorted(known.items()):
        start = held.start.offset
        cuts = sorted({start} | {p.offset for p in held.applied.values() if p.offset > start})
        for lo, hi in zip(cuts, [*cuts[1:], None]):
            if names := driver.wanted(held, lo):
                groups.setdefault(names, {})[key] = (lo, hi)
    groups.setdefault(driver.names, {})  # and the partitions the store has no books for: every definition
    splits = _PartitionSplits(source.topics)
    summary: dict[str, Any] = {"read": 0, "accepted": 0, "rejected": 0, "reasons": {}, "warnings": {}, "applied": 0,
                               "state_rows": 0, "messages": 0, "stage_s": {}}  # fmt: skip
    stats = ReadStats()
    for names, ranges in driver.in_order(groups):
        plan = MessagePlan(source.topics, ranges, frozenset(known), names == driver.names)
        selected = definitions.select(sorted(names))
        result = _job(spark, frame, plan, source.encoding, selected, options, splits)
        if dead_letter is not None:
            for path, offset, raw, reason in result.rejects:
                dead_letter.write(path, offset, raw, reason)
        for d, end in result.ends.items():
            key = splits.key(d)
            if end is None or (span := plan.reading(key)) is None:
                continue
            lo, hi = span
            stop = end[0] if hi is None else min(hi, end[0])
            if stop > lo:
                held = known.setdefault(key, books_from(KAFKA_SOURCE, partition_part(source.cluster, *key),
                                                        definitions.names))  # fmt: skip
                driver.hold(key, held)
                held.advance(names, Position(stop))
        try:
            commits.stage(selected.all, result.all_partials())
            driver.fed(result.stats.accepted)
            driver.checkpoint(wait=True)  # the dead letter flushed, then the partitions' books with the states
        finally:
            if result.release is not None:
                result.release()
        stats.merge(result.stats)
        summary["applied"] += commits.report.applied
        summary["state_rows"] = max(summary["state_rows"], result.state_rows)
        summary["messages"] = max(summary["messages"], sum(e[1] for e in result.ends.values() if e is not None))
        for stage, seconds in result.stage_s.items():
            summary["stage_s"][stage] = summary["stage_s"].get(stage, 0.0) + seconds
    summary.update(read=stats.read, accepted=stats.accepted, rejected=stats.rejected, reasons=dict(stats.reasons),
                   warnings=dict(stats.warnings))  # fmt: skip
    return summary


def _job(
    spark: SparkSession, frame: DataFrame, plan: MessagePlan, encoding: str, definitions: Definitions,
    options: JobOptions, splits: Mapping[int, Split],
) -> JobResult:  # fmt: skip
    """One job over the micro-batch's records: each task decodes and aggregates its messages (``per_type="map"``,
    the default), or decodes them for the per-type stage. The topic partitions' ranges are coalesced into a task
    per core: a task's fixed costs are paid once a core, and one task's states cover several partitions' keys (half
    the state rows on two cores). Merged states are handed out in chunks only when the tasks' state rows are many
    (:func:`~drainpipe.spark.engine.merge_states`)."""
    tasks = parallelism(spark)
    messages = frame.select("topic", "partition", "offset", "value").coalesce(tasks)
    job = replace(options, stream_metrics=True)
    if options.per_type == "map":
        # the scanner's dictionary codes kept: the task only aggregates (as a file job's scan_states reads)
        reader = message_reader(plan, encoding, definitions.spans, definitions.endpoints, dictionaries=True)
        stage = read_states(definitions, reader, "decode+aggregate", inline_rows(job, tasks))
        states = FrameStates(messages.mapInArrow(stage, spark_schema(STATE_ROWS)), job_route(definitions, job, tasks))
        return merge_states(spark, states, definitions, job, splits)
    partitions = max(1, int(spark.conf.get("spark.sql.shuffle.partitions") or 8))
    reader = message_reader(plan, encoding, definitions.spans, definitions.endpoints)
    events = messages.mapInArrow(read_events(reader, "decode"), spark_schema(EVENT_ROWS))
    return per_type_stage(spark, events, definitions, skew.hash_placement(partitions), job, splits)
