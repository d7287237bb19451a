"""Folds of the merge queue, where the database merges (:mod:`.database_merge`): the look at the queue every
writer does (:func:`fold_queue`), and the thread that does it for a writer in the background, on a connection of
its own (:class:`Folder`), so that no writer's commit waits for a fold::

    writer's commit (queued) ──wake()──> Folder thread ──> fold_queue(waited_s=after_s): every stripe whose oldest
                                            ^      │       queued commit waited after_s, folded if its lock is free
                                            │      │
                                            └──────┘ sleeps until the oldest mark (any writer's) is due by the
                                                     server's clock; a due stripe held by another fold: looks
                                                     again shortly; a failure: backs off, tries again

Why a thread: a fold that waits to add up the commits of every writer (``after_s``) takes several commits' rows,
and a writer that folded after its own commit waited for it there; a ``consume`` member on a small share of a core
then paused its reading (docs/performance.md, "Folds that wait five seconds"). The folder's connection is the
writer's second; a writer that never queues (a lone one: it merges at its commit) never starts one.

Every queued row is folded by some writer's folder once it is due (each folder watches every writer's marks), or,
if no writer runs, by the next store to open, read or close (:func:`fold_queue` with ``waited_s`` None).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ...errors import StoreError
from . import database_merge
from .backend import Backend

__all__ = ["FOLD_ROUNDS", "Folder", "fold_queue"]

log = logging.getLogger("drainpipe.store")

#: how many times a fold looks again at the stripes it folded, at most (:func:`fold_queue`)
FOLD_ROUNDS = 4
#: how long (s) a folder waits before it looks again at a due stripe another fold holds
HELD_PAUSE_S = 0.05
#: how long (s) a folder waits after a failed fold, at first (doubled at each failure, up to ``FAILED_PAUSE_S[1]``)
FAILED_PAUSE_S = (0.5, 30.0)


def fold_queue(backend: Backend, *, first: int, waited_s: float | None = None, wait: bool = False) -> int:
    """Merge the queued states of every writer into the stored ones, in ``backend``'s session; the rows folded. Never
    waits for a merge lock: each stripe whose queue holds committed rows (with ``waited_s``, a commit's queued at
    least that long ago) is folded in a statement of its own if its lock is free (:func:`~.database_merge.fold_now`)
    and left to the transaction that holds it otherwise; the stripes folded are looked at again while they hold such
    rows, at most :data:`FOLD_ROUNDS` times (writers that keep committing would keep it folding for ever). ``first``:
    the stripe to start from (writers that fold at once fold different stripes, on as many of the server's cores).
    ``wait`` (a store closing): each stripe folded under its lock, waited for, so a writer that stops leaves none of
    its rows queued.

    A stripe whose fold fails does not stop the look at the others; the first error is raised after it (raw inside
    the session, which maps it: :class:`StoreError`, or :class:`StoreUnavailable` for a lost connection). The states
    of a failed fold stay committed, queued, for the next one."""
    folded = 0
    failed: Exception | None = None
    with backend.session("merge queued states"):
        stripes = database_merge.queued_stripes(backend, waited_s)
        for _ in range(1 if wait else FOLD_ROUNDS):
            if not stripes:
                break
            taken = []
            for stripe in sorted(stripes, key=lambda s: (s - first) % database_merge.STRIPES):
                try:
                    done = _fold_stripe(backend, stripe, wait)
                except Exception as exc:  # (a lost connection fails the next statement too, and that is raised)
                    failed = failed or exc
                    continue
                if done is not None:
                    folded += done
                    taken.append(stripe)
            # (what others queued while this one held a stripe; a held stripe's holder looks after its own)
            looked = database_merge.queued_stripes(backend, waited_s) if taken else []
            stripes = [s for s in looked if s in taken]
        if failed is not None:
            raise failed
    return folded


def _fold_stripe(backend: Backend, stripe: int, wait: bool) -> int | None:
    """One stripe's fold: the rows folded, None when its lock is held (``wait``: waited for)."""
    if not wait:
        return database_merge.fold_now(backend, stripe)
    with backend.transaction():
        backend.lock_merges(stripe)
        return database_merge.fold(backend, stripe)


class Folder:
    """A writer's background folds: a thread with ``backend`` (a connection of its own to the store's database,
    opened on the thread; the schema is the store's work), which folds every stripe whose oldest queued commit has
    waited ``after_s`` (:func:`fold_queue`), when woken (:meth:`wake`, after the writer's commit queued) and when the
    oldest mark becomes due. ``vacuum(folded)``: told the rows each fold took (the store vacuums the queue now and
    then).

    Thread-safety: :meth:`wake` and :meth:`close` from any thread; the thread alone uses ``backend``. Errors never
    leave the thread: a failed fold is logged and tried again after a pause (the states are committed, queued)."""

    def __init__(self, backend: Backend, *, after_s: float, first: int,
                 vacuum: Callable[[Backend, int], None], label: str) -> None:  # fmt: skip
        self.after_s = after_s
        self._backend = backend
        self._first = first
        self._vacuum = vacuum
        self._label = label
        self._wake = threading.Event()
        self._stop = False  # (written before the last wake; read by the thread after each wait)
        self._thread = threading.Thread(target=self._run, name=f"drainpipe-fold {label}", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Look at the queue now (a commit queued states): non-blocking."""
        self._wake.set()

    def close(self) -> None:
        """Stop the thread (a fold in progress finishes first) and close its connection. Idempotent."""
        self._stop = True
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def alive(self) -> bool:
        """Whether the thread runs (a store starts another when not)."""
        return self._thread.is_alive()

    def _run(self) -> None:
        pause: float | None = 0.0  # (the first look at once: the wake that started it)
        failing = FAILED_PAUSE_S[0]
        opened = False
        try:
            while True:
                self._wake.wait(pause)
                self._wake.clear()  # (before the stop is read: a close's wake is never cleared unseen)
                if self._stop:
                    return
                try:
                    if not opened:
                        self._backend.open(None)  # (its staging relations only: the writer's store made the schema)
                        opened = True
                    self._vacuum(self._backend, fold_queue(self._backend, first=self._first, waited_s=self.after_s))
                    pause = self._until_due()
                    failing = FAILED_PAUSE_S[0]
                except Exception as exc:  # (never out of the thread: the states stay committed, queued)
                    if isinstance(exc, StoreError):  # (StoreUnavailable is one)
                        log.warning("%s: a background fold failed (%s); the states stay queued, tried again in "
                                    "%.1f s", self._label, exc, failing)  # fmt: skip
                    else:
                        log.exception("%s: a background fold failed; tried again in %.1f s", self._label, failing)
                    pause, failing = failing, min(failing * 2, FAILED_PAUSE_S[1])
        finally:
            self._backend.close()

    def _until_due(self) -> float | None:
        """Seconds until the oldest mark is due (None: nothing queued; a due stripe another fold holds: a short
        pause, then a look again)."""
        with self._backend.session("look at the queue"):
            wait = database_merge.until_due(self._backend, self.after_s)
        return None if wait is None else max(wait, HELD_PAUSE_S)
