"""Exactly once for every source: how far each part of a source is applied, per definition, and where to resume.

A store records, per (source, part, definition), the position applied (:class:`~.store.SourceProgress`), in the
same transaction as the states that data brought. Engines commit only at positions a part's reader gave
(:meth:`~drainpipe.inputs.SourcePart.snapshot`, or a planned range's end), for every definition alike, so an engine
killed at any instant leaves each part applied up to such a position, and the next one resumes there: the result
equals an uninterrupted run. :class:`PartBooks` keeps one part's books (:func:`open_books` reads them from the
store); a definition added later reads what it has not applied while the others skip it
(:meth:`PartBooks.names_from`).

Files need more than a name to be found again (:class:`InputFile`, :func:`resolve`). What counts as the same file:

* Uncompressed JSON Lines and CSV can grow (logs). Such a file is found again by the fingerprint of its head
  (:func:`~drainpipe.inputs.head_of`) or by its device and inode, and it is the same file when its first ``end``
  bytes still hash to what was recorded: then only what lies beyond ``end`` is read (complete lines only; a
  partial last line waits). A copy or a renamed (rotated) file is found by its head and counted once. A file whose
  applied bytes changed in place (same inode, other content: rewritten or truncated) is refused: counting it again
  would count its old events twice, and skipping it would lose its new ones.
* Compressed files and Parquet are immutable: they are named by a hash of their whole content. The same bytes
  under another name are the same input; other bytes under the same name are a new input.
* ``events.jsonl`` and ``events.jsonl.gz`` with the same events are different bytes: two inputs.

A file's part name in the store (its ``fid``) is, for a growable file, the hash of its first applied prefix (fixed
at its first commit); for an immutable file, its content hash.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..inputs import FileSource, Position, detect_format, growable, head_of, node_of, prefix_hasher
from .store import SourceProgress, Store

__all__ = ["COMPLETE", "InputFile", "PartBooks", "books_from", "open_books", "resolve"]

#: the whole of an immutable file is applied
COMPLETE = Position(-1, -1)


@dataclass
class PartBooks:
    """How far one part of a source is applied, per definition: read from the store (:func:`open_books`), advanced
    as data is applied, and turned into the rows to commit with it (:meth:`rows`). Not thread-safe: the one thread
    that reads the part owns it."""

    source: str
    part: str  # "" for a growable file seen for the first time (:class:`InputFile` names it at its first commit)
    applied: dict[str, Position]  # per definition name; Position() = nothing yet, COMPLETE = all of it
    advanced: bool = False  # this run applied something of it
    _dirty: set[str] = field(default_factory=set)
    _every: tuple[int, frozenset[str]] | None = None  # (the greatest open offset, the open names): names_from's cache

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
        """The definitions to aggregate for data starting at ``offset``: those applied no further than it. This is
        the one policy for every source (:mod:`.driver`); called per record or message, so the common answer (past
        every definition's position: all those not complete) is kept until the books advance."""
        if self._every is None:
            open_ = {n: p.offset for n, p in self.applied.items() if p != COMPLETE}
            self._every = (max(open_.values(), default=0), frozenset(open_))
        if offset >= self._every[0]:
            return self._every[1]
        return frozenset(n for n, p in self.applied.items() if p != COMPLETE and p.offset <= offset)

    def names_until(self, offset: int) -> tuple[frozenset[str], float]:
        """:meth:`names_from` ``offset``, and the first offset past it where the answer may differ (``math.inf``:
        none): until the books advance, every offset from ``offset`` up to there has the same definitions. For a
        reader of many small records (Kafka messages), which asks once per run of them."""
        later = [p.offset for p in self.applied.values() if p != COMPLETE and p.offset > offset]
        return self.names_from(offset), min(later, default=math.inf)

    def advance(self, names: Collection[str], end: Position | None) -> None:
        """``names`` now have the part applied up to ``end`` (None: the whole of an immutable file). A definition
        already applied further keeps its position."""
        target = COMPLETE if end is None else end
        for name in names:
            now = self.applied[name]
            if now != target and now != COMPLETE and (target == COMPLETE or target.offset > now.offset):
                self.applied[name] = target
                self._dirty.add(name)
                self.advanced = True
                self._every = None

    def rows(self) -> list[SourceProgress]:
        """Rows for the definitions advanced since the last call."""
        if not self._dirty:
            return []
        rows = [self._row(name, self.applied[name]) for name in sorted(self._dirty)]
        self._dirty.clear()
        return rows

    def _row(self, name: str, pos: Position) -> SourceProgress:
        return SourceProgress(self.source, self.part, name, pos.offset, pos.lines)


def open_books(store: Store, source: str, part: str, names: Collection[str]) -> PartBooks:
    """The books of ``part`` of ``source`` for the definitions ``names``, as the store has them."""
    return books_from(source, part, names, store.progress(source, part=part))


def books_from(source: str, part: str, names: Collection[str], rows: Iterable[SourceProgress] = ()) -> PartBooks:
    """The books of ``part`` from the store's progress ``rows`` of it (those of other definitions are ignored);
    a definition without a row is at the part's start. For a reader that reads many parts' rows in one query."""
    found = {r.name: Position(r.end, r.lines) for r in rows if r.name in names}
    return PartBooks(source, part, dict.fromkeys(names, Position()) | found)


@dataclass
class InputFile(PartBooks):
    """One input file of a run (a part of the file source), with what identifies it (see the module docstring)."""

    path: str = ""
    fmt: str = ""
    gzipped: bool = False
    head: str = ""
    node: str = ""
    hasher: Any = None  # growable: the prefix hasher (inputs.prefix_hasher) fed the file's bytes before ``start``
    _prefix: dict[Position, str] = field(default_factory=dict)  # digest of the bytes before a position

    @property
    def growable(self) -> bool:
        return growable(self.fmt, self.gzipped)

    def advance(self, names: Collection[str], end: Position | None, prefix: str = "") -> None:
        """``names`` now have the file applied up to ``end`` (None: the whole of an immutable file); ``prefix``:
        the digest of the file's bytes before ``end``, if known."""
        if prefix:
            self._prefix[COMPLETE if end is None else end] = prefix
        super().advance(names, end)

    def pending(self) -> int:
        """Bytes of a growable file after its last applied complete line: a partial last line left for later."""
        if not self.growable:
            return 0
        ends = [p.offset for p in self.applied.values() if p != COMPLETE]
        return max(0, os.path.getsize(self.path) - max(ends, default=0))

    def rows(self) -> list[SourceProgress]:
        if self._dirty and not self.part:  # a growable file's first commit names it
            first = min((self.applied[n] for n in self._dirty), key=lambda p: p.offset)
            self.part = self._digest(first)[:24]
        return super().rows()

    def _row(self, name: str, pos: Position) -> SourceProgress:
        prefix = self._digest(pos) if self.growable else ""
        return SourceProgress(self.source, self.part, name, pos.offset, pos.lines, self.head, self.node,
                              os.path.abspath(self.path), prefix)  # fmt: skip

    def _digest(self, pos: Position) -> str:
        if not self.growable:
            return self.head
        digest = self._prefix.get(pos)
        if digest is None:  # a whole CSV (or JSON Lines) file read sequentially: hash what was applied
            like = next(iter(self._prefix.values()), "")  # the algorithm of the digests the store has
            digest = self._prefix[pos] = prefix_hasher(self.path, pos.offset, like).hexdigest()
        return digest


def resolve(path: str, store: Store, names: frozenset[str]) -> InputFile:
    """What ``path`` is to ``store`` and how far each of ``names`` has it applied. Raises :class:`InputError`
    (one line) for a growable file whose applied bytes changed in place, or an unreadable file."""
    fmt, gzipped = detect_format(path)
    head, node = head_of(path), node_of(path)
    rows = store.progress(FileSource.name, head=head, node=node)
    by_fid: dict[str, list[SourceProgress]] = {}
    for row in rows:
        by_fid.setdefault(row.part, []).append(row)
    fresh = dict.fromkeys(names, Position())

    def file(fid: str, found: list[SourceProgress], hasher: Any = None) -> InputFile:
        applied = fresh | {r.name: Position(r.end, r.lines) for r in found if r.name in names}
        return InputFile(FileSource.name, fid, applied, path=path, fmt=fmt, gzipped=gzipped, head=head, node=node,
                         hasher=hasher)  # fmt: skip

    if not growable(fmt, gzipped):
        return file(head, by_fid.get(head, []))
    size = os.path.getsize(path)
    for fid, found in sorted(by_fid.items(), key=lambda kv: -max(r.end for r in kv[1])):
        far = max(found, key=lambda r: r.end)
        if far.end > size:
            continue
        hasher = prefix_hasher(path, far.end, far.prefix)
        if hasher.hexdigest() == far.prefix:
            known = file(fid, found)
            for r in found:
                known._prefix[Position(r.end, r.lines)] = r.prefix
            start = known.start  # usually where ``hasher`` stopped: one pass over the applied bytes
            known.hasher = hasher if start.offset == far.end else prefix_hasher(path, start.offset, far.prefix)
            return known
    same_node = [r for r in rows if r.node == node]
    if same_node:
        far = max(same_node, key=lambda r: r.end)
        raise InputError(
            f"{path!r} changed: the first {far.end:,} bytes, applied by an earlier run (as {far.path!r}), are not "
            "the same any more (rewritten or truncated in place); move it aside and give the new content another "
            "file, or use another store"
        )
    return file("", [], prefix_hasher(path, 0))
