"""A request/reply channel between the server and one parser process: small messages on a socket, payloads in a
shared memory file.

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
the map can be resized. Not thread-safe: one request at a time per channel (:class:`BodyDecoder` keeps it so).
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import tempfile

__all__ = ["BASE_BYTES", "Channel", "ChannelClosed"]

#: the shared file's size when idle; a map only costs memory for the pages a payload touched
BASE_BYTES = 4 << 20
_FRAME = struct.Struct("<QQQ")  # header length, payload length, the shared file's size
_READ = 64 << 10


class ChannelClosed(EOFError):
    """The other end is gone (it exited, was killed, or closed the channel)."""


def _memory_file() -> int:
    """A file descriptor of an anonymous file in memory (Linux ``memfd``; elsewhere an unlinked temporary file)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("drainpipe-parser", os.MFD_CLOEXEC)
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

    def send(self, header: bytes, payload: bytes | memoryview = b"", *, shrink: bool = False) -> None:
        """Write ``payload`` to the shared file and send ``header`` with its length; blocks only if the socket's
        buffer is full. ``shrink``: first give back what a large earlier payload grew the file to. Raises
        :class:`ChannelClosed` (OSError when the other end is gone)."""
        n = len(payload)
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
