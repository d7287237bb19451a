"""Two commits side by side: one benchmark run at each, interleaved, for several rounds; medians and ratios.

Each commit gets a clean git worktree (under ``--work``, default a temp dir) with its C extensions built in place by
this venv's Python; each run imports drainpipe from that worktree (``PYTHONPATH``) and runs that commit's own copy of
the benchmark. Rounds alternate which commit goes first, so a machine that slows down or speeds up over the run
weighs on both alike.

    .venv/bin/python benchmarks/compare_commits.py BASE [HEAD] --bench pipeline --rounds 5
    .venv/bin/python benchmarks/compare_commits.py bd20262 --bench queue --rounds 5
    .venv/bin/python benchmarks/compare_commits.py bd20262 --bench ingest --rounds 5
    .venv/bin/python benchmarks/compare_commits.py bd20262 --bench formats --rounds 5
    .venv/bin/python benchmarks/compare_commits.py bd20262 --bench kafka --rounds 5   # the broker: make kafka
    .venv/bin/python benchmarks/compare_commits.py bd20262 --bench otlp --rounds 5

Benchmarks (the metrics each reports; higher is better unless marked):

* ``pipeline``: ``benchmarks/pipeline.py`` on 2M events, one run of each contender per round: drainpipe's events/s
  from Parquet and JSON Lines, and drainpipe/DuckDB SQL in the same round (the peer side by side).
* ``queue``: ``benchmarks/queue_throughput.py``, one run per round: items/s of each produce mode.
* ``ingest``: ``benchmarks/ingest_load.py``, 24 clients, durable: events/s in the measured window and p99 (lower).
* ``formats``: ``benchmarks/formats.py`` on 2M events, one run per round: drainpipe's events/s from JSON Lines, CSV,
  access logs and OTLP JSON files, and drainpipe/DuckDB SQL on each in the same round.
* ``otlp``: this checkout's ``benchmarks/otel_load.py`` against each commit's ``drainpipe serve`` (``--server-src``),
  512-span OTLP protobuf exports, one saturated run (wrk) and one at 150,000 spans/s (the Python client, open
  loop) per round: spans/s,
  spans per CPU second of the server's process tree, its peak PSS and p99 (lower), the fixed rate's p99 (lower).
* ``kafka``: ``benchmarks/kafka.py`` on 1M events against the broker at ``$DRAINPIPE_TEST_KAFKA`` (default
  127.0.0.1:9092), one run per round: ``consume``'s events/s from messages of 100 events and of one, and the same
  relative to ``drainpipe run`` on the same events in the same round.

Prints a table and writes ``benchmarks/results/compare-<bench>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def worktree(commit: str, work: Path) -> Path:
    """A clean checkout of ``commit`` with its extensions built, reused if already there."""
    sha = _git("rev-parse", commit)
    path = work / sha[:12]
    if not path.exists():
        _git("worktree", "add", "--detach", str(path), sha)
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=path, check=True,
                       capture_output=True)  # fmt: skip
        (path / ".venv").symlink_to(ROOT / ".venv")
    return path


def _pipeline(tree: Path, out: Path) -> list[str]:
    return [sys.executable, str(tree / "benchmarks" / "pipeline.py"), "--events", "2000000", "--runs", "1",
            "--no-profile", "--memory-events", "", "--json", str(out)]  # fmt: skip


def _pipeline_metrics(d: dict[str, Any]) -> dict[str, float]:
    out = {f"drainpipe {fmt} events/s": d["results"][f"drainpipe/{fmt}"]["eps_median"] for fmt in ("parquet", "jsonl")}
    for fmt in ("parquet", "jsonl"):
        out[f"drainpipe/DuckDB SQL {fmt}"] = d["paired_ratios"][f"drainpipe/sql {fmt}"]["median"]
    return out


def _queue(tree: Path, out: Path) -> list[str]:
    return [sys.executable, str(tree / "benchmarks" / "queue_throughput.py"), "--runs", "1", "--json", str(out)]


def _queue_metrics(d: dict[str, Any]) -> dict[str, float]:
    return {f"{r['mode']} ({r['producers']}p {r['types']}t) items/s": r["drainpipe"] for r in d["rows"]}


def _ingest(tree: Path, out: Path) -> list[str]:
    return [sys.executable, str(tree / "benchmarks" / "ingest_load.py"), "--clients", "24", "--warmup", "10",
            "--measure", "30", "--flat-pct", "1000", "--out", str(out)]  # fmt: skip
    # (a 30 s window is no test of flat memory, which the benchmark otherwise fails the run for)


def _ingest_metrics(d: dict[str, Any]) -> dict[str, float]:
    return {"events/s (measured)": d["events_per_s_measured"], "p99 ms (lower is better)": d["latency_ms"]["p99"],
            "lost": d["lost"]}  # fmt: skip


def _formats(tree: Path, out: Path) -> list[str]:
    return [sys.executable, str(tree / "benchmarks" / "formats.py"), "--events", "2000000", "--runs", "1",
            "--json", str(out)]  # fmt: skip


def _formats_metrics(d: dict[str, Any]) -> dict[str, float]:
    out = {}
    for fmt, row in d["table"].items():
        out[f"drainpipe {fmt} events/s"] = row["drainpipe_eps"]
        out[f"drainpipe/DuckDB SQL {fmt}"] = row["vs_sql"]
    return out


def _kafka(tree: Path, out: Path) -> list[str]:
    servers = os.environ.get("DRAINPIPE_TEST_KAFKA", "127.0.0.1:9092").removeprefix("kafka://")
    return [sys.executable, str(tree / "benchmarks" / "kafka.py"), "--servers", servers, "--events", "1000000",
            "--runs", "1", "--json", str(out)]  # fmt: skip


def _kafka_metrics(d: dict[str, Any]) -> dict[str, float]:
    out = {}
    for name in ("consume-100", "consume-1"):
        out[f"{name} events/s"] = d["table"][name]["eps"]
        out[f"{name} / run"] = d["table"][name]["vs_run"]
    return out


def _otlp(tree: Path, out: Path) -> list[str]:
    return [sys.executable, str(ROOT / "benchmarks" / "otel_load.py"), "--server-src", str(tree / "src"),
            "--contenders", "drainpipe", "--client", "wrk", "--rounds", "1", "--warmup", "5", "--measure", "20",
            "--json", str(out)]  # fmt: skip


def _otlp_metrics(d: dict[str, Any]) -> dict[str, float]:
    m = d["medians"]["wrk"]["drainpipe"]
    return {"spans/s": m["spans_per_s"], "spans per CPU s": m["spans_per_cpu_s"],
            "peak PSS MB (lower is better)": m["peak_pss_mb"], "p99 ms (lower is better)": m["p99_ms"],
            "p99 ms at 150k spans/s (lower is better)": d["fixed_rate"]["drainpipe"]["p99_ms"],
            "spans per CPU s at 150k spans/s": d["fixed_rate"]["drainpipe"]["spans_per_cpu_s"]}  # fmt: skip


BENCHES: dict[str, tuple[Callable[[Path, Path], list[str]], Callable[[dict[str, Any]], dict[str, float]]]] = {
    "pipeline": (_pipeline, _pipeline_metrics),
    "queue": (_queue, _queue_metrics),
    "ingest": (_ingest, _ingest_metrics),
    "formats": (_formats, _formats_metrics),
    "kafka": (_kafka, _kafka_metrics),
    "otlp": (_otlp, _otlp_metrics),
}


def run_once(bench: str, tree: Path, scratch: Path) -> dict[str, float]:
    command, metrics = BENCHES[bench]
    out = scratch / f"{tree.name}-{time.monotonic_ns()}.json"
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    done = subprocess.run(command(tree, out), cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
        raise SystemExit(f"{bench} at {tree.name} failed (exit {done.returncode}):\n" + "\n".join(tail))
    return metrics(json.loads(out.read_text()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base")
    ap.add_argument("head", nargs="?", default="HEAD")
    ap.add_argument("--bench", choices=sorted(BENCHES), required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default=None, help="where the worktrees go (default: a temp dir, removed after)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="drainpipe-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    trees = {"base": worktree(args.base, work), "head": worktree(args.head, work)}
    samples: dict[str, dict[str, list[float]]] = {"base": {}, "head": {}}
    load = [os.getloadavg()]
    for r in range(args.rounds):
        order = ("base", "head") if r % 2 == 0 else ("head", "base")
        for side in order:
            got = run_once(args.bench, trees[side], work)
            for metric, value in got.items():
                samples[side].setdefault(metric, []).append(value)
            print(f"round {r + 1}/{args.rounds} {side:<4} " + "  ".join(f"{k}: {v:,.4g}" for k, v in got.items()),
                  flush=True)  # fmt: skip
        load.append(os.getloadavg())
    rows = []
    print(f"\n{args.bench}: {args.base} (base) vs {args.head} (head), {args.rounds} rounds interleaved, medians")
    print(f"{'metric':<44} {'base':>12} {'head':>12} {'head/base':>10}  per-round ratios")
    for metric, base in samples["base"].items():
        head = samples["head"][metric]
        b, h = statistics.median(base), statistics.median(head)
        per_round = [hv / bv if bv else float("nan") for bv, hv in zip(base, head)]
        ratio = h / b if b else float("nan")
        rows.append({"metric": metric, "base_median": b, "head_median": h, "ratio": ratio, "base": base,
                     "head": head, "per_round_ratios": per_round})  # fmt: skip
        print(f"{metric:<44} {b:>12,.4g} {h:>12,.4g} {ratio:>9.3f}x  " + " ".join(f"{x:.3f}" for x in per_round))
    result = {"bench": args.bench, "base": _git("rev-parse", args.base), "head": _git("rev-parse", args.head),
              "rounds": args.rounds, "cpus": os.cpu_count(), "load_average": load, "rows": rows}  # fmt: skip
    path = Path(args.json or ROOT / "benchmarks" / "results" / f"compare-{args.bench}.json")
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    if not args.work:
        for tree in set(trees.values()):  # one tree when a commit is compared with itself (an A/A run)
            _git("worktree", "remove", "--force", str(tree))


if __name__ == "__main__":
    main()
