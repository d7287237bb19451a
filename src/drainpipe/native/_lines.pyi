"""Typed stub of the C extension ``drainpipe.native._lines`` (source: ``_lines.c``)."""

def nth(data: bytes | bytearray | memoryview, start: int, stop: int, n: int, /) -> tuple[int, int]:
    """In ``data[start:stop]``: ``(offset after the n-th newline, n)`` if it holds ``n`` (>= 1) newlines, else
    ``(-1, the newlines it holds)``."""
