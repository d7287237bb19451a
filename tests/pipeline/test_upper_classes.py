"""``upper_classes``: a value's class among a histogram's bounds, as ``np.searchsorted(bounds, values, "left")``
(upper-inclusive, Prometheus' ``le``), by either of its two ways (compared with each bound, or searched)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe.pipeline import upper_classes

_finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    bounds=st.lists(st.floats(min_value=1e-3, max_value=1e9, allow_nan=False), min_size=1, max_size=100, unique=True),
    values=st.lists(_finite, max_size=200),
    on_bounds=st.integers(0, 20),
)
def test_the_class_of_every_value_is_the_binary_search_s(
    bounds: list[float], values: list[float], on_bounds: int
) -> None:
    b = np.array(sorted(bounds), np.float64)
    v = np.array(values + [b[i % len(b)] for i in range(on_bounds)], np.float64)  # values on a bound: that bucket
    got = upper_classes(b, v)
    assert got.tolist() == np.searchsorted(b, v, side="left").tolist()
    assert len(b) > 32 or got.dtype == np.int8  # (the few bounds of a latency histogram: compared, in a byte)
