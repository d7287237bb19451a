"""Queue throughput: drainpipe's BatchQueue vs queue.Queue (what a user would write) vs a bare deque (the ceiling).

The ceiling is a bare ``collections.deque`` with ``append`` per item and one drain thread taking batches; for the
produce_many rows ``deque.extend`` of the same batches is shown too, for information.

Every scenario runs all three side by side, ``--runs`` times (default 5), interleaved so machine noise hits them
alike; the table shows medians (items/s, producer start to last item consumed) and the ratios the targets name.

    .venv/bin/python benchmarks/queue_throughput.py [--items 1000000] [--runs 5] [--json out.json]

Throughput is steady state: each contender's consumer is awake when timing starts (drainpipe's drain task gets a
warm-up batch first; an idle one would otherwise sleep up to max_idle_ms before its first cycle).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import queue
import statistics
import sys
import threading
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from drainpipe import BatchQueue, BatchQueueConfig, PartitionPolicy, ThreadPolicy

BUFFER = 10_000
BATCH = 1_000


def make_items(types: int, n: int, run: int = 1) -> list:
    """n items of ``types`` types: interleaved (run=1, the worst case for grouping) or in runs of ``run`` items
    of one type (run=BATCH: every produce_many batch holds one type, as a per-type dispatcher produces them)."""
    classes = [type(f"T{i}", (), {"__slots__": ()}) for i in range(types)]
    objs = [c() for c in classes]
    return [objs[(i // run) % types] for i in range(n)], classes


def run_producers(producers: int, items: list, produce_one, produce_batch) -> None:
    chunks = [items[i::producers] for i in range(producers)]

    def work(chunk: list) -> None:
        if produce_batch is not None:
            for i in range(0, len(chunk), BATCH):
                produce_batch(chunk[i : i + BATCH])
        else:
            for x in chunk:
                produce_one(x)

    threads = [threading.Thread(target=work, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def bench_drainpipe(items: list, classes: list, producers: int, batched: bool) -> float:
    consumed = [0]

    def noop(batch: list) -> None:
        consumed[0] += len(batch)

    q = BatchQueue(
        "bench",
        BatchQueueConfig(threads=ThreadPolicy.fixed(1), partitions=PartitionPolicy.adaptive(), buffer_size=BUFFER),
    )
    for c in classes:
        q.add_handler(c, noop)
    q.produce_many(items[:BATCH])  # warm-up: the drain task is awake, not deep in idle backoff
    while consumed[0] < BATCH:
        time.sleep(0.0002)
    consumed[0] = 0
    n = len(items)
    t0 = time.perf_counter()
    run_producers(producers, items, q.produce, q.produce_many if batched else None)
    while consumed[0] < n:
        time.sleep(0.0002)
    elapsed = time.perf_counter() - t0
    q.shutdown()
    assert consumed[0] == n, (consumed[0], n)
    return n / elapsed


def bench_queue_queue(items: list, producers: int, batched: bool) -> float:
    q: queue.Queue = queue.Queue(maxsize=BUFFER)
    n = len(items)

    def consumer() -> None:
        get = q.get
        for _ in range(n):
            get()

    c = threading.Thread(target=consumer)
    c.start()
    t0 = time.perf_counter()
    put = q.put

    def put_many(batch: list) -> None:  # what a user would write: put each item
        for x in batch:
            put(x)

    run_producers(producers, items, put, put_many if batched else None)
    c.join()
    return n / (time.perf_counter() - t0)


def bench_deque(items: list, producers: int, batched: bool) -> float:
    d: deque = deque()
    n = len(items)
    consumed = [0]

    def drain() -> None:
        pop = d.popleft
        while consumed[0] < n:
            k = len(d)
            if k:
                batch = list(itertools.starmap(pop, itertools.repeat((), k)))
                consumed[0] += len(batch)
            else:
                time.sleep(0.0002)

    c = threading.Thread(target=drain)
    c.start()
    t0 = time.perf_counter()
    run_producers(producers, items, d.append, d.extend if batched else None)
    c.join()
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "queue_throughput.json"))
    args = ap.parse_args()

    rows = []
    scenarios = [(p, t, mode) for p, t, mode in itertools.product((1, 4), (10, 1000), ("each", "many", "many1"))]
    for producers, types, mode in scenarios:
        batched = mode != "each"
        items, classes = make_items(types, args.items, run=BATCH if mode == "many1" else 1)
        samples: dict[str, list[float]] = {"drainpipe": [], "queue.Queue": [], "deque": [], "deque.extend": []}
        for _ in range(args.runs):
            samples["drainpipe"].append(bench_drainpipe(items, classes, producers, batched))
            samples["queue.Queue"].append(bench_queue_queue(items, producers, batched))
            samples["deque"].append(bench_deque(items, producers, False))  # the ceiling: append per item
            if batched:
                samples["deque.extend"].append(bench_deque(items, producers, True))
        med = {k: statistics.median(v) for k, v in samples.items() if v}
        row = {
            "producers": producers,
            "types": types,
            "mode": {"each": "produce", "many": "produce_many(1000) mixed", "many1": "produce_many(1000) 1 type/batch"}[
                mode
            ],
            "drainpipe": med["drainpipe"],
            "queue_Queue": med["queue.Queue"],
            "deque": med["deque"],
            "deque_extend": med.get("deque.extend"),
            "vs_queue_Queue": med["drainpipe"] / med["queue.Queue"],
            "vs_deque": med["drainpipe"] / med["deque"],
            "samples": samples,
        }
        rows.append(row)
        print(
            f"{producers} prod {types:>4} types {row['mode']:<32} drainpipe {med['drainpipe'] / 1e6:6.2f}M/s  "
            f"queue.Queue {med['queue.Queue'] / 1e6:6.2f}M/s  deque {med['deque'] / 1e6:6.2f}M/s  "
            f"x{row['vs_queue_Queue']:.1f} vs Queue  {row['vs_deque']:.2f} of deque",
            flush=True,
        )

    print()
    print(
        "| producers | types | mode | drainpipe (M items/s) | queue.Queue | deque append (ceiling) | "
        "vs queue.Queue | vs ceiling | deque.extend (info) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ext = f"{r['deque_extend'] / 1e6:.2f}" if r["deque_extend"] else "-"
        print(
            f"| {r['producers']} | {r['types']} | {r['mode']} | {r['drainpipe'] / 1e6:.2f} | "
            f"{r['queue_Queue'] / 1e6:.2f} | {r['deque'] / 1e6:.2f} | {r['vs_queue_Queue']:.1f}x | {r['vs_deque']:.2f}x | "
            f"{ext} |"
        )
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "items": args.items,
                "runs": args.runs,
                "rows": rows,
            },
            indent=2,
        )
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
