"""Driver memory of ``drainpipe run --engine spark`` as the output grows: inputs whose every event has its own
endpoint (each new endpoint is about 5 metric state rows per minute in the default set), at 1M and at more output
rows. Each run is its own process (local[2]); its peak RSS (the Python driver, which also writes the DuckDB store)
and the JVM's (its child), sampled from ``/proc`` (VmHWM), are reported.

    .venv/bin/python benchmarks/spark_driver_memory.py [--events 200000 800000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from procs import children_of, memory_kb  # shared with the kill tests


def write(path: Path, n: int) -> None:
    base = 1_790_000_000_000 // 60_000 * 60_000
    with path.open("w") as f:
        for i in range(n):
            f.write(
                f'{{"ts":{base + (i % 10) * 60_000},"service":"api","endpoint":"/u/{i}","latency_ms":{i % 900}.5}}\n'
            )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, nargs="+", default=[200_000, 800_000])
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "spark-driver-memory.json"))
    ap.add_argument("--store", help="a PostgreSQL URL (a fresh schema per run): the store's memory is then outside "
                    "the driver; default: a DuckDB file, which lives in the driver process")  # fmt: skip
    ap.add_argument("--duckdb-options", default="",
                    help="DuckDB options for the store URL, e.g. memory_limit=500MB (DuckDB's buffer pool may "
                    "otherwise grow to 80%% of the machine's memory)")  # fmt: skip
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.events:
            data = Path(tmp) / f"e{n}.jsonl"
            write(data, n)
            store = Path(tmp) / f"s{n}.duckdb"
            url = f"duckdb:///{store}" + (f"?{args.duckdb_options}" if args.duckdb_options else "")
            if args.store:
                sys.path.insert(0, str(ROOT / "benchmarks"))
                from ingest_load import fresh_pg_schema

                url, _schema = fresh_pg_schema(args.store)
            t0 = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-m", "drainpipe.cli", "run", "-q", "--engine", "spark",
                                     "--spark-master", "local[2]", "--input", str(data), "--store",
                                     url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # fmt: skip
            driver = jvm = 0
            while proc.poll() is None:
                driver = max(driver, memory_kb(proc.pid, "VmHWM"))
                for child in children_of(proc.pid):
                    jvm = max(jvm, memory_kb(child, "VmHWM"))
                time.sleep(0.2)
            seconds = time.perf_counter() - t0
            if proc.returncode != 0:
                raise SystemExit(proc.stderr.read().decode()[-2000:] if proc.stderr else "failed")
            from drainpipe.pipeline.store import open_store

            s = open_store(url)
            try:
                keys = len(s.query(metric="endpoint_cpm", granularity="minute"))
            finally:
                s.close()
            rows.append({"events": n, "store": url.split("://")[0] + (f"?{args.duckdb_options}" if args.duckdb_options and not args.store else ""), "endpoint_minute_keys": keys, "approx_minute_state_rows": 5 * keys, "seconds": round(seconds, 1),
                         "driver_python_peak_mb": round(driver / 1024, 1), "driver_jvm_peak_mb": round(jvm / 1024, 1)})  # fmt: skip
            print(rows[-1], flush=True)
    Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
