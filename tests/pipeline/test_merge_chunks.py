"""Store.merge_chunks (the Spark driver's bounded-memory write): chunks written one after another in one
transaction, sharing keys across chunks and with what was stored before, leave the store exactly as one merge of
everything; a repeated write with the same progress rows changes nothing."""

from __future__ import annotations

import pyarrow as pa
import pytest

import drainpipe.pipeline.store.merge as merge_module
from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.store import SourceProgress, open_store
from testlib import event_batch, metric_chunks

BASE = 1_790_000_000_000 // 60_000 * 60_000


def events(seed: int, n: int) -> pa.RecordBatch:
    return event_batch({"ts": BASE + ((i * 7 + seed) % 5) * 60_000, "service": f"s{(i + seed) % 3}",
                        "instance": f"i{i % 2}", "endpoint": f"/e{(i * seed) % 4}",
                        "latency_ms": float((i * 13 + seed) % 700), "status": i % 9 != 0,
                        "db_statement": f"SELECT {i % 5}" if i % 3 == 0 else None} for i in range(n))  # fmt: skip


def test_chunks_sharing_keys_store_what_one_merge_stores(tmp_path) -> None:
    definitions = default_definitions()
    before, *chunks = [aggregate_batch(events(seed, 300), definitions) for seed in range(1, 5)]
    progress = [SourceProgress("file", "f1", name, -1, 0, "h", "n", "p") for name in definitions.names]
    one, chunked = open_store(f"duckdb:///{tmp_path / 'one.duckdb'}"), open_store(f"duckdb:///{tmp_path / 'c.duckdb'}")
    try:
        for store in (one, chunked):
            store.merge(before)  # states stored earlier: the chunks merge into them
        one.merge([p for c in chunks for p in c])
        report = chunked.merge_chunks(definitions.all, (p for c in chunks for p in c), progress=progress)
        assert report.applied == sum(len(c) for c in chunks)
        assert chunked.query() == one.query()
        for t in definitions.topns:
            assert chunked.query_topn(t.name) == one.query_topn(t.name)
        again = chunked.merge_chunks(definitions.all, (p for c in chunks for p in c), progress=progress)
        assert again.applied == 0 and chunked.query() == one.query()  # exactly once by the progress rows
    finally:
        one.close()
        chunked.close()


def test_a_long_merge_holds_one_batch_not_every_batch(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Spark job's whole output is one merge_chunks transaction. DuckDB kept every Arrow table that had been
    registered (and unregistered) in a transaction until it committed: memory grew with the output. Arrow's
    allocations while the 24th chunk is made must be those of about one write batch, as at the 6th."""
    monkeypatch.setattr(merge_module, "WRITE_ROWS", 20_000)
    definitions = default_definitions()
    seen: dict[int, int] = {}

    def chunks():
        for k in range(24):
            seen[k] = pa.total_allocated_bytes()
            yield from metric_chunks(k * 4_000, 4_000, 3, definitions)

    with open_store(f"duckdb:///{tmp_path / 's.duckdb'}") as store:
        store.merge_chunks(definitions.all, chunks())
        assert len(store.query(metric="endpoint_cpm", granularity="minute")) == 96_000
    assert seen[23] < 2 * seen[5] + (8 << 20), seen
