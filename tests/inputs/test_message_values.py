"""JSON message values read together (one validation call for a poll's messages) as each is read alone."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe.inputs.messages import BLANK, TOMBSTONE, json_values
from testlib import T0, rec

_GOOD = [rec(service="svc-a", endpoint="/a", ts=T0 + 1_000).encode(), rec(service="svc-b", ts=T0 + 2_000).encode()]
_VALUES = st.one_of(
    st.none(),  # a tombstone
    st.sampled_from(_GOOD),
    st.just(b"{not json"),
    st.just(rec(service="", ts=T0).encode()),  # an empty service: rejected
    st.lists(st.sampled_from([*_GOOD, b"{not json"]), min_size=2, max_size=3).map(b"\n".join),  # NDJSON lines
    st.sampled_from([b"", b" ", b"\n", b"\r\n\t "]),  # blank: rejected whole
    st.sampled_from(_GOOD).map(lambda v: v + b"\n"),  # a line with its newline: one event
    st.lists(st.sampled_from(_GOOD), min_size=2, max_size=2).map(b"\n\n".join),  # a blank line within: skipped
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_VALUES, min_size=1, max_size=12))
def test_values_read_together_equal_each_read_alone(values: list[bytes | None]) -> None:
    """The events, and the rejects with their message index, line and reason, whether the values have a tombstone
    among them (the path that sets them aside) or none."""
    together, rejects = json_values(values)
    alone = [json_values([value]) for value in values]
    expected_rejects = [(i, raw, reason) for i, (_, found) in enumerate(alone) for _, raw, reason in found]
    assert rejects == expected_rejects
    assert all(raw is None and reason == TOMBSTONE for i, raw, reason in rejects if values[i] is None)
    blank = [i for i, v in enumerate(values) if v is not None and not v.strip()]
    assert [i for i, _, reason in rejects if reason == BLANK] == blank  # every blank value accounted for, once
    tables = [batch.rows for batch, _ in alone if batch.num_rows]
    assert together.num_rows == sum(t.num_rows for t in tables)
    if tables:
        assert pa.Table.from_batches([together.rows]).to_pylist() == [r for t in tables for r in t.to_pylist()]
