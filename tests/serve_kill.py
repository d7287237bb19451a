"""kill -9 of a serving ``drainpipe serve`` under load, and the books to check it by. Shared by the fault tests
(tests/faults/test_serve_kill.py) and ``benchmarks/chaos.py serve``.

Every request carries events of one service name used by no other request (``r<round>-c<client>-<n>``), so the
store says, per request, how many of its events it holds. After the kills and a final graceful stop:

* an acknowledged request (answered 200) must be in the store exactly once: lost if fewer, duplicated if more;
* a request that got no answer (the kill cut it) may be stored or not, but whole and once: its events were in the
  log or not;
* service, instance and endpoint counts agree (the issue's "metrics of one store disagree").
"""

from __future__ import annotations

import http.client
import re
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from drainpipe.pipeline.clock import now_ms
from drainpipe.pipeline.store import open_store

PLACEHOLDER = b"SERVICE-PLACEHOLDER"


def start_serve(store_url: str, wal_dir: str, *extra: str, port: int = 0,
                program: tuple[str, ...] = ("-m", "drainpipe.cli", "serve")) -> tuple[subprocess.Popen[str], str]:  # fmt: skip
    """Start ``drainpipe serve`` (or ``program`` with serve's arguments) and wait for its "listening on" line;
    returns the process (what it prints is collected in ``proc.output``) and its base URL."""
    # every request is a service of its own: a cardinality limit above any load here, or a fast server's thousands
    # of requests a minute fold into __overflow__ and the books cannot tell them apart (``extra`` may lower it)
    proc = subprocess.Popen(
        [sys.executable, *program, "--store", store_url, "--port", str(port), "--wal", wal_dir,
         "--shutdown-grace-s", "10", "--max-entities", "10000000", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"listening on (http://\S+)", line)
    if not m:
        proc.kill()
        raise AssertionError(f"serve did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    # keep the pipes from filling up; what the server says is kept in proc.output (whole once proc.readers joined)
    proc.output = [line]  # type: ignore[attr-defined]
    proc.readers = [threading.Thread(target=lambda p=pipe: proc.output.extend(p), daemon=True)  # type: ignore[attr-defined]
                    for pipe in (proc.stdout, proc.stderr)]  # fmt: skip
    for reader in proc.readers:  # type: ignore[attr-defined]
        reader.start()
    return proc, m.group(1)


def all_output(proc: subprocess.Popen[str], timeout: float = 30) -> str:
    """Everything a server started by :func:`start_serve` printed, once it has exited (its pipes read to the end)."""
    proc.wait(timeout)
    for reader in proc.readers:  # type: ignore[attr-defined]
        reader.join(timeout)
    return "".join(proc.output)  # type: ignore[attr-defined]


def grpc_address(proc: subprocess.Popen[str]) -> str:
    """The OTLP/gRPC address a server started with ``--grpc-port`` announced."""
    m = re.search(r"OTLP/gRPC on (\S+);", proc.output[0])  # type: ignore[attr-defined]
    assert m, proc.output[0]  # type: ignore[attr-defined]
    return m.group(1)


def body_template(events: int) -> bytes:
    """NDJSON of ``events`` events of service PLACEHOLDER, timestamps in the last minute (by drainpipe's clock, which
    the servers' purges read)."""
    now = now_ms()
    lines = [
        b'{"ts": %d, "service": "%s", "instance": "%s-i%d", "endpoint": "/e%d", "latency_ms": %d, "status": %s}'
        % (now - (i * 37) % 60_000, PLACEHOLDER, PLACEHOLDER, i % 3, i % 4, 1 + i % 300,
           b"false" if i % 17 == 0 else b"true")
        for i in range(events)
    ]  # fmt: skip
    return b"\n".join(lines) + b"\n"


@dataclass
class Books:
    """What the clients sent and what was acknowledged, per request name."""

    size: int
    attempted: set[str] = field(default_factory=set)
    acked: set[str] = field(default_factory=set)
    refused: int = 0
    cut: int = 0  # no answer (connection reset by the kill)
    in_flight: int = 0  # requests begun (attempted) and not yet settled
    lock: threading.Lock = field(default_factory=threading.Lock)

    def attempt(self, tag: str, client: int, n: int) -> str:
        """A client's ``n``-th request begins: its name (its service), recorded as attempted and in flight."""
        name = f"{tag}-c{client}-{n}"
        with self.lock:
            self.attempted.add(name)
            self.in_flight += 1
        return name

    def settle(self, name: str, outcome: str) -> None:
        """The request ``name`` ended: ``acked`` (answered 200), ``refused`` (any other answer) or ``cut`` (none)."""
        with self.lock:
            self.in_flight -= 1
            if outcome == "acked":
                self.acked.add(name)
            elif outcome == "refused":
                self.refused += 1
            else:
                self.cut += 1


def _start_clients(client: Callable[[int], None], clients: int) -> list[threading.Thread]:
    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    return threads


def otlp_export(name: str, spans: int) -> bytes:
    """An OTLP export of ``spans`` SERVER spans of service ``name`` (instance ``<name>-i0``), ending in the last
    minute: the gRPC clients' request, as :func:`body_template` is the HTTP clients'."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    now = now_ms() * 1_000_000
    export = ExportTraceServiceRequest()
    rs = export.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = name
    rs.resource.attributes.add(key="service.instance.id").value.string_value = f"{name}-i0"
    scope = rs.scope_spans.add()
    for i in range(spans):
        end = now - (i * 37) % 60_000 * 1_000_000
        span = scope.spans.add(trace_id=(i + 1).to_bytes(16, "big"), span_id=(i + 1).to_bytes(8, "big"),
                               name=f"/e{i % 4}", kind=2, start_time_unix_nano=end - (1 + i % 300) * 1_000_000,
                               end_time_unix_nano=end)  # fmt: skip
        if i % 17 == 0:
            span.status.code = 2
    return export.SerializeToString()


def export_until(address: str, books: Books, tag: str, clients: int, stop: threading.Event) -> list[threading.Thread]:
    """As :func:`post_until`, over OTLP/gRPC: each call exports ``books.size`` spans of a service of its own. A
    call refused with RetryInfo (throttled) counts as refused; any other failure as cut (the kill)."""
    import grpc
    from grpc_status import rpc_status

    from drainpipe.server.otlp_answers import GRPC_EXPORT_PATH

    def client(c: int) -> None:
        with grpc.insecure_channel(address) as channel:
            export = channel.unary_unary(GRPC_EXPORT_PATH)
            n = 0
            while not stop.is_set():
                name = books.attempt(tag, c, n)
                n += 1
                try:
                    export(otlp_export(name, books.size), timeout=60)
                except grpc.RpcError as err:
                    status = rpc_status.from_call(err)  # type: ignore[arg-type]
                    books.settle(name, "refused" if status is not None and status.details else "cut")
                    stop.wait(0.05)
                    continue
                books.settle(name, "acked")

    return _start_clients(client, clients)


def post_until(
    url: str, books: Books, template: bytes, tag: str, clients: int, stop: threading.Event, pause_s: float = 0.0
) -> list[threading.Thread]:
    """Start ``clients`` threads posting (one keep-alive connection each) until ``stop`` or the server dies; each
    waits ``pause_s`` after an answer (a lighter load: fewer requests for a test's stores to hold)."""
    host, port = url.removeprefix("http://").split(":")

    def client(c: int) -> None:
        conn: http.client.HTTPConnection | None = None
        n = 0
        while not stop.is_set():
            name = books.attempt(tag, c, n)
            n += 1
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(host, int(port), timeout=60)
                conn.request("POST", "/v1/events", template.replace(PLACEHOLDER, name.encode()),
                             {"Content-Type": "application/x-ndjson"})  # fmt: skip
                r = conn.getresponse()
                r.read()
            except (OSError, http.client.HTTPException):  # HTTPException: an answer cut mid-body by the kill
                books.settle(name, "cut")
                if conn is not None:
                    conn.close()
                conn = None
                if stop.wait(0.05):
                    return
                continue
            books.settle(name, "acked" if r.status == 200 else "refused")
            if r.status != 200:
                stop.wait(0.05)
            elif pause_s and stop.wait(pause_s):
                return

    return _start_clients(client, clients)


def check(store_url: str, books: Books) -> dict[str, Any]:
    """Compare the store with the books: counts of acknowledged, stored, lost, duplicated events."""
    store = open_store(store_url)
    try:
        per_service: dict[str, float] = defaultdict(float)
        for _m, entity, _g, _b, _l, value in store.query(metric="service_cpm", granularity="minute"):
            per_service[entity] += value
        totals = {
            m: sum(r[5] for r in store.query(metric=m, granularity="minute"))
            for m in ("service_cpm", "instance_cpm", "endpoint_cpm")
        }
        hours = 60 * sum(r[5] for r in store.query(metric="service_cpm", granularity="hour"))  # cpm of an hour
    finally:
        store.close()
    size = books.size
    lost = duplicated = partial = unacked_stored = 0
    for name in books.attempted:
        got = int(round(per_service.get(name, 0)))
        if name in books.acked:
            lost += max(0, size - got)
            duplicated += max(0, got - size)
        elif got:
            unacked_stored += 1
            if got != size:
                partial += 1
                duplicated += max(0, got - size)
    unknown = [s for s in per_service if s not in books.attempted]
    stored = int(round(sum(per_service.values())))
    return {
        "acknowledged": len(books.acked) * size,
        "stored": stored,
        "lost": lost,
        "duplicated": duplicated,
        "partial_requests": partial,
        "unacknowledged_but_stored_requests": unacked_stored,  # the kill came between fsync and the answer
        "unknown_services": len(unknown),
        "metrics_agree": len({round(v) for v in totals.values()} | {round(hours)}) == 1,
        "totals": {**{k: round(v, 3) for k, v in totals.items()}, "service_cpm_hours": round(hours, 3)},
        "refused": books.refused,
        "cut": books.cut,
    }
