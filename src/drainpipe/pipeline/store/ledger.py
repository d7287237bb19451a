"""The idempotency ledger in memory: which (source, name) pairs are applied, counting pieces of a split source."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ..partials import PIECE_MARK, piece_of


class Ledger:
    """Recorded (source, name) pairs and what they say about a source: applied, partly applied or new.

    A source is applied for a name when it or an ancestor is recorded, or when, for some k, each of its k
    pieces ``"<source> ~i/k"`` is applied; it is partly applied when only some of that holds.
    """

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        self.names: set[str] = set()
        self._pairs: set[tuple[str, str]] = set()
        self._pieces: dict[tuple[str, str], dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
        self._touched: set[tuple[str, str]] = set()
        for source, name in pairs:
            self.add(source, name)

    def add(self, source: str, name: str) -> None:
        self.names.add(name)
        self._pairs.add((source, name))
        self._touched.add((source, name))
        while (piece := piece_of(source)) is not None:
            source, i, k = piece
            self._pieces[(source, name)][k].add(i)
            self._touched.add((source, name))

    def applied(self, source: str, name: str) -> bool:
        ancestor: str | None = source
        while ancestor is not None:
            if (ancestor, name) in self._pairs:
                return True
            piece = piece_of(ancestor)
            ancestor = piece[0] if piece else None
        return self._covered_by_pieces(source, name)

    def _covered_by_pieces(self, source: str, name: str) -> bool:
        for k, _seen in self._pieces.get((source, name), {}).items():
            if all(
                (piece := f"{source}{PIECE_MARK}{i}/{k}", name) in self._pairs or self._covered_by_pieces(piece, name)
                for i in range(1, k + 1)
            ):
                return True
        return False

    def _touches(self, source: str, name: str) -> bool:
        return (source, name) in self._touched or self.applied(source, name)

    def state(self, sources: Iterable[str], name: str) -> str:
        """ "applied" (every source applied; also for no sources: "new"), "new" (none touched) or "partly"."""
        sources = list(sources)
        if not sources:
            return "new"
        if all(self.applied(s, name) for s in sources):
            return "applied"
        if any(self._touches(s, name) for s in sources):
            return "partly"
        return "new"
