"""Chaos: kill -9 at random moments, then check that nothing was lost or counted twice.

    .venv/bin/python benchmarks/chaos.py run [--kills 20] [--events 4000000] [--checkpoint-s 1] [--json out.json]

``run`` mode: ``drainpipe run`` (the real command, worker processes and all) over one large JSON Lines file, with a
checkpoint every ``--checkpoint-s`` seconds. First one uninterrupted run gives the reference store and the run
time T. Then, ``--kills`` times: a fresh store, a run SIGKILLed at a random moment in [0.05 T, 0.95 T], a check
that no worker process outlived it, and a rerun of the same command to the end; the store must equal the
reference row for row (metric values, float sums to 1e-12 relative, and every top-N row). Prints a table (one row
per kill) and a verdict, and writes JSON (default ``benchmarks/results/chaos-run.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("run",))
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--events", type=int, default=4_000_000)
    ap.add_argument("--checkpoint-s", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--data-dir", default=os.environ.get("DRAINPIPE_BENCH_DATA",
                                                         str(Path.home() / ".cache" / "drainpipe-bench")))  # fmt: skip
    ap.add_argument("--json", default=None)
    opts = ap.parse_args()
    result = run_mode(opts)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()}
    out = Path(opts.json or ROOT / "benchmarks" / "results" / f"chaos-{opts.mode}.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
