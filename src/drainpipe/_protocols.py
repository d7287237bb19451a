"""The typed shapes a user plugs into a queue besides handlers: a balancer, an error handler, a rebalance
listener. (Handlers: :class:`drainpipe.HandlerConsumer`.) Structural: any object of the right shape will do."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Balancer(Protocol):
    """Decides partition -> drain task ownership (``BatchQueueConfig.balancer``). Called on the queue's control
    thread only, with per-partition throughput (items per interval, smoothed for periodic rebalances), the current
    owners, the task count, and the standard error of each throughput figure (periodic rebalances; None for
    ``rebalance_now``, which measures once); returns the new owner of every partition, or None to leave things as
    they are."""

    def assign(
        self,
        throughput: Sequence[int],
        current_owner: Sequence[int],
        task_count: int,
        spread: Sequence[float] | None = None,
    ) -> list[int] | None: ...


class ErrorHandler(Protocol):
    """``BatchQueueConfig.error_handler``: called with the batch and the exception when a handler raised, on the
    drain thread that called the handler. Whatever it raises is logged; the queue keeps running."""

    def __call__(self, batch: list[Any], exc: BaseException, /) -> None: ...


class RebalanceListener(Protocol):
    """``BatchQueueConfig.rebalance_listener``, as Kafka's ``ConsumerRebalanceListener``: told which partitions
    (and the item types placed on them) each drain task loses and gains when a rebalance moves partitions.

    Both run on the control thread. Partitions are handed over per old owner: ``on_revoked`` once that owner has
    left the drain cycle it was in (no handler of those partitions runs on it any more), then ``on_assigned`` for
    their new owners (before a new owner's first cycle over them); a partition's ``on_revoked`` always precedes
    its ``on_assigned``. Keep them short: every queue's control work waits for them. What they raise is logged;
    the rebalance goes on."""

    def on_revoked(self, task: int, partitions: tuple[int, ...], types: tuple[type, ...]) -> None: ...

    def on_assigned(self, task: int, partitions: tuple[int, ...], types: tuple[type, ...]) -> None: ...
