"""The thread count of the pipeline engine: its five queues' drain threads and the one control thread of the process
(no thread per queue for control). Documented in docs/architecture.md; this keeps the documented figures true."""

from __future__ import annotations

import threading

import pytest

from drainpipe import processes
from drainpipe.inputs import EventBatch
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.engine import EngineOptions, LocalEngine
from drainpipe.pipeline.store import open_store
from drainpipe.server.service import serve_engine_options
from testlib import T0, event_batch


@pytest.mark.parametrize(("cores", "expected"), [(2, 9), (8, 22), (64, 84)])
def test_engine_threads(monkeypatch: pytest.MonkeyPatch, cores: int, expected: int) -> None:
    monkeypatch.setattr(processes, "usable_cpus", lambda: cores)
    before = {t.name for t in threading.enumerate()}
    store = open_store("duckdb:///:memory:")
    engine = LocalEngine(default_definitions(), store, name=f"threads{cores}")
    try:
        new = [t.name for t in threading.enumerate() if t.name not in before]
        control = "drainpipe-control" in before or "drainpipe-control" in new
        assert control
        drain = sorted(n for n in new if n != "drainpipe-control")
        roles = {
            r: sum(1 for n in drain if n.rsplit("-", 2)[-2] == r) for r in ("ingest", "L1", "L2", "topn", "persist")
        }
        # ingest and L1: one per core; L2: 1 + a quarter per core (half up); top-N and persist: one each; no stage
        # more than MAX_STAGE_THREADS (32): on 64 cores, 32 + 32 + 17 + 2 and the control thread
        per_core = min(cores, 32)
        assert roles == {"ingest": per_core, "L1": per_core, "L2": min(32, 1 + int(cores / 4 + 0.5)), "topn": 1,
                         "persist": 1}  # fmt: skip
        assert len(drain) + 1 == expected
    finally:
        engine.close()
        store.close()


def test_with_checkpoints_serve_s_stages_back_off_idle_up_to_half_a_second() -> None:
    """``serve_engine_options`` (``serve``, ``consume``): no stage hands states on by a timer there (a checkpoint wakes
    them), so every stage's idle drain threads sleep up to ``max_idle_ms`` = 500 ms; without it each stage keeps its
    own backoff (50 ms, 100 ms for top-N and persist). An idle ``serve`` woke 300 times a second before."""
    store = open_store("duckdb:///:memory:")
    engines = {
        "serve": LocalEngine(default_definitions(), store, serve_engine_options(), name="idle-serve"),
        "default": LocalEngine(default_definitions(), store, EngineOptions(), name="idle-default"),
    }
    try:
        for kind, engine in engines.items():
            queues = {"ingest": engine.ingest_queue, "L1": engine.l1, "L2": engine.l2, "topn": engine.topn,
                      "persist": engine.persist}  # fmt: skip
            backoff = {name: q.config.max_idle_ms for name, q in queues.items()}
            expected = dict.fromkeys(queues, 500) if kind == "serve" else {
                "ingest": 50, "L1": 50, "L2": 50, "topn": 100, "persist": 100}  # fmt: skip
            assert backoff == expected, kind
    finally:
        for engine in engines.values():
            engine.close()
        store.close()


def test_the_observer_sees_every_event_batch_once_aggregated_and_its_errors_stop_nothing(caplog) -> None:
    """``observe`` gets each EventBatch with requests, and its request columns as the aggregation read them; an
    observer that raises is logged and the batch is still aggregated and stored."""
    seen: list[tuple[int, list[str]]] = []

    def observe(batch: EventBatch, columns) -> None:
        seen.append((columns.rows, columns.encoded("service")[1].to_pylist()))
        if len(seen) == 2:
            raise RuntimeError("observer down")

    store = open_store("duckdb:///:memory:")
    engine = LocalEngine(default_definitions(), store, name="observed", observe=observe)
    rows = [{"ts": T0 + i, "service": f"s{i % 2}", "latency_ms": 1.0} for i in range(10)]
    exits = [{"ts": T0, "service": "s0", "latency_ms": 1.0, "db_statement": "select 1"}] * 3
    for _ in range(3):
        assert engine.ingest(EventBatch(event_batch(rows + exits), len(rows)))
    assert engine.ingest(EventBatch(event_batch(exits), 0))  # no requests: nothing to observe
    engine.close()
    assert seen == [(10, ["s0", "s1"])] * 3
    assert "observing an ingested batch failed" in caplog.text
    assert sum(r[5] for r in store.query(metric="service_cpm", granularity="minute")) == 30
