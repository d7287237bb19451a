"""Spark streaming: ``drainpipe stream`` from a Kafka topic beside ``drainpipe stream`` over a directory of files,
on the same events.

The events (the skewed default workload, as in ``benchmarks/kafka.py``) are written once as JSON Lines, cut into
``--files`` files in a directory, and produced once into a topic of 6 partitions on the broker of
``scripts/kafka.sh`` (NDJSON messages of 100 events). Each run, interleaved, is ``drainpipe stream --trigger-once``
from start to exit into a fresh DuckDB file with a fresh checkpoint, on ``--master`` (default ``local[*]``):

* ``file stream``: ``--input DIR`` (Spark's file source, the batch engine per micro-batch);
* ``kafka stream``: ``--bootstrap-servers ... --topic ...`` (Spark's Kafka source, every message in one
  micro-batch).

Before timing, the two stores are checked to hold the same values. The table gives medians of ``--runs`` runs,
events/s, and the Kafka stream's ratio to the file stream (no target yet).

    scripts/kafka.sh start
    .venv/bin/python benchmarks/spark_stream.py --servers 127.0.0.1:9092 [--events 2000000] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
RESULTS = Path(__file__).parent / "results"
DRAINPIPE = str(Path(sys.executable).with_name("drainpipe"))


def split_file(path: Path, directory: Path, files: int) -> Path:
    """``path``'s lines cut into ``files`` JSON Lines files in ``directory`` (written once)."""
    if not (directory / ".complete").exists():
        directory.mkdir(parents=True, exist_ok=True)
        lines = path.read_bytes().splitlines(keepends=True)
        step = -(-len(lines) // files)
        for i in range(files):
            (directory / f"part-{i:03d}.jsonl").write_bytes(b"".join(lines[i * step : (i + 1) * step]))
        (directory / ".complete").touch()
    return directory


def stream(args: argparse.Namespace, kind: str, source: list[str], work: Path) -> tuple[float, str]:
    """One ``drainpipe stream --trigger-once`` run: (seconds, store URL)."""
    name = f"{kind}-{uuid.uuid4().hex[:6]}"
    store = f"duckdb:///{work / name}.duckdb"
    cmd = [DRAINPIPE, "stream", "-q", *source, "--checkpoint", str(work / f"ck-{name}"), "--store", store,
           "--trigger-once", "--spark-master", args.master]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{kind} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return wall, store


def main() -> None:
    from kafka import fill_topic, write_inputs
    from pipeline import _compare, _rows_of

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", default=os.environ.get("DRAINPIPE_TEST_KAFKA", "kafka://127.0.0.1:9092"))
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "drainpipe-bench" / "kafka")
    ap.add_argument("--json", type=Path, default=RESULTS / "spark-stream.json")
    args = ap.parse_args()
    args.servers = args.servers.removeprefix("kafka://")
    path = write_inputs(args.data_dir, args.events)
    directory = split_file(path, args.data_dir / f"stream-{args.events}-{args.files}", args.files)
    topic = f"bench-stream-{uuid.uuid4().hex[:8]}"
    messages = fill_topic(args.servers, topic, path, 100)
    print(f"topic {topic}: {messages:,} messages of 100 events; {args.files} files in {directory}", flush=True)
    sources = {"file stream": ["--input", str(directory)],
               "kafka stream": ["--bootstrap-servers", args.servers, "--topic", topic]}  # fmt: skip
    walls: dict[str, list[float]] = {k: [] for k in sources}
    with tempfile.TemporaryDirectory(prefix="drainpipe-spark-stream-") as tmp:
        work = Path(tmp)
        stores = {kind: stream(args, kind, source, work)[1] for kind, source in sources.items()}  # warm-up + check
        (ref, _), (got, _) = (_rows_of(Path(stores[k].removeprefix("duckdb:///"))) for k in sources)
        common, problems = _compare(ref, got)
        print(f"check: {common:,} value rows compared, {'the same' if not problems else '; '.join(problems)}")
        for r in range(args.runs):
            for kind, source in sources.items() if r % 2 == 0 else reversed(sources.items()):
                wall, _ = stream(args, kind, source, work)
                walls[kind].append(wall)
                print(f"run {r + 1}: {kind:13s} {args.events / wall:>11,.0f} events/s ({wall:.2f} s)", flush=True)
    medians = {k: statistics.median(v) for k, v in walls.items()}
    rate = {k: args.events / m for k, m in medians.items()}
    print(f"\n{args.events:,} events, {args.master}, medians of {args.runs} runs, start to exit\n")
    print("| contender | events/s | runs (s) | of the file stream |\n|---|---|---|---|")
    for kind in sources:
        runs = " / ".join(f"{w:.1f}" for w in walls[kind])
        print(f"| {kind} | {rate[kind]:,.0f} | {runs} | {rate[kind] / rate['file stream']:.2f}x |")
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "events": args.events, "files": args.files, "runs": args.runs, "master": args.master,
        "check": {"rows": common, "problems": problems},
        "walls_s": walls, "events_per_s": rate,
        "kafka_of_file": rate["kafka stream"] / rate["file stream"],
    }  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
