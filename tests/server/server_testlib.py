"""Helpers for the server tests: an in-process server, HTTP calls with urllib, event payloads."""

from __future__ import annotations

import gzip
import itertools
import json
import random
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from drainpipe.pipeline import clock
from drainpipe.pipeline.definitions import Definitions, default_definitions
from drainpipe.pipeline.store import open_store
from drainpipe.server.bodies import BodyDecoder
from drainpipe.server.http import IngestServer
from drainpipe.server.service import IngestService, ServiceOptions, serve_engine_options
from drainpipe.server.wal import EventLog

_names = itertools.count()


@contextmanager
def running_server(
    store_url: str = "duckdb:///:memory:",
    token: str | None = None,
    options: ServiceOptions | None = None,
    shutdown_grace_s: float = 30.0,
    log: EventLog | None = None,
    decoder: BodyDecoder | None = None,
    definitions: Definitions | None = None,
    clock: Callable[[], int] | None = None,
    grpc_port: int | None = None,
    **engine: Any,
) -> Iterator[IngestServer]:
    """A server on a free loopback port; ``clock`` replaces the store's (epoch ms of "now", for retention and
    alerts)."""
    store = open_store(store_url)
    if clock is not None:
        store.clock = clock  # type: ignore[attr-defined]
    opts = options or ServiceOptions(sample_interval_s=0.25, top_refresh_s=0.5)
    service = IngestService(
        definitions or default_definitions(),
        store,
        log=log,
        store_url=store_url,
        options=opts,
        engine_options=serve_engine_options(**({"rebalance_interval_ms": 200} | engine)),
        name=f"t{next(_names)}",
        decoder=decoder,
    )
    server = IngestServer(service, "127.0.0.1", 0, token, shutdown_grace_s, grpc_port).start()
    try:
        yield server
    finally:
        server.shutdown_all()


def events(n: int, *, services: int = 6, seed: int | None = None, now_ms: int | None = None) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    now_ms = now_ms or clock.now_ms()  # (drainpipe's clock: the one the servers' purges read)
    out = []
    for _ in range(n):
        s = min(services - 1, int(rng.paretovariate(1.2)) - 1)
        e = {
            "ts": now_ms - rng.randint(0, 3000),
            "service": f"svc-{s:02d}",
            "instance": f"svc-{s:02d}-i{rng.randint(0, 2)}",
            "endpoint": f"/api/e{rng.randint(0, 4)}",
            "latency_ms": round(rng.expovariate(1 / 40), 3),
            "status": rng.random() > 0.02,
        }
        if rng.random() < 0.3:
            e["db_statement"] = f"SELECT {rng.randint(0, 3)}"
        out.append(e)
    return out


def ndjson(records: list[Any]) -> bytes:
    return ("\n".join(json.dumps(r) for r in records) + "\n").encode()


def request(
    url: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None, timeout: float = 30
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def post_events(
    base: str, records: list[Any], *, kind: str = "json", gzipped: bool = False, token: str | None = None
) -> tuple[int, dict[str, str], Any]:
    body = json.dumps(records).encode() if kind == "json" else ndjson(records)
    headers = {"Content-Type": "application/json" if kind == "json" else "application/x-ndjson"}
    if gzipped:
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    status, h, raw = request(base + "/v1/events", "POST", body, headers)
    return status, h, json.loads(raw) if raw else None


def stored_event_count(store_url: str) -> int:
    """Events in a store: the sum of the minute service_cpm values (cpm of a minute = its event count)."""
    store = open_store(store_url)
    try:
        return int(round(sum(r[5] for r in store.query(metric="service_cpm", granularity="minute"))))
    finally:
        store.close()


def free_port() -> int:
    """A loopback port free now (for a process started next that takes no port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


@contextmanager
def prometheus(workdir: Path, config: str, flags: Sequence[str] = ()) -> Iterator[str]:
    """A real Prometheus (Debian's, which ``make test`` installs) on a free loopback port with ``config`` (YAML) and
    ``flags``, its data in ``workdir``; its base URL, once ready."""
    port = free_port()
    (workdir / "prometheus.yml").write_text(config)
    log = open(workdir / "prometheus.log", "wb")  # closed below, after the process
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", *flags],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(base + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("prometheus did not start:\n" + (workdir / "prometheus.log").read_text()[-3000:])
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def promql(base: str, query: str, at: float) -> list[dict]:
    """An instant query's result (``data.result``) at ``at`` (epoch seconds)."""
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": query, "time": f"{at:.3f}"})
    with urllib.request.urlopen(url, timeout=10) as r:
        answer = json.loads(r.read())
    assert answer["status"] == "success", answer
    return answer["data"]["result"]
