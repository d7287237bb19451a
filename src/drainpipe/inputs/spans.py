"""Which spans are requests and which attributes give each event field: the ``[spans]`` table of the metrics TOML.

Plain data with no protobuf import, so that definitions (which carry it) load anywhere, Spark executors included;
:mod:`.otlp` applies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import DefinitionError

__all__ = ["KINDS", "SpanMapping", "parse_span_mapping"]

#: OTLP's SpanKind values by the names the TOML uses
KINDS = {"internal": 1, "server": 2, "client": 3, "producer": 4, "consumer": 5}


@dataclass(frozen=True)
class SpanMapping:
    """Which spans are requests, and which attributes give each event field (first present wins)."""

    request_kinds: tuple[str, ...] = ("server", "consumer")
    service: tuple[str, ...] = ("service.name",)
    instance: tuple[str, ...] = ("service.instance.id", "host.name")
    endpoint: tuple[str, ...] = ("http.route",)
    http_status: tuple[str, ...] = ("http.response.status_code", "http.status_code")
    statement: tuple[str, ...] = ("db.query.text", "db.statement")
    #: keep each request's trace id (the batch's ``trace_id`` column): the metrics TOML's ``[prometheus] exemplars``
    trace_ids: bool = False

    def __post_init__(self) -> None:
        for name in ("request_kinds", "service", "instance", "endpoint", "http_status", "statement"):
            value = getattr(self, name)
            if isinstance(value, list):
                value = tuple(value)
                object.__setattr__(self, name, value)
            if not isinstance(value, tuple) or not all(isinstance(v, str) and v for v in value):
                raise DefinitionError(f"[spans] {name} must be a list of attribute names, not {value!r}")
        unknown = [k for k in self.request_kinds if k not in KINDS]
        if unknown:
            raise DefinitionError(f"[spans] request_kinds: unknown kind {unknown[0]!r} (kinds: {', '.join(KINDS)})")


def parse_span_mapping(table: Any, source: str = "<definitions>") -> SpanMapping:
    """The metrics TOML's ``[spans]`` table."""
    if not isinstance(table, dict):
        raise DefinitionError(f"{source}: spans must be a table: [spans]")
    allowed = ("request_kinds", "service", "instance", "endpoint", "http_status", "statement")
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise DefinitionError(f"{source}: [spans] unknown key {unknown[0]!r} (allowed: {', '.join(allowed)})")
    try:
        lists: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in table.items()}
        return SpanMapping(**lists)
    except DefinitionError as exc:
        raise DefinitionError(f"{source}: {exc}") from None
