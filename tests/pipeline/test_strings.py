"""The string columns' kernel (``native/_strings.h``, through ``pipeline/strings.py``) against pyarrow, the path it
replaces where it is not built or is off: the same codes in the same order, the same values gathered, for chunked,
sliced and null-holding columns; and ``numpy_column`` against ``to_numpy``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe import native
from drainpipe.pipeline.grouping import numpy_column
from drainpipe.pipeline.strings import join_strings, string_values, take_strings

if native.groupstates is None:
    pytest.skip("the aggregation kernel is not built", allow_module_level=True)

_value = st.one_of(st.none(), st.sampled_from(["", "a", "svc-03", "café", "x" * 40]), st.text(max_size=6))


@st.composite
def _columns(draw: st.DrawFn) -> pa.Array | pa.ChunkedArray:
    """A string column: one array or chunks (empty ones among them), each maybe a slice of a larger array."""
    chunks = []
    for _ in range(draw(st.integers(1, 3))):
        values = draw(st.lists(_value, max_size=30))
        array = pa.array(values, pa.string())
        start = draw(st.integers(0, len(values)))
        chunks.append(array.slice(start, draw(st.integers(0, len(values) - start))))
    return chunks[0] if len(chunks) == 1 and draw(st.booleans()) else pa.chunked_array(chunks, pa.string())


def _both(f):  # type: ignore[no-untyped-def]
    got = f()
    with native.disabled("groupstates"):
        want = f()
    return got, want


@settings(max_examples=300, deadline=None)
@given(_columns())
def test_codes_and_values_are_pyarrows(column: pa.Array | pa.ChunkedArray) -> None:
    (codes, values), (want_codes, want_values) = _both(lambda: string_values(column))
    assert codes.dtype == np.int32 and codes.tolist() == want_codes.tolist()
    assert values.equals(want_values)
    assert [values[c].as_py() for c in codes] == [v or "" for v in column.to_pylist()]  # nulls read as ""


@settings(max_examples=300, deadline=None)
@given(_columns(), _columns(), st.data())
def test_gathers_are_pyarrows(
    a: pa.Array | pa.ChunkedArray, b: pa.Array | pa.ChunkedArray, data: st.DataObject
) -> None:
    k = data.draw(st.integers(0, 20))
    if len(a) == 0 or len(b) == 0:
        k = 0
    rows_a = np.asarray(data.draw(st.lists(st.integers(0, max(len(a) - 1, 0)), min_size=k, max_size=k)), np.int64)
    rows_b = np.asarray(data.draw(st.lists(st.integers(0, max(len(b) - 1, 0)), min_size=k, max_size=k)), np.int64)
    got, want = _both(lambda: join_strings([a, b], [rows_a, rows_b], "/"))
    assert got.equals(want)
    got, want = _both(lambda: take_strings(a, rows_a))
    assert got.equals(want)


def test_a_dictionary_column_is_coded_by_its_values() -> None:
    column = pa.array(["b", "a", None, "b", ""], pa.string()).dictionary_encode()
    repeating = pa.DictionaryArray.from_arrays(pa.array([2, 1, 0, 1], pa.int32()), pa.array(["b", "a", "b"]))
    codes, values = string_values(repeating)  # (a dictionary may repeat a value: coded by value)
    assert values.to_pylist() == ["b", "a"] and codes.tolist() == [0, 1, 0, 1]
    codes, values = string_values(column)  # a null reads as "", as in a plain column
    assert [values[c].as_py() for c in codes] == ["b", "a", "", "b", ""]


def test_a_row_out_of_range_is_an_error_not_a_read() -> None:
    with pytest.raises(ValueError, match="out of range"):
        take_strings(pa.array(["a", "b"]), np.array([2], np.int64))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.booleans(), st.none()), max_size=40), st.integers(0, 10), st.booleans())
def test_numpy_column_is_to_numpy(values: list[bool | None], start: int, floats: bool) -> None:
    array = pa.array(values, pa.bool_()).slice(min(start, len(values)))
    if floats:
        array = pa.array([None if v is None else float(v) for v in array.to_pylist()], pa.float64())
    got, want = numpy_column(array), array.to_numpy(zero_copy_only=False)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # (NaN, a float null, equals NaN here)


def test_damaged_offsets_are_an_error_not_a_read() -> None:
    """An array whose offsets go negative in the middle (Arrow's cheap validation passes it): gathering that row
    reads nothing outside the data."""
    damaged = pa.Array.from_buffers(
        pa.string(), 2, [None, pa.py_buffer(np.array([0, -8, 3], np.int32)), pa.py_buffer(b"abc")]
    )
    with pytest.raises(ValueError, match="out of order"):
        take_strings(damaged, np.array([1], np.int64))
