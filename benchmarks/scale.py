"""Scaling out on one PostgreSQL store, as machines would see it: N ``drainpipe consume`` members of one group, each
in a cgroup of its own capped at a share of a core, so that N members have N times the CPU, as N machines would.

    scripts/postgres.sh start && scripts/kafka.sh start        # (root: the cgroups are made under /sys/fs/cgroup)
    .venv/bin/python benchmarks/scale.py                        # N = 1, 2, 4 on 12 partitions; 8 on 24
    .venv/bin/python benchmarks/scale.py --members 1,2,4 --rounds 2 --share 0.15 --events 3600000
    .venv/bin/python benchmarks/scale.py --src /tmp/base/src --src src      # two checkouts side by side
    .venv/bin/python benchmarks/scale.py --serve 1,2,4                     # serve processes instead of members

The topic (``--events`` of the skewed workload of ``benchmarks/pipeline.py``, NDJSON messages of 100 events, round
robin over the partitions; with ``--keyed``, each message of one service, on its service's partition, as a producer
that keys by service writes) is produced once per partition count. Each run: a fresh PostgreSQL schema, a fresh group,
N members started together with ``--exit-at-end``, each in its own cgroup v1 ``cpu`` group (``cpu.cfs_quota_us`` =
share x ``cpu.cfs_period_us``) and ``cpuacct`` group. The broker's and PostgreSQL's processes are moved into
``cpuacct`` groups of their own (not capped: they get the rest of the machine), so that the CPU each party used is
read from the kernel, exited PostgreSQL backends included.

The rate is read in the steady part of the run, from the events merged into the stored states (what a query sees:
the count of the day states of ``service_cpm``, one cheap query twice a second; not the offsets the books hold, which
also count states a writer queued and no fold has merged yet): between the last merge that left at most 20% of the
events stored and the first that brought 80% or more, both merge instants, so that the members' start-up
(Python's at the cap: the first commit comes tens of seconds in) and the tail stay out, and no commit is counted in
part. A busy store gets few, large commits, so the run must be long enough for many: the default is 12M events,
at 1,000 a second of event time as in the first measurement's 3.6M over an hour (a denser input would make fewer
state rows per event and flatter the store). The whole run's rate is reported beside it. The CPU of each party is
over the same window. Every run is checked exact: the events the store counts (the day states of ``service_cpm``)
equal the events produced. The curve (events/s, x one member, target 0.8 N) and the CPU of members, broker and
PostgreSQL are printed and written to ``benchmarks/results/scale.json``. With ``--src`` given more than once (a
checkout's ``src``, e.g. a baseline commit's worktree with its extensions built), the members run each checkout's
code in turn (``PYTHONPATH``), configuration by configuration, and each gets its own curve: the baseline runs side
by side in the same run.

``--serve`` measures ``drainpipe serve`` processes the same way (:func:`serve_run`): each capped as a member is,
behind one PostgreSQL store, with HTTP clients (this process, outside the caps, its CPU reported) posting NDJSON
bodies of 1,000 events over keep-alive connections split evenly over the servers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from ingest_load import drop_pg_schema, fresh_pg_schema
from kafka import DRAINPIPE, fill_topic, write_inputs

RESULTS = Path(__file__).parent / "results"
PER_MESSAGE = 100
EVENT_RATE = 1000  # events per second of event time: 3.6M over an hour, as the first measurement
CPU_ROOT = Path("/sys/fs/cgroup/cpu")
ACCT_ROOT = Path("/sys/fs/cgroup/cpuacct")
PERIOD_US = 100_000


class Cgroup:
    """A cgroup v1 pair (``cpu`` for the cap, ``cpuacct`` for the CPU used) named ``drainpipe-scale/<name>``."""

    def __init__(self, name: str, share: float | None) -> None:
        self.name = name
        self.dirs = [root / "drainpipe-scale" / name for root in (CPU_ROOT, ACCT_ROOT)]
        for d in self.dirs:
            d.mkdir(parents=True, exist_ok=True)
        cpu = self.dirs[0]
        (cpu / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (cpu / "cpu.cfs_quota_us").write_text(str(int(share * PERIOD_US)) if share else "-1")

    def enter(self, pid: int | None = None) -> None:
        """Move ``pid`` (default: the calling process, as a ``preexec_fn``) and its threads into both groups."""
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(pid or os.getpid()))

    def adopt(self, pids: list[int]) -> None:
        """Move each of ``pids`` into both groups (one that exited meanwhile, a PostgreSQL backend say, is skipped)."""
        for pid in pids:
            try:
                self.enter(pid)
            except ProcessLookupError:
                pass

    def cpu_s(self) -> float:
        return int((self.dirs[1] / "cpuacct.usage").read_text()) / 1e9

    def throttled_s(self) -> float:
        stat = dict(line.split() for line in (self.dirs[0] / "cpu.stat").read_text().splitlines())
        return int(stat.get("throttled_time", 0)) / 1e9

    def remove(self) -> None:
        for d, root in zip(self.dirs, (CPU_ROOT, ACCT_ROOT)):
            for pid in (d / "cgroup.procs").read_text().split():
                try:
                    (root / "cgroup.procs").write_text(pid)
                except OSError:
                    pass  # (it exited meanwhile)
            d.rmdir()
            try:
                d.parent.rmdir()  # drainpipe-scale itself, once its last group is gone
            except OSError:
                pass  # (other groups of the run are still in it)


def release(procs: list[Any], logs: list[Any], groups: list[Cgroup]) -> None:
    """The end of a run, however it ended: processes still running killed, logs closed, cgroups removed."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    for log in logs:
        log.close()
    for cg in groups:
        cg.remove()


def change_points(samples: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The samples (t, stored, ...) where the stored count changed (the first included): the store's commits."""
    return [s for i, s in enumerate(samples) if i == 0 or s[1] != samples[i - 1][1]]


def pids_of(match: str, comm: str) -> list[int]:
    """The processes named ``comm`` whose command line holds ``match``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != comm:
                continue
            if match in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                out.append(int(entry.name))
        except OSError:
            continue
    return out


def stored_events(con: Any) -> int:
    """The events merged into the stored states (the day states of ``service_cpm`` count every event once)."""
    row = con.execute(
        "SELECT coalesce(sum(n), 0) FROM metric_state WHERE metric = 'service_cpm' AND granularity = 'day'"
    ).fetchone()
    return int(row[0])


def fill_keyed_topic(servers: str, topic: str, path: Path, per_message: int, partitions: int) -> int:
    """As :func:`kafka.fill_topic`, but keyed by service, as a producer that keys its messages would: a message holds
    ``per_message`` events of one service, on the partition of the service's hash (every service on one partition,
    in the file's order); the messages produced."""
    import zlib

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": servers})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(60)
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 20, "batch.size": 1 << 20,
                         "queue.buffering.max.messages": 1_000_000, "compression.type": "lz4"})  # fmt: skip
    pending: dict[bytes, list[bytes]] = {}
    messages = 0

    def send(service: bytes, lines: list[bytes]) -> None:
        nonlocal messages
        while True:
            try:
                producer.produce(topic, b"\n".join(lines), key=service, partition=zlib.crc32(service) % partitions)
                break
            except BufferError:
                producer.poll(0.1)
        messages += 1

    with open(path, "rb") as f:
        for line in f:
            service = json.loads(line)["service"].encode()
            lines = pending.setdefault(service, [])
            lines.append(line.rstrip(b"\n"))
            if len(lines) == per_message:
                send(service, lines)
                pending[service] = []
    for service, lines in pending.items():
        if lines:
            send(service, lines)
    producer.flush(300)
    return messages


def member_run(
    args: argparse.Namespace, src: Path, members: int, topic: str, messages: int, work: Path
) -> dict[str, Any]:
    """One run of ``members`` members (the code of ``src``) over ``topic``; the rate in the steady window and the
    CPU of each party."""
    import psycopg

    url, schema = fresh_pg_schema(args.pg)
    group = f"scale-{uuid.uuid4().hex[:10]}"
    caps = [Cgroup(f"m{i}", args.share) for i in range(members)]
    parties = {"broker": Cgroup("broker", None), "postgres": Cgroup("postgres", None)}
    parties["broker"].adopt(pids_of("kafka.Kafka", "java"))
    parties["postgres"].adopt(pids_of("", "postgres"))
    logs = [open(work / f"member-{src.parent.name}-{members}-{i}.log", "w") for i in range(members)]
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [DRAINPIPE, "consume", "--bootstrap-servers", args.servers, "--topic", topic, "--group", group,
           "--store", url, "--exit-at-end", "--checkpoint-s", str(args.checkpoint_s)]  # fmt: skip
    samples: list[tuple[float, int, float, float, float]] = []  # (t, merged messages, CPU: members, broker, pg)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with psycopg.connect(url, autocommit=True) as con:
            xacts0 = transactions(con)
            t0 = time.perf_counter()
            procs = [
                subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=cg.enter, env=env, cwd=work)
                for cg, log in zip(caps, logs)
            ]
            while True:
                done = all(p.poll() is not None for p in procs)
                try:
                    merged = stored_events(con) // PER_MESSAGE
                except psycopg.errors.UndefinedTable:
                    merged = 0  # (the first member has not made the tables yet)
                samples.append((time.perf_counter() - t0, merged, sum(c.cpu_s() for c in caps),
                                parties["broker"].cpu_s(), parties["postgres"].cpu_s()))  # fmt: skip
                if done:
                    break
                if samples[-1][0] > args.timeout_s:
                    raise SystemExit(f"{members} member(s): not done after {args.timeout_s} s")
                time.sleep(0.5)
            wall = time.perf_counter() - t0
            for p in procs:
                if p.returncode:
                    raise SystemExit(f"a member failed ({p.returncode}): see {work}")
            stored = stored_events(con)
            throttled = sum(c.throttled_s() for c in caps)
            # (less the poller's own transactions: a count per sample, and the reads of the counter)
            store = store_work(con, schema, transactions(con) - xacts0 - len(samples) - 4,
                               samples[-1][4] - samples[0][4])  # fmt: skip
    finally:
        release(procs, logs, [*caps, *parties.values()])
    drop_pg_schema(args.pg, schema)
    # The rate in the steady part: between two commits, the last one that left at most 20% stored and the first
    # that brought 80% or more (commit instants both, so no commit is counted in part); the members' start (the
    # first commit comes after the Python start-up at the cap) and the tail stay out. The CPU of each party over
    # the same commits. The whole run's rate (start until all stored) is reported beside it.
    commits = change_points(samples)
    done = next(s for s in commits if s[1] >= messages)
    lo = [s for s in commits if s[1] <= 0.2 * messages][-1]
    hi = next(s for s in commits if s[1] >= 0.8 * messages)
    window = hi[0] - lo[0]
    return {
        "members": members, "eps": (hi[1] - lo[1]) * PER_MESSAGE / window, "window_s": [round(lo[0], 2), round(hi[0], 2)],
        "eps_whole": args.events / done[0], "seconds": done[0], "wall_s": wall, "stored": stored,
        "exact": stored == args.events, "members_cores": (hi[2] - lo[2]) / window, "throttled_s": throttled,
        "broker_cores": (hi[3] - lo[3]) / window, "postgres_cores": (hi[4] - lo[4]) / window,
        "store": store, "commits": [[round(t, 2), a] for t, a, *_ in commits],
    }  # fmt: skip


def transactions(con: Any) -> int:
    """The transactions the database committed so far (every session's, as PostgreSQL's statistics have them)."""
    con.execute("SELECT pg_stat_clear_snapshot()")
    return int(con.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()[0])


def store_work(con: Any, schema: str, xacts: int, cpu_s: float) -> dict[str, Any]:
    """What the store did over a whole run, from PostgreSQL's statistics of the run's schema: its transactions (the
    members' commits and the folds), the stored states it wrote (rows of ``metric_state`` and ``metric_values``
    inserted or updated: a key merged costs one of each), the rows queued for folds; its CPU per transaction and per
    state written."""
    con.execute("SELECT pg_stat_clear_snapshot()")
    rows = {name: int(ins) + int(upd) for name, ins, upd in con.execute(
        "SELECT relname, n_tup_ins, n_tup_upd FROM pg_stat_user_tables WHERE schemaname = %s", (schema,))}  # fmt: skip
    states = rows.get("metric_state", 0)
    return {
        "postgres_cpu_s": round(cpu_s, 2), "transactions": xacts, "states_written": states,
        "values_written": rows.get("metric_values", 0), "queued_rows": rows.get("merge_queue", 0),
        "ms_per_transaction": round(1e3 * cpu_s / xacts, 3) if xacts > 0 else None,
        "us_per_state": round(1e6 * cpu_s / states, 2) if states else None,
    }  # fmt: skip


def serve_run(args: argparse.Namespace, src: Path, servers: int, bodies: list[bytes], work: Path) -> dict[str, Any]:
    """``servers`` ``drainpipe serve`` processes (the code of ``src``), each capped as a member is, on one fresh
    schema; ``--clients`` keep-alive connections (this process, outside the caps, its CPU reported) split evenly over
    them post NDJSON bodies of 1,000 events for ``--serve-s`` seconds; the store's count polled twice a second. The
    rate: between the store's last commit in the first third of the posting and its last commit before the posting
    ended (the servers' start and the drain after stay out). Then each server is stopped (SIGTERM: it applies what its
    log holds) and the run is checked exact: stored = acknowledged."""
    import psycopg

    from ingest_load import drive

    url, schema = fresh_pg_schema(args.pg)
    caps = [Cgroup(f"s{i}", args.share) for i in range(servers)]
    postgres = Cgroup("postgres", None)
    postgres.adopt(pids_of("", "postgres"))
    env = {**os.environ, "PYTHONPATH": str(src)}
    logs = [open(work / f"serve-{src.parent.name}-{servers}-{i}.log", "w") for i in range(servers)]
    procs: list[subprocess.Popen[str]] = []
    samples: list[tuple[float, int, float, float, float]] = []  # (t, stored, servers' CPU, postgres', clients')
    try:
        for i, (cg, log) in enumerate(zip(caps, logs)):
            cmd = [sys.executable, "-m", "drainpipe.cli", "serve", "--store", url, "--port", "0",
                   "--wal", str(work / f"wal-{src.parent.name}-{servers}-{i}-{time.time_ns()}")]  # fmt: skip
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=cg.enter,
                                          env=env, cwd=work))  # fmt: skip
        ports = []
        for p in procs:
            line = p.stdout.readline() if p.stdout else ""
            found = re.search(r"listening on http://([\d.]+):(\d+)", line)
            if not found:
                raise SystemExit(f"serve did not start: {line!r} (see {work})")
            ports.append(int(found.group(2)))
        share = max(1, args.clients // servers)
        loads: list[Any] = [None] * servers
        t0 = time.perf_counter()
        clients_cpu = time.process_time()

        def post(i: int) -> None:
            loads[i] = drive("127.0.0.1", ports[i], bodies, False, share, t0, args.serve_s)

        posting = [threading.Thread(target=post, args=(i,)) for i in range(servers)]
        for t in posting:
            t.start()
        with psycopg.connect(url, autocommit=True) as con:
            while any(t.is_alive() for t in posting):
                try:
                    stored = stored_events(con)
                except psycopg.errors.UndefinedTable:
                    stored = 0
                samples.append((time.perf_counter() - t0, stored, sum(c.cpu_s() for c in caps), postgres.cpu_s(),
                                time.process_time() - clients_cpu))  # fmt: skip
                time.sleep(0.5)
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                if p.wait(timeout=args.timeout_s):
                    raise SystemExit(f"a server failed ({p.returncode}): see {work}")
            stored = stored_events(con)
    finally:
        release(procs, logs, [*caps, postgres])
    drop_pg_schema(args.pg, schema)
    accepted = sum(load.accepted for load in loads if load is not None)
    commits = change_points(samples)
    lo = [s for s in commits if s[0] <= args.serve_s / 3][-1]
    hi = commits[-1]
    window = hi[0] - lo[0]
    return {
        "servers": servers, "eps": (hi[1] - lo[1]) / window if window > 0 else 0.0,
        "window_s": [round(lo[0], 2), round(hi[0], 2)], "accepted": accepted, "stored": stored,
        "exact": stored == accepted, "accepted_eps": accepted / args.serve_s,
        "servers_cores": (hi[2] - lo[2]) / window if window > 0 else 0.0,
        "postgres_cores": (hi[3] - lo[3]) / window if window > 0 else 0.0,
        "clients_cores": (hi[4] - lo[4]) / window if window > 0 else 0.0,
        "retries": {k: sum(load.retries[k] for load in loads) for k in ("429", "503")},
        "commits": [[round(t, 2), n] for t, n, *_ in commits],
    }  # fmt: skip


def serve_main(args: argparse.Namespace, sources: list[Path]) -> list[dict[str, Any]]:
    """The ``serve`` curve: ``--serve`` server counts, each checkout in turn, ``--rounds`` rounds."""
    from ingest_load import build_bodies

    counts = [int(n) for n in args.serve.split(",") if n]
    bodies = build_bodies(args.bodies, 1000, False, seed=7, ahead_s=args.serve_s)
    runs: dict[tuple[Path, int], list[dict[str, Any]]] = {(s, n): [] for s in sources for n in counts}
    with tempfile.TemporaryDirectory(prefix="drainpipe-scale-serve-") as tmp:
        work = Path(args.logs or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for r in range(args.rounds):
            for n in counts if r % 2 == 0 else counts[::-1]:
                for src in sources if r % 2 == 0 else sources[::-1]:
                    run = serve_run(args, src, n, bodies, work)
                    runs[(src, n)].append(run)
                    print(f"round {r + 1}: {src}: {n} server(s): {run['eps']:,.0f} events/s stored (accepted "
                          f"{run['accepted_eps']:,.0f}/s; window {run['window_s']}; servers {run['servers_cores']:.2f} "
                          f"cores, postgres {run['postgres_cores']:.2f}, clients {run['clients_cores']:.2f}; exact "
                          f"{run['exact']})", flush=True)  # fmt: skip
    table = []
    print(f"\nserve processes capped at {args.share} core each, {args.clients} connections, medians of "
          f"{args.rounds} round(s)\n")  # fmt: skip
    print("| code | servers | events/s stored | x one server | target | servers' cores | postgres | clients | exact |")
    print("|---|---|---|---|---|---|---|---|---|")
    for src in sources:
        ones = runs.get((src, 1))
        one = statistics.median(r["eps"] for r in ones) if ones else None
        for n in counts:
            rows = runs[(src, n)]
            med = {k: statistics.median(r[k] for r in rows) for k in
                   ("eps", "servers_cores", "postgres_cores", "clients_cores")}  # fmt: skip
            scale = med["eps"] / one if one else float("nan")
            target = 0.8 * n if n > 1 else None
            exact = all(r["exact"] for r in rows)
            table.append({"src": str(src), "servers": n, **med, "x_one": scale, "target": target, "exact": exact,
                          "runs": rows})  # fmt: skip
            print(f"| {src.parent.name} | {n} | {med['eps']:,.0f} | {scale:.2f} | "
                  f"{f'>= {target:.1f}' if target else '-'} | {med['servers_cores']:.2f} | "
                  f"{med['postgres_cores']:.2f} | {med['clients_cores']:.2f} | {'yes' if exact else 'NO'} |")  # fmt: skip
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", default=os.environ.get("DRAINPIPE_TEST_KAFKA", "kafka://127.0.0.1:9092"))
    ap.add_argument(
        "--pg", default=os.environ.get("DRAINPIPE_TEST_PG"), required=not os.environ.get("DRAINPIPE_TEST_PG")
    )
    ap.add_argument("--events", type=int, default=12_000_000)
    ap.add_argument("--members", default="1,2,4", help="member counts on --partitions partitions")
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--wide", default="8:24", help="MEMBERS:PARTITIONS reported without a target ('' for none)")
    ap.add_argument("--keyed", action="store_true", help="messages keyed by service (default: round robin)")
    ap.add_argument("--share", type=float, default=0.15, help="each member's cap, in cores")
    ap.add_argument("--checkpoint-s", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout-s", type=float, default=900)
    ap.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "drainpipe-bench" / "kafka")
    ap.add_argument("--src", type=Path, action="append", help="a checkout's src for the members (repeatable; default: "
                    "this checkout's)")  # fmt: skip
    ap.add_argument("--logs", type=Path, help="keep the members' output here (default: a temporary directory)")
    ap.add_argument("--json", type=Path, default=RESULTS / "scale.json")
    ap.add_argument("--serve", help="serve process counts (e.g. 1,2,4): the serve curve instead of the members'")
    ap.add_argument("--serve-s", type=float, default=90.0, help="how long the clients post, per serve run")
    ap.add_argument("--clients", type=int, default=16, help="client connections, split over the servers")
    ap.add_argument("--bodies", type=int, default=400, help="distinct bodies of 1,000 events (cycled)")
    args = ap.parse_args()
    args.servers = args.servers.removeprefix("kafka://")
    if os.geteuid() != 0 or not CPU_ROOT.is_dir():
        raise SystemExit("scale.py caps members with cgroup v1 (/sys/fs/cgroup/cpu): run it as root")
    if args.serve:
        sources = [p.resolve() for p in (args.src or [ROOT / "src"])]
        table = serve_main(args, sources)
        report = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "serve": True,
                  "share": args.share, "clients": args.clients, "serve_s": args.serve_s, "rounds": args.rounds,
                  "table": table}  # fmt: skip
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        print(f"\nwrote {args.json}")
        return
    path = write_inputs(args.data_dir, args.events, duration_s=args.events // EVENT_RATE)
    plan = [(int(n), args.partitions) for n in args.members.split(",") if n]
    if args.wide:
        n, p = args.wide.split(":")
        plan.append((int(n), int(p)))
    topics: dict[int, tuple[str, int]] = {}
    for partitions in sorted({p for _, p in plan}):
        topic = f"scale-{partitions}-{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        fill = fill_keyed_topic if args.keyed else fill_topic
        messages = fill(args.servers, topic, path, PER_MESSAGE, partitions)
        print(f"topic {topic}: {messages:,} messages, {partitions} partitions ({time.perf_counter() - t0:.1f} s)",
              flush=True)  # fmt: skip
        topics[partitions] = (topic, messages)
    sources = [p.resolve() for p in (args.src or [ROOT / "src"])]
    runs: dict[tuple[Path, int, int], list[dict[str, Any]]] = {(s, n, p): [] for s in sources for n, p in plan}
    with tempfile.TemporaryDirectory(prefix="drainpipe-scale-") as tmp:
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            tmp = str(args.logs)
        for r in range(args.rounds):
            for n, p in plan if r % 2 == 0 else plan[::-1]:
                for src in sources if r % 2 == 0 else sources[::-1]:
                    topic, messages = topics[p]
                    run = member_run(args, src, n, topic, messages, Path(tmp))
                    runs[(src, n, p)].append(run)
                    print(f"round {r + 1}: {src}: {n} member(s), {p} partitions: {run['eps']:,.0f} events/s "
                          f"(whole run {run['eps_whole']:,.0f} in {run['seconds']:.1f} s; window {run['window_s']}; members {run['members_cores']:.2f} cores, broker "
                          f"{run['broker_cores']:.2f}, postgres {run['postgres_cores']:.2f}; exact {run['exact']})",
                          flush=True)  # fmt: skip
    table = []
    print(f"\n{args.events:,} events, members capped at {args.share} core each, medians of {args.rounds} round(s)\n")
    print("| code | members | partitions | events/s | x one member | target | members' cores | broker | postgres "
          "| exact |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for src in sources:
        ones = runs.get((src, 1, args.partitions))
        one = statistics.median(r["eps"] for r in ones) if ones else None
        for n, p in plan:
            rows = runs[(src, n, p)]
            med = {k: statistics.median(r[k] for r in rows) for k in
                   ("eps", "members_cores", "broker_cores", "postgres_cores")}  # fmt: skip
            scale = med["eps"] / one if one else float("nan")
            target = 0.8 * n if p == args.partitions and n > 1 else None
            exact = all(r["exact"] for r in rows)
            table.append({"src": str(src), "members": n, "partitions": p, **med, "x_one": scale, "target": target,
                          "exact": exact, "runs": rows})  # fmt: skip
            print(f"| {src.parent.name} | {n} | {p} | {med['eps']:,.0f} | {scale:.2f} | "
                  f"{f'>= {target:.1f}' if target else '-'} | {med['members_cores']:.2f} | {med['broker_cores']:.2f} | "
                  f"{med['postgres_cores']:.2f} | {'yes' if exact else 'NO'} |")  # fmt: skip
    print(
        "\nThe store's work over whole runs (medians): its transactions (commits and folds), the states it wrote "
        "and its CPU per each\n"
    )
    print("| code | members | transactions | states written | PostgreSQL CPU s | ms per transaction | us per state |")
    print("|---|---|---|---|---|---|---|")
    for row in table:
        works = [r["store"] for r in row["runs"]]
        med = {k: statistics.median(w[k] or 0 for w in works) for k in works[0]}
        row["store"] = med
        print(f"| {Path(row['src']).parent.name} | {row['members']} | {med['transactions']:,.0f} | "
              f"{med['states_written']:,.0f} | {med['postgres_cpu_s']:.1f} | {med['ms_per_transaction']:.2f} | "
              f"{med['us_per_state']:.1f} |")  # fmt: skip
    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "keyed": args.keyed,
        "events": args.events, "share": args.share, "checkpoint_s": args.checkpoint_s, "rounds": args.rounds,
        "table": table,
    }  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
