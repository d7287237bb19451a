"""The thread count of the pipeline engine: its five queues' drain threads and the one control thread of the process
(no thread per queue for control). Documented in docs/architecture.md; this keeps the documented figures true."""

from __future__ import annotations

import threading

import pytest

from drainpipe import processes
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.engine import EngineOptions, LocalEngine
from drainpipe.pipeline.store import open_store
from drainpipe.server.service import serve_engine_options


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
