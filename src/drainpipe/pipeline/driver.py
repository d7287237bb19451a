"""The exactly-once driver: the books of a source's parts, kept once for every source and every engine.

::

    a part's reader ──batch, offset──> Driver.feed ──(the definitions that still need it)──> sink.ingest
                                         │
    Driver.checkpoint(marker) ──every part's advanced books + the dead letter flushed──> sink.checkpoint ──> Commit
                                         │                                     (states + positions, one transaction)
    Driver.reap() <── finished commits, in order: on_commit(marker) │ failed │ fenced
    Driver.rollback() ── wait for the queued commits, then discard what the sink holds uncommitted

Every source (``drainpipe run``'s files, ``serve``'s write-ahead log, a ``consume`` member's topic partitions,
Spark's file parts and Kafka micro-batches) reads its parts its own way (planned byte ranges, log records, fetched
messages, Spark tasks) and hands what it read here. What is the same for all lives here and nowhere else:

* **the policy**: data starting at a position is aggregated for the definitions that have applied the part no
  further than that position (:meth:`PartBooks.names_from`), and skipped when none has: a definition added later
  catches up while the others skip what they have (:meth:`wanted`, :meth:`definitions_for`); data grouped by those
  definitions is committed the fewest definitions first (:meth:`in_order`);
* **the checkpoint**: the rows of every held part's advanced books, with the rejects of what they cover flushed to
  the dead letter first, and the held parts' fencing tokens, go to the sink, which commits them in the same
  transaction as the states (:meth:`checkpoint`);
* **pending commits**: a checkpoint is due every ``checkpoint_s``, but not while the one before waits for the store
  (up to ``max_checkpoint_s``), and not sooner than :data:`PACE` times as long as the last commit took (up to
  ``max_checkpoint_s`` too): a store slower than the checkpoints gets fewer, larger commits, not a queue of small
  ones, and a commit that grows costly (many entities, many periods touched) takes a bounded share of the time
  instead of a growing one. That is how writers sharing one store scale, and how one writer under a heavy load
  keeps its cores for the events: a commit's cost is mostly fixed (the minute, hour and day states of every entity
  it touches are rewritten, whatever the events it brings), so as it grows it is paid less often. At most
  ``max_commits`` are queued (:attr:`behind`: the reader stops reading, so what waits for the store waits in the
  source, not in memory), reaped in order (:meth:`reap`); a commit that fails for good
  stops the driver (:attr:`failed`), a fenced one (another owner holds a part now) is reported to the source;
* **rollback**: when a part is lost (a file that cannot be read, a partition taken away), everything not committed
  is dropped and the part is read again from the store's position (:meth:`rollback`).

The sink is where states are committed (:class:`Sink`): :class:`~drainpipe.pipeline.LocalEngine`, whose ``ingest``
the driver feeds (``ingest=engine.ingest``), or a Spark job's driver-side merge, whose states Spark's tasks made.

Thread-safety: none. One thread, the source's reader, owns a driver (its books, queue and counters); the sink's
commits complete on other threads, which only set a :class:`Commit`'s ``done``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ..inputs import DeadLetter, EventBatch
from .definitions import Definitions
from .progress import PartBooks
from .store import SourceProgress

__all__ = ["Commit", "Driver", "Sink"]

log = logging.getLogger("drainpipe.pipeline")
T = TypeVar("T")


@dataclass
class Commit:
    """One commit of a sink: the states made since the last one, in one transaction with ``progress`` (or, with
    ``rollback``, discarded). On the local engine, a marker on the persist queue behind everything produced before
    it. ``done`` is set once that has happened (by the thread that committed); ``error`` is the failure, if any."""

    progress: list[SourceProgress]
    events: int
    rollback: bool = False
    fences: list[SourceProgress] = field(default_factory=list)  # the writer's tokens (Store.merge's ``fences``)
    done: threading.Event = field(default_factory=threading.Event)
    error: str = ""
    fenced: bool = False  # refused for a stale fencing token: its states are discarded, later commits go on
    # when it was done (``time.monotonic()``, the clock a driver reads unless a test hands it another): what the next
    # checkpoint's pace is measured by
    finished: float = 0.0

    def finish(self) -> None:
        """Done (stored, fenced or failed, as ``error`` and ``fenced`` say): called once, by the committing thread."""
        self.finished = time.monotonic()
        self.done.set()


class Sink(Protocol):
    """Where a driver's commits go: :class:`~drainpipe.pipeline.LocalEngine` is one (its ``checkpoint`` commits the
    states it made with the rows given, in one transaction); a Spark job's driver-side merge is another."""

    def checkpoint(self, progress: Sequence[SourceProgress], events: int, *, wait: bool = False,
                   rollback: bool = False, fences: Sequence[SourceProgress] = ()) -> Commit: ...  # fmt: skip


#: how many checkpoint intervals a checkpoint waits for the commit before it, at most (``max_checkpoint_s``)
STRETCH = 5

#: a checkpoint comes no sooner than this many times as long as the last commit took (from its checkpoint until the
#: store had it), up to ``max_checkpoint_s``: the commits' share of the time stays about 1/PACE. Measured on
#: ``serve`` under a saturated OTLP load whose exports touch 17 minutes each: a commit (~120k state rows, the
#: minutes, hours and days of every entity) took 0.6-1.3 s, so checkpoints every 2 s gave the store a fifth to a
#: third of the process's CPU (docs/performance.md, "Checkpoints paced by their cost"). At 20 rather than 10: at a
#: steady 150k spans/s a commit (100-115k state rows, most of them the percentiles' histogram bins) took 0.12-0.3 s
#: of the persist thread's CPU, a seventh of the process's at every 3 s; every 6 s, the same bins are merged half
#: as often (docs/performance.md, "Idle wake-ups, and commits half as often").
PACE = 20


class Driver:
    """The books of the parts one reader holds, and the commits that carry them; see the module docstring.

    ``ingest(batch, definitions=)``: where :meth:`feed` hands batches (the engine's ``ingest``; None for a sink
    whose states were made elsewhere, e.g. by Spark's tasks); ``checkpoint_s``: how often :attr:`due` says a
    checkpoint is, and ``max_checkpoint_s`` how long it may wait for the commit before it (default :data:`STRETCH`
    intervals); ``max_commits``: commits queued before :attr:`behind`; ``on_commit(marker)``: called (on the
    reader's thread, from :meth:`reap`) for each commit the store has, in order; ``observe(batch)``: sees every
    batch fed (the live RED metrics), and its errors are logged, never raised; ``clock``: ``time.monotonic``, which
    :meth:`Commit.finish` stamps with too (a test that hands in its own sets the commits' ``finished`` by it)."""

    def __init__(
        self,
        definitions: Definitions,
        sink: Sink,
        *,
        ingest: Callable[..., Any] | None = None,
        dead_letter: DeadLetter | None = None,
        checkpoint_s: float = 2.0,
        max_checkpoint_s: float | None = None,
        max_commits: int = 2,
        on_commit: Callable[[Any], None] | None = None,
        observe: Callable[[Any], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.definitions = definitions
        self.sink = sink
        self._ingest = ingest
        self.dead_letter = dead_letter
        self.checkpoint_s = checkpoint_s
        self.max_checkpoint_s = (
            STRETCH * checkpoint_s if max_checkpoint_s is None else max(checkpoint_s, max_checkpoint_s)
        )
        self.max_commits = max_commits
        self.on_commit = on_commit
        self.observe = observe
        self.names = frozenset(definitions.names)
        #: the parts held: key -> (books, fencing token or None). A part's books advance as the reader goes.
        self.parts: dict[Hashable, tuple[PartBooks, int | None]] = {}
        self.failed = ""  # a commit failed for good: the reason (nothing after it may be committed)
        self.stored_events = 0  # events of the commits the store has (reaped)
        self.fenced_commits = 0
        self.uncommitted = 0  # events fed since the last checkpoint
        self.last_commit_s = 0.0  # how long the last commit reaped took, from its checkpoint until the store had it
        self._previous_finished = 0.0  # when the commit reaped before it was done
        self._clock = clock
        self._queued: deque[tuple[Commit, Any, float]] = deque()
        self._last = clock()
        self._subsets: dict[frozenset[str], Definitions | None] = {self.names: None}

    # ------------------------------------------------------------------ parts

    def hold(self, key: Hashable, books: PartBooks, token: int | None = None) -> None:
        """Hold a part from now on (its books as the store has them; ``token``: the fencing token the store issued
        for it, which every later commit carries)."""
        self.parts[key] = (books, token)

    def release(self, key: Hashable) -> None:
        """Stop holding a part (after its last commit, or when it was lost)."""
        self.parts.pop(key, None)

    # ------------------------------------------------------------------ the policy, and feeding

    def wanted(self, books: PartBooks, offset: int) -> frozenset[str]:
        """The definitions that need a part's data starting at ``offset`` (empty: every one has it)."""
        return books.names_from(offset)

    @staticmethod
    def in_order(groups: Mapping[frozenset[str], T]) -> list[tuple[frozenset[str], T]]:
        """Groups of data keyed by the definitions that need them, in the order to commit them: the fewest
        definitions first. Along a part the set only grows (a definition behind the others needs everything the
        others need, and more before it), so this commits every part's earlier data first: a commit never advances
        a definition past data of the same part still to come in a later commit, which a crash in between would
        lose."""
        return sorted(groups.items(), key=lambda item: len(item[0]))

    def definitions_for(self, names: frozenset[str]) -> Definitions | None:
        """``names`` as the sink takes them: None for all of them, else the subset (made once per set)."""
        if names not in self._subsets:
            self._subsets[names] = self.definitions.select(sorted(names))
        return self._subsets[names]

    def feed(self, batch: EventBatch, names: frozenset[str]) -> None:
        """Hand ``batch`` to ``ingest`` for ``names`` (skipped when empty); its rows (requests and exit rows: each
        is an accepted event of its reader) count towards the next checkpoint. ``observe`` sees it; an error there
        is logged, never raised: the traffic's metrics must not stop feeding the store."""
        if not names:
            return
        assert self._ingest is not None, "a driver without ingest is fed partials (fed()), not batches"
        self._ingest(batch, definitions=self.definitions_for(names))
        self.uncommitted += batch.num_rows
        self._observe(batch)

    def fed(self, events: int) -> None:
        """Count ``events`` handed to the sink another way (partials aggregated elsewhere: ``run``'s workers,
        Spark's tasks)."""
        self.uncommitted += events

    def _observe(self, batch: EventBatch) -> None:
        if self.observe is not None:
            try:
                self.observe(batch)
            except Exception:  # the traffic's metrics must not stop feeding the store
                log.exception("observing a batch for the RED metrics failed")

    # ------------------------------------------------------------------ checkpoints

    @property
    def due(self) -> bool:
        """:attr:`interval` has passed since the last checkpoint and the store has it; or, while the store still
        works on it, ``max_checkpoint_s`` has passed."""
        elapsed = self._clock() - self._last
        if elapsed < self.interval:
            return False
        return elapsed >= self.max_checkpoint_s or not self._queued or self._queued[-1][0].done.is_set()

    @property
    def interval(self) -> float:
        """The time between checkpoints now: ``checkpoint_s``, or :data:`PACE` times the last commit's duration when
        that is longer, at most ``max_checkpoint_s``."""
        return min(self.max_checkpoint_s, max(self.checkpoint_s, PACE * self.last_commit_s))

    @property
    def behind(self) -> bool:
        """``max_commits`` commits are queued: the store is behind; read nothing until :meth:`wait_for_store`."""
        return len(self._queued) >= self.max_commits

    @property
    def queued(self) -> int:
        """Commits not yet reaped."""
        return len(self._queued)

    def checkpoint(self, marker: Any = None, *, wait: bool = False) -> Commit | None:
        """Commit everything fed so far with every held part's advanced books (not waiting for the store unless
        ``wait``); None when there is nothing to commit. The dead letter is flushed first: the rejects of what a
        commit covers are on disk before it (at least once; the store is exactly once)."""
        self._last = self._clock()
        rows = [row for books, _ in self.parts.values() for row in books.rows()]
        if not rows and not self.uncommitted:
            return None
        if self.dead_letter is not None:
            self.dead_letter.flush()
        fences = [SourceProgress(b.source, b.part, "fence", t) for b, t in self.parts.values() if t is not None]
        commit = self.sink.checkpoint(rows, self.uncommitted, wait=wait, fences=fences)
        self._queued.append((commit, marker, self._last))
        self.uncommitted = 0
        if wait:
            self.reap()
        return commit

    def reap(self) -> bool:
        """Take in the finished commits, in order: ``on_commit`` for each the store has. Stops at a commit that
        failed for good (:attr:`failed` says why) or was fenced; returns True for a fenced one (another owner
        holds one of the parts now: the source rolls back and drops the parts whose token moved on)."""
        while self._queued and self._queued[0][0].done.is_set():
            commit, marker, started = self._queued.popleft()
            # From the commit's own stamp (a reader that reaps late, idle or busy with a long part, must not stretch
            # it), and from when the commit before it was done if it was queued behind that one: its own work only.
            finished = commit.finished or self._clock()
            self.last_commit_s = max(0.0, finished - max(started, self._previous_finished))
            self._previous_finished = finished
            if commit.fenced:
                self.fenced_commits += 1
                return True
            if commit.error:
                self.failed = commit.error
                return False
            self.stored_events += commit.events
            if self.on_commit is not None:
                self.on_commit(marker)
        return False

    def wait_for_store(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the oldest queued commit (returns at once when none is queued)."""
        if self._queued:
            self._queued[0][0].done.wait(timeout_s)

    def drain(self) -> bool:
        """Wait until every queued commit is done (or one failed); True if one was fenced."""
        while self._queued and not self.failed:
            self.wait_for_store(0.1)
            if self.reap():
                return True
        return False

    def rollback(self) -> None:
        """Drop everything fed since the last checkpoint, after the queued commits are done (each is stored,
        fenced in turn, or failed: :attr:`failed`). The parts' books are the caller's to reopen from the store."""
        while self._queued:
            self.wait_for_store(0.1)
            if self._queued[0][0].done.is_set():
                commit, marker, _ = self._queued.popleft()
                if commit.fenced:
                    self.fenced_commits += 1
                elif commit.error:
                    self.failed = self.failed or commit.error
                else:
                    self.stored_events += commit.events
                    if self.on_commit is not None:
                        self.on_commit(marker)
        self.sink.checkpoint([], 0, rollback=True, wait=True)
        self.uncommitted = 0
