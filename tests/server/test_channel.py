"""The request/reply channel between the server and its helper processes: payloads of any size arrive whole, the
shared file grows for a large one and shrinks back, a long header arrives whole, and a peer that is gone is
:class:`ChannelClosed`, not a hang."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from drainpipe.errors import ChannelClosed
from drainpipe.server.channel import BASE_BYTES, Channel, Helper, HelperPool


def _pair() -> tuple[Channel, Channel]:
    # both ends in this process: they take turns, and a small frame fits the socket's buffer
    mine, theirs = Channel.pair()
    mine.hand_over()
    return mine, Channel.accept(theirs)


def _size(channel: Channel) -> int:
    return os.fstat(channel._fd).st_size


def test_payloads_of_any_size_arrive_whole_and_the_file_shrinks_back() -> None:
    a, b = _pair()
    try:
        for n in (0, 1, 1000, BASE_BYTES, 3 * BASE_BYTES + 7):
            payload = os.urandom(n)
            a.send(b"q%d" % n, payload, shrink=True)
            header, got = b.recv()
            assert header == b"q%d" % n and got == payload
            reply = payload[::-1] + b"!" * (n // 2)  # the other end may need more room than the request took
            b.send(b"r", reply)
            assert a.recv() == (b"r", reply)
        assert _size(a) == _size(b) > 4 * BASE_BYTES  # grown by the answer's end, seen by this one
        a.send(b"small", b"x", shrink=True)
        assert _size(a) == BASE_BYTES
        assert b.recv() == (b"small", b"x")
    finally:
        a.close()
        b.close()


def test_a_header_longer_than_the_read_buffer_arrives_whole() -> None:
    a, b = _pair()
    try:
        header = os.urandom(300_000)  # e.g. the reasons of many rejected records; more than the socket buffers
        import threading

        sender = threading.Thread(target=a.send, args=(header, b"p"))
        sender.start()
        assert b.recv() == (header, b"p")
        sender.join()
        b.send(b"ok")
        assert a.recv() == (b"ok", b"")
    finally:
        a.close()
        b.close()


def test_a_peer_that_is_gone_is_channel_closed() -> None:
    a, b = _pair()
    b.close()
    with pytest.raises(ChannelClosed):
        a.recv()
    with pytest.raises(ChannelClosed):
        for _ in range(100):  # the first write may still be buffered
            a.send(b"x" * 100_000)
    a.close()


class _SlowToStart:
    """A helper's handle whose unpickling, in a spawned process, takes longer than the helper's answer timeout: a
    process that imports its modules for seconds on a loaded machine."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_slow_handle, ())

    def __call__(self, request: object, payload: bytes) -> tuple[object, bytes]:
        return ("echo", request), b""


def _slow_handle() -> _SlowToStart:
    time.sleep(1.5)
    return _SlowToStart()


def test_a_helper_slow_to_start_is_not_taken_for_a_stuck_one() -> None:
    """The answer timeout runs from when the process is up (it says so), not from its start: a replacement
    spawned under load was killed as stuck while it still imported its modules (a flaky test's race)."""
    helper = Helper(multiprocessing.get_context("spawn"), _SlowToStart(), name="slow-helper", timeout_s=1.0)
    try:
        assert helper.call(7) == (("echo", 7), b"")
        assert helper.call(8) == (("echo", 8), b"")
    finally:
        helper.close()


def _echo(request: object, payload: bytes) -> tuple[object, bytes]:
    return request, payload


def test_a_pool_whose_processes_cannot_start_answers_every_call_at_once_and_never_hangs(caplog) -> None:
    """Out of processes or descriptors, a helper cannot be started: it is logged, the pool's thread lives on, and a
    call raises ChannelClosed at once (the caller does its work itself), before and after the failure."""
    pool = HelperPool(_echo, 2, name="doomed")

    def fail() -> Helper:
        raise OSError(24, "Too many open files")

    pool._new = fail  # (the one way to make a spawn fail here)
    try:
        with pytest.raises(ChannelClosed):
            pool.call("x")  # starts them
        assert not pool.wait_up(0.5) and pool.processes == []
        for _ in range(3):
            with pytest.raises(ChannelClosed):
                pool.call("x")
        assert "could not be started" in caplog.text
    finally:
        pool.close()


def _converts(request: object, payload: bytes) -> tuple[object, bytes]:
    import sys

    import pyarrow as pa

    pa.scalar(0, pa.int64())  # (pyarrow's first conversion of a Python value imports pandas where it can)
    return "pandas" in sys.modules, b""


def test_a_helper_process_hides_pandas() -> None:
    """A helper is drainpipe's own process: pyarrow's first conversion of a Python value would import pandas there
    (48 MB of PSS a helper) only to ask whether the value is a pandas object."""
    helper = Helper(multiprocessing.get_context("spawn"), _converts, name="converting-helper", timeout_s=30.0)
    try:
        assert helper.call(1) == (False, b"")
    finally:
        helper.close()
