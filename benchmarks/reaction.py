"""How fast the queue reacts: failover of a stuck handler call, and ``split="auto"`` of a type that turns hot.

1. failover: 4 drain threads, 16 types of one partition each, items of every type flowing; one handler call hangs.
   Measured: from the moment the call starts hanging until every other type on its drain thread receives items
   again (the starvation a stuck call causes), for slow_handler_ms 100, 200 and 500; beside it, the same without
   failover (nothing else flows until the call returns: the starvation lasts the whole hang, here 2 s).
2. split: 4 drain threads, 8 types; one turns from 1% to 90% of the items. Measured: from the switch until it runs
   as 3 instances or more, for rebalance intervals of 100 and 250 ms; and from its load falling back until it
   runs as one instance again.

Medians of --runs runs; a table, and JSON in benchmarks/results/reaction.json.

    .venv/bin/python benchmarks/reaction.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from drainpipe import BatchQueue, BatchQueueConfig, PartitionPolicy, ThreadPolicy

RESULTS = Path(__file__).parent / "results"
HANG_S = 2.0


class Clocked:
    """Records when it last received items; hangs in the call that carries a "hang" item."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.times: list[float] = []
        self.gate = gate

    def consume(self, batch: list) -> None:
        if self.gate is not None and any(getattr(x, "hang", False) for x in batch):
            self.gate.wait(HANG_S)
        self.times.append(time.monotonic())


def _types(prefix: str, n: int) -> list[type]:
    return [type(f"{prefix}{i}", (), {"__slots__": ("hang",), "__init__": _init}) for i in range(n)]


def _init(self, hang: bool = False) -> None:  # type: ignore[no-untyped-def]
    self.hang = hang


def failover_once(slow_ms: int, failover: bool, run: int) -> float:
    """Seconds the other types of the stuck task's thread went without items after the call started hanging."""
    q = BatchQueue(f"reaction-fo-{slow_ms}-{failover}-{run}", BatchQueueConfig(
        threads=ThreadPolicy.fixed(4), partitions=PartitionPolicy.fixed(16),
        slow_handler_ms=slow_ms if failover else 3_600_000))  # fmt: skip
    types = _types(f"F{slow_ms}{run}", 16)
    gate = threading.Event()
    handlers = {t: Clocked(gate) for t in types}
    for t, h in handlers.items():
        q.add_handler(t, h)
    owners = q.assigned_partitions
    on_task = [t for t in types if _partition(q, t) in owners[0]]  # the types of drain task 0
    stuck, others = on_task[0], on_task[1:]
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            q.produce_many([t() for t in types])
            time.sleep(0.001)

    producer = threading.Thread(target=produce)
    producer.start()
    time.sleep(0.2)
    hang_at = time.monotonic()
    q.produce(stuck(hang=True))
    time.sleep(HANG_S + 0.3)
    stop.set()
    producer.join()
    gate.set()
    q.shutdown()
    resumed = []
    for t in others:
        after = [x for x in handlers[t].times if x > hang_at + 0.05]
        gaps = [b - a for a, b in zip([hang_at, *after], after)]
        resumed.append(max(gaps) if gaps else HANG_S)
    return max(resumed)


def _partition(q: BatchQueue, t: type) -> int:
    """The partition of a type, as its first item lands there (produced.count per partition before and after)."""
    before = [q.produced_count(p) for p in range(q.partition_count)]
    q.produce(t())
    after = [q.produced_count(p) for p in range(q.partition_count)]
    return next(p for p in range(q.partition_count) if after[p] != before[p])


class Instance:
    def consume(self, batch: list) -> None:
        time.sleep(2e-6 * len(batch))  # releases the GIL, as a database driver does


def split_once(interval_ms: int, run: int) -> tuple[float, float]:
    """Seconds until a type turned hot runs as 3+ instances, and until it is back to one after it cools."""
    q = BatchQueue(f"reaction-split-{interval_ms}-{run}", BatchQueueConfig(
        threads=ThreadPolicy.fixed(4), partitions=PartitionPolicy.adaptive(), rebalance_interval_ms=interval_ms))  # fmt: skip
    hot, *others = _types(f"S{interval_ms}{run}", 8)
    q.add_handler(hot, Instance, split="auto")
    for t in others:
        q.add_handler(t, Instance())
    phase = ["cold"]
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            batch = [t() for t in others for _ in range(5)]
            batch += [hot() for _ in range(300 if phase[0] == "hot" else 1)]
            q.produce_many(batch)
            time.sleep(0.001)

    producer = threading.Thread(target=produce)
    producer.start()
    time.sleep(1.0)

    phase[0] = "hot"
    t0 = time.monotonic()
    while _instances(q, hot) < 3 and time.monotonic() - t0 < 10:
        time.sleep(0.01)
    up = time.monotonic() - t0
    time.sleep(1.0)
    phase[0] = "cold"
    t1 = time.monotonic()
    while _instances(q, hot) > 1 and time.monotonic() - t1 < 10:
        time.sleep(0.01)
    down = time.monotonic() - t1
    stop.set()
    producer.join()
    q.shutdown()
    return up, down


def _instances(q: BatchQueue, t: type) -> int:
    return dict(q.stats().split_instances).get(t.__qualname__, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", default=str(RESULTS / "reaction.json"))
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # every run logs its failover and its resizes: the table says it
    report: dict = {"failover": {}, "split": {}}
    print("| failover | other types on the stuck thread starve for (median) |")
    print("|---|---|")
    for slow_ms, on in ((100, True), (200, True), (500, True), (200, False)):
        runs = [failover_once(slow_ms, on, r) for r in range(args.runs)]
        key = f"slow_handler_ms={slow_ms}" if on else "no failover"
        report["failover"][key] = {"median_s": statistics.median(runs), "runs": runs}
        print(f"| {key} | {statistics.median(runs) * 1000:.0f} ms |", flush=True)
    print()
    print('| split="auto" | hot -> 3+ instances (median) | cool -> 1 instance (median) |')
    print("|---|---|---|")
    for interval in (100, 250):
        runs = [split_once(interval, r) for r in range(args.runs)]
        up = statistics.median(u for u, _ in runs)
        down = statistics.median(d for _, d in runs)
        report["split"][f"interval_ms={interval}"] = {"up_median_s": up, "down_median_s": down, "runs": runs}
        print(f"| rebalance_interval_ms={interval} | {up * 1000:.0f} ms | {down * 1000:.0f} ms |", flush=True)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
