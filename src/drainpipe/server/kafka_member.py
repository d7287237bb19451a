"""``drainpipe consume``: a member of a Kafka consumer group that feeds the local engine, exactly once into the store.

::

    broker ──consume()──> member thread ──decode──> engine.ingest ──> L1 ──> L2 ──checkpoint──> store
                            │                                                    (states + each partition's
                            │                                                     next offset, one transaction)
                            ├─ on_assign: each partition's offset read from the store; the consumer seeks there
                            ├─ on_revoke: checkpoint, wait for the store, then let the partitions go
                            └─ on_lost:   drop everything not committed (rollback); rewind the partitions kept

The design's handoff (revoke -> fence -> assign) across processes: a partition (a part of the ``kafka`` source,
named ``<cluster id>/<topic>/<partition>``; :mod:`drainpipe.inputs.source`) is applied in the store up to an offset,
in the same transaction as the states its messages brought (:class:`~drainpipe.pipeline.SourceProgress` rows, as
a file's or the write-ahead log's). The store is the truth: a member that is given a partition reads from the
store's offset (the earliest one when the store has none), and a member that gives one up commits what it read of
it first; the group's rebalance waits for that (the revoke callback runs inside ``consume()``). So a partition
moves between members, and a member killed at any moment is replaced, without an event lost or counted twice.
Offsets also go to Kafka once committed to the store, for monitoring (lag), never read back.

Messages are decoded as ``serve``'s request bodies are (:func:`drainpipe.inputs.messages.decode_values`, which the
Spark stream's tasks share): ``json`` (one event, or NDJSON
lines), ``otlp_proto`` or ``otlp_json`` (an ``ExportTraceServiceRequest``, as the Collector's Kafka exporter writes).
A message that does not decode is rejected whole, one that partly does loses the records that do not: each goes to
the dead letter (``{"source": "kafka:<topic>/<partition>", "line": <offset>, "raw": ..., "reason": ...}``; ``raw``
is the value's first 4 KB, or the record's line or span index with it), counts as read and rejected, and the
partition goes on.

With ``exit_at_end`` a member leaves once every partition it holds is read to its end (draining a topic as a
batch job; the tests).

Zombies are fenced: at every assignment the store issues the partition a new token (:meth:`Store.fence`, before its
offsets are read), and every checkpoint carries the member's tokens; a commit with a stale one (a member that was
paused past its session and has not noticed yet) writes nothing (:class:`~drainpipe.errors.Fenced`). The member
then drops everything uncommitted, gives up the partitions whose token moved on, and reads the rest again from the
store's offsets; librdkafka's "lost" callback does the same when the member notices first.

With ``--port``, :mod:`.member_http` serves the dashboard, ``/v1/stats``, ``/metrics`` (the traffic's RED series as
``serve`` has them, and per-partition lag) and ``/healthz``.

Thread-safety: one thread (the caller of :meth:`GroupMember.run`) owns the consumer, the engine's intake and the
books; rebalance callbacks run on it, inside ``consume()``. :meth:`stop` may be called from any thread.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import DrainpipeError, InputError, StoreError, UsageError
from ..inputs import DeadLetter, EventBatch, Position, ReadStats
from ..inputs.endpoints import EndpointRules
from ..inputs.messages import KAFKA_SOURCE, check_encoding, decode_values, message_source, message_text, partition_part
from ..inputs.spans import SpanMapping
from ..pipeline import (
    Commit,
    Definitions,
    LocalEngine,
    PartBooks,
    RemoteWriteOptions,
    SourceProgress,
    open_books,
)

log = logging.getLogger("drainpipe.server")


class _Repeats(logging.Filter):
    """Passes each kind of line (its text with the numbers blanked) once per ``every_s``; the next one that passes
    says how many were held back. librdkafka retries a broker that is down every few hundred milliseconds, and
    says so each time. Thread-safe."""

    def __init__(self, every_s: float) -> None:
        super().__init__()
        self.every_s = every_s
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, int]] = {}  # kind -> (when it last passed, held back since)

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        kind = re.sub(r"\d+", "#", text)[:300]
        now = time.monotonic()
        with self._lock:
            last, held = self._seen.get(kind, (-self.every_s, 0))
            if now - last < self.every_s:
                self._seen[kind] = (last, held + 1)
                return False
            if len(self._seen) > 1000:
                self._seen.clear()
            self._seen[kind] = (now, 0)
        if held:
            record.msg, record.args = f"{text} ({held} more like it in the last {now - last:.0f} s)", ()
        return True


#: librdkafka's lines and the consumer's errors, each kind at most once per 30 s
kafka_log = logging.getLogger("drainpipe.kafka")
kafka_log.addFilter(_Repeats(30.0))

__all__ = ["ConsumeConfig", "GroupMember"]

#: messages taken from the consumer per call (one-event messages: the batch's fixed costs, its validation and
#: ingest, are spread over this many events; 20,000 gave 25% less, 100,000 no more)
CONSUME_MESSAGES = 50_000
#: how often (s) the positions that /metrics and the dashboard show are refreshed between checkpoints
POSITIONS_S = 0.5


@dataclass
class ConsumeConfig:
    """What ``drainpipe consume`` was given (see ``docs/pipeline.md``, "Kafka")."""

    bootstrap_servers: str
    topics: list[str]
    group: str
    encoding: str = "json"
    session_timeout_s: float = 10.0
    max_poll_interval_s: float = 300.0
    checkpoint_s: float = 2.0
    max_commits: int = 2  # checkpoints queued for the store before the member pauses its partitions
    exit_at_end: bool = False  # leave once every partition this member holds is read to its end
    spans: SpanMapping = field(default_factory=SpanMapping)
    endpoints: EndpointRules = field(default_factory=EndpointRules)
    client: dict[str, Any] = field(default_factory=dict)  # more librdkafka settings
    remote_write: RemoteWriteOptions | None = None  # send the stored minutes to Prometheus (None: off)

    def consumer_settings(self) -> dict[str, Any]:
        check_encoding(self.encoding)
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.group,
            "partition.assignment.strategy": "cooperative-sticky",
            "enable.auto.commit": False,  # offsets go to Kafka after the store has them, for monitoring only
            "auto.offset.reset": "earliest",  # no stored position, or one a topic's retention deleted
            "session.timeout.ms": int(self.session_timeout_s * 1000),
            "heartbeat.interval.ms": max(100, int(self.session_timeout_s * 1000) // 4),
            "max.poll.interval.ms": int(self.max_poll_interval_s * 1000),
            "fetch.message.max.bytes": 16 << 20,
            # prefetch deep (librdkafka's default, 100,000 messages, kept a one-event-per-message topic at a third
            # of the rate), bounded by queued.max.messages.kbytes (64 MB); answer a fetch within 50 ms when idle
            "queued.min.messages": 1_000_000,
            "fetch.wait.max.ms": 50,
            "topic.metadata.refresh.interval.ms": 30_000,  # partitions added to a topic are taken within 30 s
            "enable.partition.eof": self.exit_at_end,
            **self.client,
        }


@dataclass
class _Partition:
    """A partition this member owns: its books (per definition, the offset the store has applied) and the next
    offset to feed (everything before it is in the engine or the store)."""

    books: PartBooks
    token: int  # the fencing token the store issued this member for the partition at assignment
    # derived from the books (reopen):
    next: int = field(init=False)
    at_end: bool = field(init=False)  # the broker said the partition ends at ``next`` (exit_at_end only)
    stored: int = field(init=False)  # the next offset the store has (after the last commit this member saw done)
    all_names: frozenset[str] = field(init=False)  # every definition ...
    all_from: int = field(init=False)  # ... needs the messages from this offset on (none is applied further)

    def __post_init__(self) -> None:
        self.reopen(self.books)

    def reopen(self, books: PartBooks) -> None:
        """Start over from ``books`` (the store's): read from its least offset."""
        self.books, self.next, self.at_end = books, books.start.offset, False
        self.stored = self.next
        self.all_names = frozenset(books.applied)
        self.all_from = max((p.offset for p in books.applied.values()), default=0)

    def fence(self) -> SourceProgress:
        """The token as a commit carries it (``Store.merge``'s ``fences``)."""
        return SourceProgress(KAFKA_SOURCE, self.books.part, "fence", self.token)


class GroupMember:
    """One member of the group; :meth:`run` until :meth:`stop`. See the module docstring."""

    def __init__(self, config: ConsumeConfig, engine: LocalEngine, definitions: Definitions,
                 dead_letter: DeadLetter | None = None) -> None:  # fmt: skip
        from confluent_kafka import Consumer, KafkaException

        self.config = config
        self.engine = engine
        self.definitions = definitions
        self.dead_letter = dead_letter
        self.stats = ReadStats()
        self.failed = ""  # why the member stopped on its own: a store commit failed for good, or a rewind failed
        self.failure: type[DrainpipeError] = StoreError  # the error that says so
        self.partitions: dict[tuple[str, int], _Partition] = {}
        self.cluster = ""
        self.assignments = self.revocations = self.losses = self.rewinds = self.fenced_commits = 0
        self.pauses = 0  # times the partitions were paused because the store was behind
        try:
            self._consumer = Consumer(config.consumer_settings(), logger=kafka_log)
        except KafkaException as exc:  # a setting librdkafka refuses (--kafka-config)
            raise UsageError(f"kafka consumer settings: {exc.args[0].str()}") from None
        self._outstanding: deque[tuple[Commit, dict[tuple[str, int], int]]] = deque()
        self._events_since = 0
        self._paused = False
        self._stop = threading.Event()
        self._closed = False
        self._all_names = frozenset(definitions.names)
        #: sees every event batch handed to the engine (the RED metrics of ``--port``)
        self.observe: Callable[[EventBatch], None] | None = None
        #: per partition held: (next offset fed, high watermark as of the last fetch or -1, next offset stored);
        #: refreshed at each checkpoint, read by ``/metrics``
        self.positions: dict[tuple[str, int], tuple[int, int, int]] = {}

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        """Join the group and feed the engine until :meth:`stop` (or a store commit fails for good); then commit
        what was read and leave the group (the partitions go to the other members at once)."""
        from confluent_kafka import KafkaException

        consumer = self._consumer
        try:
            metadata = consumer.list_topics(timeout=30)
        except KafkaException as exc:
            raise UsageError(f"cannot reach Kafka at {self.config.bootstrap_servers}: {exc}") from None
        self.cluster = metadata.cluster_id or "kafka"
        missing = [t for t in self.config.topics if t not in metadata.topics]
        if missing and self.config.exit_at_end:  # (nothing to read to its end: it would wait for ever)
            raise UsageError(f"Kafka topic {missing[0]!r} does not exist at {self.config.bootstrap_servers}")
        if missing:  # a long-running member waits: the topic may be created later
            log.warning("Kafka topic %r does not exist yet; waiting for it", missing[0])
        consumer.subscribe(self.config.topics, on_assign=self._assigned, on_revoke=self._revoked,
                           on_lost=self._lost)  # fmt: skip
        last = shown = time.monotonic()
        try:
            while not self._stop.is_set() and not self.failed and not self._at_end():
                self._reap()
                if time.monotonic() - last >= self.config.checkpoint_s:
                    self._checkpoint()  # (it refreshes the positions)
                    last = shown = time.monotonic()
                elif time.monotonic() - shown >= POSITIONS_S:  # /metrics and the dashboard see reading, not commits
                    self._refresh_positions()
                    shown = time.monotonic()
                self._throttle()
                with _collector_paused():
                    self._feed(consumer.consume(CONSUME_MESSAGES, 0.1))
            if not self.failed:
                self._checkpoint()
                self._drain()
        finally:
            self.close()  # leaves the group: the revoke callback commits first (nothing left to commit now)

    def close(self) -> None:
        """Leave the group and release the consumer (its librdkafka threads). Idempotent; the thread of
        :meth:`run` (which calls it), or any thread once :meth:`run` has returned or was never called."""
        if not self._closed:
            self._closed = True
            self._consumer.close()

    def _at_end(self) -> bool:
        return self.config.exit_at_end and bool(self.partitions) and all(p.at_end for p in self.partitions.values())

    def stop(self) -> None:
        """Ask :meth:`run` to commit and return (any thread)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called (any thread)."""
        return self._stop.is_set()

    def _throttle(self) -> None:
        """The store is behind (``max_commits`` checkpoints queued): pause the partitions and keep polling, which
        keeps the membership, until it catches up."""
        behind = len(self._outstanding) >= self.config.max_commits
        if behind != self._paused:
            assignment = self._consumer.assignment()
            (self._consumer.pause if behind else self._consumer.resume)(assignment)
            self._paused = behind
            self.pauses += behind
        if behind:
            self._outstanding[0][0].done.wait(0.05)

    def _feed(self, messages: list[Any]) -> None:
        """Decode messages and ingest them, grouped by the definitions that still need them (all, unless some
        were applied further before a restart; messages every definition has are skipped)."""
        from confluent_kafka import KafkaError

        groups: dict[frozenset[str], list[Any]] = {}
        partitions = self.partitions
        for m in messages:
            part = partitions.get((m.topic(), m.partition()))
            error = m.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    kafka_log.warning("kafka: %s", error)
                elif part is not None and m.offset() >= part.next:
                    part.at_end = True
                continue
            offset = m.offset()
            if part is None or offset < part.next:  # not ours (any more), or read before a rewind
                continue
            part.at_end = False
            part.next = offset + 1
            names = part.all_names if offset >= part.all_from else part.books.names_from(offset)
            if names:
                groups.setdefault(names, []).append(m)
        for names, group in groups.items():
            table = self._decode(group)
            if table.num_rows:
                subset = None if names == self._all_names else self.definitions.select(sorted(names))
                self.engine.ingest(table, definitions=subset)
                self._events_since += table.num_rows
                if self.observe is not None:
                    self.observe(table)

    def _decode(self, messages: list[Any]) -> EventBatch:
        """The valid events of ``messages``; every reject to the dead letter (:func:`~drainpipe.inputs.messages.
        decode_values`: JSON values validated as one NDJSON block, OTLP values one export each)."""
        config = self.config
        batch, rejects = decode_values([m.value() for m in messages], config.encoding, config.spans, config.endpoints)
        self.stats.add_accepted(batch.num_rows)
        for reason, n in batch.warnings:
            self.stats.add_warning(reason, n)
        for k, raw, reason in rejects:
            m = messages[k]
            self._reject(message_source(m.topic(), m.partition()), m.offset(), raw, reason)
        return batch

    def _reject(self, source: str, offset: int, raw: Any, reason: str) -> None:
        self.stats.add_rejected(reason)
        if self.dead_letter is not None:
            self.dead_letter.write(source, offset, message_text(raw) if isinstance(raw, bytes) else raw, reason)

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint(self) -> None:
        """Commit everything fed so far with each partition's next offset (not waiting for the store)."""
        self._refresh_positions()
        rows = []
        for part in self.partitions.values():
            part.books.advance(self.definitions.names, Position(part.next))
            rows += part.books.rows()
        if not rows and not self._events_since:
            return
        if self.dead_letter is not None:
            self.dead_letter.flush()  # the rejects of what the commit covers are written before it
        ends = {tp: part.next for tp, part in self.partitions.items()}
        fences = [part.fence() for part in self.partitions.values()]
        self._outstanding.append((self.engine.checkpoint(rows, self._events_since, fences=fences), ends))
        self._events_since = 0

    def _refresh_positions(self) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        positions = {}
        for (topic, partition), part in self.partitions.items():
            try:
                _, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
            except KafkaException:
                high = -1
            positions[(topic, partition)] = (part.next, high, part.stored)
        self.positions = positions  # replaced whole: a scrape reads one consistent dict

    def _reap(self) -> None:
        """Take in finished commits: their offsets go to Kafka (monitoring); a failed one stops the member."""
        from confluent_kafka import KafkaException, TopicPartition

        done = []
        while self._outstanding and self._outstanding[0][0].done.is_set():
            commit, ends = self._outstanding.popleft()
            if commit.fenced:  # another member owns one of the partitions now: start over from the store
                self.fenced_commits += 1
                self._rewind(set())
                return
            if commit.error:
                self.failed = f"the store write failed: {commit.error}"
                log.error("store write failed for good: %s; the member stops (the store keeps what it had)",
                          commit.error)  # fmt: skip
                return
            done.append(ends)
        offsets = {tp: end for ends in done for tp, end in ends.items() if tp in self.partitions}
        for tp, end in offsets.items():
            self.partitions[tp].stored = end
        if offsets:
            try:
                self._consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                      asynchronous=True)  # fmt: skip
            except KafkaException as exc:  # e.g. in the middle of a rebalance: the store has them, which counts
                log.debug("kafka offset commit (monitoring only) failed: %s", exc)

    def _drain(self) -> None:
        """Wait until every queued commit is done (or one failed)."""
        while self._outstanding and not self.failed:
            self._outstanding[0][0].done.wait(0.1)
            self._reap()

    # ------------------------------------------------------------------ rebalances (inside consume())

    def _assigned(self, consumer: Any, partitions: list[Any]) -> None:
        from confluent_kafka import OFFSET_BEGINNING

        self.assignments += 1
        store = self.engine.store
        for tp in partitions:
            part = partition_part(self.cluster, tp.topic, tp.partition)
            # the token first, then the offsets: an old owner's commit lands before (its offsets are read here) or
            # is refused
            token = store.fence(KAFKA_SOURCE, part)
            books = open_books(store, KAFKA_SOURCE, part, self.definitions.names)
            held = self.partitions[(tp.topic, tp.partition)] = _Partition(books, token)
            tp.offset = held.next if held.next > 0 else OFFSET_BEGINNING
        consumer.incremental_assign(partitions)
        if self._paused:
            consumer.pause(partitions)
        log.info("kafka: assigned %s", ", ".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in partitions))

    def _revoked(self, consumer: Any, partitions: list[Any]) -> None:
        """Commit what was read of every partition, wait for the store, then let ``partitions`` go (a failed
        member commits nothing: its partitions are read again from the store's offsets)."""
        self.revocations += 1
        if not self.failed:
            self._checkpoint()
            self._drain()
        for tp in partitions:
            self.partitions.pop((tp.topic, tp.partition), None)
        log.info("kafka: revoked %s", ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions))

    def _lost(self, consumer: Any, partitions: list[Any]) -> None:
        """The partitions were taken away without a revoke (this member missed its session): another member may
        own them already, so nothing read since the last commit may be committed."""
        self.losses += 1
        self._rewind({(tp.topic, tp.partition) for tp in partitions})
        log.warning("kafka: lost %s; uncommitted work dropped, the rest rewound to the store's offsets",
                    ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions))  # fmt: skip

    def _rewind(self, lost: set[tuple[str, int]]) -> None:
        """Drop everything not committed, give up ``lost`` and every partition whose fencing token moved on (another
        member owns it), and read the rest again from the store's offsets."""
        from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

        while self._outstanding:  # queued commits: stored, or fenced in turn (they carry the same tokens)
            self._outstanding[0][0].done.wait(0.1)
            if self._outstanding[0][0].done.is_set():
                commit, _ = self._outstanding.popleft()
                self.fenced_commits += commit.fenced
                if commit.error and not commit.fenced:
                    self.failed = f"the store write failed: {commit.error}"
        self.engine.checkpoint([], 0, rollback=True, wait=True)
        self._events_since = 0
        self.rewinds += 1
        store = self.engine.store
        for tp, part in list(self.partitions.items()):
            if tp in lost or store.fence_token(KAFKA_SOURCE, part.books.part) != part.token:
                del self.partitions[tp]
                continue
            part.reopen(open_books(store, KAFKA_SOURCE, part.books.part, self.definitions.names))
            try:
                self._consumer.seek(TopicPartition(tp[0], tp[1], part.next if part.next > 0 else OFFSET_BEGINNING))
            except KafkaException as exc:  # reading on from where the consumer is would skip what was dropped:
                # stop instead; the others read the partitions again from the store's offsets
                self.failed = f"cannot rewind {tp[0]}[{tp[1]}] to offset {part.next}: {exc}"
                self.failure = InputError
                log.error("kafka: %s; the member stops", self.failed)
                return


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a batch of messages lives. confluent-kafka's messages are
    tracked by the collector, and 50,000 of them alive trigger a collection every 700 allocations and a full one
    often: at one event per message that took a quarter of the member's time. They hold no cycles (freed by their
    reference counts as the batch ends); the collector runs again between batches."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
