"""The connection loop: OTLP protobuf exports answered on one thread exactly as a request thread answers them,
requests sent back to back answered in order, a connection handed to a request thread with the bytes already
read, and the deadlines of the request threads kept (a trickling body cut)."""

from __future__ import annotations

import gzip
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from server_testlib import events, ndjson, running_server

from drainpipe.server.service import ServiceOptions
from serve_kill import otlp_export


@contextmanager
def _server(**kw) -> Iterator:
    """A running server whose hand-overs to request threads are counted (``srv.handed``), and which says when the
    loop has first asked for admission (``srv.head_taken``: a fast request's head is read and admitted)."""
    with running_server(**kw) as srv:
        handed: list[bytes] = []
        hand_over, admissible = srv.hand_over, srv.service.admissible
        head_taken = threading.Event()

        def counted(sock, address, read: bytes) -> None:
            handed.append(read)
            hand_over(sock, address, read)

        def admitted() -> bool:
            answer = admissible()
            head_taken.set()
            return answer

        srv.hand_over, srv.service.admissible = counted, admitted
        srv.handed, srv.head_taken = handed, head_taken
        yield srv


def _connect(srv) -> socket.socket:
    host, port = srv.url.split("//")[1].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


OTLP = ("/v1/traces", "application/x-protobuf")


def _post(body: bytes, *extra: str, route: tuple[str, str] = OTLP) -> bytes:
    head = [f"POST {route[0]} HTTP/1.1", "Host: x", f"Content-Type: {route[1]}", f"Content-Length: {len(body)}",
            *extra]  # fmt: skip
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _chunked(body: bytes, *extra: str, route: tuple[str, str] = OTLP) -> bytes:
    """The same request with chunked framing: a request the loop hands to a request thread."""
    head = "\r\n".join([f"POST {route[0]} HTTP/1.1", "Host: x", f"Content-Type: {route[1]}", *extra,
                         "Transfer-Encoding: chunked"])  # fmt: skip
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


def test_exports_sent_back_to_back_are_answered_in_order_and_a_get_after_them_too() -> None:
    with _server() as srv, _connect(srv) as sock:
        bodies = [otlp_export(f"svc-{i}", 5 + i) for i in range(3)]
        sock.sendall(b"".join(_post(b) for b in bodies) + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answers = _answers(sock, 4)
        assert [a[0] for a in answers] == [200, 200, 200, 200]
        assert srv.handed == [b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"]  # the exports were the loop's
    stats = srv.service.summary()
    assert stats["accepted"] == sum(5 + i for i in range(3))


def test_many_connections_posting_at_once_are_each_answered_without_a_lost_wake_up() -> None:
    """The intake wakes the loop once for the answers queued together (a flag says a byte is on its way). Eight
    connections posting back to back race the intake's answers against the loop's reading of the wake socket: a
    byte read with the flag left set would leave every later answer waiting for good (seen: a hang within some
    hundreds of exports)."""
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


def test_admission_lost_while_the_body_came_is_answered_by_a_request_thread() -> None:
    with _server() as srv, _connect(srv) as sock:
        request = _post(otlp_export("svc-a", 4))
        sock.sendall(request[:-10])
        assert srv.head_taken.wait(10)  # the head is read and admitted; then the service stops admitting
        srv.service.drain(0.0)
        sock.sendall(request[-10:])
        ((status, headers, _),) = _answers(sock, 1)
        assert status == 503 and "retry-after" in headers
        assert len(srv.handed) == 1 and srv.handed[0] == request
    assert srv.service.summary()["accepted"] == 0


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


def _event_bodies() -> list[tuple[str, tuple[str, str], bytes, tuple[str, ...], int]]:
    """(what, route, body, extra headers, status) of /v1/events requests: each form, rejects, gzip, and errors."""
    good = events(30, seed=5)
    mixed = [*good[:10], {"service": "svc-x"}, "not an object", *good[10:20]]
    lines = ndjson(good[:10]) + b"{broken\n" + ndjson(good[10:20])
    array, nd = ("/v1/events", "application/json"), ("/v1/events", "application/x-ndjson")
    zipped = ("Content-Encoding: gzip",)
    return [
        ("an array", array, json.dumps(good).encode(), (), 200),
        ("an array with rejects", array, json.dumps(mixed).encode(), (), 200),
        ("NDJSON with a bad line", nd, lines, (), 200),
        ("gzipped NDJSON", nd, gzip.compress(ndjson(good)), zipped, 200),
        ("a gzip body that is not gzip", nd, b"not gzip at all", zipped, 400),
        ("a body that is not JSON", array, b"[{,]", (), 400),
    ]


def test_an_events_body_is_answered_as_a_request_thread_answers_it() -> None:
    """Each /v1/events request the loop serves gets the answer a request thread gives the same request (status,
    headers, body byte for byte); the accepted events are counted once each."""
    accepted = 0
    with _server() as srv:
        for what, route, body, extra, status in _event_bodies():
            with _connect(srv) as sock:
                sock.sendall(_post(body, *extra, route=route))
                (fast,) = _answers(sock, 1)
                assert srv.handed == [], f"{what}: handed over"
                sock.sendall(_chunked(body, *extra, route=route))
                (thread,) = _answers(sock, 1)
                assert len(srv.handed) == 1 and b"chunked" in srv.handed.pop()
            assert fast[0] == thread[0] == status, what
            assert fast[2] == thread[2], what
            assert fast[1]["content-type"] == thread[1]["content-type"] == "application/json", what
            assert set(fast[1]) == set(thread[1]), what
            if status == 200:
                accepted += 2 * json.loads(fast[2])["accepted"]
        assert srv.service.drain(10)
    assert srv.service.summary()["accepted"] == accepted


def test_events_posted_at_once_through_parser_processes_are_each_counted_once() -> None:
    """With parser processes, the loop hands JSON bodies to them through the parsers' callers and never waits:
    many connections posting at once are each answered, every event counted once, and gets and exports on other
    connections are served meanwhile."""
    from drainpipe.server.bodies import INLINE_BYTES, BodyDecoder

    decoder = BodyDecoder(2)
    assert decoder.wait_up(60)
    batches = [events(400, seed=i) for i in range(24)]
    bodies = [ndjson(b) for b in batches]
    assert all(len(b) >= INLINE_BYTES for b in bodies)  # (each goes to a parser)
    with _server(decoder=decoder) as srv:
        socks = [_connect(srv) for _ in bodies]
        try:
            for sock, body in zip(socks, bodies):
                sock.sendall(_post(body, route=("/v1/events", "application/x-ndjson")) * 2)
            with _connect(srv) as other:
                other.sendall(_post(otlp_export("svc-o", 7)))
                assert _answers(other, 1)[0][0] == 200
            for sock in socks:
                answers = _answers(sock, 2)
                assert [a[0] for a in answers] == [200, 200]
                assert [json.loads(a[2])["accepted"] for a in answers] == [400, 400]
        finally:
            for sock in socks:
                sock.close()
        assert srv.handed == []
        assert srv.service.drain(10)
    assert srv.service.summary()["accepted"] == 2 * 400 * len(bodies) + 7


def test_a_shutdown_waits_for_an_events_body_the_loop_is_reading(caplog) -> None:
    """A body still arriving when the server shuts down is a request in flight, as a request thread's is: the
    shutdown waits for it (within its grace) and it is answered, 503 with Retry-After (nothing was accepted: the
    client sends it again), not cut."""
    from testlib import wait_until

    caplog.set_level(logging.WARNING, logger="drainpipe")
    request = _post(ndjson(events(50, seed=9)), route=("/v1/events", "application/x-ndjson"))
    with _server(shutdown_grace_s=20.0) as srv, _connect(srv) as sock:
        sock.sendall(request[:-20])
        assert srv.head_taken.wait(10)
        closing = threading.Thread(target=srv.shutdown_all)
        closing.start()
        wait_until(lambda: srv.service.draining, what="the shutdown draining")
        assert closing.is_alive()  # waiting for the body in flight
        sock.sendall(request[-20:])
        ((status, headers, _),) = _answers(sock, 1)
        closing.join(30)
        assert not closing.is_alive()
        assert status == 503 and "retry-after" in headers
    assert srv.service.summary()["accepted"] == 0
    assert not [r for r in caplog.records if "cut" in r.getMessage()]


def test_requests_to_both_routes_pipelined_on_one_connection_are_answered_in_order_in_their_own_forms() -> None:
    """An events body, an export and an events array back to back on one connection: three answers in order, each
    in its route's form, each counted under its own route (an answer is built from its own request, not from the
    connection, which may be reading the next one by then)."""
    events_route = ("/v1/events", "application/x-ndjson")
    with _server() as srv, _connect(srv) as sock:
        counted = srv.metrics.count_request
        seen: list[tuple[str, int]] = []

        def counting(path: str, status: int) -> None:
            seen.append((path, status))
            counted(path, status)

        srv.metrics.count_request = counting
        sock.sendall(
            _post(ndjson(events(5, seed=1)), route=events_route)
            + _post(otlp_export("svc-p", 3))
            + _post(json.dumps(events(4, seed=2)).encode(), route=("/v1/events", "application/json"))
        )
        answers = _answers(sock, 3)
        assert [a[0] for a in answers] == [200, 200, 200]
        assert [a[1]["content-type"] for a in answers] == ["application/json", "application/x-protobuf",
                                                           "application/json"]  # fmt: skip
        assert [json.loads(answers[i][2])["accepted"] for i in (0, 2)] == [5, 4]
        assert srv.handed == []
        assert sorted(seen) == sorted([("/v1/events", 200), ("/v1/traces", 200), ("/v1/events", 200)])


def test_a_json_body_handed_in_after_the_service_closed_is_refused_not_raised() -> None:
    """``ingest_then`` never raises: a JSON body that comes after the parsers' callers are gone (a shutdown whose
    drain ran out of time) gets its answer, a 503, through ``then``."""
    from drainpipe.errors import IngestRefused
    from drainpipe.server.bodies import BodyDecoder

    with _server(decoder=BodyDecoder(1)) as srv:
        srv.service.close(5)
        got: list[tuple[object, BaseException | None]] = []
        body = ndjson(events(3, seed=4))
        srv.service.ingest_then(body, form="ndjson", gzipped=False, then=lambda r, e: got.append((r, e)))
        assert len(got) == 1 and got[0][0] is None
        assert isinstance(got[0][1], IngestRefused) and got[0][1].status == 503
