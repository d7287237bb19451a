"""Typed stub of the C extension ``drainpipe.native._jsonscan`` (source and its rules: ``_jsonscan.c``)."""

def scan(data: bytes, lines: int, start: int = 0, /) -> tuple[int, int, tuple[tuple, ...]] | None:
    """Up to ``lines`` JSON Lines of ``data`` (UTF-8, checked by the caller) from offset ``start``: ``(end
    offset, lines read, columns)``, columns as one ``(null count, validity bitmap or None, value buffers...)``
    per event field in the event schema's order; None when a line is outside the scanner's strict subset of
    JSON (the caller then reads the block another way)."""
