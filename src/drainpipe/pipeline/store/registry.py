"""The store's registry of definitions (``definitions``: name -> signature): states of a name computed differently
are never merged.

Every writing transaction checks the definitions it writes (:func:`check`) before it writes anything, and records
the new ones; a definition stored under its name with another
:func:`~drainpipe.pipeline.definitions.signature` is :class:`~drainpipe.errors.StoreError`.

Functions over a :class:`~.backend.Backend`, called inside the store's session (and, for :func:`check`, its writing
transaction); blocking; database errors propagate.
"""

from __future__ import annotations

import json

from ...errors import StoreError
from ..definitions import Definition, signature
from .backend import Backend

__all__ = ["check", "stored_names"]


def check(backend: Backend, definitions: set[Definition]) -> None:
    """Compare each of ``definitions`` with the one stored under its name, recording those not stored yet;
    :class:`StoreError` naming the first stored with a different signature."""
    if not definitions:
        return
    wanted = {d.name: signature(d) for d in definitions}
    if len(wanted) != len(definitions):
        raise StoreError("one merge holds two different definitions with the same name")
    names = sorted(wanted)
    marks = ", ".join("?" * len(names))
    stored = dict(backend.fetchall(f"SELECT name, signature FROM definitions WHERE name IN ({marks})", names))
    missing = [name for name in names if name not in stored]
    if missing:
        # writers may register at once (each holds the books of its own parts only): ON CONFLICT makes the later
        # one lose nothing, and the row the other wrote is compared below like any other. One statement, in name
        # order (two writers' inserts wait for each other, never in a cycle): a fresh store registers every
        # definition at once.
        backend.execute(
            f"INSERT INTO definitions VALUES {', '.join(['(?, ?)'] * len(missing))} ON CONFLICT (name) DO NOTHING",
            [value for name in missing for value in (name, wanted[name])],
        )
        stored = dict(backend.fetchall(f"SELECT name, signature FROM definitions WHERE name IN ({marks})", names))
    for name in names:
        if stored[name] != wanted[name]:
            raise StoreError(
                f"{name!r} is stored with a different definition ({stored[name]}); use another store or name"
            )


def stored_names(backend: Backend) -> dict[str, str]:
    """The definitions the store holds states of: name -> ``"metric"`` or ``"topn"``."""
    rows = backend.fetchall("SELECT name, signature FROM definitions ORDER BY name")
    return {name: json.loads(sig).get("kind", "metric") for name, sig in rows}
