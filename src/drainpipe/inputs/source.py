"""Partitioned sources: the one shape of every input (files, the serve write-ahead log, and next a Kafka topic).

=============== ===================================================================================================
``Source``      an input that lists its **parts** (:meth:`~Source.list_parts`) and builds a reader of one part from
                its resume position (:meth:`~Source.build_part`); its :attr:`~Source.name` keys the store's progress
``SourcePart``  the reader of one part: :meth:`~SourcePart.next_batch` gives the next :class:`EventBatch`, and
                :meth:`~SourcePart.snapshot` the position after the last batch given (the part's resume state)
``Position``    a place in a part: bytes and lines of a text file, rows of Parquet, a log's offset, a partition's
                offset
=============== ===================================================================================================

The shape is bytewax's ``FixedPartitionedSource``/``StatefulSourcePartition``. A part is a stream with one position
that only grows: a file (the file source's parts are its paths), the log (one part, named by the log's identity),
a topic partition. The store keeps, per (source, part, definition), the position applied, in the same transaction
as the states that data brought (:class:`drainpipe.pipeline.SourceProgress`, kept by
:mod:`drainpipe.pipeline.progress`), so an engine resumes every part of every source alike: it builds the part
from the least position its definitions have applied, and commits the snapshot it reached.

A part may be read by several readers at once when its source can cut it into ranges: the file source plans a
file's remainder into byte or row-group ranges (:meth:`FileSource.plan`, plain picklable data), and any process (a
worker, a Spark task) reads one with :func:`~drainpipe.inputs.read_part`, a :class:`SourcePart` of that range.

Nothing here needs the C extensions: Spark executors import this package from a zip without them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator

from .batches import EventBatch
from .position import Position

__all__ = ["Source", "SourcePart"]


class SourcePart(ABC):
    """The reader of one part, from a resume position. One thread reads it."""

    @abstractmethod
    def next_batch(self) -> EventBatch | None:
        """The next batch with accepted rows, or None: a bounded part (a file, a range) has ended; a live part
        (the log) has nothing more now, and may have later. Blocks only on I/O. Raises
        :class:`~drainpipe.errors.InputError` (one line) for input that cannot be read; batches already given stay
        valid."""

    @abstractmethod
    def snapshot(self) -> Position:
        """Where the part is read to after the last batch given (after the whole part once :meth:`next_batch`
        returned None): building the part from this position reads on from there, without a batch twice."""

    def close(self) -> None:
        """Release what the reader holds (open files). Idempotent."""
        return None  # a reader that holds nothing has nothing to release

    def __iter__(self) -> Iterator[EventBatch]:
        """The batches until :meth:`next_batch` gives None."""
        while (batch := self.next_batch()) is not None:
            yield batch


class Source(ABC):
    """An input of parts; see the module docstring."""

    #: names the source in the store's progress rows ("file", "log", ...)
    name: str

    @abstractmethod
    def list_parts(self) -> list[str]:
        """The parts to read, in order."""

    @abstractmethod
    def build_part(self, part: str, resume: Position) -> SourcePart:
        """A reader of ``part`` from ``resume`` (``Position()``: its start)."""
