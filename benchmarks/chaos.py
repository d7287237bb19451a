"""Chaos: kill -9 at random moments, then check that nothing was lost or counted twice.

    .venv/bin/python benchmarks/chaos.py run [--kills 20] [--events 4000000] [--checkpoint-s 1] [--json out.json]
    .venv/bin/python benchmarks/chaos.py serve [--kills 20] [--clients 4] [--store duckdb|postgresql] [--pg URL]

``run`` mode: ``drainpipe run`` (the real command, worker processes and all) over one large JSON Lines file, with a
checkpoint every ``--checkpoint-s`` seconds. First one uninterrupted run gives the reference store and the run
time T. Then, ``--kills`` times: a fresh store, a run SIGKILLed at a random moment in [0.05 T, 0.95 T], a check
that no worker process outlived it, and a rerun of the same command to the end; the store must equal the
reference row for row (metric values, float sums to 1e-12 relative, and every top-N row). Prints a table (one row
per kill) and a verdict, and writes JSON (default ``benchmarks/results/chaos-run.json``).

``serve`` mode: ``drainpipe serve`` (durable, the default) on a fresh DuckDB file or a fresh PostgreSQL schema,
``--clients`` threads posting NDJSON requests of 200 events, each request under a service name of its own (see
tests/serve_kill.py). ``--kills`` times: start the server (it replays what the last kill left in its write-ahead
log: the bytes to replay and the time the replay took are recorded), post for a random 0.5-3 s, SIGKILL. Then
one last start and a graceful stop. Per request the store must hold all of an acknowledged request once, and of
an unanswered one all or nothing: lost and duplicated events must both be 0. Writes
``benchmarks/results/chaos-serve-<store>.json``. ``--servers 2`` (PostgreSQL): a second server on the same store
takes its own clients the whole time and is never killed, while the first is killed and restarted as above
(``chaos-serve-postgresql-2servers.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from drainpipe.pipeline.generator import generate_events, write_events
from drainpipe.pipeline.store import open_store

sys.path.insert(0, str(ROOT / "tests"))
from procs import alive, children_of  # shared with the kill tests
from serve_kill import Books, body_template, check, post_until, start_serve

DRAINPIPE = [sys.executable, "-m", "drainpipe.cli"]


def _run(args: list[str]) -> tuple[int, float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(DRAINPIPE + args, capture_output=True, text=True, timeout=3600)
    return done.returncode, time.perf_counter() - t0, (done.stdout + done.stderr).strip()


def _contents(url: str) -> tuple[dict[tuple, float], list[tuple]]:
    store = open_store(url)
    try:
        values = {tuple(r[:5]): r[5] for r in store.query()}
        topn = [tuple(r) for name in store.stored_names() for r in store.query_topn(name)]
        return values, topn
    finally:
        store.close()


def _same(ref: tuple[dict, list], got: tuple[dict, list]) -> str:
    """'' when equal, else what differs."""
    if ref[0].keys() != got[0].keys():
        return f"metric keys differ ({len(ref[0])} vs {len(got[0])})"
    bad = [k for k, v in ref[0].items() if not math.isclose(v, got[0][k], rel_tol=1e-12)]
    if bad:
        return f"{len(bad)} values differ, e.g. {bad[0]}: {ref[0][bad[0]]} vs {got[0][bad[0]]}"
    if ref[1] != got[1]:
        return f"top-N rows differ ({len(ref[1])} vs {len(got[1])})"
    return ""


def run_mode(opts: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="drainpipe-chaos-"))
    data = Path(opts.data_dir) / f"chaos-{opts.events}.jsonl"
    if not data.exists():
        data.parent.mkdir(parents=True, exist_ok=True)
        print(f"generating {opts.events:,} events -> {data}", flush=True)
        write_events(generate_events(opts.events, services=40, endpoints_per_service=10, seed=3), data)
    common = ["run", "-q", "--input", str(data), "--checkpoint-s", str(opts.checkpoint_s)]
    ref_url = f"duckdb:///{work}/reference.duckdb"
    code, clean_s, out = _run([*common, "--store", ref_url])
    if code != 0:
        raise SystemExit(f"the reference run failed: {out}")
    reference = _contents(ref_url)
    print(f"reference run: {clean_s:.2f} s, {len(reference[0]):,} metric values, {len(reference[1]):,} top-N rows")
    rng = random.Random(opts.seed)
    rows = []
    for i in range(opts.kills):
        url = f"duckdb:///{work}/kill-{i}.duckdb"
        at = rng.uniform(0.05, 0.95) * clean_s
        child = subprocess.Popen(DRAINPIPE + [*common, "--store", url], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)  # fmt: skip
        workers: list[int] = []
        deadline = time.monotonic() + at
        while time.monotonic() < deadline and child.poll() is None:
            workers = children_of(child.pid) or workers
            time.sleep(0.01)
        finished_first = child.poll() is not None
        child.send_signal(signal.SIGKILL)
        child.wait()
        time.sleep(0.5)
        orphans = alive(workers)
        code, rerun_s, out = _run([*common, "--store", url])
        diff = _same(reference, _contents(url)) if code == 0 else f"rerun exit {code}: {out[-300:]}"
        rows.append({"kill": i + 1, "at_s": round(at, 2), "finished_before_kill": finished_first,
                     "orphan_workers": len(orphans), "rerun_exit": code, "rerun_s": round(rerun_s, 2),
                     "identical": not diff, "difference": diff})  # fmt: skip
        r = rows[-1]
        print(f"kill {r['kill']:>2} at {r['at_s']:>6.2f} s  orphans {r['orphan_workers']}  rerun exit "
              f"{r['rerun_exit']}  {r['rerun_s']:>6.2f} s  {'identical' if r['identical'] else 'DIFFERENT: ' + diff}",
              flush=True)  # fmt: skip
        for f in work.glob(f"kill-{i}.*"):
            f.unlink()
    identical = sum(r["identical"] for r in rows)
    print()
    print("| kills | identical to the uninterrupted run | different | orphaned workers | rerun exit != 0 |")
    print("|---|---|---|---|---|")
    print(f"| {len(rows)} | {identical} | {len(rows) - identical} | {sum(r['orphan_workers'] for r in rows)} | "
          f"{sum(r['rerun_exit'] != 0 for r in rows)} |")  # fmt: skip
    verdict = identical == len(rows) and not any(r["orphan_workers"] for r in rows)
    print("PASS" if verdict else "FAIL")
    return {"mode": "run", "events": opts.events, "checkpoint_s": opts.checkpoint_s, "clean_run_s": clean_s,
            "kills": rows, "identical": identical, "pass": verdict}  # fmt: skip


def _stats(base: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(base + "/v1/stats", timeout=10) as r:
        return json.loads(r.read())


def _start_and_recover(url: str, wal: str) -> tuple[subprocess.Popen[str], str, int, float]:
    """Start serve; wait until it has replayed its log. (process, base URL, bytes it had to replay, seconds)."""
    proc, base = start_serve(url, wal)
    m = re.search(r"([\d,]+) bytes to replay", proc.output[0])  # type: ignore[attr-defined]
    to_replay = int(m.group(1).replace(",", "")) if m else -1
    deadline = time.monotonic() + 300
    while (recovery := _stats(base)["log"]["recovery_s"]) is None:
        if time.monotonic() > deadline:
            raise SystemExit("the server did not finish its replay in 300 s")
        time.sleep(0.05)
    return proc, base, to_replay, recovery


def serve_mode(opts: argparse.Namespace) -> dict[str, Any]:
    import threading

    work = Path(tempfile.mkdtemp(prefix="drainpipe-chaos-serve-"))
    schema = ""
    if opts.store == "postgresql":
        from ingest_load import drop_pg_schema, fresh_pg_schema

        pg = opts.pg or subprocess.run([str(ROOT / "scripts" / "postgres.sh"), "url"], capture_output=True,
                                       text=True, check=True).stdout.strip()  # fmt: skip
        url, schema = fresh_pg_schema(pg)
    else:
        url = f"duckdb:///{work}/serve.duckdb"
    wal = str(work / "wal")
    books = Books(size=200)
    template = body_template(200)
    rng = random.Random(opts.seed)
    rows = []
    survivor = None
    if opts.servers == 2:  # a second server on the same store, under load the whole time, never killed
        s_proc, s_base, _, _ = _start_and_recover(url, str(work / "wal-survivor"))
        s_stop = threading.Event()
        survivor = (s_proc, s_stop, post_until(s_base, books, template, "s", opts.clients, s_stop))
    for i in range(opts.kills):
        proc, base, to_replay, recovery_s = _start_and_recover(url, wal)
        if rows:
            rows[-1] |= {"log_bytes_to_replay": to_replay, "recovery_s": round(recovery_s, 3)}
        stop = threading.Event()
        threads = post_until(base, books, template, f"k{i}", opts.clients, stop)
        at = rng.uniform(0.5, 3.0)
        time.sleep(at)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        stop.set()
        for t in threads:
            t.join(60)
        rows.append({"kill": i + 1, "at_s": round(at, 2), "acknowledged_so_far": len(books.acked) * books.size})
        print(f"kill {i + 1:>2} after {at:4.2f} s of load  acknowledged so far {rows[-1]['acknowledged_so_far']:>9,}",
              flush=True)  # fmt: skip
    proc, base, to_replay, recovery_s = _start_and_recover(url, wal)
    rows[-1] |= {"log_bytes_to_replay": to_replay, "recovery_s": round(recovery_s, 3)}
    proc.send_signal(signal.SIGTERM)
    stopped = proc.wait(120)
    if survivor is not None:
        s_proc, s_stop, s_threads = survivor
        s_stop.set()
        for t in s_threads:
            t.join(60)
        s_proc.send_signal(signal.SIGTERM)
        stopped = max(stopped, s_proc.wait(120))
    result = check(url, books)
    if schema:
        drop_pg_schema(opts.pg or url, schema)
    print()
    print("| kill | after (s) | log to replay at restart (bytes) | recovery (s) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['kill']} | {r['at_s']} | {r['log_bytes_to_replay']:,} | {r['recovery_s']} |")
    print()
    print(
        f"servers: {opts.servers} ({'one killed -9 at random moments, the other under load throughout' if survivor else 'killed -9 at random moments'})"
    )
    print("| store | kills | clients | acknowledged | stored | lost | duplicated | unanswered but stored (requests) |"
          " metrics agree |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {opts.store} | {len(rows)} | {opts.clients} | {result['acknowledged']:,} | {result['stored']:,} | "
          f"{result['lost']} | {result['duplicated']} | {result['unacknowledged_but_stored_requests']} | "
          f"{result['metrics_agree']} |")  # fmt: skip
    verdict = (result["lost"] == 0 and result["duplicated"] == 0 and result["partial_requests"] == 0
               and result["metrics_agree"] and stopped == 0)  # fmt: skip
    print("PASS" if verdict else "FAIL")
    return {"mode": "serve", "store": opts.store, "servers": opts.servers, "clients": opts.clients, "kills": rows, **result,
            "final_stop_exit": stopped, "pass": verdict}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("run", "serve"))
    ap.add_argument("--clients", type=int, default=4, help="serve: posting clients")
    ap.add_argument("--store", choices=("duckdb", "postgresql"), default="duckdb", help="serve: the store")
    ap.add_argument("--pg", default=None, help="serve: PostgreSQL URL (default: scripts/postgres.sh url)")
    ap.add_argument("--servers", type=int, choices=(1, 2), default=1,
                    help="serve: 2 runs a second server on the same store under load throughout; the first is the "
                    "one killed (use --store postgresql: a DuckDB file takes one writer)")  # fmt: skip
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--events", type=int, default=4_000_000)
    ap.add_argument("--checkpoint-s", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--data-dir", default=os.environ.get("DRAINPIPE_BENCH_DATA",
                                                         str(Path.home() / ".cache" / "drainpipe-bench")))  # fmt: skip
    ap.add_argument("--json", default=None)
    opts = ap.parse_args()
    result = run_mode(opts) if opts.mode == "run" else serve_mode(opts)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()}
    name = (
        "chaos-run" if opts.mode == "run" else f"chaos-serve-{opts.store}" + ("-2servers" if opts.servers == 2 else "")
    )
    out = Path(opts.json or ROOT / "benchmarks" / "results" / f"{name}.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
