"""Event files as a user names them: paths and globs into files (:func:`expand_inputs`), and whole files read in
order (:func:`read_events`), through the same part readers as every engine."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence

from ..errors import InputError
from .batches import EventBatch
from .formats import format_of
from .parts import read_part, whole_file
from .rejects import DeadLetter, ReadStats, Sink

__all__ = ["expand_inputs", "read_events"]


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
    return _read_all(plan, batch_rows, stats if stats is not None else ReadStats(), dead_letter)


def _read_all(
    plan: list[str], batch_rows: int, stats: ReadStats, dead_letter: DeadLetter | None
) -> Iterator[EventBatch]:
    for path in plan:
        for _, batch in read_part(whole_file(path, batch_rows), Sink(path, stats, dead_letter)):
            yield batch
