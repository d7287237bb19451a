"""A consumer for :class:`drainpipe.kafka.GroupMember` without a broker: topic partitions as lists of values, and a
group whose rebalances a test scripts (assign, revoke, lose), delivered inside ``consume()`` as librdkafka delivers
them. It has the methods of confluent-kafka's ``Consumer`` that the member calls, and returns its message and
topic-partition types, so the member runs the code it runs against a broker."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition


@dataclass
class Message:
    """A fetched message (or, with ``eof``, the end of a partition), shaped as confluent-kafka's."""

    _topic: str
    _partition: int
    _offset: int
    _value: bytes | None
    eof: bool = False

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes | None:
        return self._value

    def error(self) -> KafkaError | None:
        return KafkaError(KafkaError._PARTITION_EOF) if self.eof else None


class Metadata:
    def __init__(self, topics: dict[str, Any]) -> None:
        self.cluster_id = "fake-cluster"
        self.topics = topics


class FakeConsumer:
    """``log[topic][partition]``: the values of a partition, offsets from 0. ``script``: called with this consumer
    at each ``consume()`` before it fetches (the test's group: it calls :meth:`assign`, :meth:`revoke`,
    :meth:`lose`, whose callbacks run there, inside ``consume()``). ``fetch``: messages per partition per call."""

    def __init__(self, log: dict[str, list[list[bytes | None]]], script: Callable[[FakeConsumer], None],
                 fetch: int = 100) -> None:  # fmt: skip
        self.log = log
        self.script = script
        self.fetch = fetch
        self.positions: dict[tuple[str, int], int] = {}  # assigned partitions and where each reads next
        self.paused: set[tuple[str, int]] = set()
        self.committed: dict[tuple[str, int], int] = {}  # offsets sent to "Kafka" (monitoring)
        self.fetched: dict[tuple[str, int], int] = {}  # messages handed out per partition
        self.calls = 0
        self.asked: list[int] = []  # num_messages of each consume()
        self.returned: list[tuple[int, int]] = []  # messages with a value, and their values' bytes, of each
        self.closed = False
        self.closed_with: list[tuple[str, int]] = []  # partitions still assigned when close() was called
        self._leaving = False
        self._callbacks: dict[str, Any] = {}

    # ------------------------------------------------------------------ the group, as a test scripts it

    def assign(self, *partitions: tuple[str, int]) -> None:
        self._callbacks["on_assign"](self, [TopicPartition(t, p) for t, p in partitions])

    def revoke(self, *partitions: tuple[str, int]) -> None:
        self._callbacks["on_revoke"](self, [TopicPartition(t, p) for t, p in partitions])
        for key in partitions:
            self.positions.pop(key, None)

    def lose(self, *partitions: tuple[str, int]) -> None:
        self._callbacks["on_lost"](self, [TopicPartition(t, p) for t, p in partitions])
        for key in partitions:
            self.positions.pop(key, None)

    # ------------------------------------------------------------------ what the member calls

    def list_topics(self, timeout: float = -1) -> Metadata:
        return Metadata(dict.fromkeys(self.log))

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self._callbacks = callbacks

    def unsubscribe(self) -> None:  # (as librdkafka: the revoke comes in the next poll)
        self._leaving = True

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.positions[(tp.topic, tp.partition)] = 0 if tp.offset == OFFSET_BEGINNING else tp.offset

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in self.positions]

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in partitions}

    def seek(self, tp: TopicPartition) -> None:
        self.positions[(tp.topic, tp.partition)] = 0 if tp.offset == OFFSET_BEGINNING else tp.offset

    def commit(self, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        for tp in offsets:
            self.committed[(tp.topic, tp.partition)] = tp.offset

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        return 0, len(self.log[tp.topic][tp.partition])

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        """At most ``fetch`` messages of each partition assigned and not paused, ``num_messages`` in all, and the end
        of each partition read to its end."""
        self.calls += 1
        self.asked.append(num_messages)
        if self._leaving:
            if self.positions:
                self.revoke(*self.positions)
            return []
        self.script(self)
        out: list[Message] = []
        for (topic, partition), at in sorted(self.positions.items()):
            if (topic, partition) in self.paused:
                continue
            values = self.log[topic][partition]
            end = min(len(values), at + self.fetch, at + num_messages - len(out))
            out += [Message(topic, partition, o, values[o]) for o in range(at, end)]
            self.fetched[(topic, partition)] = self.fetched.get((topic, partition), 0) + end - at
            self.positions[(topic, partition)] = end
            if end == len(values):
                out.append(Message(topic, partition, end, None, eof=True))
        valued = [m._value for m in out if m._value is not None]
        self.returned.append((len(valued), sum(map(len, valued))))
        return out

    def close(self) -> None:
        self.closed = True
        self.closed_with = sorted(self.positions)
