"""Typed stub of the C extension ``drainpipe._fastpath`` (source: ``_fastpath.c``; its header comment states the
atomicity rules). Every call is atomic with respect to other Python threads: it runs under the GIL without
releasing it."""

from collections.abc import Callable
from typing import Any

class Buffers:
    """A queue's bounded partition buffers and their produced counters."""

    def __init__(self, partitions: int, capacity: int, closing: list[bool]) -> None: ...
    @property
    def capacity(self) -> int: ...
    def put(self, p: int, items: list[Any], start: int = 0, /) -> int:
        """Append ``items[start:]`` to partition ``p`` while it has room and shutdown has not begun; how many
        went in."""
    def take(self, p: int, /) -> list[Any] | None:
        """Every item of partition ``p``, swapped for an empty list in O(1); None if it is empty."""
    def size(self, p: int, /) -> int: ...
    def sizes(self) -> tuple[int, ...]: ...
    def produced(self, p: int, /) -> int:
        """Items ever accepted into partition ``p``."""
    def produced_all(self) -> tuple[int, ...]:
        """Items ever accepted, per partition (one consistent snapshot)."""
    def grow(self) -> int:
        """Add one empty partition; the new count."""
    def __len__(self) -> int: ...

class Producer:
    """``produce(item) -> bool``: route the item, check the closing flag and the bound, append and count, in one
    call. False after shutdown began, or (IF_POSSIBLE) when the partition is full; with BLOCKING the ``full``
    callback waits for room. ``wake(p)``, if given, is called when an item made partition ``p`` non-empty and
    ``idle[owners[p]]`` is True (its owner backs off idle; both lists are read, never written). Routes change
    only through :meth:`set_route` / :meth:`drop_route`."""

    def __init__(
        self,
        buffers: Buffers,
        routes: dict[type, int] | None,
        select: Callable[[Any, int], int] | None,
        pcount: list[int],
        route_slow: Callable[[Any], int | None],
        full: Callable[[Any, int], bool],
        wake: Callable[[int], None] | None = None,
        owners: list[int] | None = None,
        idle: list[bool] | None = None,
    ) -> None: ...
    def __call__(self, item: Any, /) -> bool: ...
    def many(self, items: list[Any], /) -> tuple[int, dict[int, list[Any]] | None]:
        """Produce each item in order; items that found their partition full come back per partition."""
    def set_route(self, type_: type, partition: int, /) -> None: ...
    def drop_route(self, type_: type, /) -> bool: ...

def group_by_type(items: list[Any], /) -> list[tuple[type, list[Any]]]:
    """Items by exact type, in first-seen order."""
