"""Immutable snapshots of a queue's state: buffer usage, counters, per-task load and rebalance history."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PartitionUsage:
    partition_index: int
    used: int
    used_percentage: float


@dataclass(frozen=True)
class RebalanceResult:
    """One rebalance: what moved and the per-task loads (items per interval) before and after.

    ``skipped`` names why nothing moved ("" when partitions moved): "no load", "already even", "no gain",
    "single task", "shutdown".
    """

    at: float  # time.time() when it finished
    moves: tuple[tuple[int, int, int], ...]  # (partition, from_task, to_task)
    loads_before: tuple[int, ...]
    loads_after: tuple[int, ...]
    duration_ms: float = 0.0
    skipped: str = ""

    @property
    def moved(self) -> int:
        return len(self.moves)

    @staticmethod
    def ratio(loads: tuple[int, ...]) -> float:
        """max/min task load (inf when some task has none but another has load; 1.0 when all are idle)."""
        if not loads or max(loads) == 0:
            return 1.0
        return float("inf") if min(loads) == 0 else max(loads) / min(loads)

    @property
    def ratio_before(self) -> float:
        return self.ratio(self.loads_before)

    @property
    def ratio_after(self) -> float:
        return self.ratio(self.loads_after)


@dataclass(frozen=True)
class SlowCall:
    """A handler call that has run longer than ``slow_handler_ms`` (Kafka's ``max.poll.interval.ms``): the
    handler's type (``"consumer"`` in single-consumer mode), the drain task, ``consume`` or ``on_idle``, and the
    seconds it has been running when the snapshot was taken."""

    type_name: str
    task: int
    method: str
    seconds: float
    started: float = field(default=0.0, repr=False)  # time.monotonic() when the call began (identifies it)


@dataclass(frozen=True)
class BatchQueueStats:
    """Point-in-time snapshot of a queue (the seed's usage view plus the counters an operator needs)."""

    name: str
    buffer_size: int
    partition_used_counts: tuple[int, ...]
    produced: int = 0  # items accepted by produce/produce_many
    dropped_full: int = 0  # IF_POSSIBLE produce on a full partition
    dropped_no_handler: int = 0  # items of a type without a handler
    dispatched: int = 0  # items handed to a handler or the consumer
    handler_errors: int = 0
    task_restarts: int = 0  # drain cycles that raised: the task was restarted and handed on what it held
    lost: int = 0  # items a failed cycle held and could not hand on even then (logged)
    task_dispatched: tuple[int, ...] = ()  # per drain task: items it dispatched
    task_partitions: tuple[tuple[int, ...], ...] = ()
    rebalances: int = 0  # rebalances that moved partitions
    rebalance_state: str = "stable"  # stable | revoking | fencing | assigning
    rebalance_history: tuple[RebalanceResult, ...] = field(default=(), repr=False)
    slow_calls: tuple[SlowCall, ...] = ()  # handler calls running longer than slow_handler_ms right now
    failovers: int = 0  # times a stuck task's partitions were taken from it without a fence
    failed_over: tuple[int, ...] = ()  # drain tasks stuck in a call now, their other partitions failed over
    resizes: int = 0  # split="auto" types spread over more instances or joined into fewer
    handoff_timeouts: int = 0  # fences rolled back and listener calls left behind at handoff_timeout_ms
    events_dropped: int = 0  # events() not polled in time: the oldest dropped from the event queue
    split_instances: tuple[tuple[str, int], ...] = ()  # per split type (fixed or "auto"): instances routed to now

    @property
    def partition_count(self) -> int:
        return len(self.partition_used_counts)

    def total_capacity(self) -> int:
        return self.buffer_size * self.partition_count

    def total_used(self) -> int:
        return sum(self.partition_used_counts)

    def total_used_percentage(self) -> float:
        cap = self.total_capacity()
        return 0.0 if cap == 0 else min(100.0, 100.0 * self.total_used() / cap)

    def partition_used(self, i: int) -> int:
        return self.partition_used_counts[i]

    def partition_used_percentage(self, i: int) -> float:
        return min(100.0, 100.0 * self.partition_used_counts[i] / self.buffer_size)

    def top_n(self, n: int) -> list[PartitionUsage]:
        """The ``n`` fullest partitions: used desc, ties by index asc."""
        order = sorted(range(self.partition_count), key=lambda i: (-self.partition_used_counts[i], i))
        return [
            PartitionUsage(i, self.partition_used_counts[i], self.partition_used_percentage(i))
            for i in order[: max(0, n)]
        ]

    @property
    def task_count(self) -> int:
        return len(self.task_dispatched)
