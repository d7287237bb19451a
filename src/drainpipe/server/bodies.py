"""Request bodies into validated event batches: gunzip, JSON or NDJSON, the input layer's validation, limits; in
this process or in parser processes (the server's second core).

Parsing and validating are the per-event Python work of ingest; under one GIL they would share a core with HTTP,
the log and the whole engine. :class:`BodyDecoder` with ``processes > 0`` hands each body to a pool of parser
processes (``concurrent.futures.ProcessPoolExecutor``) that send back the validated batch as an Arrow IPC
message (a memory copy to rebuild) and the rejects; the request thread waits without holding the GIL. A parser
process that dies (killed, out of memory) breaks the pool: the request it was serving and those queued behind it
are parsed in process instead, and a new pool is started, so a crashed parser costs time, never a request.
Bodies under ``INLINE_BYTES`` are parsed in process: the round trip would cost more than the parse.

Errors are :class:`BadBody` (an HTTP status and a one-line message), raised in the request thread either way.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import zlib
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import pyarrow as pa

from ..inputs import EVENT_SCHEMA, validate_json_lines, validate_records

__all__ = ["INLINE_BYTES", "BadBody", "BodyDecoder", "decode_body"]

log = logging.getLogger("drainpipe.server")

INLINE_BYTES = 16 << 10  # bodies smaller than this are parsed in the request thread

Rejects = list[tuple[int, str]]


class BadBody(Exception):
    """A body that cannot be accepted: ``status`` (400, 413) and a one-line ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message


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


def decode_body(
    body: bytes, *, array: bool, gzipped: bool, max_decoded: int, max_events: int
) -> tuple[pa.RecordBatch, Rejects]:
    """A body as sent (``array``: a JSON array or one object; else NDJSON) -> the valid events as an
    :data:`EVENT_SCHEMA` batch, and ``(index or line, reason)`` per rejected one. Raises :class:`BadBody`."""
    if gzipped:
        body = gunzip(body, max_decoded)
    elif len(body) > max_decoded:
        raise BadBody(413, f"body larger than {max_decoded} bytes")
    if array:
        return validate_records(_json_records(body, max_events))
    batch, rejects = validate_json_lines(body)
    if batch.num_rows + len(rejects) > max_events:
        raise BadBody(413, f"more than {max_events} events in one request")
    return batch, rejects


def _decode_in_parser(body: bytes, kwargs: dict[str, Any]) -> tuple[Any, Rejects] | tuple[int, str]:
    """In a parser process: (IPC message of the batch, rejects), or (status, message) for a bad body."""
    try:
        batch, rejects = decode_body(body, **kwargs)
    except BadBody as exc:
        return exc.status, exc.message
    return batch.serialize(), rejects


def _init_parser(parent: int) -> None:
    from ..inputs import use_serial_json_reader
    from ..pipeline.parallel import die_with

    use_serial_json_reader()  # the pool is the parallelism
    die_with(parent)


class BodyDecoder:
    """Decodes bodies in ``processes`` parser processes (0: in the calling thread). Thread-safe; ``close`` once."""

    def __init__(self, processes: int = 0) -> None:
        self.processes = processes
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = self._start() if processes else None
        self.restarts = 0

    def _start(self) -> ProcessPoolExecutor:
        from ..pipeline.parallel import process_pool

        return process_pool(self.processes, _init_parser, (os.getpid(),))

    def decode(
        self, body: bytes, *, array: bool, gzipped: bool, max_decoded: int, max_events: int
    ) -> tuple[pa.RecordBatch, Rejects]:
        """As :func:`decode_body`; blocks until parsed. Raises :class:`BadBody`."""
        kwargs = dict(array=array, gzipped=gzipped, max_decoded=max_decoded, max_events=max_events)
        pool = self._pool
        if pool is None or len(body) < INLINE_BYTES:
            return decode_body(body, **kwargs)  # type: ignore[arg-type]
        try:
            first, second = pool.submit(_decode_in_parser, body, kwargs).result()
        except BrokenProcessPool:
            self._replace(pool)
            return decode_body(body, **kwargs)  # type: ignore[arg-type]
        if isinstance(first, int):
            raise BadBody(first, str(second))
        return pa.ipc.read_record_batch(first, EVENT_SCHEMA), second  # type: ignore[return-value]

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is not broken:
                return  # another request thread replaced it already
            log.error("a parser process died; starting new ones (requests meanwhile are parsed in process)")
            self.restarts += 1
            self._pool = None
        broken.shutdown(wait=False, cancel_futures=True)
        pool = self._start()
        with self._lock:
            self._pool = pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
