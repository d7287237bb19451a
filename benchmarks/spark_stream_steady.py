"""The Kafka stream's steady rate on Spark: this checkout beside another commit, on the same topic, in one run.

``drainpipe stream --bootstrap-servers`` (the API: :func:`drainpipe.spark.run_stream` with ``trigger_once``) reads a
topic of ``--events`` events (the skewed default workload, as in ``benchmarks/kafka.py``; NDJSON messages of 100
events over 6 partitions, produced once) into a fresh DuckDB store with a fresh checkpoint, at most
``--batch-messages`` messages a micro-batch, on ``local[2]``. Each run is a child process that imports drainpipe
from its commit's tree (a clean worktree of ``--against`` with its extensions built, as
``benchmarks/compare_commits.py`` makes them; this checkout's ``src`` for ``head``) and notes when each
micro-batch's store commit returned.

* **start**: from the child's call to the first micro-batch's end (the JVM, the connector, the first batch's
  jobs and their warm-up), reported apart;
* **steady**: the events of the micro-batches after the first over the time from the first's end to the last's.

The contenders take turns, round after round (``--rounds``, the order alternating); medians, and head's ratio to
the other. Before timing, the two stores of round 1 are checked to hold the same values. Prints a table and writes
``benchmarks/results/spark-stream-steady.json``.

    .venv/bin/python benchmarks/spark_stream_steady.py --against 679a9e1 --servers "$(scripts/kafka.sh url)"
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"


def child(args: argparse.Namespace) -> int:
    """One stream, run in a process whose ``PYTHONPATH`` names the commit's tree: one JSON line on stdout."""
    from drainpipe.spark import KafkaTopics, run_stream

    marks: list[tuple[float, int]] = []
    t0 = time.perf_counter()

    def on_batch(_batch: int, summary: dict[str, Any]) -> None:
        marks.append((time.perf_counter() - t0, int(summary.get("accepted", 0))))

    source = KafkaTopics.at(args.servers, [args.topic], max_messages=args.batch_messages)
    totals = run_stream(source, store_url=args.store, checkpoint=args.checkpoint, master=args.master,
                        trigger_once=True, on_batch=on_batch)  # fmt: skip
    print(json.dumps({"marks": marks, "accepted": totals["accepted"], "total_s": time.perf_counter() - t0}))
    return 0


def one_run(tree: Path, args: argparse.Namespace, topic: str, work: Path, name: str) -> dict[str, Any]:
    """One child run of ``tree``'s drainpipe: its marks, start and steady rate, and its store URL."""
    store = f"duckdb:///{work / name}.duckdb"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--servers", args.servers, "--topic", topic,
           "--store", store, "--checkpoint", str(work / f"ck-{name}"), "--master", args.master,
           "--batch-messages", str(args.batch_messages)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree)
    if done.returncode:
        raise SystemExit(f"{name} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    marks = report["marks"]
    if len(marks) < 3:
        raise SystemExit(f"{name}: {len(marks)} micro-batches; lower --batch-messages")
    steady_events = sum(n for _, n in marks[1:])
    return {"store": store, "batches": len(marks), "start_s": marks[0][0], "total_s": report["total_s"],
            "steady_events_per_s": steady_events / (marks[-1][0] - marks[0][0]),
            "batch_s": [round(b[0] - a[0], 3) for a, b in zip(marks, marks[1:])]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="the other commit (a worktree of it is built under --work)")
    parser.add_argument("--servers", default=os.environ.get("DRAINPIPE_TEST_KAFKA", "127.0.0.1:9092"),
                        help="the Kafka broker (scripts/kafka.sh url)")  # fmt: skip
    parser.add_argument("--events", type=int, default=3_000_000)
    parser.add_argument("--batch-messages", type=int, default=5_000, help="messages a micro-batch reads at most")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "drainpipe-compare"))
    parser.add_argument("--out", default=str(RESULTS / "spark-stream-steady.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.servers = args.servers.removeprefix("kafka://")
    if args.child:
        return child(args)
    if not args.against:
        parser.error("--against COMMIT is required")
    sys.path.insert(0, str(ROOT / "src"))
    from compare_commits import worktree
    from kafka import fill_topic, write_inputs
    from pipeline import _compare, _rows_of

    work_dir = Path(args.work)
    work_dir.mkdir(parents=True, exist_ok=True)
    trees = {"head": ROOT, args.against: worktree(args.against, work_dir)}
    path = write_inputs(Path.home() / ".cache" / "drainpipe-bench" / "kafka", args.events)
    topic = f"bench-steady-{uuid.uuid4().hex[:8]}"
    messages = fill_topic(args.servers, topic, path, 100)
    print(f"topic {topic}: {messages:,} messages of 100 events, at most {args.batch_messages:,} a micro-batch",
          flush=True)  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="drainpipe-steady-") as tmp:
        for r in range(args.rounds):
            order = list(trees.items()) if r % 2 == 0 else list(reversed(trees.items()))
            for name, tree in order:
                run = one_run(tree, args, topic, Path(tmp), f"{name}-{r}")
                runs[name].append(run)
                print(f"round {r + 1}: {name:8s} start {run['start_s']:5.1f} s, steady "
                      f"{run['steady_events_per_s']:>9,.0f} events/s over {run['batches'] - 1} batches "
                      f"({' '.join(f'{s:.2f}' for s in run['batch_s'])} s)", flush=True)  # fmt: skip
            if r == 0:
                (ref, _), (got, _) = (_rows_of(Path(runs[n][0]["store"].removeprefix("duckdb:///"))) for n in trees)
                common, problems = _compare(ref, got)
                print(f"check: {common:,} value rows compared, {'the same' if not problems else '; '.join(problems)}")
                if problems:
                    return 1
    steady = {n: statistics.median(r["steady_events_per_s"] for r in v) for n, v in runs.items()}
    start = {n: statistics.median(r["start_s"] for r in v) for n, v in runs.items()}
    print(f"\n{args.events:,} events, {args.master}, at most {args.batch_messages:,} messages a micro-batch, "
          f"medians of {args.rounds} rounds\n")  # fmt: skip
    print("| commit | steady events/s | x the other | start (s) |\n|---|---|---|---|")
    for name in trees:
        other = next(n for n in trees if n != name)
        print(f"| {name} | {steady[name]:,.0f} | {steady[name] / steady[other]:.2f}x | {start[name]:.1f} |")
    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "config": {"events": args.events, "batch_messages": args.batch_messages, "rounds": args.rounds,
                   "master": args.master, "against": args.against,
                   "head": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                          text=True).stdout.strip()},
        "check_rows": common, "runs": runs, "steady_events_per_s": steady, "start_s": start,
        "head_of_against": steady["head"] / steady[args.against],
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwritten {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
