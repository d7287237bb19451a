"""The file connector: paths and globs into files (:func:`expand_inputs`), the files as a partitioned source
(:class:`FileSource`: a part per file, resumed at a byte, line or row position, planned into ranges for parallel
readers), and whole files read in order (:func:`read_events`). Every engine reads files through it."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import InputError
from .batches import EventBatch
from .formats import format_of
from .options import InputOptions
from .part import Part, PartReader
from .parts import plan_parts, read_part, whole_file
from .position import Position
from .rejects import DeadLetter, ReadStats, Sink
from .source import Source

__all__ = ["FileSource", "expand_inputs", "read_events"]


def expand_inputs(patterns: Sequence[str]) -> list[str]:
    """Files and glob patterns -> the sorted, deduplicated list of files (paths normalised).

    A glob (``*``, ``?``, ``[``; ``**`` recurses) that matches no file, a path that does not exist, or a
    directory raises :class:`InputError` with a one-line message."""
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    if not patterns:
        raise InputError("no input files given")
    found: set[str] = set()
    for pattern in map(os.fspath, patterns):
        if glob.has_magic(pattern):
            matches = [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
            if not matches:
                raise InputError(f"no input files match {pattern!r}")
            found.update(os.path.normpath(p) for p in matches)
        elif os.path.isdir(pattern):
            raise InputError(f"input {pattern!r} is a directory (use a glob such as '{pattern}/*.jsonl')")
        elif not os.path.isfile(pattern):
            raise InputError(f"no such input file: {pattern!r}")
        else:
            found.add(os.path.normpath(pattern))
    return sorted(found)


def read_events(
    paths: Sequence[str] | str,
    *,
    batch_rows: int = 65536,
    dead_letter: DeadLetter | None = None,
    stats: ReadStats | None = None,
) -> Iterator[EventBatch]:
    """Read event files (in the given order) as :class:`~.batches.EventBatch` values (canonical
    :data:`~.schema.EVENT_SCHEMA` rows; exit rows, from OTLP files, after each batch's requests).

    Each yielded batch holds at most ``batch_rows`` accepted rows and comes from one file; empty batches
    are not yielded. Rejected records go to ``stats`` and ``dead_letter`` (both optional) and reading
    goes on; ``stats`` is up to date for everything read so far each time a batch is yielded and when
    the iterator is exhausted.

    Checked at call time (before iterating): every path has a supported suffix (:func:`detect_format`)
    and exists, else :class:`InputError`. A file that cannot be read at all (corrupt gzip or Parquet,
    I/O error) raises :class:`InputError` while iterating; records already yielded stay valid."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if batch_rows < 1:
        raise ValueError("batch_rows must be >= 1")
    plan = [os.fspath(p) for p in paths]
    for path in plan:
        format_of(path)
        if not os.path.isfile(path):
            raise InputError(f"no such input file: {path!r}")
    return _read_all(FileSource(plan, batch_rows, stats=stats, dead_letter=dead_letter))


def _read_all(source: FileSource) -> Iterator[EventBatch]:
    for path in source.list_parts():
        yield from source.build_part(path, Position())


class FileSource(Source):
    """Event files as a :class:`~.source.Source`: a part per file (named by its path, in the given order), read
    from a position in the file's progress unit (bytes and lines of text, rows of Parquet) to its end: for a
    growable text file, to its last complete line (:meth:`~.source.SourcePart.snapshot` says where).

    :meth:`plan` cuts a part into ranges (:class:`~.part.Part`, plain picklable data) for readers in other
    processes; :func:`~.parts.read_part` reads one, counting and rejecting into a sink the caller gives.
    Readers built here count into ``stats`` and write rejects to ``dead_letter`` (both optional). Reading is not
    thread-safe across parts (one ``stats``); planning is."""

    name = "file"

    def __init__(
        self,
        paths: Sequence[str],
        batch_rows: int = 65_536,
        *,
        options: InputOptions = InputOptions(),
        stats: ReadStats | None = None,
        dead_letter: DeadLetter | None = None,
    ) -> None:
        self.paths = list(paths)
        self.batch_rows = batch_rows
        self.options = options
        self.stats = stats if stats is not None else ReadStats()
        self.dead_letter = dead_letter

    def list_parts(self) -> list[str]:
        return list(self.paths)

    def build_part(self, part: str, resume: Position) -> PartReader:
        return read_part(whole_file(part, self.batch_rows, resume, self.options), self.sink(part))

    def sink(self, part: str) -> Sink:
        """Where the readers of ``part`` count and reject."""
        return Sink(part, self.stats, self.dead_letter)

    def plan(self, part: str, resume: Position, *, workers: int = 1, hasher: Any = None) -> Iterator[Part]:
        """The ranges of ``part`` from ``resume`` on, in file order, sized for ``workers`` readers (see
        :func:`~.parts.plan_parts`, which says what ``hasher`` is)."""
        return plan_parts(part, self.batch_rows, workers=workers, start=resume, hasher=hasher, options=self.options)
