"""One hung aggregation call no longer stops the engine's intake (issue 58: the ingest queue's round-robin producers
blocked on the hung task's full partition). The ingest queue declares its consumer thread-safe, so the hung task's
partitions fail over; every other batch is aggregated while the call hangs, and the held batch is counted once when
it returns."""

from __future__ import annotations

import threading

import pytest

from drainpipe import ThreadPolicy
from drainpipe.pipeline import engine as engine_module
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.engine import EngineOptions, LocalEngine
from drainpipe.pipeline.store import open_store
from testlib import store_events, wait_until


def test_a_hung_aggregation_call_fails_over_and_intake_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = [store_events(200, seed=i) for i in range(40)]
    hung = batches[3]
    gate, entered = threading.Event(), threading.Event()
    real = engine_module.aggregate_batch

    def aggregate(batch, definitions, observe=None):
        if batch is hung:
            entered.set()
            gate.wait(30)
        return real(batch, definitions, observe)

    monkeypatch.setattr(engine_module, "aggregate_batch", aggregate)
    store = open_store("duckdb:///:memory:")
    engine = LocalEngine(default_definitions(), store,
                         EngineOptions(ingest_threads=ThreadPolicy.fixed(2), slow_handler_ms=100), name="hung-ingest")  # fmt: skip
    done = threading.Event()

    def feed() -> None:
        for batch in batches:
            engine.ingest(batch)
        done.set()

    feeder = threading.Thread(target=feed, daemon=True)
    try:
        feeder.start()
        assert entered.wait(10)
        # every batch but the hung one is taken in and aggregated while the call hangs
        assert done.wait(10), "intake stopped behind the hung aggregation call"
        # every batch is handed to an aggregation call, and all are aggregated but the hung one and at most one
        # taken with it (an ingest partition holds two batches: a call may hold the one after the hung one)
        others = sum(b.num_rows for b in batches if b is not hung)
        wait_until(lambda: engine.ingest_queue.stats().dispatched == len(batches) and engine.counters.events >= others
                   - 200, timeout=10, what="the other batches aggregated")  # fmt: skip
        assert engine.ingest_queue.stats().failovers >= 1
    finally:
        gate.set()
        feeder.join(10)
        report = engine.close()
    assert engine.counters.events == sum(b.num_rows for b in batches) and report["dropped"] == 0
    per_minute = [r[5] for r in store.query() if r[0] == "service_cpm" and r[2] == "minute"]  # calls per minute
    assert sum(per_minute) == sum(b.num_rows for b in batches)
    store.close()
