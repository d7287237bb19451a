"""Definitions written back as the metrics TOML that :func:`~drainpipe.pipeline.definitions.parse_definitions` reads:
``drainpipe definitions`` prints the built-in set this way, as a file to edit.

What is written parses to the same metrics, top-Ns and retention (``tests/pipeline/test_definitions.py`` holds the
round trip); a key is written only when it differs from its default, so the file says what each definition is.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from .definitions import Definitions, MetricDef, TopNDef
from .retention import FOREVER, Retention

__all__ = ["definitions_toml"]

#: duration units from the largest, for writing retention as the shortest exact text
_UNITS = (("w", 7 * 86_400_000), ("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000))


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def _duration(ms: int | None) -> str:
    if ms is None:
        return FOREVER
    for unit, size in _UNITS:
        if ms % size == 0:
            return f"{ms // size}{unit}"
    raise ValueError(f"retention of {ms} ms is not a whole number of seconds")


def _table(kind: str, definition: MetricDef | TopNDef) -> list[str]:
    lines = [f"[[{kind}]]"]
    for field in dataclasses.fields(definition):
        value = getattr(definition, field.name)
        required = field.default is dataclasses.MISSING
        if required or value != field.default:
            lines.append(f"{field.name} = {_value(value)}")
    return lines


def definitions_toml(definitions: Definitions, header: str = "") -> str:
    """``definitions``' metrics, top-Ns and retention as metrics TOML (``header``: comment lines put first).

    Pure; thread-safe. The span mapping, endpoint rules, alerts and ``[prometheus]`` settings are not written."""
    out = [f"# {line}".rstrip() for line in header.splitlines()]
    for metric in definitions.metrics:
        out += ["", *_table("metric", metric)]
    for topn in definitions.topns:
        out += ["", *_table("topn", topn)]
    if definitions.retention != Retention():
        out += ["", "[retention]"]
        out += [f'{f.name} = "{_duration(getattr(definitions.retention, f.name))}"'
                for f in dataclasses.fields(Retention)]  # fmt: skip
    return "\n".join(out).lstrip("\n") + "\n"
