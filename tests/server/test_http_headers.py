"""The lean header reader gives what the standard library's email-based one gives for the headers a client sends,
and refuses what it refuses (431)."""

from __future__ import annotations

import http.client
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe.errors import RequestRefused
from drainpipe.server.http_headers import MAX_HEADERS, MAX_LINE, read_headers

NAMES = st.sampled_from(["Content-Type", "content-length", "Content-Encoding", "Authorization", "Accept",
                         "Connection", "Expect", "Transfer-Encoding", "X-Custom", "HOST"])  # fmt: skip
# values as clients send them: visible ASCII and spaces, any leading blanks (dropped by both readers; trailing ones kept)
VALUES = st.tuples(st.sampled_from(["", " ", "  ", "\t"]),
                   st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=30),
                   st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20))  # fmt: skip


def _section(pairs: list[tuple[str, str]], end: bytes = b"\r\n") -> bytes:
    return b"".join(f"{n}:{v}".encode("iso-8859-1") + end for n, v in pairs) + end


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(NAMES, VALUES.map(lambda t: t[0] + t[1] + t[2])), max_size=12), st.sampled_from([b"\r\n", b"\n"])
)
def test_the_headers_read_as_the_standard_library_reads_them(pairs: list[tuple[str, str]], end: bytes) -> None:
    data = _section(pairs, end) + b"BODY"
    ours_file, theirs_file = io.BytesIO(data), io.BytesIO(data)
    ours, theirs = read_headers(ours_file), http.client.parse_headers(theirs_file)
    assert ours_file.read() == theirs_file.read() == b"BODY"  # the body starts where it did
    for name in {n for n, _ in pairs} | {"Missing"}:
        for variant in (name, name.lower(), name.upper()):
            assert ours.get(variant) == theirs.get(variant)
            assert ours.get(variant, "x") == theirs.get(variant, "x")
            assert ours.get_all(variant) == theirs.get_all(variant)
            assert (variant in ours) == (variant in theirs)


def test_a_folded_line_continues_the_value_and_a_line_without_a_name_is_skipped() -> None:
    headers = read_headers(
        io.BytesIO(b"X-A: one\r\n  two\r\nno colon here\r\n: empty\r\nBad Name: v\r\nX-B: b\r\n\r\n")
    )
    assert headers.get("x-a") == "one two"
    assert headers.get("x-b") == "b"
    assert headers.items() == [("x-a", "one two"), ("x-b", "b")]


def test_the_end_of_the_stream_ends_the_section() -> None:
    assert read_headers(io.BytesIO(b"Host: h\r\n")).get("host") == "h"


@pytest.mark.parametrize(
    "data, message",
    [
        (b"X: " + b"a" * MAX_LINE + b"\r\n\r\n", "Line too long"),
        (b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS + 1)) + b"\r\n", "Too many headers"),
    ],
)
def test_what_the_standard_library_refuses_is_refused_with_431(data: bytes, message: str) -> None:
    with pytest.raises(http.client.HTTPException):
        http.client.parse_headers(io.BytesIO(data))
    with pytest.raises(RequestRefused) as caught:
        read_headers(io.BytesIO(data))
    assert (caught.value.status, caught.value.message) == (431, message)
    read_headers(io.BytesIO(b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS)) + b"\r\n"))  # at the limit
