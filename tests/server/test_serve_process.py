"""`drainpipe serve` as a real process: SIGTERM while clients post loses nothing; `drainpipe stats --once`."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
from pathlib import Path

from server_testlib import events, post_events, stored_event_count


def start_serve(store_url: str, *extra: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "drainpipe.cli", "serve", "--store", store_url, "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    m = re.search(r"listening on (http://\S+)", line)
    if not m:
        proc.kill()
        raise AssertionError(f"serve did not start: {line!r} {proc.stderr.read()}")
    return proc, m.group(1)


def test_sigterm_while_posting_loses_nothing(tmp_path: Path) -> None:
    store_url = f"duckdb:///{tmp_path / 'serve.duckdb'}"
    proc, url = start_serve(store_url)
    accepted = [0]
    refused = [0]
    lock = threading.Lock()
    stop = threading.Event()

    def client(seed: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                status, _, body = post_events(
                    url, events(800, seed=seed * 1000 + i), kind="ndjson" if i % 2 else "json", gzipped=i % 3 == 0
                )
            except (urllib.error.URLError, ConnectionError, OSError):
                return  # the server has closed its socket: done
            i += 1
            with lock:
                if status == 200:
                    accepted[0] += body["accepted"]
                else:
                    assert status == 503, (status, body)
                    refused[0] += 1
            if status == 503:
                return

    try:
        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while accepted[0] < 20_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        # also: the terminal view works against the running server
        out = subprocess.run(
            [sys.executable, "-m", "drainpipe.cli", "stats", "--url", url, "--once"],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "COLUMNS": "120"},
        )
        assert out.returncode == 0, out.stderr
        assert "accepted" in out.stdout and "serve-L1" in out.stdout and "partition buffers" in out.stdout
        proc.send_signal(signal.SIGTERM)  # while the clients are still posting
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(30)
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "SIGTERM: draining and flushing" in stdout
    summary = dict(kv.split("=") for kv in stdout.strip().splitlines()[-1].split(": ", 2)[-1].split())
    assert int(summary["accepted"]) == accepted[0] > 0
    assert int(summary["dropped"]) == 0 and int(summary["handler_errors"]) == 0
    assert stored_event_count(store_url) == accepted[0]


def test_serve_errors_are_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "drainpipe.cli", "serve", "--store", "sqlite:///x", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # (the log it opens before the store refuses is beside the store: in the working directory)
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "unknown store scheme" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "drainpipe.cli", "stats", "--url", "http://127.0.0.1:9", "--once"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "cannot reach" in out.stderr and out.stderr.count("\n") == 1
    with socket.socket() as taken:  # OTLP/gRPC's port in use: one line too
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        out = subprocess.run(
            [sys.executable, "-m", "drainpipe.cli", "serve", "--store", f"duckdb:///{tmp_path / 'g.duckdb'}",
             "--port", "0", "--grpc-port", str(taken.getsockname()[1])],
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "for OTLP/gRPC" in out.stderr, out.stderr


def test_the_serve_command_watches_its_heap_and_an_embedded_service_does_not(monkeypatch) -> None:
    """``drainpipe serve`` (release_memory, set for the command's own process) runs the heap watcher while it serves
    and stops it after; a program that serves a ServeConfig of its own gets no trimming of its process's heap."""
    import pytest

    from drainpipe.errors import UsageError
    from drainpipe.server import assembly, http

    seen: list[set[str]] = []

    def fake_run_server(service, *args, **kwargs) -> dict:
        seen.append({t.name for t in threading.enumerate()})
        service.close()
        return {}

    monkeypatch.setattr(http, "run_server", fake_run_server)
    for release in (True, False):
        assembly.serve(assembly.ServeConfig(store_url="duckdb:///:memory:", durable=False, parsers=0,
                                            release_memory=release))  # fmt: skip
    assert "drainpipe-heap" in seen[0] and "drainpipe-heap" not in seen[1]
    assert "drainpipe-heap" not in {t.name for t in threading.enumerate()}  # stopped when serving ended

    def cannot_bind(*args, **kwargs) -> dict:
        raise OSError(98, "Address already in use")

    monkeypatch.setattr(http, "run_server", cannot_bind)
    with pytest.raises(UsageError, match="cannot listen"):  # a failed start stops the watcher too
        assembly.serve(assembly.ServeConfig(store_url="duckdb:///:memory:", durable=False, parsers=0,
                                            release_memory=True))  # fmt: skip
    assert "drainpipe-heap" not in {t.name for t in threading.enumerate()}


def test_serve_opens_its_store_through_live_store_url(monkeypatch) -> None:
    """``serve``'s DuckDB store returns freed memory: it is opened with LIVE_DUCKDB_OPTIONS, which DuckDB accepts
    (the store opens). What ``live_store_url`` adds and keeps is its own test's (tests/pipeline/test_store.py)."""
    from drainpipe.pipeline import LIVE_DUCKDB_OPTIONS, duckdb_config
    from drainpipe.server import assembly, http

    opened: list[str] = []
    real_open = assembly.open_store

    def recording_open(url: str, **kw):
        opened.append(url)
        return real_open(url, **kw)

    monkeypatch.setattr(assembly, "open_store", recording_open)
    monkeypatch.setattr(http, "run_server", lambda service, *a, **k: service.close() or {})
    assembly.serve(assembly.ServeConfig(store_url="duckdb:///:memory:", durable=False, parsers=0, release_memory=False))
    assert [duckdb_config(u) for u in opened] == [LIVE_DUCKDB_OPTIONS]
