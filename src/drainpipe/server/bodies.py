"""Request bodies into validated event batches: gunzip, JSON or NDJSON, the input layer's validation, limits; in
this process or in parser processes (the server's second core).

Parsing and validating are the per-event Python work of ingest; under one GIL they would share a core with HTTP,
the log and the whole engine. :class:`BodyDecoder` with ``processes > 0`` hands each body to one of its parser
processes over a :class:`~.channel.Channel` (the body, then the validated batch as an Arrow IPC message, in
shared memory; the rejects in the answer's header); the request thread waits without holding the GIL.
(``concurrent.futures.ProcessPoolExecutor`` was measured first: its feeder and manager threads and pickling took a
third of the server's GIL time.) A parser that dies (killed, out of memory) is replaced, and the request it was
serving is parsed in process: a crashed parser costs time, never a request.
Bodies under ``INLINE_BYTES`` are parsed in process: the round trip would cost more than the parse.

Errors are :class:`BadBody` (an HTTP status and a one-line message), raised in the request thread either way.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import native
from ..errors import BadBody, ChannelClosed
from ..inputs import EventBatch, InputOptions, ReadStats, decode_exports, validate_json_lines, validate_records
from ..inputs.endpoints import EndpointRules
from ..inputs.span_events import TOO_LARGE, map_proto_exports
from ..inputs.spans import SpanMapping
from .channel import HelperPool

__all__ = ["FORMS", "INLINE_BYTES", "MAX_EVENT_BYTES", "NATIVE_FORMS", "BadBody", "BodyDecoder", "Decoded",
           "decode_body", "decode_proto_bodies"]  # fmt: skip

log = logging.getLogger("drainpipe.server")

INLINE_BYTES = 16 << 10  # bodies smaller than this are parsed in the request thread

#: a request's events (Arrow bytes) at most, 413 above: a log record holds at most 1 GiB, and an OTLP export whose
#: resource repeats a long value on every span takes far more as events than as a body (a 1 MB gzip body, 1 GB)
MAX_EVENT_BYTES = 512 << 20

Rejects = list[tuple[int, str]]


class Decoded(NamedTuple):
    """What a request's answer says of its body once its events are logged."""

    accepted: int  # events (an OTLP export's exit rows among them)
    rejects: Rejects  # (index, reason) per rejected record
    warnings: tuple[tuple[str, int], ...]  # (reason, events) accepted with an odd optional field dropped

    @classmethod
    def of(cls, batch: EventBatch, rejects: Rejects) -> Decoded:
        return cls(batch.num_rows, rejects, batch.warnings)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_strict_json = json.JSONDecoder(parse_constant=_reject_constant)


def gunzip(body: bytes, limit: int) -> bytes:
    """Decompress a gzip body (several members allowed) up to ``limit`` bytes: 413 above, 400 if corrupt."""
    out = bytearray()
    data = body
    try:
        while data:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out += d.decompress(data, limit + 1 - len(out))
            if len(out) > limit:
                raise BadBody(413, f"decompressed body larger than {limit} bytes")
            if not d.eof:
                if d.unconsumed_tail:
                    raise BadBody(413, f"decompressed body larger than {limit} bytes")
                raise BadBody(400, "truncated gzip body")
            data = d.unused_data.lstrip(b"\0")
    except zlib.error as exc:
        raise BadBody(400, f"bad gzip body: {exc}") from None
    return bytes(out)


def _json_records(body: bytes, max_events: int) -> list[Any]:
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise BadBody(400, "body is not UTF-8") from None
    try:
        obj, end = _strict_json.raw_decode(text, len(text) - len(text.lstrip()))
        if text[end:].strip():
            raise ValueError("extra data after the JSON value")
    except (ValueError, RecursionError) as exc:
        raise BadBody(400, f"malformed JSON: {exc}") from None
    if isinstance(obj, dict):
        obj = [obj]
    if not isinstance(obj, list):
        raise BadBody(400, "expected a JSON array of events (or one event object)")
    if len(obj) > max_events:
        raise BadBody(413, f"more than {max_events} events in one request")
    return obj


#: what a body holds: NDJSON events, a JSON array of events, an OTLP trace export in protobuf or in OTLP JSON
FORMS = ("ndjson", "array", "otlp-protobuf", "otlp-json")
#: the forms a C pass decodes (the span mapping included): cheaper in the server process than a round trip
NATIVE_FORMS = ("otlp-protobuf", "otlp-json")


#: decoded bytes one native pass over a group's bodies takes at most: a group is bounded by the bytes posted, and
#: gzip bodies may each decode to ``max_decoded`` (the pass keeps every export and its columns at once)
PASS_BYTES = 64 << 20


def decode_proto_bodies(
    bodies: Sequence[tuple[bytes, bool]],
    *,
    max_decoded: int,
    max_events: int,
    spans: SpanMapping | None = None,
    endpoints: EndpointRules | None = None,
) -> tuple[list[EventBatch], list[Decoded | BadBody]]:
    """OTLP protobuf bodies as sent (``(body, gzipped)`` each) -> the events of those accepted, in batches of at
    most :data:`MAX_EVENT_BYTES` each, and per body what :func:`decode_body` gives it (as :class:`Decoded`) or
    raises: the same answers, from one native pass over up to :data:`PASS_BYTES` of them at a time, so that the
    Python around the pass runs once a group, not once a body.

    A run of bodies in which the pass declines an export, a body holds more than ``max_events`` spans, an event is
    accepted with a warning (which the pass counts for the run, not per export), or the events take more than
    :data:`MAX_EVENT_BYTES` (or 2 GiB of text in a column) is decoded a body at a time."""
    out: list[Decoded | BadBody | None] = [None] * len(bodies)
    batches: list[EventBatch] = []
    run: list[tuple[int, bytes]] = []  # (body index, its export) for the next pass
    run_bytes = 0
    for i, (body, gzipped) in enumerate(bodies):
        try:
            export = _sized(body, gzipped, max_decoded)
        except BadBody as exc:
            out[i] = exc
            continue
        if run and run_bytes + len(export) > PASS_BYTES:
            batches += _decode_run(run, bodies, out, max_decoded, max_events, spans, endpoints)
            run, run_bytes = [], 0
        run.append((i, export))
        run_bytes += len(export)
    if run:
        batches += _decode_run(run, bodies, out, max_decoded, max_events, spans, endpoints)
    return batches, [o for o in out if o is not None]


def _decode_run(
    run: list[tuple[int, bytes]],
    bodies: Sequence[tuple[bytes, bool]],
    out: list[Decoded | BadBody | None],
    max_decoded: int,
    max_events: int,
    spans: SpanMapping | None,
    endpoints: EndpointRules | None,
) -> list[EventBatch]:
    """One native pass over ``run``'s exports, each body's outcome in ``out``; the events' batches."""
    exports = [export for _, export in run]
    try:
        mapped = (map_proto_exports(exports, spans or SpanMapping(), endpoints or EndpointRules())
                  if len(run) > 1 else None)  # fmt: skip
    except OverflowError:  # more than 2 GiB of text in a column: a body at a time, below
        mapped = None
    if mapped is not None and not (mapped.declined or mapped.events.warnings) and not _over_event_bytes(mapped.events):
        assert mapped.per_export is not None  # (the C pass counts them)
        rejects: list[Rejects] = [[] for _ in exports]
        for k, raw, reason in mapped.rejects:
            rejects[k].append((raw["span"], reason))
        if all(mapped.per_export[k] + len(rejects[k]) <= max_events for k in range(len(exports))):
            for (i, _), n, r in zip(run, mapped.per_export, rejects):
                out[i] = Decoded(int(n), r, ())
            return [mapped.events]
    batches = []
    for i, _ in run:  # a body at a time, as decode_body answers it
        body, gzipped = bodies[i]
        try:
            batch, found = decode_body(body, form="otlp-protobuf", gzipped=gzipped, max_decoded=max_decoded,
                                       max_events=max_events, spans=spans, endpoints=endpoints)  # fmt: skip
        except BadBody as exc:
            out[i] = exc
            continue
        out[i] = Decoded.of(batch, found)
        batches.append(batch)
    return batches


def _over_event_bytes(events: EventBatch) -> bool:
    """Whether ``events`` take more than :data:`MAX_EVENT_BYTES` (their buffers first: the exact count only then)."""
    return events.buffer_bytes > MAX_EVENT_BYTES and events.rows.nbytes > MAX_EVENT_BYTES


def _sized(body: bytes, gzipped: bool, max_decoded: int) -> bytes:
    """The body decompressed, within ``max_decoded`` bytes (413 above, 400 for a corrupt gzip body)."""
    if gzipped:
        return gunzip(body, max_decoded)
    if len(body) > max_decoded:
        raise BadBody(413, f"body larger than {max_decoded} bytes")
    return body


def decode_body(
    body: bytes,
    *,
    form: str,
    gzipped: bool,
    max_decoded: int,
    max_events: int,
    spans: SpanMapping | None = None,
    endpoints: EndpointRules | None = None,
) -> tuple[EventBatch, Rejects]:
    """A body as sent (``form``: one of :data:`FORMS`) -> the valid events (an OTLP export's exit rows after its
    requests, see :class:`~drainpipe.inputs.EventBatch`), and ``(index, reason)`` per rejected
    record (the array index, the line number, or the span's index in the export). ``spans``/``endpoints``: the
    OTLP mapping (default: the built-in one). Raises :class:`BadBody`."""
    body = _sized(body, gzipped, max_decoded)
    if form in ("array", "ndjson"):
        stats = ReadStats()  # for the warnings of the events accepted (an odd optional field dropped)
        if form == "array":
            batch, rejects = validate_records(_json_records(body, max_events), stats)
        else:
            batch, rejects = validate_json_lines(body, stats)
            if batch.num_rows + len(rejects) > max_events:
                raise BadBody(413, f"more than {max_events} events in one request")
        return EventBatch(batch, batch.num_rows, tuple(stats.warnings.items())), rejects
    # an export goes through the pass that reads it from files and Kafka values too: one decoder per wire format
    options = InputOptions(spans=spans or SpanMapping(), endpoints=endpoints or EndpointRules())
    if form == "otlp-json":
        events, found = decode_exports([body], options)
    else:
        from ..inputs.otlp import decode_proto_exports

        events, found = decode_proto_exports([body], options)
    for _, raw, reason in found:
        if not isinstance(raw, dict):
            raise BadBody(413 if reason == TOO_LARGE else 400, reason)
    if events.num_rows + len(found) > max_events:
        raise BadBody(413, f"more than {max_events} spans in one request")
    if _over_event_bytes(events):
        raise BadBody(413, f"the request's events take {events.rows.nbytes:,} bytes, more than {MAX_EVENT_BYTES:,}")
    return events, [(raw["span"], reason) for _, raw, reason in found]


class _Parse:
    """What a parser process does with a request: ``(decode_body's keyword arguments, body) -> ((0, (rejects,
    warnings)), the batch encoded)`` (:meth:`EventBatch.encode`; its warnings travel beside it), or ``((status,
    message), b"")`` for a bad body."""

    def __init__(self) -> None:
        self.endpoints: EndpointRules | None = None
        self.ready = False

    def __call__(self, kwargs: dict[str, Any], body: bytes) -> tuple[tuple[int, Any], memoryview]:
        if not self.ready:  # in the process, once
            native.disable("threads")  # the processes are the parallelism
            self.ready = True
        # the endpoint rules arrive with every body; keep using the first equal copy, whose memo is warm
        if kwargs.get("endpoints") is not None:
            if kwargs["endpoints"] == self.endpoints:
                kwargs["endpoints"] = self.endpoints
            else:
                self.endpoints = kwargs["endpoints"]
        try:
            batch, rejects = decode_body(body, **kwargs)
        except BadBody as exc:
            return (exc.status, exc.message), memoryview(b"")
        return (0, (rejects, batch.warnings)), batch.encode()


class BodyDecoder:
    """Decodes bodies in ``processes`` parser processes (0: in the calling thread), a :class:`~.channel.HelperPool`.
    Thread-safe; ``close`` once.

    Each parser serves one request at a time over its own channel: a request thread takes a free parser, puts the
    body in the channel's shared memory, and waits for the answer (without the GIL); no executor threads, no
    pickling of bodies or batches. The parsers start with the first body that needs one (a JSON body; OTLP exports
    are decoded natively on the intake thread, so a server of OTLP traffic runs none); until one is up, and when a
    parser dies (it is replaced), a body is parsed in the calling thread."""

    def __init__(self, processes: int = 0) -> None:
        self.processes = processes
        self._pool = HelperPool(_Parse(), processes, name="drainpipe-parser") if processes else None

    def wait_up(self, timeout_s: float = 60.0) -> bool:
        """Start the parsers now and wait until every one is up; False if that took longer than ``timeout_s``."""
        return self._pool is None or self._pool.wait_up(timeout_s)

    @property
    def restarts(self) -> int:
        return self._pool.restarts if self._pool is not None else 0

    @property
    def parser_processes(self) -> list[Any]:
        """The processes of the parsers that are up now (``multiprocessing.Process``)."""
        return self._pool.processes if self._pool is not None else []

    def decode(self, body: bytes, **kwargs: Any) -> tuple[EventBatch, Rejects]:
        """As :func:`decode_body` (same keyword arguments); blocks until parsed. Raises :class:`BadBody`."""
        if self._pool is None or len(body) < INLINE_BYTES:
            return decode_body(body, **kwargs)
        try:
            (status, second), payload = self._pool.call(kwargs, body)
        except ChannelClosed:  # none is up yet, or it died (and was replaced): parse this one here
            return decode_body(body, **kwargs)
        if status:
            raise BadBody(status, str(second))
        rejects, warnings = second
        return EventBatch.decode(payload, warnings), rejects

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
