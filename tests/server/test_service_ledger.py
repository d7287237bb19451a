"""The serve store wrapper trims request ids from the ledger after each successful write (and retries a trim
that failed), leaving file sources alone."""

from __future__ import annotations

from drainpipe.errors import StoreUnavailable
from drainpipe.pipeline.definitions import DEFAULT_DEFINITIONS
from drainpipe.pipeline.functions import aggregate_batch
from drainpipe.pipeline.generator import generate_events
from drainpipe.pipeline.store import open_store
from drainpipe.server.service import InstrumentedStore


def test_request_ids_are_forgotten_after_the_write_and_a_failed_trim_is_retried():
    batches = list(generate_events(900, services=3, seed=4, batch_rows=300))
    real = open_store("duckdb:///:memory:")
    failures = [1]

    class FlakyForget:  # the store, but its first trim fails as if the connection dropped
        def merge(self, partials, **kw):
            return real.merge(partials, **kw)

        def forget(self, sources):
            if failures[0]:
                failures[0] -= 1
                raise StoreUnavailable("connection lost")
            real.forget(sources)

    store = InstrumentedStore(FlakyForget(), forget_prefix="http:")
    store.merge(aggregate_batch(batches[0], DEFAULT_DEFINITIONS, source="http:r1"))
    assert real.has_sources("http:r1")  # the trim failed: kept for the next write
    store.merge(aggregate_batch(batches[1], DEFAULT_DEFINITIONS, source="http:r2"))
    store.merge(aggregate_batch(batches[2], DEFAULT_DEFINITIONS, source="file:f"))
    assert not real.has_sources("http:")  # both requests trimmed after the next successful write
    assert real.is_applied("file:f", DEFAULT_DEFINITIONS.names)
    assert sum(r[5] for r in real.query(metric="service_cpm", granularity="minute")) == 900
    real.close()
