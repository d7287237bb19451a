"""The thread count of the pipeline engine: its five queues' drain threads and the one control thread of the process
(no thread per queue for control). Documented in docs/architecture.md; this keeps the documented figures true."""

from __future__ import annotations

import os
import threading

import pytest

from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.engine import LocalEngine
from drainpipe.pipeline.store import open_store


@pytest.mark.parametrize(("cores", "expected"), [(2, 9), (8, 22)])
def test_engine_threads(monkeypatch: pytest.MonkeyPatch, cores: int, expected: int) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
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
        # ingest and L1: one per core; L2: 1 + a quarter per core (half up); top-N and persist: one each
        assert roles == {"ingest": cores, "L1": cores, "L2": 1 + int(cores / 4 + 0.5), "topn": 1, "persist": 1}
        assert len(drain) + 1 == expected
    finally:
        engine.close()
        store.close()
