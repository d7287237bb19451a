"""A stage call that runs longer than slow_handler_ms (here: a store merge that hangs) is reported while it runs:
in /v1/stats (the dashboard's data, shown in its "slow handler calls" panel) and in /metrics, and the report clears
once the call returns."""

from __future__ import annotations

import json
import threading

from server_testlib import events, post_events, request

from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.store import open_store
from drainpipe.server.http import IngestServer
from drainpipe.server.service import IngestService, ServiceOptions, serve_engine_options
from testlib import wait_until


class Hang:
    """A store whose merges wait for ``go``."""

    def __init__(self, store) -> None:
        self.store = store
        self.go = threading.Event()

    def merge(self, partials, **kwargs):
        self.go.wait(30)
        return self.store.merge(partials, **kwargs)

    def __getattr__(self, name):
        return getattr(self.store, name)


def _slow(server) -> list[tuple[str, dict]]:
    stats = json.loads(request(server.url + "/v1/stats")[2])
    return [(q["name"], c) for q in stats["queues"] for c in q["slow_calls"]]


def test_a_hanging_store_merge_is_reported_then_cleared() -> None:
    store = Hang(open_store("duckdb:///:memory:"))
    service = IngestService(
        default_definitions(),
        store,
        store_url="duckdb:///:memory:",
        options=ServiceOptions(sample_interval_s=0.25, checkpoint_s=0.2),
        engine_options=serve_engine_options(slow_handler_ms=200),
    )
    server = IngestServer(service, "127.0.0.1", 0).start()
    try:
        assert post_events(server.url, events(500))[0] == 200
        (queue, call), *_ = wait_until(lambda: _slow(server), timeout=10, interval=0.05, what="a slow handler")
        assert queue.endswith("-persist") and call["method"] == "consume" and call["seconds"] >= 0.2
        metrics = request(server.url + "/metrics")[2].decode()
        line = next(x for x in metrics.splitlines() if x.startswith("drainpipe_queue_slow_handler_seconds{"))
        assert f'queue="{queue}"' in line and float(line.rsplit(" ", 1)[1]) >= 0.2
        store.go.set()
        wait_until(lambda: not _slow(server), timeout=10, interval=0.05, what="the slow handler gone")
        assert "drainpipe_queue_slow_handler_seconds{" not in request(server.url + "/metrics")[2].decode()
    finally:
        store.go.set()
        server.shutdown_all()
