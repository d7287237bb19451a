"""Which part of an input file is new: the books a store keeps on input files, read and written by both engines.

A store records, per input file and definition, how far the file is applied (:class:`~.store.FileProgress`), in
the same transaction as the states that data brought. Engines commit only at part boundaries, for every definition
alike, so a run killed at any instant leaves each file applied up to a part boundary, and the next run resumes
there: the result equals an uninterrupted run.

What counts as the same file:

* Uncompressed JSON Lines and CSV can grow (logs). Such a file is found again by the fingerprint of its head
  (:func:`~drainpipe.inputs.head_of`) or by its device and inode, and it is the same file when its first ``end``
  bytes still hash to what was recorded: then only what lies beyond ``end`` is read (complete lines only; a
  partial last line waits). A copy or a renamed (rotated) file is found by its head and counted once. A file whose
  applied bytes changed in place (same inode, other content: rewritten or truncated) is refused: counting it again
  would count its old events twice, and skipping it would lose its new ones.
* Compressed files and Parquet are immutable: they are named by a hash of their whole content. The same bytes
  under another name are the same input; other bytes under the same name are a new input.
* ``events.jsonl`` and ``events.jsonl.gz`` with the same events are different bytes: two inputs.

The identity (``fid``) of a growable file is the hash of its first applied prefix (fixed at its first commit); of
an immutable file, its content hash.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..inputs import Position, detect_format, growable, head_of, node_of, prefix_hasher
from .store import FileProgress, Store

__all__ = ["COMPLETE", "InputFile", "resolve"]

#: the whole of an immutable file is applied
COMPLETE = Position(-1, -1)


@dataclass
class InputFile:
    """One input file of a run: what it is, and how far each definition has it applied (updated as parts are
    applied; :meth:`progress` gives the rows to commit). Not thread-safe: one reader thread owns it."""

    path: str
    fmt: str
    gzipped: bool
    head: str
    node: str
    fid: str | None  # None: a growable file seen for the first time (named at its first commit)
    applied: dict[str, Position]  # per definition name; Position() = nothing yet, COMPLETE = all of it
    hasher: Any = None  # growable: SHA-256 fed the file's bytes before ``start``
    advanced: bool = False  # this run applied something of it
    _prefix: dict[Position, str] = field(default_factory=dict)  # digest of the bytes before a position
    _dirty: set[str] = field(default_factory=set)

    @property
    def growable(self) -> bool:
        return growable(self.fmt, self.gzipped)

    @property
    def start(self) -> Position:
        """Where reading resumes: the least applied position over the definitions not complete."""
        open_ = [p for p in self.applied.values() if p != COMPLETE]
        return min(open_, key=lambda p: p.offset) if open_ else COMPLETE

    @property
    def done(self) -> bool:
        """Nothing to read (an immutable file applied in full for every definition)."""
        return self.start == COMPLETE

    def names_from(self, offset: int) -> frozenset[str]:
        """The definitions to aggregate for data starting at ``offset``: those applied no further than it."""
        return frozenset(n for n, p in self.applied.items() if p != COMPLETE and p.offset <= offset)

    def advance(self, names: frozenset[str], end: Position | None, prefix: str = "") -> None:
        """``names`` now have the file applied up to ``end`` (None: the whole of an immutable file)."""
        target = COMPLETE if end is None else end
        if prefix:
            self._prefix[target] = prefix
        for name in names:
            if self.applied[name] != target:
                self.applied[name] = target
                self._dirty.add(name)
                self.advanced = True

    def pending(self) -> int:
        """Bytes of a growable file after its last applied complete line: a partial last line left for later."""
        if not self.growable:
            return 0
        ends = [p.offset for p in self.applied.values() if p != COMPLETE]
        return max(0, os.path.getsize(self.path) - max(ends, default=0))

    def progress(self) -> list[FileProgress]:
        """Rows for the definitions advanced since the last call (the file's identity is fixed at the first)."""
        if not self._dirty:
            return []
        if self.fid is None:
            first = min((self.applied[n] for n in self._dirty), key=lambda p: p.offset)
            self.fid = self._digest(first)[:24]
        rows = []
        for name in sorted(self._dirty):
            pos = self.applied[name]
            prefix = self._digest(pos) if self.growable else ""
            rows.append(FileProgress(self.fid, name, self.head, self.node, os.path.abspath(self.path), pos.offset,
                                     pos.lines, prefix))  # fmt: skip
        self._dirty.clear()
        return rows

    def _digest(self, pos: Position) -> str:
        if not self.growable:
            return self.head
        digest = self._prefix.get(pos)
        if digest is None:  # a whole CSV (or JSON Lines) file read sequentially: hash what was applied
            digest = self._prefix[pos] = prefix_hasher(self.path, pos.offset).hexdigest()
        return digest


def resolve(path: str, store: Store, names: frozenset[str]) -> InputFile:
    """What ``path`` is to ``store`` and how far each of ``names`` has it applied. Raises :class:`InputError`
    (one line) for a growable file whose applied bytes changed in place, or an unreadable file."""
    fmt, gzipped = detect_format(path)
    head, node = head_of(path), node_of(path)
    rows = store.file_progress(head, node)
    by_fid: dict[str, list[FileProgress]] = {}
    for row in rows:
        by_fid.setdefault(row.fid, []).append(row)
    fresh = dict.fromkeys(names, Position())
    if not growable(fmt, gzipped):
        found = by_fid.get(head, [])
        applied = fresh | {r.name: Position(r.end, r.lines) for r in found if r.name in names}
        return InputFile(path, fmt, gzipped, head, node, head, applied)
    size = os.path.getsize(path)
    for fid, found in sorted(by_fid.items(), key=lambda kv: -max(r.end for r in kv[1])):
        far = max(found, key=lambda r: r.end)
        if far.end > size:
            continue
        hasher = prefix_hasher(path, far.end)
        if hasher.hexdigest() == far.prefix:
            applied = fresh | {r.name: Position(r.end, r.lines) for r in found if r.name in names}
            file = InputFile(path, fmt, gzipped, head, node, fid, applied)
            for r in found:
                file._prefix[Position(r.end, r.lines)] = r.prefix
            start = file.start  # usually where ``hasher`` stopped: one pass over the applied bytes
            file.hasher = hasher if start.offset == far.end else prefix_hasher(path, start.offset)
            return file
    same_node = [r for r in rows if r.node == node]
    if same_node:
        far = max(same_node, key=lambda r: r.end)
        raise InputError(
            f"{path!r} changed: the first {far.end:,} bytes, applied by an earlier run (as {far.path!r}), are not "
            "the same any more (rewritten or truncated in place); move it aside and give the new content another "
            "file, or use another store"
        )
    return InputFile(path, fmt, gzipped, head, node, None, fresh, prefix_hasher(path, 0))
