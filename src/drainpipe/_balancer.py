"""Throughput-weighted partition placement (LPT), shared by the queue and the Spark engine's skew planner."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

SKIP_RATIO = 1.15  # below this max/min task load nothing moves
_EXACT_RELABEL_TASKS = 7  # up to this many tasks, bins are matched to tasks by trying every permutation


def task_loads(throughput: Sequence[int], owner: Sequence[int], task_count: int) -> list[int]:
    loads = [0] * task_count
    for p, t in enumerate(owner):
        if 0 <= t < task_count:
            loads[t] += throughput[p]
    return loads


def _ratio(loads: Sequence[int]) -> float:
    lo = min(loads)
    return float("inf") if lo == 0 else max(loads) / lo


def lpt_bins(weights: Sequence[int], bins: int, prefer: Sequence[int] | None = None) -> list[int]:
    """Longest-processing-time placement: items by weight desc, each to the least-loaded bin.

    Ties between equally loaded bins go to ``prefer[i]`` (e.g. the current owner) when given, else the lowest bin.
    Returns the bin of every item. Deterministic. 4/3-approximation of the optimal makespan.
    """
    order = sorted(range(len(weights)), key=lambda i: (-weights[i], i))
    loads = [0] * bins
    out = [0] * len(weights)
    for i in order:
        pref = prefer[i] if prefer is not None else -1
        # O(bins) argmin: task counts are small, and ties are decided explicitly (preferred bin, then lowest)
        b = min(range(bins), key=lambda k: (loads[k], k != pref, k))
        loads[b] += weights[i]
        out[i] = b
    return out


def _relabel(plan: list[int], throughput: Sequence[int], owner: Sequence[int], task_count: int) -> list[int]:
    """Rename the plan's bins so that as much load as possible stays where it is (fewest items in flight move).

    Bins are interchangeable (the same loads under any naming), so this picks the naming that keeps the most
    throughput on its current owner; lightly loaded partitions are then the ones that move.
    """
    keep = [[0] * task_count for _ in range(task_count)]  # keep[bin][task]: load of bin already on task
    for p, b in enumerate(plan):
        t = owner[p]
        if 0 <= t < task_count:
            keep[b][t] += throughput[p]
    if task_count <= _EXACT_RELABEL_TASKS:
        best: Sequence[int] = max(
            itertools.permutations(range(task_count)), key=lambda perm: sum(keep[b][perm[b]] for b in range(task_count))
        )
    else:
        chosen = [-1] * task_count
        used: set[int] = set()
        pairs = sorted(((keep[b][t], -b, -t) for b in range(task_count) for t in range(task_count)), reverse=True)
        for _, nb, nt in pairs:
            b, t = -nb, -nt
            if chosen[b] < 0 and t not in used:
                chosen[b] = t
                used.add(t)
        best = chosen
    return [best[b] for b in plan]


class DrainBalancer:
    """Decides partition -> drain task ownership from measured throughput. Stateless and thread-safe.

    Any object with an ``assign`` method of the same signature can be plugged into ``BatchQueueConfig.balancer``.
    """

    @classmethod
    def throughput_weighted(cls) -> DrainBalancer:
        return cls()

    @staticmethod
    def place(weights: Sequence[int], bins: int) -> list[int]:
        """The LPT planner itself: the bin of each item, items by weight desc each onto the least-loaded bin
        (ties to the lowest bin). Deterministic; within 4/3 of the optimal makespan. Used wherever weighted work
        is placed (the Spark engine places skewed per-type work with it)."""
        return lpt_bins(weights, bins)

    def assign(self, throughput: Sequence[int], current_owner: Sequence[int], task_count: int) -> list[int] | None:
        """New owner per partition, or None to leave things as they are.

        None when there is no load, when the current max/min task load is below 1.15, or when the plan would not
        lower the heaviest task's load. Partitions with zero throughput keep their owner. Among equally balanced
        plans the one that moves the least throughput is chosen.
        """
        if task_count <= 1 or len(throughput) != len(current_owner):
            return None
        if sum(throughput) <= 0:
            return None
        before = task_loads(throughput, current_owner, task_count)
        if _ratio(before) < SKIP_RATIO:
            return None
        hot = [p for p, w in enumerate(throughput) if w > 0]
        bins = lpt_bins([throughput[p] for p in hot], task_count, [current_owner[p] for p in hot])
        plan = list(current_owner)
        for p, b in zip(hot, bins):
            plan[p] = b
        # zero-throughput partitions stay put; relabel so the heaviest partitions stay on their owners
        relabeled_hot = _relabel(
            [plan[p] for p in hot], [throughput[p] for p in hot], [current_owner[p] for p in hot], task_count
        )
        for p, b in zip(hot, relabeled_hot):
            plan[p] = b
        after = task_loads(throughput, plan, task_count)
        if max(after) >= max(before):
            return None
        return plan

    def __repr__(self) -> str:
        return "DrainBalancer.throughput_weighted()"
