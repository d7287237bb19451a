"""A request's header section, read without the email parser: what ``serve``'s request threads do per request.

The standard library reads headers through ``email.parser`` (a feed parser, a policy, a message object): about a
fifth of a request thread's time holding the interpreter lock under an OTLP load, for the six or so headers a
client sends. :func:`read_headers` reads the same lines under the same limits (:data:`MAX_LINE` bytes a line,
:data:`MAX_HEADERS` lines) into :class:`Headers`, which answers what the handler asks of a header section: ``get``,
``get_all`` and ``in``, names case-insensitive, values as the standard library gives them (leading blanks dropped,
the line's end cut). An obsolete folded line (one that starts with a blank) continues the value before it, joined
by a space (RFC 9112 5.2). A line without a colon, or whose name is empty or holds a blank, names no header and is
skipped (the standard library stopped reading headers at such a line and dropped the ones after it).

Not thread-safe, and need not be: a handler reads its own request's headers.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from ..errors import RequestRefused

__all__ = ["MAX_HEADERS", "MAX_LINE", "Headers", "read_headers"]

MAX_LINE = 65536  # the standard library's limit (http.client._MAXLINE)
MAX_HEADERS = 100  # likewise (http.client._MAXHEADERS)
_BLANKS = b" \t"
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
    :class:`RequestRefused` 431 for a line longer than :data:`MAX_LINE` or more than :data:`MAX_HEADERS` lines, as
    the standard library refuses them."""
    headers = Headers()
    name = value = ""
    lines = 0
    while True:
        line = rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise RequestRefused(431, "Line too long")
        if line in (b"\r\n", b"\n", b""):
            break
        lines += 1
        if lines > MAX_HEADERS:
            raise RequestRefused(431, "Too many headers")
        text = line.decode("iso-8859-1").rstrip("\r\n")
        if line[0] in _BLANKS:  # an obsolete fold: more of the value before
            if name:
                more = text.strip(" \t")
                value = f"{value} {more}" if value else more
            continue
        if name:
            headers.add(name, value)
        field, colon, rest = text.partition(":")
        if not colon or not field or " " in field or "\t" in field:
            name = ""  # names no header (see the module docstring)
            continue
        name, value = field, rest.lstrip(" \t")
    if name:
        headers.add(name, value)
    return headers
