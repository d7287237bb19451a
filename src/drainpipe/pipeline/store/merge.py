"""The store's upsert-merge: new states merged into the stored states of their keys, which they replace.

Contract (``docs/pipeline.md``, "Output (storage)"): rows are upserts keyed by (metric, entity, granularity,
time_bucket, label); states are merged, not overwritten, so two halves of the input stored one after the other give
the same values as the whole. Merging a state twice counts it twice: what makes a rerun exactly once is the books
(:mod:`.books`), checked by the store before it calls this module.

How, per call:

1. the partials are merged per (definition, granularity) in memory, and merged minute states are rolled up to hour
   and day (:func:`~drainpipe.pipeline.partials.rollup`); merging is associative, so the roll-up of the merge is the
   merge of the roll-ups;
2. in batches of about :data:`WRITE_ROWS` state rows (memory holds a batch, not every state of the transaction; the
   statements stay few, whatever the number of metrics), the new states are merged into the stored ones of their
   keys, and the keys' value rows replaced; likewise the top-N rows. Two ways, by what the backend declares
   (:attr:`~.backend.Backend.merges_in_database`): here, the keys (name, granularity, entity, time_bucket) are
   staged, the stored states for them read, merged with the new ones by :func:`~drainpipe.pipeline.partials.merge`
   and rewritten (DuckDB, an embedded file with one writer process); or by the database server itself, from the
   writer's staged rows and those other writers queued (:mod:`.database_merge`: PostgreSQL, which several writers
   share, so that none holds a lock for its own Python, and a key's rows from several writers are merged at once).

Functions over a :class:`~.backend.Backend`, called inside the store's session and writing transaction (whose lock
keeps two merges of one key from interleaving); blocking; database errors propagate; a partial of the wrong kind is
``TypeError``, misused granularities ``ValueError``, before anything is written.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..definitions import Definition
from ..partials import MetricPartial, Partial, TopNPartial, merge, rollup
from ..state_table import from_state_table, from_topn_table, to_state_table, to_topn_table, with_key
from ..values import TOPN_COLUMNS, VALUE_COLUMNS, finalize_table
from . import database_merge
from .backend import Backend, stage_keys

__all__ = ["WRITE_ROWS", "Writes", "check_partials", "write_chunks"]

#: state rows written per batch of statements within one merge transaction (read at each call: tests lower it)
WRITE_ROWS = 400_000

_STATE_COLUMNS = ("metric", "entity", "granularity", "time_bucket", "b", "n", "v", "ok", "tol")
_TOPN_GRANULARITY = "topn"  # a label for the staged keys only (top-N rows have no granularity column)
_STAGED = (
    "EXISTS (SELECT 1 FROM stage_keys k WHERE k.name = t.metric AND k.granularity = t.granularity"
    " AND k.entity = t.entity AND k.time_bucket = t.time_bucket)"
)
_STAGED_TOPN = (
    "EXISTS (SELECT 1 FROM stage_keys k WHERE k.name = t.name AND k.entity = t.entity"
    " AND k.time_bucket = t.time_bucket)"
)


def check_partials(parts: Sequence[Partial], with_rollup: bool) -> None:
    """``TypeError`` for anything but a partial; ``ValueError`` for coarser states given with ``with_rollup``."""
    for part in parts:
        if not isinstance(part, (MetricPartial, TopNPartial)):
            raise TypeError(f"not a partial: {part!r}")
        if with_rollup and isinstance(part, MetricPartial) and part.granularity != "minute":
            raise ValueError(
                f"{part.name!r}: {part.granularity} states given to merge(rollup=True), which derives hour and "
                "day from minute states itself; pass minute states only, or all granularities with rollup=False"
            )


class Writes:
    """The writes of one merge: ``parts`` merged per (definition, granularity), rolled up with ``with_rollup``, in
    batches of about :data:`WRITE_ROWS` state rows (memory holds a batch, not every state of the transaction).

    Made inside the store's writing transaction *before* its locks: where the database merges
    (:attr:`~.backend.Backend.merges_in_database`), the first batch (a checkpoint's whole merge, as a rule) is staged
    now, so that no lock is held for this process's work. :meth:`apply` runs under the store's locks: where the
    database merges, it merges the staged rows with the queue's (:func:`~.database_merge.merge_with_queue`), or moves
    them to the shared queue (:func:`~.database_merge.queue_staged`) for the store's fold after the commit; else it
    merges every batch into the stored states."""

    def __init__(self, backend: Backend, parts: Iterable[Partial], with_rollup: bool) -> None:
        grouped: dict[tuple[Definition, str], list[Partial]] = defaultdict(list)
        for part in parts:
            grouped[(part.definition, getattr(part, "granularity", ""))].append(part)
        self._backend = backend
        self._definitions = {definition for definition, _ in grouped}
        self._batches = _batches(grouped.values(), with_rollup)
        self._first = next(self._batches, None)
        if self._first is not None and backend.merges_in_database:
            database_merge.stage(backend, *self._first)

    @property
    def empty(self) -> bool:
        """Whether there is nothing to write (no partial, or none with a row)."""
        return self._first is None

    def apply(self, *, queue: bool) -> int:
        """Merge every batch into the stored states or, with ``queue`` (where the database merges), queue it for the
        fold after the commit; the number of other writers' queued rows merged with them (where the database
        merges, the first batch is merged in one pass with the queue: the transaction holds every merge lock)."""
        backend = self._backend
        if not backend.merges_in_database:
            for batch in self._all():
                _apply(backend, batch)
            return 0
        database_merge.define_queued(backend, self._definitions)
        folded = 0
        for i, batch in enumerate(self._all()):
            if i:
                database_merge.stage(backend, *batch)
            if queue:
                database_merge.queue_staged(backend)
            elif i:
                database_merge.merge_staged(backend)
            else:
                folded = database_merge.merge_with_queue(backend)
        return folded

    def _all(self) -> Iterator[_Batch]:
        if self._first is not None:
            yield self._first
        yield from self._batches


def write_chunks(backend: Backend, chunks: Iterable[Partial]) -> int:
    """Merge minute metric states and top-N rows into the stored states as they come, a batch of about
    :data:`WRITE_ROWS` rows at a time (chunks of one definition may share keys: each batch merges into what the
    batches before it wrote); the number of chunks."""
    count = 0
    pending: list[Partial] = []
    rows = 0
    for chunk in chunks:
        if not isinstance(chunk, (MetricPartial, TopNPartial)):
            raise TypeError(f"merge_chunks takes partials, not {chunk!r}")
        count += 1
        pending.append(chunk)
        rows += chunk.table.num_rows
        if rows >= WRITE_ROWS:
            _write_chunk_batch(backend, pending)
            pending, rows = [], 0
    _write_chunk_batch(backend, pending)
    return count


def _write_chunk_batch(backend: Backend, chunks: list[Partial]) -> None:
    grouped: dict[Definition, list[Partial]] = defaultdict(list)
    for chunk in chunks:
        if chunk.table.num_rows:
            grouped[chunk.definition].append(chunk)
    for batch in _batches(grouped.values(), True):
        _apply(backend, batch)


#: a batch of writes: metric partials (one per definition and granularity) and top-N partials
_Batch = tuple[list[MetricPartial], list[TopNPartial]]


def _batches(groups: Iterable[list[Partial]], with_rollup: bool) -> Iterator[_Batch]:
    """Each group (partials of one definition and granularity) merged first and, with ``with_rollup``, rolled up
    once; in batches of about WRITE_ROWS state rows, the top-N partials with the last."""
    metrics: list[MetricPartial] = []
    topns: list[TopNPartial] = []
    for group in groups:
        for m in _granular(merge(group), with_rollup):
            if isinstance(m, MetricPartial):
                if m.table.num_rows:
                    metrics.append(m)
            elif isinstance(m, TopNPartial) and m.table.num_rows:
                topns.append(m)
        if sum(m.table.num_rows for m in metrics) >= WRITE_ROWS:
            yield metrics, []
            metrics = []
    if metrics or topns:
        yield metrics, topns


def _apply(backend: Backend, batch: _Batch) -> None:
    metrics, topns = batch
    if backend.merges_in_database:
        database_merge.stage(backend, metrics, topns)
        database_merge.merge_staged(backend)
        return
    if metrics:
        _merge_metrics(backend, metrics)
    if topns:
        _merge_topns(backend, topns)


def _granular(part: Partial, with_rollup: bool) -> list[Partial]:
    if isinstance(part, MetricPartial) and with_rollup and part.granularity == "minute":
        return [part, rollup(part, "hour"), rollup(part, "day")]
    return [part]


def _merge_metrics(backend: Backend, parts: list[MetricPartial]) -> None:
    """Merge stored states into the new ones for every key of ``parts``; replace their state and value rows."""
    new_states = pa.concat_tables(with_key(to_state_table(p), p.name, p.granularity) for p in parts)
    combined = parts
    if _maybe_stored(backend, "metric_state", "metric", (p.name for p in parts), new_states):
        stage_keys(backend, new_states)
        stored = backend.fetch_arrow(f"SELECT {', '.join(_STATE_COLUMNS)} FROM metric_state t WHERE {_STAGED}")
        combined = [
            merge([part, from_state_table(part.definition, part.granularity, found)]) if found.num_rows else part
            for part, found in zip(parts, _split(stored, "metric", [(p.name, p.granularity) for p in parts]))
        ]
        if stored.num_rows:  # a key has value rows only with state rows: none stored, none to delete
            backend.execute(f"DELETE FROM metric_state t WHERE {_STAGED}")
            backend.execute(f"DELETE FROM metric_values t WHERE {_STAGED}")
            new_states = pa.concat_tables(with_key(to_state_table(c), c.name, c.granularity) for c in combined)
    backend.insert_arrow("metric_state", new_states.select(list(_STATE_COLUMNS)))
    backend.insert_arrow(
        "metric_values",
        pa.concat_tables(finalize_table(c, stored=True) for c in combined).select(list(VALUE_COLUMNS)),
    )


def _merge_topns(backend: Backend, parts: list[TopNPartial]) -> None:
    """Merge stored top-N rows into the new ones for every key of ``parts``; replace their rows."""
    new_rows = pa.concat_tables(with_key(to_topn_table(p), p.name, _TOPN_GRANULARITY) for p in parts)
    if _maybe_stored(backend, "topn_values", "name", (p.name for p in parts), new_rows):
        stage_keys(backend, new_rows)
        stored = backend.fetch_arrow(f"SELECT {', '.join(TOPN_COLUMNS)} FROM topn_values t WHERE {_STAGED_TOPN}")
        if stored.num_rows:
            combined = [
                merge([part, from_topn_table(part.definition, found)]) if found.num_rows else part
                for part, found in zip(parts, _split(stored, "name", [(p.name, None) for p in parts]))
            ]
            backend.execute(f"DELETE FROM topn_values t WHERE {_STAGED_TOPN}")
            new_rows = pa.concat_tables(to_topn_table(c) for c in combined)
    backend.insert_arrow("topn_values", new_rows.select(list(TOPN_COLUMNS)))


def _maybe_stored(backend: Backend, table: str, name_column: str, names: Iterable[str], new_rows: pa.Table) -> bool:
    """Whether ``table`` may hold a key of ``new_rows``: a row of ``names`` within the time buckets they span. When
    it holds none, no new key can be stored yet, and staging the keys to look them up is skipped: a run into a new
    store, or over the next hour of input (minute keys of new time), writes without a join. A backend whose probe
    has no index (:attr:`~.backend.Backend.probe_ranges` False) always looks the keys up: a probe that finds nothing
    would read every row of the metrics."""
    if not backend.probe_ranges:
        return True
    lo, hi = pc.min_max(new_rows.column("time_bucket")).values()
    names = sorted(set(names))
    found = backend.fetchall(
        f"SELECT 1 FROM {table} WHERE time_bucket BETWEEN ? AND ? "
        f"AND {name_column} IN ({', '.join('?' * len(names))}) LIMIT 1",
        (lo.as_py(), hi.as_py(), *names),
    )
    return bool(found)


def _split(stored: pa.Table, name_column: str, keys: list[tuple[str, str | None]]) -> list[pa.Table]:
    """The rows of ``stored`` per (name, granularity) key (granularity None: any)."""
    out = []
    names = stored.column(name_column)
    for name, granularity in keys:
        mask = pc.equal(names, name)
        if granularity is not None:
            mask = pc.and_(mask, pc.equal(stored.column("granularity"), granularity))
        out.append(stored.filter(mask))
    return out
