"""Typed stub of the C extension ``drainpipe.native._crc32`` (source: ``_crc32.c``, which states the contract)."""

def crc32(data: bytes | bytearray | memoryview, value: int = 0, /) -> int:
    """What ``zlib.crc32(data, value)`` returns."""
