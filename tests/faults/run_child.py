"""A `drainpipe run` in a child process for kill tests: the real local engine, with a short checkpoint period and
markers on stdout at the moments a test kills it.

    python run_child.py STORE_URL FLUSH_S WORKERS [--slow-commit] INPUT...

Markers (one line each, flushed): ``start``, ``in-txn N`` (inside checkpoint N's store transaction, before its
COMMIT; with --slow-commit the transaction then sleeps 0.5 s so a kill lands inside it), ``in-txn final`` (after
the ``in-txn N`` of the transaction that brings the last input, in the run's own order, to its end: the run's last
checkpoint, whatever its number), ``committed N``, ``done``.
"""

from __future__ import annotations

import os
import sys

import txn_markers

from drainpipe.inputs import expand_inputs
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.engine import EngineOptions
from drainpipe.pipeline.run import run_local
from drainpipe.pipeline.store import SqlStore


def main() -> None:
    store_url, flush_s, workers = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    slow = "--slow-commit" in sys.argv
    inputs = [a for a in sys.argv[4:] if not a.startswith("--")]
    merge = SqlStore.merge
    last = os.path.abspath(expand_inputs(inputs)[-1])  # the input the run reads last (its order)
    size = os.path.getsize(last)  # a text file's progress ends at its size once read whole
    txn_markers.install(0.5 if slow else 0.0,
                        lambda progress: any(p.path == last and p.end in (size, -1) for p in progress))  # fmt: skip

    def traced_merge(self: SqlStore, *args: object, **kwargs: object) -> object:
        report = merge(self, *args, **kwargs)  # type: ignore[arg-type]
        if kwargs.get("progress"):
            print(f"committed {txn_markers.count[0]}", flush=True)
        return report

    SqlStore.merge = traced_merge  # type: ignore[method-assign]
    print("start", flush=True)
    summary = run_local(inputs, definitions=default_definitions(), store_url=store_url,
                        options=EngineOptions(l2_flush_s=flush_s), workers=workers)  # fmt: skip
    print("done" if summary.complete else f"incomplete {summary.failure()}", flush=True)


if __name__ == "__main__":
    main()
