"""A batch aggregated elsewhere (the live commands' aggregator process): :meth:`LocalEngine.ingest` starts it and
returns, its partials are taken when the next batch comes or a checkpoint asks, and a checkpoint covers every batch
ingested before it, exactly as when the engine's own threads aggregate."""

from __future__ import annotations

from collections.abc import Callable

from drainpipe.inputs import EventBatch
from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS, Definitions
from drainpipe.pipeline.engine import EngineOptions, LocalEngine
from drainpipe.pipeline.partials import Partial
from drainpipe.pipeline.store import open_store
from testlib import same_values, store_events

OPTS = EngineOptions(checkpoints=True, l1_flush_s=0.05, l2_flush_s=0.1)


def _stored(batches: list[EventBatch], aggregate: Callable | None) -> list[tuple]:
    store = open_store("duckdb:///:memory:")
    engine = LocalEngine(DEFAULT_DEFINITIONS, store, OPTS, aggregate=aggregate)
    try:
        for batch in batches[:-1]:
            engine.ingest(batch)
        engine.checkpoint([], sum(b.requests for b in batches[:-1]), wait=True)
        engine.ingest(batches[-1])  # the last one's partials are taken by the checkpoint alone
        engine.checkpoint([], batches[-1].requests, wait=True)
        return store.query()
    finally:
        engine.close()
        store.close()


def test_ingest_returns_before_the_partials_and_every_checkpoint_covers_what_came_before_it() -> None:
    batches = [EventBatch.of(store_events(3_000, seed)) for seed in range(4)]
    started: list[int] = []
    taken: list[int] = []

    def aggregate(batch: EventBatch, definitions: Definitions) -> Callable[[], list[Partial]]:
        started.append(batch.requests)

        def partials() -> list[Partial]:
            taken.append(batch.requests)
            return aggregate_batch(batch, definitions)

        return partials

    store = open_store("duckdb:///:memory:")
    engine = LocalEngine(DEFAULT_DEFINITIONS, store, OPTS, aggregate=aggregate)
    try:
        engine.ingest(batches[0])
        assert (started, taken) == ([3_000], [])  # started, not waited for: the caller reads on meanwhile
        engine.ingest(batches[1])
        assert (started, taken) == ([3_000] * 2, [3_000])  # the batch before's, taken when the next came
        engine.checkpoint([], 6_000, wait=True)
        assert taken == [3_000] * 2  # the checkpoint took the one still out
        total = sum(r[5] for r in store.query() if r[0] == "service_cpm" and r[2] == "minute")
        assert total == 6_000
    finally:
        engine.close()
        store.close()
    assert same_values(_stored(batches, aggregate), _stored(batches, None))
