"""How long a store keeps what: retention per granularity, and the cut-offs a purge deletes below.

Defaults (the metrics TOML's ``[retention]`` table, or ``--retention GRANULARITY=DURATION`` flags, override them):

* ``minute = "7d"``: per-minute rows are most of a store (a row per entity, metric and minute: 1,440 a day each)
  and serve incident analysis, which looks back days, not months. SkyWalking's OAP keeps metrics 7 days by default.
* ``hour = "90d"``: a quarter of hourly trends for capacity and week-over-week comparisons, at 1/60 of the rows.
* ``day = "800d"``: daily rows are few (one per entity, metric and day); two years and a bit allow year-over-year.
* ``topn = "7d"``: the slowest statements per 10 minutes belong with the minutes they explain.

The store's books (``source_progress``: how far each input is applied, which makes re-runs and retries exactly
once) are pruned on the same terms: a progress row goes once it was recorded longer ago than the longest of these
retentions. Its data are older still (data are applied after they happen), so every state they brought is purged
at every granularity: applying the same input again could only bring back rows the next purge deletes, never count
anything twice that is still kept.

A duration is a number and a unit, ``s m h d w``, or ``"forever"`` (never purged; then the books are never pruned
either).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from ..errors import DefinitionError

__all__ = ["FOREVER", "Retention", "parse_duration", "parse_retention", "parse_retention_flag"]

_DAY_MS = 86_400_000
_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": _DAY_MS, "w": 7 * _DAY_MS}
_DURATION = re.compile(r"\s*(\d+)\s*([smhdw])\s*\Z")
FOREVER = "forever"


@dataclass(frozen=True)
class Retention:
    """Milliseconds each kind of row is kept (None: forever). Immutable; thread-safe."""

    minute: int | None = 7 * _DAY_MS
    hour: int | None = 90 * _DAY_MS
    day: int | None = 800 * _DAY_MS
    topn: int | None = 7 * _DAY_MS

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise DefinitionError(f"retention {f.name} must be a positive duration, not {value!r}")

    def metric_cutoffs(self, now_ms: int) -> dict[str, int]:
        """Per granularity with a retention: the bucket start (epoch ms) below which its rows are purged."""
        return {g: now_ms - keep for g in ("minute", "hour", "day") if (keep := getattr(self, g)) is not None}

    def topn_cutoff(self, now_ms: int) -> int | None:
        return None if self.topn is None else now_ms - self.topn

    def books_cutoff(self, now_ms: int) -> int | None:
        """The record time (epoch ms) below which the store's progress rows (its books) are pruned; None when
        anything is kept forever."""
        kept = [getattr(self, f.name) for f in fields(self)]
        return None if any(k is None for k in kept) else now_ms - max(k for k in kept if k is not None)

    def with_overrides(self, overrides: dict[str, int | None]) -> Retention:
        unknown = sorted(set(overrides) - {f.name for f in fields(self)})
        if unknown:
            raise DefinitionError(f"unknown retention {unknown[0]!r} (expected minute, hour, day or topn)")
        return Retention(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **overrides})

    def with_flags(self, flags: Iterable[str]) -> Retention:
        """This retention overridden by ``--retention GRANULARITY=DURATION`` flags (:class:`DefinitionError`, one
        line, for a bad one)."""
        return self.with_overrides(dict(parse_retention_flag(f) for f in flags))

    def describe(self) -> str:
        return ", ".join(f"{f.name} {_format(getattr(self, f.name))}" for f in fields(self))


def parse_duration(text: Any, what: str = "duration") -> int | None:
    """``"7d"``, ``"12h"``, ``"90m"``, ``"2w"``, ``"30s"`` as milliseconds; ``"forever"`` as None."""
    if isinstance(text, str) and text.strip().lower() == FOREVER:
        return None
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None or int(match.group(1)) == 0:
        raise DefinitionError(f"{what}: expected a duration like 7d, 12h, 90m, 2w or 'forever', not {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


def parse_retention(table: Any, source: str = "<definitions>") -> Retention:
    """The metrics TOML's ``[retention]`` table (keys minute, hour, day, topn; values durations)."""
    if not isinstance(table, dict):
        raise DefinitionError(f"{source}: retention must be a table: [retention]")
    overrides = {key: parse_duration(value, f"{source}: [retention] {key}") for key, value in table.items()}
    try:
        return Retention().with_overrides(overrides)
    except DefinitionError as exc:
        raise DefinitionError(f"{source}: [retention] {exc}") from None


def parse_retention_flag(text: str) -> tuple[str, int | None]:
    """``GRANULARITY=DURATION`` (a ``--retention`` flag) as (key, milliseconds or None)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise DefinitionError(f"--retention {text!r}: expected GRANULARITY=DURATION, e.g. minute=7d")
    return key.strip(), parse_duration(value, f"--retention {key.strip()}")


def _format(ms: int | None) -> str:
    if ms is None:
        return FOREVER
    for unit in ("d", "h", "m", "s"):
        if ms % _UNITS[unit] == 0:
            return f"{ms // _UNITS[unit]}{unit}"
    return f"{ms}ms"
