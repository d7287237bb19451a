"""Exit rows (CLIENT statements of an OTLP export, after a batch's requests) feed only the top-Ns keyed on
db_statement: joining marked batches (as the serve feeder does) keeps every row and the mark right, and aggregating
the joined batch equals aggregating the batches one by one and merging."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe.inputs import EventBatch
from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import default_definitions
from drainpipe.pipeline.partials import merge
from drainpipe.pipeline.values import finalize
from testlib import event_batch

BASE = 1_790_000_000_000


def rows(spec: list[tuple[int, int]], statement: bool) -> pa.RecordBatch:
    return event_batch({"ts": BASE + m * 60_000, "service": f"s{s}", "instance": "i",
                        "endpoint": "" if statement else "/x", "latency_ms": float(10 * m + s),
                        "db_statement": f"SELECT {s}" if statement else None} for m, s in spec)  # fmt: skip


spec = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), max_size=20)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(spec, spec), min_size=1, max_size=4))
def test_joined_batches_aggregate_as_the_batches_do(parts) -> None:
    definitions = default_definitions()
    batches = [EventBatch.with_exits(rows(req, False), rows(ex, True)) for req, ex in parts]
    joined = EventBatch.join(batches)
    assert joined.requests == sum(len(req) for req, _ in parts)
    assert joined.num_rows == sum(len(req) + len(ex) for req, ex in parts)
    one = aggregate_batch(joined, definitions)
    each = [aggregate_batch(b, definitions) for b in batches]
    for i, partial in enumerate(one):
        assert sorted(finalize(partial)) == sorted(finalize(merge([e[i] for e in each])))
    cpm = next(p for p in one if p.name == "service_cpm")  # statements are not requests
    assert sum(v for *_, v in finalize(cpm)) == sum(len(req) for req, _ in parts)
