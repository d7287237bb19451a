"""Typed stub of the C extension ``drainpipe.native._otlpproto`` (source and its rules: ``_otlpproto.c``)."""

from collections.abc import Sequence
from typing import Any

def scan(exports: Sequence[bytes | memoryview], /) -> tuple[Any, ...]:
    """The spans of OTLP protobuf trace exports as column buffers, the tuple of ``_otlpjson.scan`` with an export
    for a line: ``(declined export indexes, spans, resources, export, resource, kind, start, end, status code, trace
    id offsets, data, span id offsets, data, name offsets, data, trace state offsets, data, span attributes, resource
    attributes)``."""
