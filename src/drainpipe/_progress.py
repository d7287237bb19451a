"""Progress displays for long commands (rich on a terminal, nothing when quiet or not a terminal)."""

from __future__ import annotations

import contextlib
import glob
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence


@contextlib.contextmanager
def file_progress(*, quiet: bool, inputs: Sequence[str]) -> Iterator[Callable[[int, int], None]]:
    """Yields ``update(events_read, bytes_done)``; shows bytes of input done and events/s."""
    if quiet or not sys.stderr.isatty():
        yield lambda events, done: None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    total = sum(os.path.getsize(p) for pat in inputs for p in (glob.glob(pat) or [pat]) if os.path.isfile(p))
    start = time.perf_counter()
    # No auto-refresh thread: the local engine forks its worker processes only while the process has one
    # thread, so the display refreshes from update() instead (at most 10 times a second).
    with Progress(
        TextColumn("[bold]run"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        transient=True,
        console=None,
        auto_refresh=False,
    ) as bar:
        task = bar.add_task("run", total=total or None, rate="")
        shown = [0.0]

        def update(events: int, done: int) -> None:
            now = time.perf_counter()
            rate = events / max(1e-9, now - start)
            refresh = now - shown[0] >= 0.1
            if refresh:
                shown[0] = now
            bar.update(task, completed=done, rate=f"{events:,} events  {rate:,.0f}/s", refresh=refresh)

        yield update
