"""The connection loop: OTLP protobuf exports answered on one thread exactly as a request thread answers them,
requests sent back to back answered in order, a connection handed to a request thread with the bytes already
read, and the deadlines of the request threads kept (a trickling body cut)."""

from __future__ import annotations

import logging
import socket
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from server_testlib import running_server

from drainpipe.server.service import ServiceOptions
from serve_kill import otlp_export


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
    with running_server() as srv, _connect(srv) as sock:
        for body, status in ((good, 200), (bad, 400)):
            sock.sendall(_post(body))
            (fast,) = _answers(sock, 1)
            sock.sendall(_chunked(body))  # the same request through a request thread (this connection is theirs now)
            (thread,) = _answers(sock, 1)
            assert fast[0] == thread[0] == status and fast[2] == thread[2]
            same = {"content-type", "content-length", "cache-control", "server"}
            assert {k: fast[1][k] for k in same} == {k: thread[1][k] for k in same}
            assert set(fast[1]) == set(thread[1])
            if status == 200:
                assert ExportTraceServiceResponse.FromString(fast[2]) == ExportTraceServiceResponse()
            sock.close()
            sock = _connect(srv)
        sock.close()


def test_exports_sent_back_to_back_are_answered_in_order_and_a_get_after_them_too() -> None:
    with running_server() as srv, _connect(srv) as sock:
        bodies = [otlp_export(f"svc-{i}", 5 + i) for i in range(3)]
        sock.sendall(b"".join(_post(b) for b in bodies) + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answers = _answers(sock, 4)
        assert [a[0] for a in answers] == [200, 200, 200, 200]
    stats = srv.service.summary()
    assert stats["accepted"] == sum(5 + i for i in range(3))


def test_an_export_with_connection_close_is_answered_then_closed() -> None:
    with running_server() as srv, _connect(srv) as sock:
        sock.sendall(_post(otlp_export("svc-a", 3), "Connection: close"))
        ((status, headers, _),) = _answers(sock, 1)
        assert status == 200 and headers["connection"] == "close"
        assert sock.recv(10) == b""


def test_a_trickling_export_body_is_cut_at_its_deadline(caplog) -> None:
    caplog.set_level(logging.INFO, logger="drainpipe")
    opts = ServiceOptions(header_deadline_s=1.0, body_deadline_s=1.0, sample_interval_s=0.25, top_refresh_s=0.5)
    with running_server(options=opts) as srv, _connect(srv) as sock:
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
    assert closed and took < 3, f"the body trickle was not cut ({took:.1f} s)"
    assert any("its body took too long" in r.getMessage() for r in caplog.records)
