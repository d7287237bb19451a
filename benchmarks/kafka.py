"""Kafka in: ``drainpipe consume`` from a topic beside ``drainpipe run`` on the same events and a bare consumer.

The events (the skewed default workload of ``benchmarks/pipeline.py``, ``drainpipe.pipeline.generator``) are written
once as a JSON Lines file and produced once into two topics of 6 partitions on the broker of ``scripts/kafka.sh``
(on the same two cores): NDJSON messages of 100 events, and one event per message. Each run, interleaved, timed
from start to exit:

* ``consume``: ``drainpipe consume --exit-at-end`` as one member of a fresh group (the store a fresh DuckDB file):
  it joins, reads every partition to its end, commits and leaves;
* ``consume x2`` (the 100-event topic): two members of one fresh group on one PostgreSQL store (``--pg URL``;
  skipped without one), timed until both have exited: their combined rate;
* ``run``: ``drainpipe run`` on the JSON Lines file;
* ``bare``: a confluent-kafka consumer in a Python process reading every message of the topic and nothing more
  (no decoding; the member's fetch and prefetch settings, :func:`member_fetching`): the ceiling of reading the topic
  from Python.

Before timing, the store of ``consume`` is checked to hold the same values as the store of ``run`` (the 100-event
topic). The table gives medians of ``--runs`` runs, events/s and ratios against ``run``, and the peak memory of each
contender: the proportional set size (PSS) summed over its processes, sampled every 0.1 s (SAMPLE_S; shared libraries count
once). Targets: consume >= 0.5x of run with NDJSON messages of 100 events, >= 0.25x with one event per message;
consume's peak PSS at most 400 MB.

    scripts/kafka.sh start
    .venv/bin/python benchmarks/kafka.py --servers 127.0.0.1:9092          # 5M events, 3 runs
    .venv/bin/python benchmarks/kafka.py --events 1000000 --runs 1 --pg postgresql://...
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
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
from procs import children_of, memory_kb

RESULTS = Path(__file__).parent / "results"
DRAINPIPE = str(Path(sys.executable).with_name("drainpipe"))
PARTITIONS = 6
TARGETS = {"consume-100": 0.5, "consume-1": 0.25}
#: how often the peak memory is sampled: a commit's spike lasts a few tenths of a second, which a sampler every 0.5 s
#: (this benchmark's until the fifty-third session) saw or missed by chance, 30-80 MB lower than it was
SAMPLE_S = 0.1

BARE = r"""
import json, sys, time
from confluent_kafka import Consumer
servers, topic, partitions, fetching = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
c = Consumer({"bootstrap.servers": servers, "group.id": "bare-" + str(time.time()), "auto.offset.reset": "earliest",
              "enable.auto.commit": False, "enable.partition.eof": True, **fetching})
c.subscribe([topic])
messages = size = 0
ended = set()
while len(ended) < partitions:
    for m in c.consume(10000, 0.5):
        if m.error():
            ended.add(m.partition())
            continue
        messages += 1
        size += len(m.value())
c.close()
print(messages, size)
"""


def write_inputs(data_dir: Path, n: int, duration_s: int = 3600) -> Path:
    """The events (over ``duration_s`` seconds of event time) as one JSON Lines file (written once per event count
    and duration)."""
    from drainpipe.inputs.formats import format_of
    from drainpipe.pipeline.generator import generate_events

    path = data_dir / (f"kafka-events-{n}.jsonl" if duration_s == 3600 else f"kafka-events-{n}-{duration_s}s.jsonl")
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        writer, _ = format_of(path)
        tmp = path.with_name(path.name + ".tmp.jsonl")
        writer.write(generate_events(n, seed=42, duration_s=duration_s), str(tmp), False)
        tmp.rename(path)
    return path


def fill_topic(servers: str, topic: str, path: Path, per_message: int, partitions: int = PARTITIONS) -> int:
    """A topic of ``partitions`` partitions holding the file's lines, ``per_message`` to a message (round robin
    over the partitions); the messages produced."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": servers})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(60)
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 20, "batch.size": 1 << 20,
                         "queue.buffering.max.messages": 1_000_000, "compression.type": "lz4"})  # fmt: skip
    messages = 0
    with open(path, "rb") as f:
        lines: list[bytes] = []
        for line in f:
            lines.append(line.rstrip(b"\n"))
            if len(lines) == per_message:
                _produce(producer, topic, b"\n".join(lines), messages % partitions)
                messages += 1
                lines = []
        if lines:
            _produce(producer, topic, b"\n".join(lines), messages % partitions)
            messages += 1
    producer.flush(300)
    return messages


def _produce(producer: Any, topic: str, value: bytes, partition: int) -> None:
    while True:
        try:
            producer.produce(topic, value, partition=partition)
            return
        except BufferError:
            producer.poll(0.1)


def timed(cmds: list[list[str]]) -> tuple[float, list[str], float]:
    """Start the commands together; the seconds until the last has exited, their outputs, and the peak PSS (MB) of
    all their processes together."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in cmds]
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_S):
            pids = [q for p in procs for q in (p.pid, *children_of(p.pid))]
            peak[0] = max(peak[0], sum(memory_kb(pid, "Pss", "smaps_rollup") for pid in pids))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    outs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    for p, out in zip(procs, outs):
        if p.returncode:
            raise SystemExit(f"{p.args} failed ({p.returncode}):\n{out[-3000:]}")
    return wall, outs, peak[0] / 1024


def member_fetching() -> dict[str, Any]:
    """The member's librdkafka settings for fetching and prefetching (what the bare reader reads with)."""
    from drainpipe.kafka import ConsumeConfig

    settings = ConsumeConfig("", [], "").consumer_settings()
    return {k: v for k, v in settings.items() if k.startswith(("fetch.", "queued."))}


def consume_cmd(servers: str, topic: str, group: str, store: str) -> list[str]:
    return [DRAINPIPE, "consume", "--bootstrap-servers", servers, "--topic", topic, "--group", group, "--store",
            store, "--exit-at-end"]  # fmt: skip


def fresh_pg(url: str) -> str:
    import psycopg

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import with_schema

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as con:
        con.execute(f"CREATE SCHEMA {schema}")
    return with_schema(url, schema)


def run_once(
    kind: str, args: argparse.Namespace, topics: dict[int, str], path: Path, work: Path
) -> tuple[float, float]:
    """One run of ``kind``: its seconds from start to exit and its peak PSS (MB)."""
    db = work / f"{kind}-{uuid.uuid4().hex[:6]}.duckdb"
    if kind == "run":
        wall, _, pss = timed([[DRAINPIPE, "run", "--input", str(path), "--store", f"duckdb:///{db}", "--quiet"]])
    elif kind == "consume-x2":
        url, group = fresh_pg(args.pg), f"bench-{uuid.uuid4().hex}"
        wall, _, pss = timed([consume_cmd(args.servers, topics[100], group, url) for _ in range(2)])
    elif kind.startswith("consume-"):
        topic = topics[int(kind.split("-")[1])]
        wall, _, pss = timed([consume_cmd(args.servers, topic, f"bench-{uuid.uuid4().hex}", f"duckdb:///{db}")])
    else:
        topic = topics[int(kind.split("-")[1])]
        wall, _, pss = timed([[sys.executable, "-c", BARE, args.servers, topic, str(PARTITIONS),
                               json.dumps(member_fetching())]])  # fmt: skip
    return wall, pss


def check_same(args: argparse.Namespace, topic: str, path: Path, work: Path) -> dict[str, Any]:
    from pipeline import _compare, _rows_of

    a, b = work / "check-run.duckdb", work / "check-consume.duckdb"
    timed([[DRAINPIPE, "run", "--input", str(path), "--store", f"duckdb:///{a}", "--quiet"]])
    timed([consume_cmd(args.servers, topic, f"check-{uuid.uuid4().hex}", f"duckdb:///{b}")])
    (ref, _), (got, _) = _rows_of(a), _rows_of(b)
    common, problems = _compare(ref, got)
    print(f"check: {common:,} value rows compared, {'the same' if not problems else '; '.join(problems)}",
          flush=True)  # fmt: skip
    return {"rows": common, "problems": problems}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", default=os.environ.get("DRAINPIPE_TEST_KAFKA", "kafka://127.0.0.1:9092"))
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pg", default=os.environ.get("DRAINPIPE_TEST_PG"), help="PostgreSQL URL for two members")
    ap.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "drainpipe-bench" / "kafka")
    ap.add_argument("--json", type=Path, default=RESULTS / "kafka.json")
    args = ap.parse_args()
    args.servers = args.servers.removeprefix("kafka://")
    path = write_inputs(args.data_dir, args.events)
    topics = {}
    for per in (100, 1):
        topic = f"bench-{per}-{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        messages = fill_topic(args.servers, topic, path, per)
        print(f"topic {topic}: {messages:,} messages of {per} event(s) ({time.perf_counter() - t0:.1f} s)", flush=True)
        topics[per] = topic
    kinds = ["run", "consume-100", "consume-1", "bare-100", "bare-1"] + (["consume-x2"] if args.pg else [])
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                              "events": args.events, "runs": args.runs, "partitions": PARTITIONS}  # fmt: skip
    walls: dict[str, list[float]] = {k: [] for k in kinds}
    peaks: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="drainpipe-kafka-") as tmp:
        work = Path(tmp)
        report["check"] = check_same(args, topics[100], path, work)
        for r in range(args.runs):
            order = kinds[r % len(kinds) :] + kinds[: r % len(kinds)]
            for kind in order:
                wall, pss = run_once(kind, args, topics, path, work)
                walls[kind].append(wall)
                peaks[kind].append(pss)
                print(f"run {r + 1}: {kind:12s} {args.events / wall:>11,.0f} events/s ({wall:.2f} s), peak PSS "
                      f"{pss:.0f} MB", flush=True)  # fmt: skip
                for stale in work.glob("*.duckdb*"):
                    if not stale.name.startswith("check-"):
                        stale.unlink()
    run_eps = args.events / statistics.median(walls["run"])
    table = {}
    for kind in kinds:
        eps = args.events / statistics.median(walls[kind])
        table[kind] = {"eps": eps, "vs_run": eps / run_eps, "target": TARGETS.get(kind), "walls": walls[kind],
                       "peak_pss_mb": statistics.median(peaks[kind]), "peaks_pss_mb": peaks[kind]}  # fmt: skip
    report["table"] = table
    print(f"\n{args.events:,} events, {PARTITIONS} partitions, medians of {args.runs} runs, start to exit\n")
    print("| contender | events/s | of `drainpipe run` | target | peak PSS MB |")
    print("|---|---|---|---|---|")
    for kind, row in table.items():
        target = f">= {row['target']}x" if row["target"] else "-"
        print(f"| {kind} | {row['eps']:,.0f} | {row['vs_run']:.2f}x | {target} | {row['peak_pss_mb']:.0f} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
