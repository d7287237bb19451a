"""A store outage is ridden out in the write-ahead log, on disk: the server keeps accepting far past what the
engine holds in memory, answers 503 + Retry-After at the log's byte budget, and after the outage catches up with
every acknowledged event stored once. The embedded DuckDB store cannot go away by itself, so its outage is
injected: the store raises StoreUnavailable (as a lost PostgreSQL connection does) while ``down`` is set.
tests/postgres has the same with a real PostgreSQL server stopped and started."""

from __future__ import annotations

import threading
from pathlib import Path

from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.store import open_store
from drainpipe.server.http import IngestServer
from drainpipe.server.service import IngestService, ServiceOptions, serve_engine_options
from drainpipe.server.wal import WriteAheadLog
from serve_kill import Books, body_template, check, post_until
from testlib import Outage, wait_until


def test_a_duckdb_outage_waits_in_the_log_then_everything_acknowledged_is_stored_once(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'store.duckdb'}"
    # the engine's lag may use half (admission), the rest is for the outage. 4 MB hold about 75,000 events of these
    # requests, five times the 15,000 asserted below (8 MB held twice as many, and took 7 s longer to fill and catch up)
    budget = 4 << 20
    wal = WriteAheadLog(tmp_path / "wal", max_bytes=budget, segment_bytes=512 << 10)
    store = Outage(open_store(url))
    service = IngestService(
        default_definitions(),
        store,
        log=wal,
        store_url=url,
        options=ServiceOptions(admit_wait_s=0.05, sample_interval_s=0.25, checkpoint_s=0.2),
        engine_options=serve_engine_options(store_retry_s=(0.05, 0.2)),
    )
    server = IngestServer(service, "127.0.0.1", 0).start()
    books = Books(size=200)
    stop = threading.Event()
    threads = post_until(server.url, books, body_template(200), "o", 3, stop)
    try:
        wait_until(lambda: len(books.acked) >= 50, timeout=60, interval=0.01, what="acknowledged requests")
        store.down.set()
        acked_before = len(books.acked)
        wait_until(lambda: books.refused >= 5, timeout=60, interval=0.01, what="the log at its budget (refusals)")
        acked_in_outage = len(books.acked) - acked_before
        held = service.engine.persist.stats().total_used()
        in_log = wal.size
        store.down.clear()
        wait_until(lambda: len(books.acked) >= acked_before + acked_in_outage + 50, timeout=60, interval=0.01,
                   what="requests accepted again after the outage")  # fmt: skip
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        summary = server.shutdown_all()
    # the outage lasted past the old in-memory cap (128 flushes refused it after a few thousand events) ...
    assert acked_in_outage * 200 >= 15_000 and in_log >= budget - (256 << 10), (acked_in_outage, in_log)
    # ... held on disk: the engine had at most two checkpoints' states (one flush per definition and stage each)
    assert held <= 6 * len(default_definitions().names), held
    assert summary["store_retries"] > 0 and summary["refused_503"] >= 5 and summary["in_log"] == 0, summary
    result = check(url, books)
    assert result["lost"] == result["duplicated"] == result["partial_requests"] == 0, result
    assert result["stored"] == result["acknowledged"] and result["metrics_agree"], result
