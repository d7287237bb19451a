"""``drainpipe run`` on the local engine: files in, validated batches through the engine, a summary out.

Exactly once, whatever happens (see :mod:`.progress`): the files are a partitioned source
(:class:`~drainpipe.inputs.FileSource`, a part per file); each is resumed where the store has it applied, planned
into ranges and read range by range (in this process or on worker processes), and the engine commits a
checkpoint (every ``l2_flush_s`` of work, and at the end of each file) that writes the states of whole ranges
together with how far each file is applied, in one transaction. A run killed at any instant leaves every file
applied up to a range boundary; the next run resumes there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..inputs import (
    DeadLetter,
    FileSource,
    Part,
    Position,
    ReadStats,
    default_dead_letter,
    detect_format,
    expand_inputs,
    growable,
    prefix_hasher,
    read_part,
)
from ..inputs.log_formats import DEFAULT_LOG_FORMAT, LogFormat
from ..inputs.options import InputOptions
from ..processes import usable_cpus
from . import parallel
from .definitions import Definitions
from .driver import Driver
from .engine import EngineOptions, LocalEngine
from .progress import InputFile, resolve
from .store import Store, is_new_store, open_store

Progress = Callable[[int, int], None]  # (events read so far, bytes of input done so far)


@dataclass
class RunSummary:
    """What a run did. ``read == accepted + rejected`` always; ``dropped`` is zero for file input.

    ``stored`` counts the accepted events whose checkpoint reached the store; when it is less than ``accepted``,
    ``error`` says why (a store failure, or a file that could not be read), and a rerun stores the rest."""

    files: list[str]
    read: int = 0
    accepted: int = 0
    rejected: int = 0
    stored: int = 0
    unchanged_files: int = 0  # files an earlier run stored in full: nothing new to read
    pending: dict[str, int] = field(default_factory=dict)  # path -> bytes of a partial last line, left for later
    dropped: int = 0
    handler_errors: int = 0
    elapsed_s: float = 0.0
    dead_letter: str | None = None
    store: str = ""
    error: str = ""  # why not everything read was stored (one line)
    input_error: bool = False  # the error is a file that could not be read (exit 2), not the store (exit 1)
    queues: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)  # accepted events read with a caveat, by reason
    overflow: dict[str, int] = field(default_factory=dict)  # per scope: state rows folded into __overflow__
    engine: str = ""  # shown after the store when not the local engine ("spark")
    executors: str = ""  # Spark: which tier the executors' tasks ran (the C extensions, or the fallback and why)
    start_s: float = 0.0  # Spark: seconds of the run spent starting the session (its share, reported apart)

    @property
    def events_per_s(self) -> float:
        """Accepted events per second of the whole run."""
        return self.accepted / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def complete(self) -> bool:
        """Every accepted event reached the store, and nothing failed."""
        return not self.error and self.stored == self.accepted and not self.handler_errors

    def lines(self) -> list[str]:
        out = [
            f"read {self.read:,} = accepted {self.accepted:,} + rejected {self.rejected:,}"
            f"   dropped {self.dropped:,}   handler errors {self.handler_errors}"
        ]
        if not self.read and self.unchanged_files == len(self.files) and not self.error:
            out.append(f"nothing new: every input was already stored in {self.store} ({self.elapsed_s:.2f} s)")
        else:
            into = f"{self.store} ({self.engine})" if self.engine else self.store
            out.append(f"{self.events_per_s:,.0f} events/s over {self.elapsed_s:.2f} s into {into}")
            if self.unchanged_files:
                out.append(f"{self.unchanged_files} of {len(self.files)} files were already stored: nothing new")
        for path, size in self.pending.items():
            out.append(f"{path}: its last {size:,} bytes are a partial line (no newline yet): left for the next run")
        if self.rejected:
            top = ", ".join(f"{r} ({n})" for r, n in sorted(self.reasons.items(), key=lambda kv: -kv[1])[:4])
            out.append(f"rejects appended to {self.dead_letter}: {top}")
        if self.warnings:
            out.append("accepted with warnings: " + ", ".join(f"{r} ({n:,})" for r, n in sorted(self.warnings.items())))
        if self.overflow:
            folded = ", ".join(f"{scope} {n:,}" for scope, n in sorted(self.overflow.items()))
            out.append(f"too many entities (max_entities): state rows folded into __overflow__: {folded}")
        if self.executors:
            start = f"Spark started in {self.start_s:.2f} s; " if self.start_s >= 0.005 else ""
            out.append(f"{start}Spark executors ran {self.executors}")
        return out

    @classmethod
    def from_totals(
        cls, totals: dict[str, Any], *, store: str, dead_letter: str | None, engine: str = ""
    ) -> RunSummary:
        """The summary of a job that reports a dict of totals (the Spark engine: ``run_batch``, ``run_stream``): what
        it committed is stored (it returns after its store transaction), so ``stored`` is ``accepted``."""
        files = int(totals.get("files", 0))
        summary = cls(
            files=[""] * files,
            read=int(totals.get("read", 0)),
            accepted=int(totals.get("accepted", 0)),
            rejected=int(totals.get("rejected", 0)),
            unchanged_files=int(totals.get("unchanged_files", 0)),
            pending=dict(totals.get("pending") or {}),
            dropped=int(totals.get("dropped", 0)),
            elapsed_s=float(totals.get("elapsed_s", 0.0)),
            dead_letter=dead_letter,
            store=store,
            reasons=dict(totals.get("reasons") or {}),
            warnings=dict(totals.get("warnings") or {}),
            overflow=dict(totals.get("overflow") or {}),
            engine=engine,
            executors=str(totals.get("executors") or ""),
            start_s=float(totals.get("start_s") or 0.0),
        )
        summary.stored = summary.accepted
        return summary

    def failure(self) -> str:
        """One line saying what was not stored and why ("" when everything was)."""
        if self.complete:
            return ""
        why = self.error or f"{self.handler_errors} handler errors"
        return (f"not stored: {self.accepted - self.stored:,} of {self.accepted:,} accepted events ({why}); "
                "running the same input again stores them")  # fmt: skip


def default_workers() -> int:
    """Worker processes for large files: one per usable CPU (affinity, cgroup quota) when there are several, else
    none."""
    cpus = usable_cpus()
    return cpus if cpus > 1 else 0


def run_local(
    inputs: Sequence[str],
    *,
    definitions: Definitions,
    store_url: str,
    dead_letter: str | None = None,
    options: EngineOptions | None = None,
    batch_rows: int = 65_536,
    progress: Progress | None = None,
    workers: int | None = None,
    service: str = "",
    log_format: LogFormat = DEFAULT_LOG_FORMAT,
) -> RunSummary:
    """Process ``inputs`` (files and globs) on the local engine into ``store_url``.

    Raises ``InputError``/``StoreError``/``DefinitionError`` (one-line messages) for mistakes found before any
    data is read: a missing file, a bad store URL, a definition that conflicts with the store. Problems met while
    running (an unreadable file, a failed store write) are reported in the summary (``error``, ``complete``).

    ``workers``: processes that read, validate and aggregate large uncompressed JSON Lines and Parquet files
    (:mod:`.parallel`; default :func:`default_workers`, 0 = everything in this process). Results are the same
    either way. ``service``: the service that access logs (``.log``) belong to; ``log_format``: their format
    (:func:`drainpipe.inputs.log_format_of`)."""
    t0 = time.perf_counter()  # the clock includes starting the workers
    paths = expand_inputs(inputs)
    workers = default_workers() if workers is None else max(0, workers)
    big = {p for p in paths if workers > 0 and parallel.eligible(p)}
    pool = parallel.start_pool(workers, definitions) if big else None  # before any thread starts (fork)
    try:
        run = _Run(t0, paths, big, pool, workers, definitions, store_url, dead_letter, options, batch_rows, progress,
                   service, log_format)  # fmt: skip
        if is_new_store(store_url):
            run.start_early()  # the workers start on the first file while the store is created
        store = open_store(store_url)
        try:
            store.register(definitions.all)  # a conflicting definition is refused before any data is read
            return run.run(store)
        finally:
            store.close()
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class _Run:
    """One run: files in order, parts in order, checkpoints between parts and at the end of every file."""

    def __init__(self, t0: float, paths: list[str], big: set[str], pool: Any, workers: int,
                 definitions: Definitions, store_url: str, dead_letter: str | None,
                 options: EngineOptions | None, batch_rows: int, progress: Progress | None,
                 service: str = "", log_format: LogFormat = DEFAULT_LOG_FORMAT) -> None:  # fmt: skip
        self.t0 = t0
        self.paths, self.big, self.pool, self.workers = paths, big, pool, workers
        self.definitions = definitions
        self.store: Store
        self.names = frozenset(definitions.names)
        self.options = replace(options or EngineOptions(), checkpoints=True)
        self.batch_rows = batch_rows
        self.inputs = InputOptions(service, definitions.spans, definitions.endpoints, log_format)
        self.progress = progress
        self.summary = RunSummary(files=paths, store=store_url,
                                  dead_letter=dead_letter or default_dead_letter(store_url))  # fmt: skip
        self.stats = ReadStats()
        self.source = FileSource(paths, batch_rows, options=self.inputs, stats=self.stats)
        self.done_bytes = 0
        self.driver: Driver  # the books and commits (made in :meth:`run`, with the engine)
        self.later: list[str] = []  # the files after the one being read
        self.early: tuple[str, parallel.PartStream] | None = None  # the first file's parts (:meth:`start_early`)

    def start_early(self) -> None:
        """Submit the first file's first parts to the workers now, before the store is open, as if nothing of it
        were applied: true of a new store (:func:`is_new_store`), and checked when the file's turn comes.
        Opening and creating the store (~0.1 s: DuckDB's import, the schema) then runs beside the workers."""
        if not self.paths or self.paths[0] not in self.big:
            return
        path = self.paths[0]
        hasher = prefix_hasher(path, 0) if growable(*detect_format(path)) else None
        parts = self._plan(path, Position(), hasher)
        self.early = (path, parallel.PartStream(self.pool, self.workers, parts, lambda _: self.names))

    def run(self, store: Store) -> RunSummary:
        self.store = store
        engine = LocalEngine(self.definitions, self.store, self.options)
        summary = self.summary
        try:
            with DeadLetter(summary.dead_letter or "") as dl:
                self.source.dead_letter = dl
                # commits are not throttled here: the engine's checkpoint waits for its stages, which bounds them
                self.driver = Driver(self.definitions, engine, ingest=engine.ingest, dead_letter=dl,
                                     checkpoint_s=self.options.l2_flush_s, max_commits=1 << 30)  # fmt: skip
                paths = self.source.list_parts()
                for i, path in enumerate(paths):
                    self.later = paths[i + 1 :]
                    if not self._file(engine, path, dl):
                        break
                    self.done_bytes += Path(path).stat().st_size
                    if self.progress:
                        self.progress(self.stats.read, self.done_bytes)
        finally:
            report = engine.close()
        summary.elapsed_s = time.perf_counter() - self.t0
        summary.read, summary.accepted, summary.rejected = self.stats.read, self.stats.accepted, self.stats.rejected
        summary.reasons = dict(self.stats.reasons)
        summary.warnings = dict(self.stats.warnings)
        summary.stored = engine.counters.events_stored
        summary.error = summary.error or engine.counters.store_error
        summary.dropped = report["dropped"]
        summary.handler_errors = report["handler_errors"]
        summary.overflow = report["overflow"]
        summary.queues = report["stats"]
        return summary

    def _file(self, engine: LocalEngine, path: str, dl: DeadLetter) -> bool:
        """Read one file into the engine from where the store has it; False if the run must stop (read error)."""
        file = resolve(path, self.store, self.names)
        stream = self._early_parts(path, file)
        if file.done:
            self.summary.unchanged_files += 1
            return True
        stored_before = self.driver.stored_events
        self.driver.hold(path, file)
        parts = self._plan(path, file.start, file.hasher) if stream is None else iter(())
        try:
            if path in self.big:
                if stream is None:
                    stream = parallel.PartStream(self.pool, self.workers, parts, file.names_from)
                self._parts_on_workers(engine, file, stream, dl)
                if not self.big.intersection(self.later):
                    # no later file needs the workers: they go now, so that the memory they hold is free before
                    # this file's last checkpoint, whose store write is the run's peak (they held ~200 MB of 620)
                    self.pool.shutdown(wait=False)
            else:
                self._parts_in_process(engine, file, parts)
        except InputError as exc:
            self.driver.rollback()  # what this file brought since its last checkpoint
            self.driver.release(path)
            stored = self.driver.stored_events - stored_before
            self.summary.error = f"{exc}; {stored:,} events of this file were stored before it (a rerun resumes there)"
            self.summary.input_error = True
            return False
        if file.pending():
            self.summary.pending[path] = file.pending()
        if not file.advanced:
            self.summary.unchanged_files += 1  # a growable file with nothing new
        self.driver.checkpoint(wait=True)
        self.driver.release(path)
        return True

    def _plan(self, path: str, start: Position, hasher: Any) -> Iterator[Part]:
        return self.source.plan(path, start, workers=max(1, self.workers), hasher=hasher)

    def _early_parts(self, path: str, file: InputFile) -> parallel.PartStream | None:
        """The parts :meth:`start_early` submitted for ``path``, if they are what this run must read of it: nothing
        of it applied in the store. Else they are cancelled (a store created meanwhile by another process)."""
        if self.early is None or self.early[0] != path:
            return None
        stream = self.early[1]
        self.early = None
        if any(position != Position() for position in file.applied.values()):
            stream.close()
            return None
        return stream

    def _parts_in_process(self, engine: LocalEngine, file: InputFile, parts: Iterable[Part]) -> None:
        for part in parts:
            names = self.driver.wanted(file, part.start_offset)
            reader = read_part(part, self.source.sink(part.path))
            for batch in reader:
                self.driver.feed(batch, names)
                if self.progress:
                    self.progress(self.stats.read, self.done_bytes)
            position = part.end_position
            if position is None:  # a whole file read sequentially: where the reader stopped, if it can grow
                position = reader.snapshot() if file.growable else None
            file.advance(names, position, part.prefix)
            self._maybe_checkpoint()

    def _parts_on_workers(self, engine: LocalEngine, file: InputFile, parts: parallel.PartStream,
                          dl: DeadLetter) -> None:  # fmt: skip
        for part, result in parts:
            self.stats.merge(result.stats)
            for line, raw, reason in result.rejects:
                dl.write(part.path, line, raw, reason)
            if result.partials:
                engine.ingest_partials(result.partials, result.events, result.blocks)
            self.driver.fed(result.events)
            position = part.end_position
            assert position is not None
            file.advance(result.names, position, part.prefix)
            if self.progress:
                self.progress(self.stats.read, self.done_bytes)
            self._maybe_checkpoint()

    def _maybe_checkpoint(self) -> None:
        self.driver.reap()
        if self.driver.due:
            self.driver.checkpoint()
