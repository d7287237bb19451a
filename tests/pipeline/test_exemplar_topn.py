"""Top-Ns per latency bucket and per minute, keyed on trace ids: the stored exemplars (``[prometheus] exemplars``).

The cut (``keep_top``) and the aggregation are checked against a plain-Python reference, and the aggregation of a
batch against the merge of its pieces' (what the engine's L1/L2 and the stores do), for random rows with latencies
on and around the bucket bounds."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe.errors import DefinitionError
from drainpipe.inputs import EVENT_SCHEMA, TRACE_ID, batch_schema
from drainpipe.pipeline.aggregate import aggregate_batch
from drainpipe.pipeline.definitions import (
    EXEMPLARS,
    Definitions,
    TopNDef,
    default_definitions,
    parse_definitions,
    signature,
    with_exemplars,
)
from drainpipe.pipeline.partials import merge
from testlib import event_batch

BOUNDS = (5.0, 10.0, 25.0)
LATENCIES = st.sampled_from([0.5, 4.999, 5.0, 5.001, 7.0, 10.0, 12.0, 25.0, 25.5, 300.0])
T0 = 1_790_000_000_000 // 600_000 * 600_000

rows = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),  # service
        st.sampled_from(["/x", "/y", ""]),  # endpoint ("" counts for no endpoint)
        st.integers(0, 3 * 60_000 - 1),  # ms after T0: three minutes
        LATENCIES,
        st.one_of(st.none(), st.binary(min_size=16, max_size=16)),  # trace id
    ),
    max_size=60,
)


def _batch(events: list[tuple]) -> pa.RecordBatch:
    return event_batch(
        ({"ts": T0 + offset, "service": service, "endpoint": endpoint, "latency_ms": latency, TRACE_ID: trace}
         for service, endpoint, offset, latency, trace in events),
        schema=batch_schema([TRACE_ID]),
    )  # fmt: skip


def _reference(events: list[tuple], topn: TopNDef) -> list[tuple]:
    """(entity, bucket ms, latency, hex key) rows: per endpoint, bucket and latency bucket (le), the n slowest."""
    groups: dict[tuple, list[tuple[float, str]]] = {}
    for service, endpoint, offset, latency, trace in events:
        if not endpoint or trace is None:
            continue
        bucket = (T0 + offset) // topn.bucket_ms * topn.bucket_ms
        le = next((i for i, bound in enumerate(topn.latency_buckets_ms) if latency <= bound), len(BOUNDS))
        groups.setdefault((f"{service}/{endpoint}", bucket, le), []).append((latency, trace.hex()))
    out = []
    for (entity, bucket, _le), found in groups.items():
        for latency, key in sorted(found, key=lambda x: (-x[0], x[1]))[: topn.n]:
            out.append((entity, bucket, latency, key))
    return sorted(out)


def _rows(table: pa.Table) -> list[tuple]:
    return sorted(zip(*(table.column(c).to_pylist() for c in ("entity", "bucket", "latency_ms", "key"))))


@settings(max_examples=150, deadline=None)
@given(rows, st.integers(1, 2), st.sampled_from([1, 2]), st.integers(0, 60))
def test_the_top_per_latency_bucket_equals_the_reference_and_merges(events, n, minutes, cut) -> None:
    topn = TopNDef("t", "endpoint", TRACE_ID, n, minutes=minutes, latency_buckets_ms=BOUNDS)
    definitions = Definitions((), (topn,))
    whole = aggregate_batch(_batch(events), definitions)[0]
    assert _rows(whole.table) == _reference(events, topn)
    # L1 per piece, then merged (L2, the stores): the same rows
    pieces = [aggregate_batch(_batch(part), definitions)[0] for part in (events[:cut], events[cut:])]
    assert _rows(merge(pieces).table) == _rows(whole.table)


def test_without_latency_buckets_a_trace_top_n_is_the_n_slowest_of_its_bucket() -> None:
    events = [("a", "/x", i * 1000, float(i), bytes([i]) * 16) for i in range(1, 20)]
    topn = TopNDef("t", "endpoint", TRACE_ID, 3, minutes=1)
    rows = _rows(aggregate_batch(_batch(events), Definitions((), (topn,)))[0].table)
    assert [(r[2], r[3]) for r in rows] == [(float(i), (bytes([i]) * 16).hex()) for i in (17, 18, 19)]


def test_a_batch_without_trace_ids_gives_an_empty_exemplar_partial() -> None:
    batch = pa.RecordBatch.from_pydict(
        {"ts": [T0], "service": ["a"], "instance": [""], "endpoint": ["/x"], "latency_ms": [1.0], "status": [True],
         "db_statement": [None]},
        schema=EVENT_SCHEMA,
    )  # fmt: skip
    partials = aggregate_batch(batch, with_exemplars(default_definitions()))
    assert partials[-1].definition.name == EXEMPLARS and partials[-1].table.num_rows == 0


def test_exemplars_in_the_toml_add_the_top_n_and_keep_the_signatures_of_the_others() -> None:
    toml = '[prometheus]\nexemplars = true\nlatency_buckets_ms = [5, 50]\n[[topn]]\nname = "slow"\n'
    definitions = parse_definitions(toml)
    assert definitions.spans.trace_ids
    assert definitions.topns[-1] == TopNDef(EXEMPLARS, "endpoint", TRACE_ID, 1, 1, (5.0, 50.0))
    # a top-N of the first kind signs as it did before minutes and latency buckets existed (stores keep it)
    assert signature(definitions.topns[0]) == '{"key": "db_statement", "kind": "topn", "n": 10, "scope": "service"}'
    with pytest.raises(DefinitionError, match="keeps a top-N named 'exemplars'"):
        parse_definitions('[prometheus]\nexemplars = true\n[[topn]]\nname = "exemplars"\n')
    with pytest.raises(DefinitionError, match="minutes must be one of"):
        TopNDef("t", minutes=7)
    with pytest.raises(DefinitionError, match="latency_buckets_ms must be"):
        TopNDef("t", latency_buckets_ms=(5.0, 1.0))
    assert dataclasses.replace(TopNDef("t"), key=TRACE_ID).key == TRACE_ID
