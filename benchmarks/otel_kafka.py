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
     summed), then stopped. While it reads, the harness watches its receiver's own counter (the Collector's
     telemetry, level basic, every 0.5 s); then the exporter, every 0.25 s, until the count is whole.

   Each is a whole process, start-up included, measured by the kernel: wall seconds, CPU seconds (user + system),
   spans per CPU second, peak PSS (sampled every 0.25 s). Each checks its count: ``consume`` accepted exactly the
   topic's spans, the connector counted exactly them. The Collector's figures include what the harness adds: up to
   about 1.5 s of wall time to see the count (the connector flushes every 1 s), and the scrapes' CPU. After the
   count the Collector is kept idle ``SETTLE_S`` with the receiver's scrapes, then ``SETTLE_S`` without, and both
   costs per second are reported (``idle_cpu_per_s``, ``quiet_cpu_per_s``): its own idle work (the receiver's
   polling, the connector's flushes) and what the scrapes add to it.

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
from otel_load import recorded_exports, spans_in, wait_rusage
from otelcol import Collector
from pipeline import MemorySampler
from procs import cpu_s

RESULTS = Path(__file__).parent / "results"
CONTENDERS = ("drainpipe", "collector")
#: after the Collector has counted every span: how long its idle cost (the scrapes, its flushes) is measured
SETTLE_S = 5.0


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
        errors: list[str] = []

        def client() -> None:
            nonlocal sent
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            while not errors:
                with lock:
                    if sent >= spans:
                        break
                    i = turn[0] % len(bodies)
                    turn[0] += 1
                try:
                    conn.request("POST", "/v1/traces", bodies[i], {"Content-Type": "application/x-protobuf"})
                    response = conn.getresponse()
                    response.read()
                except OSError as exc:  # (a request the Collector may have taken: the counts below catch it)
                    errors.append(f"posting to the writing Collector failed: {exc}")
                    break
                if response.status != 200:
                    errors.append(f"the writing Collector answered {response.status}")
                    break
                with lock:
                    sent += counts[i]  # (counted once accepted)
            conn.close()

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise SystemExit(errors[0])
    return sent


def scraped_sum(url: str, name: str) -> int:
    """The samples of the metric ``name`` (its ``_total`` counter too) at ``url`` summed; 0 before it has one."""
    total = 0.0
    with urllib.request.urlopen(url, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#") and line.split("{", 1)[0].split(" ", 1)[0] in (name, name + "_total"):
                # the value: the first token after the name and its labels (a timestamp may follow)
                total += float((line.rsplit("}", 1)[1] if "}" in line else line.split(None, 1)[1]).split()[0])
    return int(total)


def collector_spans(url: str) -> int:
    """Every span the spanmetrics connector counted (its ``calls`` series summed), 0 before its first flush."""
    return scraped_sum(url, "traces_span_metrics_calls")


def run_drainpipe(servers: str, topic: str, work: Path, spans: int) -> dict[str, Any]:
    store = work / f"consume-{uuid.uuid4().hex[:6]}.duckdb"
    t0 = time.perf_counter()
    with open(work / "consume.out", "w+") as out_file, open(work / "consume.err", "w+") as err_file:
        proc = subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "drainpipe"), "consume", "--bootstrap-servers", servers, "--topic", topic,
             "--group", f"bench-{uuid.uuid4().hex}", "--encoding", "otlp_proto", "--exit-at-end",
             "--store", f"duckdb:///{store}"],
            stdout=out_file, stderr=err_file, text=True,
        )  # fmt: skip
        with MemorySampler(root=proc.pid) as memory:
            cpu = wait_rusage(proc)  # (the kernel's count: wait4, not communicate)
            wall = time.perf_counter() - t0
        out_file.seek(0)
        err_file.seek(0)
        out, err = out_file.read(), err_file.read()
    if proc.returncode:
        raise SystemExit(f"consume failed ({proc.returncode}): {err[-2000:]}")
    summary = [line for line in out.splitlines() if line.startswith("read ")][-1]
    if f"accepted {spans:,} " not in summary:  # every span of the topic stored, none rejected
        raise SystemExit(f"consume did not accept the topic's {spans:,} spans: {summary}")
    for path in work.glob(store.name + "*"):
        path.unlink()
    return {"wall_s": wall, "cpu_s": cpu, "pss_mb": memory.peak_mb, "summary": summary}


def run_collector(servers: str, topic: str, work: Path, spans: int) -> dict[str, Any]:
    group = f"bench-{uuid.uuid4().hex}"
    t0 = time.perf_counter()
    with (
        Collector(work, list(DEFAULT_LATENCY_BUCKETS_MS), kafka_in=(servers, topic, group)) as reader,
        MemorySampler(root=reader.proc.pid) as memory,
    ):
        assert reader.telemetry is not None
        accepted = counted = 0
        deadline = time.monotonic() + 600
        # the receiver's own counter while it reads (a scrape of a few series), then the connector's count once
        # (the exporter's scrape renders every series: scraped every 0.5 s all along it cost the Collector a fifth
        # of a CPU second a second)
        while counted < spans:
            if time.monotonic() > deadline:
                raise SystemExit(f"the Collector accepted {accepted:,} and counted {counted:,} of {spans:,} spans")
            if accepted < spans:
                time.sleep(0.5)
                accepted = scraped_sum(reader.telemetry, "otelcol_receiver_accepted_spans")
            else:
                time.sleep(0.25)
                counted = collector_spans(reader.metrics)
        wall = time.perf_counter() - t0
        cpu = cpu_s(reader.proc.pid)  # now, before the stop's own work
        if counted != spans:
            raise SystemExit(f"the Collector counted {counted:,} spans, the topic holds {spans:,}")
        # what the harness adds: the Collector idle with the scrapes, then without them
        for _ in range(int(SETTLE_S / 0.5)):
            time.sleep(0.5)
            scraped_sum(reader.telemetry, "otelcol_receiver_accepted_spans")
        after = cpu_s(reader.proc.pid)
        time.sleep(SETTLE_S)
        idle, quiet = (after - cpu) / SETTLE_S, (cpu_s(reader.proc.pid) - after) / SETTLE_S
    return {"wall_s": wall, "cpu_s": cpu, "pss_mb": memory.peak_mb, "idle_cpu_per_s": idle, "quiet_cpu_per_s": quiet,
            "summary": f"spanmetrics counted {counted:,} spans; idle {idle:.3f} CPU-s a second with the scrapes, {quiet:.3f} without"}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap-servers", required=True, help="a broker (scripts/kafka.sh start; its url's host:port)")
    ap.add_argument("--spans", type=int, default=5_000_000, help="spans in the topic (at least; exactly with --topic)")
    ap.add_argument("--spans-per-export", type=int, default=512)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--topic",
        default=None,
        help="reuse a topic this benchmark filled; --spans must be what it "
        "holds (both contenders check that they counted exactly that many)",
    )
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
            bodies = recorded_exports(args.spans_per_export)
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
                  ratio={"median": statistics.median(ratios), "per_round": ratios, "target": 1.0,
                         "of_medians": medians["drainpipe"]["spans_per_cpu_s"] / medians["collector"]["spans_per_cpu_s"]})  # fmt: skip
    print(
        f"\n{spans:,} spans in {report['messages']:,} messages of {topic} ({args.partitions} partitions), "
        f"medians of {args.rounds} rounds in turns\n"
    )
    print("| contender | wall s | CPU s | spans per CPU second | peak PSS |")
    print("|---|---|---|---|---|")
    for name, m in medians.items():
        print(f"| {name} | {m['wall_s']:.1f} | {m['cpu_s']:.1f} | {m['spans_per_cpu_s']:,.0f} | {m['pss_mb']:.0f} MB |")
    idle = statistics.median(row["idle_cpu_per_s"] for row in rounds["collector"])
    quiet = statistics.median(row["quiet_cpu_per_s"] for row in rounds["collector"])
    print(
        f"\nthe Collector idle after the count: {idle:.3f} CPU-s a second with the harness's scrapes, {quiet:.3f} without"
    )
    print(
        f"\ndrainpipe / collector, spans per CPU second: {report['ratio']['median']:.2f}x "
        f"(the median of the rounds' ratios: {', '.join(f'{x:.2f}' for x in ratios)}; of the medians "
        f"{report['ratio']['of_medians']:.2f}x; target >= 1.0x)"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
