"""The service's store, instrumented: each merge timed (write latency), consecutive failures counted (the service
answers 503 and admission waits while the store is unavailable)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import StoreUnavailable

__all__ = ["InstrumentedStore"]


class InstrumentedStore:
    """Wraps the engine's store: times each merge (write latency), notices unavailability. Everything else passes
    through. ``merge`` is only called from the engine's single persist thread."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.lock = threading.Lock()
        self.writes = 0
        self.failures = 0
        self.consecutive_failures = 0
        self.last_error = ""
        self.last_write_s = 0.0
        self.write_seconds: deque[float] = deque(maxlen=2048)  # recent latencies (for p50/p99 in the view)
        self.on_write: Callable[[float], None] | None = None  # e.g. a Prometheus histogram's observe

    def merge(self, partials: Iterable[Any], **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            result = self._store.merge(partials, **kwargs)
        except StoreUnavailable as exc:
            with self.lock:
                self.failures += 1
                self.consecutive_failures += 1
                self.last_error = str(exc)
            raise
        dt = time.perf_counter() - t0
        with self.lock:
            self.writes += 1
            self.consecutive_failures = 0
            self.last_write_s = dt
            self.write_seconds.append(dt)
        if self.on_write is not None:
            self.on_write(dt)
        return result

    @property
    def available(self) -> bool:
        return self.consecutive_failures == 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)
