"""A bounded load test of `drainpipe serve` on loopback, and whether its memory stays flat.

The server runs as its own process (``drainpipe serve``, a fresh DuckDB store by default); this process is the
load generator: ``--clients`` threads, each with one keep-alive connection, post NDJSON bodies of
``--events-per-request`` events (built before the clock starts, cycled) for ``--warmup`` + ``--measure`` seconds.
A 429/503 answer is retried after its Retry-After (counted). The server's RSS is sampled every 0.5 s.

Memory is judged on the measured window only, after the warm-up: RSS climbs for 60-90 s under load while the
allocators (glibc's per-thread arenas, Arrow's mimalloc pool), DuckDB's WAL and buffer pool and the engine's
buffers reach their working size, then stays in a band of about +-30 MB. In the window: first / last / min / max RSS there, and the slope
of a least-squares line through all samples of the window, in MB per minute and in % of the window's mean RSS per
minute. **Flat** means no upward trend: slope < ``--flat-pct`` (1 %) of the mean per minute; a leak of that
rate would be visible in the window as a steady climb, while a window that starts high in the band slopes down
(both are reported). The window is 180 s because the band is wide: on the same flat run, 90 s windows gave
slopes from -3 to +0.6 %/min, 180 s windows within +-0.5 %/min.

Afterwards the server is stopped with SIGTERM (graceful: drains, flushes, closes the store) and the events in
the store (sum of the minute ``service_cpm`` values) are compared with the events the server accepted.

Prints a table and writes benchmarks/results/ingest_load.json (``--out``). ``--compare N``: HTTP durable vs
``--durability none`` vs ``drainpipe run`` (ingest_compare.json). ``--otlp N``: the same events as NDJSON to
``/v1/events`` and as OTLP protobuf spans to ``/v1/traces`` (ingest_otlp.json; ``--grpc``: over OTLP/gRPC as
well). ``--operations N``: retention purges and alert evaluation on against off (ingest_operations.json).
``--remote-write N``: remote-write to a real Prometheus on against off (ingest_remote_write.json).

    flock /tmp/drainpipe-bench.lock .venv/bin/python benchmarks/ingest_load.py          # 8 clients, 60 s + 180 s
    flock /tmp/drainpipe-bench.lock .venv/bin/python benchmarks/ingest_load.py \
        --store postgresql://drainpipe:drainpipe@127.0.0.1:55432/drainpipe --out benchmarks/results/ingest_load_postgres.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from drainpipe.pipeline.generator import generate_events, write_events
from drainpipe.pipeline.store import open_store

sys.path.insert(0, str(ROOT / "tests"))
from procs import children_of, cpu_s, memory_kb  # shared with the kill tests


def build_bodies(requests: int, per_request: int, gzipped: bool, seed: int, ahead_s: float = 0) -> list[bytes]:
    """``requests`` NDJSON bodies of ``per_request`` events each (20 services, Zipf 1.1), timestamps from 2 minutes
    ago to ``ahead_s`` from now (so that a run of that length has fresh minutes all along, for the alert rules)."""
    total = requests * per_request
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        now = int(time.time() * 1000)
        write_events(generate_events(total, services=20, seed=seed, start_ms=now - 120_000,
                                     duration_s=120 + ahead_s), path)  # fmt: skip
        lines = path.read_bytes().splitlines(keepends=True)
    bodies = [b"".join(lines[i * per_request : (i + 1) * per_request]) for i in range(requests)]
    return [gzip.compress(b, 1) for b in bodies] if gzipped else bodies


def fresh_pg_schema(url: str) -> tuple[str, str]:
    """A new schema for this run (so the store count is this run's), and the URL that selects it."""
    import urllib.parse

    import psycopg

    schema = f"load_{int(time.time())}_{os.getpid()}"
    with psycopg.connect(url, autocommit=True) as con:
        con.execute(f"CREATE SCHEMA {schema}")
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query) + [("options", f"-csearch_path={schema}")]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query))), schema


def drop_pg_schema(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        con.execute(f"DROP SCHEMA {schema} CASCADE")


@dataclass
class Load:
    """What the clients of one load run saw."""

    accepted: int = 0
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (finished at, seconds) of 200 answers
    end_to_end: list[float] = field(default_factory=list)  # including back-pressure retries
    retries: dict[str, int] = field(default_factory=lambda: {"429": 0, "503": 0})
    errors: list[str] = field(default_factory=list)

    def answered(self, accepted: int, at: float, seconds: float, with_retries: float) -> None:
        """One request answered 200 (the caller holds the load's lock)."""
        self.accepted += accepted
        self.latencies.append((at, seconds))
        self.end_to_end.append(with_retries)


def _run_clients(client: Callable[[], None], clients: int) -> None:
    """Run ``clients`` threads of ``client`` to their end."""
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def otlp_bodies(bodies: list[bytes]) -> list[bytes]:
    """The same events as OTLP protobuf exports: one SERVER span per event (service.name and host.name from the
    event, http.route = endpoint, start = ts - latency, end = ts, ERROR status when it failed), and for an event with
    a ``db_statement`` a CLIENT span with ``db.statement`` of the same duration, so that both sides feed the same
    statement top-N: the OTLP side does the same work, plus the CLIENT spans."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    out = []
    counter = 0
    for body in bodies:
        request = ExportTraceServiceRequest()
        by_resource: dict = {}
        for line in body.splitlines():
            e = json.loads(line)
            key = (e["service"], e.get("instance") or "")
            scope = by_resource.get(key)
            if scope is None:
                rs = request.resource_spans.add()
                rs.resource.attributes.add(key="service.name").value.string_value = key[0]
                rs.resource.attributes.add(key="host.name").value.string_value = key[1]
                scope = by_resource[key] = rs.scope_spans.add()
            counter += 1
            end = e["ts"] * 1_000_000
            span = scope.spans.add(trace_id=counter.to_bytes(16, "big"), span_id=counter.to_bytes(8, "big"),
                                   name=e.get("endpoint") or "op", kind=2, end_time_unix_nano=end,
                                   start_time_unix_nano=end - int(e["latency_ms"] * 1_000_000))  # fmt: skip
            if e.get("endpoint"):
                span.attributes.add(key="http.route").value.string_value = e["endpoint"]
            if e.get("status") is False:
                span.status.code = 2
            if e.get("db_statement"):
                exit_span = scope.spans.add(trace_id=span.trace_id, span_id=(counter + (1 << 62)).to_bytes(8, "big"),
                                            name="query", kind=3, start_time_unix_nano=span.start_time_unix_nano,
                                            end_time_unix_nano=end)  # fmt: skip
                exit_span.attributes.add(key="db.statement").value.string_value = e["db_statement"]
                if e.get("status") is False:
                    exit_span.status.code = 2
        out.append(request.SerializeToString())
    return out


def drive(host: str, port: int, bodies: list[bytes], gzipped: bool, clients: int, t_start: float,
          seconds: float, otlp: int = 0, grpc_address: str | None = None) -> Load:  # fmt: skip
    """``clients`` threads, one keep-alive connection each, posting ``bodies`` (cycled) until ``t_start +
    seconds``; a 429/503 is retried after a tenth of its Retry-After. ``otlp``: the bodies are OTLP protobuf
    exports of that many spans each, posted to /v1/traces, or exported over OTLP/gRPC to ``grpc_address``."""
    load = Load()
    next_index = [0]
    lock = threading.Lock()
    if grpc_address:
        return _drive_grpc(grpc_address, bodies, clients, t_start, seconds, otlp, load)
    path = "/v1/traces" if otlp else "/v1/events"
    headers = {"Content-Type": "application/x-protobuf" if otlp else "application/x-ndjson"}
    if gzipped:
        headers["Content-Encoding"] = "gzip"
    deadline = t_start + seconds

    def client() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=60)
        while time.perf_counter() < deadline:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            body = bodies[i % len(bodies)]
            first = time.perf_counter()
            while True:
                t0 = time.perf_counter()
                try:
                    conn.request("POST", path, body, headers)
                    r = conn.getresponse()
                    payload = r.read()
                except (OSError, http.client.HTTPException) as exc:
                    conn.close()
                    conn = http.client.HTTPConnection(host, port, timeout=60)
                    with lock:
                        load.errors.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.1)
                    continue
                t1 = time.perf_counter()
                if r.status in (429, 503):
                    with lock:
                        load.retries[str(r.status)] += 1
                    if r.getheader("Connection", "").lower() == "close":
                        conn.close()
                        conn = http.client.HTTPConnection(host, port, timeout=60)
                    time.sleep(float(r.getheader("Retry-After") or 1) / 10)  # polite, but keep the test bounded
                    continue
                if r.status != 200:
                    with lock:
                        load.errors.append(f"HTTP {r.status}: {payload[:200]!r}")
                    break
                accepted = otlp - _rejected_spans(payload) if otlp else json.loads(payload)["accepted"]
                with lock:
                    load.answered(accepted, t1 - t_start, t1 - t0, t1 - first)
                break
        conn.close()

    _run_clients(client, clients)
    return load


def _drive_grpc(address: str, bodies: list[bytes], clients: int, t_start: float, seconds: float, spans: int,
                load: Load) -> Load:  # fmt: skip
    """:func:`drive` over OTLP/gRPC: one channel per client thread, blocking unary Export calls; UNAVAILABLE with
    RetryInfo (throttling) is retried after a tenth of its delay."""
    import grpc
    from grpc_status import rpc_status

    from drainpipe.server.otlp_answers import GRPC_EXPORT_PATH

    next_index = [0]
    lock = threading.Lock()
    deadline = t_start + seconds

    def client() -> None:
        with grpc.insecure_channel(address) as channel:
            export = channel.unary_unary(GRPC_EXPORT_PATH)
            while time.perf_counter() < deadline:
                with lock:
                    i = next_index[0]
                    next_index[0] += 1
                first = time.perf_counter()
                while True:
                    t0 = time.perf_counter()
                    try:
                        payload = export(bodies[i % len(bodies)], timeout=60)
                    except grpc.RpcError as err:
                        status = rpc_status.from_call(err)
                        if err.code() == grpc.StatusCode.UNAVAILABLE and status is not None and status.details:
                            with lock:
                                load.retries["503"] += 1
                            time.sleep(1 / 10)
                            continue
                        with lock:
                            load.errors.append(f"gRPC {err.code().name}: {err.details()}")
                        break
                    t1 = time.perf_counter()
                    with lock:
                        load.answered(spans - _rejected_spans(payload), t1 - t_start, t1 - t0, t1 - first)
                    break

    _run_clients(client, clients)
    return load


def _rejected_spans(payload: bytes) -> int:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    return int(ExportTraceServiceResponse.FromString(payload).partial_success.rejected_spans)


def rss_kb(pid: int) -> int:
    return memory_kb(pid, "VmRSS")


def start_server(
    store: str, env: dict[str, str] | None = None, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen, str, int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "drainpipe.cli", "serve", "--store", store, "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})},
    )
    line = proc.stdout.readline()
    proc.first_line = line  # type: ignore[attr-defined]
    m = re.search(r"listening on http://([\d.]+):(\d+)", line)
    if not m:
        proc.kill()
        raise SystemExit(f"serve did not start: {line!r} {proc.stderr.read()}")
    # the server's log is read as it comes (the last lines kept): a full pipe would block whichever server thread
    # logs next (alert transitions are logged), and the benchmark would measure its own harness
    tail: deque[str] = deque(maxlen=200)
    threading.Thread(target=lambda: tail.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
    proc.log_tail = tail  # type: ignore[attr-defined]
    return proc, m.group(1), int(m.group(2))


def fit_slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y) points (y per unit of t)."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (y - my) for t, y in points) / var if var else 0.0


def memory_verdict(rss: list[tuple[float, int]], warmup: float, end: float, flat_pct: float) -> dict:
    """RSS figures of the measured window [warmup, end] (samples in KB -> MB) and the flat verdict."""
    window = [(t, kb / 1024) for t, kb in rss if warmup <= t <= end]
    if len(window) < 10:
        return {"flat": False, "note": "too few samples in the measured window"}
    values = [mb for _, mb in window]
    mean = statistics.mean(values)
    slope_per_min = fit_slope(window) * 60
    return {
        "window_s": [round(warmup, 1), round(end, 1)],
        "samples": len(window),
        "first": round(values[0], 1),
        "last": round(values[-1], 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
        "mean": round(mean, 1),
        "slope_mb_per_min": round(slope_per_min, 2),
        "slope_pct_per_min": round(100 * slope_per_min / mean, 2),
        "flat_criterion": f"no upward trend: slope < {flat_pct}% of the mean RSS per minute",
        "flat": 100 * slope_per_min / mean < flat_pct,
    }


def _q(xs: list[float], p: float) -> float:
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def http_run(store: str, bodies: list[bytes], clients: int, warmup: float, measure: float,
             extra: tuple[str, ...], otlp: int = 0, count_by: str = "minute") -> dict:  # fmt: skip
    """One server (``extra`` flags) under load: events/s, latency and RSS in the measured window, then a graceful
    stop and the store checked against what was acknowledged (by the ``count_by`` service_cpm: hour when minute
    rows are purged during the run)."""
    proc, host, port = start_server(store, extra=extra)
    t_start = time.perf_counter()
    rss: list[tuple[float, int]] = []
    cpu: dict[str, float] = {}  # CPU seconds at the start and the end of the measured window
    done = threading.Event()

    def cpu_now() -> tuple[float, float, float]:
        """(server process, its parser processes, this load generator) CPU seconds so far."""
        return cpu_s(proc.pid), sum(cpu_s(c) for c in children_of(proc.pid)), time.process_time()

    def sample_rss() -> None:
        while not done.is_set():
            now = time.perf_counter() - t_start
            rss.append((now, rss_kb(proc.pid)))
            if "start" not in cpu and now >= warmup:
                cpu["start"], cpu["t0"] = cpu_now(), now  # type: ignore[assignment]
            elif "end" not in cpu and now >= warmup + measure:
                cpu["end"], cpu["t1"] = cpu_now(), now  # type: ignore[assignment]
            done.wait(0.5)

    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    grpc = re.search(r"OTLP/gRPC on (\S+);", proc.first_line)  # with --grpc-port: the load goes there
    load = drive(host, port, bodies, False, clients, t_start, warmup + measure, otlp, grpc and grpc.group(1))
    if "end" not in cpu and "start" in cpu:  # the load ended between two samples
        cpu["end"], cpu["t1"] = cpu_now(), time.perf_counter() - t_start  # type: ignore[assignment]
    done.set()
    sampler.join()
    t_stop = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=300)
    drained_s = time.perf_counter() - t_stop
    s = open_store(store)
    try:
        per = {"minute": 1, "hour": 60}[count_by]  # cpm x minutes per bucket = events
        stored = int(round(sum(r[5] * per for r in s.query(metric="service_cpm", granularity=count_by))))
    finally:
        s.close()
    window = sorted(x * 1000 for t, x in load.latencies if t >= warmup)
    memory = memory_verdict(rss, warmup, warmup + measure, 1.0)
    per_request = otlp or len(bodies[0].splitlines())
    cores = {}
    if "end" in cpu:  # cores used in the window, per part
        span = cpu["t1"] - cpu["t0"]
        cores = {
            k: round((b - a) / span, 2) for k, a, b in zip(("server", "parsers", "load"), cpu["start"], cpu["end"])
        }  # type: ignore[call-overload]
    return {
        "events_per_s": round(len(window) * per_request / measure, 1),
        "p50_ms": round(_q(window, 0.5), 2),
        "p99_ms": round(_q(window, 0.99), 2),
        "acknowledged": load.accepted,
        "stored": stored,
        "lost": load.accepted - stored,
        "retries": load.retries,
        "errors": len(load.errors),
        "shutdown_s": round(drained_s, 2),
        "exit": proc.returncode,
        "rss_mb": {k: memory.get(k) for k in ("mean", "max", "slope_pct_per_min", "flat")},
        "cpu_cores": cores,
    }


def file_run(path: str, store: str) -> dict:
    """``drainpipe run`` on one JSON Lines file, timed as the user waits (start-up included)."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "drainpipe.cli", "run", "-q", "--input", path, "--store", store],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # fmt: skip
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"drainpipe run failed: {done.stdout} {done.stderr}")
    events = int(re.search(r"accepted ([\d,]+)", done.stdout).group(1).replace(",", ""))  # type: ignore[union-attr]
    return {"events": events, "wall_s": round(wall, 3), "events_per_s": round(events / wall, 1)}


def _median(rounds: list[dict], *keys: str) -> float:
    """The median over the rounds of ``round[keys[0]][keys[1]]...``, to 3 decimals."""

    def pick(row: Any) -> float:
        for key in keys:
            row = row[key]
        return float(row)

    return round(statistics.median(pick(r) for r in rounds), 3)


def compare(args: argparse.Namespace, bodies: list[bytes]) -> int:
    """HTTP durable (fsync), HTTP --durability none and ``drainpipe run`` on the same events as one JSON Lines
    file, in alternation, ``args.compare`` rounds; medians and per-round ratios."""
    tmp = Path(tempfile.mkdtemp(prefix="drainpipe-compare-"))
    jsonl = tmp / "events.jsonl"
    with open(jsonl, "wb") as f:
        for _ in range(args.file_repeats):
            for b in bodies:
                f.write(b)
    extra = tuple(args.serve_arg)
    rounds = []
    for i in range(args.compare):
        row = {}
        for name, flags in (("fsync", ("--durability", "fsync")), ("none", ("--durability", "none"))):
            store = f"duckdb:///{tmp}/{name}-{i}.duckdb"
            row[name] = http_run(store, bodies, args.clients, args.warmup, args.measure,
                                 flags + ("--wal", str(tmp / f"wal-{name}-{i}")) + extra)  # fmt: skip
        row["file"] = file_run(str(jsonl), f"duckdb:///{tmp}/file-{i}.duckdb")
        row["durable_vs_none"] = round(row["fsync"]["events_per_s"] / row["none"]["events_per_s"], 3)
        row["durable_vs_file"] = round(row["fsync"]["events_per_s"] / row["file"]["events_per_s"], 3)
        rounds.append(row)
        print(f"round {i + 1}: HTTP fsync {row['fsync']['events_per_s']:>9,.0f} ev/s (p50 {row['fsync']['p50_ms']} "
              f"p99 {row['fsync']['p99_ms']} ms)  HTTP none {row['none']['events_per_s']:>9,.0f} ev/s  run "
              f"{row['file']['events_per_s']:>9,.0f} ev/s  durable/none {row['durable_vs_none']}  durable/run "
              f"{row['durable_vs_file']}", flush=True)  # fmt: skip
    med = lambda *keys: _median(rounds, *keys)
    summary = {
        "http_fsync_events_per_s": med("fsync", "events_per_s"),
        "http_none_events_per_s": med("none", "events_per_s"),
        "file_run_events_per_s": med("file", "events_per_s"),
        "fsync_p50_ms": med("fsync", "p50_ms"),
        "fsync_p99_ms": med("fsync", "p99_ms"),
        "none_p50_ms": med("none", "p50_ms"),
        "none_p99_ms": med("none", "p99_ms"),
        "durable_vs_none": med("durable_vs_none"),
        "durable_vs_file": med("durable_vs_file"),
        "lost": sum(r[k]["lost"] for r in rounds for k in ("fsync", "none")),
    }
    print()
    print("| | events/s (median) | p50 ms | p99 ms | ratio (median of the rounds' ratios) |")
    print("|---|---|---|---|---|")
    print(
        f"| HTTP, durable (fsync) | {summary['http_fsync_events_per_s']:,.0f} | {summary['fsync_p50_ms']} | "
        f"{summary['fsync_p99_ms']} | {summary['durable_vs_none']} of none, {summary['durable_vs_file']} of run |"
    )
    print(
        f"| HTTP, --durability none | {summary['http_none_events_per_s']:,.0f} | {summary['none_p50_ms']} | "
        f"{summary['none_p99_ms']} | |"
    )
    print(
        f"| drainpipe run, one JSONL file (wall, start-up included) | {summary['file_run_events_per_s']:,.0f} | | | |"
    )
    result = {"mode": "compare", "clients": args.clients, "events_per_request": args.events_per_request,
              "warmup_s": args.warmup, "measure_s": args.measure, "serve_args": list(extra),
              "file_events": rounds[0]["file"]["events"], "cpus": os.cpu_count(),
              "load_average": os.getloadavg(), "rounds": rounds, "median": summary}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if summary["lost"] == 0 else 1


def compare_otlp(args: argparse.Namespace, bodies: list[bytes]) -> int:
    """The same events posted as NDJSON to /v1/events and as OTLP protobuf spans to /v1/traces (a SERVER span per
    event, and a CLIENT span per statement: see :func:`otlp_bodies`), durable, in alternation, ``args.otlp`` rounds:
    events/s against request spans/s (SERVER spans, each one event), medians and ratios."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    tmp = Path(tempfile.mkdtemp(prefix="drainpipe-otlp-"))
    spans = otlp_bodies(bodies)
    per_request = len(bodies[0].splitlines())
    # spans per request, averaged over the bodies (the clients cycle through them; each has its own statements)
    all_spans = round(sum(len(ss.spans) for body in spans for rs in ExportTraceServiceRequest.FromString(body).resource_spans
                          for ss in rs.scope_spans) / len(spans))  # fmt: skip
    rounds = []
    sides = [("ndjson", bodies, 0, ()), ("otlp", spans, per_request, ())]
    if args.grpc:  # the same exports over OTLP/gRPC
        sides.append(("grpc", spans, per_request, ("--grpc-port", "0")))
    for i in range(args.otlp):
        row = {}
        for name, payloads, otlp, flags in sides:
            store = f"duckdb:///{tmp}/{name}-{i}.duckdb"
            row[name] = http_run(store, payloads, args.clients, args.warmup, args.measure,
                                 ("--wal", str(tmp / f"wal-{name}-{i}"), *flags, *args.serve_arg), otlp)  # fmt: skip
        row["otlp_vs_ndjson"] = round(row["otlp"]["events_per_s"] / row["ndjson"]["events_per_s"], 3)
        # every span (the CLIENT ones too) per second against events per second
        row["spans_vs_ndjson"] = round(row["otlp_vs_ndjson"] * all_spans / per_request, 3)
        if args.grpc:
            row["grpc_vs_ndjson"] = round(row["grpc"]["events_per_s"] / row["ndjson"]["events_per_s"], 3)
            row["grpc_vs_http"] = round(row["grpc"]["events_per_s"] / row["otlp"]["events_per_s"], 3)
        rounds.append(row)
        print(f"round {i + 1}: NDJSON {row['ndjson']['events_per_s']:>9,.0f} events/s (p99 {row['ndjson']['p99_ms']}"
              f" ms)  OTLP protobuf {row['otlp']['events_per_s']:>9,.0f} request spans/s (p99 {row['otlp']['p99_ms']} ms)  "
              f"ratio {row['otlp_vs_ndjson']} (in all spans {row['spans_vs_ndjson']})", flush=True)  # fmt: skip
        if args.grpc:
            print(f"  OTLP/gRPC {row['grpc']['events_per_s']:>9,.0f} request spans/s (p99 {row['grpc']['p99_ms']} ms)"
                  f"  {row['grpc_vs_ndjson']} of NDJSON, {row['grpc_vs_http']} of OTLP/HTTP", flush=True)  # fmt: skip
        print("  cores (server, parsers, load): " + "  ".join(f"{n} {row[n]['cpu_cores']}" for n, *_ in sides))
    med = lambda *keys: _median(rounds, *keys)
    summary = {
        "ndjson_events_per_s": med("ndjson", "events_per_s"),
        "otlp_spans_per_s": med("otlp", "events_per_s"),
        "otlp_all_spans_per_s": round(med("otlp", "events_per_s") * all_spans / per_request, 1),
        "ndjson_p99_ms": med("ndjson", "p99_ms"),
        "otlp_p99_ms": med("otlp", "p99_ms"),
        "otlp_vs_ndjson": med("otlp_vs_ndjson"),
        "spans_vs_ndjson": med("spans_vs_ndjson"),
        "lost": sum(r[name]["lost"] for r in rounds for name, *_ in sides),
    }
    if args.grpc:
        summary |= {"grpc_spans_per_s": med("grpc", "events_per_s"), "grpc_p99_ms": med("grpc", "p99_ms"),
                    "grpc_vs_ndjson": med("grpc_vs_ndjson"), "grpc_vs_http": med("grpc_vs_http")}  # fmt: skip
    print()
    print("| | per second (median) | p99 ms | ratio (median of the rounds') |")
    print("|---|---|---|---|")
    print(f"| POST /v1/events, NDJSON | {summary['ndjson_events_per_s']:,.0f} events | {summary['ndjson_p99_ms']} | |")
    print(f"| POST /v1/traces, OTLP protobuf | {summary['otlp_spans_per_s']:,.0f} request spans "
          f"({summary['otlp_all_spans_per_s']:,.0f} spans) | {summary['otlp_p99_ms']} | "
          f"{summary['otlp_vs_ndjson']} of NDJSON in request spans, {summary['spans_vs_ndjson']} in spans |")  # fmt: skip
    if args.grpc:
        print(f"| OTLP/gRPC Export, protobuf | {summary['grpc_spans_per_s']:,.0f} request spans | "
              f"{summary['grpc_p99_ms']} | {summary['grpc_vs_ndjson']} of NDJSON, {summary['grpc_vs_http']} of "
              "OTLP/HTTP, in request spans |")  # fmt: skip
    print(f"(an OTLP request holds {per_request} SERVER spans and {all_spans - per_request} CLIENT spans)")
    result = {"mode": "otlp", "clients": args.clients, "events_per_request": per_request,
              "spans_per_request": all_spans, "warmup_s": args.warmup,
              "measure_s": args.measure, "cpus": os.cpu_count(), "rounds": rounds, "median": summary}  # fmt: skip
    out = args.out or str(ROOT / "benchmarks" / "results" / "ingest_otlp.json")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if summary["lost"] == 0 else 1


def definitions_toml(rules: str) -> str:
    """The default definitions as metrics TOML, plus ``rules`` (``[[alert]]`` tables)."""
    from drainpipe.pipeline.definitions import default_definitions

    def table(kind: str, definition: Any) -> str:
        fields = {k: v for k, v in dataclasses.asdict(definition).items() if v is not None}
        return f"[[{kind}]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in fields.items())

    d = default_definitions()
    return "\n".join([*(table("metric", m) for m in d.metrics), *(table("topn", t) for t in d.topns)]) + rules


#: the rules the operations run evaluates every second: service and endpoint scope, a percentile, an SLA
OPERATION_RULES = """
[[alert]]
name = "slow service"
metric = "service_resp_time"
threshold = 40.0
for = 2

[[alert]]
name = "sla"
metric = "service_sla"
op = "<"
threshold = 99.5

[[alert]]
name = "p99"
metric = "service_percentile"
label = "p99"
threshold = 150
for = 3

[[alert]]
name = "hot endpoint"
metric = "endpoint_cpm"
entity = "*"
threshold = 20000
"""


class Receiver:
    """A webhook receiver on loopback counting the notifications posted to it."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        receiver = self
        self.posts = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                receiver.posts += 1
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def operations(args: argparse.Namespace, remote_write: str | None = None) -> int:
    """``drainpipe serve`` as it runs for months against the same server with retention and alerts off, in
    alternation, ``args.operations`` rounds. On: a purge every 10 s by a one-minute minute retention (so that every
    purge deletes rows the load keeps writing), four alert rules evaluated every second, notifications posted to a
    local receiver. Off: no purge, no rules. Events/s, p99, RSS in the window; nothing lost (counted by the hour
    states, which the purge leaves).

    With ``remote_write`` (a receiver's URL; ``--remote-write N``), on is instead the same server with
    ``--remote-write`` to it, each minute sent as soon as it ends (lateness 0), and off the same without."""
    tmp = Path(tempfile.mkdtemp(prefix="drainpipe-ops-"))
    toml = tmp / "ops.toml"
    toml.write_text(definitions_toml(OPERATION_RULES))
    receiver = Receiver()
    on: tuple[str, ...] = ("--metrics", str(toml), "--alert-every-s", "1", "--alert-webhook", receiver.url,
                           "--purge-every-s", "10", "--retention", "minute=1m")  # fmt: skip
    off: tuple[str, ...] = ("--purge-every-s", "0")
    on_label = "on (purge every 10 s, 4 rules every 1 s, webhook)"
    if remote_write is not None:
        on = ("--purge-every-s", "0", "--remote-write", remote_write, "--remote-write-lateness-s", "0")
        on_label = "on (remote-write each minute as it ends, to Prometheus)"
    rounds = []
    for i in range(args.operations):
        row: dict[str, Any] = {}
        # fresh timestamps for each pair, reaching past the end of both runs: the rules always see complete minutes
        # with data (bodies cycled for minutes would otherwise leave the rules' windows empty)
        bodies = build_bodies(args.bodies, args.events_per_request, False, args.seed + i,
                              ahead_s=2 * (args.warmup + args.measure) + 60)  # fmt: skip
        for name, flags in (("off", off), ("on", on)):
            if name not in args.sides:
                continue
            store = f"duckdb:///{tmp}/{name}-{i}.duckdb"
            posts = receiver.posts
            row[name] = http_run(store, bodies, args.clients, args.warmup, args.measure,
                                 flags + ("--wal", str(tmp / f"wal-{name}-{i}")), count_by="hour")  # fmt: skip
            row[name]["notifications"] = receiver.posts - posts
        if len(row) < 2:  # one side only (--sides): a long memory run
            print(f"round {i + 1}: {json.dumps(row)}", flush=True)
            rounds.append(row)
            continue
        row["on_vs_off"] = round(row["on"]["events_per_s"] / row["off"]["events_per_s"], 3)
        rounds.append(row)
        print(f"round {i + 1}: off {row['off']['events_per_s']:>9,.0f} ev/s (p99 {row['off']['p99_ms']} ms, RSS "
              f"{row['off']['rss_mb']['mean']} MB, slope {row['off']['rss_mb']['slope_pct_per_min']} %/min)  on "
              f"{row['on']['events_per_s']:>9,.0f} ev/s (p99 {row['on']['p99_ms']} ms, RSS {row['on']['rss_mb']['mean']}"
              f" MB, slope {row['on']['rss_mb']['slope_pct_per_min']} %/min, {row['on']['notifications']} "
              f"notifications)  on/off {row['on_vs_off']}", flush=True)  # fmt: skip
    if any(len(r) < 2 for r in rounds):
        out = args.out or str(ROOT / "benchmarks" / "results" / "ingest_operations_memory.json")
        Path(out).write_text(json.dumps({"mode": "operations", "sides": args.sides, "warmup_s": args.warmup,
                                         "measure_s": args.measure, "rounds": rounds}, indent=2) + "\n")  # fmt: skip
        print(f"wrote {out}")
        return 0 if all(side["lost"] == 0 for r in rounds for side in r.values()) else 1
    med = lambda *keys: _median(rounds, *keys)
    summary = {
        "off_events_per_s": med("off", "events_per_s"),
        "on_events_per_s": med("on", "events_per_s"),
        "off_p99_ms": med("off", "p99_ms"),
        "on_p99_ms": med("on", "p99_ms"),
        "off_rss_mean_mb": med("off", "rss_mb", "mean"),
        "on_rss_mean_mb": med("on", "rss_mb", "mean"),
        "on_rss_slope_pct_per_min": med("on", "rss_mb", "slope_pct_per_min"),
        "on_vs_off": med("on_vs_off"),
        "on_flat_rounds": sum(bool(r["on"]["rss_mb"]["flat"]) for r in rounds),
        "lost": sum(r[k]["lost"] for r in rounds for k in ("off", "on")),
    }
    print()
    print("| | events/s (median) | p99 ms | RSS mean MB | RSS slope %/min | ratio (median of the rounds') |")
    print("|---|---|---|---|---|---|")
    print(f"| off | {summary['off_events_per_s']:,.0f} | {summary['off_p99_ms']} | "
          f"{summary['off_rss_mean_mb']} | | |")  # fmt: skip
    print(f"| {on_label} | {summary['on_events_per_s']:,.0f} | "
          f"{summary['on_p99_ms']} | {summary['on_rss_mean_mb']} | {summary['on_rss_slope_pct_per_min']} "
          f"(flat in {summary['on_flat_rounds']} of {len(rounds)}) | {summary['on_vs_off']} of off |")  # fmt: skip
    result = {"mode": "remote-write" if remote_write else "operations", "clients": args.clients, "events_per_request": args.events_per_request,
              "warmup_s": args.warmup, "measure_s": args.measure, "on_flags": list(on[:2]) + list(on[4:]),
              "cpus": os.cpu_count(), "rounds": rounds, "median": summary}  # fmt: skip
    name = "ingest_remote_write.json" if remote_write else "ingest_operations.json"
    out = args.out or str(ROOT / "benchmarks" / "results" / name)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    receiver.server.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if summary["lost"] == 0 else 1


def remote_write_cost(args: argparse.Namespace) -> int:
    """:func:`operations` with remote-write as the "on" side, to a Prometheus started here with its remote-write
    receiver; afterwards, how many samples it holds."""
    import urllib.request

    prometheus = shutil.which("prometheus") or "/usr/bin/prometheus"
    work = Path(tempfile.mkdtemp(prefix="drainpipe-prom-"))
    (work / "prometheus.yml").write_text("global: {scrape_interval: 1h}\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([prometheus, f"--config.file={work / 'prometheus.yml'}",
                             f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--web.enable-remote-write-receiver"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(base + "/-/ready", timeout=2):
                    break
            except OSError:
                time.sleep(0.2)
        args.operations = args.remote_write
        code = operations(args, remote_write=base + "/api/v1/write")
        with urllib.request.urlopen(f"{base}/api/v1/status/tsdb", timeout=30) as r:
            head = json.loads(r.read())["data"]["headStats"]
        print(f"Prometheus holds {head['numSeries']:,} series")
        return code
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def exemplar_cost(args: argparse.Namespace) -> int:
    """OTLP protobuf spans to ``serve`` with exemplars on (``[prometheus] exemplars = true`` over the default
    metrics: trace ids through the parsers and the log, the live histogram's exemplars and the stored top-N
    ``exemplars``) against off, durable, in alternation, ``args.exemplars`` rounds: request spans/s, medians and
    the ratio (ingest_exemplars.json)."""
    tmp = Path(tempfile.mkdtemp(prefix="drainpipe-exemplars-"))
    toml = tmp / "exemplars.toml"
    toml.write_text("[prometheus]\nexemplars = true\n\n" + definitions_toml(""))
    print(f"building {args.bodies} bodies of {args.events_per_request} events ...", flush=True)
    bodies = build_bodies(args.bodies, args.events_per_request, False, args.seed)
    spans, per_request = otlp_bodies(bodies), args.events_per_request
    rounds = []
    for i in range(args.exemplars):
        row: dict[str, Any] = {}
        for name, flags in (("off", ()), ("on", ("--metrics", str(toml)))):
            store = f"duckdb:///{tmp}/{name}-{i}.duckdb"
            row[name] = http_run(store, spans, args.clients, args.warmup, args.measure,
                                 ("--wal", str(tmp / f"wal-{name}-{i}"), *flags), per_request)  # fmt: skip
        row["on_vs_off"] = round(row["on"]["events_per_s"] / row["off"]["events_per_s"], 3)
        rounds.append(row)
        print(f"round {i + 1}: off {row['off']['events_per_s']:>9,.0f} request spans/s (p99 {row['off']['p99_ms']} ms)"
              f"  on {row['on']['events_per_s']:>9,.0f} (p99 {row['on']['p99_ms']} ms)  on/off {row['on_vs_off']}",
              flush=True)  # fmt: skip
    med = lambda *keys: _median(rounds, *keys)
    summary = {"off_spans_per_s": med("off", "events_per_s"), "on_spans_per_s": med("on", "events_per_s"),
               "on_vs_off": round(med("on", "events_per_s") / med("off", "events_per_s"), 3),
               "median_round_ratio": med("on_vs_off"),
               "lost": sum(r[name]["lost"] for r in rounds for name in ("off", "on"))}  # fmt: skip
    print(f"medians: off {summary['off_spans_per_s']:,.0f}  on {summary['on_spans_per_s']:,.0f} request spans/s  "
          f"on/off {summary['on_vs_off']} (median of the rounds' ratios {summary['median_round_ratio']}); "
          f"lost {summary['lost']}")  # fmt: skip
    out = args.out or str(ROOT / "benchmarks" / "results" / "ingest_exemplars.json")
    Path(out).write_text(json.dumps({"mode": "exemplars", "warmup_s": args.warmup, "measure_s": args.measure,
                                     "clients": args.clients, "rounds": rounds, "summary": summary}, indent=2))  # fmt: skip
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if summary["lost"] == 0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--warmup", type=float, default=60.0, help="seconds of load before the measured window")
    ap.add_argument("--measure", type=float, default=180.0, help="seconds of the measured window")
    ap.add_argument("--bodies", type=int, default=600, help="distinct request bodies (cycled)")
    ap.add_argument("--events-per-request", type=int, default=1000)
    ap.add_argument("--store", help="store URL (default: a fresh DuckDB file in a temp dir)")
    ap.add_argument("--gzip", action="store_true", help="gzip the bodies")
    ap.add_argument("--flat-pct", type=float, default=1.0, help="flat: RSS slope below this %% of RSS per minute")
    ap.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment of the server process (e.g. allocator settings to compare)",
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=None, help="JSON result (default: benchmarks/results/ingest_load.json, or "
                    "ingest_compare.json with --compare)")  # fmt: skip
    ap.add_argument("--compare", type=int, default=0, metavar="ROUNDS",
                    help="instead of the memory test: HTTP durable vs --durability none vs drainpipe run on the same "
                    "events as one JSONL file, ROUNDS rounds in alternation")  # fmt: skip
    ap.add_argument(
        "--file-repeats", type=int, default=5, help="--compare: the JSONL file is the bodies this many times"
    )
    ap.add_argument("--serve-arg", action="append", default=[], help="--compare: an extra flag for drainpipe serve")
    ap.add_argument("--grpc", action="store_true",
                    help="with --otlp: the same exports over OTLP/gRPC too, a third server per round")  # fmt: skip
    ap.add_argument("--otlp", type=int, default=0, metavar="ROUNDS",
                    help="instead of the memory test: the same events as NDJSON to /v1/events and as OTLP protobuf "
                    "spans to /v1/traces, ROUNDS rounds in alternation (ingest_otlp.json)")  # fmt: skip
    ap.add_argument("--operations", type=int, default=0, metavar="ROUNDS",
                    help="instead of the memory test: retention purges and alert evaluation on against off, ROUNDS "
                    "rounds in alternation (ingest_operations.json)")  # fmt: skip
    ap.add_argument("--remote-write", type=int, default=0, metavar="ROUNDS",
                    help="serve with --remote-write to a real Prometheus (Debian's, started here) against without, "
                    "ROUNDS rounds in alternation (ingest_remote_write.json)")  # fmt: skip
    ap.add_argument("--exemplars", type=int, default=0, metavar="ROUNDS",
                    help="OTLP spans to serve with [prometheus] exemplars = true against without, ROUNDS rounds in "
                    "alternation (ingest_exemplars.json)")  # fmt: skip
    ap.add_argument("--sides", default="off,on", help="--operations: which runs, off,on (default) or one of them")
    args = ap.parse_args()
    args.sides = args.sides.split(",")
    if args.remote_write:
        return remote_write_cost(args)
    if args.exemplars:
        return exemplar_cost(args)
    if args.operations:
        return operations(args)
    if args.otlp:
        print(f"building {args.bodies} bodies of {args.events_per_request} events ...", flush=True)
        return compare_otlp(args, build_bodies(args.bodies, args.events_per_request, False, args.seed))
    if args.compare:
        args.out = args.out or str(ROOT / "benchmarks" / "results" / "ingest_compare.json")
        print(f"building {args.bodies} bodies of {args.events_per_request} events ...", flush=True)
        return compare(args, build_bodies(args.bodies, args.events_per_request, False, args.seed))
    args.out = args.out or str(ROOT / "benchmarks" / "results" / "ingest_load.json")

    tmp = tempfile.mkdtemp(prefix="drainpipe-load-")
    store = args.store or f"duckdb:///{tmp}/load.duckdb"
    schema = None
    if store.startswith(("postgresql://", "postgres://")):
        store, schema = fresh_pg_schema(store)
    print(f"building {args.bodies} bodies of {args.events_per_request} events ...", flush=True)
    bodies = build_bodies(args.bodies, args.events_per_request, args.gzip, args.seed)
    server_env = dict(kv.split("=", 1) for kv in args.server_env)
    load_before = os.getloadavg()
    proc, host, port = start_server(store, server_env)
    total_s = args.warmup + args.measure
    print(
        f"server pid {proc.pid} on {host}:{port}, store {store}; {args.clients} clients, "
        f"{args.warmup:.0f} s warm-up + {args.measure:.0f} s measured",
        flush=True,
    )

    rss: list[tuple[float, int]] = []
    pss_peak = [0]  # KB: the server's process tree, sampled every 5 s (smaps_rollup is not free to read)
    tree_cpu: dict[str, tuple[float, float]] = {}  # (time, CPU seconds of the server tree) at the window's ends
    done = threading.Event()
    t_start = time.perf_counter()

    def sample_rss() -> None:
        n = 0
        tree = [proc.pid, *children_of(proc.pid)]  # (once: scanning /proc each time cost the clients' GIL throughput)
        while not done.is_set():
            now = time.perf_counter() - t_start
            rss.append((now, rss_kb(proc.pid)))
            if "start" not in tree_cpu and now >= args.warmup:
                tree_cpu["start"] = (now, sum(cpu_s(p) for p in tree))
            elif "end" not in tree_cpu and now >= total_s - 0.25:
                tree_cpu["end"] = (now, sum(cpu_s(p) for p in tree))
            if n % 10 == 0:  # (reading smaps_rollup walks the page tables: every 5 s)
                pss_peak[0] = max(pss_peak[0], sum(memory_kb(p, "Pss", "smaps_rollup") for p in tree))
            n += 1
            done.wait(0.5)

    rss_idle = rss_kb(proc.pid)
    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    load = drive(host, port, bodies, args.gzip, args.clients, t_start, total_s)
    accepted, latencies, end_to_end, retries, errors = (
        [load.accepted],
        load.latencies,
        load.end_to_end,
        load.retries,
        load.errors,
    )
    elapsed = time.perf_counter() - t_start
    done.set()
    sampler.join()
    if "start" in tree_cpu and "end" not in tree_cpu:  # the load ended between two samples
        tree_cpu["end"] = (elapsed, sum(cpu_s(p) for p in [proc.pid, *children_of(proc.pid)]))
    load_after = os.getloadavg()

    t_stop = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    shutdown_s = time.perf_counter() - t_stop
    summary_line = out.strip().splitlines()[-1] if out.strip() else ""
    server = dict(kv.split("=", 1) for kv in summary_line.split(": ", 2)[-1].split() if "=" in kv)

    s = open_store(store)
    try:
        stored = int(round(sum(r[5] for r in s.query(metric="service_cpm", granularity="minute"))))
    finally:
        s.close()
    shutil.rmtree(tmp, ignore_errors=True)

    if schema:
        drop_pg_schema(args.store, schema)
    q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")
    lat_ms = sorted(x * 1000 for _, x in latencies)
    measured = [x for t, x in latencies if t >= args.warmup]
    lat_measured_ms = sorted(x * 1000 for x in measured)
    e2e_ms = sorted(x * 1000 for x in end_to_end)
    # the window ends when the clients stop starting requests (after that the load tapers off)
    memory = memory_verdict(rss, args.warmup, total_s - 0.25, args.flat_pct)
    requests_done = len(latencies)
    events_measured = len(measured) * args.events_per_request
    cpu_cores = 0.0  # the server tree's cores in the measured window
    if "start" in tree_cpu and "end" in tree_cpu:
        (t0, c0), (t1, c1) = tree_cpu["start"], tree_cpu["end"]
        cpu_cores = (c1 - c0) / (t1 - t0)
    result = {
        "clients": args.clients,
        "warmup_s": args.warmup,
        "measure_s": args.measure,
        "events_per_request": args.events_per_request,
        "gzip": args.gzip,
        "server_env": server_env,
        "store": re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", store),
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "elapsed_s": round(elapsed, 2),
        "requests": requests_done,
        "events_accepted": accepted[0],
        "events_per_s": round(accepted[0] / elapsed, 1),
        "events_per_s_measured": round(events_measured / args.measure, 1),
        "requests_per_s": round(requests_done / elapsed, 1),
        "latency_ms": {
            "p50": round(q(lat_ms, 0.5), 2),
            "p90": round(q(lat_ms, 0.9), 2),
            "p99": round(q(lat_ms, 0.99), 2),
            "max": round(lat_ms[-1], 2) if lat_ms else None,
        },
        "latency_measured_ms": {"p50": round(q(lat_measured_ms, 0.5), 2), "p99": round(q(lat_measured_ms, 0.99), 2)},
        "latency_with_retries_ms": {"p50": round(q(e2e_ms, 0.5), 2), "p99": round(q(e2e_ms, 0.99), 2)},
        "retries": retries,
        "errors": len(errors),
        "error_samples": errors[:5],
        "server_accepted": int(server.get("accepted", -1)),
        "server_dropped": int(server.get("dropped", -1)),
        "events_in_store": stored,
        "lost": accepted[0] - stored,
        "shutdown_s": round(shutdown_s, 2),
        "server_exit_code": proc.returncode,
        "server_tree_cpu_cores": round(cpu_cores, 3) if cpu_cores else None,
        "events_per_cpu_s": round(events_measured / args.measure / cpu_cores, 1) if cpu_cores else None,
        "pss_peak_mb": round(pss_peak[0] / 1024, 1),
        "rss_mb": {
            "idle": round(rss_idle / 1024, 1),
            **memory,
            "samples": [[round(t, 1), round(kb / 1024, 1)] for t, kb in rss],
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")

    m = result["rss_mb"]
    rows = [
        (
            "clients x events/request",
            f"{args.clients} x {args.events_per_request}"
            + (" (gzip)" if args.gzip else "")
            + (f"  server env {server_env}" if server_env else ""),
        ),
        ("elapsed (warm-up + measured)", f"{elapsed:.1f} s ({args.warmup:.0f} + {args.measure:.0f})"),
        ("requests / events accepted", f"{requests_done:,} / {accepted[0]:,}"),
        (
            "sustained events/s (all / measured window)",
            f"{result['events_per_s']:,.0f} / {result['events_per_s_measured']:,.0f}",
        ),
        (
            "ingest latency p50 / p90 / p99",
            f"{result['latency_ms']['p50']} / {result['latency_ms']['p90']} / {result['latency_ms']['p99']} ms",
        ),
        (
            "incl. back-pressure retries p50 / p99",
            f"{result['latency_with_retries_ms']['p50']} / {result['latency_with_retries_ms']['p99']} ms",
        ),
        ("429 / 503 retries", f"{retries['429']} / {retries['503']}"),
        ("accepted / in store / lost", f"{accepted[0]:,} / {stored:,} / {accepted[0] - stored}"),
        ("dropped in queues", str(result["server_dropped"])),
        (
            "server tree: cores used (window) / events per CPU s",
            f"{result['server_tree_cpu_cores']} / {result['events_per_cpu_s']:,}" if cpu_cores else "n/a",
        ),
        ("server tree: peak PSS", f"{result['pss_peak_mb']} MB"),
        ("server RSS idle", f"{m['idle']} MB"),
        (
            "RSS in the window first / last / min / max",
            f"{m.get('first')} / {m.get('last')} / {m.get('min')} / {m.get('max')} MB (mean {m.get('mean')})",
        ),
        (
            "RSS slope (least squares)",
            f"{m.get('slope_mb_per_min')} MB/min = {m.get('slope_pct_per_min')} %/min"
            f" -> {'FLAT' if m.get('flat') else 'NOT flat'} ({m.get('flat_criterion')})",
        ),
        ("graceful shutdown (drain + flush)", f"{shutdown_s:.1f} s, exit {proc.returncode}"),
        ("transport errors", str(len(errors))),
        ("load average before / after", f"{load_before[0]:.2f} / {load_after[0]:.2f}"),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(f"\nwrote {args.out}")
    ok = accepted[0] == stored and stored > 0 and proc.returncode == 0 and not errors and memory.get("flat", False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
