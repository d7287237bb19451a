"""``drainpipe run`` on the local engine: files in, validated batches through the engine, a summary out."""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .definitions import Definitions
from .engine import EngineOptions, LocalEngine
from . import parallel
from .events import DeadLetter, ReadStats, expand_inputs, read_file_indexed
from .store import open_store

Progress = Callable[[int, int], None]   # (events read so far, bytes of input done so far)


@dataclass
class RunSummary:
    """What a run did. ``read == accepted + rejected`` always; ``dropped`` is zero for file input."""

    files: list[str]
    read: int = 0
    accepted: int = 0
    rejected: int = 0
    skipped_batches: int = 0          # batches a previous run already stored (idempotent re-run)
    dropped: int = 0
    handler_errors: int = 0
    elapsed_s: float = 0.0
    dead_letter: str | None = None
    store: str = ""
    queues: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def events_per_s(self) -> float:
        return self.accepted / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def lines(self) -> list[str]:
        out = [f"read {self.read:,} = accepted {self.accepted:,} + rejected {self.rejected:,}"
               f"   dropped {self.dropped:,}   handler errors {self.handler_errors}",
               f"{self.events_per_s:,.0f} events/s over {self.elapsed_s:.2f} s into {self.store}"]
        if self.skipped_batches:
            out.append(f"{self.skipped_batches} batches were already stored by an earlier run: skipped")
        if self.rejected:
            top = ", ".join(f"{r} ({n})" for r, n in sorted(self.reasons.items(), key=lambda kv: -kv[1])[:4])
            out.append(f"rejects in {self.dead_letter}: {top}")
        return out


def file_identity(path: str, digest: str | None = None) -> str:
    """A content fingerprint: the same bytes anywhere give the same identity (source ids for idempotent runs).

    SHA-256 (96 bits of it): with the CPU's SHA instructions it takes ~0.1 us per JSON line, half of BLAKE2b.
    ``digest``: the file's SHA-256 hex digest if already known (the worker planner's scan computes it)."""
    if digest is None:
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
    return digest[:24]


def default_workers() -> int:
    """Worker processes for large files: one per CPU when there are several, else none."""
    cpus = os.cpu_count() or 1
    return cpus if cpus > 1 else 0


def run_local(inputs: Sequence[str], *, definitions: Definitions, store_url: str,
              dead_letter: str | None = None, options: EngineOptions | None = None,
              batch_rows: int = 65_536, progress: Progress | None = None,
              workers: int | None = None) -> RunSummary:
    """Process ``inputs`` (files and globs) on the local engine into ``store_url``. Raises ``InputError`` /
    ``StoreError`` (ValueError subclasses with one-line messages) for user mistakes before any data is read.

    ``workers``: processes that read, validate and aggregate large uncompressed JSON Lines and Parquet files
    (:mod:`.parallel`; default :func:`default_workers`, 0 = everything in this process). Results are the same
    either way: a batch's source identity is ``<file fingerprint>:<batch rows>:<block index>`` on both paths.
    A file an earlier run stored (some of) is read in process, checking each batch."""
    t0 = time.perf_counter()    # the clock includes starting the workers
    paths = expand_inputs(inputs)
    workers = default_workers() if workers is None else max(0, workers)
    big = [p for p in paths if workers > 0 and parallel.eligible(p)]
    pool = parallel.start_pool(workers, definitions) if big else None   # before any thread starts (fork)
    try:
        return _run(t0, paths, set(big), pool, workers, definitions=definitions, store_url=store_url,
                    dead_letter=dead_letter, options=options, batch_rows=batch_rows, progress=progress)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _run(t0: float, paths: list[str], big: set[str], pool: Any, workers: int, *, definitions: Definitions, store_url: str,
         dead_letter: str | None, options: EngineOptions | None, batch_rows: int,
         progress: Progress | None) -> RunSummary:
    store = open_store(store_url)
    summary = RunSummary(files=paths, store=store_url, dead_letter=dead_letter)
    stats = ReadStats()
    engine = LocalEngine(definitions, store, options)
    try:
        done_bytes = 0
        with DeadLetter(dead_letter or _default_dead_letter(store_url)) as dl:
            summary.dead_letter = str(dl.path)
            for path in paths:
                fid = None
                if path in big:   # the workers start at once, the fingerprint is taken meanwhile
                    def identify(digest: str | None, path: str = path) -> tuple[str, bool]:
                        identity = file_identity(path, digest)
                        return identity, not store.has_sources(f"{identity}:{batch_rows}:")
                    fid, done = parallel.run_file(pool, workers, path, batch_rows, identify, engine.ingest_partials,
                                                  stats, dl,
                                                  (lambda: progress(stats.read, done_bytes)) if progress else None)
                else:
                    done = False
                if not done:
                    fid = fid or file_identity(path)
                    # one query per file; per-batch checks only for a file an earlier run stored (some of)
                    seen_before = store.has_sources(f"{fid}:{batch_rows}:")
                    for i, batch in read_file_indexed(path, batch_rows=batch_rows, dead_letter=dl, stats=stats):
                        source = f"{fid}:{batch_rows}:{i}"
                        if seen_before and store.is_applied(source, definitions.names):
                            summary.skipped_batches += 1
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


def _default_dead_letter(store_url: str) -> str:
    """``<output>.rejected.jsonl`` beside the store file (in the working directory for server stores)."""
    if store_url.startswith("duckdb:///") and ":memory:" not in store_url:
        return str(Path(store_url[len("duckdb:///"):]).with_suffix("")) + ".rejected.jsonl"
    return "drainpipe.rejected.jsonl"
