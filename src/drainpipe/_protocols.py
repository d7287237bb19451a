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

    Every ownership change is told once, in order, per partition: ``on_assigned`` first (the initial assignment
    included), then ``on_revoked``/``on_lost`` and ``on_assigned`` in turn; at shutdown ``on_revoked`` for what is
    still held. The callbacks run one at a time on the drain thread that loses or gains the partitions (never on
    the control thread all queues share): ``on_revoked`` once the old owner has left the drain cycle it was in (no
    handler of those partitions runs on it any more), ``on_assigned`` before the new owner takes anything from
    them; the assignment completes when it returns, or at ``handoff_timeout_ms``. Also told: growth
    (``on_assigned``), a failover (``on_lost`` for the partitions taken from a task stuck in a handler call, on the
    thread of the task taking them over; optional, defaulting to ``on_revoked``), a shrink (``on_revoked`` for the
    partitions dropped) and shutdown (on the final drain's thread). What they raise is logged; the rebalance goes
    on."""

    def on_revoked(self, task: int, partitions: tuple[int, ...], types: tuple[type, ...]) -> None: ...

    def on_assigned(self, task: int, partitions: tuple[int, ...], types: tuple[type, ...]) -> None: ...
