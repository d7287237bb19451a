"""OTLP JSON trace files (``.otlp.jsonl``, ``.otlp.json``, optionally gzipped): one ``ExportTraceServiceRequest``
in the OTLP JSON encoding per line, as the OpenTelemetry Collector's file exporter writes them, decoded and mapped
by :mod:`drainpipe.inputs.otlp` (the same mapping as OTLP over HTTP and gRPC).

A block of lines is read and mapped to events in one C pass (:func:`~drainpipe.inputs.span_events.map_json_block`;
where it is not built or is off, as on Spark executors, read into span columns by ``json`` and pyarrow,
:mod:`~drainpipe.inputs.span_json`, and mapped at once); a line the pass declines is decoded by the reference
(protobuf's JSON mapping), which decides whether it is valid. With the ``columnar`` tier off
(:mod:`drainpipe.native`) every line goes to the reference. The file is cut into byte ranges of whole lines for
the workers, as JSON Lines files are, with blocks of about :data:`~.base.LINE_BLOCK_BYTES` each (an OTLP line is a
whole export, often hundreds of spans)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ... import native
from ...errors import InputError, OtlpError
from ..batches import EventBatch
from ..options import InputOptions
from ..span_events import TOO_LARGE, Mapped, decode_halves, map_columns, map_json_block
from ..span_json import python_json_spans
from .base import LINE_BLOCK_BYTES, LineDecoder, LineFormat, split_lines

__all__ = ["OtlpJson", "decode_exports"]


class OtlpJson(LineFormat):
    name = "otlp"
    suffixes = (".otlp.jsonl", ".otlp.json")
    cost_per_byte = 4.0  # a Spark split's weight: the Python pass (span_json) where the C one is not, slowest per byte
    block_bytes = LINE_BLOCK_BYTES

    def decoder(self, options: InputOptions) -> LineDecoder:
        columns = native.enabled("columnar")

        def decode(data: bytes | memoryview, count: int, first: int) -> tuple[EventBatch, list[tuple[int, Any, str]]]:
            return decode_block(data, count, first, options, columns)

        return decode


def decode_block(
    data: bytes | memoryview, count: int, first_line: int, options: InputOptions, columns: bool = True
) -> tuple[EventBatch, list[tuple[int, Any, str]]]:
    """A block of ``count`` OTLP JSON lines, the first of them line ``first_line + 1`` -> its events and
    ``(line, raw, reason)`` rejects: those of :func:`~drainpipe.inputs.otlp.decode_otlp_lines` (the reference), in
    the same order of lines. With ``columns`` the lines are read in one pass (C, or :mod:`~..span_json` where the C
    pass is not built) and mapped at once; the lines the pass declines, and every line when ``columns`` is false, go
    to the reference. Lines whose events take more than 2 GiB of text in a column are decoded apart
    (:func:`~..span_events.decode_halves`)."""
    try:
        return _decode_block(data, count, first_line, options, columns)
    except OverflowError:
        lines = split_lines(bytes(data))
        return decode_halves(first_line + 1, first_line + 1 + count,
                             lambda lo, hi: _decode_block(b"".join(lines[lo - first_line - 1 : hi - first_line - 1]),
                                                          hi - lo, lo - 1, options, columns),
                             lambda line: lines[line - first_line - 1])  # fmt: skip


def _decode_block(
    data: bytes | memoryview, count: int, first_line: int, options: InputOptions, columns: bool
) -> tuple[EventBatch, list[tuple[int, Any, str]]]:
    if not columns:
        return _reference(split_lines(bytes(data)), first_line, options)
    mapped = map_json_block(data, count, options.spans, options.endpoints)
    if mapped is None:  # no C pass (Spark executors, or off): the same columns by json and pyarrow, then mapped
        scanned = python_json_spans(bytes(data), count)
        result = map_columns(scanned.columns, options.spans, options.endpoints)
        mapped = Mapped(result.batch, scanned.span_rejects(result.rejects), scanned.declined)
    events, span_rejects, declined, _ = mapped
    batches = [events] if events.num_rows else []
    bad: list[tuple[int, Any, str]] = [(first_line + 1 + k, raw, why) for k, raw, why in span_rejects]
    if declined:
        raw = split_lines(bytes(data))
        for k in declined:
            batch, rejects = _reference(raw[k : k + 1], first_line + k, options)
            if batch.num_rows:
                batches.append(batch)
            bad += rejects
        bad.sort(key=lambda reject: reject[0])  # line order, as the reference reports them (the sort is stable)
    return EventBatch.join(batches), bad


def decode_exports(exports: Sequence[bytes], options: InputOptions) -> tuple[EventBatch, list[tuple[int, Any, str]]]:
    """OTLP JSON exports as they come in messages and bodies (an ``ExportTraceServiceRequest`` each, in any
    layout) -> their events and ``(export index, raw, reason)`` rejects, by the pass that reads files' lines
    (:func:`decode_block`): a JSON document holds no raw newline inside a string, so an export with its line breaks
    blanked is one line, and the exports are one block. An export rejected whole is ``(index, its bytes, the
    reference decoder's one-line reason)``, as :func:`~drainpipe.inputs.otlp.decode_traces` raises it; a span is
    ``(index, {"span": its index in the export}, reason)``."""
    lines = [e.replace(b"\r", b" ").replace(b"\n", b" ") for e in exports]
    blank = [k for k, line in enumerate(lines) if not line.strip()]
    if blank:  # (a blank line is no line to the block: its reject comes from the reference below)
        lines = [b"{}" if not line.strip() else line for line in lines]
    batch, rejects = decode_block(b"\n".join(lines), len(lines), -1, options, native.enabled("columnar"))
    out: list[tuple[int, Any, str]] = []
    for k, raw, reason in rejects:
        if isinstance(raw, dict):
            out.append((k, raw, reason))
        else:  # rejected whole: the reference's reason, but for one too large (the reference overflows as well)
            out.append((k, exports[k], reason if reason == TOO_LARGE else _why(exports[k], options)))
    out += [(k, exports[k], _why(exports[k], options)) for k in blank]
    out.sort(key=lambda reject: reject[0])
    return batch, out


def _why(export: bytes, options: InputOptions) -> str:
    """The reference decoder's reason for an export it rejects whole ("invalid JSON: ...")."""
    from ..otlp import decode_traces

    try:
        decode_traces(export, json_body=True, mapping=options.spans, endpoints=options.endpoints)
    except OtlpError as exc:
        return str(exc)
    return "invalid OTLP JSON"  # (the block's pass and the reference disagree: the tests hold them to one result)


def _reference(
    lines: list[bytes], first_line: int, options: InputOptions
) -> tuple[EventBatch, list[tuple[int, Any, str]]]:
    """The reference decoder over ``lines`` (imported here: it needs opentelemetry-proto, which only the lines the
    passes decline, and the tests' comparisons, use)."""
    try:
        from ..otlp import decode_otlp_lines
    except ImportError as exc:  # a Spark executor without opentelemetry-proto, on a line the Python pass declines
        raise InputError(f"an OTLP JSON line outside the fast passes needs the reference decoder, which needs "
                         f"opentelemetry-proto installed where it is read ({exc})") from None  # fmt: skip
    return decode_otlp_lines(lines, first_line, options)
