"""OTLP JSON trace files (``.otlp.jsonl``, ``.otlp.json``, optionally gzipped): one ``ExportTraceServiceRequest``
in the OTLP JSON encoding per line, as the OpenTelemetry Collector's file exporter writes them, decoded and mapped
by :mod:`drainpipe.inputs.otlp` (the same mapping as OTLP over HTTP and gRPC)."""

from __future__ import annotations

from typing import Any

from ..batches import EventBatch
from ..options import InputOptions
from .base import LINE_BLOCK_BYTES, LineDecoder, LineFormat, split_lines

__all__ = ["OtlpJson"]


class OtlpJson(LineFormat):
    name = "otlp"
    suffixes = (".otlp.jsonl", ".otlp.json")
    cost_per_byte = 4.0  # protobuf's JSON mapping per line: the slowest per byte
    block_bytes = LINE_BLOCK_BYTES

    def decoder(self, options: InputOptions) -> LineDecoder:
        from ..otlp import decode_otlp_lines  # imports opentelemetry-proto: only where OTLP files are read

        def decode(data: bytes, count: int, first: int) -> tuple[EventBatch, list[tuple[int, Any, str]]]:
            return decode_otlp_lines(split_lines(data), first, options)

        return decode
