"""The shared partition state of one queue, and the ownership handoff over it.

One object per queue, shared by the producers (:mod:`._queue`), the drain tasks (:mod:`._drain`) and the control
thread (:mod:`._control`). Who may write what:

* ``buffers`` (C, ``_fastpath.Buffers``): producers append and drain tasks take, each in one atomic C call.
* ``closing``: set once by the first ``shutdown()`` caller; read by the C fast path and by waiting producers.
* ``epoch[t]``: only drain task ``t`` (odd while inside a drain cycle); the control thread reads it to fence.
* ``idle[t]``: drain task ``t`` raises it when it backs off idle; the producer that wakes it lowers it (one wake
  per idle spell).
* ``owner``, ``assigned``, ``targets``, ``type_count``, ``count`` and growth of every list: only the control thread.
  Lists grow in place (never replaced), and a new partition count is published last, so a reader on another
  thread never indexes past what exists.
* ``conds``/``waiters``: producers waiting for room, and drain tasks that free room.

Handoff (revoke, fence, assign; run by :mod:`._control`): the partition becomes unowned, the control thread waits
(without blocking: :meth:`in_cycle`, :meth:`left`) until its old owner has left the drain cycle it was in, then the
new owner is published. Items produced meanwhile stay in the partition and are drained by the new owner.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

from ._fastpath import Buffers
from ._handlers import Target

UNOWNED = -1


class Partitions:
    """Buffers, owners and cycle epochs of one queue's partitions (see the module docstring for the rules)."""

    def __init__(self, count: int, capacity: int, tasks: int) -> None:
        self.capacity = capacity
        self.closing = [False]  # a list: the C fast path holds a reference and reads element 0
        self.buffers = Buffers(count, capacity, self.closing)
        self.count = [count]  # published partition count (custom selectors read it through the C producer)
        self.conds = [threading.Condition(threading.Lock()) for _ in range(count)]
        self.waiters = [0] * count
        # types a shrink moved off each partition so far (changed under the partition's condition lock, with the
        # route): a producer waiting for room in one never moved off puts without looking at the routes
        self.moved_off = [0] * count
        self.owner = [p % tasks for p in range(count)]
        self.targets: list[tuple[Target, ...]] = [() for _ in range(count)]  # handler instances per partition
        self.type_count = [0] * count  # types placed on each partition
        self.epoch = [0] * tasks
        self.idle = [False] * tasks  # True while task t backs off idle (only task t writes it; producers read it)
        self.assigned: list[tuple[int, ...]] = self._assignment()

    # ------------------------------------------------------------------ drain side

    def take_owned(self, t: int) -> Iterator[tuple[int, list[Any]]]:
        """(partition, items) of each non-empty partition task ``t`` owns, taken as the iteration reaches it."""
        owner, take, waiters = self.owner, self.buffers.take, self.waiters
        for p in self.assigned[t]:
            if owner[p] != t:
                continue
            items = take(p)
            if items is not None:
                if waiters[p]:
                    self.notify_room(p)
                yield p, items

    def has_items(self, t: int) -> bool:
        """Whether a partition task ``t`` owns holds items now."""
        owner, size = self.owner, self.buffers.size
        return any(owner[p] == t and size(p) for p in self.assigned[t])

    def owned_targets(self, t: int) -> list[tuple[int, Target]]:
        """The handler instances on the partitions task ``t`` owns now, with their partition."""
        owner = self.owner
        return [(p, tg) for p in self.assigned[t] if owner[p] == t for tg in self.targets[p]]

    def take_all(self) -> list[tuple[int, list[Any]]]:
        """Every non-empty partition's items (the final drain, once no task runs)."""
        take = self.buffers.take
        return [(p, items) for p in range(len(self.buffers)) if (items := take(p)) is not None]

    # ------------------------------------------------------------------ producer side

    def notify_room(self, p: int) -> None:
        cond = self.conds[p]
        with cond:
            cond.notify_all()

    def notify_all_rooms(self) -> None:
        for p in range(len(self.conds)):
            self.notify_room(p)

    def wait_for_room(self, p: int) -> bool:
        """Wait until partition ``p`` has room; False once shutdown began."""
        cond, size, cap = self.conds[p], self.buffers.size, self.capacity
        with cond:
            self.waiters[p] += 1
            try:
                while size(p) >= cap:
                    if self.closing[0]:
                        return False
                    cond.wait(0.05)
            finally:
                self.waiters[p] -= 1
        return not self.closing[0]

    # ------------------------------------------------------------------ control side (the control thread only)

    def in_cycle(self, tasks: Iterable[int]) -> dict[int, int]:
        """The tasks among ``tasks`` that are inside a drain cycle now, with that cycle's epoch (for :meth:`left`)."""
        epoch = self.epoch
        return {t: epoch[t] for t in tasks if epoch[t] & 1}

    def left(self, waiting: dict[int, int]) -> bool:
        """Whether every task of ``waiting`` (from :meth:`in_cycle`) has left that cycle; forgets those that have."""
        epoch = self.epoch
        for t in [t for t, e in waiting.items() if epoch[t] != e]:
            del waiting[t]
        return not waiting

    def add_task(self) -> int:
        """Room for one more drain task (a stand-in); its index. It owns nothing yet."""
        self.epoch.append(0)
        self.idle.append(False)
        self.assigned = self._assignment()
        return len(self.epoch) - 1

    def publish(self) -> None:
        """Publish each task's partitions after owners changed (the drain side reads ``assigned``)."""
        self.assigned = self._assignment()

    def types_on(self, partitions: Iterable[int]) -> tuple[type, ...]:
        """The item types placed on ``partitions``."""
        return tuple(dict.fromkeys(tg.type for p in partitions for tg in self.targets[p] if tg.type is not None))

    def grow(self, want: int, hold: bool = False) -> list[tuple[int, int]]:
        """Add partitions up to ``want``; returns each new partition with the task it goes to (the one that owns
        the fewest). Existing partitions keep their owners (and their items). ``hold``: the new partitions stay
        unowned until the caller assigns them (after telling the rebalance listener). The new count is published
        last."""
        current = self.count[0]
        if want <= current:
            return []
        owned = [0] * len(self.epoch)
        for t in self.owner:
            if t >= 0:
                owned[t] += 1
        grown = []
        for p in range(current, want):
            t = min(range(len(owned)), key=lambda i: (owned[i], i))
            owned[t] += 1
            if p < len(self.conds):  # a slot left by a shrink: empty, no type
                self.targets[p], self.type_count[p] = (), 0
                self.owner[p] = UNOWNED if hold else t
            else:
                self.buffers.grow()
                self.conds.append(threading.Condition(threading.Lock()))
                self.waiters.append(0)
                self.moved_off.append(0)
                self.targets.append(())
                self.type_count.append(0)
                self.owner.append(UNOWNED if hold else t)
            grown.append((p, t))
        self.assigned = self._assignment(want)
        self.count[0] = want
        return grown

    def free(self, k: int, avoid: set[int]) -> list[int]:
        """Up to ``k`` partitions that carry no type and hold no item, preferring owners not in ``avoid`` and one per
        owner (a split type's instances on different tasks)."""
        n, size = self.count[0], self.buffers.size
        empty = [p for p in range(n) if not self.type_count[p] and not size(p) and self.owner[p] >= 0]
        chosen: list[int] = []
        owners = set(avoid)
        for p in empty:
            if len(chosen) < k and self.owner[p] not in owners:
                chosen.append(p)
                owners.add(self.owner[p])
        return chosen

    def shrink(self, want: int) -> None:
        """Publish ``want`` partitions (fewer than now; the caller made sure those beyond carry no type and hold no
        item, and their owners have left any cycle over them). Their slots stay allocated, unowned, and are reused
        by :meth:`grow`."""
        for p in range(want, self.count[0]):
            self.owner[p] = UNOWNED
        self.count[0] = want
        self.assigned = self._assignment(want)

    def place(self, k: int, home: tuple[int, ...] | None) -> tuple[int, ...]:
        """Partitions for a newly registered type: its previous ones if it had any (items of a re-registered type
        must not sit in two partitions), else the k partitions carrying the fewest types, on distinct owners."""
        n = self.count[0]
        k = min(k, n)
        if home is not None and len(home) == k and all(p < n for p in home):
            return home
        order = sorted(range(n), key=lambda p: (self.type_count[p], p))
        chosen: list[int] = []
        owners: set[int] = set()
        for p in order:
            if len(chosen) < k and self.owner[p] not in owners:
                chosen.append(p)
                owners.add(self.owner[p])
        for p in order:
            if len(chosen) < k and p not in chosen:
                chosen.append(p)
        return tuple(sorted(chosen))

    def attach(self, partition: int, target: Target) -> None:
        self.targets[partition] = self.targets[partition] + (target,)
        self.type_count[partition] += 1

    def detach(self, partition: int, type_: type) -> None:
        self.targets[partition] = tuple(tg for tg in self.targets[partition] if tg.type is not type_)
        self.type_count[partition] -= 1

    def owners_of(self, partitions: Iterable[int]) -> set[int]:
        return {self.owner[p] for p in partitions if self.owner[p] >= 0}

    def _assignment(self, count: int | None = None) -> list[tuple[int, ...]]:
        """Each task's partitions among the first ``count`` (default: the published count)."""
        per: list[list[int]] = [[] for _ in self.epoch]
        for p, t in enumerate(self.owner[: self.count[0] if count is None else count]):
            if t >= 0:
                per[t].append(p)
        return [tuple(x) for x in per]
