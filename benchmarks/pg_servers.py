"""Scaling out: 1 and 2 ``drainpipe serve`` processes on one PostgreSQL store, the same clients, the same run.

    .venv/bin/python benchmarks/pg_servers.py [--rounds 3] [--clients 24] [--warmup 10] [--measure 30] [--pg URL]

Each round runs both set-ups in alternation, each on a fresh schema: ``--clients`` threads post NDJSON bodies of
1,000 events (the bodies of ``ingest_load.py``), all to the one server or split evenly over two. Per set-up:
events/s and p99 in the measured window, and the store checked against what was acknowledged after a graceful stop
(lost must be 0). From the servers' ``/metrics``: store merges committed per second and their mean duration (the
lock wait included).

Then the store's own ceiling, without HTTP: one process merging checkpoint-sized partials (``--checkpoint-events``
events of the same workload, aggregated once) back to back into a fresh schema, so that a user can size a
deployment: merges/s, and events/s at that checkpoint size. Prints tables and writes
``benchmarks/results/pg_servers.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from drainpipe.pipeline.store import open_store
from ingest_load import _median, _q, build_bodies, drive, drop_pg_schema, fresh_pg_schema, start_server


def _scrape(host: str, port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    wanted = ("drainpipe_engine_persisted_batches_total", "drainpipe_engine_store_write_seconds_total")
    out = {}
    for name in wanted:
        m = re.search(rf"^{name} ([\d.e+-]+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def setup_run(pg: str, servers: int, bodies: list[bytes], args: argparse.Namespace, work: Path) -> dict:
    """``servers`` servers on a fresh schema under ``args.clients`` clients split evenly; the measured window."""
    url, schema = fresh_pg_schema(pg)
    procs = [start_server(url, extra=("--wal", str(work / f"wal-{servers}-{i}-{time.time_ns()}")))
             for i in range(servers)]  # fmt: skip
    try:
        loads: list = [None] * servers
        t_start = time.perf_counter()
        share = args.clients // servers

        def one(i: int) -> None:
            _, host, port = procs[i]
            loads[i] = drive(host, port, bodies, False, share, t_start, args.warmup + args.measure)

        scrape_at = t_start + args.warmup
        before: list[dict] = []
        threads = [threading.Thread(target=one, args=(i,)) for i in range(servers)]
        for t in threads:
            t.start()
        time.sleep(max(0.0, scrape_at - time.perf_counter()))
        before = [_scrape(h, p) for _, h, p in procs]
        for t in threads:
            t.join()
        after = [_scrape(h, p) for _, h, p in procs]
    finally:
        codes = []
        for proc, _, _ in procs:
            proc.send_signal(signal.SIGTERM)
            codes.append(proc.wait(300))
    with open_store(url) as store:  # type: ignore[attr-defined]
        stored = int(round(sum(r[5] for r in store.query(metric="service_cpm", granularity="minute"))))
    drop_pg_schema(pg, schema)
    per_request = len(bodies[0].splitlines())
    window = sorted(x * 1000 for load in loads for t, x in load.latencies if t >= args.warmup)
    acked = sum(load.accepted for load in loads)
    merges = sum(a["drainpipe_engine_persisted_batches_total"] - b["drainpipe_engine_persisted_batches_total"]
                 for a, b in zip(after, before))  # fmt: skip
    merge_s = sum(a["drainpipe_engine_store_write_seconds_total"] - b["drainpipe_engine_store_write_seconds_total"]
                  for a, b in zip(after, before))  # fmt: skip
    return {
        "servers": servers,
        "events_per_s": round(len(window) * per_request / args.measure, 1),
        "p50_ms": round(_q(window, 0.5), 2),
        "p99_ms": round(_q(window, 0.99), 2),
        "acknowledged": acked,
        "stored": stored,
        "lost": acked - stored,
        "errors": sum(len(load.errors) for load in loads),
        "exits": codes,
        "merges_per_s": round(merges / args.measure, 2),
        "mean_merge_ms": round(1000 * merge_s / merges, 1) if merges else None,
        "store_busy": round(merge_s / args.measure, 3),  # summed over servers: > 1 means merges queued on the lock
    }


def store_ceiling(pg: str, bodies: list[bytes], checkpoint_events: int, merges: int) -> dict:
    """Merges of checkpoint-sized partials back to back from one process into a fresh schema."""
    import pyarrow as pa

    from drainpipe.inputs import validate_json_lines
    from drainpipe.pipeline.aggregate import aggregate_batch
    from drainpipe.pipeline.definitions import default_definitions

    per_request = len(bodies[0].splitlines())
    n = max(1, checkpoint_events // per_request)
    definitions = default_definitions()
    partials = []
    for k in range(merges):
        chunk = bodies[(k * n) % len(bodies) : (k * n) % len(bodies) + n]
        table = pa.Table.from_batches([validate_json_lines(b)[0] for b in chunk]).combine_chunks().to_batches()[0]
        partials.append(aggregate_batch(table, definitions))
    url, schema = fresh_pg_schema(pg)
    try:
        with open_store(url) as store:  # type: ignore[attr-defined]
            store.merge(partials[0])  # the first writes every key: not what the steady state does
            t0 = time.perf_counter()
            for p in partials[1:]:
                store.merge(p)
            seconds = time.perf_counter() - t0
    finally:
        drop_pg_schema(pg, schema)
    per_s = (merges - 1) / seconds
    return {"checkpoint_events": n * per_request, "merges_per_s": round(per_s, 2),
            "mean_merge_ms": round(1000 / per_s, 1), "events_per_s": round(per_s * n * per_request, 1)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--measure", type=float, default=30.0)
    ap.add_argument("--bodies", type=int, default=300)
    ap.add_argument("--checkpoint-events", type=int, default=100_000,
                    help="events per merge in the store-ceiling measurement")  # fmt: skip
    ap.add_argument("--pg", default=None, help="PostgreSQL URL (default: scripts/postgres.sh url)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pg_servers.json"))
    args = ap.parse_args()
    pg = args.pg or subprocess.run([str(ROOT / "scripts" / "postgres.sh"), "url"], capture_output=True, text=True,
                                   check=True).stdout.strip()  # fmt: skip
    print(f"building {args.bodies} bodies of 1000 events ...", flush=True)
    bodies = build_bodies(args.bodies, 1000, False, 7)
    work = Path(tempfile.mkdtemp(prefix="drainpipe-pg-servers-"))
    rounds = []
    for i in range(args.rounds):
        row = {str(n): setup_run(pg, n, bodies, args, work) for n in (1, 2)}
        row["ratio_2_to_1"] = round(row["2"]["events_per_s"] / row["1"]["events_per_s"], 3)
        rounds.append(row)
        print(f"round {i + 1}: " + "  ".join(
            f"{n} server(s) {row[n]['events_per_s']:>9,.0f} events/s p99 {row[n]['p99_ms']} ms "
            f"{row[n]['merges_per_s']} merges/s of {row[n]['mean_merge_ms']} ms lost {row[n]['lost']}"
            for n in ("1", "2")) + f"  ratio {row['ratio_2_to_1']}", flush=True)  # fmt: skip
    ceiling = store_ceiling(pg, bodies, args.checkpoint_events, 12)
    median = {
        **{f"{n}_server_events_per_s": _median(rounds, n, "events_per_s") for n in ("1", "2")},
        **{f"{n}_server_p99_ms": _median(rounds, n, "p99_ms") for n in ("1", "2")},
        **{f"{n}_server_merges_per_s": _median(rounds, n, "merges_per_s") for n in ("1", "2")},
        **{f"{n}_server_mean_merge_ms": _median(rounds, n, "mean_merge_ms") for n in ("1", "2")},
        "ratio_2_to_1": _median(rounds, "ratio_2_to_1"),
        "lost": sum(r[n]["lost"] for r in rounds for n in ("1", "2")),
    }
    print()
    print("| servers | events/s (median) | p99 ms | store merges/s | mean merge ms | ratio |")
    print("|---|---|---|---|---|---|")
    for n in ("1", "2"):
        print(f"| {n} | {median[f'{n}_server_events_per_s']:,.0f} | {median[f'{n}_server_p99_ms']} | "
              f"{median[f'{n}_server_merges_per_s']} | {median[f'{n}_server_mean_merge_ms']} | "
              f"{median['ratio_2_to_1'] if n == '2' else ''} |")  # fmt: skip
    print()
    print(f"store ceiling (one process, back to back): {ceiling['merges_per_s']} merges/s of "
          f"{ceiling['checkpoint_events']:,} events ({ceiling['mean_merge_ms']} ms each) = "
          f"{ceiling['events_per_s']:,.0f} events/s")  # fmt: skip
    result = {"clients": args.clients, "warmup_s": args.warmup, "measure_s": args.measure, "cpus": os.cpu_count(),
              "rounds": rounds, "median": median, "store_ceiling": ceiling}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if median["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
