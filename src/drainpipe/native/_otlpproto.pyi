"""Typed stub of the C extension ``drainpipe.native._otlpproto`` (source and its rules: ``_otlpproto.c``)."""

from collections.abc import Sequence
from typing import Any

def scan(exports: Sequence[bytes | memoryview], /) -> tuple[Any, ...]:
    """The spans of OTLP protobuf trace exports as column buffers, the tuple of ``_otlpjson.scan`` with an export
    for a line: ``(declined export indexes, spans, resources, export, resource, kind, start, end, status code, trace
    id offsets, data, span id offsets, data, name offsets, data, trace state offsets, data, span attributes, resource
    attributes)``."""

def events(exports: Sequence[bytes | memoryview], span_roles: list[tuple[bytes, int, int]],
           resource_roles: list[tuple[bytes, int, int]], request_kinds: int, client: int, server: int,
           latency_max_ms: float, /) -> tuple[Any, ...]:  # fmt: skip
    """The events of OTLP protobuf trace exports, the span mapping done in the pass: ``(declined export indexes,
    spans, requests, rows (int64 span index per event), ts, latency, ok bits, service offsets, data, instance
    offsets, data, the requests' distinct raw endpoints (list of str, in the order they first appear), each
    event's endpoint code (int32; an exit row's is the number of distinct endpoints), statement offsets, data,
    validity, rejected spans' export indexes (int32), their indexes in the export (int32), their categories (int8),
    spans mapped with a trace id that cannot be used, with a span id that cannot be used, trace id offsets, data,
    span id offsets, data, trace state offsets, data, each export's events (int64 per export; 0 for one declined))``.
    ``span_roles``: fields endpoint 0, statement 1, HTTP status 2; ``resource_roles``: service 0, instance 1
    (``(key, field, rank)``, lower rank first)."""

def gather(codes: bytes, texts: list[str], /) -> tuple[bytes, bytes]:
    """The string column whose row ``i`` is ``texts[codes[i]]`` (``codes``: int32, each in range), as Arrow's int32
    offsets and data."""
