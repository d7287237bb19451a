"""The write-ahead log of ``drainpipe serve``: validated event batches, on disk before a request is answered.

A log is a sequence of records, each one validated event batch, at positions that only grow: a record's
position is the byte offset of its end in the log, counted from the log's birth (Kafka's offsets, in bytes). The
store records, in the same transaction as the states the records brought, the position it has applied (Flink's
checkpoint: input position and state committed atomically), so after any crash the server resumes exactly there.

Two kinds, one interface (``append``, ``reader``, ``wait``, ``release``):

* :class:`WriteAheadLog`, on disk. Segment files ``<base position>.wal`` (20 digits) of about ``segment_bytes``.
  A segment of format 2 (written since the fifty-fourth session) starts with an 8-byte magic and its base position
  (u64), and holds records ``<length u32><crc32 u32><position u64><payload>``, ``position`` where the record
  starts; format 1 (read as before, never written) has the magic alone and records without the position. The
  payload is an Arrow IPC message of an :data:`~drainpipe.inputs.EVENT_SCHEMA` batch (one with exit rows is
  prefixed with ``DPX1`` and its request row count: an IPC message starts with 0xFFFFFFFF). ``append`` returns once
  the record is written *and* fsynced; concurrent appends share one fsync (group commit: the first caller to get
  the flush lock writes and syncs everything queued so far, the others find their record already done). On open,
  every record's CRC is checked; a torn tail (a crash mid-write) or a damaged record is truncated away, counted
  and logged, never fatal. A write that fails (disk full) is truncated back, so the log never holds a partial
  record, and raises :class:`LogFull`.

  A segment the store has applied everything of (``release``) is kept as a spare, up to :data:`SPARES` of them
  (the rest are deleted), and the next segment is a spare overwritten, not a new file: an ``fdatasync`` of
  blocks already written has no metadata to journal (a 150 KB record: 201 us and 75 us of system CPU against 623
  us and 216 us appended to a growing file). Its old records are still there after the new ones; each names its
  position, and the first whose position is not the one expected is the segment's end, not damage.
* :class:`MemoryLog`, for ``--durability none``: the same positions and interface, batches kept in memory. Nothing
  survives the process.

Both keep at most ``max_bytes`` not yet released; beyond, ``append`` raises :class:`LogFull` (the server answers
503 with Retry-After). Thread-safety: ``append`` from any number of threads; one reader per reader object;
``release`` from the thread that commits.
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import itertools
import logging
import os
import struct
import threading
import uuid
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from .. import native
from ..errors import DrainpipeError, LogFull
from ..inputs import EventBatch

__all__ = ["DEFAULT_MAX_BYTES", "EventLog", "LogFull", "LogReader", "MemoryLog", "Repair", "WriteAheadLog"]

log = logging.getLogger("drainpipe.wal")

MAGIC = b"DPWAL\x00\x00\x01"  # segment header of format 1 (read, not written)
HEADER = struct.Struct("<II")  # a format 1 record's header: payload length, CRC-32 of the payload
MAGIC2 = b"DPWAL\x00\x00\x02"  # format 2: the magic, then the segment's base position
SEGMENT2 = struct.Struct("<8sQ")
HEADER2 = struct.Struct("<IIQ")  # a format 2 record's header: payload length, CRC-32 of the payload, its position
MAX_RECORD = 1 << 30
SUFFIX = ".wal"
SPARE_SUFFIX = ".spare"  # a released segment kept to be overwritten as a later one
#: released segments kept as spares (each about ``segment_bytes`` on disk)
SPARES = 2
ID_FILE = "log.id"
DEFAULT_MAX_BYTES = 4 << 30  # 4 GiB: at about 60 bytes an event, some 70 million events (minutes at full load)
DEFAULT_SEGMENT_BYTES = 64 << 20


@dataclass(frozen=True)
class Repair:
    """What opening a log found damaged and cut away."""

    records: int = 0  # records dropped (a torn last record, or a damaged one and what followed it in its segment)
    bytes: int = 0


class LogReader(Protocol):
    def read(self, max_records: int) -> list[tuple[int, EventBatch]]:
        """Up to ``max_records`` (end position, batch) pairs available now, in order; [] when caught up."""
        ...

    def close(self) -> None: ...


class EventLog(Protocol):
    """What the server needs of a log (see the module docstring)."""

    key: str  # names this log in the store's progress rows
    location: str  # where it lives, for messages and progress rows
    durable: bool
    max_bytes: int

    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def size(self) -> int: ...
    def append(self, *batches: EventBatch) -> int: ...
    def reader(self, position: int) -> LogReader: ...
    def wait(self, position: int, timeout: float) -> bool: ...
    def release(self, position: int) -> None: ...
    def renew(self) -> None: ...
    def close(self) -> None: ...


def _crc(data: bytes | memoryview, value: int = 0) -> int:
    """The CRC-32 of a record's payload (``value``: of the bytes before ``data``, for a payload in parts): zlib's, by
    carry-less multiplication where the CPU has it (the ``crc32`` native tier: 2.6 GB/s -> 11 GB/s here; every
    record is checked when written and when read back)."""
    fast = native.crc32
    return fast.crc32(data, value) if fast is not None else zlib.crc32(data, value)


#: buffers one ``pwritev`` takes at most (Linux's IOV_MAX)
_IOV_MAX = 1024


def _write_at(fd: int, parts: list[bytes | memoryview], offset: int) -> None:
    """Write ``parts`` one after the other at ``offset``, whole: gathered by ``pwritev`` from where they are (joined
    first, a group's records were copied once more, 50 MB a second under a saturated load)."""
    views = [memoryview(p).cast("B") for p in parts]
    i = 0
    while i < len(views):
        n = os.pwritev(fd, views[i : i + _IOV_MAX], offset)
        if n <= 0:  # (a regular file takes something or fails: not a loop without end)
            raise OSError(errno.EIO, "write-ahead log: a write took nothing")
        offset += n
        while n:  # what the kernel took, off the front
            if n >= len(views[i]):
                n -= len(views[i])
                i += 1
            else:
                views[i], n = views[i][n:], 0


class _Ticket:
    __slots__ = ("parts", "length", "crc", "end", "error")

    def __init__(self, parts: tuple[bytes | memoryview, ...]) -> None:
        self.parts = parts  # the payload, in the parts it was encoded in (written by pwritev as they are)
        self.length = sum(len(p) for p in parts)
        crc = 0
        for part in parts:
            crc = _crc(part, crc)
        self.crc = crc
        self.end = 0
        self.error: BaseException | None = None

    @property
    def size(self) -> int:
        """The bytes (and positions) the record takes in the log, its header included."""
        return HEADER2.size + self.length


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteAheadLog:
    """A durable event log in ``directory`` (created if missing). See the module docstring."""

    durable = True

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    ) -> None:
        self.dir = Path(directory)
        self.location = str(self.dir)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DrainpipeError(
                f"cannot create the write-ahead log directory {str(self.dir)!r}: {exc.strerror}"
            ) from None
        self._lock_fd = self._lock_directory()
        self._lock = threading.Lock()  # queue, positions, segment list
        self._flush_lock = threading.Lock()  # one writer at a time (the group-commit leader)
        self._grown = threading.Condition(self._lock)
        self._queue: list[_Ticket] = []
        self._queued = 0
        self._bases: list[int] = []  # each segment's first position
        self._ends: list[int] = []  # each segment's end position
        self._v2: list[bool] = []  # each segment's format: 2, or 1 (read only)
        self._spares: list[Path] = []  # released segments to overwrite (this process's: see _open_segments)
        self._broken = ""  # why no write may be made any more (a failed write that could not be cut back)
        self._fd = -1
        self._released = 0  # the store has everything up to here
        self._closed = False
        try:
            self.key = "wal:" + self._identity()
            self.repair = self._open_segments()
            end = self._ends[-1] if self._ends else 0
            if self._bases and not self._v2[-1] and self._ends[-1] == self._bases[-1]:
                self._path(self._bases.pop()).unlink()  # an empty segment of format 1: the next one takes its base
                self._ends.pop()
                self._v2.pop()
            if not self._bases or not self._v2[-1]:  # records are written in format 2 only
                self._new_segment(end)
            else:
                self._fd = os.open(self._path(self._bases[-1]), os.O_WRONLY)
        except OSError as exc:
            os.close(self._lock_fd)
            raise DrainpipeError(
                f"cannot open the write-ahead log in {str(self.dir)!r}: {exc.strerror or exc}"
            ) from None

    # ------------------------------------------------------------------ opening

    def _lock_directory(self) -> int:
        """One process per log: a second server on the same directory would interleave its records."""
        try:
            fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DrainpipeError(f"cannot open the write-ahead log in {str(self.dir)!r}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DrainpipeError(
                f"the write-ahead log {str(self.dir)!r} is in use by another process (pid {owner}); give each server "
                "its own --wal DIR"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _identity(self) -> str:
        path = self.dir / ID_FILE
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            pass
        ident = uuid.uuid4().hex
        tmp = path.with_suffix(".tmp")
        tmp.write_text(ident + "\n")
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.dir)
        return ident

    def renew(self) -> None:
        """Start a new log under a new identity (the store has applied more than this log holds: it is not the
        log the store was fed from). Everything in it is deleted."""
        with self._flush_lock, self._lock:
            os.close(self._fd)
            for base in self._bases:
                self._path(base).unlink(missing_ok=True)
            (self.dir / ID_FILE).unlink(missing_ok=True)
            for spare in self._spares:  # positions start over: an old record could stand where a new one is expected
                spare.unlink(missing_ok=True)
            self._spares.clear()
            self.key = "wal:" + self._identity()
            self._bases.clear()
            self._ends.clear()
            self._v2.clear()
            self._new_segment(0)

    def _path(self, base: int) -> Path:
        return self.dir / f"{base:020d}{SUFFIX}"

    def _open_segments(self) -> Repair:
        """Find the segments, check every record, cut damaged tails (and a reused segment's old records). Sets the
        segment list and positions. Spares left by an earlier process are deleted: a spare is only reused by the
        process that released it, under the log identity its records had."""
        for spare in self.dir.glob("*" + SPARE_SUFFIX):
            spare.unlink()
        bases = sorted(int(p.stem) for p in self.dir.glob("*" + SUFFIX) if p.stem.isdigit())
        records = cut = 0
        for k, base in enumerate(bases):
            path = self._path(base)
            good, total, bad, head = self._scan(path, base)
            if good < total:
                with open(path, "rb+") as f:
                    f.truncate(good)
                    os.fsync(f.fileno())
                if bad:
                    records += bad
                    cut += total - good
                    log.warning(
                        "write-ahead log %s: cut %d damaged byte(s) at offset %d (%s); what was acknowledged "
                        "before them is kept", path.name, total - good, good, "a torn last write"
                        if base == bases[-1] else "a damaged record",
                    )  # fmt: skip
            if not bad and k + 1 < len(bases) and base + good - head < bases[k + 1]:
                # segments follow each other: one that ends short of the next lost records, though what ended it
                # read as a reused segment's old record (its position damaged) or its file was cut
                records += 1
                cut += bases[k + 1] - (base + good - head)
                log.warning(
                    "write-ahead log %s: its records end at position %d, short of the next segment's %d (damage); "
                    "what was acknowledged before is kept", path.name, base + good - head, bases[k + 1],
                )  # fmt: skip
            if good < head:  # not even a segment header: an empty segment from a crash at creation
                path.unlink()
                continue
            self._bases.append(base)
            self._ends.append(base + good - head)
            self._v2.append(head == SEGMENT2.size)
        return Repair(records, cut)

    @staticmethod
    def _scan(path: Path, base: int) -> tuple[int, int, int, int]:
        """(bytes of valid records incl. the header, file size, damaged records found, the segment header's size)
        of one segment. In format 2, a record whose position is not the one expected where it stands is the end
        (a reused segment's old record), not damage."""
        data = path.read_bytes()
        if data[: len(MAGIC2)] == MAGIC2:
            head, record = SEGMENT2.size, HEADER2.size
            if len(data) < head or SEGMENT2.unpack_from(data)[1] != base:
                return 0, len(data), 1, head
        elif data[: len(MAGIC)] == MAGIC:
            head, record = len(MAGIC), HEADER.size
        else:
            return 0, len(data), 1 if data else 0, len(MAGIC)
        at = head
        while at < len(data):
            if at + record > len(data):
                return at, len(data), 1, head
            if record == HEADER2.size:
                length, crc, position = HEADER2.unpack_from(data, at)
                if position != base + at - head:
                    return at, len(data), 0, head
            else:
                length, crc = HEADER.unpack_from(data, at)
            end = at + record + length
            if not 0 < length <= MAX_RECORD or end > len(data) or _crc(memoryview(data)[at + record : end]) != crc:
                return at, len(data), 1, head
            at = end
        return at, len(data), 0, head

    def _new_segment(self, base: int) -> None:
        """Start the segment at ``base`` (format 2): a spare overwritten (its header first, synced, then renamed:
        a crash leaves either the spare or the new segment), or a new file."""
        path, header = self._path(base), SEGMENT2.pack(MAGIC2, base)
        fd = -1
        while fd < 0 and self._spares:
            spare = self._spares.pop()
            try:
                fd = os.open(spare, os.O_WRONLY)
                os.pwrite(fd, header, 0)
                os.fdatasync(fd)
                os.rename(spare, path)
            except OSError as exc:
                log.warning("write-ahead log: could not reuse %s (%s); a new segment instead", spare.name, exc)
                if fd >= 0:
                    os.close(fd)
                    fd = -1
                spare.unlink(missing_ok=True)
        if fd < 0:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, header)
            os.fsync(fd)
        _fsync_dir(self.dir)
        self._fd = fd
        self._bases.append(base)
        self._ends.append(base)
        self._v2.append(True)

    # ------------------------------------------------------------------ positions

    @property
    def start(self) -> int:
        """The position of the oldest record still in the log."""
        return self._bases[0]

    @property
    def end(self) -> int:
        """The position after the last durable record."""
        return self._ends[-1]

    @property
    def size(self) -> int:
        """Bytes the store has not applied (not released), plus bytes queued for the next write. (The disk holds
        up to one segment more: segments are deleted whole.)"""
        return self._ends[-1] - max(self._bases[0], self._released) + self._queued

    # ------------------------------------------------------------------ writing

    def append(self, *batches: EventBatch) -> int:
        """Write validated batches, a record each, all in one group commit: all of them or none are in the log.
        Returns the last one's end position once it is on disk (fsynced). Blocks for one group commit (a few ms).
        Raises :class:`LogFull` over the budget, for a record larger than :data:`MAX_RECORD` (which opening the log
        would cut as damaged: never acknowledged), or when the disk refuses the write; then none of them is in the
        log."""
        tickets = [_Ticket(batch.encode_parts()) for batch in batches]
        for ticket in tickets:
            if ticket.length > MAX_RECORD:
                raise LogFull(f"a record of {ticket.length:,} bytes is larger than the log takes ({MAX_RECORD:,})")
        size = sum(t.size for t in tickets)
        with self._lock:
            if self._closed:
                raise LogFull("the log is closed")
            if self.size + size > self.max_bytes:
                raise LogFull(f"write-ahead log full ({self.size:,} of {self.max_bytes:,} bytes wait for the store)")
            self._queue += tickets  # (together: a flush takes the whole queue, so they share its write and its fate)
            self._queued += size
        last = tickets[-1]
        with self._flush_lock:
            if not last.end and last.error is None:
                self._flush()
        if not last.end and last.error is None:  # (a bug: never acknowledge what was not written)
            last.error = OSError(errno.EIO, "the record was not written")
        if last.error is not None:
            raise LogFull(f"write-ahead log write failed: {last.error}") from last.error
        return last.end

    def _flush(self) -> None:
        """Write and sync every queued record (under the flush lock): one group commit."""
        with self._lock:
            group, self._queue = self._queue, []
            self._queued -= sum(t.size for t in group)
            closed = self._closed
        at, offset = self._ends[-1], -1
        try:
            if closed:  # queued before close took the flush lock: its descriptor is gone (its number maybe reused)
                raise OSError(errno.EBADF, "the log is closed")
            if self._broken:
                raise OSError(errno.EIO, self._broken)
            if at - self._bases[-1] >= self.segment_bytes:  # roll over before, never inside, a group
                if self._fd >= 0:
                    os.close(self._fd)
                    self._fd = -1  # (until the next segment is open: a failed roll-over is tried again)
                with self._lock:
                    self._new_segment(at)
            offset = SEGMENT2.size + at - self._bases[-1]  # (the segment written is always of format 2)
            parts: list[bytes | memoryview] = []
            position = at
            for t in group:
                parts += (HEADER2.pack(t.length, t.crc, position), *t.parts)
                position += t.size
            _write_at(self._fd, parts, offset)
            os.fdatasync(self._fd)
        except OSError as exc:
            if offset >= 0:
                self._cut(offset)
            if exc.errno == errno.ENOSPC:
                log.error("write-ahead log: disk full in %s; refusing writes until there is room", self.dir)
            for t in group:
                t.error = exc
            return
        for t in group:
            at += t.size
            t.end = at
        with self._lock:
            self._ends[-1] = at
            self._grown.notify_all()

    def _cut(self, offset: int) -> None:
        """Cut a failed group's bytes off at ``offset``, durably: never leave part of a record behind, nor whole
        records of a group that failed (the next group is written at the same offset, and one as long as a failed
        record would make the record after it look like the next; a reused segment's old tail goes too). A cut
        that fails leaves the log refusing writes until it is opened again (its repair then cuts the tail)."""
        try:
            os.ftruncate(self._fd, offset)
            os.fsync(self._fd)
        except OSError as exc:
            self._broken = f"a failed write could not be cut back ({exc}); restart the server"
            log.exception("write-ahead log: could not cut a failed write back; refusing writes until restarted")

    # ------------------------------------------------------------------ reading

    def reader(self, position: int) -> _DiskReader:
        """A reader of the records after ``position`` (or from the oldest one, if those are gone)."""
        return _DiskReader(self, max(position, self.start))

    def wait(self, position: int, timeout: float) -> bool:
        """Block until the log ends after ``position`` or ``timeout`` passes; True if it does."""
        with self._lock:
            return self._grown.wait_for(lambda: self._ends[-1] > position or self._closed, timeout) and (
                self._ends[-1] > position
            )

    def _segment_of(self, position: int) -> tuple[int, int, bool]:
        """(base, end, format 2) of the segment holding ``position`` (or the next one after a gap)."""
        with self._lock:
            i = max(0, bisect.bisect_right(self._bases, position) - 1)
            if i < len(self._bases) - 1 and position >= self._ends[i]:
                i += 1
            return self._bases[i], self._ends[i], self._v2[i]

    # ------------------------------------------------------------------ releasing

    def release(self, position: int) -> None:
        """The store has applied everything up to ``position``: the segments that end at or before it become spares
        (up to :data:`SPARES`) or are deleted (never the one being written). Every reader must be past
        ``position``: a spare is written over as a later segment, and a reader still inside it would read that (the
        feeder's reader is always ahead of what the store has applied)."""
        with self._lock:
            self._released = max(self._released, position)
        while True:
            with self._lock:
                if len(self._bases) < 2 or self._ends[0] > position:
                    return
                base = self._bases.pop(0)
                self._ends.pop(0)
                self._v2.pop(0)
                keep = len(self._spares) < SPARES
            path = self._path(base)
            if keep:
                spare = path.with_suffix(SPARE_SUFFIX)
                try:
                    path.rename(spare)
                    _fsync_dir(self.dir)  # (lost in a crash, the spare would come back as this segment, rewritten)
                except OSError:
                    keep = False
                else:
                    with self._lock:
                        self._spares.append(spare)
            if not keep:
                path.unlink(missing_ok=True)

    def close(self) -> None:
        with self._flush_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            os.close(self._lock_fd)  # releases the directory lock
            self._grown.notify_all()


class _DiskReader:
    """Reads a :class:`WriteAheadLog` sequentially from a position (durable records only)."""

    def __init__(self, wal: WriteAheadLog, position: int) -> None:
        self._wal = wal
        self.position = position
        self._file: BinaryIO | None = None
        self._base = -1
        self._seg_end = -1  # the end of the open segment, as last seen (the active one grows)
        self._v2 = True  # the open segment's format

    def read(self, max_records: int) -> list[tuple[int, EventBatch]]:
        out: list[tuple[int, EventBatch]] = []
        while len(out) < max_records:
            if self.position >= self._seg_end and not self._next_segment():
                break
            assert self._file is not None
            if self._v2:
                length, crc, at = HEADER2.unpack(self._file.read(HEADER2.size))
                header = HEADER2.size
            else:
                (length, crc), at, header = HEADER.unpack(self._file.read(HEADER.size)), self.position, HEADER.size
            payload = self._file.read(length)
            if at != self.position or len(payload) != length or _crc(payload) != crc:  # checked at open,
                raise DrainpipeError(f"write-ahead log damaged at position {self.position} in {self._wal.dir}")
            self.position += header + length  # (written whole: a bug)
            out.append((self.position, EventBatch.decode(payload)))
        return out

    def _next_segment(self) -> bool:
        """Move on to what follows ``position`` (more of the active segment, or the next one); False if nothing."""
        base, end, v2 = self._wal._segment_of(self.position)
        if base != self._base:
            if self._file is not None:
                self._file.close()
            self.position = max(self.position, base)  # after a gap (a damaged segment was cut)
            # kept open across reads; unbuffered: a buffer reads ahead, and past the end of a reused segment it
            # would keep its old records where the next ones are written
            self._file = open(self._wal._path(base), "rb", buffering=0)
            self._file.seek((SEGMENT2.size if v2 else len(MAGIC)) + self.position - base)
            self._base, self._v2 = base, v2
        self._seg_end = end
        return self.position < end

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class MemoryLog:
    """The log's interface without the disk (``--durability none``): positions count the batches' Arrow bytes.
    Acknowledged batches live in memory until the store has them; a crash loses them."""

    durable = False

    def __init__(self, *, max_bytes: int = 512 << 20) -> None:
        self.max_bytes = max_bytes
        self.location = "memory"
        self.key = "memory:" + uuid.uuid4().hex  # never replayed: a new identity per process
        self._records: deque[tuple[int, EventBatch]] = deque()
        self._start = self._end = 0
        self._popped = 0  # records released so far: the absolute index of _records[0]
        self._lock = threading.Lock()
        self._grown = threading.Condition(self._lock)
        self._closed = False

    @property
    def start(self) -> int:
        return self._start

    @property
    def end(self) -> int:
        return self._end

    @property
    def size(self) -> int:
        return self._end - self._start

    def append(self, *batches: EventBatch) -> int:
        size = sum(batch.rows.nbytes for batch in batches)
        with self._lock:
            if self._closed:
                raise LogFull("the log is closed")
            if self.size + size > self.max_bytes:
                raise LogFull(f"in-memory buffer full ({self.size:,} of {self.max_bytes:,} bytes wait for the store)")
            for batch in batches:
                self._end += batch.rows.nbytes
                self._records.append((self._end, batch))
            self._grown.notify_all()
            return self._end

    def reader(self, position: int) -> _MemoryReader:
        with self._lock:
            index = self._popped + bisect.bisect_right([e for e, _ in self._records], position)
        return _MemoryReader(self, index)

    def _records_from(self, index: int, max_records: int) -> list[tuple[int, EventBatch]]:
        """Up to ``max_records`` records from absolute index ``index`` on."""
        with self._lock:
            i = max(0, index - self._popped)
            return list(itertools.islice(self._records, i, i + max_records))

    def wait(self, position: int, timeout: float) -> bool:
        with self._lock:
            return self._grown.wait_for(lambda: self._end > position or self._closed, timeout) and self._end > position

    def release(self, position: int) -> None:
        with self._lock:
            while self._records and self._records[0][0] <= position:
                self._start = self._records.popleft()[0]
                self._popped += 1

    def renew(self) -> None:
        """A new identity (the log is empty at start anyway)."""
        self.key = "memory:" + uuid.uuid4().hex

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._grown.notify_all()


class _MemoryReader:
    def __init__(self, log: MemoryLog, index: int) -> None:
        self._log = log
        self._index = index

    def read(self, max_records: int) -> list[tuple[int, EventBatch]]:
        out = self._log._records_from(self._index, max_records)
        self._index += len(out)
        return out

    def close(self) -> None:
        pass
