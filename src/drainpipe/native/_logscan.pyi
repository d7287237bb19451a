"""Typed stub of the C extension ``drainpipe.native._logscan`` (source and its rules: ``_logscan.c``)."""

def scan(
    data: bytes | memoryview, count: int, program: tuple[tuple[str, str], ...], quoted: tuple[bool, ...], ids: bool, /
) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes | None, bytes | None] | None:
    """``count`` whole lines of ``data`` read by a log format's program: ``(good, blank, ts, latency, status,
    endpoint offsets, endpoint values, instance offsets, instance values)``: numpy buffers (uint8, uint8, int64,
    float64, uint8) and Arrow string buffers (int32 offsets, values); the endpoint's id segments written ``{id}``
    when ``ids``. None when a byte is not ASCII or a step's role is unknown."""
