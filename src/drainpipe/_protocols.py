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
    (and the item types placed on them) each drain task loses and gains.

    The callbacks run in order on the queue's own listener thread (never on the control thread all queues share:
    a slow listener holds up this queue's handoffs only). A rebalance hands partitions over per old owner:
    ``on_revoked`` once that owner has left the drain cycle it was in (no handler of those partitions runs on it
    any more), then ``on_assigned`` for their new owners, and only after it returned do the new owners get them.
    Also told: partitions added by growth (``on_assigned``), a failover (``on_lost`` for the partitions taken from
    a task stuck in a handler call without its fence, then ``on_assigned``; optional, defaulting to
    ``on_revoked``), and shutdown (``on_revoked`` for every task's partitions after the final drain). What they
    raise is logged; the rebalance goes on."""

    def on_revoked(self, task: int, partitions: tuple[int, ...], types: tuple[type, ...]) -> None: ...

    def on_assigned(self, task: int, partitions: tuple[int, ...], types: tuple[type, ...]) -> None: ...
