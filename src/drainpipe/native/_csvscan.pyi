"""Typed stub of the C extension ``drainpipe.native._csvscan`` (source and its rules: ``_csvscan.c``)."""

def scan(data: bytes | memoryview, begin: int, records: int, final: bool, /) -> tuple[bytes, int, bool]:
    """The ends of up to ``records`` CSV records of ``data`` from ``begin`` (int64 offsets after each record's
    newline), the newlines from ``begin`` to the last end, and whether the record after the last end is not
    well-formed (``final``: the data ends the file). Scanning stops at the first record that is not well-formed."""

def columns(data: bytes, fields: bytes, records: int, begin: int, /) -> tuple[int, int, int, tuple] | None:
    """Up to ``records`` well-formed records of ``data`` from ``begin`` typed into the event fields' column buffers
    (per field: null count, validity bitmap or None, value buffers...; ``fields``: per CSV column, the field it feeds
    or 255): ``(end offset, records read, newlines read, columns)``, or None where the reference might type a cell
    otherwise (see ``_csvscan.c``)."""
