"""The store protocol and the records it speaks in: what a merge reports, what a purge reports, and how far an
input is applied (:class:`SourceProgress`, committed with the states it brought)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..definitions import Definition
from ..partials import Partial
from ..retention import Retention

DEFAULT_STORE_URL = "duckdb:///drainpipe.duckdb"


@dataclass(frozen=True)
class SourceProgress:
    """How far one part of a source is applied for one definition, recorded in the same transaction as the states it
    brought (so a killed engine leaves each part applied up to a commit, for every definition alike).

    ``source`` and ``part`` name the part (:mod:`drainpipe.inputs.source`): ``"file"`` and the file's identity
    (see :mod:`drainpipe.pipeline.progress`), ``"log"`` and the write-ahead log's key, ... ``end``/``lines`` say
    where the applied data ends (bytes and lines of a text file, rows of Parquet, a log offset; ``-1``: the whole of
    an immutable file). Files only: ``head`` and ``node`` are what a file is looked up by, ``path`` where it was,
    and ``prefix`` the digest (XXH3-128, or SHA-256 from earlier versions) of a text file's bytes before ``end``."""

    source: str
    part: str
    name: str
    end: int
    lines: int = 0
    head: str = ""
    node: str = ""
    path: str = ""
    prefix: str = ""


@dataclass(frozen=True)
class PurgeReport:
    """What one :meth:`SqlStore.purge` did: the time it purged for, and rows deleted per table."""

    now_ms: int
    deleted: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.deleted.values())


@dataclass(frozen=True)
class MergeReport:
    """What one :meth:`Store.merge` call did."""

    applied: int  # partials (or chunks) merged
    skipped: int  # partials not merged because the store's books held every progress row of the call already


@runtime_checkable
class Store(Protocol):
    """Where metric states and values live. Implementations are thread-safe."""

    def merge(
        self,
        partials: Iterable[Partial],
        *,
        rollup: bool = True,
        progress: Sequence[SourceProgress] = (),
        fences: Sequence[SourceProgress] = (),
    ) -> MergeReport:
        """Upsert-merge metric and top-N partials in one transaction (see :mod:`drainpipe.pipeline.store.sql`),
        with ``progress``, the rows that say how far the input they hold is applied (the store's books): when the
        books hold every one of them already, nothing is written (``skipped``). ``fences``: the fencing tokens
        (:meth:`fence`) of the parts the writer owns, as rows whose ``end`` is the token; when one is no longer the
        part's latest, :class:`~drainpipe.errors.Fenced` and nothing is written.

        With ``rollup`` (the default) metric partials must be minute states, and they also update the hour
        and day buckets. With ``rollup=False`` each partial updates its own granularity only.

        When it returns, queries see the states, with one exception: a store whose database merges queued states
        (PostgreSQL) whose merge after the commit failed with the database unavailable; the merge has then
        succeeded (its states are committed) and the next merge, query or close, or any writer, merges them. If
        that merge fails otherwise (a permanent error), this raises though the commit landed: the progress rows
        committed with the states keep a rerun from applying them twice.
        """
        ...

    def merge_chunks(
        self, definitions: Iterable[Definition], chunks: Iterable[Partial], *, progress: Sequence[SourceProgress] = ()
    ) -> MergeReport:
        """:meth:`merge` for states too large to hold at once: ``chunks`` (minute metric states and top-N rows of
        ``definitions``; ``progress`` makes the write exactly once, as for :meth:`merge`) are written as they come, in
        one transaction, so memory holds a chunk and not the whole output. Chunks of one definition may share keys.
        """
        ...

    def fence(self, source: str, part: str) -> int:
        """Issue ``part``'s next fencing token: merges carrying an older one are refused from now on."""
        ...

    def fence_token(self, source: str, part: str) -> int:
        """``part``'s latest fencing token (0: none issued)."""
        ...

    def purge(self, retention: Retention, now_ms: int | None = None) -> PurgeReport:
        """Delete, in one transaction, what ``retention`` no longer keeps at ``now_ms`` (default: now), old progress
        rows included (see :mod:`drainpipe.pipeline.retention`)."""
        ...

    def reclaim(self) -> None:
        """Make the space of deleted rows reusable now."""
        ...

    def size_bytes(self) -> int:
        """The space the store takes."""
        ...

    def register(self, definitions: Iterable[Definition]) -> None:
        """Check each definition against the one stored under its name (and record new ones), before any data is
        read; :class:`StoreError` naming the first that was stored with a different definition."""
        ...

    def progress(
        self, source: str, *, part: str | None = None, head: str | None = None, node: str | None = None
    ) -> list[SourceProgress]:
        """The progress rows of ``source``: of its ``part`` if given; with ``head``/``node`` (files), the rows of
        the files with this head fingerprint or this device/inode. Ordered by part and definition."""
        ...

    def query(
        self,
        metric: str | None = None,
        entity: str | None = None,
        granularity: str | None = None,
        start: Any = None,
        end: Any = None,
        entity_prefix: str | None = None,
    ) -> list[tuple[str, str, str, str, str, float]]:
        """Value rows ``(metric, entity, granularity, time_bucket, label, value)`` ordered by those columns;
        ``start``/``end`` (ISO-8601 text, datetime or epoch ms) bound ``time_bucket`` inclusively;
        ``entity_prefix`` keeps the entities starting with it (``"checkout/"``: the service's endpoints and
        instances)."""
        ...

    def query_topn(
        self, name: str, entity: str | None = None, start: Any = None, end: Any = None,
        entity_prefix: str | None = None,
    ) -> list[tuple[str, str, str, int, str, float]]:  # fmt: skip
        """Top-N rows ``(name, entity, time_bucket, rank, key, latency_ms)`` ordered by those columns; the bounds
        and ``entity_prefix`` as :meth:`query` takes them."""
        ...

    def stored_names(self) -> dict[str, str]:
        """The definitions the store holds states of: name -> ``"metric"`` or ``"topn"``."""
        ...

    def close(self) -> None: ...
