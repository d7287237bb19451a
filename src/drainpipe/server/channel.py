"""The server's helper processes (the parsers) and the request/reply channel to each: small messages
on a socket, payloads in a shared memory file.

Why not a ``multiprocessing`` pipe: a request's body and the parsed batch are 100 KB or more each way, which a pipe
or socket carries in several reads and writes, and every one of them lets go of the GIL and waits to get it back.
With two dozen request threads and the engine wanting the GIL, each of those waits was most of a millisecond: a
parser was held ~7.8 ms per OTLP request for ~1.75 ms of parsing. Here a payload is copied into the shared file
(a ``memcpy``, GIL held) and the socket carries one frame each way, read in one call when it fits the read
buffer (it does, but for a long list of rejects): two waits for the GIL per round trip instead of five or more.

Both ends use the same two calls and take turns, never at the same time: one sends (the payload written at the
file's start), then the other receives, then answers the same way. The file grows to fit a payload, on either
side, and the frame says the file's size so that the other end maps it again; the server's end shrinks it back to
:data:`BASE_BYTES` after a large payload. A payload comes out as a copy, so no view of the map outlives a call and
the map can be resized. Not thread-safe: one request at a time per channel.

:class:`Helper` is a process serving requests over a channel, one at a time; :class:`HelperPool` keeps a number of
them and replaces one that dies or gets stuck. A pool is told what its processes do with a request.
"""

from __future__ import annotations

import logging
import mmap
import multiprocessing
import os
import pickle
import queue
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ..errors import ChannelClosed

__all__ = ["BASE_BYTES", "START_TIMEOUT_S", "Channel", "ChannelClosed", "Helper"]

Buffer = bytes | bytearray | memoryview  # a payload (an Arrow buffer as ``memoryview(buffer)``)

#: the shared file's size when idle; a map only costs memory for the pages a payload touched
BASE_BYTES = 4 << 20
_FRAME = struct.Struct("<QQQ")  # header length, payload length, the shared file's size
_READ = 64 << 10


def _memory_file() -> int:
    """A file descriptor of an anonymous file in memory (Linux ``memfd``; elsewhere an unlinked temporary file)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("drainpipe-helper", os.MFD_CLOEXEC)
    f = tempfile.TemporaryFile()
    fd = os.dup(f.fileno())
    f.close()
    return fd


class Channel:
    """One end of a channel: ``sock`` (a connected stream socket) and ``fd`` (the shared file, owned by this end)."""

    def __init__(self, sock: socket.socket, fd: int) -> None:
        self.sock = sock
        self._fd = fd
        size = os.fstat(fd).st_size
        if size == 0:
            os.ftruncate(fd, BASE_BYTES)
            size = BASE_BYTES
        self._map = mmap.mmap(fd, size)
        self._buffer = bytearray(_READ)

    @classmethod
    def pair(cls) -> tuple[Channel, socket.socket]:
        """The parent's end and the socket for the child's end: start the child with that socket, close it here,
        then :meth:`hand_over` the shared file, which the child takes with :meth:`accept`."""
        mine, theirs = socket.socketpair()
        return cls(mine, _memory_file()), theirs

    def hand_over(self) -> None:
        """Send the shared file's descriptor to the other end (once, after it started)."""
        socket.send_fds(self.sock, [b"m"], [self._fd])

    @classmethod
    def accept(cls, sock: socket.socket) -> Channel:
        """The child's end: receives the shared file sent by :meth:`hand_over`. Raises :class:`ChannelClosed`."""
        _, fds, _, _ = socket.recv_fds(sock, 1, 1)
        if not fds:
            raise ChannelClosed("the channel closed before its memory file arrived")
        return cls(sock, fds[0])

    def send(self, header: bytes, payload: Buffer = b"", *, shrink: bool = False) -> None:
        """Write ``payload`` to the shared file and send ``header`` with its length; blocks only if the socket's
        buffer is full. ``shrink``: first give back what a large earlier payload grew the file to. Raises
        :class:`ChannelClosed` (OSError when the other end is gone)."""
        payload = memoryview(payload)
        n = payload.nbytes
        size = len(self._map)
        if n > size:
            self._resize(max(n, 2 * size))
        elif shrink and size > BASE_BYTES and n <= BASE_BYTES:
            self._resize(BASE_BYTES)
        if n:
            self._map[:n] = payload
        try:
            self.sock.sendall(_FRAME.pack(len(header), n, len(self._map)) + header)
        except OSError as exc:
            raise ChannelClosed(str(exc)) from None

    def recv(self) -> tuple[bytes, bytes]:
        """Block for the other end's next message: ``(header, payload)``, the payload copied out of the shared
        file. Raises :class:`ChannelClosed` if the other end is gone."""
        buf, got = self._buffer, 0
        view = memoryview(buf)
        try:
            while got < _FRAME.size:
                got += self._read_into(view[got:])
            head, n, size = _FRAME.unpack_from(buf)
            end = _FRAME.size + head
            if end > len(buf):  # a long header (many rejects): read the rest of it
                view.release()
                buf = self._buffer = bytearray(buf[:got]) + bytearray(end - got)
                view = memoryview(buf)
            while got < end:
                got += self._read_into(view[got:end])
            header = bytes(view[_FRAME.size : end])
        finally:
            view.release()
        if len(buf) > _READ:
            self._buffer = bytearray(_READ)
        if size != len(self._map):
            self._resize(size)
        return header, self._map[:n]

    def _read_into(self, view: memoryview) -> int:
        try:
            got = self.sock.recv_into(view)
        except OSError as exc:
            raise ChannelClosed(str(exc)) from None
        if not got:
            raise ChannelClosed("the other end closed the channel")
        return got

    def _resize(self, size: int) -> None:
        self._map.resize(size)  # the file too: the other end maps it again when the next frame says so

    def close(self) -> None:
        """Close this end (the socket, the map and this end's descriptor of the file)."""
        self.sock.close()
        self._map.close()
        os.close(self._fd)


# ------------------------------------------------------------------------------------------------ helper processes


#: what a helper process sends once it is up, and how long its first call waits for that (a spawned process imports
#: numpy, pyarrow and drainpipe: seconds on a loaded machine)
_READY = b"up"
START_TIMEOUT_S = 60.0


def _serve(sock: socket.socket, parent: int, handle: Callable[[Any, bytes], tuple[Any, Buffer]]) -> None:
    """A helper process's loop: answer each request (``handle(request, payload) -> (answer, payload)``) until told
    to stop (None) or the channel closes."""
    from ..processes import die_with, hide_pandas

    die_with(parent)
    hide_pandas()  # (a helper is drainpipe's own process: pyarrow would import pandas at its first conversion)
    try:
        channel = Channel.accept(sock)
        channel.send(_READY)  # (its modules, the handle's among them, are imported: it can answer in time)
    except (ChannelClosed, OSError):
        return
    while True:
        try:
            header, payload = channel.recv()
        except ChannelClosed:
            return
        request = pickle.loads(header)
        if request is None:
            return
        answer, out = handle(request, payload)
        try:
            channel.send(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL), memoryview(out))
        except ChannelClosed:
            return


class Helper:
    """A helper process that answers one request at a time over a :class:`Channel`: ``handle(request, payload) ->
    (answer, payload)`` runs in the process (a picklable callable: a module-level function or an instance of a
    module-level class), requests and answers are pickled, payloads go through the shared memory.

    Not thread-safe: one :meth:`call` at a time. ``timeout_s``: longest wait for an answer (None: no limit), from
    when the process is up: the first call first waits for the process to say it is (at most
    :data:`START_TIMEOUT_S`), so that a process spawned on a busy machine, importing its modules for seconds, is
    not taken for a stuck one. ``context``: how the process starts (a pool spawns them, :class:`HelperPool`)."""

    def __init__(self, context: Any, handle: Callable[[Any, bytes], tuple[Any, Buffer]], *, name: str,
                 timeout_s: float | None = None) -> None:  # fmt: skip
        self.channel, theirs = Channel.pair()
        self.process = context.Process(target=_serve, args=(theirs, os.getpid(), handle), name=name, daemon=True)
        self.process.start()
        theirs.close()
        self.channel.hand_over()
        self.timeout_s = timeout_s
        self._up = False  # whether the process said it is up (read at the first call)

    def wait_up(self) -> None:
        """Wait (at most :data:`START_TIMEOUT_S`) for the process to say it is up, if it has not yet. Raises
        :class:`ChannelClosed` if it died or did not."""
        if self._up:
            return
        self.channel.sock.settimeout(START_TIMEOUT_S)
        header, _ = self.channel.recv()
        if header != _READY:
            raise ChannelClosed(f"{self.process.name} process {self.process.pid} did not start as a helper")
        self._up = True
        self.channel.sock.settimeout(self.timeout_s)  # a wait past it raises ChannelClosed

    def call(self, request: Any, payload: Buffer = b"") -> tuple[Any, bytes]:
        """Send one request, wait for the answer: ``(answer, payload)``. Raises :class:`ChannelClosed` if the
        process died, did not come up within :data:`START_TIMEOUT_S` or did not answer within the timeout."""
        self.wait_up()
        self.channel.send(pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL), payload, shrink=True)
        header, out = self.channel.recv()
        return pickle.loads(header), out

    def close(self, kill: bool = False) -> None:
        """Stop the process: told to (a forked helper holds copies of the sockets of the helpers forked before it,
        so closing ours need be no end of file for it), given 5 s, then killed; ``kill``: at once (it is stuck)."""
        if kill:
            self.process.kill()
        else:
            try:
                self.channel.send(pickle.dumps(None))
            except ChannelClosed:  # it died already
                pass
        self.channel.close()
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


log = logging.getLogger("drainpipe.server")


class HelperPool:
    """``size`` helper processes that run ``handle``, each serving one request at a time (:class:`Helper`), started
    when first needed: a server whose traffic never needs them (OTLP protobuf, decoded on the intake thread) never
    pays their memory.

    Thread-safe. :meth:`call` takes a free helper, blocking while all are busy. Until the first helper is up (the
    first call, or :meth:`start`, starts them, in the background: a spawned process imports its modules for a second
    or more), a call raises :class:`ChannelClosed` at once, and the caller does the work itself. A helper that dies
    (killed, out of memory) is replaced before the call raises :class:`ChannelClosed`, so again the caller does that
    request's work: a crash costs time, never a request. :attr:`restarts` counts replacements, each once the new
    process is in place. A helper that cannot be started (out of processes or descriptors) is logged and left out;
    with none left, every call raises :class:`ChannelClosed` at once.

    The processes are spawned (the process runs other threads by then: forking one would copy locks some other
    thread holds) by one long-lived thread of the pool: the kernel kills a child whose parent *thread* exits
    (``PR_SET_PDEATHSIG``), and a caller's thread (a request's) may end at any time. ``close`` once."""

    def __init__(self, handle: Callable[[Any, bytes], tuple[Any, Buffer]], size: int, *, name: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._new = lambda: Helper(context, handle, name=name)
        self.name = name
        self.size = size
        self.restarts = 0
        self.helpers: list[Helper] = []  # guarded by _lock; each one up (it said so)
        self._lock = threading.Lock()
        self._started = False  # guarded by _lock
        self._up = threading.Event()  # a helper came up: ``_free`` holds helpers, or None once none is left
        # the free helpers; None once every helper is gone: a caller that takes it puts it back and does its work
        self._free: queue.SimpleQueue[Helper | None] = queue.SimpleQueue()
        self._spawns: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._spawner = threading.Thread(target=self._spawn_loop, name=f"{name}-spawner", daemon=True)
        self._closed = False  # guarded by _lock

    @property
    def processes(self) -> list[Any]:
        """The processes of the helpers that are up now (``multiprocessing.Process``)."""
        with self._lock:
            return [h.process for h in self.helpers]

    def start(self) -> None:
        """Start the helpers in the background (once; later calls, and calls after :meth:`close`, do nothing)."""
        with self._lock:
            if self._started or self._closed:
                return
            self._started = True
            self._spawner.start()
            for _ in range(self.size):
                self._spawns.put(self._add)

    def wait_up(self, timeout_s: float) -> bool:
        """Start the helpers and wait until every one is up (tests, benchmarks); False if that took too long."""
        self.start()
        deadline = time.monotonic() + timeout_s
        while len(self.processes) < self.size:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def call(self, request: Any, payload: Buffer = b"") -> tuple[Any, bytes]:
        """One request to a free helper: ``(answer, payload)``. Raises :class:`ChannelClosed` if no helper is up
        (they are starting, or none could be), if the helper died or was stuck (it is replaced first), or the pool
        is closed."""
        if not self._up.is_set():
            self.start()
            raise ChannelClosed(f"no {self.name} process is up yet")
        helper = self._free.get()
        if helper is None:  # no helper is left
            self._free.put(None)
            raise ChannelClosed(f"no {self.name} process could be started")
        try:
            answer = helper.call(request, payload)
        except ChannelClosed:
            back = helper if self._closed else self._replace(helper)
            if back is not None:
                self._free.put(back)
            raise
        except BaseException:
            self._free.put(helper)
            raise
        self._free.put(helper)
        return answer

    def _add(self) -> None:
        """On the spawner thread: one more helper, in the pool once it is up."""
        if self._closed:
            return
        try:
            helper = self._started_helper()
        except Exception as exc:  # it did not come up: the pool serves with fewer (the callers do their work)
            log.error("a %s process could not be started: %s", self.name, exc)
            return
        with self._lock:
            closed = self._closed
            if not closed:
                self.helpers.append(helper)
        if closed:
            helper.close(kill=True)
            return
        self._free.put(helper)
        self._up.set()

    def _started_helper(self) -> Helper:
        helper = self._new()
        try:
            helper.wait_up()
        except BaseException:
            helper.close(kill=True)
            raise
        return helper

    def _replace(self, dead: Helper) -> Helper | None:
        """A new helper in ``dead``'s place, or None when none could be started (``dead`` is dropped then: with
        no helper left, the pool hands out None, and every call does its work itself)."""
        stuck = dead.process.is_alive()
        if stuck:
            log.error("%s process %d did not answer; killing it", self.name, dead.process.pid)
        dead.close(kill=stuck)
        log.error("%s process %d died (exit %s); starting another", self.name, dead.process.pid, dead.process.exitcode)
        future: Future[Helper] = Future()

        def spawn() -> None:
            try:
                future.set_result(self._started_helper())
            except BaseException as exc:  # e.g. out of processes: the caller's error says so
                future.set_exception(exc)

        with self._lock:  # (after close the spawner stops: nothing would run the spawn)
            if not self._closed:
                self._spawns.put(spawn)
            else:
                future.set_exception(ChannelClosed("the pool is closed"))
        try:
            fresh = future.result()
        except Exception as exc:
            log.error("no %s process took the place of process %d: %s", self.name, dead.process.pid, exc)
            with self._lock:
                self.helpers.remove(dead)
                none_left = not self.helpers
            if none_left:  # the callers waiting for a helper, and all later ones, get None: they do their work
                self._free.put(None)
            return None
        with self._lock:
            self.helpers[self.helpers.index(dead)] = fresh
            self.restarts += 1
        return fresh

    def _spawn_loop(self) -> None:
        while (work := self._spawns.get()) is not None:
            try:
                work()
            except BaseException:  # (each work reports its own failure; this thread must live: see the docstring)
                log.exception("%s: starting a process failed", self.name)

    def close(self) -> None:
        """Stop every helper (each told to, given 5 s, then killed), then the spawner: the helpers are its children,
        which the kernel kills when it ends (``PR_SET_PDEATHSIG``), so they are stopped first."""
        if self._closed:
            return
        with self._lock:  # (a helper coming up from now on is closed by the spawner)
            self._closed = True
            helpers = list(self.helpers)
        for helper in helpers:
            helper.close()
        self._spawns.put(None)
