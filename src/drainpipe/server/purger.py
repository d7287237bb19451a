"""Retention in a running service: the :class:`Purger` thread deletes what the definitions' retention no longer
keeps, at start and then every ``every_s`` seconds (``drainpipe compact`` does the same once, for batch users)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..errors import StoreError
from ..pipeline import Retention

__all__ = ["Purger"]

log = logging.getLogger("drainpipe.server")


class Purger(threading.Thread):
    """Purges the store by ``retention`` every ``every_s`` seconds once started (the service purges once itself
    before it starts feeding the engine). A failed purge is logged and tried again next period: it deletes in one
    transaction, so nothing is half done. The store's own lock keeps it from interleaving with the engine's
    merges."""

    def __init__(self, store: Any, retention: Retention, every_s: float) -> None:
        super().__init__(name="drainpipe-retention", daemon=True)
        self.store, self.retention, self.every_s = store, retention, every_s
        self.purged_rows = 0
        self.purges = 0
        self.last_error = ""
        self._stopping = threading.Event()

    def purge(self) -> None:
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
        while not self._stopping.wait(self.every_s):
            self.purge()

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(timeout=30)
