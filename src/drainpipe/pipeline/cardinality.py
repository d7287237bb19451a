"""The cardinality guard: at most ``max_entities`` distinct entities per definition scope and bucket; the rest fold
into the entity ``__overflow__``.

One metric series per user id (an endpoint ``/users/1234`` that no rule normalized) would make every stage hold and
the store keep millions of series. The guard works on the states of each event batch as the local engine's ingest
stage made them (:meth:`EntityGuard.apply`, on the way to L1; ``drainpipe run`` and ``drainpipe serve`` alike),
before any stage keeps them: per scope (service, instance, endpoint) and minute (per top-N scope and 10-minute bucket
for top-Ns), the first ``max_entities`` entities seen are kept; the states of any further one are merged into the
entity ``__overflow__`` of that scope and bucket, so nothing is lost from the totals. Exact counts of the state rows
folded are kept per scope (:attr:`EntityGuard.folded`), and the first fold of each scope is logged.

Memory is bounded: per scope, the admitted entities of the newest ``horizon`` buckets (an older bucket's set is
dropped; data that late is admitted against a fresh set). The guard is per process and first come, first kept:
which entities are kept beyond the limit depends on arrival order. The Spark engine applies the same limit to
its merged minute states in Spark (the first entities by name are kept, ``drainpipe.spark.engine``) and this class
to its merged top-Ns on the driver.
Thread-safe: one lock around the admission of a partial's distinct keys (never per event).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

import numpy as np
import pyarrow as pa

from . import strings
from .grouping import distinct_pairs
from .partials import MetricPartial, Partial, fold_entities

__all__ = ["OVERFLOW", "EntityGuard"]

log = logging.getLogger("drainpipe.engine")

OVERFLOW = "__overflow__"


class EntityGuard:
    """See the module docstring. ``max_entities`` >= 1 per scope and bucket."""

    def __init__(self, max_entities: int, horizon: int = 180) -> None:
        if max_entities < 1:
            raise ValueError("max_entities must be >= 1")
        self.max_entities = max_entities
        self.horizon = horizon
        self._lock = threading.Lock()
        self._admitted: dict[str, OrderedDict[int, set[str]]] = {}
        self.folded: dict[str, int] = {}  # per scope key: state rows folded into __overflow__
        self._logged: set[str] = set()
        self._forgotten = 0  # buckets dropped past the horizon (under _lock; apply reads it between partials)

    def apply(self, partials: list[Partial]) -> list[Partial]:
        """The partials with every entity beyond the limit folded (the same objects where nothing folds).

        The metrics of one scope over one batch share its (entity, bucket) columns (one array each, computed once by
        the aggregation): once a partial over those arrays folded nothing, every later one over the same arrays
        folds nothing either (its pairs are admitted now), so it is not looked at again: the guard took as long as
        the aggregation itself when each of a scope's five metrics was checked. (Unless a bucket was forgotten
        meanwhile, past the horizon: then every partial is looked at again.)"""
        passed: set[tuple[str, tuple[int, ...]]] = set()  # (scope, the columns' buffers) that folded nothing
        out = []
        forgotten = self._forgotten
        for partial in partials:
            if self._forgotten != forgotten:  # a bucket left the horizon: what was admitted may be admitted anew
                passed.clear()
                forgotten = self._forgotten
            scope = self._scope(partial)
            if scope is None:
                out.append(partial)
                continue
            key = (scope, _buffers(partial.table))
            if key in passed:
                out.append(partial)
                continue
            kept = self._apply(partial, scope)
            if kept is partial:  # (the buffers stay alive with ``partials``: no address is reused meanwhile)
                passed.add(key)
            out.append(kept)
        return out

    @staticmethod
    def _scope(partial: Partial) -> str | None:
        """The guard's scope key of ``partial``, or None when it is not guarded (empty, or not minute states)."""
        if partial.table.num_rows == 0:
            return None
        if isinstance(partial, MetricPartial):
            return partial.definition.scope if partial.granularity == "minute" else None
        return "topn:" + partial.definition.scope

    def _apply(self, partial: Partial, scope: str) -> Partial:
        table = partial.table
        codes32, values = strings.string_values(table.column("entity"))
        codes = codes32.astype(np.int64)
        names = np.asarray(values.to_pylist(), dtype=object)
        buckets = table.column("bucket").to_numpy()
        # the distinct (bucket, entity) pairs; the admission then works per bucket on whole sets (C speed), and per
        # entity only in a bucket that reaches the limit
        pair_buckets, pair_codes = distinct_pairs(buckets, codes, len(names))
        rejected: set[tuple[int, int]] = set()
        with self._lock:
            sets = self._admitted.setdefault(scope, OrderedDict())
            for bucket in np.unique(pair_buckets).tolist():
                admitted = sets.get(bucket)
                if admitted is None:
                    admitted = sets[bucket] = set()
                    while len(sets) > self.horizon:
                        sets.popitem(last=False)  # the bucket first seen longest ago
                        self._forgotten += 1
                in_bucket = pair_codes[pair_buckets == bucket]
                new = set(names[in_bucket].tolist()) - admitted
                new.discard(OVERFLOW)
                if len(admitted) + len(new) <= self.max_entities:
                    admitted |= new  # the common case: everything fits
                    continue
                for code in in_bucket.tolist():  # first come (in entity order within the batch), first kept
                    name = names[code]
                    if name in admitted or name == OVERFLOW:
                        continue
                    if len(admitted) < self.max_entities:
                        admitted.add(name)
                    else:
                        rejected.add((bucket, code))
            if not rejected:
                return partial
            fold = np.fromiter(((b, c) in rejected for b, c in zip(buckets.tolist(), codes.tolist())), bool,
                               count=len(codes))  # fmt: skip
            self.folded[scope] = self.folded.get(scope, 0) + int(fold.sum())
            first = scope not in self._logged
            self._logged.add(scope)
        if first:
            log.warning("%s: more than %d %s entities in one bucket; further ones fold into %r (raise max_entities "
                        "in the metrics TOML if they are real)", partial.name, self.max_entities, scope,
                        OVERFLOW)  # fmt: skip
        return fold_entities(partial, fold, OVERFLOW)


def _buffers(table: pa.Table) -> tuple[int, ...]:
    """Where a state table's entity and bucket columns live: (address, offset, length) of each chunk's buffers."""
    out: list[int] = []
    for name in ("entity", "bucket"):
        for chunk in table.column(name).chunks:
            out += (chunk.offset, len(chunk), *(b.address if b is not None else 0 for b in chunk.buffers()))
    return tuple(out)
