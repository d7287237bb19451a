"""Rendering query rows as an aligned text table, CSV or JSON.

* ``table``: a header, a rule and one line per row; numbers right-aligned, floats shown with at most 4
  decimals (trailing zeros dropped); ``(no rows)`` when empty. For people.
* ``csv``: a header line, then the rows; floats in full (shortest round-trip) precision.
* ``json``: an array of objects keyed by column name; floats in full precision; always standard JSON (a
  non-finite value is ``null``).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["FORMATS", "render"]

FORMATS: tuple[str, ...] = ("table", "csv", "json")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        text = f"{value:.4f}".rstrip("0").rstrip(".")
        return "0" if text == "-0" else text
    return str(value)


def _table(rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    numeric = [
        bool(rows) and all(isinstance(row[i], (int, float)) and not isinstance(row[i], bool) for row in rows)
        for i in range(len(columns))
    ]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [line(list(columns)), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells] if cells else ["(no rows)"]
    return "\n".join(out) + "\n"


def _csv(rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([repr(v) if isinstance(v, float) else v for v in row] for row in rows)
    return buffer.getvalue()


def _json(rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> str:
    # strict JSON only: a non-finite value (which validation keeps out of new data) becomes null, never NaN/Infinity
    objects = [
        {c: (None if isinstance(v, float) and not math.isfinite(v) else v) for c, v in zip(columns, row)}
        for row in rows
    ]
    return json.dumps(objects, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


_RENDERERS = {"table": _table, "csv": _csv, "json": _json}


def render(rows: Sequence[Sequence[Any]], columns: Sequence[str], fmt: str = "table") -> str:
    """``rows`` (tuples in the order of ``columns``) as text in format ``fmt`` (one of :data:`FORMATS`)."""
    renderer = _RENDERERS.get(fmt)
    if renderer is None:
        raise ValueError(f"unknown format {fmt!r} (expected one of {', '.join(FORMATS)})")
    return renderer(rows, columns)
