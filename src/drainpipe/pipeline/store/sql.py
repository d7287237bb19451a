"""The SQL store: the :class:`~.protocol.Store` over a :class:`~.backend.Backend`, composed from the store's rooms.

=============== ===================================================================================================
:mod:`.schema`   the tables, and the migrations of a store written by an earlier version
:mod:`.merge`    the upsert-merge of states into the stored ones
:mod:`.books`    how far each input is applied (progress rows, committed with the states) and fencing tokens
:mod:`.registry` the definitions stored states were computed by
:mod:`.queries`  the read side
:mod:`.purge`    retention
=============== ===================================================================================================

A merge (:meth:`SqlStore.merge`) is one transaction, so a failure leaves nothing half-written: the fences are
checked, the definitions checked against the registry (states of a name computed differently are never merged), and
when the books already hold every progress row the call brings (a retry of a transaction that committed), nothing is
written; else the states are merged (where the database merges them, with every state queued before, or, while
another writer merges, queued for the fold that follows the commit: :mod:`.database_merge`) and the progress rows
recorded with them. Exactly once is these rows: merging states
is not idempotent by itself (merging a count twice doubles it), and a merge without progress rows is always applied.

Thread-safety: every method may be called from any thread; the store's lock serialises them (one connection per
store; a writer that queues also has a folder, a thread with a connection of its own: :mod:`.folder`). Writers
in several processes (a PostgreSQL store) are serialised by the backend's locks: the books' lock of the parts a
transaction writes (:meth:`~.backend.Backend.lock_books`), taken first in every writing transaction, and
a stripe's merge lock (:meth:`~.backend.Backend.lock_merges`), taken by every transaction that merges into the
stored states (a writer's merge at its commit and its folds take them only if no other transaction holds one: a
writer waits for no other's merge, but for a merge of chunks or a purge, which wait for every stripe). Blocking:
every method waits for the database. Errors: :class:`~drainpipe.errors.StoreError` (permanent: a closed store, a
definition stored with another signature, a database error) or :class:`~drainpipe.errors.StoreUnavailable` (worth
retrying: see the backend); :class:`~drainpipe.errors.Fenced` for a merge by a part's former owner.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ...errors import StoreError, StoreUnavailable
from ..clock import now_ms
from ..definitions import Definition
from ..partials import Partial
from ..retention import Retention
from . import books, database_merge, merge, purge, queries, registry, schema
from .backend import Backend
from .folder import Folder, fold_queue
from .protocol import MergeReport, PurgeReport, SourceProgress

log = logging.getLogger("drainpipe.store")

#: how long (s) queued states wait before a fold in the background takes them (:attr:`SqlStore.fold_after_s`)
FOLD_AFTER_S = 5.0


class SqlStore:
    """A store over ``backend``, which it opens (creating or migrating the schema) and owns; :class:`StoreError`
    when the database cannot be opened or used."""

    def __init__(self, backend: Backend, twin: Callable[[], Backend] | None = None) -> None:
        """``twin``: where the database merges, another connection to it (not opened), for this writer's folds in
        the background (:class:`~.folder.Folder`), made when it first queues."""
        if backend.merges_in_database and twin is None:
            raise StoreError(f"{backend!r} merges states itself: its store needs a second connection for its folds")
        self._lock = threading.RLock()
        self._closed = False
        #: queued rows this store folded since it last vacuumed the queue (under _vacuum_lock: the folder's too)
        self._folded = 0
        self._vacuum_lock = threading.Lock()
        #: the stripe this store's folds start from (see :func:`~.folder.fold_queue`)
        self._first_stripe = random.randrange(database_merge.STRIPES)
        #: where the database merges, how long queued states wait before a fold in the background takes them, so
        #: that one fold adds up the commits of every writer meanwhile and a key costs the server one upsert for all
        #: of them; a writer that finds rows waiting less queues its states rather than merging them at its commit.
        #: Reads, opens and closes fold at once: a query always sees every commit. Set before the first merge.
        self.fold_after_s = FOLD_AFTER_S
        self._twin = twin
        self._folder: Folder | None = None  # (made under _lock, at the first merge that queues)
        #: the time (epoch ms) progress rows record and purges measure against: drainpipe's clock
        #: (:func:`~drainpipe.pipeline.clock.now_ms`) unless a caller hands in its own, as tests do
        self.clock: Callable[[], int] = now_ms
        #: the database; public for tests and tools that look at the tables themselves
        self.backend = backend
        backend.open(self._prepare)
        with self._guard("merge queued states"):  # (states a writer queued and committed, but did not fold)
            self._fold_queued()

    def _prepare(self, migrate: bool) -> None:
        """What every new connection of the store's own runs."""
        schema.create(self.backend, migrate=migrate, clock=lambda: self.clock(), label=repr(self))

    def __repr__(self) -> str:
        return f"SqlStore({self.backend!r})"

    @contextmanager
    def _guard(self, action: str) -> Iterator[None]:
        with self._lock:
            if self._closed:
                raise StoreError(f"cannot {action}: the store is closed")
            with self.backend.session(action):
                yield

    @contextmanager
    def _write_transaction(self, parts: Collection[tuple[str, str]] | None = None, *, merges: bool = True
                           ) -> Iterator[None]:  # fmt: skip
        """A writing transaction under the books' lock of ``parts`` (None: the whole books), and with ``merges``
        every stripe's merge lock."""
        try:
            with self.backend.transaction():
                self.backend.lock_books(parts)
                if merges:
                    self.backend.lock_merges(None)
                yield
        except Exception:  # (a database error is raw here: the session outside maps it)
            if merges:
                self._fold_queued()  # (it held the merge locks: what writers queued meanwhile is its to look at)
            raise
        if merges and self.backend.merges_in_database:  # (what writers queued while it held the merge locks)
            self._fold()

    def _fold(self, *, wait: bool = False) -> None:
        """Merge the queued states of every writer into the stored ones at once (a database that merges them itself:
        :func:`~.folder.fold_queue`), on the store's connection: what a store that opens, reads or closes does, and a
        transaction that held every merge lock after its commit. ``wait`` (a store closing): each stripe folded under
        its lock, waited for, so a writer that stops leaves none of its rows queued.

        A fold that fails because the database is unavailable leaves the states committed (queued): the merge that
        queued them has succeeded, and the next fold of any writer takes them (a retried merge would queue them
        again). A stripe whose fold fails for another reason does not stop the look at the others; the first such
        error is raised after it."""
        try:
            folded = fold_queue(self.backend, first=self._first_stripe, wait=wait)
        except StoreUnavailable as exc:
            log.warning("%r: merging the queued states failed (%s); they are committed and merged later", self, exc)
            return
        self._vacuum_when_due(self.backend, folded)

    def _vacuum_when_due(self, backend: Backend, folded: int) -> None:
        """Count ``folded`` queued rows, and vacuum the queue every :data:`~.database_merge.VACUUM_ROWS` (on
        ``backend``: the store's connection or its folder's)."""
        with self._vacuum_lock:
            self._folded += folded
            due = self._folded >= database_merge.VACUUM_ROWS
            if due:
                self._folded = 0
        if due:
            try:
                with backend.session("vacuum the queue"):
                    database_merge.vacuum_queue(backend)
            except (StoreError, StoreUnavailable) as exc:  # (autovacuum does it later)
                log.warning("%r: %s", self, exc)

    def _fold_queued(self, *, wait: bool = False) -> None:
        """Where the database merges: a look at the queue, and a fold of what it holds (a store opening, a reader, a
        store closing; a writer that queued and then failed, or whose fold's lock holder failed, leaves rows there).
        A failure is logged, not raised: the next writer or open folds the states."""
        if self.backend.merges_in_database:
            try:
                self._fold(wait=wait)
            except StoreError as exc:
                log.warning("%r: queued states left for the next writer: %s", self, exc)

    # ----------------------------------------------------------------------------- writes

    def merge(
        self,
        partials: Iterable[Partial],
        *,
        rollup: bool = True,
        progress: Sequence[SourceProgress] = (),
        fences: Sequence[SourceProgress] = (),
    ) -> MergeReport:
        parts = list(partials)
        merge.check_partials(parts, rollup)
        with self._guard("merge"):
            merged_queue = None  # (the queued rows merged with this commit's states)
            fold_later = False  # (this commit queued states, or is a retry of one that may have)
            try:
                with self.backend.transaction():
                    # (this process's share of the work: before the locks)
                    writes = merge.Writes(self.backend, parts, rollup)
                    # the books of this merge's parts only: writers of other parts commit meanwhile
                    whole = self.backend.lock_books({(p.source, p.part) for p in (*progress, *fences)})
                    books.check_fences(self.backend, fences)
                    registry.check(self.backend, {p.definition for p in parts})
                    if progress and books.recorded(self.backend, progress):
                        report = MergeReport(applied=0, skipped=len(parts))
                        fold_later = self.backend.merges_in_database and not writes.empty
                    else:
                        # Where the database merges: at once, with every state queued before, when no merge runs and
                        # nothing queued is younger than fold_after_s (a lone writer, as a rule: its states never go
                        # through the queue); else queued, and a fold in the background merges every writer's once
                        # they have waited (a key costs the server one merge per fold, not one per writer).
                        if not self.backend.merges_in_database:
                            self.backend.lock_merges(None)
                            queue = False
                        else:  # (nothing to merge, or the whole books held: other writers' commits would wait for it)
                            due = database_merge.until_due(self.backend, self.fold_after_s)  # (None: none queued)
                            queue = writes.empty or whole or (due is not None and due > 0)
                            queue = queue or not self.backend.try_lock_merges()
                        folded = writes.apply(queue=queue)
                        if self.backend.merges_in_database and not queue:
                            merged_queue = folded
                        fold_later = self.backend.merges_in_database and queue and not writes.empty
                        # the tokens are recorded again with the progress: their record time moves on with it, so
                        # a retention purge of the books never takes the token of a part that is still being written
                        self._record_progress([*progress, *books.fence_rows(fences)])
                        report = MergeReport(applied=len(parts), skipped=0)
            except Exception:  # (it may have held the merge locks: what writers queued meanwhile is its to look at;
                self._fold_queued()  # a database error is raw here, the session outside maps it)
                raise
            if merged_queue is not None:
                self._vacuum_when_due(self.backend, merged_queue)
            if fold_later:
                # (folded in the background once it has waited, with every writer's commits meanwhile: no commit
                # waits for a fold; what others queue has their folders, and a store that opens, reads or closes
                # folds whatever is left)
                self._folder_started().wake()
        return report

    def _folder_started(self) -> Folder:
        """This writer's folder (started at the first call). Under the store's lock."""
        if self._folder is None or not self._folder.alive:
            assert self._twin is not None  # (checked at init: a database that merges itself has a twin)
            self._folder = Folder(self._twin(), after_s=self.fold_after_s, first=self._first_stripe,
                                  vacuum=self._vacuum_when_due, label=repr(self))  # fmt: skip
        return self._folder

    def merge_chunks(
        self, definitions: Iterable[Definition], chunks: Iterable[Partial], *, progress: Sequence[SourceProgress] = ()
    ) -> MergeReport:
        with self._guard("merge"), self._write_transaction():
            registry.check(self.backend, set(definitions))
            if progress and books.recorded(self.backend, progress):
                return MergeReport(applied=0, skipped=0)
            count = merge.write_chunks(self.backend, chunks)
            self._record_progress(progress)
        return MergeReport(applied=count, skipped=0)

    def _record_progress(self, progress: Sequence[SourceProgress]) -> None:
        """The last write of a merge's transaction (the kill tests hook it, ``tests/faults/txn_markers.py``, to land
        a kill between it and the COMMIT)."""
        books.record(self.backend, progress, self.clock())

    def fence(self, source: str, part: str) -> int:
        """Issue ``part``'s next fencing token (one transaction; the first is 1): from now on a merge carrying an
        older one for it raises :class:`~drainpipe.errors.Fenced`. A new owner of a part takes one before it reads
        the part's progress: a commit of the old owner lands before that read, and is seen, or after it, and is
        refused (:mod:`.books`)."""
        with self._guard("fence"), self._write_transaction({(source, part)}, merges=False):
            token = books.fence_of(self.backend, source, part) + 1
            self._record_progress([SourceProgress(source, part, books.FENCE, token)])
        return token

    def register(self, definitions: Iterable[Definition]) -> None:
        with self._guard("register definitions"), self._write_transaction((), merges=False):
            registry.check(self.backend, set(definitions))

    def purge(self, retention: Retention, now_ms: int | None = None) -> PurgeReport:
        """Delete, in one transaction, the rows older than ``retention`` allows at ``now_ms`` (default: the store's
        clock), progress rows included (:mod:`.purge`). Blocks other writers meanwhile."""
        now = self.clock() if now_ms is None else now_ms
        with self._guard("purge"), self._write_transaction():
            if self.backend.merges_in_database:  # (queued states are stored states: they are purged alike)
                database_merge.fold(self.backend, None)
            deleted = purge.purge(self.backend, retention, now)
        return PurgeReport(now, deleted)

    def reclaim(self) -> None:
        """Make the space of deleted rows reusable now (DuckDB: a checkpoint; PostgreSQL: VACUUM) rather than when
        the database gets round to it. Outside any transaction; blocks writers meanwhile."""
        with self._guard("reclaim"):
            self.backend.reclaim(schema.TABLES)

    # ----------------------------------------------------------------------------- reads

    def fence_token(self, source: str, part: str) -> int:
        """``part``'s latest fencing token (0: none issued)."""
        with self._guard("read a fence"):
            return books.fence_of(self.backend, source, part)

    def progress(
        self, source: str, *, part: str | None = None, head: str | None = None, node: str | None = None
    ) -> list[SourceProgress]:
        with self._guard("read"):
            return books.read(self.backend, source, part=part, head=head, node=node)

    def query(
        self,
        metric: str | None = None,
        entity: str | None = None,
        granularity: str | None = None,
        start: Any = None,
        end: Any = None,
        entity_prefix: str | None = None,
    ) -> list[tuple[str, str, str, str, str, float]]:
        with self._guard("query"):
            self._fold_queued()
            return queries.values(self.backend, metric, entity, granularity, start, end, entity_prefix)

    def query_topn(
        self, name: str, entity: str | None = None, start: Any = None, end: Any = None,
        entity_prefix: str | None = None,
    ) -> list[tuple[str, str, str, int, str, float]]:  # fmt: skip
        with self._guard("query"):
            self._fold_queued()
            return queries.topn(self.backend, name, entity, start, end, entity_prefix)

    def stored_names(self) -> dict[str, str]:
        with self._guard("query"):
            return registry.stored_names(self.backend)

    def size_bytes(self) -> int:
        """The space the store takes: its database file, or its tables with their indexes."""
        with self._guard("measure"):
            return self.backend.size_bytes(schema.TABLES)

    # ----------------------------------------------------------------------------- lifecycle

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                if self._folder is not None:
                    self._folder.close()
                self._fold_queued(wait=True)  # (waiting: a writer that stops leaves none of its rows queued)
                self._closed = True
                self.backend.close()

    def __enter__(self) -> SqlStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
