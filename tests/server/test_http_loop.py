"""The connection loop: OTLP protobuf exports answered on one thread exactly as a request thread answers them,
requests sent back to back answered in order, a connection handed to a request thread with the bytes already
read, and the deadlines of the request threads kept (a trickling body cut)."""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import selectors
import socket
import struct
import termios
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from server_testlib import running_server

from drainpipe.inputs import EventBatch
from drainpipe.server.service import ServiceOptions
from drainpipe.server.wal import MemoryLog
from serve_kill import otlp_export
from testlib import wait_until


@contextmanager
def _server(**kw) -> Iterator:
    """A running server whose hand-overs to request threads are counted (``srv.handed``), and which says when a
    request's token was first checked (``srv.head_taken``: the head of a fast request of a shape the loop has not
    seen is read, its body next)."""
    with running_server(**kw) as srv:
        handed: list[bytes] = []
        hand_over, token_ok = srv.hand_over, srv.token_ok
        head_taken = threading.Event()

        def counted(sock, address, read: bytes) -> None:
            handed.append(read)
            hand_over(sock, address, read)

        def asked(headers) -> bool:
            answer = token_ok(headers)
            head_taken.set()
            return answer

        srv.hand_over, srv.token_ok = counted, asked
        srv.handed, srv.head_taken = handed, head_taken
        yield srv


def _connect(srv) -> socket.socket:
    host, port = srv.url.split("//")[1].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _post(body: bytes, *extra: str) -> bytes:
    head = ["POST /v1/traces HTTP/1.1", "Host: x", "Content-Type: application/x-protobuf",
            f"Content-Length: {len(body)}", *extra]  # fmt: skip
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _chunked(body: bytes) -> bytes:
    """The same export with chunked framing: a request the loop hands to a request thread."""
    head = "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nTransfer-Encoding: chunked"
    return f"{head}\r\n\r\n{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


def _answers(sock: socket.socket, n: int) -> list[tuple[int, dict[str, str], bytes]]:
    """``n`` answers read off ``sock``: (status, headers, body)."""
    data, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in data:
            more = sock.recv(65536)
            assert more, f"the connection closed after {len(out)} answers"
            data += more
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        while len(data) < length:
            data += sock.recv(65536)
        out.append((int(lines[0].split()[1]), headers, data[:length]))
        data = data[length:]
    return out


def test_an_export_is_answered_as_a_request_thread_answers_it() -> None:
    good, bad = otlp_export("svc-a", 20), b"\x0a\x05trunc"  # (a resource_spans field cut short: malformed)
    with _server() as srv, _connect(srv) as sock:
        for body, status in ((good, 200), (bad, 400)):
            sock.sendall(_post(body))
            (fast,) = _answers(sock, 1)
            assert srv.handed == []  # answered by the loop

            sock.sendall(_chunked(body))  # the same request through a request thread (this connection is theirs now)
            (thread,) = _answers(sock, 1)
            assert fast[0] == thread[0] == status and fast[2] == thread[2]
            same = {"content-type", "content-length", "cache-control", "server"}
            assert {k: fast[1][k] for k in same} == {k: thread[1][k] for k in same}
            assert set(fast[1]) == set(thread[1])
            if status == 200:
                assert ExportTraceServiceResponse.FromString(fast[2]) == ExportTraceServiceResponse()
            assert len(srv.handed) == 1 and b"chunked" in srv.handed.pop()
            sock.close()
            sock = _connect(srv)
        sock.close()


def test_a_head_sent_again_is_framed_again_by_its_own_bytes() -> None:
    """The loop keeps the framing of the heads it has read (clients repeat theirs): a head with the token is the
    fast path each time, the same head with another token or another length is not taken for it (a wrong token is a
    request thread's 401; another length is framed by that length)."""
    short, long_ = otlp_export("svc-a", 5), otlp_export("svc-b", 40)
    with _server(token="s3cret") as srv, _connect(srv) as sock:
        for body in (short, short, long_, short, long_):
            sock.sendall(_post(body, "Authorization: Bearer s3cret"))
            ((status, _, answer),) = _answers(sock, 1)
            assert status == 200 and ExportTraceServiceResponse.FromString(answer) == ExportTraceServiceResponse()
        assert srv.handed == []
        sock.sendall(_post(short, "Authorization: Bearer wrong"))
        assert _answers(sock, 1)[0][0] == 401 and len(srv.handed) == 1
        with _connect(srv) as again:  # the good head once more, after the refused one
            again.sendall(_post(short, "Authorization: Bearer s3cret"))
            assert _answers(again, 1)[0][0] == 200 and len(srv.handed) == 1
    assert srv.service.summary()["accepted"] == 3 * 5 + 2 * 40 + 5


def test_a_head_whose_length_is_not_read_from_its_content_length_digits_is_not_kept_by_its_shape() -> None:
    """The loop keeps framings by the head without its ``Content-Length: <digits>`` line's digits, and only where the
    header parser reads the length from those digits. Here the parser reads an earlier ``content-length`` (a line
    without a colon ends the header section before the canonical line): each such head goes to a request thread,
    never framed by the digits the parser does not read."""
    body = otlp_export("svc-a", 3)
    head = ("POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            f"content-length: {len(body)}\r\nno header here\r\nContent-Length: {{}}\r\n\r\n")  # fmt: skip
    with _server() as srv:
        for digits in (len(body), len(body) + 7):
            with _connect(srv) as sock:
                sock.sendall(head.format(digits).encode() + body)
                assert _answers(sock, 1)[0][0] == 200
        assert len(srv.handed) == 2


def test_exports_sent_back_to_back_are_answered_in_order_and_a_get_after_them_too() -> None:
    with _server() as srv, _connect(srv) as sock:
        bodies = [otlp_export(f"svc-{i}", 5 + i) for i in range(3)]
        sock.sendall(b"".join(_post(b) for b in bodies) + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answers = _answers(sock, 4)
        assert [a[0] for a in answers] == [200, 200, 200, 200]
        assert srv.handed == [b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"]  # the exports were the loop's
    stats = srv.service.summary()
    assert stats["accepted"] == sum(5 + i for i in range(3))


class _CountingSelector(selectors.DefaultSelector):
    """The loop's selector, counting the changes of what it watches (each one an ``epoll_ctl``, letting the GIL go)."""

    changes = 0

    def register(self, fileobj, events, data=None):
        _CountingSelector.changes += 1
        return super().register(fileobj, events, data)

    def modify(self, fileobj, events, data=None):
        _CountingSelector.changes += 1
        return super().modify(fileobj, events, data)

    def unregister(self, fileobj):
        _CountingSelector.changes += 1
        return super().unregister(fileobj)


def test_a_keep_alive_connection_s_exports_do_not_change_what_the_selector_watches(monkeypatch) -> None:
    """A request read and answered in the same turn leaves its connection waiting for the next one, as before: the
    selector is told once a turn what changed, not twice a request (busy, then idle again)."""
    monkeypatch.setattr(selectors, "DefaultSelector", _CountingSelector)
    _CountingSelector.changes = 0
    with _server() as srv, _connect(srv) as sock:
        for i in range(20):  # one at a time: each read, logged and answered in a turn of its own
            sock.sendall(_post(otlp_export(f"svc-{i}", 2)))
            assert _answers(sock, 1)[0][0] == 200
        changes = _CountingSelector.changes
    assert changes <= 4, changes  # the listener, the wake socket, the connection once (two a request: 40)


def test_many_connections_posting_at_once_are_each_answered_and_each_export_counted_once() -> None:
    """Eight connections posting back to back: their exports go to the log in groups of whatever each turn of the
    loop read, and every one is answered 200 and counted once. (When the intake thread answered them, a wake-up
    lost between it and the loop left every later answer waiting for good: a hang within some hundreds.)"""
    body, rounds, connections = otlp_export("svc-race", 50), 150, 8
    with _server() as srv:
        failures: list[str] = []

        def client() -> None:
            try:
                with _connect(srv) as sock:
                    sock.settimeout(10)
                    for _ in range(rounds):
                        sock.sendall(_post(body))
                        ((status, _, _),) = _answers(sock, 1)
                        assert status == 200, status
            except Exception as exc:  # a timeout: an answer never came
                failures.append(repr(exc))

        threads = [threading.Thread(target=client) for _ in range(connections)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == [] and srv.handed == []
    assert srv.service.summary()["accepted"] == rounds * connections * 50


class _HeldLog(MemoryLog):
    """A log whose appends can be held (``gate``), recording each append's requests."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.entered = threading.Event(), threading.Event()
        self.gate.set()
        self.requests: list[int] = []

    def append(self, batch: EventBatch) -> int:
        self.entered.set()
        assert self.gate.wait(10)
        self.requests.append(batch.requests)
        return super().append(batch)


def _delivered(sock: socket.socket) -> bool:
    """Whether everything sent on ``sock`` has reached its peer (the send queue is empty: loopback acks on receipt)."""
    return struct.unpack("i", fcntl.ioctl(sock, termios.TIOCOUTQ, b"\0" * 4))[0] == 0


def test_exports_that_came_while_a_group_was_logged_are_the_next_group() -> None:
    """The loop logs on its own thread: while it waits for one group's append, the exports of other connections wait
    in their sockets, and the next turn reads them all and logs them as one record."""
    log = _HeldLog()
    log.gate.clear()
    with _server(log=log) as srv:
        socks = [_connect(srv) for _ in range(4)]
        try:
            socks[0].sendall(_post(otlp_export("svc-0", 3)))
            assert log.entered.wait(10)  # the loop is inside the first group's append
            for i, sock in enumerate(socks[1:], 1):
                sock.sendall(_post(otlp_export(f"svc-{i}", 3)))
            wait_until(
                lambda: all(_delivered(sock) for sock in socks), what="the three exports in the server's sockets"
            )
            log.gate.set()
            assert [_answers(sock, 1)[0][0] for sock in socks] == [200] * 4
        finally:
            for sock in socks:
                sock.close()
    assert log.requests == [3, 9]


def test_an_export_with_connection_close_is_answered_then_closed() -> None:
    with _server() as srv, _connect(srv) as sock:
        request = _post(otlp_export("svc-a", 3), "Connection: close")
        sock.sendall(request[:-10])  # the body's end comes later: the request is still read to its end
        assert srv.head_taken.wait(10)  # the head taken: the body's end comes in a later segment
        sock.sendall(request[-10:])
        ((status, headers, _),) = _answers(sock, 1)
        assert status == 200 and headers["connection"] == "close" and srv.handed == []
        assert sock.recv(10) == b""


def test_a_head_with_bare_line_feeds_is_read_as_a_request_thread_reads_it() -> None:
    """A bare LF ends a header line (and an empty one the head) for the request threads' parser: such a head is
    theirs, or the two would see different requests in the same bytes."""
    with _server() as srv, _connect(srv) as sock:
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\n"
                     b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # fmt: skip
        assert [a[0] for a in _answers(sock, 2)] == [200, 200]
        assert len(srv.handed) == 1


def test_a_request_the_loop_cannot_parse_is_a_request_thread_s_and_the_loop_serves_on() -> None:
    with _server() as srv:
        with _connect(srv) as sock:
            sock.sendall(_post(b"")[: -len(b"Content-Length: 0\r\n\r\n")] + b"Content-Length: " + b"9" * 5000
                         + b"\r\n\r\n")  # fmt: skip
            ((status, _, _),) = _answers(sock, 1)
        assert status in (400, 411, 413)
        with _connect(srv) as sock:
            sock.sendall(_post(otlp_export("svc-a", 2)))
            assert _answers(sock, 1)[0][0] == 200


def test_admission_lost_while_the_body_came_is_refused_by_the_loop_as_a_request_thread_refuses_it() -> None:
    """A body that began before the drain holds its request's place (as a request thread enters before it reads),
    and is refused at admission once read whole: 503, the connection kept (its body was read), as a thread does."""
    with _server() as srv, _connect(srv) as sock:
        request = _post(otlp_export("svc-a", 4))
        sock.sendall(request[:-10])
        assert srv.head_taken.wait(10)  # the head is read; then the service stops admitting
        wait_until(lambda: srv.service.in_flight == 1, 10)
        srv.service.drain(0.0)
        sock.sendall(request[-10:])
        ((status, headers, _),) = _answers(sock, 1)
        assert status == 503 and "retry-after" in headers and "connection" not in headers
        assert srv.handed == []
    assert srv.service.summary()["accepted"] == 0


def test_bodies_still_arriving_hold_places_so_the_loop_holds_no_more_of_them_than_requests_in_flight() -> None:
    """Each body that does not come whole holds one of ``max_concurrent_requests`` while it arrives (a request
    thread enters before it reads): past them a request is refused 429 and its connection closed, unread; a client
    gone mid-body gives its place back; a body completed is answered 200."""
    opts = ServiceOptions(max_concurrent_requests=2)
    with _server(options=opts) as srv:
        first, second, third = (_post(otlp_export(f"svc-{i}", 3)) for i in range(3))
        a, b = _connect(srv), _connect(srv)
        a.sendall(first[:-5])
        b.sendall(second[:-5])
        wait_until(lambda: srv.service.in_flight == 2, 10)  # two bodies arriving: both places taken
        with _connect(srv) as c:
            c.sendall(third[:-5])
            ((status, headers, _),) = _answers(c, 1)
            assert status == 429 and headers["connection"] == "close"
        b.close()  # gone mid-body: its place comes back
        wait_until(lambda: srv.service.in_flight == 1, 10)
        with _connect(srv) as c:
            c.sendall(third)
            assert _answers(c, 1)[0][0] == 200
        a.sendall(first[-5:])
        assert _answers(a, 1)[0][0] == 200
        a.close()
        wait_until(lambda: srv.service.in_flight == 0, 10)
        assert srv.handed == []
    assert srv.service.summary()["accepted"] == 6


def test_an_export_waits_in_the_loop_while_the_engine_is_behind_and_is_answered_once_it_catches_up() -> None:
    """The engine behind (429's condition): an export read whole waits for admission in the loop, its connection
    not handed to a request thread; admitted once the engine catches up within ``admit_wait_s``, refused 429 with
    Retry-After after it (the connection kept: its body was read), and the next export on it is the loop's again."""
    opts = ServiceOptions(admit_wait_s=0.3, sample_interval_s=0.25)
    with _server(options=opts) as srv, _connect(srv) as sock:
        svc = srv.service
        keeping_up = svc.options
        looked: list[float] = []
        try_admit = svc.try_admit

        def counted(since: float) -> bool:
            looked.append(since)
            return try_admit(since)

        svc.try_admit = counted
        svc.options = dataclasses.replace(keeping_up, max_lag_bytes=-1)  # every lag is too much: "behind"
        sock.sendall(_post(otlp_export("svc-a", 3)))
        ((status, headers, _),) = _answers(sock, 1)  # waited admit_wait_s, then refused
        assert status == 429 and headers["retry-after"] == "1" and "connection" not in headers
        assert len(looked) > 2 and len(set(looked)) == 1  # asked again and again for the same request

        looked.clear()  # (a long wait now: a busy machine may take its time to see the engine catch up)
        svc.options = dataclasses.replace(keeping_up, max_lag_bytes=-1, admit_wait_s=60.0)
        sock.sendall(_post(otlp_export("svc-b", 5)))
        wait_until(lambda: len(looked) > 2, 10)  # it waits ...
        svc.options = keeping_up  # ... and the engine catches up
        ((status, _, answer),) = _answers(sock, 1)
        assert status == 200 and ExportTraceServiceResponse.FromString(answer) == ExportTraceServiceResponse()
        sock.sendall(_post(otlp_export("svc-c", 2)))
        assert _answers(sock, 1)[0][0] == 200
        assert srv.handed == []
    summary = svc.summary()
    assert summary["accepted"] == 7 and summary["refused_429"] == 1


def test_a_trickling_export_body_is_cut_at_its_deadline(caplog) -> None:
    caplog.set_level(logging.INFO, logger="drainpipe")
    opts = ServiceOptions(header_deadline_s=1.0, body_deadline_s=1.0, sample_interval_s=0.25, top_refresh_s=0.5)
    with _server(options=opts) as srv, _connect(srv) as sock:
        sock.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            b"Content-Length: 5000\r\n\r\n"
        )
        t0, closed = time.monotonic(), False
        while time.monotonic() - t0 < 6:
            try:
                sock.sendall(b" ")
                time.sleep(0.2)
            except OSError:
                closed = True
                break
        took = time.monotonic() - t0
        assert srv.handed == []  # cut by the loop
    assert closed and took < 4, f"the body trickle was not cut ({took:.1f} s)"
    assert any("its body took too long" in r.getMessage() for r in caplog.records)


def test_a_refusal_for_good_is_the_loop_s_and_the_connection_serves_on_once_it_is_over() -> None:
    """503 (here: a store write failed) is answered by the loop once the body is read, as a request thread answers
    it (the connection kept), and the connection's next export, once the service admits again, is the loop's: a
    refusal never moves a connection off the fast path."""
    with _server() as srv, _connect(srv) as sock:
        srv.service.feeder.failed = "the store refused a write"
        sock.sendall(_post(otlp_export("svc-a", 3)))
        ((status, headers, body),) = _answers(sock, 1)
        assert status == 503 and "retry-after" in headers and "connection" not in headers
        assert b"the store refused a write" in body
        srv.service.feeder.failed = ""
        sock.sendall(_post(otlp_export("svc-b", 4)))
        assert _answers(sock, 1)[0][0] == 200
        assert srv.handed == []
    summary = srv.service.summary()
    assert summary["accepted"] == 4 and summary["refused_503"] == 1
