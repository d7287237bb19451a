"""``drainpipe serve``: the HTTP face of :class:`~drainpipe.server.service.IngestService` (stdlib only).

Endpoints::

    POST /v1/events   NDJSON (application/x-ndjson) or a JSON array (application/json), gzip accepted
                      -> 200 {"accepted", "rejected", "reasons", "errors", "warnings"}; 400 malformed body (or
                         malformed chunked framing), 401 bad token, 411 neither Content-Length nor chunked, 413 too
                         large, 415 wrong type/encoding, 429/503 + Retry-After
                      The body comes with a Content-Length or ``Transfer-Encoding: chunked``; either way the body
                      as sent (after de-chunking, before gzip) is limited to ``max_body_bytes`` and never more
                      than that is read into memory: a chunk that would pass the limit is answered 413 before
                      it is read.
    POST /v1/traces   OTLP/HTTP: an ExportTraceServiceRequest in protobuf (application/x-protobuf) or OTLP JSON
                      (application/json), gzip accepted, mapped to events (:mod:`drainpipe.inputs.otlp`)
                      -> 200 ExportTraceServiceResponse (partial_success when spans were rejected); errors as
                         for /v1/events, with a google.rpc.Status body in the request's encoding
                         (:mod:`.otlp_answers`)
    (gRPC)            with ``grpc_port``, OTLP/gRPC's TraceService/Export on that port (:mod:`.otlp_grpc`)
    GET  /v1/stats, /metrics, /v1/service, /healthz, /: the read routes every process with an HTTP face shares, and
                      their token rule (:mod:`.http_face`); /healthz is 503 while shutting down

Every error body but OTLP's is JSON (``{"error": ..., "status": ...}``), the standard library's own errors (a malformed
request line, a header too long, an unknown method) included. Conflicting ``Content-Length`` headers are refused
with 400 and the connection closed (RFC 9112 6.3). A client that goes away mid-request is one log line. A
request line and headers must arrive within ``header_deadline_s`` (30 s) of its first byte (a keep-alive
connection idle that long is closed), a body within ``body_deadline_s`` (60 s): a slow sender is cut then,
whatever its pace. A client that takes none of its answer for
``answer_deadline_s`` (60 s) is cut too. The sockets have no timeout of their own: Python polls before every read
and write of a socket with one, a system call and a hand-over of the GIL more per operation (without it, the same
load gave 754-755 requests/s against 677-726 at the same CPU); the deadlines' watchdog bounds the reads, and a
kernel send timeout (``SO_SNDTIMEO``) the writes.

With a token every endpoint but ``/healthz`` and ``/`` (a static page without data) wants
``Authorization: Bearer <token>``; the dashboard sends the token it finds in the page URL's ``#token=...``.
Binding a non-loopback address without a token is refused.

Shutdown (SIGTERM/SIGINT, or :meth:`IngestServer.shutdown_all`): stop accepting connections, refuse new posts
(503), give the requests in flight ``shutdown_grace_s`` (30 s) to finish and cut those still running (logged: they
were not acknowledged, so their clients send again), then apply the rest of the event log and close the store.
What the store does not take within the grace stays in a durable log for the next start.

A POST is answered 200 only once its events are in the service's event log (:mod:`.service`): fsynced, unless
the log is a memory log (``--durability none``). OTLP exports are decoded by the intake thread (:mod:`.intake`),
JSON bodies by :class:`~.bodies.BodyDecoder` (parser processes in ``drainpipe serve``).

Connections are read by one thread (:class:`~.http_loop.ConnectionLoop`): an OTLP/HTTP export in protobuf (one
Content-Length, the token, admitted at once) is answered there, without a thread; any other request moves its
connection, with the bytes already read, to a request thread (:class:`Handler`) for good. Both answer alike.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, cast

from ..errors import BadBody, IngestRefused, RequestRefused
from .http_face import ReadRoutes, check_bind
from .http_headers import read_headers
from .http_loop import PROTOBUF_TYPES, ConnectionLoop
from .metrics import ServerMetrics
from .otlp_answers import content_type, export_answer, status_answer
from .service import IngestService

if TYPE_CHECKING:
    from .otlp_grpc import OtlpGrpcServer

log = logging.getLogger("drainpipe.server")

NDJSON_TYPES = {"application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines"}
JSON_TYPES = {"application/json"}
MAX_ERRORS = 20
MAX_CHUNK_LINE = 4096  # a chunk-size line (with extensions) or a trailer line
MAX_TRAILERS = 32
HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")


class Handler(BaseHTTPRequestHandler):
    server: IngestServer
    protocol_version = "HTTP/1.1"
    timeout = None  # no socket timeout (see the module docstring): the deadlines bound reads, SO_SNDTIMEO writes
    server_version = "drainpipe"
    sys_version = ""
    default_request_version = "HTTP/1.0"  # an error before the version is parsed still gets a status line (no 0.9)
    _date: tuple[int, str] = (0, "")  # the Date header's second and text (date_time_string)

    # ------------------------------------------------------------------ plumbing

    def setup(self) -> None:
        super().setup()
        prefix = self.server.prefixes.pop(self.connection, b"")
        if prefix:  # what the connection loop read before it handed the connection over
            self.rfile = io.BufferedReader(_Prefixed(prefix, self.connection), io.DEFAULT_BUFFER_SIZE)
        seconds = self.server.service.options.answer_deadline_s
        whole = int(seconds)
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                                       struct.pack("ll", whole, int((seconds - whole) * 1e6)))  # fmt: skip
        except OSError:  # a platform without it: a socket timeout bounds the writes (and polls before each)
            self.connection.settimeout(seconds)

    def handle_one_request(self) -> None:
        # a keep-alive connection that sends nothing within the header deadline is closed (quietly: it is idle); once
        # a request begins, its line and headers must arrive within the deadline too (loudly: a slow sender)
        deadlines, seconds = self.server.deadlines, self.server.service.options.header_deadline_s
        deadlines.set(self.connection, seconds, "idle")
        try:
            if not cast(io.BufferedReader, self.rfile).peek(1):  # (the read that fills the buffer) closed or cut
                self.close_connection = True
                return
            deadlines.set(self.connection, seconds, "headers")
            super().handle_one_request()
        finally:
            deadlines.clear(self.connection)

    def parse_request(self) -> bool:
        """The standard library's request-line rules (the same answers to a bad line or version), with the header
        section read by :func:`.http_headers.read_headers` instead of the email parser (see that module)."""
        self.command = None  # type: ignore[assignment]  # set in case of an error in the request line
        self.request_version = version = self.default_request_version
        self.close_connection = True
        raw: bytes = self.raw_requestline  # type: ignore[attr-defined]  # set by handle_one_request before this
        self.requestline = requestline = str(raw, "iso-8859-1").rstrip("\r\n")
        words = requestline.split()
        if not words:
            return False
        if len(words) >= 3:  # enough to tell the protocol version
            version = words[-1]
            number = version[5:].split(".") if version.startswith("HTTP/") else []
            if len(number) != 2 or not all(n.isascii() and n.isdigit() and len(n) <= 10 for n in number):
                self.send_error(400, f"Bad request version ({version!r})")
                return False
            major, minor = int(number[0]), int(number[1])
            if (major, minor) >= (1, 1):
                self.close_connection = False
            if major >= 2:
                self.send_error(505, f"Invalid HTTP version ({version[5:]})")
                return False
            self.request_version = version
        if not 2 <= len(words) <= 3:
            self.send_error(400, f"Bad request syntax ({requestline!r})")
            return False
        command, path = words[:2]
        if len(words) == 2:
            self.close_connection = True
            if command != "GET":
                self.send_error(400, f"Bad HTTP/0.9 request type ({command!r})")
                return False
        self.command, self.path = command, "/" + path.lstrip("/") if path.startswith("//") else path
        try:
            self.headers = read_headers(self.rfile)  # type: ignore[assignment]  # answers what the handler asks
        except RequestRefused as exc:
            self.send_error(exc.status, exc.message)
            return False
        connection = self.headers.get("Connection", "").lower()
        if connection == "close":
            self.close_connection = True
        elif connection == "keep-alive":
            self.close_connection = False
        expect = self.headers.get("Expect", "")
        if expect.lower() == "100-continue" and self.request_version >= "HTTP/1.1":
            return self.handle_expect_100()
        return True

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The Date header's value, formatted once a second (the standard library formats it per answer)."""
        if timestamp is not None:
            return super().date_time_string(timestamp)
        now = int(time.time())
        second, text = Handler._date
        if second != now:
            text = super().date_time_string(now)
            Handler._date = (now, text)  # one tuple, rebound whole: the request threads share it without a lock
        return text

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        # counted before the answer leaves: a client that reads /metrics next must see its own request counted
        self.server.metrics.count_request(getattr(self, "path", "").split("?", 1)[0], status)
        self.end_headers()
        if getattr(self, "command", None) != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(
            status, json.dumps(obj, allow_nan=False, separators=(",", ":")).encode(), "application/json", headers
        )

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        otlp = getattr(self, "otlp_json", None)
        if otlp is not None:  # OTLP/HTTP: a google.rpc.Status in the request's encoding
            self._send(status, status_answer(status, message, otlp), content_type(otlp), headers)
            return
        self._json(status, {"error": message, "status": status}, headers)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's own errors (a malformed request line, headers too long, an unknown method) as
        JSON, like every other error of this API, and the connection closed."""
        self.close_connection = True
        try:
            short, _ = self.responses.get(code, ("error", ""))
            self._error(code, message or short)
        except OSError:  # the client is gone
            pass

    # ------------------------------------------------------------------ GET

    def do_GET(self) -> None:
        self.server.deadlines.clear(self.connection)
        path = self.path.split("?", 1)[0]
        answer = self.server.routes.get(self.path, self.headers.get("Authorization"), self.headers.get("Accept", ""))
        if answer is not None:  # the read routes every process with an HTTP face shares (http_face)
            self._send(answer.status, answer.body, answer.content_type, answer.headers)
        elif path in ("/v1/events", "/v1/traces"):
            self._error(405, "use POST", {"Allow": "POST"})
        else:
            self._error(404, f"no such endpoint: {path}")

    do_HEAD = do_GET

    # ------------------------------------------------------------------ POST

    def do_POST(self) -> None:
        self.server.deadlines.clear(self.connection)
        path = self.path.split("?", 1)[0]
        self.otlp_json: bool | None = None  # set for /v1/traces: errors are then OTLP's google.rpc.Status
        if path == "/v1/traces":
            ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
            self.otlp_json = ctype in JSON_TYPES
        if path not in ("/v1/events", "/v1/traces"):
            self._discard_body()
            self._error(
                404 if path not in ("/", "/v1/stats", "/metrics", "/healthz") else 405, f"no POST endpoint: {path}"
            )
            return
        if not self.server.token_ok(self.headers):  # before admission: a client without the token never holds a slot
            self.close_connection = True  # and its body is not read (a slow sender would tie up this thread)
            self._error(401, "missing or bad bearer token", {"WWW-Authenticate": 'Bearer realm="drainpipe"'})
            return
        t0 = time.perf_counter()
        svc = self.server.service
        try:
            svc.enter()
        except IngestRefused as r:
            self.close_connection = True
            self._error(r.status, r.message, {"Retry-After": str(r.retry_after)})
            return
        self.server.in_flight.add(self.connection)
        try:
            self._ingest(svc)
        finally:
            self.server.in_flight.discard(self.connection)
            svc.leave()
            self.server.metrics.ingest_latency.observe(time.perf_counter() - t0)

    @contextmanager
    def _body_deadline(self) -> Iterator[None]:
        """Every read of a body is within the body deadline (the sockets have no timeout of their own)."""
        deadlines = self.server.deadlines
        deadlines.set(self.connection, self.server.service.options.body_deadline_s, "body")
        try:
            yield
        finally:
            deadlines.clear(self.connection)

    def _discard_body(self) -> None:
        if "Transfer-Encoding" in self.headers:
            self.close_connection = True  # not worth de-chunking a body we do not want
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        if 0 < length <= (1 << 20):
            with self._body_deadline():
                self.rfile.read(length)
        elif length:
            self.close_connection = True

    def _ingest(self, svc: IngestService) -> None:
        opts = svc.options
        ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        otlp = self.otlp_json is not None
        if otlp:
            form = "otlp-json" if ctype in JSON_TYPES else "otlp-protobuf" if ctype in PROTOBUF_TYPES else ""
            wanted = "application/x-protobuf or application/json"
        else:
            form = "array" if ctype in JSON_TYPES else "ndjson" if ctype in NDJSON_TYPES else ""
            wanted = "application/x-ndjson or application/json"
        if not form:
            self._discard_body()
            self._error(415, f"unsupported content type {ctype or '(none)'!r}: send {wanted}")
            return
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding not in ("identity", "gzip", "x-gzip"):
            self._discard_body()
            self._error(415, f"unsupported content encoding {encoding!r}: send gzip or none")
            return
        try:
            with self._body_deadline():
                body = self._read_body(opts.max_body_bytes)
        except BadBody as exc:
            self.close_connection = True  # the body was not (fully) read: the connection cannot be reused
            self._error(exc.status, exc.message)
            return
        except OSError:  # cut at its deadline, or the client went away
            body = None
        if body is None:  # the client went away mid-body (or was cut at its deadline)
            self.close_connection = True
            log.info("client %s went away mid-body", self.client_address[0])
            return
        try:
            decoded = svc.ingest(body, form=form, gzipped=encoding != "identity")
        except BadBody as exc:
            self._error(exc.status, exc.message)
            return
        except IngestRefused as r:
            self._error(r.status, r.message, {"Retry-After": str(r.retry_after)})
            return
        if otlp:
            answer = export_answer(decoded.rejects, bool(self.otlp_json), decoded.warnings)
            self._send(200, answer, content_type(bool(self.otlp_json)))
            return
        rejects = decoded.rejects
        reasons: dict[str, int] = {}
        for _, reason in rejects:
            reasons[reason] = reasons.get(reason, 0) + 1
        key = "index" if ctype in JSON_TYPES else "line"
        self._json(
            200,
            {
                "accepted": decoded.accepted,
                "rejected": len(rejects),
                "reasons": reasons,
                "errors": [{key: i, "reason": reason} for i, reason in rejects[:MAX_ERRORS]],
                "warnings": dict(decoded.warnings),  # accepted events whose odd optional field was dropped, by reason
            },
        )

    def _read_body(self, limit: int) -> bytes | None:
        """The request body, by Content-Length or chunked; at most ``limit`` bytes are ever read into memory.
        Raises :class:`BadBody` (411/413/400/501; the caller closes the connection); None on EOF mid-body."""
        te = self.headers.get("Transfer-Encoding")
        if te is not None:
            if "Content-Length" in self.headers:
                raise BadBody(400, "both Transfer-Encoding and Content-Length")  # ambiguous framing (smuggling)
            codings = [c.strip().lower() for c in te.split(",") if c.strip()]
            if codings != ["chunked"]:
                raise BadBody(501, f"unsupported transfer encoding {te!r}: send chunked or a Content-Length")
            return self._read_chunked(limit)
        lengths = {v.strip() for v in self.headers.get_all("Content-Length") or ()}
        if len(lengths) > 1:  # RFC 9112 6.3: an invalid framing; the rest could be read as another request
            raise BadBody(400, "conflicting Content-Length headers")
        try:
            text = self.headers.get("Content-Length", "")
            length = int(text)
            if length < 0 or not text.strip().isdigit():
                raise ValueError
        except ValueError:
            raise BadBody(411, "Content-Length (or Transfer-Encoding: chunked) required") from None
        if length > limit:
            raise BadBody(413, f"body of {length} bytes is larger than the limit of {limit}")
        body = self.rfile.read(length)
        return body if len(body) == length else None

    def _read_chunked(self, limit: int) -> bytes | None:
        """De-chunk the body (RFC 9112 7.1): size lines in hex (extensions ignored), CRLF after each chunk,
        optional trailer lines (ignored) after the last (size 0) chunk."""
        body = bytearray()
        rfile = self.rfile
        while True:
            line = rfile.readline(MAX_CHUNK_LINE + 1)
            if not line:
                return None
            if len(line) > MAX_CHUNK_LINE or not line.endswith(b"\n"):
                raise BadBody(400, "malformed chunked body: chunk size line too long")
            size_text = line.split(b";", 1)[0].strip()
            if not size_text or len(size_text) > 16 or not all(c in HEX_DIGITS for c in size_text):
                raise BadBody(400, f"malformed chunked body: bad chunk size {size_text[:20]!r}")
            size = int(size_text, 16)
            if size == 0:
                break
            if len(body) + size > limit:
                raise BadBody(413, f"chunked body larger than the limit of {limit} bytes")
            data = rfile.read(size)
            if len(data) != size:
                return None
            body += data
            end = rfile.readline(3)
            if not end:
                return None
            if end not in (b"\r\n", b"\n"):
                raise BadBody(400, "malformed chunked body: chunk data not followed by CRLF")
        for _ in range(MAX_TRAILERS + 1):  # trailer section, ended by an empty line
            line = rfile.readline(MAX_CHUNK_LINE + 1)
            if not line:
                return None
            if line in (b"\r\n", b"\n"):
                return bytes(body)
            if len(line) > MAX_CHUNK_LINE:
                break
        raise BadBody(400, "malformed chunked body: trailer section too long")


class _Prefixed(io.RawIOBase):
    """A connection's bytes that the connection loop read, then the socket's."""

    def __init__(self, prefix: bytes, sock: socket.socket) -> None:
        self._prefix = memoryview(prefix)
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._prefix:
            n = min(len(buffer), len(self._prefix))
            buffer[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        return self._sock.recv_into(buffer)


class _Deadlines:
    """One watchdog thread for every connection's deadline: a connection still reading its request line and headers,
    or its body, when its deadline passes is cut (its socket shut down), which ends the blocked read. Slow senders
    (slowloris) cannot hold a thread for longer than the deadline, however slowly they trickle."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[socket.socket, tuple[float, str]] = {}
        self._thread = threading.Thread(target=self._watch, name="drainpipe-http-deadlines", daemon=True)
        self._stopped = threading.Event()
        self._thread.start()

    def set(self, sock: socket.socket, seconds: float, what: str) -> None:
        with self._lock:
            self._due[sock] = (time.monotonic() + seconds, what)

    def clear(self, sock: socket.socket) -> None:
        with self._lock:
            self._due.pop(sock, None)

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(0.1):
            now = time.monotonic()
            with self._lock:
                late = [(sock, what) for sock, (due, what) in self._due.items() if due <= now]
                for sock, _ in late:
                    del self._due[sock]
            for sock, what in late:
                try:
                    peer = sock.getpeername()[0]
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    continue
                if what == "idle":
                    log.debug("closed an idle keep-alive connection from %s", peer)
                else:
                    log.info("cut a connection from %s: its %s took too long", peer, what)


class IngestServer(ThreadingHTTPServer):
    """The HTTP server around one :class:`IngestService`. ``serve_forever`` in a thread; ``shutdown_all`` once."""

    daemon_threads = True  # idle keep-alive threads do not hold the process; in-flight work is tracked
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        service: IngestService,
        host: str = "127.0.0.1",
        port: int = 8080,
        token: str | None = None,
        shutdown_grace_s: float = 30.0,
        grpc_port: int | None = None,
    ) -> None:
        check_bind(host, token, "serve")
        self.service = service
        self.token = token or None
        self.shutdown_grace_s = shutdown_grace_s
        self.in_flight: set[socket.socket] = set()  # connections inside a POST (cut when the grace runs out)
        self.prefixes: dict[socket.socket, bytes] = {}  # connections handed over by the loop: what it read of them
        self.version = f"{Handler.server_version} {Handler.sys_version}"  # the Server header, as a Handler sends it
        self.deadlines = _Deadlines()
        self.metrics = ServerMetrics(service)
        self.routes = ReadRoutes(service.health, service.stats_view, self.metrics.render, service.store,
                                 service.definitions, self.token)  # fmt: skip
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.address_family = family
        super().__init__((host, port), Handler)
        self._loop = ConnectionLoop(self)
        self._thread: threading.Thread | None = None
        self._closed = False
        self.grpc: OtlpGrpcServer | None = None  # OTLP/gRPC beside, when given a port (grpcio is imported then)
        if grpc_port is not None:
            from .otlp_grpc import OtlpGrpcServer

            try:
                self.grpc = OtlpGrpcServer(service, self.metrics, self.token, host, grpc_port)
            except BaseException:
                self.server_close()
                raise

    @property
    def url(self) -> str:
        address, port = self.server_address[:2]
        host = str(address, "ascii") if isinstance(address, bytes) else address
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"

    def token_ok(self, headers: Any) -> bool:
        """Whether a request's ``Authorization`` header carries the bearer token (always, without a token)."""
        return self.routes.authorized(headers.get("Authorization"))

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that goes away mid-request is one log line; anything else keeps its traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.info("client %s went away: %s", client_address[0], type(exc).__name__)
            return
        if isinstance(exc, BlockingIOError):  # the send timeout (SO_SNDTIMEO): the client took none of its answer
            log.info("cut a connection from %s: its answer was not taken", client_address[0])
            return
        log.error("request from %s failed", client_address[0], exc_info=exc)

    def start(self) -> IngestServer:
        if self.grpc is not None:
            self.grpc.start()
        self._thread = threading.Thread(target=self._loop.run, name="drainpipe-http", daemon=True)
        self._thread.start()
        return self

    def hand_over(self, sock: socket.socket, address: Any, read: bytes) -> None:
        """A connection the loop does not serve: to a request thread (``read``: its bytes the loop took)."""
        if read:
            self.prefixes[sock] = read
        try:
            self.process_request(sock, address)
        except BaseException:
            self.prefixes.pop(sock, None)
            raise

    def shutdown(self) -> None:
        """Stop accepting (the connection loop); the connections it served are closed, request threads finish."""
        self._loop.stop()
        if self._thread is not None:
            self._loop.join(10.0)

    def shutdown_all(self) -> dict[str, Any]:
        """Stop accepting, finish the requests in flight, flush the pipeline, close the store. Idempotent."""
        if self._closed:
            return self.service.summary()
        self._closed = True
        t0 = time.monotonic()
        if not self.service.drain(self.shutdown_grace_s):  # new posts get 503 from here on
            # requests still in flight after the grace (slow senders): cut them; none was acknowledged, so nothing
            # accepted is lost, and their clients send again
            cut = list(self.in_flight)
            for sock in cut:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            log.warning("shutdown: cut %d request(s) still in flight after %.0f s", len(cut), time.monotonic() - t0)
        if self.grpc is not None:
            self.grpc.stop()  # and cancel its calls still running, as the connections above were cut
        self.shutdown()  # stop the accept loop
        self.deadlines.stop()
        self.server_close()
        return self.service.close(self.shutdown_grace_s)  # applies the rest of the log (what the store takes in time)


def run_server(
    service: IngestService,
    host: str,
    port: int,
    token: str | None,
    *,
    announce: Any = print,
    shutdown_grace_s: float = 30.0,
    grpc_port: int | None = None,
) -> dict[str, Any]:
    """Serve until SIGTERM or SIGINT, then shut down gracefully: requests in flight get ``shutdown_grace_s`` to
    finish, then are cut; the pipeline is flushed. Returns the shutdown summary."""
    server = IngestServer(service, host, port, token, shutdown_grace_s, grpc_port)
    stop = threading.Event()
    received: list[str] = []

    def on_signal(signum: int, _frame: Any) -> None:
        received.append(signal.Signals(signum).name)
        if stop.is_set() and len(received) > 1:
            # a second signal while flushing (e.g. the store stays down): give up; a durable log keeps what the
            # store does not have yet for the next start, a memory log loses it
            kept = "it stays in the write-ahead log" if service.log.durable else "it is lost (--durability none)"
            announce(f"drainpipe serve: {received[-1]} again: exiting without finishing; what the store does not "
                     f"have yet: {kept}")  # fmt: skip
            os._exit(3)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.start()
        grpc_note = f"OTLP/gRPC on {server.grpc.address}; " if server.grpc is not None else ""
        announce(
            f"drainpipe serve: listening on {server.url} ({grpc_note}store {service.store_url or '?'}; "
            f"{service.log_note()}; {'bearer token required' if token else 'no token'})"
        )
        while not stop.wait(0.5):
            pass
        announce(f"drainpipe serve: {received[0] if received else 'stop'}: draining and flushing")
        summary = server.shutdown_all()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if not server._closed:
            server.shutdown_all()
    announce("drainpipe serve: stopped: " + " ".join(f"{k}={v}" for k, v in summary.items()))
    return summary
