"""How many drainpipe modules one event runs code in on its way to the store, per source, at one commit or two.

Each source runs twice as a user runs it, in its own processes (helpers included), under a profiler that records
every drainpipe function called (module-level code, that is imports, is not counted):

* once idle: the same start, wait and stop with no event (``run`` on an empty file, ``serve`` with no request,
  ``consume`` of an empty topic);
* once with one event: a one-event JSON Lines file; one OTLP/HTTP protobuf export of one SERVER span posted to
  ``serve``; one NDJSON message to ``consume``.

A module counts for the event when the event run called a function of it that the idle runs (two, unioned, so a
timer that fired in one is not counted as the event's) never called: the modules that run code *for the event*,
from its arrival to its commit. The queue core's control plane (:data:`CONTROL_PLANE`: rebalancing, liveness,
resizing, run by timers on the control thread) is left out: it runs because time passes, and an event run lasts
longer than an idle one. Every run checks the store holds the event (or nothing, idle).

    .venv/bin/python benchmarks/event_path.py                    # this checkout
    .venv/bin/python benchmarks/event_path.py --base afea8e4     # and another commit, side by side
    .venv/bin/python benchmarks/event_path.py --sources file,otlp-http --list

``kafka`` needs the broker of ``scripts/kafka.sh`` (``$DRAINPIPE_TEST_KAFKA``, default 127.0.0.1:9092). Prints a
table and writes ``benchmarks/results/event-path.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
RESULTS = Path(__file__).parent / "results"
SOURCES = ("file", "otlp-http", "kafka")
#: the queue core's timer-driven modules (see the module docstring)
CONTROL_PLANE = frozenset(f"drainpipe.{m}" for m in ("_balancer", "_control", "_control_loop", "_control_state",
                                                      "_handoff", "_liveness", "_load", "_requests", "_resize",
                                                      "_stats"))  # fmt: skip
SERVE_WAIT_S = 3.0  # serve: how long after the request (or after ready, idle) before SIGTERM

# The profiler, loaded by every Python process of a run through sitecustomize (PYTHONPATH). It keeps the code objects
# of every 'call' and writes the drainpipe ones at exit: atexit in a process started as a program, multiprocessing's
# finalizers and a writer thread in a forked helper (which may be killed at the end: its last ~0.1 s can be missed).
TRACER = r"""
import atexit, os, sys, threading
_out = os.environ.get("DP_EVENT_PATH_OUT")
if _out:
    _seen = set()
    def _prof(frame, event, arg, _add=_seen.add):
        if event == "call":
            _add(frame.f_code)
    def _dump():
        rows = sorted({f"{c.co_filename}\t{c.co_qualname}" for c in list(_seen)
                       if "/drainpipe/" in c.co_filename and c.co_name != "<module>"})
        tmp = f"{_out}/{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write("\n".join(rows))
        os.replace(tmp, f"{_out}/{os.getpid()}.txt")
    def _writer():
        import time
        while True:
            time.sleep(0.1)
            _dump()
    def _child():
        sys.setprofile(_prof)
        threading.Thread(target=_writer, daemon=True).start()
        import multiprocessing.util
        multiprocessing.util.Finalize(None, _dump, exitpriority=100)
    sys.setprofile(_prof)
    threading.setprofile(_prof)
    atexit.register(_dump)
    os.register_at_fork(after_in_child=_child)
"""


def _module(path: str) -> str:
    """``drainpipe.server.feeder`` from a file path."""
    tail = path.split("/drainpipe/", 1)[1].removesuffix(".py").removesuffix("/__init__")
    return "drainpipe." + tail.replace("/", ".")


def _traced(tree: Path, run: Callable[[dict[str, str], Path], None]) -> set[tuple[str, str]]:
    """(module, function) pairs every process of ``run`` called, run against ``tree``'s sources."""
    with tempfile.TemporaryDirectory(prefix="dp-path-") as tmp:
        site, out, work = Path(tmp, "site"), Path(tmp, "out"), Path(tmp, "work")
        for d in (site, out, work):
            d.mkdir()
        (site / "sitecustomize.py").write_text(TRACER)
        env = {**os.environ, "PYTHONPATH": f"{site}:{tree / 'src'}", "DP_EVENT_PATH_OUT": str(out)}
        run(env, work)
        pairs = set()
        for f in out.glob("*.txt"):
            for line in f.read_text().splitlines():
                path, name = line.split("\t")
                pairs.add((_module(path), name))
        return pairs


def _drainpipe(env: dict[str, str], *args: str, **kw: Any) -> subprocess.Popen:
    cli = "import sys; from drainpipe.cli import main; sys.argv[0] = 'drainpipe'; sys.exit(main())"
    return subprocess.Popen([sys.executable, "-c", cli, *args], env=env, **kw)


def _stored(tree: Path, store: Path) -> int:
    """Requests in the store's per-minute service counts (read without the profiler; -1: no store)."""
    code = (
        'import duckdb,sys; c=duckdb.connect(sys.argv[1], read_only=True); print(c.execute("select '
        "coalesce(sum(n),0) from metric_state where metric='service_cpm' and granularity='minute'\").fetchone()[0])"
    )
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    got = subprocess.run([sys.executable, "-c", code, str(store)], env=env, capture_output=True, text=True)
    return int(float(got.stdout.strip() or 0)) if got.returncode == 0 else -1


def _event() -> str:
    """One event of a minute ago (inside every retention) as a JSON line."""
    ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
    return json.dumps({"ts": ts, "service": "checkout", "instance": "i-1", "endpoint": "/pay", "status": True,
                       "latency_ms": 12.5})  # fmt: skip


def file_run(with_event: bool) -> Callable[[dict[str, str], Path], None]:
    def run(env: dict[str, str], work: Path) -> None:
        path = work / "events.jsonl"
        path.write_text(_event() + "\n" if with_event else "")
        p = _drainpipe(env, "run", "--input", str(path), "--store", f"duckdb:///{work}/s.duckdb", "-q",
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        out = p.communicate()[0]
        if p.returncode:
            raise SystemExit(f"run failed:\n{out[-2000:]}")

    return run


def _otlp_export() -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="checkout")))
    span = rs.scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name, span.kind = os.urandom(16), os.urandom(8), "GET /pay", Span.SPAN_KIND_SERVER
    span.start_time_unix_nano = int(time.time() * 1e9)
    span.end_time_unix_nano = span.start_time_unix_nano + 12_000_000
    span.attributes.append(KeyValue(key="http.route", value=AnyValue(string_value="/pay")))
    span.attributes.append(KeyValue(key="http.response.status_code", value=AnyValue(int_value=200)))
    return req.SerializeToString()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_run(with_event: bool) -> Callable[[dict[str, str], Path], None]:
    def run(env: dict[str, str], work: Path) -> None:
        port = _free_port()
        p = _drainpipe(env, "serve", "--store", f"duckdb:///{work}/s.duckdb", "--port", str(port),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or p.poll() is not None:
                    p.kill()
                    raise SystemExit("serve did not come up") from None
                time.sleep(0.1)
        if with_event:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=_otlp_export(),
                                         headers={"Content-Type": "application/x-protobuf"})  # fmt: skip
            urllib.request.urlopen(req, timeout=30).read()
        time.sleep(SERVE_WAIT_S)
        p.send_signal(signal.SIGTERM)
        if p.wait(timeout=60):
            raise SystemExit(f"serve exited {p.returncode}")

    return run


def kafka_run(with_event: bool) -> Callable[[dict[str, str], Path], None]:
    def run(env: dict[str, str], work: Path) -> None:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        servers = os.environ.get("DRAINPIPE_TEST_KAFKA", "127.0.0.1:9092").removeprefix("kafka://")
        topic = f"event-path-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": servers})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        if with_event:
            producer = Producer({"bootstrap.servers": servers})
            producer.produce(topic, _event().encode(), partition=0)
            producer.flush(30)
        p = _drainpipe(env, "consume", "--bootstrap-servers", servers, "--topic", topic, "--group", topic,
                       "--store", f"duckdb:///{work}/s.duckdb", "--exit-at-end",
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        out = p.communicate(timeout=120)[0]
        admin.delete_topics([topic])
        if p.returncode:
            raise SystemExit(f"consume failed:\n{out[-2000:]}")

    return run


RUNS = {"file": file_run, "otlp-http": serve_run, "kafka": kafka_run}


def measure(tree: Path, source: str) -> dict[str, Any]:
    """The modules (and their new functions) ``source``'s one event ran code in at ``tree``."""
    idle = _traced(tree, RUNS[source](False)) | _traced(tree, RUNS[source](False))
    holder: dict[str, int] = {}

    def run_and_check(env: dict[str, str], work: Path) -> None:
        RUNS[source](True)(env, work)
        holder["stored"] = _stored(tree, work / "s.duckdb")

    event = _traced(tree, run_and_check)
    if holder.get("stored") != 1:
        raise SystemExit(f"{source} at {tree}: the store holds {holder.get('stored')} requests, not 1")
    new = {(m, f) for m, f in event - idle if m not in CONTROL_PLANE}
    modules: dict[str, list[str]] = {}
    for module, fn in sorted(new):
        modules.setdefault(module, []).append(fn)
    return {"modules": len(modules), "functions": len(new), "by_module": modules,
            "modules_in_run": len({m for m, _ in event})}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", help="another commit, measured side by side (a worktree under --work)")
    ap.add_argument("--sources", default=",".join(SOURCES))
    ap.add_argument("--work", default=None, help="where a --base worktree goes (default: a temp dir)")
    ap.add_argument("--list", action="store_true", help="print the modules of each source")
    ap.add_argument("--json", type=Path, default=RESULTS / "event-path.json")
    args = ap.parse_args()
    trees = {"head": ROOT}
    if args.base:
        from compare_commits import worktree

        trees = {"base": worktree(args.base, Path(args.work or tempfile.mkdtemp(prefix="drainpipe-path-"))), **trees}
    commits = {k: subprocess.run(["git", "-C", str(v), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                 text=True).stdout.strip() for k, v in trees.items()}  # fmt: skip
    result: dict[str, Any] = {"trees": {k: str(v) for k, v in trees.items()}, "commits": commits, "sources": {}}
    for source in args.sources.split(","):
        result["sources"][source] = {side: measure(tree, source) for side, tree in trees.items()}
    print(f"{'source':<10} " + " ".join(f"{side + ' modules':>14} {side + ' fns':>9}" for side in trees))
    for source, sides in result["sources"].items():
        print(f"{source:<10} " + " ".join(f"{sides[s]['modules']:>14} {sides[s]['functions']:>9}" for s in trees))
    if args.list:
        for source, sides in result["sources"].items():
            for side, got in sides.items():
                print(f"\n{source} ({side}): {got['modules']} modules")
                for module, fns in got["by_module"].items():
                    print(f"  {module:<44} {len(fns):>3}  {', '.join(fns[:4])}{' ...' if len(fns) > 4 else ''}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
