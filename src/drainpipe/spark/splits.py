"""Input splits: the input layer's parts (:mod:`drainpipe.inputs.parts`) as Spark tasks' inputs.

A :class:`Split` is one planned :class:`~drainpipe.inputs.Part` (the same parts, blocks and source ids the local
engine uses), its placement weight, and the blocks an earlier run already stored (read and counted, but not
aggregated again). :func:`read_split` reads it with :func:`~drainpipe.inputs.read_part`: the same validation,
reject reasons and file line numbers as the local engine, and the indices of the blocks it aggregated, from
which the driver records the blocks' source ids in the store.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from drainpipe.inputs import (
    Part,
    ReadStats,
    RejectList,
    Sink,
    detect_format,
    file_identity,
    jsonable,
    plan_parts,
    read_part,
)

__all__ = ["Split", "SplitResult", "plan_file", "plan_splits", "read_split"]

#: estimated relative processing cost per input byte (the weights only order and place splits)
_COST_PER_BYTE = {
    ("jsonl", False): 1.0,
    ("csv", False): 1.2,
    ("jsonl", True): 5.0,
    ("csv", True): 6.0,
    ("parquet", False): 2.0,
}


@dataclass(frozen=True)
class Split:
    """One task's input; ``index`` is its position in the plan (files in order, then parts)."""

    index: int
    part: Part
    weight: int  # estimated cost, for placement
    skip: frozenset[int] = frozenset()  # blocks already stored: read and counted, not aggregated

    @property
    def path(self) -> str:
        return self.part.path

    @property
    def nbytes(self) -> int:
        return self.part.nbytes


def plan_file(path: str, batch_rows: int, parallelism: int) -> list[Part]:
    """The parts of ``path`` with the file's identity set (the JSON Lines planner fingerprints as it scans)."""
    hasher = hashlib.sha256() if detect_format(path) == ("jsonl", False) else None
    parts = list(plan_parts(path, batch_rows, workers=parallelism, hasher=hasher))
    identity = file_identity(path, hasher.hexdigest() if hasher is not None else None)
    return [p.identified(identity) for p in parts]


def plan_splits(parts: Sequence[Part], skip: dict[str, frozenset[int]] | None = None) -> list[Split]:
    """Splits of planned parts, in order; ``skip``: per file path, the blocks already stored."""
    skip = skip or {}
    return [
        Split(
            i,
            part,
            max(1, int(part.nbytes * _COST_PER_BYTE[(part.fmt, part.gzipped)])),
            skip.get(part.path, frozenset()),
        )
        for i, part in enumerate(parts)
    ]


@dataclass
class SplitResult:
    """What reading a split produced besides its batches: counts, rejects and the blocks it aggregated."""

    stats: ReadStats
    rejects: list[tuple[int, str, str]]  # (file line or row, raw as JSON text, reason)
    blocks: list[int] = field(default_factory=list)  # blocks with accepted rows that were not skipped


class _JsonRejects(RejectList):
    """Rejects with ``raw`` as JSON text (Spark rows carry strings)."""

    rows: list[tuple[int, str, str]]

    def write(self, source: str, line: int, raw: Any, reason: str) -> None:
        self.rows.append((line, json.dumps(jsonable(raw), ensure_ascii=False, allow_nan=False), reason))


def read_split(split: Split) -> tuple[Iterator[pa.RecordBatch], SplitResult]:
    """Canonical event batches of ``split`` (lazily; skipped blocks are left out) and the :class:`SplitResult`
    they fill in as they go. An unreadable file raises :class:`~drainpipe.errors.InputError` while iterating."""
    rejects = _JsonRejects()
    result = SplitResult(ReadStats(), rejects.rows)

    def batches() -> Iterator[pa.RecordBatch]:
        for block, batch in read_part(split.part, Sink(split.path, result.stats, rejects)):
            if block not in split.skip:
                result.blocks.append(block)
                yield batch

    return batches(), result
