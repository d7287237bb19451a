"""How the serve feeder hands the log to the engine: batches of up to ``COALESCE_EVENTS`` requests, whatever exit
rows (a CLIENT span's statement) they carry besides, and never more than ``COALESCE_ROWS`` rows in all."""

from __future__ import annotations

import pyarrow as pa

from drainpipe.inputs import EventBatch
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.engine import LocalEngine
from drainpipe.pipeline.store import open_store
from drainpipe.server import feeder as feeder_module
from drainpipe.server.feeder import COALESCE_EVENTS, COALESCE_ROWS, Feeder
from drainpipe.server.service import serve_engine_options
from drainpipe.server.wal import MemoryLog
from testlib import T0, event_batch


def export(requests: int, exits: int) -> pa.RecordBatch:
    """One OTLP request's events: ``requests`` request rows, then ``exits`` exit rows."""

    def rows(n: int, statement: str | None) -> pa.RecordBatch:
        return event_batch({"ts": T0 + i, "service": "s", "instance": "i", "endpoint": "" if statement else "/e",
                            "latency_ms": 1.0, "db_statement": statement} for i in range(n))  # fmt: skip

    return EventBatch.with_exits(rows(requests, None), rows(exits, "select 1"))


def fed(batches: list[EventBatch], monkeypatch) -> list[EventBatch]:
    """What the engine is handed when ``batches`` are in the log as the feeder starts. The gather window and the
    checkpoint period are made long: batches are cut by their bounds only (on a busy machine a 0.5 s window could
    pass between two reads of the log and cut a batch short: 128,000 requests, not 131,000, in one fresh-clone run)."""
    monkeypatch.setattr(feeder_module, "GATHER_S", 60.0)
    definitions = default_definitions()
    store = open_store("duckdb:///:memory:")
    engine = LocalEngine(definitions, store, serve_engine_options(), name="coalesce")
    log = MemoryLog()
    seen: list[EventBatch] = []
    feeder = Feeder(log, engine, definitions, checkpoint_s=60.0, observe=seen.append)
    try:
        for batch in batches:
            log.append(batch)
        feeder.recover()
        feeder.start()
        assert feeder.stop(60)
    finally:
        engine.close()
        store.close()
    return seen


def test_exit_rows_do_not_count_toward_a_batchs_requests(monkeypatch) -> None:
    per = 1_000
    seen = fed([export(per, 400) for _ in range(2 * COALESCE_EVENTS // per + 3)], monkeypatch)
    requests = [b.requests for b in seen]
    assert sum(requests) == per * (2 * COALESCE_EVENTS // per + 3)  # every request, once
    assert max(requests) == (COALESCE_EVENTS // per) * per  # as many requests as without exit rows
    assert all(b.num_rows <= COALESCE_ROWS for b in seen)


def test_batches_of_exit_rows_only_stay_within_the_row_bound(monkeypatch) -> None:
    exports = 3 * (COALESCE_ROWS // 5_000)
    seen = fed([export(0, 5_000) for _ in range(exports)], monkeypatch)
    assert sum(b.num_rows for b in seen) == exports * 5_000
    assert all(b.num_rows <= COALESCE_ROWS for b in seen)
    assert max(b.num_rows for b in seen) > COALESCE_ROWS // 2  # still coalesced


def test_records_read_beyond_a_full_batch_start_the_next_one(monkeypatch) -> None:
    """The record that takes a batch past its bound starts the next batch, not fed as a small batch of its own
    after the full one (an engine batch costs a pass of every definition whatever its size)."""
    per = 1_000
    exports = 3 * (COALESCE_EVENTS // per) + 5
    seen = fed([export(per, 0) for _ in range(exports)], monkeypatch)
    requests = [b.requests for b in seen]
    assert sum(requests) == per * exports
    assert requests[:-1] == [(COALESCE_EVENTS // per) * per] * (len(requests) - 1)


def test_batches_stay_within_their_bytes_whatever_their_counts(monkeypatch) -> None:
    """Records join into one engine batch: their bytes are bounded too (two records of a request's largest events
    could pass Arrow's 2 GiB of text in a column), here made small; every request still fed, once, in order."""
    per = 1_000
    one = export(per, 0).buffer_bytes
    monkeypatch.setattr(feeder_module, "COALESCE_BYTES", 3 * one)
    seen = fed([export(per, 0) for _ in range(10)], monkeypatch)
    assert [b.requests for b in seen] == [3 * per, 3 * per, 3 * per, per]
    assert all(b.buffer_bytes <= 3 * one for b in seen)
