"""Kafka messages as an input: the part name of a topic partition, and a batch of JSON message values validated
as one NDJSON block, the rejects traced back to their messages.

Both engines read topics through this module: ``drainpipe consume`` (:mod:`drainpipe.kafka`) and
the Spark stream's tasks (:mod:`drainpipe.spark.kafka`), so a message is accepted or rejected, with the same reason,
whichever reads it. Pure Python over :func:`~.formats.jsonl_format.validate_json_lines` (its columnar path runs on
the C scanner where it is built, else on pyarrow alone, as on a Spark executor unlike the build's)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import Any, cast

from ..errors import UsageError
from .batches import EventBatch
from .endpoints import EndpointRules
from .formats.jsonl_format import validate_json_lines
from .options import InputOptions
from .rejects import ReadStats
from .spans import SpanMapping

__all__ = [
    "BLANK",
    "ENCODINGS",
    "KAFKA_SOURCE",
    "TOMBSTONE",
    "check_encoding",
    "decode_values",
    "json_values",
    "otlp_values",
    "partition_part",
    "message_source",
    "message_text",
]

#: message encodings (the OpenTelemetry Collector's words)
ENCODINGS = ("json", "otlp_proto", "otlp_json")

#: the source name of Kafka partitions in the store's progress rows
KAFKA_SOURCE = "kafka"
#: the reject reason of a message without a value
TOMBSTONE = "no value (a tombstone)"
#: the reject reason of a JSON message whose value holds nothing but white space (no event: not JSON)
BLANK = "blank value"


def check_encoding(encoding: str) -> None:
    """A :class:`UsageError` in one line for an encoding not in :data:`ENCODINGS`."""
    if encoding not in ENCODINGS:
        raise UsageError(f"--encoding must be one of {', '.join(ENCODINGS)}, not {encoding!r}")


def partition_part(cluster: str, topic: str, partition: int) -> str:
    """The part name of a topic partition in the store (the cluster id keeps two clusters' topics apart)."""
    return f"{cluster}/{topic}/{partition}"


def message_source(topic: str, partition: int) -> str:
    """The ``source`` of a message's dead-letter record."""
    return f"kafka:{topic}/{partition}"


def message_text(value: bytes | None) -> str:
    """A message value for the dead letter: its first 4 KB as text (binary bytes escaped)."""
    return (value or b"")[:4096].decode("utf-8", "backslashreplace")


def json_values(
    values: Sequence[bytes | None], *, dictionaries: bool = False
) -> tuple[EventBatch, list[tuple[int, Any, str]]]:
    """JSON message values (one event, or NDJSON lines, each) -> their valid events (with the warnings of those
    accepted with an odd optional field dropped) and ``(message index, raw, reason)`` per reject: a tombstone
    (``raw`` None), a value that is blank (``raw`` its text) or a line that does not validate (``raw`` ``{"line": its
    line in the message, "value": the message's text}``); a blank line within a value is skipped, as in files. One
    validation call for all of them: a call per message would cost more than the events of one-event messages.
    ``dictionaries``: :func:`~.formats.jsonl_format.validate_json_lines`'s flag."""
    kept: Sequence[int] = range(len(values))
    rejects: list[tuple[int, Any, str]] = []
    present = cast("Sequence[bytes]", values)
    if None in values:  # a tombstone (the test runs in C: the common case pays no loop of its own)
        kept = [i for i, v in enumerate(values) if v is not None]
        rejects = [(i, None, TOMBSTONE) for i, v in enumerate(values) if v is None]
        present = [v for v in values if v is not None]
    if not present:
        return EventBatch.empty(), rejects
    stats = ReadStats()
    block = b"\n".join(present)
    batch, bad = validate_json_lines(block, stats, dictionaries=dictionaries)
    if stats.read <= block.count(b"\n"):  # blank lines (a line is a record or blank): is a whole value blank?
        rejects += [(kept[k], message_text(v), BLANK) for k, v in enumerate(present) if not v.strip()]
    if bad:  # the block's line numbers back to messages (each value is one line or more)
        starts = list(itertools.accumulate((v.count(b"\n") + 1 for v in present[:-1]), initial=1))
        for lineno, reason in bad:
            k = bisect.bisect_right(starts, lineno) - 1
            rejects.append((kept[k], {"line": lineno - starts[k] + 1, "value": message_text(present[k])}, reason))
    rejects.sort(key=lambda r: r[0])
    if not batch.num_rows:
        return EventBatch.empty(), rejects
    return EventBatch(batch, batch.num_rows, tuple(stats.warnings.items())), rejects


def otlp_values(
    values: Sequence[bytes | None], *, json_body: bool, mapping: SpanMapping, endpoints: EndpointRules
) -> tuple[EventBatch, list[tuple[int, Any, str]]]:
    """OTLP message values (an ``ExportTraceServiceRequest`` each, protobuf or OTLP JSON, as the OpenTelemetry
    Collector's Kafka exporter writes) -> their events and ``(message index, raw, reason)`` per reject: a
    tombstone, a value that does not decode (``raw`` its text), or a span that does not map (``raw`` ``{"span":
    its index, "value": the message's text}``). OTLP JSON values are read together, by the pass that reads OTLP
    JSON files (:func:`~.formats.otlp_format.decode_exports`), protobuf values by the pass that reads OTLP/HTTP and
    gRPC bodies (:func:`~.otlp.decode_proto_exports`)."""
    present = [k for k, value in enumerate(values) if value is not None]
    exports = [values[k] or b"" for k in present]
    options = InputOptions(spans=mapping, endpoints=endpoints)
    if json_body:
        from .formats.otlp_format import decode_exports

        batch, found = decode_exports(exports, options)
    else:
        from .otlp import decode_proto_exports

        batch, found = decode_proto_exports(exports, options)
    rejects: list[tuple[int, Any, str]] = [(k, None, TOMBSTONE) for k, value in enumerate(values) if value is None]
    for i, raw, reason in found:
        k = present[i]
        text = message_text(values[k])
        rejects.append((k, {**raw, "value": text} if isinstance(raw, dict) else text, reason))
    rejects.sort(key=lambda reject: reject[0])
    return batch, rejects


def decode_values(
    values: Sequence[bytes | None],
    encoding: str,
    mapping: SpanMapping,
    endpoints: EndpointRules,
    *,
    dictionaries: bool = False,
) -> tuple[EventBatch, list[tuple[int, Any, str]]]:
    """Message values in ``encoding`` (:data:`ENCODINGS`) -> their events and rejects (:func:`json_values`,
    :func:`otlp_values`). A :class:`UsageError` for an encoding not in the list. ``dictionaries``: string columns
    the JSON scanner gives dictionary-encoded may stay so, for a caller that only aggregates the events."""
    check_encoding(encoding)
    if encoding == "json":
        return json_values(values, dictionaries=dictionaries)
    return otlp_values(values, json_body=encoding == "otlp_json", mapping=mapping, endpoints=endpoints)
