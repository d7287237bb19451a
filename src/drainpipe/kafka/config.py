"""What ``drainpipe consume`` is given (:class:`ConsumeConfig`), the librdkafka consumer built from it
(:func:`kafka_consumer`), and the log its lines go to, each kind of line at most once per 30 s."""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..inputs.endpoints import EndpointRules
from ..inputs.messages import check_encoding
from ..inputs.spans import SpanMapping
from ..pipeline import RemoteWriteOptions

__all__ = ["ConsumeConfig", "kafka_consumer", "kafka_log"]


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
    #: give the heap's freed memory back to the system before a checkpoint, and as the resident set grows while a
    #: commit is in flight and nothing is read (``drainpipe consume`` in a process of its own; never in a program
    #: that embeds a member: it acts on the whole process)
    release_memory: bool = False

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
            # Prefetch a little, and fetch again as soon as the queue has room. librdkafka holds what it fetched
            # until the member takes it (with a structure of its own per message: small messages are bounded by
            # their number, large ones by their bytes), and after a fetch that found its queue full it waits
            # fetch.queue.backoff.ms (1 s by default) before the next. A deep queue (a million messages, 16 MB
            # fetches) held the whole topic: 0.9-1.3 GB. A shallow one with the 1 s wait ran dry, at a third of the
            # rate. 8 MB or 20,000 messages of queue, 1 MB a partition's fetch (librdkafka's default; a larger
            # message still comes, alone) and 10 ms: a bare reader of one-event messages at 137 MB and 523k-688k
            # messages/s, against 737 MB and 586k with the deep queue
            # (docs/performance.md, "Memory of the live path"). Answer a fetch within 50 ms when idle.
            "queued.min.messages": 20_000,
            "queued.max.messages.kbytes": 8 << 10,
            "fetch.message.max.bytes": 1 << 20,
            "fetch.queue.backoff.ms": 10,
            "fetch.wait.max.ms": 50,
            "topic.metadata.refresh.interval.ms": 30_000,  # partitions added to a topic are taken within 30 s
            "enable.partition.eof": self.exit_at_end,
            **self.client,
        }


def kafka_consumer(config: ConsumeConfig) -> Any:
    """A confluent-kafka ``Consumer`` with ``config``'s settings (not subscribed yet). Raises
    :class:`~drainpipe.errors.UsageError` (one line) for a setting librdkafka refuses (``--kafka-config``)."""
    from confluent_kafka import Consumer, KafkaException

    try:
        return Consumer(config.consumer_settings(), logger=kafka_log)
    except KafkaException as exc:
        raise UsageError(f"kafka consumer settings: {exc.args[0].str()}") from None
