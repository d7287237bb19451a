"""The live view's top services: looked up in the store only while someone reads the view."""

from __future__ import annotations

import threading
import time
from typing import Any

from server_testlib import events

from drainpipe.inputs import EventBatch, validate_records
from drainpipe.pipeline import LocalEngine
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.store import open_store
from drainpipe.server import live as live_module
from drainpipe.server.instrumented import InstrumentedStore
from drainpipe.server.live import Intake, LiveOptions, Sampler
from testlib import wait_until


class _CountingStore(InstrumentedStore):
    """The store as ``serve`` watches it, its queries counted."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.queries = 0
        self._count_lock = threading.Lock()

    def query(self, *args: Any, **kwargs: Any) -> Any:
        with self._count_lock:
            self.queries += 1
        return super().__getattr__("query")(*args, **kwargs)


class _Watched:
    def __init__(self, engine: LocalEngine, store: Any, max_ts: int) -> None:
        self.engine, self.store, self.definitions = engine, store, engine.definitions
        self.store_url, self.started, self.draining = "duckdb:///:memory:", time.time(), False
        self.max_ts = max_ts

    def intake(self) -> Intake:
        return Intake(accepted=0, rejected=0)

    def sections(self) -> dict[str, Any]:
        return {}


def test_top_services_are_looked_up_only_while_the_view_is_read(monkeypatch) -> None:
    # a first read waits for the lookup up to TOP_WAIT_S: long here, so that a busy machine's slow query is waited for
    monkeypatch.setattr(live_module, "TOP_WAIT_S", 60.0)
    definitions = default_definitions()
    real = open_store("duckdb:///:memory:")
    store = _CountingStore(real)
    engine = LocalEngine(definitions, real)
    batch = EventBatch.of(validate_records(events(500, seed=3))[0])
    engine.ingest(batch)
    wait_until(lambda: list(real.query(metric="service_cpm", granularity="minute")), timeout=30, interval=0.05,
               what="the events in the store")  # fmt: skip
    top_ts = max(batch.rows.column("ts").to_pylist())
    period = 0.1
    sampler = Sampler(_Watched(engine, store, top_ts), LiveOptions(sample_interval_s=0.05, top_refresh_s=period))
    sampler.start()
    try:
        time.sleep(15 * period)  # unread (an absence over time, nothing to wait for): no lookups at all
        assert store.queries == 0
        # the first read after the quiet spell waits for the lookup and answers with what the store has
        top = sampler.view()["top_services"]
        assert top["rows"] and top["rows"][0][0].startswith("svc-") and store.queries > 0
        # read over and over for a second: looked up again, but one lookup a period at most
        before, t0 = store.queries, time.monotonic()
        while time.monotonic() - t0 < 10 * period:
            sampler.view()
            time.sleep(period / 10)
        per_lookup = sum(1 for m in definitions.metrics if m.scope == "service")
        assert before < store.queries <= before + per_lookup * (10 + 2)
    finally:
        sampler.stop()
        engine.close()
        real.close()
