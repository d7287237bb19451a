"""A disk running full is seen, and answered, before a write fails on it: on a small tmpfs holding both the write-ahead
log and the DuckDB store, ``serve`` shows the free space on /metrics, says degraded on /healthz under the warning
threshold and purges by retention at once, refuses POSTs with 503 and Retry-After under the refusal threshold while
the disk still has room, and takes events again once space is freed."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_testlib import events, post_events, request

from drainpipe.pipeline import clock
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.retention import Retention
from drainpipe.pipeline.store import open_store
from drainpipe.server.disk import DiskLimits
from drainpipe.server.http import IngestServer
from drainpipe.server.service import IngestService, ServiceOptions, serve_engine_options
from drainpipe.server.wal import WriteAheadLog
from testlib import fill_to, free_bytes, small_volume, wait_until

MB = 1 << 20


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    with small_volume(tmp_path / "vol", 32) as path:
        yield path


def _health(base: str) -> tuple[int, dict]:
    status, _, body = request(base + "/healthz")
    return status, json.loads(body)


def test_a_disk_running_full_is_answered_before_a_write_fails(volume: Path) -> None:
    url = f"duckdb:///{volume / 'store.duckdb'}"
    retention = Retention(minute=600_000)  # 10 minutes of minute rows: the events below are older
    definitions = dataclasses.replace(default_definitions(), retention=retention)
    service = IngestService(
        definitions,
        open_store(url),
        log=WriteAheadLog(volume / "wal", max_bytes=8 * MB, segment_bytes=256 << 10),
        store_url=url,
        options=ServiceOptions(sample_interval_s=0.25, checkpoint_s=0.2, disk=DiskLimits(12 * MB, 6 * MB)),
        engine_options=serve_engine_options(),
    )
    server = IngestServer(service, "127.0.0.1", 0).start()
    base = server.url
    old = clock.now_ms() - 30 * 60_000
    try:
        assert post_events(base, events(500, seed=1, now_ms=old))[0] == 200
        status, body = _health(base)
        assert status == 200 and body["status"] == "ok", body
        page = request(base + "/metrics")[2].decode()
        for name in ("log", "store"):
            assert f'drainpipe_disk_free_bytes{{path="{volume}' in page and f'volume="{name}"' in page
        wait_until(lambda: open_store_minutes(service) > 0, timeout=20, what="the old events' minute rows stored")

        filler = volume / "filler"
        fill_to(filler, 9 * MB)  # under the warning threshold, above the refusal one
        wait_until(lambda: _health(base)[1]["status"] == "degraded", timeout=10, what="/healthz degraded")
        status, body = _health(base)
        assert status == 200 and "warning under" in body["disk"], body
        # the retention purge ran at once, not an hour from now: the 30-minute-old minute rows are gone
        wait_until(lambda: service.purger.early_purges >= 1 and open_store_minutes(service) == 0, timeout=10,
                   what="an early purge")  # fmt: skip
        assert post_events(base, events(100, seed=2))[0] == 200  # still accepting

        fill_to(filler, 3 * MB)  # under the refusal threshold: the disk still has room
        wait_until(lambda: _health(base)[0] == 503, timeout=10, what="/healthz 503")
        assert _health(base)[1]["status"] == "disk full"
        status, headers, answer = post_events(base, events(100, seed=3))
        assert status == 503 and int(headers["Retry-After"]) > 0 and "disk nearly full" in answer["error"], answer
        assert free_bytes(volume) > 2 * MB  # refused while a write would still have succeeded

        filler.unlink()
        wait_until(lambda: _health(base)[1]["status"] == "ok", timeout=10, what="/healthz ok again")
        assert post_events(base, events(100, seed=4))[0] == 200
    finally:
        summary = server.shutdown_all()
    assert summary["refused_503"] >= 1


def open_store_minutes(service: IngestService) -> int:
    """The service's minute rows of service_cpm (read through its own store)."""
    return len(service.store.query(metric="service_cpm", granularity="minute"))


def test_either_threshold_alone_keeps_refusing_inside_warning() -> None:
    gib = 1 << 30
    total = 100 * gib
    assert (DiskLimits().warn(total), DiskLimits().refuse(total)) == (gib, 256 * MB)
    assert DiskLimits(warn_bytes=100 * MB).refuse(total) == 100 * MB  # not the default 256M above the warning
    assert DiskLimits(refuse_bytes=2 * gib).warn(total) == 2 * gib  # a refused volume is low too
    small = 10 * MB
    assert (DiskLimits().warn(small), DiskLimits().refuse(small)) == (small // 10, small // 50)
