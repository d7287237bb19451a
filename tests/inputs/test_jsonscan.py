"""The C scanner of JSON Lines blocks (``drainpipe.native._jsonscan``) against ``json.loads``.

The scanner is the first fast path of a JSON Lines block. ``test_events.py`` holds the whole read to the per-line
result (fast paths on or off); these tests hold the scanner itself to json.loads + float() value by value, show
that it really takes the clean blocks it should, and that it declines what it must leave to the other paths."""

from __future__ import annotations

import json
import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe.inputs.formats.jsonl_format import fast_jsonl_block, json_rows, scanned
from drainpipe.inputs.validation import rows_to_batch
from drainpipe.native._jsonscan import scan

HYPO = settings(max_examples=300, deadline=None)

DIGITS = st.text("0123456789", min_size=1, max_size=25)
#: 16 to 19 significant digits with a decimal point anywhere: where a conversion through a rounded mantissa
#: goes wrong (a quarter of such numbers would be off by one ulp)
LONG_MANTISSA = st.builds(
    lambda m, k: f"{m // 10**k}.{m % 10**k:0{k}d}" if k else str(m), st.integers(10**15, 10**19 - 1), st.integers(0, 19)
)
NUMBER_TOKEN = st.one_of(
    LONG_MANTISSA,
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(-(10**30), 10**30).map(str),
    st.builds(
        lambda sign, whole, frac, exp: sign + (whole.lstrip("0") or "0") + (frac and "." + frac) + exp,
        st.sampled_from(["", "-"]),
        DIGITS,
        st.one_of(st.just(""), DIGITS),
        st.one_of(st.just(""), st.builds("{}{}{}".format, st.sampled_from("eE"), st.sampled_from(["", "+", "-"]),
                                         st.integers(0, 400).map(str))),
    ),
)  # fmt: skip


def bits(x: float) -> bytes:
    return struct.pack("<d", x)  # tells 0.0 from -0.0


def scanned_latency(token: str) -> float | None:
    line = b'{"ts":1,"service":"s","latency_ms":' + token.encode() + b"}\n"
    batch = scanned(line, 1)
    return None if batch is None else batch.column("latency_ms")[0].as_py()


@HYPO
@given(NUMBER_TOKEN)
def test_latency_numbers_convert_as_json_loads_and_float(token):
    """Every JSON number: the scanner's double is bit for bit float(json.loads(token)) (correctly rounded,
    the sign of zero kept for floats and dropped for integers), inf where that float overflows."""
    value = json.loads(token)
    try:
        expected = float(value)
    except OverflowError:  # a huge integer: the per-line rules reject it as out of range, so does inf
        expected = math.copysign(math.inf, value)
    got = scanned_latency(token)
    assert got is not None, token
    assert bits(got) == bits(expected), (token, got, expected)


@HYPO
@given(st.integers(-(10**18) + 1, 10**18 - 1))
def test_ts_integers_within_18_digits_are_exact(ts):
    batch = scanned(f'{{"service":"s","ts":{ts}}}'.encode(), 1)
    assert batch is not None and batch.column("ts")[0].as_py() == ts


KNOWN = st.fixed_dictionaries(
    {},
    optional={
        "ts": st.one_of(st.none(), st.integers(-(10**17), 10**17)),
        "service": st.one_of(
            st.none(), st.text(st.characters(min_codepoint=0x20, exclude_characters='"\\', exclude_categories=("Cs",)))
        ),
        "instance": st.one_of(st.none(), st.text("abc-_./ 0\u00e9\u4e2d", max_size=8)),
        "endpoint": st.one_of(st.none(), st.text("/api{}0é", max_size=8)),
        "latency_ms": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False), st.integers(-5, 10**6)),
        "status": st.one_of(st.none(), st.booleans()),
        "db_statement": st.one_of(st.none(), st.text("SELECT *", max_size=6)),
        # the optional trace id: the scanner keeps the text, validation decodes it (or rejects it)
        "trace_id": st.one_of(
            st.none(),
            st.binary(min_size=16, max_size=16).map(bytes.hex),
            st.sampled_from(["ABCDEF0123456789abcdef0123456789", "zz", ""]),
        ),
    },
)
SPACING = st.sampled_from([(",", ":"), (", ", ": "), (" ,\t", " :\r")])


@HYPO
@given(st.lists(st.tuples(KNOWN, SPACING), min_size=1, max_size=12), st.sampled_from([b"\n", b"\r\n"]), st.booleans())
def test_clean_blocks_are_scanned_with_the_per_line_result(records, ending, final):
    """Objects of known fields with unescaped values, any key order, any JSON spacing, nulls and absent
    fields: the scanner takes the block, and the fast path's result equals the per-line path's."""
    lines = [json.dumps(r, ensure_ascii=False, separators=sep).encode() for r, sep in records]
    data = ending.join(lines) + (ending if final else b"")
    assert scanned(data, len(lines)) is not None
    chunk = [line + ending for line in lines]
    fast = fast_jsonl_block(chunk, 0, data)
    assert fast is not None
    rejects: list = []
    expected = rows_to_batch(json_rows(enumerate(chunk, 1), lambda *r: rejects.append(r)))
    assert fast[0].equals(expected)
    assert [(line, reason) for line, _, reason in fast[1]] == [(line, reason) for line, _, reason in rejects]


OK = '"ts":1795255200000,"service":"svc","latency_ms":1.5'


@pytest.mark.parametrize(
    "line",
    [
        "{" + OK + ',"extra":1}',  # an unknown field: pyarrow's path or the per-line path decides
        "{" + OK + ',"ts":2}',  # a duplicate key: json.loads keeps the last
        "{" + OK + ',"trace_id":"a","trace_id":"b"}',
        "{" + OK + ',"trace_id":5}',  # a number for the trace id's text
        "{" + OK + ',"tr":"a"}',  # a key that starts as trace_id does
        '{"t\\u0073":1,"service":"s","latency_ms":1}',  # an escaped key
        "{" + OK + ',"instance":"a\\"b"}',  # an escape in a value
        "{" + OK + ',"instance":"a\tb"}',  # a control character
        '{"ts":1.0,"service":"s","latency_ms":1}',  # a float ts
        '{"ts":1e3,"service":"s","latency_ms":1}',
        '{"ts":"2026-11-21","service":"s","latency_ms":1}',  # an ISO ts
        '{"ts":1234567890123456789,"service":"s","latency_ms":1}',  # 19 digits
        "{" + OK + ',"status":1}',
        "{" + OK + ',"status":"true"}',
        '{"ts":1,"service":5,"latency_ms":1}',
        '{"ts":1,"service":"s","latency_ms":"1"}',
        '{"ts":1,"service":"s","latency_ms":NaN}',
        '{"ts":1,"service":"s","latency_ms":01}',
        '{"ts":1,"service":"s","latency_ms":1.}',
        '{"ts":1,"service":"s","latency_ms":.5}',
        '{"ts":1,"service":"s","latency_ms":1e}',
        '{"ts":1,"service":"s","latency_ms":+1}',
        "{" + OK + ',"status":tru}',
        "{" + OK + ',"status":nul}',
        "{" + OK + ",}",
        "{" + OK + "} ",
        " {" + OK + "}",
        "{" + OK + "}{" + OK + "}",
        "{" + OK,
        "[1]",
        "",
        "{" + OK + ',"x":' + "[" * 300 + "]" * 300 + "}",
    ],
)
def test_outside_the_subset_declines(line):
    ok = ("{" + OK + "}").encode()
    data = ok + b"\n" + line.encode() + b"\n" + ok + b"\n"
    assert scan(data, 3) is None
    assert scan(ok + b"\n" + ok + b"\n", 2) is not None


def test_ranges_of_lines():
    """scan(data, lines, start) reads up to ``lines`` lines from ``start`` and says where it stopped;
    scanned wants exactly the block's lines."""
    line = ("{" + OK + "}\n").encode()
    data = line * 3
    assert scan(data, 2)[:2] == (2 * len(line), 2)
    assert scan(data, 5)[:2] == (3 * len(line), 3)
    assert scan(data, 5, len(line))[:2] == (3 * len(line), 2)
    assert scan(data, 1, 1) is None  # not a line start
    assert scan(data, 1, len(data)) is None and scan(b"", 1) is None
    assert scanned(data, 3) is not None
    assert scanned(data, 2) is None and scanned(data, 4) is None
    tail = scanned(data[len(line) :], 2)
    assert tail is not None and tail.equals(scan_batch(data, len(line), 2))


def scan_batch(data: bytes, begin: int, count: int):
    from drainpipe.inputs.formats.jsonl_format import scan_range

    scanned = scan_range(data, begin, count)
    assert scanned is not None
    return scanned[2]


def test_without_the_extension_pyarrow_reads_the_same():
    """Without the scanner (a Spark executor unlike the build), pyarrow's reader takes the same clean block, with
    the same result."""
    from drainpipe import native

    lines = [json.dumps({"ts": 1795255200000 + i, "service": "s", "latency_ms": i / 7, "status": i % 2 == 0})
             for i in range(50)]  # fmt: skip
    chunk = [line.encode() + b"\n" for line in lines]
    with_scanner = fast_jsonl_block(chunk)
    with native.disabled("jsonscan"):
        without = fast_jsonl_block(chunk)
    assert with_scanner is not None and without is not None
    assert with_scanner[0].equals(without[0]) and with_scanner[1] == without[1] == []
