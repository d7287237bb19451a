"""The same OTLP load against ``drainpipe serve`` and against the OpenTelemetry Collector (spanmetrics), side by
side: spans/s saturated, CPU seconds per million spans, memory, and latency at a fixed rate both sustain.

The Collector is built by ``benchmarks/otelcol.py`` (not committed) and runs the pipeline of the comparison
(``benchmarks/otel_compare.py``): OTLP receiver -> batch -> spanmetrics (drainpipe's latency buckets) ->
Prometheus exporter. drainpipe runs ``drainpipe serve`` durable (its write-ahead log on, into a fresh DuckDB store:
what it acknowledged survives a crash; the Collector keeps nothing across one). The client is the same for both:
``benchmarks/ingest_load.py``'s, OTLP/HTTP protobuf exports (one SERVER span per event and a CLIENT span per
database statement, ``--spans-per-export`` events each, 20 services), ``--clients`` keep-alive connections.

1. **Saturated**, ``--rounds`` rounds, the contenders taking turns: each posts as fast as it is answered for
   ``--warmup`` + ``--measure`` seconds; in the measured window: spans/s, the contender's CPU seconds (its process
   and, for drainpipe, its parser processes), CPU seconds per million spans and spans per CPU second, its peak RSS,
   and the latency of an export (p50, p99).
2. **Fixed rate**: exports sent on a schedule (open loop: an export's latency counts from when it was due) at
   ``--rate-share`` (default half) of the slower contender's saturated rate, for ``--measure`` seconds each.

Target (issue 40): drainpipe at >= 3x the Collector's spans per CPU second, durability on. Medians over the
rounds; prints a table and writes ``benchmarks/results/otel_load.json``. Not part of ``make test``.

    .venv/bin/python benchmarks/otel_load.py [--rounds 3] [--clients 8] [--warmup 10] [--measure 30]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from drainpipe.pipeline.definitions import DEFAULT_LATENCY_BUCKETS_MS
from ingest_load import _q, build_bodies, drive, otlp_bodies, start_server
from otelcol import Collector
from procs import children_of, cpu_s, memory_kb

RESULTS = Path(__file__).parent / "results"
CONTENDERS = ("drainpipe", "collector")


def spans_in(body: bytes) -> int:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(body)
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


class Contender:
    """One contender running (``with Contender(name, work) as c``): ``c.host``/``c.port`` its OTLP/HTTP endpoint,
    ``c.cpu()`` the CPU seconds of its processes so far, ``c.rss_kb()`` their resident memory now."""

    def __init__(self, name: str, work: Path) -> None:
        self.name, self.work = name, work / f"{name}-{time.monotonic_ns()}"
        self.work.mkdir()

    def __enter__(self) -> Contender:
        if self.name == "drainpipe":
            self.proc, self.host, self.port = start_server(f"duckdb:///{self.work / 'serve.duckdb'}",
                                                           extra=("--wal", str(self.work / "wal")))  # fmt: skip
            self._collector = None
        else:
            self._collector = Collector(self.work, list(DEFAULT_LATENCY_BUCKETS_MS)).__enter__()
            self.proc, self.host, self.port = self._collector.proc, "127.0.0.1", self._collector.http_port
        return self

    def pids(self) -> list[int]:
        return [self.proc.pid, *children_of(self.proc.pid)]

    def cpu(self) -> float:
        return sum(cpu_s(pid) for pid in self.pids())

    def rss_kb(self) -> int:
        return sum(memory_kb(pid, "VmRSS") for pid in self.pids())

    def __exit__(self, *exc: object) -> None:
        if self._collector is not None:
            self._collector.__exit__(*exc)
        else:
            self.proc.terminate()
            self.proc.communicate(timeout=300)


def saturated(name: str, work: Path, bodies: list[bytes], spans: float, args: argparse.Namespace) -> dict[str, Any]:
    """One saturated run of one contender (module docstring, 1.)."""
    with Contender(name, work) as c:
        peak = [0]
        marks: dict[str, tuple[float, float]] = {}
        stop = threading.Event()
        t_start = time.perf_counter()

        def sample() -> None:
            while not stop.is_set():
                now = time.perf_counter() - t_start
                if now >= args.warmup:
                    peak[0] = max(peak[0], c.rss_kb())
                    marks.setdefault("start", (now, c.cpu()))
                if now <= args.warmup + args.measure:
                    marks["end"] = (now, c.cpu())
                stop.wait(0.25)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        load = drive(c.host, c.port, bodies, False, args.clients, t_start, args.warmup + args.measure, otlp=1)
        stop.set()
        sampler.join()
    window = sorted(s * 1000 for t, s in load.latencies if t >= args.warmup)
    (t0, cpu0), (t1, cpu1) = marks["start"], marks["end"]
    spans_per_s = len(window) * spans / args.measure
    cpu_per_s = (cpu1 - cpu0) / (t1 - t0)
    return {
        "spans_per_s": round(spans_per_s),
        "cpu_cores": round(cpu_per_s, 3),
        "cpu_s_per_million_spans": round(cpu_per_s / spans_per_s * 1e6, 3),
        "spans_per_cpu_s": round(spans_per_s / cpu_per_s),
        "peak_rss_mb": round(peak[0] / 1024, 1),
        "p50_ms": round(_q(window, 0.5), 2),
        "p99_ms": round(_q(window, 0.99), 2),
        "errors": len(load.errors),
    }


def fixed_rate(name: str, work: Path, bodies: list[bytes], rate: float, args: argparse.Namespace) -> dict[str, Any]:
    """Exports due every ``1 / rate`` s, spread over the clients; latency from when each was due (2.)."""
    with Contender(name, work) as c:
        latencies: list[float] = []
        lock = threading.Lock()
        t0 = time.perf_counter() + 0.5
        total = int(rate * args.measure)

        def client(k: int) -> None:
            conn = http.client.HTTPConnection(c.host, c.port, timeout=60)
            for i in range(k, total, args.clients):
                due = t0 + i / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                conn.request("POST", "/v1/traces", bodies[i % len(bodies)], {"Content-Type": "application/x-protobuf"})
                r = conn.getresponse()
                r.read()
                done = time.perf_counter()
                with lock:
                    latencies.append((done - due) * 1000 if r.status == 200 else float("inf"))
            conn.close()

        threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
        cpu0 = c.cpu()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cpu = c.cpu() - cpu0
    latencies.sort()
    return {"exports_per_s": rate, "p50_ms": round(_q(latencies, 0.5), 2), "p99_ms": round(_q(latencies, 0.99), 2),
            "max_ms": round(latencies[-1], 2), "cpu_s": round(cpu, 2)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--measure", type=float, default=30.0)
    ap.add_argument(
        "--spans-per-export",
        type=int,
        default=394,
        help="events per export (SERVER spans; with the CLIENT spans about 512: the SDK's batch)",
    )
    ap.add_argument("--rate-share", type=float, default=0.5, help="of the slower contender's saturated rate")
    ap.add_argument("--json", type=Path, default=RESULTS / "otel_load.json")
    args = ap.parse_args()
    bodies = otlp_bodies(build_bodies(400, args.spans_per_export, False, seed=3, ahead_s=900))
    spans = statistics.fmean(spans_in(b) for b in bodies)
    print(f"{len(bodies)} exports of {spans:.0f} spans on average (SERVER and CLIENT)", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
    with tempfile.TemporaryDirectory(prefix="drainpipe-otel-load-") as tmp:
        work = Path(tmp)
        for r in range(args.rounds):
            for name in CONTENDERS if r % 2 == 0 else reversed(CONTENDERS):
                row = saturated(name, work, bodies, spans, args)
                runs[name].append(row)
                print(f"round {r + 1}: {name:9s} {row['spans_per_s']:>10,} spans/s, {row['cpu_cores']:.2f} cores, "
                      f"{row['spans_per_cpu_s']:>10,} spans per CPU s, peak RSS {row['peak_rss_mb']} MB, "
                      f"p99 {row['p99_ms']} ms", flush=True)  # fmt: skip
        medians = {name: {k: statistics.median(row[k] for row in rows) for k in rows[0]} for name, rows in runs.items()}
        slower = min(m["spans_per_s"] for m in medians.values())
        rate = round(args.rate_share * slower / spans, 1)
        fixed = {name: fixed_rate(name, work, bodies, rate, args) for name in CONTENDERS}
        for name, row in fixed.items():
            print(f"fixed rate {rate} exports/s: {name:9s} p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms", flush=True)
    ratio = medians["drainpipe"]["spans_per_cpu_s"] / medians["collector"]["spans_per_cpu_s"]
    print(
        f"\n{args.clients} clients, OTLP/HTTP protobuf, {spans:.0f} spans per export, medians of {args.rounds} rounds\n"
    )
    print("| contender | spans/s | CPU cores | CPU s per 1M spans | spans per CPU s | peak RSS MB | p50 ms | p99 ms |"
          f" p50 / p99 ms at {rate * spans:,.0f} spans/s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for name in CONTENDERS:
        m, f = medians[name], fixed[name]
        print(f"| {name} | {m['spans_per_s']:,.0f} | {m['cpu_cores']:.2f} | {m['cpu_s_per_million_spans']:.2f} | "
              f"{m['spans_per_cpu_s']:,.0f} | {m['peak_rss_mb']:.0f} | {m['p50_ms']} | {m['p99_ms']} | "
              f"{f['p50_ms']} / {f['p99_ms']} |")  # fmt: skip
    print(f"\ndrainpipe / Collector, spans per CPU second: {ratio:.2f}x (target >= 3x)")
    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "spans_per_export": spans, "runs": runs, "medians": medians, "fixed_rate": {"exports_per_s": rate, **fixed},
        "spans_per_cpu_s_ratio": round(ratio, 3), "target_met": ratio >= 3,
    }  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
