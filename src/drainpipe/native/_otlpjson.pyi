"""Typed stub of the C extension ``drainpipe.native._otlpjson`` (source and its rules: ``_otlpjson.c``)."""

from typing import Any

def scan(data: bytes | memoryview, count: int, /) -> tuple[Any, ...] | None:
    """The spans of a block of ``count`` OTLP JSON lines as column buffers: ``(declined line indexes, spans,
    resources, line, resource, kind, start, end, status code, trace id offsets, data, span id offsets, data, name
    offsets, data, span attributes, resource attributes)``, each attribute pool ``(owners, owner offsets, key offsets,
    key data, value validity, text validity, text offsets, text data, integer validity, integer data)``; None when
    ``data`` does not hold ``count`` lines."""

def events(data: bytes | memoryview, count: int, span_roles: list[tuple[bytes, int, int]],
           resource_roles: list[tuple[bytes, int, int]], request_kinds: int, client: int, server: int,
           latency_max_ms: float, /) -> tuple[Any, ...] | None:  # fmt: skip
    """The events of a block of ``count`` OTLP JSON lines, the span mapping done in the pass: the tuple of
    ``_otlpproto.events`` with a line for an export; None when ``data`` does not hold ``count`` lines."""

def gather(codes: bytes, texts: list[str], /) -> tuple[bytes, bytes]:
    """As ``_otlpproto.gather``."""
