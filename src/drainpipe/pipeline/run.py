"""``drainpipe run`` on the local engine: files in, validated batches through the engine, a summary out."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..inputs import (
    DeadLetter,
    ReadStats,
    Sink,
    default_dead_letter,
    expand_inputs,
    file_identity,
    read_part,
    source_prefix,
    whole_file,
)
from . import parallel
from .definitions import Definitions
from .engine import EngineOptions, LocalEngine
from .store import open_store

Progress = Callable[[int, int], None]  # (events read so far, bytes of input done so far)


@dataclass
class RunSummary:
    """What a run did. ``read == accepted + rejected`` always; ``dropped`` is zero for file input."""

    files: list[str]
    read: int = 0
    accepted: int = 0
    rejected: int = 0
    skipped_batches: int = 0  # batches a previous run already stored (idempotent re-run)
    skipped_events: int = 0  # accepted events in those batches
    dropped: int = 0
    handler_errors: int = 0
    elapsed_s: float = 0.0
    dead_letter: str | None = None
    store: str = ""
    queues: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def events_per_s(self) -> float:
        """Accepted events per second of the whole run."""
        return self.accepted / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def applied(self) -> int:
        """Accepted events this run added to the store (the rest were stored by an earlier run)."""
        return self.accepted - self.skipped_events

    def lines(self) -> list[str]:
        out = [
            f"read {self.read:,} = accepted {self.accepted:,} + rejected {self.rejected:,}"
            f"   dropped {self.dropped:,}   handler errors {self.handler_errors}"
        ]
        if self.skipped_events and not self.applied:
            out.append(
                f"nothing new: all {self.accepted:,} accepted events were already stored in {self.store} "
                f"by an earlier run ({self.elapsed_s:.2f} s)"
            )
        else:
            out.append(f"{self.events_per_s:,.0f} events/s over {self.elapsed_s:.2f} s into {self.store}")
        if self.skipped_events and self.applied:
            out.append(
                f"{self.skipped_events:,} events in {self.skipped_batches} batches were already stored by an "
                f"earlier run: skipped; {self.applied:,} new"
            )
        if self.rejected:
            top = ", ".join(f"{r} ({n})" for r, n in sorted(self.reasons.items(), key=lambda kv: -kv[1])[:4])
            out.append(f"rejects in {self.dead_letter}: {top}")
        return out


def default_workers() -> int:
    """Worker processes for large files: one per CPU when there are several, else none."""
    cpus = os.cpu_count() or 1
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
) -> RunSummary:
    """Process ``inputs`` (files and globs) on the local engine into ``store_url``. Raises ``InputError`` /
    ``StoreError`` (ValueError subclasses with one-line messages) for user mistakes before any data is read.

    ``workers``: processes that read, validate and aggregate large uncompressed JSON Lines and Parquet files
    (:mod:`.parallel`; default :func:`default_workers`, 0 = everything in this process). Results are the same
    either way: a batch's source identity is ``<file fingerprint>:<batch rows>:<block index>`` on both paths.
    A file an earlier run stored (some of) is read in process, checking each batch."""
    t0 = time.perf_counter()  # the clock includes starting the workers
    paths = expand_inputs(inputs)
    workers = default_workers() if workers is None else max(0, workers)
    big = [p for p in paths if workers > 0 and parallel.eligible(p)]
    pool = parallel.start_pool(workers, definitions) if big else None  # before any thread starts (fork)
    try:
        return _run(
            t0,
            paths,
            set(big),
            pool,
            workers,
            definitions=definitions,
            store_url=store_url,
            dead_letter=dead_letter,
            options=options,
            batch_rows=batch_rows,
            progress=progress,
        )
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _run(
    t0: float,
    paths: list[str],
    big: set[str],
    pool: Any,
    workers: int,
    *,
    definitions: Definitions,
    store_url: str,
    dead_letter: str | None,
    options: EngineOptions | None,
    batch_rows: int,
    progress: Progress | None,
) -> RunSummary:
    store = open_store(store_url)
    summary = RunSummary(files=paths, store=store_url, dead_letter=dead_letter)
    stats = ReadStats()
    engine = LocalEngine(definitions, store, options)
    try:
        done_bytes = 0
        with DeadLetter(dead_letter or default_dead_letter(store_url)) as dl:
            summary.dead_letter = str(dl.path)
            for path in paths:
                fid = None
                if path in big:  # the workers start at once, the fingerprint is taken meanwhile

                    def identify(digest: str | None, path: str = path) -> tuple[str, bool]:
                        identity = file_identity(path, digest)
                        return identity, not store.has_sources(source_prefix(identity, batch_rows))

                    fid, done = parallel.run_file(
                        pool,
                        workers,
                        path,
                        batch_rows,
                        identify,
                        engine.ingest_partials,
                        stats,
                        dl,
                        _progress_of(progress, stats, done_bytes),
                    )
                else:
                    done = False
                if not done:
                    fid = fid or file_identity(path)
                    # one query per file; per-batch checks only for a file an earlier run stored (some of)
                    part = whole_file(path, batch_rows, fid)
                    seen_before = store.has_sources(source_prefix(fid, batch_rows))
                    for i, batch in read_part(part, Sink(path, stats, dl)):
                        source = part.source(i)
                        if seen_before and store.is_applied(source, definitions.names):
                            summary.skipped_batches += 1
                            summary.skipped_events += batch.num_rows
                        else:
                            engine.ingest(batch, source)
                        if progress:
                            progress(stats.read, done_bytes)
                done_bytes += Path(path).stat().st_size
                if progress:
                    progress(stats.read, done_bytes)
    finally:
        report = engine.close()
        store.close()
    summary.elapsed_s = time.perf_counter() - t0
    summary.read, summary.accepted, summary.rejected = stats.read, stats.accepted, stats.rejected
    summary.reasons = dict(stats.reasons)
    summary.dropped = report["dropped"]
    summary.handler_errors = report["handler_errors"]
    summary.queues = report["stats"]
    return summary


def _progress_of(progress: Progress | None, stats: ReadStats, done_bytes: int) -> Callable[[], None] | None:
    """A no-argument progress callback for one file: events read so far, input bytes done before the file."""
    if progress is None:
        return None
    return lambda: progress(stats.read, done_bytes)
