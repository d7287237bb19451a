"""``serve``'s connections on one thread (:class:`ConnectionLoop`): OTLP exports in protobuf are read, decoded,
logged and answered without a thread per connection; every other request goes to a request thread.

A thread per connection made every socket call a hand-over of the GIL among a dozen threads: under a saturated
OTLP load the server process spent about 40% of its CPU in the scheduler, 32 context switches a request, while the
work itself (the HTTP framing, the native decode, the log) is a few hundred microseconds. Here one thread polls
every connection (``selectors``); the exports that a turn of the loop completed, from all the connections, are
decoded and logged as one group on this thread (:meth:`IngestService.ingest_now`, the intake's group path), and
their answers written. While a group is logged (its fsync) the next requests wait in their sockets, and the next
turn takes them all: the group grows with the load. (They went to the intake thread before, and their answers came
back through a wake-up socket: two hand-offs a turn, 14 against 9 context switches a request at a fixed rate)::

    accept ─► ConnectionLoop: read the request line and the headers (http_headers.read_headers, as a request
              │               thread reads them)
              ├─ the fast path: POST /v1/traces, HTTP/1.1, application/x-protobuf, one Content-Length within the
              │  limit, no Expect, the token:
              │     read the body; admission (the engine behind: the request waits here, its connection unread,
              │     and is asked again every ADMIT_POLL_S; 429 after admit_wait_s, 503 at once); at the end of the
              │     turn, every body admitted: IngestService.ingest_now: decode (one pass), log (fsync), the
              │     answers; write them, read the connections' next requests
              └─ anything else (a GET, chunked or JSON bodies, a bad request): the connection and the bytes read
                 from it go to a request thread (http.Handler) for the rest of its life

The fast path answers exactly what a request thread answers for those requests (the same ExportTraceServiceResponse,
the same errors: a malformed export 400 with a google.rpc.Status, 429/503 with Retry-After); anything it is not sure
of, it hands over. The deadlines are the request threads': an idle keep-alive connection is closed after
``header_deadline_s``, a request line and headers must arrive within it, a body within ``body_deadline_s``, an
answer must be taken within ``answer_deadline_s``.

Admission is the loop's too, never a reason to hand a connection over: a saturated server's engine falls behind for
moments (a checkpoint, a large batch), the log fills while the store is down, and a connection handed to a request
thread is theirs for good. Handed over for that, after a few seconds of saturation every export went through a
request thread and the intake thread, with their hand-offs (1.35x the spans per CPU second once they wait here:
medians of 3 rounds in turns, 20 s each).

Thread-safety: the loop's state is its own thread's; :meth:`ConnectionLoop.stop` from another thread sets the
stop flag and writes a byte to the wake socket.
"""

from __future__ import annotations

import email.utils
import io
import logging
import re
import selectors
import socket
import threading
import time
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import IngestRefused, RequestRefused
from .http_headers import read_headers
from .otlp_answers import content_type, export_answer, status_answer
from .service import ADMIT_POLL_S

if TYPE_CHECKING:
    from .bodies import Decoded
    from .metrics import ServerMetrics
    from .service import Answer, IngestService

__all__ = ["PROTOBUF_TYPES", "ConnectionLoop", "Server"]

log = logging.getLogger("drainpipe.server")

PROTOBUF_TYPES = {"application/x-protobuf", "application/protobuf"}
READ_BYTES = 256 << 10
HEAD_BYTES = 64 << 10  # a header section longer than this goes to a request thread (which applies its limits)
TICK_S = 0.1  # how often deadlines are checked at most
#: request heads whose framing the loop keeps, by shape (a head without its Content-Length digits: a client sends
#: a few); all are dropped when there are more, so a client that varies its heads costs the parse, never memory
SHAPES_KEPT = 256
#: the length of a head as clients write it (a head written otherwise is read every time)
_LENGTH = re.compile(rb"\r\nContent-Length: ([0-9]{1,18})\r\n")


Socket = socket.socket


class Server(Protocol):
    """What the loop needs of its HTTP server (:class:`.http.IngestServer`)."""

    service: IngestService
    metrics: ServerMetrics
    socket: Socket  # the listening socket
    version: str  # the Server header

    def token_ok(self, headers: Any) -> bool: ...
    def hand_over(self, sock: Socket, address: Any, read: bytes) -> None: ...


class _Conn:
    __slots__ = ("sock", "addr", "buf", "head_end", "length", "gzipped", "due", "what", "out", "busy", "closing",
                 "handoff", "events", "asked_close", "since", "entered")  # fmt: skip

    def __init__(self, sock: socket.socket, addr: Any, idle_s: float) -> None:
        self.sock = sock
        self.addr = addr
        self.buf = bytearray()
        self.head_end = -1  # where the body starts, once the head is read and taken for the fast path
        self.length = 0
        self.gzipped = False
        self.due = time.monotonic() + idle_s  # the deadline of what it waits for (``what``), or 0
        self.what = "idle"
        self.out = bytearray()  # an answer not yet taken by the client
        self.busy = False  # a request at the intake: nothing more is read until it is answered (answers in order)
        self.closing = False  # close once the answers are out (the client asked, or closed its side)
        self.handoff = False  # hand over to a request thread once the answers are out
        self.events = 0  # what the selector watches for it
        self.asked_close = False  # the request being read asked for Connection: close
        self.since = 0.0  # when the request read whole began to wait for admission (``what`` is "admit")
        self.entered = False  # its body is arriving and holds one of the requests in flight (service.enter)


class ConnectionLoop:
    """The connections of ``server`` (see the module docstring). :meth:`run` on one thread; :meth:`stop` once.

    A connection is read only while it has no request at the intake and no answer waiting to be taken: one request
    at a time, and a client that sends without reading is held back by TCP, not by this process's memory."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.service = server.service
        self._sel: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._bodies: list[tuple[bytes, bool, Answer]] = []  # the turn's exports, read whole: the next group
        self._answers: list[tuple[_Conn, bytes, bool]] = []  # the group's answers, as its requests were read
        self._conns: set[_Conn] = set()
        self._waiting: list[_Conn] = []  # requests read whole that wait for admission (the engine is behind)
        self._unsettled: set[_Conn] = set()  # connections whose watch may have changed this turn (see _settle)
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._date = (0, "")
        self._ok_answers: tuple[int, dict[bool, bytes]] = (0, {})  # (the second, {close: the answer}), see _ok
        self._shapes: dict[bytes, tuple[bool, bool]] = {}  # a head without its length -> its framing, see _fast
        self._next_scan = 0.0  # when the deadlines are next looked at
        # what a read receives, before it joins its connection's buffer: one buffer for every read (recv() made a
        # bytes object of READ_BYTES each time and cut it down, 380 MB a second of allocations under saturated
        # load, in and out of glibc's heaps: their pages faulted in again after each trim)
        self._received = bytearray(READ_BYTES)

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        listener = self.server.socket
        listener.setblocking(False)
        self._sel.register(listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stop.is_set():
                for key, mask in self._sel.select(ADMIT_POLL_S if self._waiting else TICK_S):
                    if key.data is None:
                        self._accept(listener)
                    elif key.data == "wake":
                        self._woken()
                    else:
                        self._event(key.data, mask)
                self._admit_waiting()
                self._serve_bodies()
                self._settle()
                self._deadlines()
        finally:
            self._serve_bodies()  # the turn broke off (a bug): each body still gets its answer, its leave() is in it
            for _ in self._waiting:  # (their connections are closed below, unanswered, as at any stop)
                self.service.leave()
            self._waiting.clear()
            for conn in list(self._conns):
                self._close(conn)
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()
            self._stopped.set()

    def stop(self) -> None:
        """Stop polling and close the connections the loop holds (those handed to request threads are theirs)."""
        self._stop.set()
        self._wake()

    def join(self, timeout: float) -> None:
        self._stopped.wait(timeout)

    def _event(self, conn: _Conn, mask: int) -> None:
        """One connection's readiness; whatever goes wrong with it closes that connection only."""
        try:
            if mask & selectors.EVENT_WRITE and conn in self._conns:
                self._flush(conn)
            if mask & selectors.EVENT_READ and conn in self._conns:
                self._read(conn)
        except Exception:
            log.exception("connection from %s failed", conn.addr[0])
            self._close(conn)

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(64):
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, a connection reset before accept: the next one
                log.warning("accept failed: %s", exc)
                return
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # reset already
                sock.close()
                continue
            conn = _Conn(sock, addr, self.service.options.header_deadline_s)
            self._conns.add(conn)
            self._watch(conn)

    def _watch(self, conn: _Conn) -> None:
        """Have the selector watch what ``conn`` waits for, as of the end of this turn (:meth:`_settle`)."""
        self._unsettled.add(conn)

    def _settle(self) -> None:
        """Tell the selector what each connection touched this turn waits for now. Once a turn, not at each change:
        a request read makes its connection busy and its answer, written in the same turn, idle again, and telling
        the selector each time was two ``epoll_ctl`` calls a request, each letting the GIL go (under load another
        thread takes it, and this one waits to win it back)."""
        unsettled, self._unsettled = self._unsettled, set()
        for conn in unsettled:
            try:
                self._watch_now(conn)
            except Exception:  # (as in _event: what goes wrong with one connection closes that one only)
                log.exception("connection from %s failed", conn.addr[0])
                self._close(conn)

    def _watch_now(self, conn: _Conn) -> None:
        """Have the selector watch what ``conn`` waits for now: room for its answer, else its next request."""
        assert self._sel is not None
        self._unsettled.discard(conn)
        want = 0
        if conn in self._conns:
            if conn.out:
                want = selectors.EVENT_WRITE
            elif not (conn.busy or conn.closing or conn.handoff):
                want = selectors.EVENT_READ
        if want == conn.events:
            return
        if not want:
            self._sel.unregister(conn.sock)
        elif not conn.events:
            self._sel.register(conn.sock, want, conn)
        else:
            self._sel.modify(conn.sock, want, conn)
        conn.events = want

    def _read(self, conn: _Conn) -> None:
        try:
            n = conn.sock.recv_into(self._received)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            n = 0
        if not n:  # the client closed (or reset) its side
            if conn.head_end >= 0 or (conn.buf and conn.what != "idle"):
                log.info("client %s went away mid-request", conn.addr[0])
            self._close(conn)
            return
        if conn.what == "idle":
            conn.what, conn.due = "headers", time.monotonic() + self.service.options.header_deadline_s
        with memoryview(self._received) as view, view[:n] as data:
            conn.buf += data
        self._advance(conn)

    def _advance(self, conn: _Conn) -> None:
        """Take the connection's next request as far as its bytes go."""
        while conn in self._conns and not (conn.busy or conn.closing or conn.handoff or conn.out):
            if conn.head_end < 0:
                end = conn.buf.find(b"\r\n\r\n")
                if end < 0:
                    if not _plain(conn.buf) or len(conn.buf) > HEAD_BYTES:
                        self._hand_over(conn)
                    return
                if not self._fast(conn, end + 4):
                    self._hand_over(conn)
                    return
            if len(conn.buf) < conn.head_end + conn.length:
                # a body that does not come whole holds a request's place while it arrives, as a request thread's
                # does: the bodies this process holds are bounded by the requests in flight, not the connections
                if not conn.entered:
                    conn.entered = self._enter(conn)  # (refused: its body is not read, the connection closes)
                return
            self._submit(conn)
        self._watch(conn)

    def _fast(self, conn: _Conn, head_end: int) -> bool:
        """Whether the request whose head ends at ``head_end`` takes the fast path (then its framing is set).

        Clients send the same head again and again but for its length (a client's exports differ in size), and
        reading the headers was a tenth of the loop's time under saturated load: the framing of a head is kept by
        its *shape*, the head with its ``Content-Length`` digits cut out, once :meth:`_shaped` has shown that the
        length read from it is those digits whatever they are. Admission is :meth:`_submit`'s, once the body is read
        (as a request thread reads it before it asks)."""
        head = bytes(conn.buf[:head_end])
        found = _LENGTH.search(head)
        if found is None:  # (an unusual head: read every time)
            framing = self._framing(head)
        else:
            shape = head[: found.start(1)] + head[found.end(1) :]
            kept = self._shapes.get(shape)
            if kept is None:
                kept = self._shaped(head, found)
                if kept is not None:
                    if len(self._shapes) >= SHAPES_KEPT:
                        self._shapes.clear()
                    self._shapes[shape] = kept
            length = int(found.group(1))
            framing = None if kept is None or length > self.service.options.max_body_bytes else (length, *kept)
        if framing is None:
            return False
        conn.head_end, (conn.length, conn.gzipped, conn.asked_close) = head_end, framing
        conn.what, conn.due = "body", time.monotonic() + self.service.options.body_deadline_s
        return True

    def _shaped(self, head: bytes, found: re.Match[bytes]) -> tuple[bool, bool] | None:
        """``(gzipped, Connection: close)`` of every head of this one's shape (its length's digits any others), or
        None if this head does not show it: not the fast path, or its length not read from the digits ``found``
        (checked by reading the head again with other digits there: a length read from any other line would not
        follow them)."""
        framing = self._framing(head)
        if framing is None or framing[0] != int(found.group(1)):
            return None
        other = b"2" if found.group(1) == b"1" else b"1"
        again = self._framing(head[: found.start(1)] + other + head[found.end(1) :])
        return framing[1:] if again == (int(other), *framing[1:]) else None

    def _framing(self, head: bytes) -> tuple[int, bool, bool] | None:
        """A request head's framing on the fast path, ``(Content-Length, gzipped, Connection: close)``, or None if
        it does not take it. A function of the head's bytes alone (the body limit and the token are the process's),
        which is what lets :meth:`_fast` keep it by shape."""
        line_end = head.find(b"\r\n")
        if not _plain(head) or head[:line_end] != b"POST /v1/traces HTTP/1.1":
            return None
        try:
            headers = read_headers(io.BytesIO(head[line_end + 2 :]))
        except RequestRefused:
            return None
        lengths = headers.get_all("Content-Length") or []
        if "Transfer-Encoding" in headers or "Expect" in headers or len(lengths) != 1:
            return None
        text = lengths[0].strip()
        ctype = (headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        encoding = (headers.get("Content-Encoding") or "identity").strip().lower()
        connection = headers.get("Connection", "").lower()
        if (
            not 0 < len(text) <= 18
            or not (text.isascii() and text.isdigit())
            or int(text) > self.service.options.max_body_bytes
            or ctype not in PROTOBUF_TYPES
            or encoding not in ("identity", "gzip", "x-gzip")
            or connection not in ("", "keep-alive", "close")
            or not self.server.token_ok(headers)
        ):
            return None
        return int(text), encoding != "identity", connection == "close"

    def _submit(self, conn: _Conn) -> None:
        """Hand the complete request to the intake once it is admitted; while the engine is behind, the request
        waits here (:meth:`_admit_waiting` asks again each :data:`ADMIT_POLL_S`), its connection read no further,
        and is refused as a request thread refuses it: 429 after ``admit_wait_s``, 503 at once."""
        if conn.what != "admit":
            if conn.entered:  # (entered as its body began to arrive: the place passes on to the request)
                conn.entered = False
            elif not self._enter(conn):
                return
            conn.busy, conn.due, conn.what, conn.since = True, 0.0, "admit", time.monotonic()
        try:
            admitted = self.service.try_admit(conn.since)
        except IngestRefused as r:
            self.service.leave()
            self._refuse(conn, r, close=conn.asked_close)
            return
        if not admitted:
            self._waiting.append(conn)
            return
        # one copy of the body (a slice of the buffer and then bytes() were two); the views go before the cut
        with memoryview(conn.buf) as view, view[conn.head_end : conn.head_end + conn.length] as part:
            body = bytes(part)
        close, t0 = self._take(conn), conn.since
        conn.what = "intake"
        self._bodies.append((body, conn.gzipped, lambda result, error: self._done(conn, t0, close, result, error)))

    def _enter(self, conn: _Conn) -> bool:
        """Take one of the requests in flight for ``conn``'s request; False when refused (then answered, and the
        connection closes)."""
        try:
            self.service.enter()
        except IngestRefused as r:
            self._refuse(conn, r, close=True)
            return False
        return True

    def _take(self, conn: _Conn) -> bool:
        """Cut the request read whole off ``conn``'s buffer; returns whether it asked for Connection: close."""
        del conn.buf[: conn.head_end + conn.length]
        close, conn.asked_close, conn.head_end = conn.asked_close, False, -1
        return close

    def _refuse(self, conn: _Conn, refused: IngestRefused, *, close: bool) -> None:
        """Answer the request on ``conn`` (read whole, or its body still arriving) with ``refused`` (then close the
        connection if ``close``)."""
        self._take(conn)
        conn.busy, conn.closing, conn.what = False, conn.closing or close, "answer"
        conn.out += self._answer(refused.status, status_answer(refused.status, refused.message, False),
                                 {"Retry-After": str(refused.retry_after)}, close)  # fmt: skip
        self.server.metrics.count_request("/v1/traces", refused.status)
        self._flush(conn)

    def _admit_waiting(self) -> None:
        """Ask again for the requests waiting for admission (in the order they came)."""
        if not self._waiting:  # (every turn: nothing made for none)
            return
        waiting, self._waiting = self._waiting, []
        for conn in waiting:
            if conn in self._conns:
                self._submit(conn)
                self._advance(conn)  # refused: a request sent behind it
            else:  # (closed meanwhile: the slot it held goes)
                self.service.leave()

    def _done(self, conn: _Conn, t0: float, close: bool, result: Decoded | None, error: BaseException | None) -> None:
        """The answer of ``conn``'s request, once its group is logged (b"" and close: none, the connection is cut)."""
        metrics = self.server.metrics
        try:
            headers: dict[str, str] = {}
            if isinstance(error, RequestRefused):
                status, body = error.status, status_answer(error.status, error.message, False)
                if isinstance(error, IngestRefused):
                    headers["Retry-After"] = str(error.retry_after)
            elif error is None and result is not None and not (result.rejects or result.warnings):
                self._answers.append((conn, self._ok(close), close))  # the common answer, made once a second
                metrics.count_request("/v1/traces", 200)
                return
            elif error is None and result is not None:
                status, body = 200, export_answer(result.rejects, False, result.warnings)
            else:  # a bug: the connection is cut, as a request thread's would be
                log.error("request from %s failed", conn.addr[0], exc_info=error)
                self._answers.append((conn, b"", True))
                return
            self._answers.append((conn, self._answer(status, body, headers, close), close))
            metrics.count_request("/v1/traces", status)
        finally:
            self.service.leave()
            metrics.ingest_latency.observe(time.monotonic() - t0)

    def _wake(self) -> None:
        if self._wake_w is None:
            return
        try:
            self._wake_w.send(b"\0")
        except OSError:  # a wake-up is pending already (or the loop is gone)
            pass

    def _woken(self) -> None:
        if self._wake_r is None:
            return
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _serve_bodies(self) -> None:
        """Decode and log the turn's exports as one group, and write their answers (answering reads on: a request
        sent behind an answer joins the next group)."""
        while self._bodies:
            bodies, self._bodies = self._bodies, []
            self.service.ingest_now(bodies)
            self._write_answers()

    def _write_answers(self) -> None:
        """Write the group's answers, each connection's then read on (a request sent behind its answer)."""
        answers, self._answers = self._answers, []
        for conn, data, close in answers:
            if conn not in self._conns:  # closed meanwhile (its deadline, a stop): the answer has nowhere to go
                continue
            try:
                conn.busy = False
                if not data:  # no answer: cut
                    self._close(conn)
                    continue
                conn.closing = conn.closing or close
                conn.out += data
                self._flush(conn)
                self._advance(conn)  # a request sent behind it
            except Exception:
                log.exception("connection from %s failed", conn.addr[0])
                self._close(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out) if conn.out else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return
        del conn.out[:sent]
        if conn.out:  # the client is slow to take it: wait for room, within the answer deadline
            if conn.what != "answer":
                conn.what, conn.due = "answer", time.monotonic() + self.service.options.answer_deadline_s
            self._watch(conn)
            return
        if conn.closing and not conn.busy:
            self._close(conn)
            return
        if conn.handoff:
            conn.handoff = False
            self._hand_over(conn)
            return
        if conn.what in ("answer", "intake"):
            conn.what = "headers" if conn.buf else "idle"
            conn.due = time.monotonic() + self.service.options.header_deadline_s
        self._watch(conn)

    def _deadlines(self) -> None:
        now = time.monotonic()
        if now < self._next_scan:  # (a scan is per connection: not per event under load)
            return
        self._next_scan = now + TICK_S
        for conn in [c for c in self._conns if c.due and c.due <= now and not c.busy]:
            if conn.what == "idle":
                log.debug("closed an idle keep-alive connection from %s", conn.addr[0])
            elif conn.what == "answer":
                log.info("cut a connection from %s: its answer was not taken", conn.addr[0])
            else:
                log.info("cut a connection from %s: its %s took too long", conn.addr[0], conn.what)
            self._close(conn)

    def _hand_over(self, conn: _Conn) -> None:
        """The connection, and what was read of it, to a request thread for good (once its answers are out)."""
        if conn.out:
            conn.handoff = True
            self._watch(conn)
            return
        self._conns.discard(conn)
        self._watch_now(conn)  # (no longer ours: unwatched before another thread has it)
        try:
            conn.sock.setblocking(True)
            self.server.hand_over(conn.sock, conn.addr, bytes(conn.buf))
        except Exception:  # no thread to be had (the process is at its limit): this connection is cut
            log.exception("could not hand the connection from %s to a request thread", conn.addr[0])
            conn.sock.close()

    def _close(self, conn: _Conn) -> None:
        if conn not in self._conns:
            return
        if conn.entered:  # cut (or gone) while its body arrived
            conn.entered = False
            self.service.leave()
        self._conns.discard(conn)
        self._watch_now(conn)  # (unwatched before its descriptor is closed)
        try:
            conn.sock.shutdown(socket.SHUT_WR)  # as socketserver closes: what was sent is not cut by a reset
        except OSError:
            pass
        conn.sock.close()

    # ------------------------------------------------------------------ answers

    def _ok(self, close: bool) -> bytes:
        """The answer to an export accepted whole (an empty ExportTraceServiceResponse), as :meth:`_answer` writes
        it: the same bytes for every such request within a second (its Date)."""
        now = int(time.time())
        if self._ok_answers[0] != now:
            self._ok_answers = (now, {})
        made = self._ok_answers[1]
        answer = made.get(close)
        if answer is None:
            answer = made[close] = self._answer(200, export_answer((), False), {}, close)
        return answer

    def _answer(self, status: int, body: bytes, headers: dict[str, str], close: bool) -> bytes:
        """An answer as a request thread writes it (http.Handler._send)."""
        now = int(time.time())
        if self._date[0] != now:
            self._date = (now, email.utils.formatdate(now, usegmt=True))
        lines = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            f"Server: {self.server.version}",
            f"Date: {self._date[1]}",
            f"Content-Type: {content_type(False)}",
            f"Content-Length: {len(body)}",
            "Cache-Control: no-store",
            *(f"{k}: {v}" for k, v in headers.items()),
        ]
        if close:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _plain(head: bytes | bytearray) -> bool:
    """Whether a request's head (so far) could be the fast path's: it begins ``POST `` and every line ends in CRLF.
    A bare LF or CR ends lines for the header parser too; such a head goes to a request thread, which reads it by
    the standard library's rules (read here, the head would end elsewhere than there)."""
    start = bytes(head[:5])
    if b"POST "[: len(start)] != start:
        return False
    crlf = head.count(b"\r\n")
    return head.count(b"\n") == crlf and head.count(b"\r") - head.endswith(b"\r") == crlf
