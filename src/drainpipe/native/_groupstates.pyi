"""Typed stub of the C extension ``drainpipe.native._groupstates`` (source: ``_groupstates.c``, which states the
contracts)."""

from typing import Any

COUNT: int
SUM: int
MIN: int
MAX: int
SLA: int
APDEX: int

def groups(services: Any, subs: Any, excluded: int, ts: Any, width_ms: int, /) -> tuple[bytearray, bytearray]:
    """Dense group ids (int64 per row, -1: no group) of the rows' (service, sub, slot) keys in key order, and a row of
    each group."""

def states(
    function: int, gid: Any, size: int, values: Any, status: Any, weights: Any, threshold: float, /
) -> tuple[bytearray, ...]:
    """One metric's states per group: ``(n, ...)`` as int64 / float64 arrays."""

def histogram(
    gid: Any, size: int, values: Any, weights: Any, precision: float, /
) -> tuple[bytearray, bytearray, bytearray] | None:
    """``(group, bin, n)`` per (group, bin) pair that occurs, in that order; None for a NaN value, or bins spanning
    more than the dense table's limit."""

def encode(chunks: Any, /) -> tuple[bytearray, bytearray]:
    """A string column's int32 codes per row, in the order its values first occur, and each code's first row
    (int64); chunks: ``(offsets, data, offset, length, validity)`` each (``_strings.h``)."""

def gather(parts: Any, separator: bytes, /) -> tuple[bytearray, bytearray]:
    """String values by row, each part's ``(chunks, rows)`` joined by ``separator``: int32 offsets and data."""
