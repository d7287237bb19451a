"""The engine as a consumer of the log: batches go from the event log into the engine in log order, and the log
position they reach is committed in the same store transaction as the states they brought.

Request threads only append to the log (and answer once it is durable); one feeder thread reads the log, a
partitioned source of one part (:class:`~.log_source.LogSource`), from the position the store has applied
(:func:`~drainpipe.pipeline.open_books`) and ingests each batch. Every ``checkpoint_s`` it asks the engine for a
checkpoint (:meth:`LocalEngine.checkpoint`), with the part's books: a :class:`SourceProgress` row per definition that
says "this log, applied up to this position". A kill at any instant therefore leaves the store at the end of some
committed checkpoint, and the next start replays the log from exactly there: every acknowledged event is counted once.

Recovery is the same loop started from the store's position; the server answers requests meanwhile (they append
after the replayed records). When the store is slow or down, commits queue up; at ``max_commits`` outstanding the
feeder stops reading, so what waits for the store waits in the log, not in memory. A commit that fails for good
(not "unavailable") stops the feeder: nothing after it may be committed, the data stays in the log, and the
service reports the reason (unhealthy, 503).

The books, the checkpoints, the queued commits and their reaping are the :class:`~drainpipe.pipeline.Driver`'s, as
for every source; what is the feeder's own is the log: gathering live records into batches, and releasing the log
up to what the store has.

Thread-safety: one feeder thread owns the reader, the driver and the engine's intake; ``position``, ``committed``,
``failed`` are read by others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..inputs import EventBatch, Position
from ..pipeline import Definitions, Driver, LocalEngine, PartBooks, open_books
from .log_source import LogPart, LogSource
from .wal import EventLog

log = logging.getLogger("drainpipe.server")

__all__ = ["Feeder"]

READ_RECORDS = 64  # records taken from the log at a time
#: requests per batch handed to the engine. Exit rows (a CLIENT span's statement, see ``EventBatch``) are not
#: counted: they feed one top-N only, and counting them handed OTLP traffic to the engine in batches of a quarter
#: fewer requests, with the engine's cost per batch spread over fewer requests. All rows stay within twice that.
#: 131,072 (with :data:`GATHER_S` 0.5 s and the engine's chunks as large): a saturated server's spans per CPU second
#: 1.06x-1.33x those of 32,768 in 0.2 s (seven pairs of runs in turns), its PSS peaks the same once a batch's records
#: go before it is fed (see _ingest); at a fixed 150k spans/s the CPU the same, the p99 of an export 1-3 ms longer in
#: some runs (the engine's C kernels hold the GIL for a whole call over a batch).
COALESCE_EVENTS = 131_072
COALESCE_ROWS = 2 * COALESCE_EVENTS
#: the Arrow bytes of one engine batch's records at most (a record alone may hold more): records join into one
#: batch, and two large records (a request's events reach 512 MiB) could pass Arrow's 2 GiB of text in a column
COALESCE_BYTES = 512 << 20
#: how long live records are gathered into one batch. The engine's cost is per batch as much as per event: at a
#: fixed 293 exports/s of 512 spans, 0.2 s (about 60 requests a batch) took the server's CPU a request from 2.59 ms to
#: 2.03 ms against 0.05 s (medians of 4 runs in turns; the ingest thread's share halved), the answers unchanged (the
#: requests are answered once logged) and the stored minutes 0.15 s later; 0.5 s with batches four times as large
#: (see :data:`COALESCE_EVENTS`): the store is written at checkpoints, every 2 s by default, anyway
GATHER_S = 0.5
ABORT_JOIN_S = 10.0  # after the grace: how long the feeder may take to hand over the batch it is feeding


def _take(part: LogPart, events: int, rows: int) -> list[tuple[int, EventBatch]]:
    """Up to :data:`READ_RECORDS` (end position, batch) records available now for a batch that holds ``events``
    requests and ``rows`` rows so far: none once it is full, and no more after the record that fills it (the
    records after it stay in the part, not held here until the next batch)."""
    out: list[tuple[int, EventBatch]] = []
    while (
        len(out) < READ_RECORDS
        and events < COALESCE_EVENTS
        and rows < COALESCE_ROWS
        and (batch := part.next_batch()) is not None
    ):
        out.append((part.snapshot().offset, batch))
        events, rows = events + batch.requests, rows + batch.num_rows
    return out


def _size(records: list[tuple[int, EventBatch]]) -> tuple[int, int]:
    """(requests, rows) of ``records``."""
    return sum(b.requests for _, b in records), sum(b.num_rows for _, b in records)


def _one_batch(records: list[tuple[int, EventBatch]]) -> int:
    """How many of ``records``, from the first, fit one engine batch (:data:`COALESCE_EVENTS` requests,
    :data:`COALESCE_ROWS` rows and :data:`COALESCE_BYTES`; at least one record)."""
    events = rows = size = 0
    for i, (_, batch) in enumerate(records):
        events, rows, size = events + batch.requests, rows + batch.num_rows, size + batch.buffer_bytes
        if i and (events > COALESCE_EVENTS or rows > COALESCE_ROWS or size > COALESCE_BYTES):
            return i
    return len(records)


class Feeder:
    """Feeds ``engine`` from ``log``; see the module docstring. ``start`` once, ``stop`` once."""

    def __init__(
        self,
        log_: EventLog,
        engine: LocalEngine,
        definitions: Definitions,
        *,
        checkpoint_s: float = 2.0,
        max_commits: int = 2,
        observe: Callable[[EventBatch], None] | None = None,
    ) -> None:
        self.log = log_
        self.engine = engine
        self.definitions = definitions
        self.checkpoint_s = checkpoint_s
        self.max_commits = max_commits
        self.driver = Driver(definitions, engine, ingest=engine.ingest, checkpoint_s=checkpoint_s,
                             max_commits=max_commits, on_commit=self._stored, observe=observe)  # fmt: skip
        self._hold(PartBooks(LogSource.name, log_.key, dict.fromkeys(definitions.names, Position())))
        self.position = 0  # fed up to here
        self.committed = 0  # the store has everything up to here
        self.replay_start = self.replay_end = 0  # what the log held beyond the store's position at start
        self.replayed_events = 0
        self.recovered_s: float | None = None  # time until what the log held at start was in the store
        self.failed = ""  # a commit failed for good: the reason
        self._halt = threading.Event()
        self._abort = threading.Event()  # the grace is over: stop feeding, commit nothing more (the log keeps it)
        self._thread = threading.Thread(target=self._run, name="drainpipe-feeder", daemon=True)

    # ------------------------------------------------------------------ recovery

    def recover(self) -> int:
        """Read from the store how far this log is applied (per definition); returns where feeding starts.

        A store that has applied more of this log's identity than the log holds was fed from another copy of the
        log (or the log's files were deleted): then the log starts over under a new identity, with a warning."""
        names = self.definitions.names
        self._hold(open_books(self.engine.store, LogSource.name, self.log.key, names))
        top = max((p.offset for p in self.books.applied.values()), default=0)
        if top > self.log.end:
            log.warning(
                "the store has applied the write-ahead log %s up to position %d, but the log ends at %d: not the "
                "log that fed it; starting a new log", self.log.key, top, self.log.end,
            )  # fmt: skip
            self.log.renew()
            self._hold(PartBooks(LogSource.name, self.log.key, dict.fromkeys(names, Position())))
        start = self.books.start.offset
        self.position = self.committed = self.replay_start = start
        self.replay_end = self.log.end
        self.log.release(start)
        return start

    # ------------------------------------------------------------------ the loop

    def _hold(self, books: PartBooks) -> None:
        """Hold the log's part with ``books`` (the one part the feeder holds; a renewed log is another part)."""
        for key in list(self.driver.parts):
            self.driver.release(key)
        self.books = books
        self.driver.hold(books.part, books)

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        part = LogSource(self.log).build_part(self.log.key, Position(self.position))
        driver = self.driver
        # the record taken beyond a full batch (records are taken until the batch is full, see _take), fed first
        # next time: fed at once, the last records of a gather were a batch of their own, a fifth of the batches a
        # few thousand events each (an engine batch costs a pass of every definition whatever its size)
        pending: list[tuple[int, EventBatch]] = []
        try:
            while not self.failed and not self._abort.is_set():
                self._reap()
                if driver.due:
                    self._checkpoint()
                if driver.behind:  # the store is behind: let the log hold the data
                    driver.wait_for_store(0.05)
                    continue
                if self.recovered_s is None and self.position >= self.replay_end:
                    if self.committed >= self.replay_end:
                        self._recovered()
                    elif not driver.queued:
                        self._checkpoint()  # the replay is fed: commit it now, not at the next period
                records, pending = pending + _take(part, *_size(pending)), []
                if not records:
                    if self._halt.is_set():
                        break
                    part.wait(0.05)
                    continue
                # live traffic arrives a request at a time: gather for up to GATHER_S (the requests are answered
                # already) so the engine gets batches of thousands of events, not one request's; never longer than
                # a checkpoint period (checkpoints are looked at between batches, and a store outage is noticed at one)
                gather_until = time.monotonic() + min(GATHER_S, driver.checkpoint_s)
                events, rows = _size(records)
                while events < COALESCE_EVENTS and rows < COALESCE_ROWS and time.monotonic() < gather_until:
                    more = _take(part, events, rows)
                    if not more:  # sleep out the window (waking at every group commit cost a thread switch each),
                        if self._halt.is_set():  # (stopping: what the log has, without waiting for more)
                            break
                        self._halt.wait(max(0.0, gather_until - time.monotonic()))  # then take what came meanwhile
                        more = _take(part, events, rows)
                    records += more
                    more_events, more_rows = _size(more)
                    events, rows = events + more_events, rows + more_rows
                full = _one_batch(records)
                pending = records[full:]
                del records[full:]
                self._feed(records)
            if self._abort.is_set():
                return
            self._checkpoint()
            while driver.queued and not self.failed:
                driver.wait_for_store(0.1)
                self._reap()
        except Exception as exc:  # a bug: stop feeding, keep the data in the log, say so
            self.failed = f"feeder failed: {exc!r}"
            log.exception("the feeder failed; acknowledged events stay in the write-ahead log")
        finally:
            part.close()

    def _feed(self, records: list[tuple[int, EventBatch]]) -> None:
        """Ingest records (one engine batch of them, see :func:`_one_batch`), cut where the definitions that have not
        applied a record change (all, unless some were applied further before a restart: the driver's policy).
        ``records`` is emptied as they are fed."""
        group: list[EventBatch] = []
        names: frozenset[str] = frozenset()
        records.reverse()
        while records:  # taken off the list: a batch fed is held by nothing here (see _ingest)
            end, batch = records.pop()
            now_names = self.driver.wanted(self.books, self.position)  # the record starts where the last ended
            if group and now_names != names:
                self._ingest(group, names)
                group = []
            names = now_names
            if names:
                group.append(batch)
                if end <= self.replay_end:
                    self.replayed_events += batch.requests
            self.position = end  # fed once ingested below: checkpoints run between _feed calls only
        if group:
            self._ingest(group, names)

    def _ingest(self, group: list[EventBatch], names: frozenset[str]) -> None:
        batch = EventBatch.join(group)  # one batch (requests first, then any exit rows)
        # the records go before the batch is handed over: feed blocks while the engine is busy, and a batch's records
        # held beside their joined copy meanwhile took the tree's PSS to 305-315 MB at its peaks over 90 s saturated
        # (batches of 131,072 events; 281-299 MB without them, in four runs)
        group.clear()
        self.driver.feed(batch, names)

    def _recovered(self) -> None:
        self.recovered_s = time.monotonic() - self._t0
        if self.replayed_events:
            log.warning(
                "replayed %d events (%d bytes of the write-ahead log) into the store in %.2f s", self.replayed_events,
                self.replay_end - self.replay_start, self.recovered_s,
            )  # fmt: skip

    def _checkpoint(self) -> None:
        """Commit everything fed so far together with the log position (not waiting for the store)."""
        self.books.advance(self.definitions.names, Position(self.position))  # a definition ahead keeps its own
        self.driver.checkpoint(self.position)

    def _stored(self, position: int) -> None:
        """The store has the log up to ``position``: the log may let it go."""
        self.committed = position
        self.log.release(position)

    def _reap(self) -> None:
        self.driver.reap()
        if self.driver.failed and not self.failed:
            self.failed = self.driver.failed
            log.error(
                "store write failed for good: %s; accepting no more events; what was acknowledged stays in the "
                "write-ahead log and is stored at the next start", self.failed,
            )  # fmt: skip

    # ------------------------------------------------------------------ stopping

    def stop(self, timeout_s: float) -> bool:
        """Feed the rest of the log, commit it and wait for the store, up to ``timeout_s``; then stop feeding (a
        long replay is cut short: the thread is joined, so nothing feeds the engine while it closes). True if
        everything in the log is stored; False if not (it stays in the log: a durable log applies it at the next
        start)."""
        self._halt.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._abort.set()
            self._thread.join(ABORT_JOIN_S)  # the batch it is feeding
        return not self._thread.is_alive() and not self.failed and self.committed >= self.log.end

    @property
    def running(self) -> bool:
        """Whether the feeder's thread is still running (after :meth:`stop`: it could not be joined)."""
        return self._thread.is_alive()

    def settle(self) -> None:
        """Take in the commits the store finished after :meth:`stop` gave up waiting (the engine's close runs
        them), so that ``committed`` says what the store has. Only once the feeder's thread has ended."""
        if not self._thread.is_alive():
            self._reap()

    @property
    def lag(self) -> int:
        """Bytes in the log not yet fed to the engine."""
        return self.log.end - self.position
