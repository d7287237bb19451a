"""A bounded load test of `drainpipe serve` on loopback.

The server runs as its own process (``drainpipe serve``, a fresh DuckDB store by default); this process is the
load generator: ``--clients`` threads, each with one keep-alive connection, send a fixed number of NDJSON
requests (``--requests`` x ``--events-per-request``, bodies built before the clock starts). A 429/503 answer is
retried after its Retry-After (counted). Meanwhile the server's RSS is sampled every 0.5 s.

Afterwards the server is stopped with SIGTERM (graceful: drains, flushes, closes the store) and the events in
the store (sum of the minute ``service_cpm`` values) are compared with the events the server accepted.

Prints a table and writes benchmarks/results/ingest_load.json.

    .venv/bin/python benchmarks/ingest_load.py                      # defaults: 8 clients, 1200 x 1000 events (~30 s)
    .venv/bin/python benchmarks/ingest_load.py --store postgresql://drainpipe:drainpipe@127.0.0.1:55432/drainpipe
"""
from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from drainpipe.pipeline.generator import generate_events, write_events  # noqa: E402
from drainpipe.pipeline.store import open_store  # noqa: E402


def build_bodies(requests: int, per_request: int, gzipped: bool, seed: int) -> list[bytes]:
    """``requests`` NDJSON bodies of ``per_request`` events each (timestamps around now, 20 services, Zipf 1.1)."""
    total = requests * per_request
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        now = int(time.time() * 1000)
        write_events(generate_events(total, services=20, seed=seed, start_ms=now - 120_000, duration_s=120), path)
        lines = path.read_bytes().splitlines(keepends=True)
    bodies = [b"".join(lines[i * per_request:(i + 1) * per_request]) for i in range(requests)]
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


def rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def start_server(store: str) -> tuple[subprocess.Popen, str, int]:
    proc = subprocess.Popen([sys.executable, "-m", "drainpipe.cli", "serve", "--store", store, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    line = proc.stdout.readline()
    m = re.search(r"listening on http://([\d.]+):(\d+)", line)
    if not m:
        proc.kill()
        raise SystemExit(f"serve did not start: {line!r} {proc.stderr.read()}")
    return proc, m.group(1), int(m.group(2))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=1200, help="total requests (fixed)")
    ap.add_argument("--events-per-request", type=int, default=1000)
    ap.add_argument("--store", help="store URL (default: a fresh DuckDB file in a temp dir)")
    ap.add_argument("--gzip", action="store_true", help="gzip the bodies")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ingest_load.json"))
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="drainpipe-load-")
    store = args.store or f"duckdb:///{tmp}/load.duckdb"
    schema = None
    if store.startswith(("postgresql://", "postgres://")):
        store, schema = fresh_pg_schema(store)
    print(f"building {args.requests} bodies of {args.events_per_request} events ...", flush=True)
    bodies = build_bodies(args.requests, args.events_per_request, args.gzip, args.seed)
    proc, host, port = start_server(store)
    print(f"server pid {proc.pid} on {host}:{port}, store {store}; {args.clients} clients", flush=True)

    next_index = [0]
    lock = threading.Lock()
    latencies: list[float] = []          # successful attempt, seconds
    end_to_end: list[float] = []         # including back-pressure retries
    accepted = [0]
    retries = {"429": 0, "503": 0}
    errors: list[str] = []
    rss: list[tuple[float, int]] = []
    done = threading.Event()
    headers = {"Content-Type": "application/x-ndjson"}
    if args.gzip:
        headers["Content-Encoding"] = "gzip"

    def client() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=60)
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= len(bodies):
                break
            first = time.perf_counter()
            while True:
                t0 = time.perf_counter()
                try:
                    conn.request("POST", "/v1/events", bodies[i], headers)
                    r = conn.getresponse()
                    payload = r.read()
                except (OSError, http.client.HTTPException) as exc:
                    conn.close()
                    conn = http.client.HTTPConnection(host, port, timeout=60)
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.1)
                    continue
                t1 = time.perf_counter()
                if r.status in (429, 503):
                    with lock:
                        retries[str(r.status)] += 1
                    if r.getheader("Connection", "").lower() == "close":
                        conn.close()
                        conn = http.client.HTTPConnection(host, port, timeout=60)
                    time.sleep(float(r.getheader("Retry-After") or 1) / 10)   # polite, but keep the test bounded
                    continue
                if r.status != 200:
                    with lock:
                        errors.append(f"HTTP {r.status}: {payload[:200]!r}")
                    break
                answer = json.loads(payload)
                with lock:
                    accepted[0] += answer["accepted"]
                    latencies.append(t1 - t0)
                    end_to_end.append(t1 - first)
                break
        conn.close()

    def sample_rss() -> None:
        start = time.perf_counter()
        while not done.is_set():
            rss.append((time.perf_counter() - start, rss_kb(proc.pid)))
            done.wait(0.5)

    sampler = threading.Thread(target=sample_rss, daemon=True)
    rss_idle = rss_kb(proc.pid)
    sampler.start()
    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    t_start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t_start
    done.set()
    sampler.join()

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

    if schema:
        drop_pg_schema(args.store, schema)
    lat_ms = sorted(x * 1000 for x in latencies)
    e2e_ms = sorted(x * 1000 for x in end_to_end)
    q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")  # noqa: E731
    warm = [kb for t, kb in rss if t >= 5.0] or [kb for _, kb in rss]   # after 5 s of warm-up
    mem = warm
    third = max(1, len(mem) // 3)
    result = {
        "clients": args.clients, "requests": args.requests, "events_per_request": args.events_per_request,
        "gzip": args.gzip, "store": re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", store), "cpus": os.cpu_count(),
        "elapsed_s": round(elapsed, 2), "events_sent": args.requests * args.events_per_request,
        "events_accepted": accepted[0], "events_per_s": round(accepted[0] / elapsed, 1),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "latency_ms": {"p50": round(q(lat_ms, 0.5), 2), "p90": round(q(lat_ms, 0.9), 2), "p99": round(q(lat_ms, 0.99), 2),
                       "max": round(lat_ms[-1], 2) if lat_ms else None},
        "latency_with_retries_ms": {"p50": round(q(e2e_ms, 0.5), 2), "p99": round(q(e2e_ms, 0.99), 2)},
        "retries": retries, "errors": len(errors), "error_samples": errors[:5],
        "server_accepted": int(server.get("accepted", -1)), "server_dropped": int(server.get("dropped", -1)),
        "events_in_store": stored, "lost": accepted[0] - stored, "shutdown_s": round(shutdown_s, 2),
        "server_exit_code": proc.returncode,
        "rss_mb": {"idle": round(rss_idle / 1024, 1),
                   "first_third_mean": round(statistics.mean(mem[:third]) / 1024, 1) if mem else None,
                   "last_third_mean": round(statistics.mean(mem[-third:]) / 1024, 1) if mem else None,
                   "growth_pct": round(100 * (statistics.mean(mem[-third:]) / statistics.mean(mem[:third]) - 1), 1)
                   if mem else None,
                   "max": round(max(kb for _, kb in rss) / 1024, 1) if rss else None,
                   "note": "first/last third of the samples after 5 s of warm-up",
                   "samples": [[round(t, 1), round(kb / 1024, 1)] for t, kb in rss]},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")

    rows = [
        ("clients x requests x events", f"{args.clients} x {args.requests} x {args.events_per_request}"
         + (" (gzip)" if args.gzip else "")),
        ("elapsed", f"{elapsed:.1f} s"),
        ("sustained events/s", f"{result['events_per_s']:,.0f}"),
        ("requests/s", f"{result['requests_per_s']:,.1f}"),
        ("ingest latency p50 / p90 / p99", f"{result['latency_ms']['p50']} / {result['latency_ms']['p90']} / "
                                          f"{result['latency_ms']['p99']} ms"),
        ("incl. back-pressure retries p50 / p99", f"{result['latency_with_retries_ms']['p50']} / "
                                                  f"{result['latency_with_retries_ms']['p99']} ms"),
        ("429 / 503 retries", f"{retries['429']} / {retries['503']}"),
        ("accepted / in store / lost", f"{accepted[0]:,} / {stored:,} / {accepted[0] - stored}"),
        ("dropped in queues", str(result["server_dropped"])),
        ("server RSS idle / steady first third / last third / max", f"{result['rss_mb']['idle']} / "
         f"{result['rss_mb']['first_third_mean']} / {result['rss_mb']['last_third_mean']} / {result['rss_mb']['max']} MB"
         f" ({result['rss_mb']['growth_pct']:+.1f}%)"),
        ("graceful shutdown (drain + flush)", f"{shutdown_s:.1f} s, exit {proc.returncode}"),
        ("transport errors", str(len(errors))),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(f"\nwrote {args.out}")
    ok = accepted[0] == stored == args.requests * args.events_per_request and proc.returncode == 0 and not errors
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
