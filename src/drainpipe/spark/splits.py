"""Input splits: the input layer's parts (:mod:`drainpipe.inputs.parts`) as Spark tasks' inputs.

A :class:`Split` is one planned :class:`~drainpipe.inputs.Part` (the same parts the local engine reads, from where
the store has the file applied), its placement weight, and the definitions to aggregate it for. :func:`read_split`
reads it with :func:`~drainpipe.inputs.read_part`: the same validation, reject reasons and file line numbers as the
local engine, and, for a whole text file, where reading stopped (its last complete line).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from drainpipe.inputs import EventBatch, Part, ReadStats, RejectList, Sink, jsonable, read_part
from drainpipe.inputs.formats import format_named

__all__ = ["Split", "SplitResult", "plan_splits", "read_split"]


@dataclass(frozen=True)
class Split:
    """One task's input; ``index`` is its position in the plan (files in order, then parts)."""

    index: int
    part: Part
    weight: int  # estimated cost, for placement

    @property
    def path(self) -> str:
        return self.part.path

    @property
    def nbytes(self) -> int:
        return self.part.nbytes


def plan_splits(parts: Sequence[Part]) -> list[Split]:
    """Splits of planned parts, in order."""
    return [Split(i, part, max(1, int(part.nbytes * format_named(part.fmt).cost(part.gzipped))))
            for i, part in enumerate(parts)]  # fmt: skip


@dataclass
class SplitResult:
    """What reading a split produced besides its batches: counts, rejects, and where a whole file's read stopped."""

    stats: ReadStats
    rejects: list[tuple[int, str, str]]  # (file line or row, raw as JSON text, reason)
    end: tuple[int, int] | None = None  # whole text file: (bytes, lines) after its last complete line


class _JsonRejects(RejectList):
    """Rejects with ``raw`` as JSON text (Spark rows carry strings)."""

    rows: list[tuple[int, str, str]]

    def write(self, source: str, line: int, raw: Any, reason: str) -> None:
        self.rows.append((line, json.dumps(jsonable(raw), ensure_ascii=False, allow_nan=False), reason))


def read_split(split: Split, *, dictionaries: bool = False) -> tuple[Iterator[EventBatch], SplitResult]:
    """Canonical event batches of ``split`` (lazily) and the :class:`SplitResult` they fill in as they go. An
    unreadable file raises :class:`~drainpipe.errors.InputError` while iterating. ``dictionaries``: string columns
    the reader gives dictionary-encoded may stay so (:func:`~drainpipe.inputs.read_part`'s flag), for a task that
    only aggregates its batches, as the local engine's workers do; a task that hands its events to Spark wants
    plain strings."""
    rejects = _JsonRejects()
    result = SplitResult(ReadStats(), rejects.rows)
    sink = Sink(split.path, result.stats, rejects)

    def batches() -> Iterator[EventBatch]:
        reader = read_part(split.part, sink, dictionaries=dictionaries)
        yield from reader
        end = reader.snapshot()
        result.end = (end.offset, end.lines)

    return batches(), result
