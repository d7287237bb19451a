"""A place in an input file (where a part starts or ends, how far a file is applied)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Position:
    """``offset`` bytes and ``lines`` physical lines before this place (JSON Lines, CSV), or ``offset`` rows
    (Parquet, where ``lines`` is the same number)."""

    offset: int = 0
    lines: int = 0
