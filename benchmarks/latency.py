"""Produce-to-handler latency at low and moderate rates, and the CPU an idle queue costs, against what users
write without drainpipe: a ``queue.Queue`` with one consumer thread. Same run, alternating.

One producer thread paces items at 200, 2,000 and 20,000 items/s (one item per tick up to 1,000/s; above, the
items due each millisecond). Each item carries its ``perf_counter`` at produce time; the handler records
now - then. ``BatchQueueConfig`` defaults with one drain thread (one handler type). Idle: a queue with a handler and nothing produced,
process CPU time over ``--idle-s`` seconds, in % of one core (the baseline's consumer blocks in ``get``).

    .venv/bin/python benchmarks/latency.py [--seconds 3] [--runs 3] [--json benchmarks/results/latency.json]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from drainpipe import BatchQueue, BatchQueueConfig, ThreadPolicy

RATES = (200, 2_000, 20_000)


class Ping:
    __slots__ = ("t",)

    def __init__(self, t: float) -> None:
        self.t = t


def pace(rate: int, seconds: float, put) -> int:
    """Call ``put(Ping)`` ``rate`` times a second for ``seconds``; returns how many."""
    tick = 1.0 / rate if rate <= 1000 else 0.001
    per_tick = 1 if rate <= 1000 else rate // 1000
    n = 0
    start = time.perf_counter()
    next_t = start
    while next_t - start < seconds:
        now = time.perf_counter()
        if now < next_t:
            time.sleep(next_t - now)
        for _ in range(per_tick):
            put(Ping(time.perf_counter()))
            n += 1
        next_t += tick
    return n


def quantiles(lat: list[float]) -> dict:
    lat = sorted(lat)
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000
    return {"p50_ms": round(q(0.5), 3), "p99_ms": round(q(0.99), 3), "max_ms": round(lat[-1] * 1000, 3)}


def drainpipe_run(rate: int, seconds: float) -> dict:
    lat: list[float] = []

    def handler(batch: list) -> None:
        now = time.perf_counter()
        lat.extend(now - x.t for x in batch)

    q = BatchQueue(f"latency-{rate}", BatchQueueConfig(threads=ThreadPolicy.fixed(1)))
    q.add_handler(Ping, handler)
    time.sleep(0.2)  # idle first: the first items meet a task in full backoff
    cpu0 = time.process_time()
    n = pace(rate, seconds, q.produce)
    time.sleep(0.1)
    cpu = time.process_time() - cpu0
    q.shutdown()
    assert len(lat) == n, (len(lat), n)
    return quantiles(lat) | {"cpu_pct": round(100 * cpu / (seconds + 0.1), 1)}


def baseline_run(rate: int, seconds: float) -> dict:
    lat: list[float] = []
    q: queue.Queue = queue.Queue()

    def consumer() -> None:
        while (x := q.get()) is not None:
            lat.append(time.perf_counter() - x.t)

    t = threading.Thread(target=consumer)
    t.start()
    time.sleep(0.2)
    cpu0 = time.process_time()
    n = pace(rate, seconds, q.put)
    time.sleep(0.1)
    cpu = time.process_time() - cpu0
    q.put(None)
    t.join()
    assert len(lat) == n
    return quantiles(lat) | {"cpu_pct": round(100 * cpu / (seconds + 0.1), 1)}


def idle_cpu(seconds: float, kind: str) -> float:
    if kind == "drainpipe":
        q = BatchQueue("latency-idle", BatchQueueConfig(threads=ThreadPolicy.fixed(1)))
        q.add_handler(Ping, lambda batch: None)
        time.sleep(0.5)  # into full backoff
        c0, t0 = time.process_time(), time.perf_counter()
        time.sleep(seconds)
        pct = 100 * (time.process_time() - c0) / (time.perf_counter() - t0)
        q.shutdown()
        return round(pct, 2)
    qq: queue.Queue = queue.Queue()
    th = threading.Thread(target=qq.get)
    th.start()
    c0, t0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    pct = 100 * (time.process_time() - c0) / (time.perf_counter() - t0)
    qq.put(None)
    th.join()
    return round(pct, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--idle-s", type=float, default=3.0)
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "latency.json"))
    args = ap.parse_args()
    runs: dict = {str(r): {"drainpipe": [], "queue.Queue": []} for r in RATES}
    for _ in range(args.runs):
        for rate in RATES:
            runs[str(rate)]["drainpipe"].append(drainpipe_run(rate, args.seconds))
            runs[str(rate)]["queue.Queue"].append(baseline_run(rate, args.seconds))
    idle = {k: statistics.median(idle_cpu(args.idle_s, k) for _ in range(args.runs)) for k in ("drainpipe", "queue")}
    med = lambda rows, key: round(statistics.median(r[key] for r in rows), 3)
    print("| items/s | drainpipe p50 | p99 | CPU | queue.Queue + thread p50 | p99 | CPU |")
    print("|---|---|---|---|---|---|---|")
    summary = {}
    for rate in RATES:
        d, b = runs[str(rate)]["drainpipe"], runs[str(rate)]["queue.Queue"]
        summary[str(rate)] = {k: {m: med(rows, m) for m in ("p50_ms", "p99_ms", "cpu_pct")} for k, rows in
                              (("drainpipe", d), ("queue.Queue", b))}  # fmt: skip
        s = summary[str(rate)]
        print(f"| {rate:,} | {s['drainpipe']['p50_ms']} ms | {s['drainpipe']['p99_ms']} ms | "
              f"{s['drainpipe']['cpu_pct']}% | {s['queue.Queue']['p50_ms']} ms | {s['queue.Queue']['p99_ms']} ms | "
              f"{s['queue.Queue']['cpu_pct']}% |")  # fmt: skip
    print(f"\nidle CPU (% of a core): drainpipe {idle['drainpipe']}%, queue.Queue consumer {idle['queue']}%")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpus": os.cpu_count(), "seconds": args.seconds, "runs": runs,
                               "median": summary, "idle_cpu_pct": idle, "load": os.getloadavg()}, indent=1))  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
