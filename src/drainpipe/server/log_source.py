"""The serve write-ahead log as a partitioned source: one part, named by the log's identity (its ``key``), read from
a log offset. The feeder reads it like every other source, and the store keeps its position under ``("log",
key)`` like a file's (:mod:`drainpipe.pipeline.progress`)."""

from __future__ import annotations

from collections import deque

from ..inputs import EventBatch, Position, Source, SourcePart
from .wal import EventLog, LogReader

__all__ = ["LogSource", "LogPart"]

#: records fetched from the log per read (the reader's cost is per read, not per record)
READ_RECORDS = 64


class LogSource(Source):
    """An :class:`~.wal.EventLog` as a :class:`~drainpipe.inputs.Source` of one part."""

    name = "log"

    def __init__(self, log: EventLog) -> None:
        self.log = log

    def list_parts(self) -> list[str]:
        return [self.log.key]

    def build_part(self, part: str, resume: Position) -> LogPart:
        if part != self.log.key:
            raise ValueError(f"this log is {self.log.key!r}, not {part!r}")
        return LogPart(self.log, resume.offset)


class LogPart(SourcePart):
    """The log read from a position, record by record: a live part, whose :meth:`next_batch` gives None when it is
    caught up (:meth:`wait` until it grows). Only durable records are read. One thread reads it."""

    def __init__(self, log: EventLog, position: int) -> None:
        self._log = log
        self._reader: LogReader = log.reader(position)
        self._ahead: deque[tuple[int, EventBatch]] = deque()  # read from the log, not given yet
        self._position = position

    def next_batch(self) -> EventBatch | None:
        if not self._ahead:
            self._ahead.extend(self._reader.read(READ_RECORDS))
            if not self._ahead:
                return None
        self._position, batch = self._ahead.popleft()
        return batch

    def snapshot(self) -> Position:
        return Position(self._position)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a record after the last one given; whether there is one."""
        return bool(self._ahead) or self._log.wait(self._position, timeout)

    def close(self) -> None:
        self._reader.close()
