"""Metrics pipeline benchmark: drainpipe's local engine vs a plain Python loop vs DuckDB SQL, end to end.

Contenders (the same work: the 16 default metrics of docs/pipeline.md at minute, hour and day granularity, plus the
``top_slow_statements`` top-N, from one input file into a fresh DuckDB file):

* ``drainpipe``: ``drainpipe.pipeline.run.run_local`` (validating reader, columnar aggregation, L1 -> L2 ->
  persist on BatchQueues, idempotent upsert-merge store), default definitions, default engine options.
* ``loop``: the straightforward Python a user would write: events read with pyarrow ``to_pylist`` (Parquet) or
  ``json.loads`` per line (JSONL), a loop updating dicts of minute states (count, latency sum, successes, errors,
  apdex counts, a percentile histogram with precision 10) per scope and entity, plus top-N lists; minute states
  rolled up to hour and day, values computed, then one insert into DuckDB. No validation (which favours the
  loop). It is slow, so it runs on ``--loop-events`` (default 1M) events and is reported as events/s.
* ``sql``: DuckDB SQL straight from the file (``read_parquet`` / ``read_json``): one GROUP BY GROUPING SETS over
  (scope entity, minute, histogram bin), rolled up to minute/hour/day states, percentiles by a running count
  over the bins (window), apdex, sla, cpm, avg, error count, and the top-N by ``row_number()`` window; results
  written into DuckDB tables. DuckDB uses both cores. JSONL is parsed once into a temporary table first (cheaper
  than parsing it twice); Parquet is scanned directly. The vectorised ceiling.

Every timed run is a fresh process. ``drainpipe`` and ``sql`` are timed as the user waits for them: the command
``drainpipe run --input FILE --store duckdb:///...`` and a Python process running the SQL, from start to exit
(start-up included; the same commands on 1,000 events are timed apart and reported as "start"), CPU of every
process they start. Their peak memory (of the process tree: the sum of PSS) comes from ``MEMORY_RUNS`` more runs
of each, after the timed ones: the sampler reads ``/proc/PID/smaps_rollup``, which walks the page tables under
the process's memory lock and slowed a timed drainpipe run by up to 0.6 s. The loop runs in a worker process, its clock
starting after imports. Contenders are interleaved across ``--runs`` runs (the order rotates
each run, since the machine is shared and noisy); the table shows medians and the min..max spread, and CPU
microseconds per event (all processes), which a busy machine disturbs less than wall time. Ratios are given on the
medians and, less exposed to the load changing between runs, as the median of the ratios within each run. Targets:
drainpipe >= 1.0x DuckDB SQL's events/s, with CPU per event and peak memory <= DuckDB's (issue 16).

Before timing, a small input checks that all contenders compute the same thing: every value row of the loop and
of the SQL (both input formats) equals drainpipe's ``Store.query()`` output (averages to 1e-9 relative: float sums
in another order; everything else exactly), and the top-N rows are identical.

Peak memory: the local engine on ``--memory-events`` (default 1M and 10M) Parquet events in subprocesses; each
reports its peak memory together with its worker processes (the sum of their PSS sampled every 0.25 s, at least
the main process's peak RSS ``VmHWM``: ``ru_maxrss`` of a child started by vfork/exec includes the parent's peak), its
RSS sampled as it reads (``/proc/self/statm``) and the number of stored state rows, to show memory follows the
state (the result), not the input.

Profile (not timed): the engine's stages run one after the other on one thread (CPU per stage and per event:
Parquet decode, read_events, aggregate_batch, merging, store.merge, JSONL read_events); one run of the engine
with stage timers (wall and CPU per thread group: read, is_applied, aggregate_batch, L1/L2 accumulators, store
merge, queue produce); one under cProfile on every thread.

    .venv/bin/python benchmarks/pipeline.py                 # 5M events, 5 runs (~5-8 min on 2 cores)
    .venv/bin/python benchmarks/pipeline.py --quick         # smoke run, a minute; JSON to a temp dir
    .venv/bin/python benchmarks/pipeline.py --events 2000000 --runs 5 --no-profile

Input files are generated once with ``drainpipe.pipeline.generator`` (skewed default workload, seed 42) into
``--data-dir`` (default ``~/.cache/drainpipe-bench``) and reused.
"""

from __future__ import annotations

import argparse
import collections
import compileall
import contextlib
import cProfile
import heapq
import json
import math
import os
import platform
import pstats
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))
from procs import memory_kb  # shared with the kill tests

RESULTS = Path(__file__).parent / "results"
FORMATS = ("parquet", "jsonl")
TARGET_EPS = 1_000_000
TARGET_LOOP_RATIO = 5.0
#: drainpipe run >= DuckDB SQL (events/s, end to end), with CPU per event and peak memory <= DuckDB's
TARGET_SQL_RATIO = 1.0
#: the timed contenders that run as the commands a user types (the loop runs in a worker process after imports)
CLI = ("drainpipe", "sql")
STARTUP_EVENTS = 1_000
MEMORY_RUNS = 3  # runs of each command with the memory sampler, after the timed ones

# -------------------------------------------------------------------------------------------------- the workload
# The default metric set of docs/pipeline.md, as the loop and the SQL hard-code it (drainpipe reads its definitions).
SCOPES = ("service", "instance", "endpoint")
GRANULARITIES = (("minute", 60_000), ("hour", 3_600_000), ("day", 86_400_000))
APDEX_T = 500.0
PRECISION = 10.0
PERCENTILES = (50, 75, 90, 95, 99)
TOPN_BUCKET_MS = 600_000
TOPN_N = 10
TOPN_NAME = "top_slow_statements"
ISO = "%Y-%m-%dT%H:%M:%SZ"


def data_file(data_dir: Path, events: int, fmt: str) -> Path:
    """The input file of ``events`` generated events (generated once, atomically, then reused; the name carries
    a hash of the generator's source, so a changed generator gets new files)."""
    import hashlib

    from drainpipe.pipeline import generator
    from drainpipe.pipeline.generator import generate_events, write_events

    version = hashlib.blake2b(Path(generator.__file__).read_bytes(), digest_size=4).hexdigest()
    path = data_dir / f"events_{events}_seed42_{version}.{fmt}"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.{fmt}")
        t0 = time.perf_counter()
        write_events(generate_events(events), tmp)
        os.replace(tmp, path)
        print(
            f"  generated {path} ({path.stat().st_size / 1e6:,.0f} MB) in {time.perf_counter() - t0:.1f} s", flush=True
        )
    return path


def fresh_db(directory: Path, name: str) -> Path:
    path = directory / f"{name}.duckdb"
    for p in (path, Path(str(path) + ".wal"), path.with_suffix(".rejected.jsonl")):
        if p.exists():
            p.unlink()
    return path


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def maxrss_mb() -> float:
    """Peak RSS of this process image. VmHWM, not ru_maxrss: a child started by vfork/exec (as subprocess does)
    inherits in ru_maxrss the parent's peak, whereas VmHWM belongs to the new address space."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def _pss_kb(pid: str) -> int:
    return memory_kb(pid, "Pss", "smaps_rollup")


def _descendants(root: str = "self") -> list[str]:
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = f.read().split()
            except OSError:
                continue
            out += kids
            todo += kids
    return out


class MemorySampler:
    """Peak memory of this process and its worker processes together: the sum of their PSS (proportional set
    size: pages a forked worker shares with its parent count once), sampled every ``interval`` seconds (reading
    ``smaps_rollup`` costs ~1.5 ms a process, so not more often).

    The sampling runs in a forked child process, not a thread: a thread in the measured process would change
    what it measures (drainpipe forks its worker processes only when no other thread runs, else spawns them,
    which costs each worker its imports; ``drainpipe run`` itself runs no other thread). The child's CPU time
    is counted with the contender's child processes (a few ms)."""

    def __init__(self, interval: float = 0.25, root: int | None = None) -> None:
        self.interval = interval
        self.root = str(root) if root is not None else "self"  # the process (tree) to sample
        self.peak_kb = 0
        self.peak_workers = 0
        self._child = 0
        self._stop_w = self._result_r = -1

    def sample(self, root: str = "self", exclude: str = "") -> None:
        kids = [k for k in _descendants(root) if k != exclude]
        total = _pss_kb(root) + sum(_pss_kb(k) for k in kids)
        if total > self.peak_kb:
            self.peak_kb = total
        self.peak_workers = max(self.peak_workers, len(kids))

    def _run_child(self, root: str, stop_r: int, result_w: int) -> None:
        import select

        me = str(os.getpid())
        try:
            while not select.select([stop_r], [], [], self.interval)[0]:
                self.sample(root, me)
            self.sample(root, me)
            os.write(result_w, f"{self.peak_kb} {self.peak_workers}".encode())
        finally:
            os._exit(0)

    def __enter__(self) -> MemorySampler:
        self.sample(self.root)
        stop_r, self._stop_w = os.pipe()
        self._result_r, result_w = os.pipe()
        root = str(os.getpid()) if self.root == "self" else self.root
        self._child = os.fork()
        if self._child == 0:
            os.close(self._stop_w)
            os.close(self._result_r)
            self._run_child(root, stop_r, result_w)
        os.close(stop_r)
        os.close(result_w)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._stop_w)  # EOF: the child takes a last sample and reports
        data = b""
        while chunk := os.read(self._result_r, 4096):
            data += chunk
        os.close(self._result_r)
        os.waitpid(self._child, 0)
        if data:
            peak_kb, workers = map(int, data.split())
            self.peak_kb = max(self.peak_kb, peak_kb)
            self.peak_workers = max(self.peak_workers, workers)

    @property
    def peak_mb(self) -> float:
        return self.peak_kb / 1024


# -------------------------------------------------------------------------------------------------- contenders


def run_drainpipe(path: Path, db: Path, *, trace: list | None = None, expected: int | None = None) -> dict[str, Any]:
    from drainpipe.pipeline.definitions import default_definitions
    from drainpipe.pipeline.run import run_local

    step = max(1, (expected or 0) // 40)
    mark = [0]

    def progress(read: int, _bytes: int) -> None:
        if trace is not None and read >= mark[0]:
            trace.append((read, round(rss_mb(), 1)))
            mark[0] = read + step

    summary = run_local([str(path)], definitions=default_definitions(), store_url=f"duckdb:///{db}", progress=progress)
    if summary.rejected or summary.dropped or summary.handler_errors:
        raise SystemExit(f"drainpipe run not clean: {summary.lines()}")
    return {"events": summary.accepted, "summary": summary.lines()}


# ---- (a) the straightforward loop


def _iter_parquet(path: Path) -> Iterator[dict]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=65_536):
        yield from batch.to_pylist()


def _iter_jsonl(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _iso(ms: int) -> str:
    return time.strftime(ISO, time.gmtime(ms // 1000))


def loop_compute(events: Iterable[dict]) -> tuple[list[tuple], list[tuple], int]:
    """The loop a user would write. Returns (value rows, top-N rows, events)."""
    # minute states per (scope, entity, minute start): [n, latency sum, ok, satisfied, tolerating, errors]
    states: dict[tuple, list] = {}
    hist: dict[tuple, dict[int, int]] = {}
    top: dict[tuple, list] = {}
    count = 0
    floor = math.floor
    for e in events:
        count += 1
        ts = e["ts"]
        service = e["service"]
        instance = e.get("instance") or ""
        endpoint = e.get("endpoint") or ""
        latency = e["latency_ms"]
        status = e.get("status")
        ok = True if status is None else bool(status)
        minute = ts - ts % 60_000
        b = floor(latency / PRECISION)
        keys = [("service", service, minute)]
        if instance:
            keys.append(("instance", service + "/" + instance, minute))
        if endpoint:
            keys.append(("endpoint", service + "/" + endpoint, minute))
        for key in keys:
            s = states.get(key)
            if s is None:
                s = states[key] = [0, 0.0, 0, 0, 0, 0]
                h = hist[key] = {}
            else:
                h = hist[key]
            s[0] += 1
            s[1] += latency
            if ok:
                s[2] += 1
                if latency <= APDEX_T:
                    s[3] += 1
                elif latency <= 4 * APDEX_T:
                    s[4] += 1
            else:
                s[5] += 1
            h[b] = h.get(b, 0) + 1
        statement = e.get("db_statement")
        if statement:
            tkey = (service, ts - ts % TOPN_BUCKET_MS)
            lst = top.get(tkey)
            if lst is None:
                lst = top[tkey] = []
            lst.append((-latency, statement))
            if len(lst) > 8 * TOPN_N:
                lst.sort()
                del lst[TOPN_N:]

    # roll minute states up to hour and day
    all_states: dict[tuple, list] = {}
    all_hist: dict[tuple, dict[int, int]] = {}
    for (scope, entity, minute), s in states.items():
        h = hist[(scope, entity, minute)]
        for gran, width in GRANULARITIES:
            key = (scope, entity, gran, minute - minute % width)
            t = all_states.get(key)
            if t is None:
                all_states[key] = list(s)
                all_hist[key] = dict(h)
            else:
                for i in range(6):
                    t[i] += s[i]
                th = all_hist[key]
                for bb, c in h.items():
                    th[bb] = th.get(bb, 0) + c

    rows: list[tuple] = []
    minutes = {"minute": 1, "hour": 60, "day": 1440}
    for (scope, entity, gran, bucket), (n, total, ok, sat, tol, err) in all_states.items():
        tb = _iso(bucket)
        rows.append((f"{scope}_cpm", entity, gran, tb, "", n / minutes[gran]))
        rows.append((f"{scope}_resp_time", entity, gran, tb, "", total / n))
        rows.append((f"{scope}_sla", entity, gran, tb, "", 100 * ok / n))
        rows.append((f"{scope}_apdex", entity, gran, tb, "", ((2 * sat + tol) * 10_000 + n) // (2 * n) / 10_000))
        if scope == "service" and err:
            rows.append(("service_error_count", entity, gran, tb, "", float(err)))
        bins = sorted(all_hist[(scope, entity, gran, bucket)].items())
        ranks = [(p * n + 99) // 100 for p in PERCENTILES]
        cumulative, i = 0, 0
        for bb, c in bins:
            cumulative += c
            while i < len(ranks) and cumulative >= ranks[i]:
                rows.append((f"{scope}_percentile", entity, gran, tb, f"p{PERCENTILES[i]}", bb * PRECISION))
                i += 1
    top_rows: list[tuple] = []
    for (service, bucket), lst in top.items():
        tb = _iso(bucket)
        for rank, (neg, statement) in enumerate(heapq.nsmallest(TOPN_N, lst), 1):
            top_rows.append((TOPN_NAME, service, tb, rank, statement, -neg))
    return rows, top_rows, count


_VALUES_DDL = (
    "CREATE TABLE metric_values (metric VARCHAR, entity VARCHAR, granularity VARCHAR, "
    "time_bucket TIMESTAMPTZ, label VARCHAR, value DOUBLE)"
)
_TOPN_DDL = (
    "CREATE TABLE topn_values (name VARCHAR, entity VARCHAR, time_bucket TIMESTAMPTZ, rank INTEGER, "
    "key VARCHAR, latency_ms DOUBLE)"
)


def run_loop(path: Path, db: Path) -> dict[str, Any]:
    import duckdb
    import pyarrow as pa

    events = _iter_parquet(path) if path.suffix == ".parquet" else _iter_jsonl(path)
    rows, top_rows, count = loop_compute(events)
    values = pa.table(list(zip(*rows)), names=["metric", "entity", "granularity", "time_bucket", "label", "value"])
    topn = pa.table(list(zip(*top_rows)), names=["name", "entity", "time_bucket", "rank", "key", "latency_ms"])
    con = duckdb.connect(str(db))
    con.execute(_VALUES_DDL)
    con.execute(_TOPN_DDL)
    con.register("loop_values", values)
    con.register("loop_topn", topn)
    con.execute("INSERT INTO metric_values SELECT * FROM loop_values")
    con.execute("INSERT INTO topn_values SELECT * FROM loop_topn")
    con.close()
    return {"events": count}


# ---- (b) DuckDB SQL


def _sql_source(path: Path) -> str:
    if path.suffix == ".parquet":
        return f"read_parquet('{path}')"
    return (
        f"read_json('{path}', format = 'newline_delimited', columns = {{ts: 'BIGINT', service: 'VARCHAR', "
        "instance: 'VARCHAR', endpoint: 'VARCHAR', latency_ms: 'DOUBLE', status: 'BOOLEAN', "
        "db_statement: 'VARCHAR'})"
    )


def sql_statements(path: Path, events_sql: str | None = None) -> list[str]:
    """The SQL contender: the default metric set computed in DuckDB straight from the file. ``events_sql``: a query
    giving the file's events in the event schema's columns (other formats than JSON Lines and Parquet)."""
    src = _sql_source(path)
    events = "ev"
    statements = [_VALUES_DDL, _TOPN_DDL]
    if events_sql is not None:
        statements.append(f"CREATE TEMP TABLE ev AS {events_sql}")
    elif path.suffix != ".parquet":  # parse JSON once, not once per query
        statements.append(f"CREATE TEMP TABLE ev AS SELECT * FROM {src}")
    else:
        events = src
    iso = "to_timestamp(bucket * 60)"  # the bucket start as drainpipe stores it: TIMESTAMP WITH TIME ZONE
    statements += [
        # one scan: per scope entity, minute and histogram bin, every state the metrics need
        f"""CREATE TEMP TABLE bins AS
        SELECT scope, entity, m, b, n, v, ok, sat, tol, err
        FROM (
          SELECT CASE WHEN grouping(instance) = 0 THEN 'instance' WHEN grouping(endpoint) = 0 THEN 'endpoint'
                      ELSE 'service' END AS scope,
                 CASE WHEN grouping(instance) = 0 THEN service || '/' || instance
                      WHEN grouping(endpoint) = 0 THEN service || '/' || endpoint ELSE service END AS entity,
                 instance, endpoint, m, b, count(*) AS n, sum(latency_ms) AS v, count_if(status) AS ok,
                 count_if(status AND latency_ms <= {APDEX_T}) AS sat,
                 count_if(status AND latency_ms > {APDEX_T} AND latency_ms <= {4 * APDEX_T}) AS tol,
                 count_if(NOT status) AS err
          FROM (SELECT ts // 60000 AS m, service, coalesce(instance, '') AS instance,
                       coalesce(endpoint, '') AS endpoint, latency_ms, coalesce(status, true) AS status,
                       CAST(floor(latency_ms / {PRECISION}) AS BIGINT) AS b
                FROM {events})
          GROUP BY GROUPING SETS ((service, m, b), (service, instance, m, b), (service, endpoint, m, b)))
        WHERE (scope <> 'instance' OR instance <> '') AND (scope <> 'endpoint' OR endpoint <> '')""",
        # minute, hour and day histograms (bucket in minutes)
        """CREATE TEMP TABLE gbins AS
        SELECT scope, entity, g.granularity, g.minutes, m // g.minutes * g.minutes AS bucket, b, sum(n) AS n,
               sum(v) AS v, sum(ok) AS ok, sum(sat) AS sat, sum(tol) AS tol, sum(err) AS err
        FROM bins, (VALUES ('minute', 1), ('hour', 60), ('day', 1440)) g(granularity, minutes)
        GROUP BY ALL""",
        f"""CREATE TEMP TABLE states AS
        SELECT scope, entity, granularity, minutes, bucket, {iso} AS time_bucket, sum(n) AS n, sum(v) AS v,
               sum(ok) AS ok, sum(sat) AS sat, sum(tol) AS tol, sum(err) AS err
        FROM gbins GROUP BY scope, entity, granularity, minutes, bucket""",
        """INSERT INTO metric_values
        SELECT scope || '_cpm', entity, granularity, time_bucket, '', n / minutes FROM states
        UNION ALL SELECT scope || '_resp_time', entity, granularity, time_bucket, '', v / n FROM states
        UNION ALL SELECT scope || '_sla', entity, granularity, time_bucket, '', 100 * ok / n FROM states
        UNION ALL SELECT scope || '_apdex', entity, granularity, time_bucket, '',
                         ((2 * sat + tol) * 10000 + n) // (2 * n) / 10000.0 FROM states
        UNION ALL SELECT 'service_error_count', entity, granularity, time_bucket, '', err FROM states
                  WHERE scope = 'service' AND err > 0""",
        # percentiles: running count over the bins, the first bin reaching rank ceil(p * n / 100)
        f"""INSERT INTO metric_values
        WITH running AS (
          SELECT scope, entity, granularity, bucket, b,
                 sum(n) OVER (PARTITION BY scope, entity, granularity, bucket ORDER BY b
                              ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum,
                 sum(n) OVER (PARTITION BY scope, entity, granularity, bucket) AS total
          FROM gbins),
        picked AS (
          SELECT scope, entity, granularity, bucket,
                 min(b) FILTER (WHERE cum >= (50 * total + 99) // 100) AS p50,
                 min(b) FILTER (WHERE cum >= (75 * total + 99) // 100) AS p75,
                 min(b) FILTER (WHERE cum >= (90 * total + 99) // 100) AS p90,
                 min(b) FILTER (WHERE cum >= (95 * total + 99) // 100) AS p95,
                 min(b) FILTER (WHERE cum >= (99 * total + 99) // 100) AS p99
          FROM running GROUP BY ALL)
        SELECT scope || '_percentile', entity, granularity, {iso}, label, {PRECISION} * b
        FROM picked UNPIVOT (b FOR label IN (p50, p75, p90, p95, p99))""",
        f"""INSERT INTO topn_values
        SELECT '{TOPN_NAME}', service,
               to_timestamp(ts // {TOPN_BUCKET_MS} * {TOPN_BUCKET_MS} // 1000),
               row_number() OVER (PARTITION BY service, ts // {TOPN_BUCKET_MS}
                                  ORDER BY latency_ms DESC, db_statement ASC) AS rank,
               db_statement, latency_ms
        FROM {events} WHERE db_statement IS NOT NULL AND db_statement <> ''
        QUALIFY rank <= {TOPN_N}""",
    ]
    return statements


#: the contenders that run in a worker process of this script (``sql`` runs only as its command, :func:`run_cli`)
CONTENDERS: dict[str, Callable[..., dict[str, Any]]] = {
    "drainpipe": run_drainpipe,
    "loop": run_loop,
}
#: the table's rows, in order
NAMES = ("drainpipe", "loop", "sql")

# -------------------------------------------------------------------------------------------------- workers


def _preload() -> None:
    """Imports are not part of any timing."""
    import importlib

    for module in (
        "duckdb",
        "numpy",
        "pyarrow.acero",
        "pyarrow.compute",
        "pyarrow.json",
        "pyarrow.parquet",
        "drainpipe.pipeline.run",
        "drainpipe.pipeline.store",
    ):
        importlib.import_module(module)


def worker(args: argparse.Namespace) -> None:
    """One timed contender in this (fresh) process; prints one JSON line."""
    path, db = Path(args.input), Path(args.out)
    _preload()

    trace: list = []
    base_rss = rss_mb()
    sampler = MemorySampler()
    sampler.sample()
    base_mem, sampler.peak_kb = sampler.peak_mb, 0
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0, c0 = time.perf_counter(), time.process_time()
    with sampler:
        if args.worker == "drainpipe-memory":
            out = run_drainpipe(path, db, trace=trace, expected=args.expected)
            out.update(state_rows=_state_rows(db))
        else:
            out = CONTENDERS[args.worker](path, db)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    children1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # worker processes, reaped by the run
    cpu_children = (children1.ru_utime + children1.ru_stime) - (children0.ru_utime + children0.ru_stime)
    out.update(
        wall_s=wall,
        cpu_s=cpu + cpu_children,
        cpu_main_s=cpu,
        cpu_workers_s=cpu_children,
        eps=out["events"] / wall,
        maxrss_mb=maxrss_mb(),
        base_rss_mb=base_rss,
        peak_mem_mb=max(sampler.peak_mb, maxrss_mb()),
        base_mem_mb=base_mem,
        workers=sampler.peak_workers,
        rss_trace=trace,
    )
    print(json.dumps(out))


def _state_rows(db: Path) -> int:
    """The stored state rows after the run (what its memory should follow), read from the closed DuckDB file."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return int(con.execute("SELECT count(*) FROM metric_state").fetchone()[0])
    finally:
        con.close()


#: the SQL contender as a user would run it: a Python process running DuckDB over the file (argv: statements file,
#: database); it prints the number of events its day states count
SQL_JOB = (
    "import duckdb, json, sys\n"
    "con = duckdb.connect(sys.argv[2])\n"
    "for statement in json.load(open(sys.argv[1])):\n"
    "    con.execute(statement)\n"
    "print(con.execute(\"SELECT sum(n) FROM states WHERE scope = 'service' AND granularity = 'day'\").fetchone()[0])\n"
    "con.close()\n"
)


def cli_command(name: str, path: Path, db: Path) -> list[str]:
    """The command a user runs: ``drainpipe run`` (the installed script), or Python running the SQL."""
    if name == "drainpipe":
        script = Path(sys.executable).with_name("drainpipe")
        return [str(script), "run", "--input", str(path), "--store", f"duckdb:///{db}", "--quiet"]
    statements = db.with_suffix(".sql.json")
    statements.write_text(json.dumps(sql_statements(path)))
    return [sys.executable, "-c", SQL_JOB, str(statements), str(db)]


def byte_compile_drainpipe() -> None:
    """Write drainpipe's bytecode caches, as installing a package does, so that the timed commands start as a user's
    do. An editable install writes them on first import, unless ``PYTHONDONTWRITEBYTECODE`` is set, as it is on the
    machine these figures come from: there every start compiled ~60 modules from source, 0.08 s."""
    compileall.compile_dir(str(ROOT / "src" / "drainpipe"), quiet=1)


def run_cli(name: str, path: Path, db: Path, sample_memory: bool = False) -> dict[str, Any]:
    """One contender as a command, timed from outside as the user waits: wall time from start to exit (start-up
    included), CPU of the process and every process it started and reaped; with ``sample_memory``, the peak memory
    of the process tree (sum of PSS, sampled every 0.25 s by a forked child of this process: its reads disturb the
    timing, so timed runs go without)."""
    cmd = cli_command(name, path, db)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = MemorySampler(root=proc.pid) if sample_memory else None
    with sampler or contextlib.nullcontext():
        out, err = proc.communicate()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:2])} failed ({proc.returncode}):\n{err[-3000:]}")
    if name == "drainpipe":
        accepted = re.search(r"accepted ([\d,]+)", out)
        events = int(accepted.group(1).replace(",", "")) if accepted else -1
    else:
        events = int(out.strip().splitlines()[-1])
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {
        "events": events,
        "wall_s": wall,
        "cpu_s": cpu,
        "eps": events / wall,
        "peak_mem_mb": sampler.peak_mb if sampler else float("nan"),
        "processes": sampler.peak_workers + 1 if sampler else 0,
        "output": out.strip().splitlines()[-2:],
    }


def startup(name: str, path: Path, db: Path) -> dict[str, Any]:
    """The same command on a tiny input: what the user waits for before any work (imports, store open and close)."""
    r = run_cli(name, path, db)
    db.unlink(missing_ok=True)
    return r


def spawn(name: str, path: Path, db: Path, *extra: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", name, "--input", str(path), "--out", str(db), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"worker {name} on {path.name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -------------------------------------------------------------------------------------------------- verification


def _rows_of(db: Path) -> tuple[list[tuple], list[tuple]]:
    """A contender's value and top-N rows, time_bucket as ISO text (what the store's query API gives)."""
    import duckdb

    from drainpipe.pipeline.times import iso_from_ms, ms_from_bucket

    def rows(sql: str) -> list[tuple]:
        table = con.sql(sql).to_arrow_table()
        i = table.column_names.index("time_bucket")
        table = table.set_column(i, "time_bucket", iso_from_ms(ms_from_bucket(table.column(i))))
        return list(zip(*(c.to_pylist() for c in table.columns)))

    con = duckdb.connect(str(db), read_only=True)
    values = rows(
        "SELECT metric, entity, granularity, time_bucket, label, value FROM metric_values "
        "ORDER BY metric, entity, granularity, time_bucket, label"
    )
    topn = rows(
        "SELECT name, entity, time_bucket, rank, key, latency_ms FROM topn_values "
        "ORDER BY name, entity, time_bucket, rank"
    )
    con.close()
    return values, topn


def _compare(reference: list[tuple], values: list[tuple]) -> tuple[int, list[str]]:
    """Differences between two sorted value-row lists (avg to 1e-9 relative, the rest exact)."""
    problems: list[str] = []
    ref = {r[:5]: r[5] for r in reference}
    got = {r[:5]: r[5] for r in values}
    missing, extra = ref.keys() - got.keys(), got.keys() - ref.keys()
    if missing:
        problems.append(f"{len(missing)} rows missing, e.g. {sorted(missing)[0]}")
    if extra:
        problems.append(f"{len(extra)} extra rows, e.g. {sorted(extra)[0]}")
    bad = 0
    for key in ref.keys() & got.keys():
        a, b = ref[key], got[key]
        if key[0].endswith("_resp_time"):
            same = math.isclose(a, b, rel_tol=1e-9)
        else:
            same = a == b
        if not same:
            bad += 1
            if bad <= 3:
                problems.append(f"{key}: drainpipe {a!r} vs {b!r}")
    if bad:
        problems.append(f"{bad} differing values")
    return len(ref.keys() & got.keys()), problems


def verify(data_dir: Path, work: Path, events: int) -> dict[str, Any]:
    """Same input, every contender: the loop's and the SQL's rows must equal drainpipe's query output."""
    from drainpipe.pipeline.store import open_store

    report: dict[str, Any] = {"events": events, "checks": []}
    reference_values = reference_topn = None
    for fmt in FORMATS:
        path = data_file(data_dir, events, fmt)
        db = fresh_db(work, f"verify-drainpipe-{fmt}")
        run_drainpipe(path, db)
        store = open_store(f"duckdb:///{db}")
        values = store.query()
        topn = store.query_topn(TOPN_NAME)
        store.close()
        if reference_values is None:
            reference_values, reference_topn = values, topn
            metrics = sorted({r[0] for r in values})
            report["value_rows"], report["topn_rows"], report["metrics"] = len(values), len(topn), metrics
            if len(metrics) != 16 or {r[2] for r in values} != {"minute", "hour", "day"}:
                raise SystemExit(f"verification: unexpected drainpipe output: {metrics}")
        else:
            _check(report, f"drainpipe {fmt}", reference_values, reference_topn, values, topn)
        for name in ("loop", "sql"):  # the SQL as the very command that is timed
            db = fresh_db(work, f"verify-{name}-{fmt}")
            run_cli(name, path, db) if name == "sql" else CONTENDERS[name](path, db)
            values, topn = _rows_of(db)
            _check(report, f"{name} {fmt}", reference_values, reference_topn, values, topn)
        # the timed runs read large files in worker processes: check that path too (small blocks, several tasks)
        from drainpipe.pipeline import parallel
        from drainpipe.pipeline.definitions import default_definitions
        from drainpipe.pipeline.run import run_local

        saved = parallel.MIN_PARALLEL_BYTES
        parallel.MIN_PARALLEL_BYTES = 0
        try:
            db = fresh_db(work, f"verify-drainpipe-workers-{fmt}")
            run_local(
                [str(path)],
                definitions=default_definitions(),
                store_url=f"duckdb:///{db}",
                batch_rows=max(1, events // 7),
                workers=2,
            )
        finally:
            parallel.MIN_PARALLEL_BYTES = saved
        values, topn = _rows_of(db)
        _check(report, f"drainpipe workers {fmt}", reference_values, reference_topn, values, topn)
    report["ok"] = all(c["ok"] for c in report["checks"])
    return report


def _check(report: dict, name: str, ref_values: list, ref_topn: list, values: list, topn: list) -> None:
    compared, problems = _compare(ref_values, values)
    topn_same = [tuple(r) for r in ref_topn] == [tuple(r) for r in topn]
    if not topn_same:
        problems.append(f"top-N rows differ ({len(ref_topn)} vs {len(topn)})")
    report["checks"].append(
        {"contender": name, "rows_compared": compared, "topn_rows": len(topn), "ok": not problems, "problems": problems}
    )
    status = "equal" if not problems else "DIFFERENT: " + "; ".join(problems)
    print(f"  {name:16s} {compared:>7,} value rows, {len(topn):>5,} top-N rows vs drainpipe: {status}", flush=True)


# -------------------------------------------------------------------------------------------------- profile


def profile_stages(path: Path, db: Path) -> dict[str, Any]:
    """The local engine with timers around its stages: wall and CPU seconds per (thread group, stage), in the main
    process (large files are read and aggregated in worker processes, which these timers do not see)."""
    from drainpipe.pipeline import engine as E
    from drainpipe.pipeline import partials as F
    from drainpipe.pipeline import store as S

    acc: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    lock = threading.Lock()

    def timed(label: str, fn: Callable) -> Callable:
        def wrapper(*a: Any, **k: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
                group = threading.current_thread().name.rsplit("-", 1)[0].replace("drainpipe-pipeline-", "")
                with lock:
                    r = acc[(group, label)]
                    r[0] += wall
                    r[1] += cpu
                    r[2] += 1

        return wrapper

    class TimedMethod:
        """A timed bound method that still offers the wrapped object's attributes (the queue's produce has some)."""

        def __init__(self, label: str, fn: Callable) -> None:
            self._fn, self._timed = fn, timed(label, fn)

        def __call__(self, *a: Any, **k: Any) -> Any:
            return self._timed(*a, **k)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._fn, name)

    from drainpipe.inputs import PartReader

    untimed = PartReader.__iter__

    def timed_iter(self: PartReader) -> Iterator:
        it = untimed(self)
        step = timed("read + validate (next batch)", it.__next__)
        while True:
            try:
                yield step()
            except StopIteration:
                return

    PartReader.__iter__ = timed_iter  # type: ignore[method-assign]
    E.LocalEngine.ingest_partials = timed("ingest_partials (from workers)", E.LocalEngine.ingest_partials)
    from drainpipe.pipeline import progress as PR

    PR.prefix_hasher = timed("file fingerprint", PR.prefix_hasher)
    E.aggregate_batch = timed("aggregate_batch", E.aggregate_batch)
    E.split_partial = timed("split_partial", E.split_partial)
    F.MetricAccumulator.add = timed("accumulator add", F.MetricAccumulator.add)
    F.MetricAccumulator.drain = timed("accumulator drain", F.MetricAccumulator.drain)
    S.SqlStore.merge = timed("store.merge", S.SqlStore.merge)
    engine_init = E.LocalEngine.__init__
    engine_close = E.LocalEngine.close

    def init(self: Any, *a: Any, **k: Any) -> None:
        engine_init(self, *a, **k)
        for q in self.queues():
            short = q.name.replace("pipeline-", "")
            q.produce = TimedMethod(f"produce -> {short}", q.produce)
            q.produce_many = TimedMethod(f"produce_many -> {short}", q.produce_many)

    E.LocalEngine.__init__ = init
    E.LocalEngine.close = timed("engine.close (final flush)", engine_close)
    t0, c0 = time.perf_counter(), time.process_time()
    out = run_drainpipe(path, db)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stages = [
        {"thread": th, "stage": st, "wall_s": w, "cpu_s": c, "calls": n}
        for (th, st), (w, c, n) in sorted(acc.items(), key=lambda kv: -kv[1][0])
    ]
    return {"events": out["events"], "wall_s": wall, "cpu_s": cpu, "stages": stages}


def profile_cprofile(path: Path, db: Path, top: int = 25) -> dict[str, Any]:
    """The local engine under cProfile on every thread (each thread its own profiler, stats merged)."""
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()
    original_run = threading.Thread.run

    def run(self: threading.Thread) -> None:
        prof = cProfile.Profile()
        with lock:
            profiles.append(prof)
        prof.enable()
        try:
            original_run(self)
        finally:
            prof.disable()

    threading.Thread.run = run  # type: ignore[method-assign]
    main = cProfile.Profile()
    t0 = time.perf_counter()
    main.enable()
    out = run_drainpipe(path, db)
    main.disable()
    wall = time.perf_counter() - t0
    threading.Thread.run = original_run  # type: ignore[method-assign]
    stats = pstats.Stats(main)
    for p in profiles:
        stats.add(p)
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(file).name}:{line}({func})", "calls": nc, "tottime_s": tt, "cumtime_s": ct})
    rows.sort(key=lambda r: -r["tottime_s"])
    # idle waits (Condition.wait, sleep) dominate tottime on queue threads; list compute first
    waiting = ("wait", "sleep", "acquire", "_next", "select", "SimpleQueue", "lock")
    busy = [r for r in rows if not any(w in r["function"].split("(", 1)[-1] for w in waiting)]
    return {
        "events": out["events"],
        "wall_s": wall,
        "top_tottime": busy[:top],
        "waits": [r for r in rows if r not in busy][:8],
    }


def profile_sequential(path: Path, db: Path, jsonl: Path) -> dict[str, Any]:
    """The engine's stages run one after the other on one thread (no queues, no contention): CPU per stage."""
    import pyarrow.parquet as pq

    from drainpipe.inputs import file_identity, read_events
    from drainpipe.pipeline.aggregate import aggregate_batch
    from drainpipe.pipeline.definitions import default_definitions
    from drainpipe.pipeline.partials import MetricAccumulator, MetricPartial, merge, split_partial
    from drainpipe.pipeline.store import open_store

    definitions = default_definitions()
    stages: list[dict[str, Any]] = []

    def stage(label: str, events: int, fn: Callable[[], Any]) -> Any:
        c0, t0 = time.process_time(), time.perf_counter()
        result = fn()
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        stages.append(
            {
                "stage": label,
                "events": events,
                "cpu_s": cpu,
                "wall_s": wall,
                "cpu_us_per_event": 1e6 * cpu / max(1, events),
            }
        )
        return result

    string_columns = ["service", "instance", "endpoint", "db_statement"]
    n = pq.ParquetFile(path).metadata.num_rows
    stage("file fingerprint (Parquet)", n, lambda: file_identity(str(path)))
    stage(
        "Parquet decode only (pyarrow iter_batches)",
        n,
        lambda: sum(b.num_rows for b in pq.ParquetFile(path).iter_batches(batch_size=65_536)),
    )
    stage(
        "  the same, strings as dictionaries",
        n,
        lambda: sum(
            b.num_rows for b in pq.ParquetFile(path, read_dictionary=string_columns).iter_batches(batch_size=65_536)
        ),
    )
    stage("read_events Parquet (decode + validate)", n, lambda: sum(b.num_rows for b in read_events([str(path)])))
    batches = list(read_events([str(path)]))  # held for the next stage (not timed: page faults of holding all)
    partials = stage(
        "aggregate_batch (16 metrics + top-N)",
        n,
        lambda: [aggregate_batch(b, definitions) for b in batches],
    )

    def l1() -> list:
        accumulators: dict[str, MetricAccumulator] = {}
        for parts in partials:
            for p in parts:
                if isinstance(p, MetricPartial):
                    for piece in split_partial(p, 4096):
                        accumulators.setdefault(p.name, MetricAccumulator(p.definition)).add(piece)
        merged = [a.drain() for a in accumulators.values()]
        return merged + [merge([p for parts in partials for p in parts if not isinstance(p, MetricPartial)])]

    merged = stage("split + merge all partials (L1/L2 work, once)", n, l1)
    store = open_store(f"duckdb:///{db}")
    stage("store.merge, all states in one transaction", n, lambda: store.merge(merged))
    rows = sum(p.table.num_rows for p in merged)
    store.close()
    m = sum(1 for _ in open(jsonl, "rb"))
    stage("file fingerprint (JSONL)", m, lambda: file_identity(str(jsonl)))
    stage("read_events JSONL (parse + validate)", m, lambda: sum(b.num_rows for b in read_events([str(jsonl)])))
    return {"stages": stages, "state_rows": rows}


def profile_worker(args: argparse.Namespace) -> None:
    path, db = Path(args.input), Path(args.out)
    _preload()

    if args.worker == "profile-stages":
        result = profile_stages(path, db)
    elif args.worker == "profile-sequential":
        result = profile_sequential(path, db, Path(args.jsonl))
    else:
        result = profile_cprofile(path, db)
    print(json.dumps(result))


# -------------------------------------------------------------------------------------------------- reporting


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarise(runs: list[dict]) -> dict[str, Any]:
    eps = [r["eps"] for r in runs]
    return {
        "events": runs[0]["events"],
        "eps_median": _median(eps),
        "eps_min": min(eps),
        "eps_max": max(eps),
        "wall_s_median": _median([r["wall_s"] for r in runs]),
        "cpu_s_median": _median([r["cpu_s"] for r in runs]),
        "peak_mem_mb_median": _median([r["peak_mem_mb"] for r in runs if r["peak_mem_mb"] == r["peak_mem_mb"]]),
        "runs": runs,
    }


def paired_ratios(raw: dict[str, list[dict]], runs: int) -> dict[str, dict[str, Any]]:
    """Per run, drainpipe's events/s over each other contender's (same run, close in time): median and spread.
    Less exposed to the machine's load changing between runs than a ratio of medians."""
    out: dict[str, dict[str, Any]] = {}
    for fmt in FORMATS:
        base = raw.get(f"drainpipe/{fmt}", [])
        for name in NAMES:
            other = raw.get(f"{name}/{fmt}", [])
            if name == "drainpipe" or not base or len(other) != len(base):
                continue
            ratios = [a["eps"] / b["eps"] for a, b in zip(base, other)]
            out[f"drainpipe/{name} {fmt}"] = {
                "median": _median(ratios),
                "min": min(ratios),
                "max": max(ratios),
                "runs": ratios,
            }
    return out


def fmt_eps(v: float) -> str:
    return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.0f}k"


def print_table(results: dict[str, dict], paired: dict[str, dict], args: argparse.Namespace) -> dict[str, Any]:
    print()
    print(f"End to end, file -> fresh DuckDB file; medians of {args.runs} interleaved run(s), spread = min..max")
    header = (
        f"{'contender':<14} {'input':<8} {'events':>10} {'events/s':>9} {'spread':>15} {'wall s':>7} {'start s':>7} "
        f"{'CPU s':>6} {'us/ev':>6} {'cores':>5} {'peak mem':>9}  vs drainpipe (wall; CPU/event)"
    )
    print(header)
    print("-" * len(header))
    ratios: dict[str, Any] = {}
    for fmt in FORMATS:
        dp = results.get(f"drainpipe/{fmt}")
        for name in NAMES:
            r = results.get(f"{name}/{fmt}")
            if r is None:
                continue
            rel = ""
            us = 1e6 * r["cpu_s_median"] / r["events"]
            if dp and name != "drainpipe":
                x = dp["eps_median"] / r["eps_median"]
                y = us / (1e6 * dp["cpu_s_median"] / dp["events"])
                rel = f"{x:.2f}x; {y:.2f}x"
                ratios[f"drainpipe/{name} {fmt}"] = x
                ratios[f"drainpipe/{name} {fmt} (CPU per event)"] = y
            label = name + (" (1)" if name == "loop" else "")
            start = f"{r['startup_s_median']:.2f}" if "startup_s_median" in r else "-"
            print(
                f"{label:<14} {fmt:<8} {r['events']:>10,} {fmt_eps(r['eps_median']):>9} "
                f"{fmt_eps(r['eps_min']) + '..' + fmt_eps(r['eps_max']):>15} {r['wall_s_median']:>7.2f} {start:>7} "
                f"{r['cpu_s_median']:>6.2f} {us:>6.2f} {r['cpu_s_median'] / r['wall_s_median']:>5.2f} "
                f"{r['peak_mem_mb_median']:>6.0f} MB  {rel}"
            )
    print(
        "drainpipe and sql are timed as the user waits: `drainpipe run FILE --store duckdb:///...` against a Python "
        "process running the SQL, from start to exit; wall s includes start s, the same command's time on "
        f"{STARTUP_EVENTS:,} events (imports, store open and close). The loop is timed after its imports."
    )
    print(
        "us/ev = CPU microseconds per event (all threads and worker processes; less sensitive to a busy machine "
        "than wall time); cores = CPU s / wall s."
    )
    print(
        "peak mem = peak memory of the contender's process and its worker processes together (the sampled sum of "
        "their PSS; for the loop, at least its peak RSS)."
    )
    print(
        "vs drainpipe: how many times drainpipe's events/s (wall), and how many times drainpipe's CPU per event "
        "the contender spends; > 1 favours drainpipe."
    )
    print(f"(1) the loop runs on {args.loop_events:,} events (it is slow); compared as events/s.")
    checks: dict[str, tuple[bool, str, str]] = {}  # name -> (pass, value, paired ratio)

    def spread(key: str, invert: bool = False) -> str:
        p = paired.get(key)
        if p is None:
            return ""
        if invert:
            return f"   [per run: {1 / p['median']:.2f}x, {1 / p['max']:.2f}..{1 / p['min']:.2f}]"
        return f"   [per run: {p['median']:.2f}x, {p['min']:.2f}..{p['max']:.2f}]"

    dp = results.get("drainpipe/parquet")
    if dp:
        checks[f">= {TARGET_EPS / 1e6:.0f}M events/s from Parquet"] = (
            dp["eps_median"] >= TARGET_EPS,
            fmt_eps(dp["eps_median"]),
            f"   [runs: {', '.join(fmt_eps(r['eps']) for r in dp['runs'])}]",
        )
    for fmt in FORMATS:
        key = f"drainpipe/loop {fmt}"
        if key in ratios:
            x = ratios[key]
            checks[f">= {TARGET_LOOP_RATIO:.0f}x the loop ({fmt})"] = (x >= TARGET_LOOP_RATIO, f"{x:.2f}x", spread(key))
        key = f"drainpipe/sql {fmt}"
        if key in ratios:
            x = ratios[key]
            checks[f">= {TARGET_SQL_RATIO:.1f}x DuckDB SQL ({fmt})"] = (x >= TARGET_SQL_RATIO, f"{x:.2f}x", spread(key))
            cpu = ratios[f"{key} (CPU per event)"]
            checks[f"CPU per event <= DuckDB's ({fmt})"] = (cpu >= 1.0, f"SQL's / ours {cpu:.2f}x", "")
            ours, theirs = results[f"drainpipe/{fmt}"], results[f"sql/{fmt}"]
            memory = ours["peak_mem_mb_median"] / theirs["peak_mem_mb_median"]
            checks[f"peak memory <= DuckDB's ({fmt})"] = (memory <= 1.0, f"ours / SQL's {memory:.2f}x", "")
    print()
    print("Targets (on the medians; in brackets the ratio within each run, median and min..max)")
    for name, (ok, value, extra) in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name:<36} {value:<18}{extra}")
    return {
        "ratios": ratios,
        "paired_ratios": paired,
        "targets": {k: {"pass": ok, "value": v} for k, (ok, v, _) in checks.items()},
    }


def print_memory(memory: list[dict]) -> dict[str, Any]:
    print()
    print(
        "Peak memory of the local engine (Parquet in, fresh subprocess each, worker processes included; "
        "memory after imports = baseline)"
    )
    print(
        f"{'events':>12} {'baseline':>9} {'peak mem':>9} {'peak - base':>11} {'state rows':>11}  "
        "main process RSS while reading (at 10%/50%/90%)"
    )
    for m in memory:
        trace = m["rss_trace"]
        marks = []
        for share in (0.1, 0.5, 0.9):
            pick = min(trace, key=lambda t: abs(t[0] - share * m["events"])) if trace else (0, float("nan"))
            marks.append(f"{pick[1]:.0f}")
        print(
            f"{m['events']:>12,} {m['base_mem_mb']:>6.0f} MB {m['peak_mem_mb']:>6.0f} MB "
            f"{m['peak_mem_mb'] - m['base_mem_mb']:>8.0f} MB {m.get('state_rows', 0):>11,}  {' / '.join(marks)} MB"
            f"   ({fmt_eps(m['eps'])} events/s)"
        )
    out: dict[str, Any] = {"runs": memory}
    if len(memory) >= 2:
        small, large = memory[0], memory[-1]
        growth = (large["peak_mem_mb"] - large["base_mem_mb"]) / max(1.0, small["peak_mem_mb"] - small["base_mem_mb"])
        states = large.get("state_rows", 0) / max(1, small.get("state_rows", 0))
        inputs = large["events"] / small["events"]
        # bounded: memory does not follow the input; it may follow the stored state (the result), which grows
        # here because more events fill more histogram bins of the same hour
        ok = growth <= max(1.25, states) and growth <= 0.25 * inputs
        out.update(growth=growth, bounded=ok, state_growth=states, input_growth=inputs)
        print(
            f"  {'PASS' if ok else 'FAIL'}  bounded: {inputs:.0f}x the events -> {growth:.2f}x the memory above "
            f"baseline, while the stored state grew {states:.2f}x (the input spans one hour whatever its size; "
            "more events fill more histogram bins)"
        )
    return out


def print_profile(sequential: dict, stages: dict, prof: dict) -> None:
    print()
    print("Cost of each stage of the local engine, run one after the other on one thread (CPU):")
    print(f"{'stage':<48} {'events':>10} {'CPU s':>7} {'us/event':>9}")
    for s in sequential["stages"]:
        print(f"{s['stage']:<48} {s['events']:>10,} {s['cpu_s']:>7.2f} {s['cpu_us_per_event']:>9.3f}")
    print(f"  ({sequential['state_rows']:,} minute state rows after merging)")
    print()
    print(
        f"Profile of the local engine on {stages['events']:,} Parquet events: wall {stages['wall_s']:.2f} s, "
        f"process CPU {stages['cpu_s']:.2f} s (stage timers; threads overlap, so walls add up to more)"
    )
    print(f"{'thread group':<16} {'stage':<30} {'wall s':>7} {'CPU s':>7} {'calls':>6}")
    for s in stages["stages"]:
        if s["wall_s"] >= 0.01:
            print(f"{s['thread']:<16} {s['stage']:<30} {s['wall_s']:>7.2f} {s['cpu_s']:>7.2f} {s['calls']:>6}")
    print()
    print(f"cProfile, every thread, top functions by own time (run took {prof['wall_s']:.2f} s under the profiler):")
    for r in prof["top_tottime"][:15]:
        print(f"  {r['tottime_s']:>7.2f} s own {r['cumtime_s']:>7.2f} s cum {r['calls']:>8}  {r['function']}")


# -------------------------------------------------------------------------------------------------- main


def main() -> None:
    global FORMATS
    byte_compile_drainpipe()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--loop-events", type=int, default=1_000_000)
    ap.add_argument("--verify-events", type=int, default=20_000)
    ap.add_argument(
        "--memory-events",
        default=None,
        help="comma-separated event counts for the peak-memory runs (default 1000000,10000000; '' to skip)",
    )
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--quick", action="store_true", help="small smoke run (JSON goes to a temp dir)")
    ap.add_argument(
        "--data-dir", default=os.environ.get("DRAINPIPE_BENCH_DATA", str(Path.home() / ".cache" / "drainpipe-bench"))
    )
    ap.add_argument("--json", default=None, help="output JSON (default benchmarks/results/pipeline.json)")
    ap.add_argument(
        "--formats",
        default=",".join(FORMATS),
        help="comma-separated input formats to run (parquet,jsonl); without parquet there are no "
        "memory or profile runs, and the JSON goes to pipeline-<formats>.json unless --json",
    )
    # worker mode (internal)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--expected", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--jsonl", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        if args.worker.startswith("profile-"):
            profile_worker(args)
        else:
            worker(args)
        return

    # An installed package has its bytecode compiled (pip compiles at install). A checkout whose .pyc files are stale,
    # in an environment with PYTHONDONTWRITEBYTECODE set, would compile drainpipe's changed modules at every start
    # (~50 ms), which no user pays: compile them once here.
    import compileall

    compileall.compile_dir(str(ROOT / "src" / "drainpipe"), quiet=1)

    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    if not formats or set(formats) - set(FORMATS):
        raise SystemExit(f"--formats: choose from {', '.join(FORMATS)}")
    partial = formats != FORMATS
    FORMATS = formats
    if "parquet" not in FORMATS:
        args.memory_events, args.no_profile = "", True
    if args.quick:
        args.events, args.runs, args.loop_events = 200_000, 1, 100_000
        args.verify_events = 10_000
        if args.memory_events is None:
            args.memory_events = "100000,1000000"
    if args.memory_events is None:
        args.memory_events = "1000000,10000000"
    json_path = (
        Path(args.json)
        if args.json
        else (
            Path(tempfile.gettempdir()) / "drainpipe-bench-pipeline.quick.json"
            if args.quick
            else RESULTS / (f"pipeline-{'-'.join(FORMATS)}.json" if partial else "pipeline.json")
        )
    )
    data_dir = Path(args.data_dir)
    memory_sizes = [int(x) for x in args.memory_events.split(",") if x.strip()]
    import duckdb
    import pyarrow

    load0 = os.getloadavg()
    print(
        f"drainpipe pipeline benchmark: {args.events:,} events (loop {args.loop_events:,}), {args.runs} run(s), "
        f"{os.cpu_count()} CPUs, load average {load0[0]:.1f}"
    )
    print("input files:", flush=True)
    sizes = (args.events, args.loop_events, STARTUP_EVENTS)
    files = {(n, fmt): data_file(data_dir, n, fmt) for n in sizes for fmt in FORMATS}
    for n in memory_sizes:
        files[(n, "parquet")] = data_file(data_dir, n, "parquet")
    print(f"  in {data_dir}")

    with tempfile.TemporaryDirectory(prefix="drainpipe-bench-") as tmp:
        work = Path(tmp)
        print(f"verification on {args.verify_events:,} events (every value row and top-N row):", flush=True)
        verification = verify(data_dir, work, args.verify_events)
        if not verification["ok"]:
            raise SystemExit("verification failed: the contenders do not compute the same thing")

        plan = [(name, fmt) for name in ("drainpipe", "sql", "loop") for fmt in FORMATS]
        raw: dict[str, list[dict]] = collections.defaultdict(list)
        for run in range(args.runs):
            order = plan[run % len(plan) :] + plan[: run % len(plan)]
            print(f"run {run + 1}/{args.runs}:", flush=True)
            for name, fmt in order:
                n = args.loop_events if name == "loop" else args.events
                db = fresh_db(work, f"{name.strip('*')}-{fmt}")
                r = run_cli(name, files[(n, fmt)], db) if name in CLI else spawn(name, files[(n, fmt)], db)
                db.unlink(missing_ok=True)
                if r["events"] != n:
                    raise SystemExit(f"{name} {fmt}: processed {r['events']} events, expected {n}")
                raw[f"{name}/{fmt}"].append(r)
                workers = f" of which workers {r['cpu_workers_s']:.2f}" if "cpu_workers_s" in r else ""
                peak = f", {r['peak_mem_mb']:.0f} MB peak" if name not in CLI else ""
                print(
                    f"  {name:<10} {fmt:<8} {fmt_eps(r['eps']):>7} events/s  ({r['wall_s']:.2f} s wall, "
                    f"{r['cpu_s']:.2f} s CPU{workers}{peak})",
                    flush=True,
                )
        print(f"peak memory: each command {MEMORY_RUNS} times more, sampled", flush=True)
        for _ in range(MEMORY_RUNS):
            for name in CLI:
                for fmt in FORMATS:
                    db = fresh_db(work, f"mem-{name}-{fmt}")
                    r = run_cli(name, files[(args.events, fmt)], db, sample_memory=True)
                    db.unlink(missing_ok=True)
                    raw[f"{name}/{fmt}"].append({**r, "memory_run": True})
                    print(f"  {name:<10} {fmt:<8} {r['peak_mem_mb']:.0f} MB peak", flush=True)
        timed = {k: [r for r in v if not r.get("memory_run")] for k, v in raw.items()}
        results = {k: summarise(timed[k]) for k in raw}
        for key, runs in raw.items():
            sampled = [r["peak_mem_mb"] for r in runs if r.get("memory_run")]
            if sampled:
                results[key]["peak_mem_mb_median"] = _median(sampled)
                results[key]["memory_runs"] = sampled
        paired = paired_ratios(timed, args.runs)

        print(f"start-up: each command on {STARTUP_EVENTS:,} events, {args.runs} runs", flush=True)
        starts: dict[str, list[float]] = collections.defaultdict(list)
        for _ in range(args.runs):
            for name in CLI:
                for fmt in FORMATS:
                    r = startup(name, files[(STARTUP_EVENTS, fmt)], fresh_db(work, f"startup-{name}-{fmt}"))
                    starts[f"{name}/{fmt}"].append(r["wall_s"])
        startups = {k: {"median_s": _median(v), "runs": v} for k, v in starts.items()}
        for key, r in results.items():
            if key in startups:
                r["startup_s_median"] = startups[key]["median_s"]

        memory = []
        if memory_sizes:
            print("peak memory runs:", flush=True)
        for n in memory_sizes:
            db = fresh_db(work, f"memory-{n}")
            r = spawn("drainpipe-memory", files[(n, "parquet")], db, "--expected", str(n))
            db.unlink(missing_ok=True)
            r["events"] = n
            memory.append(r)
            print(
                f"  {n:>12,} events: peak memory {r['peak_mem_mb']:.0f} MB (main process peak RSS "
                f"{r['maxrss_mb']:.0f} MB, at most {r['workers']} child processes)",
                flush=True,
            )

        profile = None
        if not args.no_profile:
            print("profiling the local engine (Parquet):", flush=True)
            path = files[(args.events, "parquet")]
            sequential = spawn(
                "profile-sequential",
                path,
                fresh_db(work, "profile-sequential"),
                "--jsonl",
                str(files[(args.loop_events, "jsonl")]),
            )
            stages = spawn("profile-stages", path, fresh_db(work, "profile-stages"))
            prof = spawn("profile-cprofile", path, fresh_db(work, "profile-cprofile"))
            profile = {"sequential": sequential, "stages": stages, "cprofile": prof}

    summary = print_table(results, paired, args)
    memory_summary = print_memory(memory) if memory else None
    if profile:
        print_profile(profile["sequential"], profile["stages"], profile["cprofile"])
    load1 = os.getloadavg()
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    doc = {
        "benchmark": "pipeline",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "duckdb": duckdb.__version__,
            "pyarrow": pyarrow.__version__,
            "platform": platform.platform(),
            "load_average_start": load0,
            "load_average_end": load1,
        },
        "commit": commit,
        "config": {
            "formats": list(FORMATS),
            "events": args.events,
            "runs": args.runs,
            "loop_events": args.loop_events,
            "verify_events": args.verify_events,
            "memory_events": memory_sizes,
            "quick": args.quick,
            "workload": "drainpipe.pipeline.generator.generate_events defaults (20 services x 10 endpoints "
            "x 3 instances, Zipf skew 1.1, seed 42, 1 hour)",
            "metrics": "default set: 16 metrics (minute/hour/day) + top_slow_statements",
        },
        "verification": verification,
        "results": {k: v for k, v in results.items()},
        **summary,
        "memory": memory_summary,
        "profile": profile,
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"\nwrote {json_path}")


if __name__ == "__main__":
    main()
