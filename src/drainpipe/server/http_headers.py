"""A request's header section, read without the email parser: what ``serve``'s request threads do per request.

The standard library reads headers through ``email.parser`` (a feed parser, a policy, a message object): 58 us for
the six or so headers a client sends, against 16 us here (a fifth of a request thread's time holding the interpreter
lock in a profile under an OTLP load; about 2% of the spans/s unprofiled). :func:`read_headers` reads the same lines
under the same limits (:data:`MAX_LINE` bytes a line, fewer than :data:`MAX_HEADERS` lines) and splits them as the
email parser does, with its answers: lines end at CRLF, CR or LF; the section ends at an empty line or at the first
line that is no header (a name of visible ASCII but the colon, then a colon), and what follows is ignored; a folded
line continues the value before it as it was sent; a line that starts with its colon names no header; leading blanks
of a value are dropped, its line end cut. :class:`Headers` answers what the handler asks of them: ``get``,
``get_all`` and ``in``, names case-insensitive. A property test holds it to ``http.client.parse_headers`` over
arbitrary bytes, so that no header (a framing one above all) is read where the standard library read none, or the
other way round.

Not thread-safe, and need not be: a handler reads its own request's headers.
"""

from __future__ import annotations

import re
from typing import Protocol, TypeVar

from ..errors import RequestRefused

__all__ = ["MAX_HEADERS", "MAX_LINE", "Headers", "read_headers"]

MAX_LINE = 65536  # the standard library's limit (http.client._MAXLINE)
MAX_HEADERS = 100  # likewise (http.client._MAXHEADERS)
#: the start of a header line as the email parser knows one (its ``headerRE``); any other line ends the section
_HEADER = re.compile(r"From |[\x21-\x39\x3b-\x7e]*:|[\t ]")
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")  # a line ends at CRLF, CR or LF (the email parser's split)
T = TypeVar("T")


class _Lines(Protocol):
    def readline(self, size: int = -1, /) -> bytes: ...


class Headers:
    """A request's headers: ``get(name, default)`` the first value, ``get_all(name, failobj)`` every value in order,
    ``name in headers``; names case-insensitive."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[str, list[str]] = {}

    def add(self, name: str, value: str) -> None:
        self._values.setdefault(name.lower(), []).append(value)

    def get(self, name: str, default: T = None) -> str | T:  # type: ignore[assignment]
        values = self._values.get(name.lower())
        return values[0] if values else default

    def get_all(self, name: str, failobj: T = None) -> list[str] | T:  # type: ignore[assignment]
        values = self._values.get(name.lower())
        return list(values) if values else failobj

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._values

    def items(self) -> list[tuple[str, str]]:
        return [(name, value) for name, values in self._values.items() for value in values]

    def __repr__(self) -> str:
        return f"Headers({self.items()!r})"


def read_headers(rfile: _Lines) -> Headers:
    """Read a header section up to and including its empty line (or the end of the stream). Raises
    :class:`RequestRefused` 431 for a line longer than :data:`MAX_LINE` or :data:`MAX_HEADERS` lines or more
    (the empty line counted), as the standard library refuses them."""
    raw: list[bytes] = []
    while True:  # the lines, as http.client reads them
        line = rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise RequestRefused(431, "Line too long")
        raw.append(line)
        if len(raw) > MAX_HEADERS:
            raise RequestRefused(431, "Too many headers")
        if line in (b"\r\n", b"\n", b""):
            break
    headers = Headers()
    text = b"".join(raw).decode("iso-8859-1")
    name, value = "", ""
    for match in _LINE.finditer(text):
        piece = match.group()
        if not _HEADER.match(piece):  # an empty line, or one that is no header: the section ends (the rest ignored)
            break
        if piece[0] in " \t":  # an obsolete fold: more of the value before (none: ignored)
            value += piece
            continue
        if name:
            headers.add(name, value.rstrip("\r\n"))
            name = ""
        if piece.startswith("From "):  # the email parser's envelope line: no header
            continue
        field, _, rest = piece.partition(":")
        if field:  # (a line that starts with its colon names no header)
            name, value = field, rest.lstrip(" \t")
    if name:
        headers.add(name, value.rstrip("\r\n"))
    return headers
