"""The same OTLP load against ``drainpipe serve`` and against the OpenTelemetry Collector (spanmetrics), side by
side: spans/s saturated, CPU seconds per million spans, memory, and latency at a fixed rate both sustain.

The Collector is built by ``benchmarks/otelcol.py`` (not committed) and runs the pipeline of the comparison
(``benchmarks/otel_compare.py``): OTLP receiver -> batch -> spanmetrics (drainpipe's latency buckets) ->
Prometheus exporter. drainpipe runs ``drainpipe serve`` durable (its write-ahead log on, into a fresh DuckDB store:
what it acknowledged survives a crash; the Collector keeps nothing across one). The client is the same for both:
``benchmarks/ingest_load.py``'s, OTLP/HTTP protobuf exports (one SERVER span per event and a CLIENT span per
database statement, ``--spans-per-export`` events each, 20 services), ``--clients`` keep-alive connections.

1. **Saturated**, ``--rounds`` rounds, the contenders taking turns, once per client (``--client``):

   * ``python``: ``--clients`` threads of this process, each posting as fast as it is answered;
   * ``wrk``: the C load generator ``wrk`` (1 thread, ``--clients`` connections) with a Lua script posting the
     same recorded exports in turn: a client that costs little CPU, so the contenders get the cores.

   Each runs ``--warmup`` + ``--measure`` seconds; in the measured window: spans/s, the contender's CPU seconds
   (its whole process tree), CPU seconds per million spans and spans per CPU second, its peak RSS and peak PSS
   (the proportional set size summed over the tree: shared libraries count once), the latency of an export (p50,
   p99), and the client's own CPU.
2. **Fixed rate**: exports sent on a schedule (open loop: an export's latency counts from when it was due) at
   ``--fixed-spans-per-s`` (default 150,000; 0: ``--rate-share`` of the slower contender's saturated rate), for
   ``--warmup`` + ``--measure`` seconds each (the warm-up at the same rate, as the saturated runs have theirs), by the
   Python client, ``--fixed-rounds`` rounds in turns (default ``--rounds``); over the measured window: the latency
   of an export and the contender's CPU per span at that rate. ``--client ''`` runs the fixed rate only.

Targets (issue 55): saturated, drainpipe at >= 1.5x the Collector's spans per CPU second (durable, into DuckDB);
at the fixed rate, >= 1.0x, with a p99 of at most 20 ms; PSS of the tree at most 300 MB. Medians over the
rounds; prints a table and writes ``benchmarks/results/otel_load.json``. Not part of ``make test``.

    .venv/bin/python benchmarks/otel_load.py [--rounds 3] [--client python,wrk] [--warmup 10] [--measure 30]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import statistics
import subprocess
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
#: the default contenders; ``drainpipe-pN`` (``--contenders``) is ``serve --parsers N``, to weigh its helper processes
CONTENDERS = ("drainpipe", "collector")


def recorded_exports(spans_per_export: int) -> list[bytes]:
    """The recorded OTLP/HTTP protobuf exports both contenders get: 400 of ``spans_per_export`` events each (with
    the CLIENT spans about 1.3 times as many spans), from ``ingest_load``'s generator."""
    return otlp_bodies(build_bodies(400, spans_per_export, False, seed=3, ahead_s=900))


def wait_rusage(proc: subprocess.Popen[Any]) -> float:
    """Reap ``proc``; the CPU seconds (user + system) the kernel counted for it and the children it waited for."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def spans_in(body: bytes) -> int:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(body)
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


class Contender:
    """One contender running (``with Contender(name, work, src) as c``): ``c.host``/``c.port`` its OTLP/HTTP endpoint,
    ``c.cpu()`` the CPU seconds of its processes so far, ``c.rss_kb()`` their resident memory now."""

    def __init__(self, name: str, work: Path, src: Path) -> None:
        self.name, self.work, self.src = name, work / f"{name}-{time.monotonic_ns()}", src
        self.work.mkdir()

    def __enter__(self) -> Contender:
        if self.name.startswith("drainpipe"):
            # "drainpipe-pN": serve with N parser processes
            parsers = ("--parsers", self.name.removeprefix("drainpipe-p")) if "-p" in self.name else ()
            self.proc, self.host, self.port = start_server(f"duckdb:///{self.work / 'serve.duckdb'}",
                                                           env={"PYTHONPATH": str(self.src)},
                                                           extra=("--wal", str(self.work / "wal"), *parsers))  # fmt: skip
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

    def pss_kb(self) -> int:
        return sum(memory_kb(pid, "Pss", "smaps_rollup") for pid in self.pids())

    def __exit__(self, *exc: object) -> None:
        if self._collector is not None:
            self._collector.__exit__(*exc)
        else:
            self.proc.terminate()
            self.proc.communicate(timeout=300)


WRK_SCRIPT = """
local bodies = {}
local n = 0
init = function(args)
  for i = 0, tonumber(args[2]) - 1 do
    local f = io.open(args[1] .. "/" .. i .. ".pb", "rb")
    bodies[i + 1] = f:read("*a")
    f:close()
  end
end
request = function()
  n = n % #bodies + 1
  return wrk.format("POST", "/v1/traces", {["Content-Type"] = "application/x-protobuf"}, bodies[n])
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRK {"requests": %d, "non2xx": %d, "errors": %d, "p50_us": %d, "p99_us": %d, '
    .. '"duration_us": %d}\\n', summary.requests, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99), summary.duration))
end
"""


class Wrk:
    """``wrk`` posting ``bodies`` in turn (the exports written once to ``work``)."""

    def __init__(self, work: Path, bodies: list[bytes], connections: int) -> None:
        if shutil.which("wrk") is None:
            raise SystemExit("wrk is not installed (apt-get install wrk)")
        self.dir = work / "wrk"
        self.dir.mkdir(exist_ok=True)
        for i, body in enumerate(bodies):
            (self.dir / f"{i}.pb").write_bytes(body)
        (self.dir / "post.lua").write_text(WRK_SCRIPT)
        self.count, self.connections = len(bodies), connections

    def run(self, host: str, port: int, seconds: float) -> tuple[dict[str, Any], float]:
        """One run: wrk's summary (requests, non-2xx, latency percentiles in us) and its CPU seconds."""
        proc = subprocess.Popen(
            ["wrk", "-t1", f"-c{self.connections}", f"-d{max(1, round(seconds))}s", "--timeout", "60s",
             "-s", str(self.dir / "post.lua"), f"http://{host}:{port}", "--", str(self.dir), str(self.count)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        out = proc.stdout.read().decode() if proc.stdout else ""
        cpu = wait_rusage(proc)
        line = next((ln for ln in out.splitlines() if ln.startswith("WRK ")), None)
        if line is None:
            raise RuntimeError(f"wrk gave no summary: {out[-500:]}")
        return json.loads(line[4:]), cpu


def saturated(name: str, work: Path, bodies: list[bytes], spans: float, args: argparse.Namespace,
              client: str, wrk: Wrk | None) -> dict[str, Any]:  # fmt: skip
    """One saturated run of one contender with one client (module docstring, 1.)."""
    with Contender(name, work, args.server_src) as c:
        peak = {"rss": 0, "pss": 0}
        marks: dict[str, tuple[float, float]] = {}
        stop = threading.Event()
        t_start = time.perf_counter()

        def sample() -> None:
            n = 0
            while not stop.is_set():
                now = time.perf_counter() - t_start
                if now >= args.warmup:
                    peak["rss"] = max(peak["rss"], c.rss_kb())
                    if n % 8 == 0:  # smaps_rollup walks the page tables: every 2 s
                        peak["pss"] = max(peak["pss"], c.pss_kb())
                    n += 1
                    marks.setdefault("start", (now, c.cpu()))
                if now <= args.warmup + args.measure:
                    marks["end"] = (now, c.cpu())
                stop.wait(0.25)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        if wrk is not None:
            wrk.run(c.host, c.port, args.warmup)
            summary, client_cpu = wrk.run(c.host, c.port, args.measure)
            answered = summary["requests"] - summary["non2xx"]
            errors = summary["non2xx"] + summary["errors"]
            p50, p99 = summary["p50_us"] / 1000, summary["p99_us"] / 1000
            seconds = summary["duration_us"] / 1e6
        else:
            cpu0 = time.process_time()
            load = drive(c.host, c.port, bodies, False, args.clients, t_start, args.warmup + args.measure, otlp=1)
            client_cpu = (time.process_time() - cpu0) * args.measure / (args.warmup + args.measure)
            window = sorted(s * 1000 for t, s in load.latencies if t >= args.warmup)
            answered, errors, seconds = len(window), len(load.errors), args.measure
            p50, p99 = _q(window, 0.5), _q(window, 0.99)
        stop.set()
        sampler.join()
    (t0, cpu0_), (t1, cpu1) = marks["start"], marks["end"]
    spans_per_s = answered * spans / seconds
    cpu_per_s = (cpu1 - cpu0_) / (t1 - t0)
    return {
        "client": client,
        "spans_per_s": round(spans_per_s),
        "cpu_cores": round(cpu_per_s, 3),
        "cpu_s_per_million_spans": round(cpu_per_s / spans_per_s * 1e6, 3),
        "spans_per_cpu_s": round(spans_per_s / cpu_per_s),
        "peak_rss_mb": round(peak["rss"] / 1024, 1),
        "peak_pss_mb": round(peak["pss"] / 1024, 1),
        "p50_ms": round(p50, 2),
        "p99_ms": round(p99, 2),
        "client_cpu_cores": round(client_cpu / seconds, 3),
        "errors": errors,
    }


def fixed_rate(name: str, work: Path, bodies: list[bytes], spans: float, rate: float,
               args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    """Exports due every ``1 / rate`` s, spread over the clients, for ``--warmup`` + ``--measure`` seconds; latency
    from when each was due (2.), and the contender's CPU, over the exports due in the measured window."""
    with Contender(name, work, args.server_src) as c:
        latencies: list[float] = []
        lock = threading.Lock()
        t0 = time.perf_counter() + 0.5
        start = t0 + args.warmup  # the measured window's first export is due then
        total = int(rate * (args.warmup + args.measure))
        marks: dict[str, float] = {}

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
                if due >= start:
                    with lock:
                        latencies.append((done - due) * 1000 if r.status == 200 else float("inf"))
            conn.close()

        def mark() -> None:
            time.sleep(max(0.0, start - time.perf_counter()))
            marks["cpu"] = c.cpu()

        threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
        marker = threading.Thread(target=mark)
        marker.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        marker.join()
        cpu = c.cpu() - marks["cpu"]
    latencies.sort()
    served = sum(1 for x in latencies if x != float("inf"))
    return {"exports_per_s": rate, "p50_ms": round(_q(latencies, 0.5), 2), "p99_ms": round(_q(latencies, 0.99), 2),
            "max_ms": round(latencies[-1], 2), "cpu_s": round(cpu, 2),
            "spans_per_cpu_s": round(served * spans / cpu) if cpu else 0}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8, help="connections (Python threads, or wrk's connections)")
    ap.add_argument("--client", default="python,wrk", help="the saturating clients, comma-separated: python, wrk")
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--measure", type=float, default=30.0)
    ap.add_argument(
        "--spans-per-export",
        type=int,
        default=394,
        help="events per export (SERVER spans; with the CLIENT spans about 512: the SDK's batch)",
    )
    ap.add_argument(
        "--fixed-spans-per-s",
        type=float,
        default=150_000.0,
        help="the fixed rate's spans/s (0: --rate-share of the slower contender's saturated rate)",
    )
    ap.add_argument("--rate-share", type=float, default=0.5, help="of the slower contender's saturated rate")
    ap.add_argument("--fixed-rounds", type=int, default=None, help="fixed-rate rounds, in turns (default: --rounds)")
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument(
        "--server-src",
        type=Path,
        default=ROOT / "src",
        help="the src directory drainpipe serve runs from (another checkout's: compare_commits)",
    )
    ap.add_argument("--json", type=Path, default=RESULTS / "otel_load.json")
    args = ap.parse_args()
    clients = [c for c in args.client.split(",") if c]  # none: the fixed rate only
    if args.fixed_rounds is None:
        args.fixed_rounds = args.rounds
    if args.rounds < 1 or args.fixed_rounds < 1:
        raise SystemExit("--rounds and --fixed-rounds need at least 1")
    if not clients and not args.fixed_spans_per_s:
        raise SystemExit("the fixed rate only (--client ''): give --fixed-spans-per-s")
    contenders = [c for c in args.contenders.split(",") if c]
    bodies = recorded_exports(args.spans_per_export)
    spans = statistics.fmean(spans_in(b) for b in bodies)
    print(f"{len(bodies)} exports of {spans:.0f} spans on average (SERVER and CLIENT)", flush=True)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {cl: {name: [] for name in contenders} for cl in clients}
    with tempfile.TemporaryDirectory(prefix="drainpipe-otel-load-") as tmp:
        work = Path(tmp)
        wrk = Wrk(work, bodies, args.clients) if "wrk" in clients else None
        for r in range(args.rounds):
            for client in clients:
                for name in contenders if r % 2 == 0 else list(reversed(contenders)):
                    row = saturated(name, work, bodies, spans, args, client, wrk if client == "wrk" else None)
                    runs[client][name].append(row)
                    print(f"round {r + 1}, {client:6s}: {name:9s} {row['spans_per_s']:>10,} spans/s, "
                          f"{row['cpu_cores']:.2f} cores, {row['spans_per_cpu_s']:>10,} spans per CPU s, "
                          f"peak PSS {row['peak_pss_mb']} MB, p99 {row['p99_ms']} ms, "
                          f"client {row['client_cpu_cores']:.2f} cores", flush=True)  # fmt: skip
        medians = {cl: {name: {k: (statistics.median(row[k] for row in rows) if k != "client" else cl)
                               for k in rows[0]} for name, rows in by.items()} for cl, by in runs.items()}  # fmt: skip
        if args.fixed_spans_per_s:
            rate = round(args.fixed_spans_per_s / spans, 1)
        else:
            rate = round(args.rate_share * min(m["spans_per_s"] for m in medians[clients[0]].values()) / spans, 1)
        fixed_runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
        for r in range(args.fixed_rounds):
            for name in contenders if r % 2 == 0 else list(reversed(contenders)):
                row = fixed_rate(name, work, bodies, spans, rate, args)
                fixed_runs[name].append(row)
                print(f"round {r + 1}, fixed rate {rate} exports/s: {name:9s} p50 {row['p50_ms']} ms, "
                      f"p99 {row['p99_ms']} ms, {row['spans_per_cpu_s']:,} spans per CPU s", flush=True)  # fmt: skip
        fixed = {name: {k: statistics.median(row[k] for row in rows) for k in rows[0]}
                 for name, rows in fixed_runs.items()}  # fmt: skip
    print(f"\n{args.clients} connections, OTLP/HTTP protobuf, {spans:.0f} spans per export, medians of {args.rounds} "
          "rounds\n")  # fmt: skip
    print("| client | contender | spans/s | CPU cores | spans per CPU s | peak PSS MB | peak RSS MB | p50 ms | p99 ms |"
          " client cores |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios: dict[str, float] = {}
    for client in clients:
        for name in contenders:
            m = medians[client][name]
            print(f"| {client} | {name} | {m['spans_per_s']:,.0f} | {m['cpu_cores']:.2f} | {m['spans_per_cpu_s']:,.0f} | "
                  f"{m['peak_pss_mb']:.0f} | {m['peak_rss_mb']:.0f} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} | "
                  f"{m['client_cpu_cores']:.2f} |")  # fmt: skip
        if set(CONTENDERS) <= set(contenders):
            ratios[client] = (
                medians[client]["drainpipe"]["spans_per_cpu_s"] / medians[client]["collector"]["spans_per_cpu_s"]
            )
    print(f"\nfixed rate {rate * spans:,.0f} spans/s ({rate} exports/s), Python client, open loop, medians of "
          f"{args.fixed_rounds} rounds:\n")  # fmt: skip
    print("| contender | p50 ms | p99 ms | max ms | spans per CPU s |")
    print("|---|---|---|---|---|")
    for name, row in fixed.items():
        print(f"| {name} | {row['p50_ms']} | {row['p99_ms']} | {row['max_ms']} | {row['spans_per_cpu_s']:,} |")
    fixed_ratio = None
    if set(CONTENDERS) <= set(contenders):
        fixed_ratio = fixed["drainpipe"]["spans_per_cpu_s"] / max(1, fixed["collector"]["spans_per_cpu_s"])
        print()
        for client, ratio in ratios.items():
            print(f"drainpipe / Collector, spans per CPU second, saturated, {client} client: {ratio:.2f}x "
                  "(target >= 1.5x)")  # fmt: skip
        print(f"drainpipe / Collector, spans per CPU second, fixed rate: {fixed_ratio:.2f}x (target >= 1.0x)")
    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "spans_per_export": spans, "runs": runs, "medians": medians,
        "fixed_rate": {"exports_per_s": rate, "spans_per_s": round(rate * spans), **fixed, "runs": fixed_runs},
        "spans_per_cpu_s_ratio": {k: round(v, 3) for k, v in ratios.items()},
        "fixed_rate_spans_per_cpu_s_ratio": None if fixed_ratio is None else round(fixed_ratio, 3),
    }  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
