"""The handler table of one queue: registered handlers, the instances the dispatcher calls, and their partitions.

Written only by the control thread (:mod:`._control`); read by drain tasks (:mod:`._drain`) and by producers for
types the C route table does not know (split types). Reads need no lock: every update replaces or inserts a
whole entry in a dict, which is atomic under the GIL, and an entry is fully built before it is published.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class HandlerConsumer(Protocol):
    """A handler: ``consume(batch)`` gets each batch of its type (a list, in produce order per partition), and an
    optional ``on_idle()`` is called when the drain task owning the handler found nothing. A plain callable
    ``f(batch)`` is accepted wherever a HandlerConsumer is. A handler registered with ``add_handler`` is never
    called concurrently with itself; a single ``consumer`` (config) is called from every drain task at once."""

    def consume(self, batch: list[Any], /) -> None: ...


class Target:
    """One handler instance, as the dispatcher calls it (``lock`` only where a custom selector may put the
    instance's type in several partitions at once)."""

    __slots__ = ("consume", "on_idle", "lock", "type")

    def __init__(self, handler: Any, type_: type | None, locked: bool) -> None:
        consume = getattr(handler, "consume", None)
        if consume is None:
            if not callable(handler):
                raise TypeError(f"handler for {type_!r} must be callable or have consume(batch)")
            consume = handler
        self.consume: Callable[[list[Any]], None] = consume
        self.on_idle: Callable[[], None] | None = getattr(handler, "on_idle", None)
        self.lock = threading.Lock() if locked else None
        self.type = type_


class Entry:
    """A registered handler: its type, weight, and the partition(s) it serves.

    ``split`` entries own one handler instance per sub-partition (built by the factory) and spread their type over
    ``partitions`` by ``key``; plain entries have one target for their one partition. ``auto`` entries are split
    entries whose instance count the control thread changes at runtime (:meth:`bind_more`, :meth:`route_to`,
    :meth:`retire_partitions`); each change replaces a whole attribute, so a reader on another thread sees the old
    or the new value, never a mix.
    """

    __slots__ = ("type", "weight", "split", "auto", "factory", "key", "partitions", "targets", "_single",
                 "_anywhere", "_rr")  # fmt: skip

    def __init__(
        self, type_: type, handler: Any, weight: float, split: int, key: Callable[[Any], Any] | None,
        auto: bool = False,
    ) -> None:  # fmt: skip
        self.type = type_
        self.weight = weight
        self.split = split
        self.auto = auto
        self.factory = handler if split else None
        self.key = key
        self.partitions: tuple[int, ...] = ()
        self.targets: dict[int, Target] = {}
        self._single: Target | None = None
        self._anywhere = False
        self._rr = itertools.count()

    def bind(self, partitions: tuple[int, ...], handler: Any, locked: bool) -> None:
        self.partitions = partitions
        if self.split:
            assert self.factory is not None
            self.targets = {p: Target(self.factory(), self.type, locked) for p in partitions}
        else:
            self._single = Target(handler, self.type, locked)
            self.targets = {partitions[0]: self._single}
            self._anywhere = locked  # a custom selector may put the type anywhere: the lock guards the instance

    def bind_more(self, partitions: tuple[int, ...], locked: bool) -> None:
        """A new instance for each of these partitions (not routed to until :meth:`route_to`)."""
        assert self.factory is not None
        self.targets = {**self.targets, **{p: Target(self.factory(), self.type, locked) for p in partitions}}

    def route_to(self, partitions: tuple[int, ...]) -> None:
        """The partitions producers spread the type over from now on (each with an instance bound)."""
        assert all(p in self.targets for p in partitions)
        self.partitions = partitions
        self.split = len(partitions)

    def retire_partitions(self, keep: int) -> tuple[int, ...]:
        """Route to the first ``keep`` partitions only; the rest are returned, their instances still bound: they
        handle what is buffered there and any item already on its way, and a later split routes to them again."""
        retired = self.partitions[keep:]
        self.partitions = self.partitions[:keep]
        self.split = keep
        return retired

    def target(self, partition: int) -> Target | None:
        """The instance that serves this type's items in ``partition``; None if none does (items an earlier
        registration of the type left in a partition this one does not use: they are dropped and counted, as
        after remove_handler, since handing them to an instance owned elsewhere could run it twice at once)."""
        return self._single if self._anywhere else self.targets.get(partition)

    @property
    def weighted_count(self) -> float:
        return self.weight * max(1, self.split)

    def route(self, item: Any) -> int:
        """Sub-partition of an item of a split type (hash of its key, or round-robin without a key)."""
        parts = self.partitions
        i = hash(self.key(item)) if self.key is not None else next(self._rr)
        return parts[i % len(parts)]


class HandlerTable:
    """Handlers by exact type, split types, each type's home partitions, and the types already warned about."""

    def __init__(self, queue_name: str, log: logging.Logger) -> None:
        self.entries: dict[type, Entry] = {}
        self.split: dict[type, Entry] = {}  # split types route through their entry, not the C route table
        self.home: dict[type, tuple[int, ...]] = {}  # a type keeps its partitions for life
        self._warned: set[type] = set()
        self._warn_lock = threading.Lock()
        self._name = queue_name
        self._log = log

    def weighted_count(self) -> float:
        return sum(e.weighted_count for e in self.entries.values())

    def warn_no_handler(self, t: type) -> None:
        """Log once per type that its items are dropped for want of a handler (thread-safe)."""
        if t in self._warned:
            return
        with self._warn_lock:
            if t in self._warned:
                return
            self._warned.add(t)
        self._log.warning("queue %r: no handler for %s; its items are dropped", self._name, t.__qualname__)

    def clear_warning(self, t: type) -> None:
        self._warned.discard(t)
