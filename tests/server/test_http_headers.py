"""The lean header reader gives what the standard library's email-based one gives, whatever the bytes (a framing
header read by one and not the other would be a smuggling gap), and refuses what it refuses (431)."""

from __future__ import annotations

import http.client
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe.errors import RequestRefused
from drainpipe.server.http_headers import MAX_HEADERS, MAX_LINE, read_headers

NAMES = ["Content-Type", "content-length", "Content-Encoding", "Authorization", "Accept", "Connection", "Expect",
         "Transfer-Encoding", "X-Custom", "HOST", "From", ""]  # fmt: skip
# pieces of header sections as clients (and attackers) send them: names, colons, blanks, folds, bare CR and LF,
# bytes past ASCII, controls, the email parser's envelope line
PIECES = st.one_of(
    st.sampled_from([n.encode() for n in NAMES]),
    st.sampled_from(
        [
            b":",
            b": ",
            b" ",
            b"\t",
            b"\r\n",
            b"\n",
            b"\r",
            b"\r\n ",
            b"\r\n\t",
            b"From ",
            b"chunked",
            b"5",
            b"gzip",
            b" : ",
            b"\x00",
            b"\xe9",
            b"\x7f",
            b"\x1f",
        ]
    ),  # fmt: skip
    st.binary(max_size=6),
)
LINES = st.lists(st.lists(PIECES, max_size=6).map(b"".join), max_size=12)


def _both(data: bytes) -> tuple[object, object, bytes, bytes]:
    ours_file, theirs_file = io.BytesIO(data), io.BytesIO(data)
    return read_headers(ours_file), http.client.parse_headers(theirs_file), ours_file.read(), theirs_file.read()


@settings(max_examples=600, deadline=None)
@given(LINES, st.sampled_from([b"\r\n", b"\n"]), st.booleans())
def test_any_header_section_reads_as_the_standard_library_reads_it(lines: list[bytes], end: bytes, ended: bool) -> None:
    data = b"".join(line.replace(b"\n", b" ") + end for line in lines) + (end + b"BODY" if ended else b"")
    ours, theirs, rest_ours, rest_theirs = _both(data)
    assert rest_ours == rest_theirs  # the body starts where it did
    names = {n for n in NAMES if n} | {k for k in theirs.keys()}  # type: ignore[attr-defined]
    for name in names:
        for variant in (name, name.lower(), name.upper()):
            assert ours.get(variant) == theirs.get(variant)  # type: ignore[attr-defined]
            assert ours.get_all(variant) == theirs.get_all(variant)  # type: ignore[attr-defined]
            assert (variant in ours) == (variant in theirs)  # type: ignore[operator]


@pytest.mark.parametrize(
    "data",
    [
        b"X-A: one\r\n  two\r\nX-B: b\r\n\r\n",  # a fold, kept as sent
        b"Transfer-Encoding : chunked\r\nContent-Length: 10\r\n\r\n",  # a blank before the colon ends the section
        b"X: a\rTransfer-Encoding: chunked\r\n\r\n",  # a bare CR ends a line
        b"X: a\r\r\nContent-Length: 5\r\n\r\n",  # ... and may make an empty one
        b": empty\r\n continued\r\nX-B: b\r\n\r\n",  # a line without a name, and its fold, name nothing
        b"From someone\r\nX-B: b\r\n\r\n",
        b"X\x00Y: v\r\nContent-Length: 5\r\n\r\n",
        b"\xe9t\xe9: v\r\nX-B: \xe9\r\n\r\n",
        b"Host: h",  # the end of the stream ends the section
    ],
)
def test_odd_sections_read_as_the_standard_library_reads_them(data: bytes) -> None:
    ours, theirs, rest_ours, rest_theirs = _both(data)
    assert rest_ours == rest_theirs
    keys = {k.lower() for k in theirs.keys()} | {"content-length", "transfer-encoding", "x-a", "x-b", "host"}  # type: ignore[attr-defined]
    for name in keys:
        assert ours.get_all(name) == theirs.get_all(name)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "data, message",
    [
        (b"X: " + b"a" * MAX_LINE + b"\r\n\r\n", "Line too long"),
        (b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS)) + b"\r\n", "Too many headers"),
    ],
)
def test_what_the_standard_library_refuses_is_refused_with_431(data: bytes, message: str) -> None:
    with pytest.raises(http.client.HTTPException):
        http.client.parse_headers(io.BytesIO(data))
    with pytest.raises(RequestRefused) as caught:
        read_headers(io.BytesIO(data))
    assert (caught.value.status, caught.value.message) == (431, message)


def test_the_most_header_lines_the_standard_library_takes_are_taken() -> None:
    data = b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS - 1)) + b"\r\n"
    ours, theirs, _, _ = _both(data)
    assert ours.get("x-98") == theirs.get("x-98") == "v"  # type: ignore[attr-defined]
