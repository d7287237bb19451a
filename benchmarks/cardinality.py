"""The cardinality guard's memory bound: ``drainpipe run`` over files whose every event has its own endpoint (one per
user id, as an unnormalized path would give), with the guard at its default (10,000 per minute) and, side by side,
effectively off (``max_entities`` = 10^9). Peak RSS of the run process (its worker processes excluded: ``--workers``
is not used, the file is read in process), entities stored per minute, events folded.

    .venv/bin/python benchmarks/cardinality.py [--sizes 10000 100000 1000000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[4])
import dataclasses
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.run import run_local
d = dataclasses.replace(default_definitions(), max_entities=int(sys.argv[3]))
t0 = time.perf_counter()
s = run_local([sys.argv[1]], definitions=d, store_url="duckdb:///" + sys.argv[2], workers=0,
              dead_letter=sys.argv[2] + ".rejected.jsonl")
print(json.dumps({"accepted": s.accepted, "seconds": time.perf_counter() - t0, "overflow": s.overflow,
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def write(path: Path, n: int) -> None:
    base = 1_790_000_000_000 // 60_000 * 60_000
    with path.open("w") as f:
        for i in range(n):  # ten minutes; every event its own endpoint
            f.write(f'{{"ts":{base + i * 600_000 // n},"service":"api","endpoint":"GET /u/user-{i}",'
                    f'"latency_ms":{i % 500}.5,"status":true}}\n')  # fmt: skip


def per_minute(store: str) -> int:
    import duckdb

    con = duckdb.connect(store, read_only=True)
    try:
        return int(
            con.execute("""SELECT max(n) FROM (SELECT count(DISTINCT entity) AS n FROM metric_values
            WHERE metric = 'endpoint_cpm' AND granularity = 'minute' GROUP BY time_bucket)""").fetchone()[0]
        )
    finally:
        con.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "cardinality.json"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            data = Path(tmp) / f"ids-{n}.jsonl"
            write(data, n)
            for label, limit in (("guard 10,000", 10_000), ("guard off", 10**9)):
                store = Path(tmp) / f"s-{n}-{limit}.duckdb"
                out = subprocess.run([sys.executable, "-c", CHILD, str(data), str(store), str(limit), str(ROOT / "src")],
                                     capture_output=True, text=True, check=True)  # fmt: skip
                r = json.loads(out.stdout.strip().splitlines()[-1])
                r.update(events=n, mode=label, entities_per_minute=per_minute(str(store)))
                rows.append(r)
                print(f"{n:>9,} distinct endpoints  {label:<13} peak RSS {r['maxrss_mb']:7.1f} MB  "
                      f"{r['entities_per_minute']:>7,} endpoint entities/minute stored  folded {r['overflow']}  "
                      f"{r['seconds']:.1f} s", flush=True)  # fmt: skip
    Path(args.json).write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
