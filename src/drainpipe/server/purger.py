"""Retention in a running service: the :class:`Purger` thread deletes what the definitions' retention no longer
keeps, at start and then every ``every_s`` seconds (``drainpipe compact`` does the same once, for batch users), and
early when a watched volume runs low on space (:mod:`.disk`): at once when it turns low, then at most every
``early_gap_s`` while it stays low."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..errors import StoreError
from ..pipeline import Retention
from .disk import DiskWatch

__all__ = ["Purger"]

log = logging.getLogger("drainpipe.server")


class Purger(threading.Thread):
    """Purges the store by ``retention`` every ``every_s`` seconds once started (the service purges once itself
    before it starts feeding the engine). A failed purge is logged and tried again next period: it deletes in one
    transaction, so nothing is half done. The store's own lock keeps it from interleaving with the engine's
    merges."""

    def __init__(
        self, store: Any, retention: Retention, every_s: float, *, disk: DiskWatch | None = None,
        early_gap_s: float = 60.0,
    ) -> None:  # fmt: skip
        super().__init__(name="drainpipe-retention", daemon=True)
        self.store, self.retention, self.every_s = store, retention, every_s
        self.disk = disk
        self.early_gap_s = early_gap_s
        self.purged_rows = 0
        self.purges = 0
        self.early_purges = 0  # purges a low volume brought forward
        self.last_error = ""
        self._last = float("-inf")  # time.monotonic() of the last purge
        self._stopping = threading.Event()

    def purge(self) -> None:
        self._last = time.monotonic()
        try:
            report = self.store.purge(self.retention)
            self.purged_rows += report.total
            self.purges += 1
            self.last_error = ""
            if report.total:
                log.info("retention (%s): purged %d rows", self.retention.describe(), report.total)
        except StoreError as exc:
            self.last_error = str(exc)
            log.warning("retention purge failed (tried again in %.0f s): %s", self.every_s, exc)

    def run(self) -> None:
        due = time.monotonic() + self.every_s
        was_low = False
        tick = self.every_s if self.disk is None else min(self.every_s, self.disk.every_s)
        while not self._stopping.wait(max(0.0, min(tick, due - time.monotonic()))):
            now = time.monotonic()
            if now >= due:
                self.purge()
                due = now + self.every_s
                continue
            low = self.disk is not None and bool(self.disk.check().low)
            if low and (not was_low or now - self._last >= self.early_gap_s):
                log.warning("a volume is low on space (%s): purging by retention now",
                            "; ".join(v.describe() for v in self.disk.check().low))  # type: ignore[union-attr]  # fmt: skip
                self.early_purges += 1
                self.purge()
            was_low = low

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(timeout=30)
