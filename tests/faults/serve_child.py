"""`drainpipe serve` in a child process for kill tests, with a marker on stdout inside each store transaction
that commits a log position: ``in-txn N`` (before its COMMIT; the transaction then sleeps 0.3 s so that a kill
lands inside it).

    python serve_child.py SERVE-ARGS...
"""

from __future__ import annotations

import sys
import time

from drainpipe.cli import main
from drainpipe.pipeline.store import SqlStore

record = SqlStore._record_progress
count = [0]


def traced_record(self: SqlStore, progress: object) -> None:  # runs inside the transaction, before COMMIT
    record(self, progress)  # type: ignore[arg-type]
    if progress:
        count[0] += 1
        print(f"in-txn {count[0]}", flush=True)
        time.sleep(0.3)


SqlStore._record_progress = traced_record  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
