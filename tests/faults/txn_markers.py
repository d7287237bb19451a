"""Markers on stdout from inside a store transaction, for kill tests: ``in-txn N`` is printed after the N-th
transaction that records progress has written it and before its COMMIT; then the transaction sleeps ``pause_s``
so that a kill lands inside it. Shared by run_child.py and serve_child.py."""

from __future__ import annotations

import time

from drainpipe.pipeline.store import SqlStore

count = [0]


def install(pause_s: float) -> None:
    record = SqlStore._record_progress

    def traced_record(self: SqlStore, progress: object) -> None:  # runs inside the transaction, before COMMIT
        record(self, progress)  # type: ignore[arg-type]
        if progress:
            count[0] += 1
            print(f"in-txn {count[0]}", flush=True)
            if pause_s:
                time.sleep(pause_s)

    SqlStore._record_progress = traced_record  # type: ignore[method-assign]
