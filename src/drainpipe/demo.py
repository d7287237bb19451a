"""``drainpipe demo``: a skewed synthetic workload through the local engine, into an embedded DuckDB file."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .pipeline import EngineOptions, default_definitions, generate_events, open_store, run_local, write_events


def run_demo(events: int = 2_000_000, out_dir: str = ".drainpipe/demo", seed: int = 42) -> int:
    console = Console(stderr=False, highlight=False)
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = out / "events.parquet"
    db = out / "demo.duckdb"
    for stale in (db, Path(str(db) + ".wal")):
        stale.unlink(missing_ok=True)

    console.print(
        f"[bold]drainpipe demo[/]: {events:,} request events from 20 services (Zipf 1.1 skew), "
        f"through L1 -> L2 -> DuckDB"
    )
    t0 = time.perf_counter()
    if not data.exists() or _rows(data) != events:
        write_events(generate_events(events, services=20, skew=1.1, seed=seed), str(data))
    console.print(f"generated {data} in {time.perf_counter() - t0:.1f} s")

    with Progress(
        TextColumn("[bold]pipeline"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
        transient=not sys.stdout.isatty(),
        disable=not sys.stdout.isatty(),
    ) as bar:
        task = bar.add_task("pipeline", total=events, rate="")
        start = time.perf_counter()

        def progress(read: int, _bytes: int) -> None:
            rate = read / max(1e-9, time.perf_counter() - start)
            bar.update(task, completed=read, rate=f"{rate:,.0f} events/s")

        summary = run_local(
            [str(data)],
            definitions=default_definitions(),
            store_url=f"duckdb:///{db}",
            options=EngineOptions(rebalance_interval_ms=200),
            progress=progress,
        )
    for line in summary.lines():
        console.print(line)

    t = Table(title="drain threads: load per rebalance interval (partials), before -> after")
    for c in ("queue", "moves", "before", "after"):
        t.add_column(c)
    for qname, st in summary.queues.items():
        if not (qname.endswith("-L1") or qname.endswith("-L2")):
            continue
        label = qname.rsplit("-", 1)[1]
        for r in st.rebalance_history[:3]:
            t.add_row(
                label,
                str(r.moved),
                f"{' '.join(map(str, r.loads_before))} ({r.ratio_before:.2f}x)",
                f"{' '.join(map(str, r.loads_after))} ({r.ratio_after:.2f}x)",
            )
        if not st.rebalance_history:
            t.add_row(label, "0", "already even", "(split hot types)")
        t.add_row(label, "", "items per thread", ", ".join(f"{n:,}" for n in st.task_dispatched))
    console.print(t)

    store = open_store(f"duckdb:///{db}")
    try:
        rows = store.query(metric="service_cpm", granularity="hour")
        top = sorted(rows, key=lambda r: -r[5])[:5]
        p99 = {r[1]: r[5] for r in store.query(metric="service_percentile", granularity="hour") if r[4] == "p99"}
        sla = {r[1]: r[5] for r in store.query(metric="service_sla", granularity="hour")}
    finally:
        store.close()
    m = Table(title="busiest services (hour buckets)")
    for c in ("service", "hour", "cpm", "p99 ms", "sla %"):
        m.add_column(c)
    for r in top:
        m.add_row(r[1], r[3], f"{r[5]:,.1f}", f"{p99.get(r[1], float('nan')):,.0f}", f"{sla.get(r[1], 0):.2f}")
    console.print(m)
    console.print(f"files: events {data}\n       store  {db}\n       rejects {summary.dead_letter}")
    console.print(
        f"try:   .venv/bin/drainpipe query --store duckdb:///{db} --metric service_percentile "
        f"--granularity hour --limit 10"
    )
    return 0


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:
        return -1
