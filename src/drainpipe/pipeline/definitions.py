"""Metric and top-N definitions: the data model, the built-in default set and the TOML loader.

Contract (``docs/pipeline.md``, "Metric definitions"):

* A metric is ``name`` (unique, ``[a-z0-9_]+``), ``scope`` (service | instance | endpoint), ``function``
  (count cpm sum avg min max sla apdex percentile), ``field`` (only for sum avg min max; a numeric event
  field), ``threshold_ms`` (apdex only, required there), ``precision_ms`` (percentile only, required there)
  and an optional ``where`` filter: ``field (==|!=|<|<=|>|>=) literal`` clauses joined by ``and``; literals
  are numbers, ``true``/``false`` or quoted strings.
* A top-N is ``name``, ``scope``, ``key`` (a string event field, or ``trace_id``: the trace's id in hex) and
  ``n``: per entity and bucket of ``minutes`` (default 10), the n slowest events by latency_ms desc, ties by key
  asc, events without a key skipped. With ``latency_buckets_ms`` (histogram bounds, upper-inclusive as
  Prometheus' ``le``), n per latency bucket instead: the exemplars of a histogram.

Definitions are frozen dataclasses (hashable, picklable plain data); constructing one validates it and raises
:class:`DefinitionError` (a ``ValueError``) with a one-line message naming the metric and the problem.
A ``where`` filter compiles to a :class:`Filter`, plain data whose :meth:`Filter.mask` evaluates it on a
pyarrow batch with vectorised compute kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import DefinitionError
from ..inputs.endpoints import EndpointRules, parse_endpoint_rules
from ..inputs.schema import TRACE_ID
from ..inputs.spans import SpanMapping, parse_span_mapping
from .alerts import AlertRule, parse_alert_rules
from .grouping import numpy_column, upper_classes
from .retention import Retention, parse_retention

__all__ = [
    "SCOPES",
    "FUNCTIONS",
    "FIELD_FUNCTIONS",
    "EVENT_FIELDS",
    "NUMERIC_FIELDS",
    "STRING_FIELDS",
    "TOPN_KEYS",
    "TOPN_MINUTES",
    "EXEMPLARS",
    "with_exemplars",
    "Condition",
    "Filter",
    "parse_where",
    "MetricDef",
    "TopNDef",
    "Definitions",
    "DEFAULT_DEFINITIONS",
    "default_definitions",
    "parse_definitions",
    "load_definitions",
    "definitions_from",
    "signature",
]

SCOPES: tuple[str, ...] = ("service", "instance", "endpoint")
FUNCTIONS: tuple[str, ...] = ("count", "cpm", "sum", "avg", "min", "max", "sla", "apdex", "percentile")
FIELD_FUNCTIONS: frozenset[str] = frozenset({"sum", "avg", "min", "max"})
#: input event fields and their kinds (the reader's batch schema)
EVENT_FIELDS: dict[str, str] = {
    "ts": "number",
    "service": "string",
    "instance": "string",
    "endpoint": "string",
    "latency_ms": "number",
    "status": "bool",
    "db_statement": "string",
}
NUMERIC_FIELDS: tuple[str, ...] = tuple(f for f, k in EVENT_FIELDS.items() if k == "number")
STRING_FIELDS: tuple[str, ...] = tuple(f for f, k in EVENT_FIELDS.items() if k == "string")
#: what a top-N may be keyed on: a string field, or the optional trace id (spans; kept as lowercase hex)
TOPN_KEYS: tuple[str, ...] = (*STRING_FIELDS, TRACE_ID)

_NAME_RE = re.compile(r"[a-z0-9_]+\Z")

Literal = str | int | float | bool
#: a top-N's bucket widths in minutes: whole parts of an hour, so that buckets line up with hours and days
TOPN_MINUTES: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60)


# --------------------------------------------------------------------------------------------- filters

_OPS: dict[str, str] = {
    "==": "equal",
    "!=": "not_equal",
    "<": "less",
    "<=": "less_equal",
    ">": "greater",
    ">=": "greater_equal",
}

_TOKEN_RE = re.compile(
    r"""\s*(?:
        (?P<op>==|!=|<=|>=|<|>)
      | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?![A-Za-z_0-9.])
      | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<bad>\S+)
    )""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Condition:
    """One ``field op literal`` clause. Null field values never match (SQL semantics)."""

    field: str
    op: str
    value: Literal

    def __str__(self) -> str:
        return f"{self.field} {self.op} {_format_literal(self.value)}"

    def mask(self, batch: pa.RecordBatch | pa.Table) -> np.ndarray:
        """Boolean numpy mask, one entry per row of ``batch``."""
        column = batch.column(self.field)
        result = getattr(pc, _OPS[self.op])(column, pa.scalar(self.value))
        if result.null_count:
            result = pc.fill_null(result, False)
        return numpy_column(result)


@dataclass(frozen=True)
class Filter:
    """A conjunction of :class:`Condition` s (the compiled form of a ``where`` string)."""

    conditions: tuple[Condition, ...]

    def __str__(self) -> str:
        return " and ".join(str(c) for c in self.conditions)

    def mask(self, batch: pa.RecordBatch | pa.Table) -> np.ndarray:
        """Boolean numpy mask of the rows of ``batch`` matching every condition."""
        result = np.ones(batch.num_rows, dtype=bool)
        for condition in self.conditions:
            result &= condition.mask(batch)
        return result


def _format_literal(value: Literal) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def _unquote(token: str) -> str:
    return re.sub(r"\\(.)", r"\1", token[1:-1])


def _parse_number(token: str) -> int | float:
    try:
        return int(token)
    except ValueError:
        return float(token)


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        match = _TOKEN_RE.match(text, position)
        if match is None:  # only trailing whitespace is left
            break
        kind = match.lastgroup
        assert kind is not None
        out.append((kind, match.group(kind)))
        position = match.end()
    return out


def _check_condition(field: str, op: str, value: Literal) -> None:
    kind = EVENT_FIELDS.get(field)
    if kind is None:
        raise DefinitionError(f"unknown field {field!r} (fields: {', '.join(EVENT_FIELDS)})")
    if kind == "bool":
        if not isinstance(value, bool) or op not in ("==", "!="):
            raise DefinitionError(f"{field} can only be compared with == or != to true or false")
    elif kind == "number":
        if isinstance(value, (bool, str)):
            raise DefinitionError(f"{field} is numeric and must be compared to a number, not {_format_literal(value)}")
    elif not isinstance(value, str):
        raise DefinitionError(
            f"{field} is a string and must be compared to a quoted string, not {_format_literal(value)}"
        )


@functools.lru_cache(maxsize=1024)
def parse_where(text: str) -> Filter:
    """Compile a ``where`` string; raises :class:`DefinitionError` (without metric context) on bad syntax.

    Grammar: ``clause ("and" clause)*``, ``clause := field op literal``, ``op := == | != | < | <= | > | >=``,
    ``literal := number | true | false | "string" | 'string'`` (backslash escapes the next character).
    A pure function; the cache only memoises it.
    """
    tokens = _tokens(text)
    if not tokens:
        raise DefinitionError("empty where filter")
    conditions: list[Condition] = []
    i = 0
    while True:
        clause = tokens[i : i + 3]
        if len(clause) < 3:
            raise DefinitionError(f"incomplete clause at end of {text!r} (expected: field op literal)")
        (fkind, field), (okind, op), (lkind, literal) = clause
        if fkind != "word" or field in ("and", "true", "false"):
            raise DefinitionError(f"expected a field name, found {field!r}")
        if okind != "op":
            raise DefinitionError(f"expected an operator (==, !=, <, <=, >, >=) after {field!r}, found {op!r}")
        value: Literal
        if lkind == "str":
            value = _unquote(literal)
        elif lkind == "num":
            value = _parse_number(literal)
        elif lkind == "word" and literal in ("true", "false"):
            value = literal == "true"
        else:
            raise DefinitionError(
                f"expected a literal (number, true/false, quoted string) after {field} {op}, found {literal!r}"
            )
        _check_condition(field, op, value)
        conditions.append(Condition(field, op, value))
        i += 3
        if i == len(tokens):
            return Filter(tuple(conditions))
        kind, word = tokens[i]
        if kind != "word" or word != "and":
            raise DefinitionError(f"expected 'and' between clauses, found {word!r}")
        i += 1


# --------------------------------------------------------------------------------------------- definitions


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_name(kind: str, name: Any) -> None:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise DefinitionError(f"{kind} name {name!r} is invalid (use [a-z0-9_]+)")


def _check_scope(label: str, scope: Any) -> None:
    if scope not in SCOPES:
        raise DefinitionError(f"{label}: unknown scope {scope!r} (expected one of {', '.join(SCOPES)})")


@dataclass(frozen=True)
class MetricDef:
    """One metric definition (see the module docstring for the rules); validated on construction."""

    name: str
    scope: str
    function: str
    field: str | None = None
    threshold_ms: float | None = None
    precision_ms: float | None = None
    where: str | None = None

    def __post_init__(self) -> None:
        _check_name("metric", self.name)
        label = f"metric {self.name!r}"
        _check_scope(label, self.scope)
        if self.function not in FUNCTIONS:
            raise DefinitionError(
                f"{label}: unknown function {self.function!r} (expected one of {', '.join(FUNCTIONS)})"
            )
        self._check_field(label)
        self._check_parameter(label, "threshold_ms", "apdex")
        self._check_parameter(label, "precision_ms", "percentile")
        if self.where is not None:
            if not isinstance(self.where, str):
                raise DefinitionError(f"{label}: where must be a string, not {self.where!r}")
            try:
                parse_where(self.where)
            except DefinitionError as exc:
                raise DefinitionError(f"{label}: bad where {self.where!r}: {exc}") from None

    def _check_field(self, label: str) -> None:
        if self.function not in FIELD_FUNCTIONS:
            if self.field is not None:
                raise DefinitionError(
                    f"{label}: function {self.function!r} takes no field (field is for sum avg min max)"
                )
            return
        if self.field is None:
            raise DefinitionError(
                f"{label}: function {self.function!r} needs a field (one of {', '.join(NUMERIC_FIELDS)})"
            )
        if self.field not in EVENT_FIELDS:
            raise DefinitionError(
                f"{label}: unknown field {self.field!r} (numeric fields: {', '.join(NUMERIC_FIELDS)})"
            )
        if self.field not in NUMERIC_FIELDS:
            raise DefinitionError(
                f"{label}: field {self.field!r} is not numeric (numeric fields: {', '.join(NUMERIC_FIELDS)})"
            )

    def _check_parameter(self, label: str, parameter: str, function: str) -> None:
        value = getattr(self, parameter)
        if self.function != function:
            if value is not None:
                raise DefinitionError(f"{label}: {parameter} only applies to {function}, not {self.function}")
            return
        if value is None:
            raise DefinitionError(f"{label}: {function} needs {parameter}")
        if not _is_number(value) or not value > 0 or value == float("inf"):
            raise DefinitionError(f"{label}: {parameter} must be a positive number, not {value!r}")

    @property
    def filter(self) -> Filter | None:
        """The compiled ``where`` filter, or None."""
        return None if self.where is None else parse_where(self.where)


@dataclass(frozen=True)
class TopNDef:
    """A top-N definition: per entity of ``scope`` and bucket of ``minutes``, the ``n`` slowest keyed events (with
    ``latency_buckets_ms``: the n slowest of each latency bucket)."""

    name: str
    scope: str = "service"
    key: str = "db_statement"
    n: int = 10
    minutes: int = 10
    latency_buckets_ms: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        _check_name("topn", self.name)
        label = f"topn {self.name!r}"
        _check_scope(label, self.scope)
        if self.key not in TOPN_KEYS:
            raise DefinitionError(f"{label}: key must be a string field or trace_id ({', '.join(TOPN_KEYS)}), "
                                  f"not {self.key!r}")  # fmt: skip
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise DefinitionError(f"{label}: n must be an integer >= 1, not {self.n!r}")
        if not isinstance(self.minutes, int) or isinstance(self.minutes, bool) or self.minutes not in TOPN_MINUTES:
            raise DefinitionError(f"{label}: minutes must be one of {', '.join(map(str, TOPN_MINUTES))} (whole "
                                  f"parts of an hour), not {self.minutes!r}")  # fmt: skip
        try:  # (none, as an empty list in TOML too: n per bucket of time only)
            buckets = _latency_buckets(self.latency_buckets_ms) if len(self.latency_buckets_ms) else ()
        except (DefinitionError, TypeError):
            raise DefinitionError(f"{label}: latency_buckets_ms must be 1 to 100 increasing positive numbers of "
                                  f"milliseconds, not {self.latency_buckets_ms!r}") from None  # fmt: skip
        object.__setattr__(self, "latency_buckets_ms", buckets)

    @property
    def bucket_ms(self) -> int:
        """The width of its time buckets."""
        return self.minutes * 60_000

    def latency_classes(self, latency: np.ndarray) -> np.ndarray:
        """Each latency's bucket of ``latency_buckets_ms`` (upper-inclusive, as Prometheus' ``le``: bound[i-1] <
        latency <= bound[i] is class i; above the last bound, len(bounds))."""
        return upper_classes(np.asarray(self.latency_buckets_ms, np.float64), latency)


Definition = MetricDef | TopNDef


def signature(definition: Definition) -> str:
    """A canonical one-line description of what a definition computes (everything but its name).

    Stores keep it per name so that states computed by different definitions are never merged.
    """
    fields = dataclasses.asdict(definition)
    fields.pop("name")
    if isinstance(definition, TopNDef):  # a top-N of the first kind (10 minutes, n overall) signs as it always did
        for key, default in (("minutes", 10), ("latency_buckets_ms", ())):
            if fields[key] == default:
                fields.pop(key)
    fields["kind"] = "metric" if isinstance(definition, MetricDef) else "topn"
    if isinstance(definition, MetricDef) and definition.filter is not None:
        fields["where"] = str(definition.filter)
    return json.dumps(fields, sort_keys=True)


#: Prometheus' own default histogram buckets, in milliseconds: 5 ms to 10 s
DEFAULT_LATENCY_BUCKETS_MS: tuple[float, ...] = (5, 10, 25, 50, 75, 100, 250, 500, 750, 1000, 2500, 5000, 7500, 10000)


def _latency_buckets(value: Any) -> tuple[float, ...]:
    """Histogram bounds: 1 to 100 positive, finite, increasing numbers of milliseconds."""
    ok = isinstance(value, (list, tuple)) and 0 < len(value) <= 100
    ok = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf") for v in value)
    if not ok or any(b <= a for a, b in zip(value, value[1:])):
        raise DefinitionError(
            f"latency_buckets_ms must be 1 to 100 increasing positive numbers of milliseconds, not {value!r}"
        )
    return tuple(float(v) for v in value)


@dataclass(frozen=True)
class Definitions:
    """An ordered, name-unique set of metric and top-N definitions, and how inputs become events: the span mapping
    (``[spans]``) and the endpoint rules (``[[endpoint_rule]]``, ``endpoint_ids``)."""

    metrics: tuple[MetricDef, ...] = ()
    topns: tuple[TopNDef, ...] = ()
    spans: SpanMapping = SpanMapping()
    endpoints: EndpointRules = EndpointRules()
    max_entities: int = 10_000  # the cardinality guard: entities per scope and bucket (``max_entities``)
    retention: Retention = Retention()  # how long a store keeps what (``[retention]``)
    #: upper bounds (ms) of the latency histogram ``drainpipe serve`` exposes to Prometheus (``[prometheus]``)
    latency_buckets_ms: tuple[float, ...] = DEFAULT_LATENCY_BUCKETS_MS
    alerts: tuple[AlertRule, ...] = ()  # rules over the stored metrics (``[[alert]]``), evaluated by serve
    #: where the dashboard links a trace id (``[prometheus] trace_url``; ``{trace_id}`` is replaced); "": no link
    trace_url: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "metrics", tuple(self.metrics))
        object.__setattr__(self, "topns", tuple(self.topns))
        if not all(isinstance(m, MetricDef) for m in self.metrics) or not all(
            isinstance(t, TopNDef) for t in self.topns
        ):
            raise DefinitionError("Definitions takes MetricDef metrics and TopNDef topns")
        if isinstance(self.max_entities, bool) or not isinstance(self.max_entities, int) or self.max_entities < 1:
            raise DefinitionError(f"max_entities must be an integer >= 1, not {self.max_entities!r}")
        object.__setattr__(self, "latency_buckets_ms", _latency_buckets(self.latency_buckets_ms))
        url = self.trace_url
        if url and (not isinstance(url, str) or not url.startswith(("http://", "https://")) or "{trace_id}" not in url):
            raise DefinitionError(f"trace_url must be an http(s) URL with {{trace_id}} in it, not {url!r}")
        seen: set[str] = set()
        for definition in self.all:
            if definition.name in seen:
                raise DefinitionError(f"duplicate name {definition.name!r} (metric and topn names must be unique)")
            seen.add(definition.name)

    @property
    def all(self) -> tuple[Definition, ...]:
        """Metrics then top-Ns, in definition order."""
        return (*self.metrics, *self.topns)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.all)

    def get(self, name: str) -> Definition:
        """The definition called ``name``; KeyError if there is none."""
        for definition in self.all:
            if definition.name == name:
                return definition
        raise KeyError(name)

    def select(self, names: Iterable[str]) -> Definitions:
        """The subset whose names are in ``names`` (order kept); e.g. to skip already-applied metrics."""
        wanted = set(names)
        return dataclasses.replace(
            self,
            metrics=tuple(m for m in self.metrics if m.name in wanted),
            topns=tuple(t for t in self.topns if t.name in wanted),
        )

    def __len__(self) -> int:
        return len(self.metrics) + len(self.topns)


def default_definitions() -> Definitions:
    """The built-in default set (``docs/pipeline.md``): 16 metrics and the ``top_slow_statements`` top-N."""
    metrics: list[MetricDef] = []
    for scope in SCOPES:
        metrics += [
            MetricDef(f"{scope}_cpm", scope, "cpm"),
            MetricDef(f"{scope}_resp_time", scope, "avg", field="latency_ms"),
            MetricDef(f"{scope}_sla", scope, "sla"),
            MetricDef(f"{scope}_percentile", scope, "percentile", precision_ms=10),
            MetricDef(f"{scope}_apdex", scope, "apdex", threshold_ms=500),
        ]
    metrics.append(MetricDef("service_error_count", "service", "count", where="status == false"))
    return Definitions(tuple(metrics), (TopNDef("top_slow_statements", "service", "db_statement", 10),))


DEFAULT_DEFINITIONS: Definitions = default_definitions()

#: the top-N that ``[prometheus] exemplars = true`` adds
EXEMPLARS = "exemplars"


def with_exemplars(definitions: Definitions) -> Definitions:
    """``definitions`` as ``[prometheus] exemplars = true`` makes them: request spans keep their trace ids (from
    which the live histograms pick exemplars), and a top-N named :data:`EXEMPLARS` stores them: per endpoint and
    minute, the slowest traced request of each latency bucket (of ``latency_buckets_ms``; so the slowest of the
    minute too), keyed by its trace id. :class:`DefinitionError` if a top-N already has that name."""
    if any(t.name == EXEMPLARS for t in definitions.topns):
        raise DefinitionError(f"[prometheus] exemplars = true keeps a top-N named {EXEMPLARS!r}: rename yours")
    exemplars = TopNDef(EXEMPLARS, "endpoint", TRACE_ID, 1, minutes=1,
                        latency_buckets_ms=definitions.latency_buckets_ms)  # fmt: skip
    return dataclasses.replace(definitions, topns=(*definitions.topns, exemplars),
                               spans=dataclasses.replace(definitions.spans, trace_ids=True))  # fmt: skip


# --------------------------------------------------------------------------------------------- TOML

_METRIC_KEYS = tuple(f.name for f in dataclasses.fields(MetricDef))
_TOPN_KEYS = tuple(f.name for f in dataclasses.fields(TopNDef))


def _header_lines(text: str, table: str) -> list[int]:
    """1-based line numbers of the ``[[table]]`` headers, in order."""
    pattern = re.compile(rf"^\s*\[\[\s*{table}\s*\]\]")
    return [i + 1 for i, line in enumerate(text.splitlines()) if pattern.match(line)]


def _build(kind: str, cls: type, keys: tuple[str, ...], entry: Any) -> Definition:
    if not isinstance(entry, dict):
        raise DefinitionError(f"[[{kind}]] must be a table")
    name = entry.get("name")
    label = f"{kind} {name!r}" if name is not None else f"{kind} without a name"
    unknown = sorted(set(entry) - set(keys))
    if unknown:
        raise DefinitionError(f"{label}: unknown key {unknown[0]!r} (allowed: {', '.join(keys)})")
    required = [k for k in keys[:3] if k not in entry] if cls is MetricDef else [k for k in keys[:1] if k not in entry]
    if required:
        raise DefinitionError(f"{label}: missing {required[0]}")
    try:
        return cls(**entry)
    except TypeError as exc:  # pragma: no cover - guarded by the key checks above
        raise DefinitionError(f"{label}: {exc}") from None


def _with_defaults(built: dict[str, list[Definition]], defaults: Any, source: str) -> dict[str, list[Definition]]:
    """The file's own metrics and top-Ns, after the built-in ones when ``defaults`` is true (absent: true for a file
    that has settings only, false for one with tables of its own). A name of its own that a built-in one has is
    refused: the file would otherwise compute something else than the name says elsewhere."""
    own = bool(built["metric"] or built["topn"])
    if defaults is None:
        defaults = not own
    if not isinstance(defaults, bool):
        raise DefinitionError(f"{source}: defaults must be true or false, not {defaults!r}")
    if not defaults:
        if not own:
            raise DefinitionError(f"{source}: defaults = false and no [[metric]] or [[topn]] tables: nothing to do")
        return built
    builtin = default_definitions()
    names = set(builtin.names)
    for definition in (*built["metric"], *built["topn"]):
        if definition.name in names:
            kind = "metric" if isinstance(definition, MetricDef) else "topn"
            raise DefinitionError(f"{source}: {kind} {definition.name!r} has the name of a built-in one (defaults = "
                                  "true keeps the built-in set): rename it")  # fmt: skip
    return {"metric": [*builtin.metrics, *built["metric"]], "topn": [*builtin.topns, *built["topn"]]}


def parse_definitions(text: str, source: str = "<definitions>") -> Definitions:
    """Parse TOML text (``[[metric]]`` and ``[[topn]]`` tables, settings) into :class:`Definitions`.

    A text with settings but no tables uses the built-in set with those settings; ``defaults = true`` adds its
    tables to the built-in set (a name clash is an error); an empty text is an error.

    Errors are :class:`DefinitionError` s prefixed with ``source`` and, where known, the line.
    """
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DefinitionError(f"{source}: invalid TOML: {exc}") from None
    allowed = {"metric", "topn", "defaults", "spans", "endpoint_rule", "endpoint_ids", "max_entities", "retention",
               "prometheus", "alert"}  # fmt: skip
    unknown = sorted(set(document) - allowed)
    if unknown:
        raise DefinitionError(
            f"{source}: unknown top-level key {unknown[0]!r} (expected [[metric]] and [[topn]] tables, defaults, "
            "[spans], [[endpoint_rule]], endpoint_ids, max_entities, [retention], [prometheus] and [[alert]])"
        )
    if not document:
        raise DefinitionError(f"{source}: defines nothing (no [[metric]] or [[topn]] tables, no settings)")
    retention = parse_retention(document.get("retention", {}), source)
    prometheus = document.get("prometheus", {})
    if not isinstance(prometheus, dict) or set(prometheus) - {"latency_buckets_ms", "exemplars", "trace_url"}:
        raise DefinitionError(f"{source}: [prometheus] takes latency_buckets_ms = [5, 10, 25, ...], "
                              'exemplars = true|false and trace_url = "https://.../{trace_id}"')  # fmt: skip
    exemplars = prometheus.get("exemplars", False)
    if not isinstance(exemplars, bool):
        raise DefinitionError(f"{source}: [prometheus] exemplars must be true or false, not {exemplars!r}")
    spans = parse_span_mapping(document.get("spans", {}), source)
    endpoints = parse_endpoint_rules(document.get("endpoint_rule", []), document.get("endpoint_ids", True), source)
    built: dict[str, list[Definition]] = {"metric": [], "topn": []}
    for kind, cls, keys in (("metric", MetricDef, _METRIC_KEYS), ("topn", TopNDef, _TOPN_KEYS)):
        entries = document.get(kind, [])
        if not isinstance(entries, list):
            raise DefinitionError(f"{source}: {kind} must be written as [[{kind}]] tables")
        lines = _header_lines(text, kind)
        for index, entry in enumerate(entries):
            try:
                built[kind].append(_build(kind, cls, keys, entry))
            except DefinitionError as exc:
                where = f"{source}:{lines[index]}" if index < len(lines) else source
                raise DefinitionError(f"{where}: {exc}") from None
    built = _with_defaults(built, document.get("defaults"), source)
    buckets = prometheus.get("latency_buckets_ms", DEFAULT_LATENCY_BUCKETS_MS)
    functions = {m.name: m.function for m in built["metric"]}  # type: ignore[union-attr]
    alerts = parse_alert_rules(document.get("alert", []), source, functions)
    try:
        definitions = Definitions(tuple(built["metric"]), tuple(built["topn"]), spans, endpoints,  # type: ignore[arg-type]
                                  document.get("max_entities", 10_000), retention, buckets, alerts,
                                  prometheus.get("trace_url", ""))  # fmt: skip
        return with_exemplars(definitions) if exemplars else definitions
    except DefinitionError as exc:
        raise DefinitionError(f"{source}: {exc}") from None


def definitions_from(path: str | Path | None) -> Definitions:
    """The definitions in the TOML file ``path``, or the built-in default set when ``path`` is None."""
    return load_definitions(path) if path else default_definitions()


def load_definitions(path: str | Path) -> Definitions:
    """Read and parse a definitions TOML file; :class:`DefinitionError` if unreadable or invalid."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise DefinitionError(f"{path}: cannot read metric definitions: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise DefinitionError(f"{path}: metric definitions are not UTF-8 text") from None
    return parse_definitions(text, str(path))
