"""Progress displays for long commands (rich on a terminal, nothing when quiet or not a terminal)."""
from __future__ import annotations

import contextlib
import glob
import os
import sys
import time
from typing import Callable, Iterator, Sequence


@contextlib.contextmanager
def file_progress(*, quiet: bool, inputs: Sequence[str]) -> Iterator[Callable[[int, int], None]]:
    """Yields ``update(events_read, bytes_done)``; shows bytes of input done and events/s."""
    if quiet or not sys.stderr.isatty():
        yield lambda events, done: None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    total = sum(os.path.getsize(p) for pat in inputs for p in (glob.glob(pat) or [pat]) if os.path.isfile(p))
    start = time.perf_counter()
    with Progress(TextColumn("[bold]run"), BarColumn(), DownloadColumn(), TextColumn("{task.fields[rate]}"),
                  TimeElapsedColumn(), transient=True, console=None) as bar:
        task = bar.add_task("run", total=total or None, rate="")

        def update(events: int, done: int) -> None:
            rate = events / max(1e-9, time.perf_counter() - start)
            bar.update(task, completed=done, rate=f"{events:,} events  {rate:,.0f}/s")

        yield update
