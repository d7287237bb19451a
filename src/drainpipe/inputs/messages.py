"""Kafka messages as an input: the part name of a topic partition, and a batch of JSON message values validated
as one NDJSON block, the rejects traced back to their messages.

Both engines read topics through this module: ``drainpipe consume`` (:mod:`drainpipe.server.kafka_member`) and
the Spark stream's tasks (:mod:`drainpipe.spark.kafka`), so a message is accepted or rejected, with the same reason,
whichever reads it. Pure Python over :func:`~.formats.jsonl_format.validate_json_lines` (Spark's executors have
no C extensions of ours: that function's columnar path then runs on pyarrow alone)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from .formats.jsonl_format import validate_json_lines

__all__ = ["KAFKA_SOURCE", "TOMBSTONE", "json_values", "partition_part", "message_source", "message_text"]

#: the source name of Kafka partitions in the store's progress rows
KAFKA_SOURCE = "kafka"
#: the reject reason of a message without a value
TOMBSTONE = "no value (a tombstone)"


def partition_part(cluster: str, topic: str, partition: int) -> str:
    """The part name of a topic partition in the store (the cluster id keeps two clusters' topics apart)."""
    return f"{cluster}/{topic}/{partition}"


def message_source(topic: str, partition: int) -> str:
    """The ``source`` of a message's dead-letter record."""
    return f"kafka:{topic}/{partition}"


def message_text(value: bytes | None) -> str:
    """A message value for the dead letter: its first 4 KB as text (binary bytes escaped)."""
    return (value or b"")[:4096].decode("utf-8", "backslashreplace")


def json_values(values: Sequence[bytes | None]) -> tuple[pa.RecordBatch, list[tuple[int, Any, str]]]:
    """JSON message values (one event, or NDJSON lines, each) -> the canonical batch of their valid events and
    ``(message index, raw, reason)`` per reject: a tombstone (``raw`` None) or a line that does not validate
    (``raw`` ``{"line": its line in the message, "value": the message's text}``). One validation call for all of
    them: a call per message would cost more than the events of one-event messages."""
    kept = [i for i, v in enumerate(values) if v is not None]
    rejects: list[tuple[int, Any, str]] = [(i, None, TOMBSTONE) for i, v in enumerate(values) if v is None]
    if not kept:
        batch, _ = validate_json_lines(b"")
        return batch, rejects
    present = [v for v in values if v is not None]
    batch, bad = validate_json_lines(b"\n".join(present))
    if bad:  # the block's line numbers back to messages (each value is one line or more)
        starts = list(itertools.accumulate((v.count(b"\n") + 1 for v in present[:-1]), initial=1))
        for lineno, reason in bad:
            k = bisect.bisect_right(starts, lineno) - 1
            rejects.append((kept[k], {"line": lineno - starts[k] + 1, "value": message_text(present[k])}, reason))
    rejects.sort(key=lambda r: r[0])
    return batch, rejects
