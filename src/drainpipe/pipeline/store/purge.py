"""Retention in the store: delete, in one transaction, what a :class:`~drainpipe.pipeline.retention.Retention` no
longer keeps.

Metric rows go per granularity by bucket start, top-N rows by bucket start, and rows of the books (:mod:`.books`) by
the time they were recorded (``applied_at``), once older than the longest retention: a progress row outlives the
data it vouches for, so that input replayed within any retention is still found applied. A part's fencing token is
never purged: a Kafka partition idle for longer than the longest retention is still owned (its owner's next merge
would be refused as fenced by a token gone back to 0), and a token must never be issued twice.

A function over a :class:`~.backend.Backend`, called inside the store's session and writing transaction (the store
blocks other writers meanwhile); blocking; database errors propagate.
"""

from __future__ import annotations

from collections import defaultdict

from ..retention import Retention
from ..times import instant
from . import books
from .backend import Backend

__all__ = ["purge"]


def purge(backend: Backend, retention: Retention, now_ms: int) -> dict[str, int]:
    """Delete the rows ``retention`` no longer keeps at ``now_ms``; rows deleted per table."""
    deleted: dict[str, int] = defaultdict(int)
    for granularity, cutoff in retention.metric_cutoffs(now_ms).items():
        for table in ("metric_state", "metric_values"):
            deleted[table] += backend.delete(
                f"DELETE FROM {table} WHERE granularity = ? AND time_bucket < ?", (granularity, instant(cutoff))
            )
    topn = retention.topn_cutoff(now_ms)
    if topn is not None:
        deleted["topn_values"] += backend.delete("DELETE FROM topn_values WHERE time_bucket < ?", (instant(topn),))
    recorded_before = retention.books_cutoff(now_ms)
    if recorded_before is not None:
        deleted[books.TABLE] += backend.delete(
            f"DELETE FROM {books.TABLE} WHERE applied_at < ? AND name <> ?", (recorded_before, books.FENCE)
        )
    return dict(deleted)
