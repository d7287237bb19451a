"""``POST /v1/events``: its content types and its answers, in one place for the two ways a request is served (a
request thread, :mod:`.http`, and the connection loop, :mod:`.http_loop`), so both answer alike, byte for byte.

A body is NDJSON (``application/x-ndjson`` and its aliases: a line each) or a JSON array (``application/json``:
an element each). The answer of a logged body is a JSON object: ``accepted``, ``rejected``, the rejects counted
by ``reasons``, the first :data:`MAX_ERRORS` of them with their ``line`` (NDJSON, 1-based) or ``index`` (an
array, 0-based), and the ``warnings`` (accepted events whose odd optional field was dropped, by reason). An error
is ``{"error": message, "status": status}``.
"""

from __future__ import annotations

import json
from typing import Any

from .bodies import Decoded

__all__ = ["EVENTS_TYPE", "JSON_TYPES", "MAX_ERRORS", "NDJSON_TYPES", "error_answer", "event_form", "events_answer"]

NDJSON_TYPES = frozenset({"application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines"})
JSON_TYPES = frozenset({"application/json"})
EVENTS_TYPE = "application/json"  # the answers' content type
MAX_ERRORS = 20


def event_form(content_type: str) -> str:
    """The body form (:data:`~.bodies.FORMS`) of a ``/v1/events`` body of ``content_type`` (lowercase, without
    parameters): ``"array"``, ``"ndjson"``, or ``""`` for a type the route does not take (415)."""
    return "array" if content_type in JSON_TYPES else "ndjson" if content_type in NDJSON_TYPES else ""


def _json(obj: Any) -> bytes:
    return json.dumps(obj, allow_nan=False, separators=(",", ":")).encode()


def events_answer(decoded: Decoded, *, array: bool) -> bytes:
    """The 200 answer of a logged body (``array``: a JSON array's, whose rejects are numbered by ``index``)."""
    rejects = decoded.rejects
    reasons: dict[str, int] = {}
    for _, reason in rejects:
        reasons[reason] = reasons.get(reason, 0) + 1
    key = "index" if array else "line"
    return _json(
        {
            "accepted": decoded.accepted,
            "rejected": len(rejects),
            "reasons": reasons,
            "errors": [{key: i, "reason": reason} for i, reason in rejects[:MAX_ERRORS]],
            "warnings": dict(decoded.warnings),
        }
    )


def error_answer(status: int, message: str) -> bytes:
    """An error's answer."""
    return _json({"error": message, "status": status})
