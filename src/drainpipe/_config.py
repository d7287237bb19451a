"""BatchQueueConfig: a frozen, validated description of one queue."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._policies import PartitionPolicy, ThreadPolicy
from ._protocols import Balancer, ErrorHandler
from ._routing import BufferStrategy, PartitionSelector, Selector
from .errors import ConfigError


@dataclass(frozen=True)
class BatchQueueConfig:
    """Configuration of a :class:`BatchQueue`. ``validate()`` raises ``ValueError`` naming the bad field."""

    threads: ThreadPolicy | None = None
    shared_scheduler: tuple[str, ThreadPolicy] | None = None
    partitions: PartitionPolicy = field(default_factory=lambda: PartitionPolicy.fixed(1))
    partition_selector: Selector = field(default_factory=PartitionSelector.type_hash)
    buffer_size: int = 10_000
    strategy: BufferStrategy = BufferStrategy.BLOCKING
    consumer: Any = None
    consumer_thread_safe: bool = False  # the consumer may be called from two threads at once: a stuck call fails over
    error_handler: ErrorHandler | Callable[[list, BaseException], None] | None = None
    min_idle_ms: int = 1
    max_idle_ms: int = 50
    balancer: Balancer | None = None
    rebalance_interval_ms: int = 0
    shutdown_timeout_ms: int = 500
    rebalance_listener: Any = None  # a RebalanceListener: told what each task loses and gains in a rebalance
    slow_handler_ms: int = 10_000  # a handler call running longer than this is logged and listed in stats()
    handoff_timeout_ms: int = 30_000  # a fence or a listener call not done by then: rolled back or left behind
    event_queue_size: int = 0  # > 0: BatchQueue.events() returns what happened (ownership, errors), this many kept

    def validate(self) -> BatchQueueConfig:
        """Check every field; return self so calls chain."""
        if (self.threads is None) == (self.shared_scheduler is None):
            raise ConfigError("threads / shared_scheduler: set exactly one of the two")
        if self.threads is not None and not isinstance(self.threads, ThreadPolicy):
            raise ConfigError(f"threads must be a ThreadPolicy, got {self.threads!r}")
        if self.shared_scheduler is not None:
            ss = self.shared_scheduler
            if (
                not isinstance(ss, tuple)
                or len(ss) != 2
                or not isinstance(ss[0], str)
                or not ss[0]
                or not isinstance(ss[1], ThreadPolicy)
            ):
                raise ConfigError("shared_scheduler must be (name, ThreadPolicy) with a non-empty name")
        if not isinstance(self.partitions, PartitionPolicy):
            raise ConfigError(f"partitions must be a PartitionPolicy, got {self.partitions!r}")
        if not callable(self.partition_selector):
            raise ConfigError("partition_selector must be callable (item, partition_count) -> int")
        _int_at_least("buffer_size", self.buffer_size, 1)
        if not isinstance(self.strategy, BufferStrategy):
            raise ConfigError(f"strategy must be a BufferStrategy, got {self.strategy!r}")
        if self.consumer is not None and not (callable(self.consumer) or hasattr(self.consumer, "consume")):
            raise ConfigError("consumer must be callable or have a consume(batch) method")
        if not isinstance(self.consumer_thread_safe, bool):
            raise ConfigError(f"consumer_thread_safe must be a bool, got {self.consumer_thread_safe!r}")
        if self.error_handler is not None and not callable(self.error_handler):
            raise ConfigError("error_handler must be callable (batch, exc)")
        _int_at_least("min_idle_ms", self.min_idle_ms, 1)
        _int_at_least("max_idle_ms", self.max_idle_ms, self.min_idle_ms)
        if self.balancer is not None and not callable(getattr(self.balancer, "assign", None)):
            raise ConfigError("balancer must have assign(throughput, current_owner, task_count)")
        _int_at_least("rebalance_interval_ms", self.rebalance_interval_ms, 0)
        listener = self.rebalance_listener
        if listener is not None and not all(
            callable(getattr(listener, m, None)) for m in ("on_revoked", "on_assigned")
        ):
            raise ConfigError("rebalance_listener must have on_revoked(task, partitions, types) and on_assigned(...)")
        _int_at_least("shutdown_timeout_ms", self.shutdown_timeout_ms, 0)
        _int_at_least("slow_handler_ms", self.slow_handler_ms, 1)
        _int_at_least("handoff_timeout_ms", self.handoff_timeout_ms, 1)
        _int_at_least("event_queue_size", self.event_queue_size, 0)
        return self


def _int_at_least(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
