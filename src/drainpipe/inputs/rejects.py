"""What a read reports beside its events: counts (:class:`ReadStats`, ``read == accepted + rejected``), and the
rejected records with their reasons (the :class:`Sink` a reader writes them to, the :class:`DeadLetter` file)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from ..errors import UsageError

__all__ = ["ReadStats", "DeadLetter", "RejectWriter", "Sink", "jsonable"]


@dataclass
class ReadStats:
    """Counts of one read (or several: pass the same object). ``read == accepted + rejected`` holds by
    construction; blank lines are not counted. ``reasons`` counts rejects by reason; ``warnings`` counts accepted
    records read with a caveat, by reason (an odd optional field dropped, such as ``bad trace_id``; a sampled span
    whose threshold could not be used counted 1). Not
    thread-safe: give each reading thread its own object and :meth:`merge` them."""

    read: int = 0
    accepted: int = 0
    rejected: int = 0
    reasons: Counter = field(default_factory=Counter)
    warnings: Counter = field(default_factory=Counter)

    def add_accepted(self, n: int) -> None:
        self.read += n
        self.accepted += n

    def add_rejected(self, reason: str, n: int = 1) -> None:
        self.read += n
        self.rejected += n
        self.reasons[reason] += n

    def add_warning(self, reason: str, n: int = 1) -> None:
        """``n`` of the accepted records had a caveat (they are counted as accepted already)."""
        self.warnings[reason] += n

    def merge(self, other: ReadStats) -> None:
        """Add ``other``'s counts to this one."""
        self.read += other.read
        self.accepted += other.accepted
        self.rejected += other.rejected
        self.reasons.update(other.reasons)
        self.warnings.update(other.warnings)

    def summary(self) -> str:
        """One line, e.g. ``read 10 = accepted 8 + rejected 2 (bad type: ts: 2)``, then any warnings
        (``; warnings: malformed sampling threshold: 1``)."""
        text = f"read {self.read} = accepted {self.accepted} + rejected {self.rejected}"
        if self.reasons:
            text += " (" + ", ".join(f"{r}: {n}" for r, n in self.reasons.most_common()) + ")"
        if self.warnings:
            text += "; warnings: " + ", ".join(f"{r}: {n}" for r, n in self.warnings.most_common())
        return text


class DeadLetter:
    """Rejected records as JSON Lines, one object per reject::

        {"source": "<input path>", "line": <n>, "raw": <raw record>, "reason": "<reason>"}

    ``line`` is the 1-based physical line number for JSON Lines and CSV (where a record starts; blank
    lines count) and the 1-based row number within the file for Parquet; a message's offset for Kafka. ``raw`` is
    the line's text for JSON Lines and CSV without its line ending (bytes that are not UTF-8 are decoded with
    ``errors="backslashreplace"``) and the row as an object for Parquet (only the canonical columns;
    timestamps as ISO strings, non-finite floats as strings).

    **Each rejected record once.** A record read again (a rewind after a failed or killed commit, a Kafka partition
    re-read by another member, a run after a crash, the other engine) is rejected again, but the dead letter does not
    take it twice: a record whose source, line and raw record are in the file already is skipped (``repeated``
    counts them). The file's records are known from :meth:`open` on (read once), and what other processes appended
    meanwhile is read at each :meth:`flush`, before the records held since the last one are appended (in one
    ``write`` of the append-only file: whole lines even with several processes appending).

    The file is opened eagerly by ``__enter__``/:meth:`open` and appended to: rejected records of earlier runs
    are never destroyed, and after a clean run the file exists. :meth:`write` and :meth:`flush` are thread-safe.
    Records are held in memory until :meth:`flush` (the driver flushes before each commit) or :meth:`close`.
    ``count`` is the number of records taken (written, or held to be written).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.count = 0
        self.repeated = 0  # records skipped: the dead letter held them already
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._seen: set[bytes] = set()  # digests of (source, line, raw) of the records in the file
        self._end = 0  # the file's bytes up to here are in _seen
        self._tail = b""  # an incomplete last line (another writer mid-write), read again next time
        self._held: list[tuple[bytes, bytes]] = []  # (digest, line) taken since the last flush

    def open(self) -> DeadLetter:
        with self._lock:
            if self._fd is None:
                try:
                    self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                except OSError as exc:
                    raise UsageError(f"cannot write the dead letter {self.path!r}: {exc.strerror or exc}") from None
                self._catch_up()
        return self

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> DeadLetter:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def flush(self) -> None:
        """Append the records taken since the last flush to the file (before a store commit that follows it),
        except those another process appended meanwhile. Thread-safe. Raises ``OSError`` when the file cannot take
        them (a full disk): they are dropped then, and not remembered, so that the read that rejects them again
        (after the commit failed, the input is read again from the last one) writes them."""
        with self._lock:
            if self._fd is None or not self._held:
                return
            theirs = self._catch_up()  # first: a file truncated under us is read again with ours still held
            held = [(digest, line) for digest, line in self._held if digest not in theirs]
            self.repeated += len(self._held) - len(held)
            self.count -= len(self._held) - len(held)
            self._held = []
            data = b"".join(line for _, line in held)
            if not data:
                return
            if self._tail:  # the file ends inside a line (a writer died mid-record): end that line first
                data = b"\n" + data
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view) :]
            except OSError:
                for digest, _ in held:
                    self._seen.discard(digest)
                self.count -= len(held)
                raise
            if os.fstat(self._fd).st_size == self._end + len(data):  # no one else wrote meanwhile
                self._end += len(data)
                self._tail = b""

    def write(self, source: str, line: int, raw: Any, reason: str) -> None:
        """Take one reject, unless the dead letter holds it already (thread-safe; written at :meth:`flush`)."""
        record = {"source": source, "line": line, "raw": jsonable(raw), "reason": reason}
        data = (json.dumps(record, allow_nan=False) + "\n").encode()  # ASCII: safe for any line splitter
        digest = _digest(data[: data.rfind(_REASON)])
        with self._lock:
            if self._fd is None:
                raise RuntimeError(f"dead letter {self.path!r} is not open")
            if digest in self._seen:
                self.repeated += 1
                return
            self._seen.add(digest)
            self._held.append((digest, data))
            self.count += 1

    def _catch_up(self) -> set[bytes]:
        """Read the records appended since the last look (by this or another process) into ``_seen``; returns
        their digests."""
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size <= self._end:
            if size < self._end:  # truncated or replaced under us: read it all again
                self._seen = {digest for digest, _ in self._held}
                self._end, self._tail = 0, b""
                return self._catch_up()
            return set()
        with open(self.path, "rb") as f:
            f.seek(self._end)
            data = self._tail + f.read(size - self._end)
        self._end = size
        lines = data.split(b"\n")
        self._tail = lines.pop()  # b"" when the data ends with a whole line
        new = {_digest(record[:cut]) for record in lines if (cut := record.rfind(_REASON)) > 0}
        self._seen |= new
        return new


_REASON = b', "reason": '  # the last field of a record: what comes before it identifies the record


def _digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


def jsonable(value: Any) -> Any:
    """``value`` made JSON-serialisable without loss of meaning (for Parquet rows)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, (Decimal, _dt.timedelta)):
        return str(value)
    return value


class RejectWriter(Protocol):
    """Where rejected records are written: a :class:`DeadLetter`, or a collector of them."""

    def write(self, source: str, line: int, raw: Any, reason: str) -> None: ...


class Sink:
    """Where the rejects of one source file go: the stats and (optionally) a reject writer."""

    def __init__(self, source: str, stats: ReadStats, dead_letter: RejectWriter | None) -> None:
        self.source = source
        self.stats = stats
        self.dead_letter = dead_letter

    def reject(self, line: int, raw: Any, reason: str) -> None:
        self.stats.add_rejected(reason)
        if self.dead_letter is not None:
            if isinstance(raw, (bytes, bytearray)):
                raw = _raw_text(bytes(raw))
            self.dead_letter.write(self.source, line, raw, reason)


def _raw_text(raw: bytes) -> str:
    if raw.endswith(b"\n"):
        raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
    return raw.decode("utf-8", "backslashreplace")
