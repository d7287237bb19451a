"""``drainpipe consume --encoding otlp_proto`` beside the OpenTelemetry Collector's Kafka receiver, reading the same
topic that the Collector's Kafka exporter wrote: spans per CPU second, wall time and memory, side by side.

1. **The topic.** The recorded exports of ``benchmarks/otel_load.py`` (``--spans-per-export`` events each: a SERVER
   span per event with ``http.route``, a CLIENT child per database statement) are posted over OTLP/HTTP to a
   Collector whose Kafka exporter writes them to a fresh topic (``--partitions``), until the topic holds at least
   ``--spans`` spans. That Collector is stopped (its batch and queue drained) before anything reads the topic, so
   what both contenders read is what a Collector deployment writes.
2. **In turns**, ``--rounds`` rounds (the order alternating), each contender as a new consumer group from the first
   offset:

   * ``drainpipe``: ``drainpipe consume --encoding otlp_proto --exit-at-end`` into a fresh DuckDB store, durable
     and exactly once (its positions committed with the states), from its start to its exit;
   * ``collector``: the Collector with the Kafka receiver -> batch -> spanmetrics (drainpipe's latency buckets) ->
     Prometheus exporter, from its start until its exporter counts every span of the topic (the ``calls`` series
     summed, scraped every 0.5 s), then stopped.

   Each is a whole process, start-up included, measured by the kernel: wall seconds, CPU seconds (user + system),
   spans per CPU second, peak PSS (sampled every 0.25 s).

Target (issue 55, point 5): ``consume`` at >= 1.0x the Collector's spans per CPU second. Medians over the rounds;
prints a table and writes ``benchmarks/results/otel_kafka.json``. Needs a broker (``scripts/kafka.sh start``) and
builds the Collector (``benchmarks/otelcol.py``). Not part of ``make test``.

    .venv/bin/python benchmarks/otel_kafka.py --bootstrap-servers 127.0.0.1:9092 [--spans 5000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from drainpipe.pipeline.definitions import DEFAULT_LATENCY_BUCKETS_MS
from ingest_load import build_bodies, otlp_bodies
from otel_load import spans_in
from otelcol import Collector
from procs import memory_kb

RESULTS = Path(__file__).parent / "results"
CONTENDERS = ("drainpipe", "collector")


def topic_ends(servers: str, topic: str) -> int:
    """The messages the topic holds (its partitions' high watermarks summed)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"ends-{uuid.uuid4().hex}"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions)
    finally:
        consumer.close()


def fill_topic(servers: str, topic: str, partitions: int, bodies: list[bytes], spans: int, work: Path) -> int:
    """Post ``bodies`` in turn to a Collector whose Kafka exporter writes ``topic`` until ``spans`` spans are sent;
    the spans sent (the Collector is stopped, its queue drained, before this returns)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": servers})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)
    counts = [spans_in(b) for b in bodies]
    sent = 0
    with Collector(work, list(DEFAULT_LATENCY_BUCKETS_MS), kafka=(servers, topic)) as writer:
        host, port = writer.http.removeprefix("http://").split(":")
        lock = threading.Lock()
        turn = [0]

        def client() -> None:
            nonlocal sent
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            while True:
                with lock:
                    if sent >= spans:
                        break
                    i = turn[0] % len(bodies)
                    turn[0] += 1
                    sent += counts[i]
                conn.request("POST", "/v1/traces", bodies[i], {"Content-Type": "application/x-protobuf"})
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    raise SystemExit(f"the writing Collector answered {response.status}")
            conn.close()

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return sent


class Sampler:
    """Peak PSS of one process, sampled on a thread until :meth:`stop`."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_kb, self._done = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.25):
            self.peak_kb = max(self.peak_kb, memory_kb(self.pid, "Pss", "smaps_rollup"))

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak_kb


def collector_spans(url: str) -> int:
    """Every span the spanmetrics connector counted (its ``calls`` series summed), 0 before its first flush."""
    total = 0.0
    with urllib.request.urlopen(url, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#") and line.split("{", 1)[0].endswith("_calls_total"):
                total += float(line.rsplit(" ", 1)[1])
    return int(total)


def wait_rusage(proc: subprocess.Popen[Any]) -> float:
    """Reap ``proc``; the CPU seconds (user + system) the kernel counted for it and the children it waited for."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def run_drainpipe(servers: str, topic: str, work: Path, spans: int) -> dict[str, Any]:
    store = work / f"consume-{uuid.uuid4().hex[:6]}.duckdb"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "drainpipe"), "consume", "--bootstrap-servers", servers, "--topic", topic,
         "--group", f"bench-{uuid.uuid4().hex}", "--encoding", "otlp_proto", "--exit-at-end",
         "--store", f"duckdb:///{store}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    sampler = Sampler(proc.pid)
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    cpu = wait_rusage(proc)
    wall = time.perf_counter() - t0
    peak = sampler.stop()
    if proc.returncode:
        raise SystemExit(f"consume failed ({proc.returncode}): {err[-2000:]}")
    summary = [line for line in out.splitlines() if line.startswith("read ")][-1]
    for path in work.glob(store.name + "*"):
        path.unlink()
    return {"wall_s": wall, "cpu_s": cpu, "pss_mb": peak / 1024, "summary": summary}


def run_collector(servers: str, topic: str, work: Path, spans: int) -> dict[str, Any]:
    group = f"bench-{uuid.uuid4().hex}"
    t0 = time.perf_counter()
    with Collector(work, list(DEFAULT_LATENCY_BUCKETS_MS), kafka_in=(servers, topic, group)) as reader:
        sampler = Sampler(reader.proc.pid)
        counted = 0
        deadline = time.monotonic() + 600
        while counted < spans:
            if time.monotonic() > deadline:
                raise SystemExit(f"the Collector counted {counted:,} of {spans:,} spans in 600 s")
            time.sleep(0.5)
            counted = collector_spans(reader.metrics)
        wall = time.perf_counter() - t0
        with open(f"/proc/{reader.proc.pid}/stat") as f:  # CPU now, before the stop's own work
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        peak = sampler.stop()
    return {"wall_s": wall, "cpu_s": cpu, "pss_mb": peak / 1024, "summary": f"spanmetrics counted {counted:,} spans"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap-servers", required=True, help="a broker (scripts/kafka.sh start; its url's host:port)")
    ap.add_argument("--spans", type=int, default=5_000_000, help="spans in the topic (at least)")
    ap.add_argument("--spans-per-export", type=int, default=512)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--topic", default=None, help="reuse a topic this benchmark filled (its spans: --spans)")
    ap.add_argument("--json", type=Path, default=RESULTS / "otel_kafka.json")
    args = ap.parse_args()
    servers = args.bootstrap_servers.removeprefix("kafka://")
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                              "partitions": args.partitions, "spans_per_export": args.spans_per_export}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="drainpipe-otel-kafka-") as tmp:
        work = Path(tmp)
        if args.topic:
            topic, spans = args.topic, args.spans
        else:
            topic = f"otel-kafka-{uuid.uuid4().hex[:8]}"
            bodies = otlp_bodies(build_bodies(400, args.spans_per_export, False, seed=3, ahead_s=900))
            print(f"filling {topic} with {args.spans:,} spans through the Collector's Kafka exporter ...",
                  file=sys.stderr, flush=True)  # fmt: skip
            t0 = time.perf_counter()
            spans = fill_topic(servers, topic, args.partitions, bodies, args.spans, work)
            report["fill_s"] = round(time.perf_counter() - t0, 1)
        report.update(topic=topic, spans=spans, messages=topic_ends(servers, topic))
        print(f"{topic}: {spans:,} spans in {report['messages']:,} messages", file=sys.stderr, flush=True)
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
        runners = {"drainpipe": run_drainpipe, "collector": run_collector}
        for r in range(args.rounds):
            for name in CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]:
                row = runners[name](servers, topic, work, spans)
                row["spans_per_cpu_s"] = spans / row["cpu_s"]
                rounds[name].append(row)
                print(f"round {r + 1} {name}: {row['wall_s']:.1f} s, {row['cpu_s']:.1f} CPU-s, "
                      f"{row['spans_per_cpu_s']:,.0f} spans per CPU-s, PSS {row['pss_mb']:.0f} MB; {row['summary']}",
                      file=sys.stderr, flush=True)  # fmt: skip
    medians = {name: {k: statistics.median(row[k] for row in rows) for k in ("wall_s", "cpu_s", "spans_per_cpu_s",
                                                                              "pss_mb")}
               for name, rows in rounds.items()}  # fmt: skip
    ratios = [a["spans_per_cpu_s"] / b["spans_per_cpu_s"] for a, b in zip(rounds["drainpipe"], rounds["collector"])]
    report.update(rounds=rounds, medians=medians,
                  ratio={"median": statistics.median(ratios), "per_round": ratios, "target": 1.0})  # fmt: skip
    print(
        f"\n{spans:,} spans in {report['messages']:,} messages of {topic} ({args.partitions} partitions), "
        f"medians of {args.rounds} rounds in turns\n"
    )
    print("| contender | wall s | CPU s | spans per CPU second | peak PSS |")
    print("|---|---|---|---|---|")
    for name, m in medians.items():
        print(f"| {name} | {m['wall_s']:.1f} | {m['cpu_s']:.1f} | {m['spans_per_cpu_s']:,.0f} | {m['pss_mb']:.0f} MB |")
    print(
        f"\ndrainpipe / collector, spans per CPU second: {report['ratio']['median']:.2f}x "
        f"(rounds {', '.join(f'{x:.2f}' for x in ratios)}; target >= 1.0x)"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
