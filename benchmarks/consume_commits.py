"""``drainpipe consume`` of one topic at several commits, in turns: wall and CPU seconds, medians and ratios.

Made to bisect ``consume``'s rate on one-event messages, where ``compare_commits.py --bench kafka`` (a topic per
run, 1M events, ``run`` beside it) moved by a fifth between pairs of the same commit: here one topic of
``--events`` events (the skewed default workload, ``--per-message`` to a message, 6 partitions) is produced once
(its name kept in ``--data-dir``, so later runs on the same broker reuse it), and each commit's ``drainpipe
consume --exit-at-end`` reads it whole into a fresh DuckDB store as one member of a fresh group, the commits taking
turns round after round (the order alternating). Each commit runs from a clean worktree with its extensions built,
as ``compare_commits.py`` makes them (under ``--work``; by default a temp dir, the worktrees removed after). CPU is
the member process's user and system time; wall is start to exit.

    scripts/kafka.sh start
    .venv/bin/python benchmarks/consume_commits.py dfc1f5c HEAD --events 5000000 --rounds 4 --servers "$(scripts/kafka.sh url)"

Prints a table (each commit against the first) and writes ``--json`` (default
``benchmarks/results/consume-commits.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))
from compare_commits import worktree
from kafka import DRAINPIPE, fill_topic, write_inputs


def consume_once(tree: Path, servers: str, topic: str, work: Path, events: int) -> tuple[float, float]:
    """One ``drainpipe consume`` of ``topic`` with ``tree``'s drainpipe: (wall seconds, CPU seconds). Its store must
    count every event (a member that stopped early would look fast)."""
    from drainpipe.pipeline import open_store

    store = work / f"{uuid.uuid4().hex[:8]}.duckdb"
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([DRAINPIPE, "consume", "--bootstrap-servers", servers, "--topic", topic, "--group",
                           f"bench-{uuid.uuid4().hex}", "--store", f"duckdb:///{store}", "--exit-at-end"],
                          env=env, capture_output=True, text=True)  # fmt: skip
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(
            f"consume at {tree.name} failed ({done.returncode}):\n{done.stdout[-1000:]}{done.stderr[-2000:]}"
        )
    with open_store(f"duckdb:///{store}") as stored:  # type: ignore[attr-defined]
        counted = round(sum(row[5] for row in stored.query(metric="service_cpm", granularity="minute")))
    for stale in work.glob(f"{store.name}*"):
        stale.unlink()
    if counted != events:
        raise SystemExit(f"consume at {tree.name} stored {counted:,} events of {events:,}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def topic_of(args: argparse.Namespace, servers: str) -> str:
    """The benchmark's topic on ``servers``: the one a run before produced, if the broker still has it, else a new
    one (the events generated once per count, as ``kafka.py`` does)."""
    from confluent_kafka.admin import AdminClient

    named = args.data_dir / f"topic-{args.events}-{args.per_message}-{servers.replace(':', '_')}"
    if named.exists():
        topic = named.read_text()
        if topic in AdminClient({"bootstrap.servers": servers}).list_topics(timeout=30).topics:
            return topic
    topic = f"bench-commits-{args.per_message}-{uuid.uuid4().hex[:8]}"
    path = write_inputs(args.data_dir, args.events)
    print(f"topic {topic}: {fill_topic(servers, topic, path, args.per_message):,} messages", flush=True)
    named.write_text(topic)
    return topic


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("commits", nargs="+", help="the commits, the first the reference")
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--per-message", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--servers", default=os.environ.get("DRAINPIPE_TEST_KAFKA", "127.0.0.1:9092"))
    ap.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "drainpipe-bench" / "kafka")
    ap.add_argument("--work", default=None, help="where the worktrees go (default: a temp dir, removed after)")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "consume-commits.json")
    args = ap.parse_args()
    servers = args.servers.removeprefix("kafka://")
    work = Path(args.work or tempfile.mkdtemp(prefix="drainpipe-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    trees = {c: worktree(c, work) for c in args.commits}
    topic = topic_of(args, servers)
    runs: dict[str, dict[str, list[float]]] = {c: {"wall": [], "cpu": []} for c in args.commits}
    with tempfile.TemporaryDirectory(prefix="drainpipe-consume-") as tmp:
        for r in range(args.rounds):
            for commit in args.commits if r % 2 == 0 else args.commits[::-1]:
                wall, cpu = consume_once(trees[commit], servers, topic, Path(tmp), args.events)
                runs[commit]["wall"].append(wall)
                runs[commit]["cpu"].append(cpu)
                print(f"round {r + 1}: {commit:12s} {args.events / wall:>10,.0f} events/s ({wall:.2f} s, {cpu:.2f} CPU s)",
                      flush=True)  # fmt: skip
    ref = args.commits[0]
    table = {}
    for commit in args.commits:
        wall, cpu = statistics.median(runs[commit]["wall"]), statistics.median(runs[commit]["cpu"])
        table[commit] = {"events_per_s": args.events / wall, "wall_s": wall, "cpu_s": cpu,
                         "speed_vs_first": statistics.median(runs[ref]["wall"]) / wall,
                         "cpu_vs_first": statistics.median(runs[ref]["cpu"]) / cpu, **runs[commit]}  # fmt: skip
    print(f"\n{args.events:,} events, {args.per_message} a message, medians of {args.rounds} rounds\n")
    print(f"| commit | events/s | wall (s) | CPU (s) | speed x {ref} | CPU x {ref} (less is >1) |")
    print("|---|---|---|---|---|---|")
    for commit, row in table.items():
        print(f"| {commit} | {row['events_per_s']:,.0f} | {row['wall_s']:.2f} | {row['cpu_s']:.2f} | "
              f"{row['speed_vs_first']:.3f}x | {row['cpu_vs_first']:.3f}x |")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"events": args.events, "per_message": args.per_message, "rounds": args.rounds,
                                     "commits": {c: trees[c].name for c in args.commits}, "table": table}, indent=1))  # fmt: skip
    if not args.work:
        for tree in set(trees.values()):
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=HERE.parent, check=True,
                           capture_output=True)  # fmt: skip


if __name__ == "__main__":
    main()
