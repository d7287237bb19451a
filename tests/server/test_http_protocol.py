"""The HTTP face speaks the protocol strictly and in one voice: conflicting Content-Length is refused (RFC 9112
6.3), every error body is JSON (the standard library's own errors too), a client that goes away is one log line,
and a bad --port is one line."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time

import pytest
from server_testlib import events, running_server

from testlib import wait_until


def _raw(url: str, data: bytes, timeout: float = 10) -> bytes:
    host, port = url.split("//")[1].rstrip("/").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _split(response: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


@pytest.fixture(scope="module")
def server():
    with running_server() as srv:
        yield srv


def test_conflicting_content_length_is_400_and_the_rest_is_not_read_as_a_request(server) -> None:
    body = json.dumps(events(2)).encode()
    smuggled = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    request = (
        f"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nContent-Length: {len(body) + len(smuggled)}\r\n\r\n"
    ).encode()
    response = _raw(server.url, request + body + smuggled)
    status, headers, rest = _split(response)
    assert status == 400 and headers["Content-Type"] == "application/json"
    assert json.loads(rest.split(b"HTTP/1.1")[0])["error"] == "conflicting Content-Length headers"
    assert response.count(b"HTTP/1.1 ") == 1  # the connection closed: nothing answered the smuggled request


def test_the_same_content_length_twice_is_one_length(server) -> None:
    body = json.dumps(events(3)).encode()
    request = (
        f"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    status, _, rest = _split(_raw(server.url, request + body))
    assert status == 200 and json.loads(rest)["accepted"] == 3


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (b"BREW /coffee HTTP/1.1\r\nHost: x\r\n\r\n", 501),  # a method the server does not know
        (b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n", 505),  # a protocol version it does not speak
        (b"GET / HTTP/1.1\r\n" + b"X-Long: " + b"a" * 70_000 + b"\r\n\r\n", 431),  # a header line too long
        (b"this is not http\r\n\r\n", 400),
        (b"GET / HTTP/\xb9.1\r\nHost: x\r\n\r\n", 400),  # a digit to str.isdigit, not to int()
        (b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(100)) + b"\r\n", 431),  # too many
        # a blank before a colon ends the headers, as it always did: no framing header after it is read
        (
            b"POST /v1/events HTTP/1.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Transfer-Encoding : chunked\r\nContent-Length: 3\r\n\r\n[1]",
            411,
        ),  # fmt: skip
    ],
)
def test_errors_of_the_standard_library_server_are_json_too(server, request_bytes: bytes, status: int) -> None:
    got, headers, body = _split(_raw(server.url, request_bytes))
    assert got == status and headers["Content-Type"] == "application/json"
    assert json.loads(body)["status"] == status and json.loads(body)["error"]


def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    sock.close()


@pytest.mark.parametrize("when", ["mid-body", "between-requests"])
def test_a_client_that_goes_away_is_one_log_line(server, caplog, capfd, when: str) -> None:
    caplog.set_level(logging.DEBUG, logger="drainpipe")
    capfd.readouterr()
    host, port = server.url.split("//")[1].rsplit(":", 1)
    body = json.dumps(events(2)).encode()
    for _ in range(5):
        sock = socket.create_connection((host, int(port)), timeout=10)
        if when == "mid-body":
            sock.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100000\r\n\r\n[{")  # fmt: skip
        else:  # a keep-alive client that resets while the server waits for its next request
            sock.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        _reset(sock)
    wait_until(lambda: sum("went away" in r.getMessage() for r in caplog.records) >= 5, timeout=10)
    assert not [r for r in caplog.records if r.exc_info], "a client going away logged a traceback"
    assert "Traceback" not in capfd.readouterr().err  # socketserver's default handler prints one to stderr
    assert sum("went away" in r.getMessage() for r in caplog.records) == 5


def test_a_port_out_of_range_is_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "drainpipe.cli", "serve", "--port", "70000"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "a port is 0-65535, got 70000" in done.stderr


def test_slow_clients_without_the_token_hold_no_slot_of_authorized_ones() -> None:
    """More unauthenticated clients than there are request slots, each sending its body at a trickle: every
    authorized post still gets through (the token is checked before admission, and a bad one's body is not read)."""
    from server_testlib import post_events

    from drainpipe.server.service import ServiceOptions

    opts = ServiceOptions(max_concurrent_requests=2, sample_interval_s=0.25, top_refresh_s=0.5)
    with running_server(token="s3cret", options=opts) as srv:
        host, port = srv.url.split("//")[1].rsplit(":", 1)
        slow = []
        for _ in range(6):
            sock = socket.create_connection((host, int(port)))
            sock.sendall(
                b"POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
                b"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n["
            )
            slow.append(sock)
        try:
            for sock in slow:
                sock.sendall(b" ")  # still sending, slowly
            statuses = [post_events(srv.url, events(20, seed=i), token="s3cret")[0] for i in range(10)]
        finally:
            for sock in slow:
                sock.close()
        assert statuses == [200] * 10


def test_shutdown_is_bounded_and_cuts_slow_requests_with_one_log_line(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="drainpipe")
    with running_server(shutdown_grace_s=1.0) as srv:
        host, port = srv.url.split("//")[1].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        sock.sendall(
            b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n["
        )  # a slow sender: the rest never comes
        time.sleep(0.3)
        t0 = time.monotonic()
        srv.shutdown_all()
        took = time.monotonic() - t0
        sock.close()
    assert took < 5, f"shutdown took {took:.1f} s with one slow client"
    cut = [r for r in caplog.records if "cut 1 request(s) still in flight" in r.getMessage()]
    assert len(cut) == 1 and not cut[0].exc_info


@pytest.mark.parametrize("stage", ["headers", "body"])
def test_a_trickling_client_is_cut_at_its_deadline(stage: str, caplog) -> None:
    """Slowloris: a byte every 0.2 s keeps the idle timeout from ever firing; the deadline ends it anyway."""
    from drainpipe.server.service import ServiceOptions

    caplog.set_level(logging.INFO, logger="drainpipe")
    opts = ServiceOptions(header_deadline_s=1.0, body_deadline_s=1.0, sample_interval_s=0.25, top_refresh_s=0.5)
    with running_server(options=opts) as srv:
        host, port = srv.url.split("//")[1].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=10)
        start = b"POST /v1/events HTTP/1.1\r\n"
        if stage == "body":
            start += b"Host: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n["
        sock.sendall(start)
        t0 = time.monotonic()
        closed = False
        while time.monotonic() - t0 < 6:
            try:
                sock.sendall(b"X" if stage == "headers" else b" ")
                time.sleep(0.2)
            except OSError:
                closed = True
                break
        took = time.monotonic() - t0
        sock.close()
    assert closed and took < 3, f"the {stage} trickle was not cut ({took:.1f} s)"
    assert any(f"its {stage} took too long" in r.getMessage() for r in caplog.records)


def test_a_client_that_takes_none_of_its_answers_is_cut(caplog) -> None:
    """The sockets have no timeout of their own: a client that pipelines requests and reads none of the answers
    would hold its thread in a blocked write for good. The kernel's send timeout cuts it; read afterwards, the
    connection ends early (without the cut, reading would unblock the server and every answer would come)."""
    from drainpipe.server.service import ServiceOptions

    caplog.set_level(logging.INFO, logger="drainpipe")
    opts = ServiceOptions(answer_deadline_s=0.5, sample_interval_s=0.25, top_refresh_s=0.5)
    asked = 400
    with running_server(options=opts) as srv:
        host, port = srv.url.split("//")[1].rsplit(":", 1)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(10)
        sock.connect((host, int(port)))
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * asked)  # the dashboard page, over and over
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any("was not taken" in r.getMessage() for r in caplog.records):
            time.sleep(0.05)
        data = bytearray()
        try:
            while chunk := sock.recv(1 << 16):
                data += chunk
        except ConnectionResetError:  # closed with requests unread: a reset, after what was sent before it
            pass
        sock.close()
        with socket.create_connection((host, int(port)), timeout=10) as other:
            other.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert other.recv(64).startswith(b"HTTP/1.1 200")
    answered = data.count(b"HTTP/1.1 200")
    assert 0 < answered < asked, answered
    assert any("its answer was not taken" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("case", ["unknown path", "unsupported type", "idle keep-alive"])
def test_a_connection_that_stops_sending_is_closed_at_its_deadline(case: str, caplog) -> None:
    """No socket timeout: a body that never comes (for a path that has none to give, or a type refused with 415) is
    cut at the body deadline, and an idle keep-alive connection is closed at the header deadline, quietly."""
    from drainpipe.server.service import ServiceOptions

    caplog.set_level(logging.DEBUG, logger="drainpipe")
    opts = ServiceOptions(header_deadline_s=1.0, body_deadline_s=1.0, sample_interval_s=0.25, top_refresh_s=0.5)
    with running_server(options=opts) as srv:
        host, port = srv.url.split("//")[1].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=10)
        if case == "idle keep-alive":
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        else:
            path, ctype = ("/nope", "application/json") if case == "unknown path" else ("/v1/events", "text/plain")
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n"
                         "Content-Length: 1000\r\n\r\n".encode())  # fmt: skip
        t0 = time.monotonic()
        data = b""
        try:
            while chunk := sock.recv(4096):
                data += chunk
        except ConnectionResetError:
            pass
        took = time.monotonic() - t0
        sock.close()
    assert took < 5, f"not closed ({took:.1f} s)"
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    if case == "idle keep-alive":
        assert (logging.DEBUG, f"closed an idle keep-alive connection from {host}") in messages
        assert not any("took too long" in m for _, m in messages)
    else:
        assert (logging.INFO, f"cut a connection from {host}: its body took too long") in messages


def test_a_deadline_must_be_positive() -> None:
    """0 would mean "never" to the kernel's send timeout; a negative one is no deadline at all."""
    from drainpipe.errors import UsageError
    from drainpipe.server.service import ServiceOptions

    for name in ("header_deadline_s", "body_deadline_s", "answer_deadline_s"):
        for value in (0, -1.0):
            with pytest.raises(UsageError, match=f"ServiceOptions.{name} must be > 0"):
                ServiceOptions(**{name: value})
