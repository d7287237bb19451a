"""``drainpipe consume``'s group member: a member of a Kafka consumer group that feeds the local engine, exactly
once into the store.

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

The books, the checkpoints, the queued commits, the throttle and the rollback are the
:class:`~drainpipe.pipeline.Driver`'s, as for every source; what is the member's own is Kafka: the rebalance
callbacks, seeking, the fencing tokens it holds and the offsets it reports back to Kafka. The consumer is handed in
(:func:`~.config.kafka_consumer` builds librdkafka's), so all of that is tested with a fake consumer as well as
against a broker.

Each partition is a part (its books, its next offset, its token) over the one consumer: :meth:`GroupMember._feed`
splits each fetched batch of messages by partition for positions and for the definitions that still need them, and
decodes and ingests each group of messages at once, whatever partitions they came from (the engine's cost is per
batch: a batch per partition would cost a batch per partition).

Thread-safety: one thread (the caller of :meth:`GroupMember.run`) owns the consumer, the driver and the engine's
intake; rebalance callbacks run on it, inside ``consume()``. :meth:`stop` may be called from any thread.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import DrainpipeError, InputError, StoreError, StoreUnavailable, UsageError, first_line
from ..inputs import DeadLetter, EventBatch, Position, ReadStats
from ..inputs.messages import KAFKA_SOURCE, decode_values, message_source, message_text, partition_part
from ..pipeline import Definitions, Driver, LocalEngine, PartBooks, open_books
from ..processes import HeapWatch
from ..server.disk import DiskWatch
from .config import ConsumeConfig, kafka_log

log = logging.getLogger("drainpipe.server")

_T = TypeVar("_T")

__all__ = ["GroupMember"]

#: messages taken from the consumer per call, at most (one-event messages: the batch's fixed costs, its validation
#: and ingest, are spread over this many events; 20,000 gave 25% less, 100,000 no more)
CONSUME_MESSAGES = 50_000
#: the bytes of values a call takes, about: it takes as many messages as the last call's mean value size allows
#: (at most CONSUME_MESSAGES). Messages move out of librdkafka's bounded queue while a call collects them, so only
#: this bounds the batch: 50,000 messages of 100 events held 500 MB. (4 MB made a topic of 100-event messages
#: 0.85x as fast, from a batch's fixed costs paid four times as often; 16 MB was as fast as before)
POLL_BYTES = 16 << 20
#: with ``ConsumeConfig.release_memory``, the heap's freed memory is given back before each checkpoint and, while a
#: commit is in flight and nothing is being read (GroupMember._committing_idle), whenever the resident set has grown
#: by HEAP_STEP_BYTES over the highest level a trim left, looked at every HEAP_EVERY_S seconds
#: (:class:`~drainpipe.processes.HeapWatch`; docs/performance.md, "`consume`'s peak taken apart")
HEAP_STEP_BYTES = 8 << 20
HEAP_EVERY_S = 0.05
#: how often (s) the positions that /metrics and the dashboard show are refreshed between checkpoints
POSITIONS_S = 0.5
#: how long leaving the group may take before the consumer is closed anyway (see GroupMember._leave)
LEAVE_S = 30.0

TopicPartition = tuple[str, int]


@dataclass
class _Partition:
    """A partition this member owns: its books (the ones the driver holds), the next offset to feed (everything
    before it is in the engine or the store), whether the broker said it ends there, and the next offset stored."""

    books: PartBooks
    next: int
    at_end: bool = False  # the broker said the partition ends at ``next`` (exit_at_end only)
    stored: int = field(init=False)  # the next offset the store has (after the last commit this member saw done)

    def __post_init__(self) -> None:
        self.stored = self.next


class GroupMember:
    """One member of the group; :meth:`run` until :meth:`stop`. See the module docstring. ``consumer``: a
    confluent-kafka ``Consumer`` not yet subscribed (:func:`~.config.kafka_consumer`), or any object with its
    methods; the member closes it."""

    def __init__(self, config: ConsumeConfig, engine: LocalEngine, definitions: Definitions, consumer: Any,
                 dead_letter: DeadLetter | None = None, disk: DiskWatch | None = None) -> None:  # fmt: skip
        self.config = config
        self.disk = disk  # the store's and the dead letter's volumes: under the refusal threshold, the member pauses
        self.engine = engine
        self.definitions = definitions
        self.dead_letter = dead_letter
        self.stats = ReadStats()
        self.failed = ""  # why the member stopped on its own: a store commit failed for good, or a rewind failed
        self.failure: type[DrainpipeError] = StoreError  # the error that says so
        self.partitions: dict[TopicPartition, _Partition] = {}
        self.cluster = ""
        self.assignments = self.revocations = self.losses = self.rewinds = 0
        self.pauses = 0  # times the partitions were paused because the store was behind (or its disk full)
        self.disk_pauses = 0  # of those, times a volume under the refusal threshold paused them
        #: gives the heap's freed memory back (``release_memory``: the command's own process), else None
        self.heap = HeapWatch(HEAP_STEP_BYTES, self._committing_idle) if config.release_memory else None
        self._reading = False  # the last poll brought messages (member thread; the heap watcher reads it)
        self.driver = Driver(definitions, engine, ingest=engine.ingest, dead_letter=dead_letter,
                             checkpoint_s=config.checkpoint_s, max_commits=config.max_commits,
                             on_commit=self._stored)  # fmt: skip
        self._consumer = consumer
        self._poll = CONSUME_MESSAGES  # messages the next call takes (POLL_BYTES by the last call's values)
        self._paused = False
        self._stop = threading.Event()
        self._closed = False
        #: per partition held: (next offset fed, high watermark as of the last fetch or -1, next offset stored);
        #: refreshed at each checkpoint, read by ``/metrics``
        self.positions: dict[TopicPartition, tuple[int, int, int]] = {}

    @property
    def observe(self) -> Callable[[EventBatch], None] | None:
        """Sees every event batch handed to the engine (the RED metrics of ``--port``)."""
        return self.driver.observe

    @observe.setter
    def observe(self, hook: Callable[[EventBatch], None] | None) -> None:
        self.driver.observe = hook

    @property
    def fenced_commits(self) -> int:
        """Commits the store refused for a stale fencing token."""
        return self.driver.fenced_commits

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
        shown = time.monotonic()
        try:
            if self.heap is not None:
                self.heap.start(HEAP_EVERY_S)
            while True:
                while not self._stop.is_set() and not self.failed and not self._at_end():
                    self._reap()
                    if self.driver.due:
                        self._checkpoint()  # (it refreshes the positions)
                        shown = time.monotonic()
                    elif time.monotonic() - shown >= POSITIONS_S:  # /metrics and the dashboard see reading
                        self._refresh_positions()
                        shown = time.monotonic()
                    self._throttle()
                    with _collector_paused():
                        messages = consumer.consume(self._poll, 0.1)
                        self._reading = bool(messages)
                        self._feed(messages)
                self._reading = False
                if self.failed:
                    break
                self._checkpoint()
                if not self._drain() or self._stop.is_set():
                    break  # (else a commit was fenced: the partitions kept were rewound, and are read again)
        finally:
            self.close()  # leaves the group: the revoke callback commits first (nothing left to commit now)

    def close(self) -> None:
        """Leave the group and release the consumer (its librdkafka threads). Idempotent; the thread of
        :meth:`run` (which calls it), or any thread once :meth:`run` has returned or was never called."""
        if not self._closed:
            self._closed = True
            try:
                try:
                    self._leave()
                finally:
                    self._consumer.close()
            finally:  # (the watcher's thread ends with the member, whatever the consumer's close raised)
                if self.heap is not None:
                    self.heap.stop()

    def _leave(self) -> None:
        """Unsubscribe, and serve the rebalance that follows here, by polling, until nothing is assigned (at most
        :data:`LEAVE_S`): the consumer's close then has no rebalance left to serve. A rebalance served inside close
        can hang it for good: when the group hands this member partitions as it closes (the other members left
        first, as members run with ``--exit-at-end`` do), librdkafka's assign waits there for a reply that never
        comes (seen in a four-member run; a known librdkafka issue). Messages polled meanwhile are dropped: they were
        never committed, and the partitions' next owner reads them from the store's offsets."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + LEAVE_S
        try:
            self._consumer.unsubscribe()
            while True:  # (one poll at least: an assignment may be on its way with nothing assigned yet)
                self._consumer.consume(self._poll, 0.1)
                if not self._consumer.assignment() or time.monotonic() >= deadline:
                    break
        except (KafkaException, RuntimeError):  # (never subscribed, or the consumer is closed already)
            pass
        except Exception as exc:  # (a revoke's commit failed: nothing of it is stored, the next owner reads it again)
            log.warning("kafka: leaving the group: %s", first_line(exc))

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
        """The store is behind (``max_commits`` checkpoints queued), or a volume it writes to is under the refusal
        threshold (:mod:`~drainpipe.server.disk`): pause the partitions and keep polling, which keeps the
        membership, until it catches up (or space is freed)."""
        full = self.disk.check().full if self.disk is not None else ()
        behind = self.driver.behind or bool(full)
        if behind != self._paused:
            assignment = self._consumer.assignment()
            (self._consumer.pause if behind else self._consumer.resume)(assignment)
            self._paused = behind
            self.pauses += behind
            if full:
                self.disk_pauses += 1
                log.warning("partitions paused: %s, under the refusal threshold of %s bytes", full[0].describe(),
                            f"{full[0].refuse:,}")  # fmt: skip
        if behind:
            self.driver.wait_for_store(0.05)

    def _feed(self, messages: list[Any]) -> None:
        """Split messages by partition (positions, and the definitions that still need each: the driver's
        policy), then decode and ingest each group of messages for the same definitions at once. A poll's messages
        come in runs of one partition: the partition and its definitions are looked up once a run (the policy's
        answer holds until :meth:`~drainpipe.pipeline.PartBooks.names_until`'s offset)."""
        from confluent_kafka import KafkaError

        groups: dict[frozenset[str], list[Any]] = {}
        partitions = self.partitions
        topic, partition, part = None, None, None
        group: list[Any] | None = None  # the run's group (None: no definition needs its messages)
        until = -math.inf  # the offset from which the run's definitions are looked up again
        for m in messages:
            error = m.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    kafka_log.warning("kafka: %s", error)
                elif (ended := partitions.get((m.topic(), m.partition()))) is not None and m.offset() >= ended.next:
                    ended.at_end = True
                continue
            if m.partition() != partition or m.topic() != topic:  # a run of another partition begins
                topic, partition = m.topic(), m.partition()
                part = partitions.get((topic, partition))
                until = -math.inf
            offset = m.offset()
            if part is None or offset < part.next:  # not ours (any more), or read before a rewind
                continue
            part.at_end = False
            part.next = offset + 1
            if offset >= until:  # the driver's policy (Driver.wanted), once a run
                names, until = part.books.names_until(offset)
                group = groups.setdefault(names, []) if names else None
            if group is not None:
                group.append(m)
        taken = size = 0
        for names, group in groups.items():
            for table, group_size in self._decoded(group):
                size += group_size
                if table.num_rows:
                    self.driver.feed(table, names)
            taken += len(group)
        if size:
            self._poll = max(1, min(CONSUME_MESSAGES, POLL_BYTES * taken // size))

    def _decoded(self, messages: list[Any]) -> Iterator[tuple[EventBatch, int]]:
        """:meth:`_decode` of ``messages``, half by half where their events together would pass 2 GiB of text in a
        column (OverflowError: values that each fit, a poll of large OTLP exports); a value too large alone is
        rejected by the decoders."""
        try:
            decoded = self._decode(messages)
        except OverflowError:
            if len(messages) == 1:
                raise
            mid = len(messages) // 2
            yield from self._decoded(messages[:mid])
            yield from self._decoded(messages[mid:])
            return
        yield decoded

    def _decode(self, messages: list[Any]) -> tuple[EventBatch, int]:
        """The valid events of ``messages`` and the bytes of their values; every reject to the dead letter
        (:func:`~drainpipe.inputs.messages.decode_values`: JSON values validated as one NDJSON block, OTLP values
        one export each)."""
        config = self.config
        values = [m.value() for m in messages]
        batch, rejects = decode_values(values, config.encoding, config.spans, config.endpoints)
        self.stats.add_accepted(batch.num_rows)
        for reason, n in batch.warnings:
            self.stats.add_warning(reason, n)
        for k, raw, reason in rejects:
            m = messages[k]
            self._reject(message_source(m.topic(), m.partition()), m.offset(), raw, reason)
        try:
            return batch, sum(map(len, values))
        except TypeError:  # (a message without a value: a reject)
            return batch, sum(len(v) for v in values if v is not None)

    def _reject(self, source: str, offset: int, raw: Any, reason: str) -> None:
        self.stats.add_rejected(reason)
        if self.dead_letter is not None:
            self.dead_letter.write(source, offset, message_text(raw) if isinstance(raw, bytes) else raw, reason)

    # ------------------------------------------------------------------ checkpoints

    def _committing_idle(self) -> bool:
        """A commit is in flight and the member is not reading (the last poll was empty, or the reading ended): the
        heap watcher trims then. While messages come, the next poll reuses the free memory at once, and trimming
        during commits cost messages of 100 events 7% of their speed in faults; a commit after the reading (a
        backlog's last, or any once caught up) is the peak, and trimming it costs nothing. A commit done but not yet
        reaped counts as in flight (until the next poll, 0.1 s at most), and a poll of end-of-partition events only
        as reading: either moves a trim by a look. Read on the watcher's thread without a lock, for the same
        reason."""
        return not self._reading and self.driver.queued > 0

    def _checkpoint(self) -> None:
        """Commit everything fed so far with each partition's next offset (not waiting for the store; with
        ``release_memory``, it first blocks for the heap's trim, about 10 ms per 100 MB given back)."""
        if self.heap is not None and self.driver.uncommitted:
            # A commit is the member's peak (every state row it holds is merged and written at once), and by now
            # the batches read since the last one have left free memory resident in glibc's heaps: give it back
            # first, or the commit's peak adds to it (docs/performance.md, "`consume`'s peak taken apart").
            self.heap.release()
        self._refresh_positions()
        for part in self.partitions.values():
            part.books.advance(self.definitions.names, Position(part.next))
        self.driver.checkpoint({key: part.next for key, part in self.partitions.items()})

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

    def _stored(self, ends: dict[TopicPartition, int]) -> None:
        """A commit is stored: its offsets go to Kafka (monitoring only, never read back)."""
        from confluent_kafka import KafkaException, TopicPartition

        offsets = {key: end for key, end in ends.items() if key in self.partitions}
        for key, end in offsets.items():
            self.partitions[key].stored = end
        if offsets:
            try:
                self._consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                      asynchronous=True)  # fmt: skip
            except KafkaException as exc:  # e.g. in the middle of a rebalance: the store has them, which counts
                log.debug("kafka offset commit (monitoring only) failed: %s", exc)

    def _reap(self) -> None:
        """Take in finished commits; a fenced one (another member owns a partition now) starts over from the store,
        a failed one stops the member."""
        if self.driver.reap():
            self._rewind(set())
        self._check_store()

    def _check_store(self) -> None:
        if self.driver.failed and not self.failed:
            self.failed = f"the store write failed: {self.driver.failed}"
            log.error("store write failed for good: %s; the member stops (the store keeps what it had)",
                      self.driver.failed)  # fmt: skip

    def _drain(self) -> bool:
        """Wait until every queued commit is done (or one failed); True when one was fenced (the partitions kept
        are rewound to the store's offsets)."""
        fenced = self.driver.drain()
        if fenced:
            self._rewind(set())
        self._check_store()
        return fenced

    # ------------------------------------------------------------------ rebalances (inside consume())

    def _books_call(self, what: str, call: Callable[..., _T], *args: Any) -> _T:
        """``call(*args)`` (a fence or a read of the store's books, in a rebalance), retried with the engine's backoff
        while the store is down: a partition assigned during a store restart waits for it, as commits do, instead
        of ending the member. Blocking; other store errors propagate."""
        delay, cap = self.engine.options.store_retry_s
        while True:
            try:
                return call(*args)
            except StoreUnavailable as exc:
                if self._stop.is_set():  # told to stop: the member ends (its partitions go back to the group)
                    raise
                log.warning("kafka: store unavailable for %s (%s); retrying in %.2fs", what, exc, delay)
                self._stop.wait(delay)
                delay = min(cap, delay * 2)

    def _hold(self, key: TopicPartition, books: PartBooks, token: int) -> _Partition:
        self.driver.hold(key, books, token)
        held = self.partitions[key] = _Partition(books, books.start.offset)
        return held

    def _assigned(self, consumer: Any, partitions: list[Any]) -> None:
        from confluent_kafka import OFFSET_BEGINNING

        self.assignments += 1
        store = self.engine.store
        for tp in partitions:
            part = partition_part(self.cluster, tp.topic, tp.partition)
            # the token first, then the offsets: an old owner's commit lands before (its offsets are read here) or
            # is refused
            token = self._books_call("a fence", store.fence, KAFKA_SOURCE, part)
            books = self._books_call("the offsets", open_books, store, KAFKA_SOURCE, part, self.definitions.names)
            held = self._hold((tp.topic, tp.partition), books, token)
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
            self._release((tp.topic, tp.partition))
        log.info("kafka: revoked %s", ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions))

    def _release(self, key: TopicPartition) -> None:
        self.partitions.pop(key, None)
        self.driver.release(key)

    def _lost(self, consumer: Any, partitions: list[Any]) -> None:
        """The partitions were taken away without a revoke (this member missed its session): another member may
        own them already, so nothing read since the last commit may be committed."""
        self.losses += 1
        self._rewind({(tp.topic, tp.partition) for tp in partitions})
        log.warning("kafka: lost %s; uncommitted work dropped, the rest rewound to the store's offsets",
                    ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions))  # fmt: skip

    def _rewind(self, lost: set[TopicPartition]) -> None:
        """Drop everything not committed, give up ``lost`` and every partition whose fencing token moved on (another
        member owns it), and read the rest again from the store's offsets."""
        from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

        self.driver.rollback()  # queued commits: stored, or fenced in turn (they carry the same tokens)
        self._check_store()
        self.rewinds += 1
        store = self.engine.store
        for key in list(self.partitions):
            books, token = self.driver.parts[key]
            part = books.part
            if key in lost or self._books_call("a fence", store.fence_token, KAFKA_SOURCE, part) != token:
                self._release(key)
                continue
            assert token is not None
            books = self._books_call("the offsets", open_books, store, KAFKA_SOURCE, part, self.definitions.names)
            held = self._hold(key, books, token)
            try:
                self._consumer.seek(TopicPartition(key[0], key[1], held.next if held.next > 0 else OFFSET_BEGINNING))
            except KafkaException as exc:  # reading on from where the consumer is would skip what was dropped:
                # stop instead; the others read the partitions again from the store's offsets
                self.failed = f"cannot rewind {key[0]}[{key[1]}] to offset {held.next}: {exc}"
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
