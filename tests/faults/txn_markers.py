"""Markers on stdout from inside a store transaction, for kill tests: ``in-txn N`` is printed after the N-th
transaction that records progress has written it and before its COMMIT, and ``in-txn final`` after it when
``final(progress)`` says that transaction completes the run; then the transaction sleeps ``pause_s`` so that a kill
lands inside it. Shared by run_child.py and serve_child.py.

How many transactions a run commits depends on timing (a checkpoint every so much work), so a test that kills the
last one names it by what it records, not by its number."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from drainpipe.pipeline.store import SourceProgress, SqlStore

count = [0]


def install(pause_s: float, final: Callable[[Sequence[SourceProgress]], bool] | None = None) -> None:
    record = SqlStore._record_progress

    def traced_record(self: SqlStore, progress: object) -> None:  # runs inside the transaction, before COMMIT
        record(self, progress)  # type: ignore[arg-type]
        if progress:
            count[0] += 1
            print(f"in-txn {count[0]}", flush=True)
            if final is not None and final(progress):  # type: ignore[arg-type]
                print("in-txn final", flush=True)
            if pause_s:
                time.sleep(pause_s)

    SqlStore._record_progress = traced_record  # type: ignore[method-assign]
