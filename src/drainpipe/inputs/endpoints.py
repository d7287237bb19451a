"""Endpoint normalization: raw paths into templates, so that one endpoint is one metric series, not one per user id.

Rules (``docs/pipeline.md``, "Endpoints"), applied to endpoints derived from raw paths (access logs, span names):

* the user's rules first (``[[endpoint_rule]]`` in the metrics TOML: ``pattern`` a Python regular expression,
  ``template`` its replacement, ``\\1`` for groups); the first rule whose pattern matches (``re.search``) rewrites the
  endpoint with ``re.sub`` and ends the rules;
* then every path segment that is an id becomes ``{id}``: an integer, a UUID, or a hex string of 16 or more digits
  (an object id, a hash). The query string is dropped.

:class:`EndpointRules` is plain frozen data (picklable: it travels to parser processes, worker processes and Spark
executors); :meth:`EndpointRules.normalize` memoizes per distinct input, bounded;
:meth:`EndpointRules.normalize_column` does a column of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import DefinitionError

__all__ = ["EndpointRules", "ID", "parse_endpoint_rules"]

ID = "{id}"
#: an id segment, ASCII only (RE2 reads the same expression in :meth:`EndpointRules.normalize_column`)
_ID = r"[0-9]+|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9a-fA-F]{16,}"
_ID_SEGMENT = re.compile(_ID)
#: an id segment between separators (a space before the path's first segment); a run of ids is replaced in two
#: passes, as each match takes the separator after its segment
_ID_BETWEEN = f"(?P<left>[ /])(?:{_ID})(?P<right>/|$)"
_CACHE = 65_536


@dataclass(frozen=True)
class EndpointRules:
    """``rules``: (pattern, template) pairs, tried in order; ``ids``: replace id segments with ``{id}``."""

    rules: tuple[tuple[str, str], ...] = ()
    ids: bool = True
    _compiled: tuple[tuple[re.Pattern[str], str], ...] = field(default=(), init=False, repr=False, compare=False)
    _cache: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        compiled = []
        for pattern, template in self.rules:
            try:
                compiled.append((re.compile(pattern), template))
            except re.error as exc:
                raise DefinitionError(f"endpoint_rule {pattern!r}: bad regular expression: {exc}") from None
        object.__setattr__(self, "_compiled", tuple(compiled))

    def __getstate__(self) -> dict[str, Any]:
        return {"rules": self.rules, "ids": self.ids}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "rules", state["rules"])
        object.__setattr__(self, "ids", state["ids"])
        object.__setattr__(self, "_cache", {})
        self.__post_init__()

    def normalize(self, endpoint: str) -> str:
        """The endpoint's template (see the module docstring). Thread-safe: the memo is a dict (atomic get/set
        under the GIL), emptied when it holds more than 65,536 entries."""
        cache = self._cache
        out = cache.get(endpoint)
        if out is None:
            if len(cache) >= _CACHE:
                cache.clear()
            out = cache[endpoint] = self._apply(endpoint)
        return out

    def normalize_column(self, raw: pa.Array) -> pa.Array:
        """:meth:`normalize` over a string column of ``METHOD path`` endpoints whose path has no space and no query
        (access logs): without user rules, the id segments are replaced in columns (RE2); with them, each distinct
        value goes through :meth:`normalize` once."""
        if self._compiled:
            encoded = pc.dictionary_encode(raw)
            assert isinstance(encoded, pa.DictionaryArray)
            normalize = self.normalize
            return pa.array([normalize(t) for t in encoded.dictionary.to_pylist()], pa.string()).take(encoded.indices)
        if not self.ids:
            return raw
        once = pc.replace_substring_regex(raw, _ID_BETWEEN, r"\1{id}\2")
        twice = pc.replace_substring_regex(once, _ID_BETWEEN, r"\1{id}\2")
        return pc.if_else(pc.match_substring(raw, "/"), twice, raw)

    def _apply(self, endpoint: str) -> str:
        endpoint = endpoint.split("?", 1)[0]
        for pattern, template in self._compiled:
            if pattern.search(endpoint):
                return pattern.sub(template, endpoint)
        if not self.ids or "/" not in endpoint:
            return endpoint
        # "GET /users/42": the method (if any) stays, each path segment is checked
        head, sep, path = endpoint.rpartition(" ")
        parts = path.split("/")
        changed = False
        for i, segment in enumerate(parts):
            if segment and _ID_SEGMENT.fullmatch(segment):
                parts[i] = ID
                changed = True
        if not changed:
            return endpoint
        return head + sep + "/".join(parts)


def parse_endpoint_rules(entries: Any, ids: Any = True, source: str = "<definitions>") -> EndpointRules:
    """``[[endpoint_rule]]`` tables (``pattern``, ``template``) and the ``endpoint_ids`` switch from the TOML."""
    if not isinstance(ids, bool):
        raise DefinitionError(f"{source}: endpoint_ids must be true or false, not {ids!r}")
    if not isinstance(entries, list):
        raise DefinitionError(f"{source}: endpoint_rule must be written as [[endpoint_rule]] tables")
    rules = []
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) != {"pattern", "template"}:
            raise DefinitionError(f"{source}: [[endpoint_rule]] needs exactly pattern and template")
        if not all(isinstance(entry[k], str) for k in ("pattern", "template")):
            raise DefinitionError(f"{source}: endpoint_rule pattern and template must be strings")
        rules.append((entry["pattern"], entry["template"]))
    return EndpointRules(tuple(rules), ids)
