"""Alert rules over stored metrics: what ``[[alert]]`` tables in the metrics TOML mean, and how one rule is evaluated.

A rule names a metric, an entity pattern, a comparison and how many periods in a row it must hold::

    [[alert]]
    name = "checkout slow"
    metric = "service_resp_time"    # a [[metric]] of the same file
    entity = "checkout*"            # shell-style pattern over the entity (default "*")
    op = ">"                        # >, >=, <, <=
    threshold = 250.0
    for = 3                         # periods in a row (default 1)
    granularity = "minute"          # minute (default), hour or day
    label = "p99"                   # percentile metrics: which of p50 p75 p90 p95 p99 (required for them)

Evaluation (:func:`evaluate`) is over *persisted* values only, and only over *complete* periods: a bucket counts
once it ended ``settle_ms`` ago (so that its last events are merged; an incomplete minute's cpm is too low). An
entity is in breach when each of the ``for`` latest complete periods has a stored value and every value breaches.
A period without a stored value (no traffic) is not a breach: a rule of "errors > 5" does not fire on silence, and
a firing alert whose entity goes quiet resolves. Evaluation is a pure function of the stored rows and the time, so
state lost in a restart is re-derived from the store.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import DefinitionError
from .buckets import GRANULARITY_MS, PERCENTILE_LABELS

__all__ = ["AlertRule", "Breach", "parse_alert_rules", "evaluate", "complete_buckets", "rule_fields"]

_OPS: dict[str, Callable[[float, float], bool]] = {">": operator.gt, ">=": operator.ge, "<": operator.lt,
                                                   "<=": operator.le}  # fmt: skip
_KEYS = ("name", "metric", "threshold", "op", "entity", "for", "granularity", "label")


@dataclass(frozen=True)
class AlertRule:
    """One ``[[alert]]`` table; see the module docstring. ``periods`` is the TOML key ``for``."""

    name: str
    metric: str
    threshold: float
    op: str = ">"
    entity: str = "*"
    periods: int = 1
    granularity: str = "minute"
    label: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise DefinitionError("an alert needs a name")
        if self.op not in _OPS:
            raise DefinitionError(f"alert {self.name!r}: op must be one of {', '.join(_OPS)}, not {self.op!r}")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)):
            raise DefinitionError(f"alert {self.name!r}: threshold must be a number, not {self.threshold!r}")
        if isinstance(self.periods, bool) or not isinstance(self.periods, int) or not 1 <= self.periods <= 1440:
            raise DefinitionError(f"alert {self.name!r}: for must be a whole number of periods, 1 to 1440")
        if self.granularity not in GRANULARITY_MS:
            raise DefinitionError(f"alert {self.name!r}: granularity must be minute, hour or day")
        if not isinstance(self.entity, str) or not self.entity:
            raise DefinitionError(f'alert {self.name!r}: entity must be a pattern such as "checkout*"')
        object.__setattr__(self, "threshold", float(self.threshold))
        object.__setattr__(self, "_match", re.compile(fnmatch.translate(self.entity)).match)

    @property
    def period_ms(self) -> int:
        return GRANULARITY_MS[self.granularity]

    def matches(self, entity: str) -> bool:
        return self._match(entity) is not None  # type: ignore[attr-defined]

    def breaches(self, value: float) -> bool:
        return _OPS[self.op](value, self.threshold)

    def describe(self) -> str:
        label = f"[{self.label}]" if self.label else ""
        return f"{self.metric}{label} {self.op} {self.threshold:g} for {self.periods} {self.granularity}(s)"


@dataclass(frozen=True)
class Breach:
    """How one entity stands against one rule at one evaluation: ``breaching`` or not, with the value of the latest
    complete period (None when nothing is stored for it) and that period's bucket start (epoch ms)."""

    rule: AlertRule
    entity: str
    breaching: bool
    value: float | None
    bucket_ms: int


def parse_alert_rules(entries: Any, source: str, metrics: dict[str, str]) -> tuple[AlertRule, ...]:
    """The ``[[alert]]`` tables; ``metrics``: metric name -> function of the definitions they refer to."""
    if not isinstance(entries, list):
        raise DefinitionError(f"{source}: alerts must be written as [[alert]] tables")
    rules: list[AlertRule] = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise DefinitionError(f"{source}: [[alert]] must be a table")
        label = f"alert {entry.get('name')!r}"
        unknown = sorted(set(entry) - set(_KEYS))
        if unknown:
            raise DefinitionError(f"{source}: {label}: unknown key {unknown[0]!r} (allowed: {', '.join(_KEYS)})")
        missing = [k for k in _KEYS[:3] if k not in entry]
        if missing:
            raise DefinitionError(f"{source}: {label}: missing {missing[0]}")
        fields = {("periods" if k == "for" else k): v for k, v in entry.items()}
        try:
            rule = AlertRule(**fields)
        except DefinitionError as exc:
            raise DefinitionError(f"{source}: {exc}") from None
        function = metrics.get(rule.metric)
        if function is None:
            raise DefinitionError(f"{source}: {label}: no metric {rule.metric!r} is defined")
        if (function == "percentile") != bool(rule.label):
            raise DefinitionError(
                f"{source}: {label}: " + (f"a percentile metric needs label, one of {', '.join(PERCENTILE_LABELS)}"
                                          if function == "percentile" else "label is for percentile metrics only")
            )  # fmt: skip
        if rule.label and rule.label not in PERCENTILE_LABELS:
            raise DefinitionError(f"{source}: {label}: label must be one of {', '.join(PERCENTILE_LABELS)}")
        if any(r.name == rule.name for r in rules):
            raise DefinitionError(f"{source}: duplicate alert name {rule.name!r}")
        rules.append(rule)
    return tuple(rules)


def complete_buckets(rule: AlertRule, now_ms: int, settle_ms: int) -> list[int]:
    """The starts (epoch ms) of the ``for`` latest periods that ended at least ``settle_ms`` before ``now_ms``,
    oldest first."""
    period = rule.period_ms
    last = (now_ms - settle_ms) // period * period - period
    return [last - i * period for i in range(rule.periods - 1, -1, -1)]


def evaluate(
    rule: AlertRule, rows: Iterable[Sequence[Any]], buckets: Sequence[int], also: Iterable[str] = ()
) -> list[Breach]:
    """Each matching entity's standing. ``rows``: stored ``(entity, bucket_ms, label, value)`` of the rule's metric
    and granularity covering ``buckets`` (from :func:`complete_buckets`); ``also``: entities to report even without
    rows (those firing, so that they can resolve)."""
    wanted = set(buckets)
    values: dict[str, dict[int, float]] = {}
    for entity, bucket, label, value in rows:
        if bucket in wanted and label == rule.label and rule.matches(entity):
            values.setdefault(entity, {})[bucket] = float(value)
    out = []
    for entity in sorted(set(values) | {e for e in also if rule.matches(e)}):
        seen = values.get(entity, {})
        breaching = all(b in seen and rule.breaches(seen[b]) for b in buckets)
        out.append(Breach(rule, entity, breaching, seen.get(buckets[-1]), buckets[-1]))
    return out


def rule_fields(rule: AlertRule) -> dict[str, Any]:
    """A rule as JSON-able fields (for notifications and the stats view), ``for`` as the TOML names it."""
    fields = dataclasses.asdict(rule)
    fields["for"] = fields.pop("periods")
    return fields
